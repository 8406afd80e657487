/*
 * What the files of the Kubernetes client share (client.h is the public
 * side): the records of a client, a handle, an operation (conn_t), a
 * forward listener and an exec plugin run, and the functions one file
 * calls in another.
 *
 *   client.c       the core: the client and its handles, libwebsockets'
 *                  context and vhosts, an operation's life (conn_*), the
 *                  one libwebsockets callback that dispatches to the rest
 *   connect.c      the server's name resolved by us, each address tried
 *                  in turn under its own deadline
 *   tls.c          a handle's TLS context and the server certificate check
 *   credentials.c  bearer tokens: a token file re-read, an exec plugin run
 *   rest.c         one HTTP exchange (ce_kube_request)
 *   exec.c         pods/exec over v5/v4.channel.k8s.io (ce_kube_exec)
 *   forward.c      pods/portforward listeners and their tunnels
 *
 * Ownership: a conn_t belongs to its handle (k->conns) until the handle
 * closes, then to itself; it is freed by conn_maybe_free() once
 * libwebsockets is done with its wsi (stage KC_GONE) and every libuv
 * handle and request it counts (cn->handles) has called back. Nothing
 * frees a conn synchronously inside one of its own callbacks except
 * through that path.
 */
#ifndef CE_KUBE_INTERNAL_H
#define CE_KUBE_INTERNAL_H

#include <libwebsockets.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>

#include "common/text.h"
#include "kube/client.h"
#include "kube/proto.h"

/* A request path (query and prefix included) past this is CE_ETOOBIG. */
#define CE__KUBE_URL_MAX (16u * 1024u)
/* Room for a value shown in a message (ce_text_sanitize'd, quoted). */
#define CE__KUBE_SHOWN_MAX (4 * CE_TEXT_QUOTE_MAX + 8)
/* The addresses of the server's name tried, at most (in the resolver's
 * order: RFC 6724 destination address selection, as glibc sorts them). */
#define CE__KUBE_ADDRS_MAX 8u
/* What the failed attempts said, for the final message. */
#define CE__KUBE_TRIED_MAX 360u

typedef struct {
  char *p;
  size_t n, cap;
} buf_t;

/* Appends n bytes (kept NUL-terminated); false when memory ran out, with
 * b unchanged. */
bool ce__kube_buf_add(buf_t *b, const void *d, size_t n);
void ce__kube_buf_free(buf_t *b);

typedef enum { K_HTTP, K_EXEC, K_TUNNEL } kind_t;

/* Where an operation is in its life. Every change goes through
 * ce__kube_conn_stage(), which traces it (CONDUKT_PORT_DEBUG=1). */
typedef enum {
  KC_NEW,        /* made; its request is being filled in */
  KC_CRED,       /* on k->waiting until the exec plugin gives a credential */
  KC_RESOLVING,  /* the server's name is being resolved (cn->gai) */
  KC_CONNECTING, /* a wsi tries cn->addrs[cn->addr_i] under the attempt timer */
  KC_NEXT,       /* between two addresses: no wsi, the attempt timer starts the next */
  KC_OPEN,       /* the server was reached on this wsi (TLS or an answer) */
  KC_GONE        /* libwebsockets is done with it, or there never was a wsi */
} kconn_stage_t;

/* A credential that the server refused (401) is fetched again once. */
typedef enum {
  TRY_FIRST,     /* the first try */
  TRY_FIRST_401, /* the first try got 401: retried once the answer ends */
  TRY_RETRY      /* the retry: its answer is the answer */
} ktry_t;

/* The exec stream's stdin. */
typedef enum {
  STDIN_NONE,    /* not asked for */
  STDIN_SENDING, /* frames still to send (and, for v5, the close) */
  STDIN_CLOSED   /* all sent */
} kstdin_t;

/* A tunnel's local socket (the accepted connection). */
typedef enum {
  LOCAL_NONE,    /* not opened */
  LOCAL_HELD,    /* open, not read: before the upgrade, or while the queue is full */
  LOCAL_READING, /* open and read */
  LOCAL_EOF,     /* open, read to its end (what is queued still goes) */
  LOCAL_CLOSED   /* shut down or closing */
} klocal_t;

typedef struct chunk {
  struct chunk *next;
  size_t len;           /* payload bytes after LWS_PRE + 1 */
  unsigned char data[]; /* LWS_PRE, channel byte, payload */
} chunk_t;

/* The bytes a queued chunk of len payload bytes holds. */
#define CHUNK_COST(len) (sizeof(chunk_t) + LWS_PRE + 1 + (len))

typedef struct fwd fwd_t;
typedef struct plugin plugin_t;

typedef struct conn {
  kind_t kind;
  kconn_stage_t stage;
  ktry_t try;
  ce_kube_t *k;         /* NULL once the handle closed */
  struct conn *next;    /* k->conns */
  struct conn *wnext;   /* k->waiting, in stage KC_CRED */
  struct lws *wsi;
  SSL_CTX *ctx;         /* a reference to the TLS context of the wsi's vhost */
  struct lws_vhost *vh; /* the vhost of every attempt (set with ctx) */
  bool in_connect;      /* inside lws_client_connect_via_info (re-entrancy guard) */
  bool finished;        /* the result was delivered (or is never to be) */
  int handles;          /* libuv handles and requests still to call back */
  uv_timer_t timer;     /* the operation's deadline (timeout_ms) */
  uv_timer_t attempt;   /* one address's deadline, and the step to the next */
  uv_getaddrinfo_t gai;
  bool gai_busy;        /* gai runs (counted in handles until it calls back) */
  struct sockaddr_storage addrs[CE__KUBE_ADDRS_MAX];
  size_t n_addrs, addr_i;
  char addr_text[INET6_ADDRSTRLEN]; /* the address being tried */
  char tried[CE__KUBE_TRIED_MAX];   /* "ADDR: why; ADDR: why" */
  char tls_err[512];
  char *bearer;         /* the Authorization token used */
  char *url;            /* path and query (prefix included) */
  char hosthdr[CE_KUBE_HOST_MAX + 16];
  uint32_t timeout_ms;
  /* K_HTTP */
  ce_kube_http_cb hcb;
  void *harg;
  char method[8];
  char *body;
  size_t body_len, body_sent;
  char *ctype;
  int status;
  char resp_ctype[128];
  buf_t resp;
  /* K_EXEC */
  ce_kube_exec_cb ecb;
  void *earg;
  char *stdin_data;
  size_t stdin_len, stdin_sent;
  kstdin_t stdin_state;
  bool in_msg;          /* (exec and tunnels) a message continues in the next fragment */
  unsigned cur_chan;
  size_t max_output;
  buf_t out, errout, st;
  uint64_t out_dropped, err_dropped;
  char protocol[32];
  /* K_TUNNEL */
  fwd_t *fwd;
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } local;
  klocal_t local_state;
  bool rx_paused;       /* libwebsockets' receiving paused: the local socket is behind */
  bool failed;          /* ends abortively: the local socket is closed, not shut down */
  ce_kube_prefix_t pre[2];
  chunk_t *q_head, *q_tail;
  size_t q_bytes;
  buf_t fwd_err;
} conn_t;

struct fwd {
  ce_kube_client_t *c;
  ce_kube_t *k;
  fwd_t *next;
  uint64_t id;
  union {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } l;
  bool is_unix, closing;
  char *path;
  char ns[254], pod[254];
  uint16_t port;
  ce_kube_fwd_err_cb cb;
  void *arg;
  unsigned tunnels;     /* conns with fwd pointing here */
};

/* A vhost and the TLS context it was given (ours to free once the vhost
 * is gone; each connection holds a reference too). */
typedef struct {
  struct lws_vhost *vh;
  SSL_CTX *ctx;
} vhost_t;

struct ce_kube {
  ce_kube_client_t *c;
  ce_kube_t *next;
  uint64_t id;
  ce_kube_config_t cfg;
  vhost_t vh;
  vhost_t *old_vh;
  size_t n_old_vh;
  unsigned gen;
  /* Credentials (credentials.c). */
  char *token;            /* the bearer token in use (not for client_cert) */
  struct timespec token_mtime;
  bool token_loaded;
  ce_kube_cred_t cred;
  bool cred_valid;
  plugin_t *plugin;
  conn_t *waiting, *waiting_tail;
  conn_t *conns;
};

struct ce_kube_client {
  uv_loop_t *loop;
  struct lws_context *lws;
  ce_kube_t *kubes;
  fwd_t *fwds;
  uint64_t next_kube, next_fchan;
  bool destroying;
  /* TLS contexts of vhosts that lws_context_destroy() ends: freed after
   * it, in ce_kube_client_free(). */
  SSL_CTX **held;
  size_t n_held;
};

/* ---- client.c ---- */

/* CONDUKT_PORT_DEBUG=1 traces libwebsockets' callbacks and every stage
 * change to stderr (never to the port's stdout). */
bool ce__kube_trace_on(void);
/* s made printable and quoted into dst (CE__KUBE_SHOWN_MAX bytes). */
const char *ce__kube_shown(char *dst, const char *s);
/* Formats err and returns code. */
int ce__kube_efmt(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Appends s (escaped, or as is) to u (cap bytes, *used so far); false
 * when it does not fit. */
bool ce__kube_url_put(char *u, size_t cap, size_t *used, const char *s);
bool ce__kube_url_escape(char *u, size_t cap, size_t *used, const char *s);
/* A new CE__KUBE_URL_MAX-byte buffer holding the handle's path prefix,
 * "/api/v1/namespaces/NS/pods/POD" (both escaped) and sub; *used is its
 * length. NULL when memory ran out or it does not fit. */
char *ce__kube_pod_url(const ce_kube_t *k, const char *ns, const char *pod, const char *sub,
                       size_t *used);

/* A new conn on k (linked into k->conns, its timers made), or NULL. */
conn_t *ce__kube_conn_new(ce_kube_t *k, kind_t kind);
void ce__kube_conn_stage(conn_t *cn, kconn_stage_t stage);
/* Starts the operation's deadline (timeout_ms; none when 0). */
void ce__kube_conn_arm(conn_t *cn);
/* Delivers the result once (later calls do nothing) and ends the wsi. */
void ce__kube_conn_finish(conn_t *cn, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the operation without delivering anything (its request was moved
 * elsewhere, or was never accepted). */
void ce__kube_conn_drop(conn_t *cn);
/* libwebsockets is done with the wsi, or there never was one. */
void ce__kube_conn_lws_gone(conn_t *cn);
void ce__kube_conn_maybe_free(conn_t *cn);
/* Ends an operation that has no wsi: delivers code/msg (unless a result
 * went already), closes a tunnel's local socket, frees it in time. */
void ce__kube_conn_fail_early(conn_t *cn, int code, const char *msg);
/* An error before any HTTP answer on a reached server (TLS, a reset). */
void ce__kube_conn_connect_error(conn_t *cn, const char *why);
/* Connects to cn->addrs[cn->addr_i] through libwebsockets. */
void ce__kube_conn_connect(conn_t *cn, const char *address);
/* A vhost for k holding the given client certificate (or none). */
int ce__kube_make_vhost(ce_kube_t *k, const char *cert, size_t cert_len, const char *key,
                        size_t key_len, vhost_t *out, char *err, size_t errlen);

/* ---- connect.c ---- */

/* Credentials are at hand: resolves the server's name and tries each
 * address in turn (or fails the operation). */
void ce__kube_connect_start(conn_t *cn);
/* The wsi of an attempt failed before the server was reached (refused,
 * unreachable, reset before TLS): the next address, or the final error
 * naming each address tried. Returns true when the conn goes on. */
bool ce__kube_connect_failed(conn_t *cn, const char *why);
/* The server answered on this attempt: no other address is tried. */
void ce__kube_connect_reached(conn_t *cn);

/* ---- tls.c ---- */

SSL_CTX *ce__kube_tls_context(const ce_kube_t *k, const char *cert, size_t cert_len,
                              const char *key, size_t key_len, char *err, size_t errlen);
/* libwebsockets' certificate check callback: 0 accepts, 1 refuses. */
int ce__kube_tls_verify(conn_t *cn, X509_STORE_CTX *xs, int preverify);

/* ---- credentials.c ---- */

/* Starts an operation: arms its deadline, waits for a credential when
 * the exec plugin must run, then connects. */
void ce__kube_conn_start(conn_t *cn);
/* The server refused the credential (401): the operation moves to a new
 * conn that waits for the plugin to run again; cn ends silently. */
void ce__kube_retry_after_401(conn_t *cn);
/* A handle closes: its plugin is killed and reaped, its waiting conns
 * fail with CE_ECLOSED, its tokens are wiped. */
void ce__kube_creds_close(ce_kube_t *k);

/* ---- rest.c, exec.c, forward.c: the per-kind halves of the callback ---- */

int ce__kube_add_auth_header(conn_t *cn, struct lws *wsi, unsigned char **p, unsigned char *end);
int ce__kube_http_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                     size_t len);
int ce__kube_exec_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                     size_t len);
int ce__kube_tunnel_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                       size_t len);
/* Closes a tunnel's local socket once what is queued towards it went. */
void ce__kube_tunnel_close_local(conn_t *cn);
void ce__kube_fwd_close(fwd_t *f);

#endif
