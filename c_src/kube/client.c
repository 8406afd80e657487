/*
 * The Kubernetes client (client.h) on libwebsockets.
 *
 * Every operation is a conn_t: a REST exchange (K_HTTP), an exec stream
 * (K_EXEC) or one tunnelled connection of a forward listener (K_TUNNEL).
 * A conn may first wait for credentials (a token file re-read, an exec
 * plugin run with uv_spawn), then connects through libwebsockets; the
 * wsi's opaque user data points back at it. A conn is freed once
 * libwebsockets is done with its wsi ("lws_gone": a terminal callback,
 * or no wsi at all) and its libuv handles are closed.
 *
 * TLS: each handle's vhost gets its own SSL_CTX. Its trust store is
 * replaced by the handle's CA (only that CA is trusted, as kubectl does),
 * the client certificate is loaded there, TLS 1.2 is the minimum. The
 * host name is checked by us (libwebsockets' check is skipped) so that an
 * IP literal is matched against IP SANs and tls-server-name is honoured
 * without changing the Host header.
 */
#include "kube/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libwebsockets.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/text.h"
#include "control/listen.h"
#include "kube/proto.h"

extern char **environ;

#define URL_MAX (16u * 1024u)
#define HDR_DATA_MAX 32768u
#define RX_BUFFER (64u * 1024u)
#define FWD_ERR_MAX 4096u
#define SHOWN_MAX (4 * CE_TEXT_QUOTE_MAX + 8)
/* An exec credential is renewed this long before it expires. */
#define CRED_SLACK_S 10

typedef struct {
  char *p;
  size_t n, cap;
} buf_t;

static bool buf_add(buf_t *b, const void *d, size_t n) {
  if (n == 0)
    return true;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *q = realloc(b->p, cap);
    if (q == NULL)
      return false;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = '\0';
  return true;
}

static void buf_free(buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

typedef enum { K_HTTP, K_EXEC, K_TUNNEL } kind_t;

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
  ce_kube_t *k;
  struct conn *next;    /* k->conns */
  struct conn *wnext;   /* k->waiting */
  struct lws *wsi;
  SSL_CTX *ctx;         /* a reference to the TLS context of the wsi's vhost */
  bool in_connect, lws_gone, finished, waiting, retried, got_401, silent;
  int handles;
  uv_timer_t timer;
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
  bool has_stdin, stdin_closed, in_msg;
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
  bool local_open, local_reading, local_eof, rx_paused, failed;
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

struct plugin {
  ce_kube_t *k;
  uv_process_t proc;
  uv_pipe_t out, err;
  uv_timer_t timer;
  int handles;
  int pending;          /* exit and two EOFs */
  bool timed_out, spawned, exited;
  int64_t exit_status;
  int term_signal;
  buf_t o, e;
  bool too_big;
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
  /* Credentials. */
  char *token;            /* the bearer token in use (not for client_cert) */
  struct timespec token_mtime;
  bool token_loaded;
  ce_kube_cred_t cred;
  bool cred_valid;
  plugin_t *plugin;
  conn_t *waiting, *waiting_tail;
  conn_t *conns;
  bool closed;
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

/* CONDUKT_PORT_DEBUG=1 traces libwebsockets' callbacks to stderr. */
static bool trace_on(void) {
  static int on = -1;
  if (on < 0)
    on = getenv("CONDUKT_PORT_DEBUG") != NULL;
  return on == 1;
}

static const char *shown(char *dst, const char *s) {
  ce_text_sanitize(dst, SHOWN_MAX, s, strlen(s), 1);
  return dst;
}

static int efmt(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int efmt(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

static void conn_maybe_free(conn_t *cn);
static void conn_finish(conn_t *cn, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_start(conn_t *cn);
static void tunnel_close_local(conn_t *cn);

/* ---- TLS ------------------------------------------------------------------------------- */

static void ssl_reason(char *dst, size_t cap) {
  unsigned long e = ERR_peek_last_error();
  if (e == 0)
    snprintf(dst, cap, "unknown reason");
  else
    ERR_error_string_n(e, dst, cap);
  ERR_clear_error();
}

/* The SNI name of a context (tls-server-name), freed with the context. */
static int g_sni_idx = -1;

static void sni_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                     void *argp) {
  free(ptr);
}

/* At the start of each handshake (before the ClientHello is built):
 * libwebsockets set the SNI from the Host header; tls-server-name wins. */
static void sni_info_cb(const SSL *ssl, int where, int ret) {
  if ((where & SSL_CB_HANDSHAKE_START) == 0 || g_sni_idx < 0)
    return;
  const char *name = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), g_sni_idx);
  if (name != NULL)
    SSL_set_tlsext_host_name((SSL *)ssl, name);
}

/* A client TLS context of its own for k: only k's CA is trusted (the
 * system's roots when k names none), k's client certificate (cert/key,
 * or none), TLS 1.2 at least. */
static SSL_CTX *tls_context(const ce_kube_t *k, const char *cert, size_t cert_len,
                            const char *key, size_t key_len, char *err, size_t errlen) {
  char why[200];
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == NULL) {
    ssl_reason(why, sizeof(why));
    snprintf(err, errlen, "cannot make a TLS context (%s)", why);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (k->cfg.ca_pem != NULL) {
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    BIO *bio = BIO_new_mem_buf(k->cfg.ca_pem, (int)k->cfg.ca_len);
    STACK_OF(X509_INFO) *infos = bio != NULL ? PEM_X509_INFO_read_bio(bio, NULL, NULL, NULL)
                                             : NULL;
    int added = 0;
    for (int i = 0; st != NULL && infos != NULL && i < sk_X509_INFO_num(infos); i++) {
      X509_INFO *in = sk_X509_INFO_value(infos, i);
      if (in->x509 != NULL && X509_STORE_add_cert(st, in->x509) == 1)
        added++;
    }
    sk_X509_INFO_pop_free(infos, X509_INFO_free);
    BIO_free(bio);
    ERR_clear_error();
    if (added == 0) {
      snprintf(err, errlen, "the certificate authority holds no PEM certificate");
      goto fail;
    }
  } else if (!k->cfg.insecure && SSL_CTX_set_default_verify_paths(ctx) != 1) {
    ssl_reason(why, sizeof(why));
    snprintf(err, errlen, "cannot load the system's certificate authorities (%s)", why);
    goto fail;
  }
  if (cert != NULL) {
    BIO *bio = BIO_new_mem_buf(cert, (int)cert_len);
    X509 *leaf = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (leaf == NULL || SSL_CTX_use_certificate(ctx, leaf) != 1) {
      ssl_reason(why, sizeof(why));
      snprintf(err, errlen, "the client certificate is not usable PEM (%s)", why);
      X509_free(leaf);
      BIO_free(bio);
      goto fail;
    }
    X509_free(leaf);
    X509 *more;
    while ((more = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
      if (SSL_CTX_add0_chain_cert(ctx, more) != 1)
        X509_free(more);
    ERR_clear_error();
    BIO_free(bio);
    bio = BIO_new_mem_buf(key, (int)key_len);
    EVP_PKEY *pk = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (pk == NULL || SSL_CTX_use_PrivateKey(ctx, pk) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      ssl_reason(why, sizeof(why));
      snprintf(err, errlen,
               "the client key is not usable PEM or does not match the certificate (%s)",
               why);
      EVP_PKEY_free(pk);
      goto fail;
    }
    EVP_PKEY_free(pk);
  }
  if (k->cfg.tls_server_name != NULL) {
    if (g_sni_idx < 0)
      g_sni_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, sni_free);
    char *sni = strdup(k->cfg.tls_server_name);
    if (g_sni_idx < 0 || sni == NULL || SSL_CTX_set_ex_data(ctx, g_sni_idx, sni) != 1) {
      free(sni);
      snprintf(err, errlen, "out of memory for the TLS context");
      goto fail;
    }
    SSL_CTX_set_info_callback(ctx, sni_info_cb);
  }
  return ctx;
fail:
  /* The whole context goes: nothing half-installed is ever used. */
  SSL_CTX_free(ctx);
  return NULL;
}

static bool is_ip(const char *s) {
  unsigned char b[16];
  return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

bool ce_kube_cert_names(X509 *cert, const char *name) {
  if (is_ip(name))
    return X509_check_ip_asc(cert, name, 0) == 1;
  /* As Go's crypto/tls: subjectAltName only (never the subject's CN), a
   * wildcard only as a whole left-most label. */
  return X509_check_host(cert, name, strlen(name),
                         X509_CHECK_FLAG_NEVER_CHECK_SUBJECT |
                             X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS,
                         NULL) == 1;
}

/* The server certificate check (preverify from OpenSSL, the name here).
 * 0 accepts, 1 refuses (libwebsockets' convention). */
static int tls_verify(conn_t *cn, X509_STORE_CTX *xs, int preverify) {
  if (cn->k->cfg.insecure) {
    /* insecure-skip-tls-verify, as kubectl: neither the chain nor the
     * name is checked. */
    X509_STORE_CTX_set_error(xs, X509_V_OK);
    return 0;
  }
  if (!preverify) {
    int e = X509_STORE_CTX_get_error(xs);
    snprintf(cn->tls_err, sizeof(cn->tls_err), "the server certificate is not trusted: %s",
             X509_verify_cert_error_string(e));
    return 1;
  }
  if (X509_STORE_CTX_get_error_depth(xs) != 0)
    return 0;
  const ce_kube_config_t *cfg = &cn->k->cfg;
  const char *name = cfg->tls_server_name != NULL ? cfg->tls_server_name : cfg->host;
  X509 *cert = X509_STORE_CTX_get_current_cert(xs);
  if (cert == NULL || !ce_kube_cert_names(cert, name)) {
    char s[SHOWN_MAX];
    snprintf(cn->tls_err, sizeof(cn->tls_err),
             "the server certificate does not name \"%s\"", shown(s, name));
    X509_STORE_CTX_set_error(xs, X509_V_ERR_HOSTNAME_MISMATCH);
    return 1;
  }
  return 0;
}

/* ---- libwebsockets ---------------------------------------------------------------------- */

static int kube_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len);

static const struct lws_protocols PROTOCOLS[] = {
    {"kube-http", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"kube-ws", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"v5.channel.k8s.io", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"v4.channel.k8s.io", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static int ensure_context(ce_kube_client_t *c, char *err, size_t errlen) {
  if (c->lws != NULL)
    return CE_OK;
  static bool logs_set;
  if (!logs_set) {
    /* libwebsockets logs to stderr, which is the port's log: errors only. */
    /* Our own messages say what failed; libwebsockets' log is for
     * debugging (CONDUKT_PORT_DEBUG=1). */
    lws_set_log_level(getenv("CONDUKT_PORT_DEBUG") != NULL ? LLL_ERR | LLL_WARN | LLL_NOTICE
                                                            : 0,
                      NULL);
    logs_set = true;
  }
  void *loops[1] = {c->loop};
  struct lws_context_creation_info info;
  memset(&info, 0, sizeof(info));
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT |
                 LWS_SERVER_OPTION_EXPLICIT_VHOSTS;
  info.foreign_loops = loops;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.max_http_header_data = HDR_DATA_MAX;
  info.pt_serv_buf_size = 2 * HDR_DATA_MAX;
  c->lws = lws_create_context(&info);
  if (c->lws == NULL)
    return efmt(err, errlen, CE_EUNAVAIL,
                "kube_open: libwebsockets could not start on the event loop (is "
                "libwebsockets-evlib-uv installed?)");
  return CE_OK;
}

/* A vhost for k with its own TLS context holding the given client
 * certificate (or none). libwebsockets would otherwise share one client
 * SSL_CTX between vhosts whose creation info looks the same. */
static int make_vhost(ce_kube_t *k, const char *cert, size_t cert_len, const char *key,
                      size_t key_len, vhost_t *out, char *err, size_t errlen) {
  char name[64];
  snprintf(name, sizeof(name), "kube-%llu-%u", (unsigned long long)k->id, k->gen++);
  SSL_CTX *ctx = tls_context(k, cert, cert_len, key, key_len, err, errlen);
  if (ctx == NULL)
    return CE_ETLS;
  struct lws_context_creation_info vi;
  memset(&vi, 0, sizeof(vi));
  vi.port = CONTEXT_PORT_NO_LISTEN;
  vi.protocols = PROTOCOLS;
  vi.vhost_name = name;
  vi.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
  if (k->cfg.ca_pem != NULL)
    vi.options |= LWS_SERVER_OPTION_DISABLE_OS_CA_CERTS;
  vi.provided_client_ssl_ctx = ctx;
  vi.user = k;
  /* Each operation's own timer decides; libwebsockets' stage timeouts
   * only back it up. */
  vi.timeout_secs = CE_KUBE_TIMEOUT_MAX / 1000;
  vi.connect_timeout_secs = CE_KUBE_TIMEOUT_MAX / 1000;
  struct lws_vhost *vh = lws_create_vhost(k->c->lws, &vi);
  if (vh == NULL) {
    SSL_CTX_free(ctx);
    return efmt(err, errlen, CE_ETLS, "libwebsockets could not make a vhost");
  }
  out->vh = vh;
  out->ctx = ctx;
  return CE_OK;
}

/* The vhost is no longer used by k: destroyed now, its TLS context freed
 * (connections still on it hold their own references). While the client
 * is being destroyed, lws_context_destroy() ends the vhost and the
 * context waits for ce_kube_client_free(). */
static void vhost_drop(ce_kube_client_t *c, vhost_t *v) {
  if (v->vh == NULL)
    return;
  if (!c->destroying) {
    lws_vhost_destroy(v->vh);
    SSL_CTX_free(v->ctx);
  } else {
    SSL_CTX **h = realloc(c->held, (c->n_held + 1) * sizeof(*h));
    if (h != NULL) {
      c->held = h;
      c->held[c->n_held++] = v->ctx;
    }
    /* Out of memory: the context is left (a leak, never a use after
     * free). */
  }
  v->vh = NULL;
  v->ctx = NULL;
}

/* ---- conns --------------------------------------------------------------------------- */

static void on_conn_handle_closed(uv_handle_t *h) {
  conn_t *cn = h->data;
  cn->handles--;
  conn_maybe_free(cn);
}

static void conn_unlink(conn_t *cn) {
  if (cn->k == NULL)
    return;
  for (conn_t **pp = &cn->k->conns; *pp != NULL; pp = &(*pp)->next)
    if (*pp == cn) {
      *pp = cn->next;
      break;
    }
}

static void conn_maybe_free(conn_t *cn) {
  if (!cn->lws_gone || cn->in_connect)
    return;
  if (!uv_is_closing((uv_handle_t *)&cn->timer)) {
    uv_close((uv_handle_t *)&cn->timer, on_conn_handle_closed);
    return;
  }
  if (cn->kind == K_TUNNEL && cn->local_open) {
    tunnel_close_local(cn);
    return;
  }
  if (cn->handles > 0)
    return;
  conn_unlink(cn);
  if (cn->fwd != NULL)
    cn->fwd->tunnels--;
  SSL_CTX_free(cn->ctx);
  if (cn->bearer != NULL)
    OPENSSL_clear_free(cn->bearer, strlen(cn->bearer));
  free(cn->url);
  free(cn->body);
  free(cn->ctype);
  buf_free(&cn->resp);
  free(cn->stdin_data);
  buf_free(&cn->out);
  buf_free(&cn->errout);
  buf_free(&cn->st);
  buf_free(&cn->fwd_err);
  for (chunk_t *q = cn->q_head, *nx; q != NULL; q = nx) {
    nx = q->next;
    free(q);
  }
  free(cn);
}

static conn_t *conn_new(ce_kube_t *k, kind_t kind) {
  conn_t *cn = calloc(1, sizeof(*cn));
  if (cn == NULL)
    return NULL;
  cn->kind = kind;
  cn->k = k;
  uv_timer_init(k->c->loop, &cn->timer);
  cn->timer.data = cn;
  cn->handles = 1;
  cn->next = k->conns;
  k->conns = cn;
  bool v6 = strchr(k->cfg.host, ':') != NULL;
  snprintf(cn->hosthdr, sizeof(cn->hosthdr), "%s%s%s:%u", v6 ? "[" : "", k->cfg.host,
           v6 ? "]" : "", k->cfg.port);
  return cn;
}

/* libwebsockets is done with the wsi (or there never was one). */
static void conn_lws_gone(conn_t *cn) {
  if (trace_on())
    fprintf(stderr, "condukt-egress port: kube: conn %p done with wsi %p\n", (void *)cn,
            (void *)cn->wsi);
  if (cn->wsi != NULL)
    lws_set_opaque_user_data(cn->wsi, NULL);
  cn->wsi = NULL;
  cn->lws_gone = true;
  conn_maybe_free(cn);
}

static void conn_kill_wsi(conn_t *cn) {
  if (cn->wsi != NULL && !cn->lws_gone)
    lws_set_timeout(cn->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
}

static void conn_finish(conn_t *cn, int err, const char *fmt, ...) {
  if (cn->finished)
    return;
  cn->finished = true;
  uv_timer_stop(&cn->timer);
  char msg[CE_KUBE_MSG_MAX];
  msg[0] = '\0';
  if (fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
  }
  bool quiet = cn->silent;
  if (cn->kind == K_HTTP && !quiet) {
    ce_kube_http_res_t r = {.err = err, .msg = msg, .status = cn->status,
                            .content_type = cn->resp_ctype,
                            .body = cn->resp.p != NULL ? cn->resp.p : "",
                            .body_len = cn->resp.n};
    cn->hcb(cn->harg, &r);
  } else if (cn->kind == K_EXEC && !quiet) {
    ce_kube_exec_res_t r = {.err = err, .msg = msg, .protocol = cn->protocol,
                            .out = cn->out.p != NULL ? cn->out.p : "", .out_len = cn->out.n,
                            .errout = cn->errout.p != NULL ? cn->errout.p : "",
                            .err_len = cn->errout.n, .out_dropped = cn->out_dropped,
                            .err_dropped = cn->err_dropped};
    json_t *status = NULL;
    if (err == CE_OK && cn->st.n > 0) {
      status = json_loadb(cn->st.p, cn->st.n, 0, NULL);
      if (status == NULL) {
        r.err = CE_EPROTO;
        r.msg = "exec: the status channel did not carry JSON";
      }
    }
    r.status = status;
    r.has_exit = status != NULL && ce_kube_exit_code(status, &r.exit_code);
    cn->ecb(cn->earg, &r);
    json_decref(status);
  } else if (cn->kind == K_TUNNEL && err != CE_OK && msg[0] != '\0' && !quiet &&
             cn->fwd != NULL && !cn->fwd->closing) {
    cn->fwd->cb(cn->fwd->arg, cn->fwd->id, msg);
  }
  conn_kill_wsi(cn);
}

static void on_conn_timeout(uv_timer_t *t) {
  conn_t *cn = t->data;
  conn_finish(cn, CE_ETIMEDOUT, "%s: no answer within %u ms",
              cn->kind == K_EXEC ? "kube_exec" : "kube_request", cn->timeout_ms);
}

/* An error before any HTTP answer: refused, unknown name, TLS. */
static void conn_connect_error(conn_t *cn, const char *why) {
  char s[SHOWN_MAX];
  const char *w = why != NULL ? why : "connection failed";
  const char *server = cn->k != NULL ? cn->k->cfg.server : "?";
  if (cn->tls_err[0] != '\0')
    conn_finish(cn, CE_ETLS, "%s: TLS: %s", server, cn->tls_err);
  else if (strstr(w, "SSL") != NULL || strstr(w, "ssl") != NULL || strstr(w, "tls") != NULL ||
           strstr(w, "TLS") != NULL)
    conn_finish(cn, CE_ETLS, "%s: TLS: %s", server, shown(s, w));
  else
    conn_finish(cn, CE_EUNAVAIL, "%s: cannot connect: %s", server, shown(s, w));
}

static void conn_retry_after_401(conn_t *cn);
static void conn_fail_early(conn_t *cn, int code, const char *msg);

/* ---- HTTP ------------------------------------------------------------------------------ */

static int add_auth_header(conn_t *cn, struct lws *wsi, unsigned char **p, unsigned char *end) {
  if (cn->bearer == NULL)
    return 0;
  size_t tl = strlen(cn->bearer) + 8;
  char *v = malloc(tl);
  if (v == NULL)
    return -1;
  snprintf(v, tl, "Bearer %s", cn->bearer);
  int r = lws_add_http_header_by_name(wsi, (const unsigned char *)"authorization:",
                                      (const unsigned char *)v, (int)strlen(v), p, end);
  OPENSSL_clear_free(v, tl);
  return r != 0 ? -1 : 0;
}

/* The header libwebsockets adds to a request it does not pipeline. */
#define CONN_CLOSE "connection: close\r\n"

static int http_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                   size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
    unsigned char **p = (unsigned char **)in, *end = *p + len;
    char clen[32];
    /* libwebsockets has just written "connection: close" (after the
     * request line and the Host header, so the bytes are there). On that
     * header Go's server answers a request it refuses early (a 403 from
     * the authorization filter) without reading the body, closes, and the
     * body still arriving makes the kernel reset the connection: libuv
     * reports the reset as an error and libwebsockets drops the answer
     * unread. Without it the server reads and discards the body first;
     * the connection is still ours to close after the one exchange. */
    if (memcmp(*p - (sizeof(CONN_CLOSE) - 1), CONN_CLOSE, sizeof(CONN_CLOSE) - 1) == 0)
      *p -= sizeof(CONN_CLOSE) - 1;
    if (add_auth_header(cn, wsi, p, end) != 0)
      return -1;
    if (lws_add_http_header_by_name(wsi, (const unsigned char *)"accept:",
                                    (const unsigned char *)"application/json, */*", 21, p,
                                    end) != 0 ||
        lws_add_http_header_by_name(wsi, (const unsigned char *)"user-agent:",
                                    (const unsigned char *)"condukt", 7, p, end) != 0)
      return -1;
    if (cn->body != NULL) {
      snprintf(clen, sizeof(clen), "%zu", cn->body_len);
      if (lws_add_http_header_by_name(wsi, (const unsigned char *)"content-type:",
                                      (const unsigned char *)cn->ctype,
                                      (int)strlen(cn->ctype), p, end) != 0 ||
          lws_add_http_header_by_name(wsi, (const unsigned char *)"content-length:",
                                      (const unsigned char *)clen, (int)strlen(clen), p,
                                      end) != 0)
        return -1;
      lws_client_http_body_pending(wsi, 1);
      lws_callback_on_writable(wsi);
    }
    return 0;
  }
  case LWS_CALLBACK_CLIENT_HTTP_WRITEABLE: {
    if (cn->body == NULL || cn->body_sent >= cn->body_len)
      return 0;
    size_t n = cn->body_len - cn->body_sent;
    if (n > 16384)
      n = 16384;
    unsigned char *b = malloc(LWS_PRE + n);
    if (b == NULL)
      return -1;
    memcpy(b + LWS_PRE, cn->body + cn->body_sent, n);
    bool last = cn->body_sent + n == cn->body_len;
    int w = lws_write(wsi, b + LWS_PRE, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP);
    free(b);
    if (w < 0)
      return -1;
    cn->body_sent += n;
    if (last)
      lws_client_http_body_pending(wsi, 0);
    else
      lws_callback_on_writable(wsi);
    return 0;
  }
  case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
    cn->status = (int)lws_http_client_http_response(wsi);
    if (lws_hdr_copy(wsi, cn->resp_ctype, sizeof(cn->resp_ctype),
                     WSI_TOKEN_HTTP_CONTENT_TYPE) < 0)
      cn->resp_ctype[0] = '\0';
    if (cn->status == 401 && cn->k->cfg.auth == CE_KUBE_AUTH_EXEC && !cn->retried)
      cn->got_401 = true;
    return 0;
  case LWS_CALLBACK_RECEIVE_CLIENT_HTTP: {
    char b[LWS_PRE + 4096];
    char *px = b + LWS_PRE;
    int l = (int)sizeof(b) - LWS_PRE;
    if (lws_http_client_read(wsi, &px, &l) < 0)
      return -1;
    return 0;
  }
  case LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ:
    if (cn->finished)
      return -1;
    if (cn->resp.n + len > CE_KUBE_BODY_MAX) {
      conn_finish(cn, CE_ETOOBIG, "kube_request: the response body is over %u bytes",
                  CE_KUBE_BODY_MAX);
      return -1;
    }
    if (!buf_add(&cn->resp, in, len)) {
      conn_finish(cn, CE_ENOMEM, "kube_request: out of memory for the response");
      return -1;
    }
    return 0;
  case LWS_CALLBACK_COMPLETED_CLIENT_HTTP:
    if (cn->got_401) {
      conn_retry_after_401(cn);
      return -1;
    }
    conn_finish(cn, CE_OK, NULL);
    return -1; /* one exchange per connection */
  case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
    if (cn->got_401 && !cn->finished)
      conn_retry_after_401(cn);
    else if (cn->status != 0)
      conn_finish(cn, CE_EPROTO, "kube_request: the connection closed before the response "
                                 "ended");
    else
      conn_connect_error(cn, "the connection closed before a response");
    conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}

/* ---- exec ------------------------------------------------------------------------------ */

static void exec_keep(conn_t *cn, buf_t *b, uint64_t *dropped, const uint8_t *d, size_t n) {
  size_t room = 0;
  size_t total = cn->out.n + cn->errout.n;
  if (b->n < cn->max_output && total < CE_KUBE_EXEC_OUTPUT_TOTAL) {
    room = cn->max_output - b->n;
    if (room > CE_KUBE_EXEC_OUTPUT_TOTAL - total)
      room = CE_KUBE_EXEC_OUTPUT_TOTAL - total;
  }
  size_t keep = n < room ? n : room;
  if (keep > 0 && !buf_add(b, d, keep))
    keep = 0;
  *dropped += n - keep;
}

static int exec_rx(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (!cn->in_msg) {
    unsigned chan;
    const uint8_t *data;
    size_t dl;
    if (!ce_kube_frame_split(d, n, &chan, &data, &dl))
      return 0; /* an empty message: nothing */
    cn->cur_chan = chan;
    cn->in_msg = true;
    d = data;
    n = dl;
  }
  if (lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0)
    cn->in_msg = false;
  switch (cn->cur_chan) {
  case CE_KUBE_CH_STDOUT:
    exec_keep(cn, &cn->out, &cn->out_dropped, d, n);
    break;
  case CE_KUBE_CH_STDERR:
    exec_keep(cn, &cn->errout, &cn->err_dropped, d, n);
    break;
  case CE_KUBE_CH_ERROR:
    if (cn->st.n + n > CE_KUBE_STATUS_MAX || !buf_add(&cn->st, d, n)) {
      conn_finish(cn, CE_EPROTO, "kube_exec: the status channel carried over %u bytes",
                  CE_KUBE_STATUS_MAX);
      return -1;
    }
    break;
  default:
    break;
  }
  return 0;
}

static int exec_write(conn_t *cn, struct lws *wsi) {
  if (!cn->has_stdin || cn->stdin_closed)
    return 0;
  bool v5 = strcmp(cn->protocol, "v5.channel.k8s.io") == 0;
  if (cn->stdin_sent < cn->stdin_len) {
    size_t n = cn->stdin_len - cn->stdin_sent;
    if (n > CE_KUBE_STDIN_FRAME)
      n = CE_KUBE_STDIN_FRAME;
    unsigned char *b = malloc(LWS_PRE + 1 + n);
    if (b == NULL)
      return -1;
    b[LWS_PRE] = CE_KUBE_CH_STDIN;
    memcpy(b + LWS_PRE + 1, cn->stdin_data + cn->stdin_sent, n);
    int w = lws_write(wsi, b + LWS_PRE, n + 1, LWS_WRITE_BINARY);
    free(b);
    if (w < 0)
      return -1;
    cn->stdin_sent += n;
    lws_callback_on_writable(wsi);
    return 0;
  }
  if (v5) {
    unsigned char b[LWS_PRE + 2];
    b[LWS_PRE] = CE_KUBE_CH_CLOSE;
    b[LWS_PRE + 1] = CE_KUBE_CH_STDIN;
    if (lws_write(wsi, b + LWS_PRE, 2, LWS_WRITE_BINARY) < 0)
      return -1;
  }
  cn->stdin_closed = true;
  return 0;
}

/* The HTTP status of a refused upgrade as our error code. */
static int upgrade_code(int status) {
  if (status == 401 || status == 403)
    return CE_EPERM;
  if (status == 404)
    return CE_ENOENT;
  return CE_EPROTO;
}

static int exec_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                   size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
    /* The response headers are still there: the chosen subprotocol. */
    if (lws_hdr_copy(wsi, cn->protocol, sizeof(cn->protocol), WSI_TOKEN_PROTOCOL) < 0)
      cn->protocol[0] = '\0';
    /* Fail closed: the framing (stdin close, the status channel) depends
     * on the version, and a server that agreed none of ours speaks
     * something else (RFC 6455 §4.1: the client fails the connection). */
    if (strcmp(cn->protocol, "v5.channel.k8s.io") != 0 && strcmp(cn->protocol, "v4.channel.k8s.io") != 0) {
      conn_finish(cn, CE_EPROTO, "kube_exec: the API server agreed the subprotocol \"%s\", not "
                  "v5.channel.k8s.io or v4.channel.k8s.io", cn->protocol);
      return -1;
    }
    return 0;
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (cn->has_stdin)
      lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    if (cn->finished)
      return -1;
    return exec_rx(cn, wsi, in, len);
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    if (cn->finished)
      return -1;
    return exec_write(cn, wsi);
  case LWS_CALLBACK_CLIENT_CLOSED:
    conn_finish(cn, CE_OK, NULL);
    conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}

/* ---- port-forward tunnels -------------------------------------------------------------- */

static void on_local_closed(uv_handle_t *h) {
  conn_t *cn = h->data;
  cn->handles--;
  conn_maybe_free(cn);
}

static void on_local_shutdown(uv_shutdown_t *req, int status) {
  conn_t *cn = req->data;
  free(req);
  uv_close((uv_handle_t *)&cn->local, on_local_closed);
}

/* Closes the local socket once what is queued towards it is written. */
static void tunnel_close_local(conn_t *cn) {
  if (!cn->local_open)
    return;
  cn->local_open = false;
  uv_read_stop((uv_stream_t *)&cn->local);
  uv_shutdown_t *req = cn->failed ? NULL : malloc(sizeof(*req));
  if (req != NULL) {
    req->data = cn;
    if (uv_shutdown(req, (uv_stream_t *)&cn->local, on_local_shutdown) == 0)
      return;
    free(req);
  }
  uv_close((uv_handle_t *)&cn->local, on_local_closed);
}

static void on_local_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  chunk_t *ch = malloc(sizeof(chunk_t) + LWS_PRE + 1 + CE_KUBE_STDIN_FRAME);
  if (ch == NULL) {
    *b = uv_buf_init(NULL, 0);
    return;
  }
  *b = uv_buf_init((char *)ch->data + LWS_PRE + 1, CE_KUBE_STDIN_FRAME);
}

static void on_local_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  conn_t *cn = s->data;
  chunk_t *ch = b->base != NULL ? (chunk_t *)(b->base - LWS_PRE - 1 - offsetof(chunk_t, data))
                                : NULL;
  if (n <= 0) {
    free(ch);
    if (n == 0)
      return;
    /* EOF or an error: what is queued still goes, then the tunnel ends. */
    cn->local_eof = true;
    uv_read_stop(s);
    cn->local_reading = false;
    if (cn->wsi != NULL && !cn->lws_gone)
      lws_callback_on_writable(cn->wsi);
    return;
  }
  /* What is queued is counted as allocated: a small read gets a chunk of
   * its size (1-byte segments would otherwise hold 64 KiB each). */
  if ((size_t)n < CE_KUBE_STDIN_FRAME / 2) {
    chunk_t *small = realloc(ch, CHUNK_COST((size_t)n));
    if (small != NULL)
      ch = small;
  }
  ch->next = NULL;
  ch->len = (size_t)n;
  ch->data[LWS_PRE] = CE_KUBE_PF_DATA;
  if (cn->q_tail != NULL)
    cn->q_tail->next = ch;
  else
    cn->q_head = ch;
  cn->q_tail = ch;
  cn->q_bytes += CHUNK_COST((size_t)n);
  if (cn->q_bytes > CE_KUBE_FWD_QUEUE_MAX) {
    uv_read_stop(s);
    cn->local_reading = false;
  }
  if (cn->wsi != NULL && !cn->lws_gone)
    lws_callback_on_writable(cn->wsi);
}

static void on_local_written(uv_write_t *req, int status) {
  conn_t *cn = req->data;
  free(req);
  if (cn->rx_paused && cn->local_open && cn->wsi != NULL && !cn->lws_gone &&
      cn->local.tcp.write_queue_size < CE_KUBE_FWD_QUEUE_MAX) {
    cn->rx_paused = false;
    lws_rx_flow_control(cn->wsi, 1);
  }
}

static int tunnel_to_local(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (n == 0 || !cn->local_open)
    return 0;
  uv_write_t *req = malloc(sizeof(*req) + n);
  if (req == NULL)
    return -1;
  char *copy = (char *)(req + 1);
  memcpy(copy, d, n);
  req->data = cn;
  uv_buf_t b = uv_buf_init(copy, (unsigned)n);
  if (uv_write(req, (uv_stream_t *)&cn->local, &b, 1, on_local_written) != 0) {
    free(req);
    return -1;
  }
  if (cn->local.tcp.write_queue_size > CE_KUBE_FWD_QUEUE_MAX && !cn->rx_paused) {
    cn->rx_paused = true;
    lws_rx_flow_control(wsi, 0);
  }
  return 0;
}

static int tunnel_rx(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (!cn->in_msg) {
    unsigned chan;
    const uint8_t *data;
    size_t dl;
    if (!ce_kube_frame_split(d, n, &chan, &data, &dl))
      return 0;
    cn->cur_chan = chan;
    cn->in_msg = true;
    d = data;
    n = dl;
  }
  bool end = lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0;
  if (end)
    cn->in_msg = false;
  if (cn->cur_chan > CE_KUBE_PF_ERROR)
    return 0;
  ce_kube_prefix_t *pre = &cn->pre[cn->cur_chan];
  size_t skip = 0;
  uint16_t port = cn->fwd != NULL ? cn->fwd->port : 0;
  if (!ce_kube_prefix_done(pre)) {
    if (ce_kube_prefix_feed(pre, port, d, n, &skip) != 0) {
      conn_finish(cn, CE_EPROTO, "port-forward: the %s channel named port %u, not %u",
                  cn->cur_chan == 0 ? "data" : "error",
                  (unsigned)(pre->bytes[0] | pre->bytes[1] << 8), port);
      cn->failed = true;
      return -1;
    }
    d += skip;
    n -= skip;
  }
  if (cn->cur_chan == CE_KUBE_PF_DATA)
    return tunnel_to_local(cn, wsi, d, n);
  size_t room = FWD_ERR_MAX - cn->fwd_err.n;
  if (!buf_add(&cn->fwd_err, d, n < room ? n : room))
    return -1;
  if (end && cn->fwd_err.n > 0) {
    char s[SHOWN_MAX];
    ce_text_sanitize(s, sizeof(s), cn->fwd_err.p, cn->fwd_err.n, 0);
    conn_finish(cn, CE_EPROTO, "port-forward to %s/%s:%u: %s", cn->fwd->ns, cn->fwd->pod,
                port, s);
    cn->failed = true;
    return -1;
  }
  return 0;
}

static int tunnel_write(conn_t *cn, struct lws *wsi) {
  chunk_t *ch = cn->q_head;
  if (ch == NULL) {
    if (cn->local_eof) {
      conn_finish(cn, CE_OK, NULL);
      return -1;
    }
    return 0;
  }
  cn->q_head = ch->next;
  if (cn->q_head == NULL)
    cn->q_tail = NULL;
  cn->q_bytes -= CHUNK_COST(ch->len);
  int w = lws_write(wsi, ch->data + LWS_PRE, ch->len + 1, LWS_WRITE_BINARY);
  free(ch);
  if (w < 0)
    return -1;
  if (!cn->local_reading && !cn->local_eof && cn->local_open &&
      cn->q_bytes <= CE_KUBE_FWD_QUEUE_MAX / 2) {
    if (uv_read_start((uv_stream_t *)&cn->local, on_local_alloc, on_local_read) == 0)
      cn->local_reading = true;
  }
  if (cn->q_head != NULL || cn->local_eof)
    lws_callback_on_writable(wsi);
  return 0;
}

static int tunnel_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                     size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (cn->local_open &&
        uv_read_start((uv_stream_t *)&cn->local, on_local_alloc, on_local_read) == 0)
      cn->local_reading = true;
    return 0;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    if (cn->finished)
      return -1;
    return tunnel_rx(cn, wsi, in, len);
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    if (cn->finished)
      return -1;
    return tunnel_write(cn, wsi);
  case LWS_CALLBACK_CLIENT_CLOSED:
    conn_finish(cn, CE_OK, NULL);
    tunnel_close_local(cn);
    conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}

/* ---- the callback ---------------------------------------------------------------------- */

static int kube_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len) {
  if (trace_on())
    fprintf(stderr, "condukt-egress port: kube: wsi %p reason %d len %zu conn %p\n",
            (void *)wsi, (int)reason, len, wsi != NULL ? lws_get_opaque_user_data(wsi) : NULL);
  conn_t *cn = wsi != NULL ? lws_get_opaque_user_data(wsi) : NULL;
  if (cn == NULL) {
    /* No operation to check the certificate for: refused. */
    if (reason == LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION) {
      X509_STORE_CTX_set_error((X509_STORE_CTX *)user, X509_V_ERR_APPLICATION_VERIFICATION);
      return 1;
    }
    return 0;
  }
  /* Not ci.pwsi: libwebsockets clears that pointer at the upgrade. */
  cn->wsi = wsi;
  if (cn->k == NULL) {
    /* The handle was closed under a live connection: end it. */
    switch (reason) {
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
    case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
    case LWS_CALLBACK_CLIENT_CLOSED:
    case LWS_CALLBACK_WSI_DESTROY:
      if (cn->kind == K_TUNNEL)
        tunnel_close_local(cn);
      conn_lws_gone(cn);
      return 0;
    case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
      return 1;
    default:
      return -1;
    }
  }
  switch (reason) {
  case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
    return tls_verify(cn, (X509_STORE_CTX *)user, (int)len);
  case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
    int status = (int)lws_http_client_http_response(wsi);
    bool exec_auth = cn->k->cfg.auth == CE_KUBE_AUTH_EXEC;
    if (status == 401 && exec_auth && cn->kind == K_TUNNEL && cn->k->cred_valid) {
      /* A tunnel is not retried (its client is waiting): the next
       * connection runs the plugin again. */
      ce_kube_cred_free(&cn->k->cred);
      cn->k->cred_valid = false;
    }
    if (status == 401 && cn->kind == K_EXEC && exec_auth && !cn->retried) {
      conn_retry_after_401(cn);
    } else if (status >= 200 && cn->kind != K_HTTP) {
      conn_finish(cn, upgrade_code(status),
                  "%s: the API server refused the WebSocket upgrade with HTTP %d",
                  cn->kind == K_EXEC ? "kube_exec" : "port-forward", status);
    } else {
      char why[200];
      ce_text_sanitize(why, sizeof(why), in != NULL ? (const char *)in : "",
                       in != NULL ? strnlen((const char *)in, 512) : 0, 0);
      conn_connect_error(cn, why);
    }
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      tunnel_close_local(cn);
    }
    conn_lws_gone(cn);
    return 0;
  }
  case LWS_CALLBACK_WSI_DESTROY:
    if (!cn->finished)
      conn_connect_error(cn, "the connection ended");
    if (cn->kind == K_TUNNEL)
      tunnel_close_local(cn);
    conn_lws_gone(cn);
    return 0;
  default:
    break;
  }
  if (reason == LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER && cn->kind != K_HTTP) {
    unsigned char **p = (unsigned char **)in;
    return add_auth_header(cn, wsi, p, *p + len);
  }
  switch (cn->kind) {
  case K_HTTP:
    return http_cb(cn, wsi, reason, in, len);
  case K_EXEC:
    return exec_cb(cn, wsi, reason, in, len);
  default:
    return tunnel_cb(cn, wsi, reason, in, len);
  }
}

static void conn_connect(conn_t *cn) {
  ce_kube_t *k = cn->k;
  struct lws_client_connect_info ci;
  memset(&ci, 0, sizeof(ci));
  ci.context = k->c->lws;
  ci.vhost = k->vh.vh;
  ci.address = k->cfg.host;
  ci.port = (int)k->cfg.port;
  ci.path = cn->url;
  ci.host = cn->hosthdr;
  ci.origin = cn->hosthdr;
  ci.alpn = "http/1.1";
  /* A redirect is never followed (the bearer token would go along): a
   * 3xx is the answer. */
  ci.ssl_connection = LCCSCF_USE_SSL | LCCSCF_SKIP_SERVER_CERT_HOSTNAME_CHECK |
                      LCCSCF_HTTP_NO_FOLLOW_REDIRECT;
  if (k->cfg.insecure)
    ci.ssl_connection |= LCCSCF_ALLOW_SELFSIGNED | LCCSCF_ALLOW_EXPIRED | LCCSCF_ALLOW_INSECURE;
  if (cn->kind == K_HTTP) {
    ci.method = cn->method;
    ci.protocol = "kube-http";
  } else {
    ci.protocol = cn->kind == K_EXEC ? "v5.channel.k8s.io,v4.channel.k8s.io"
                                     : "v4.channel.k8s.io";
    ci.local_protocol_name = "kube-ws";
  }
  ci.opaque_user_data = cn;
  /* The wsi's SSL is made from the vhost's context later: the context
   * stays until the conn is freed, even if the handle goes first. */
  if (cn->ctx == NULL && SSL_CTX_up_ref(k->vh.ctx) == 1)
    cn->ctx = k->vh.ctx;
  if (cn->ctx == NULL) {
    conn_fail_early(cn, CE_ENOMEM, "out of memory");
    return;
  }
  cn->in_connect = true;
  struct lws *w = lws_client_connect_via_info(&ci);
  cn->in_connect = false;
  if (!cn->lws_gone && w != NULL)
    cn->wsi = w;
  if (cn->lws_gone) {
    conn_maybe_free(cn);
    return;
  }
  if (w == NULL) {
    cn->wsi = NULL;
    conn_connect_error(cn, "libwebsockets could not start the connection");
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      tunnel_close_local(cn);
    }
    conn_lws_gone(cn);
  }
}

/* ---- credentials ----------------------------------------------------------------------- */

/* Re-reads a token file when its modification time changed. */
static int load_token_file(ce_kube_t *k, char *err, size_t errlen) {
  struct stat st;
  char s[SHOWN_MAX];
  if (stat(k->cfg.token_file, &st) != 0)
    return efmt(err, errlen, errno == ENOENT ? CE_ENOENT : CE_EIO,
                "the token file \"%s\" cannot be read: %s", shown(s, k->cfg.token_file),
                strerror(errno));
  if (k->token_loaded && st.st_mtim.tv_sec == k->token_mtime.tv_sec &&
      st.st_mtim.tv_nsec == k->token_mtime.tv_nsec)
    return CE_OK;
  char *data = NULL;
  size_t n = 0;
  char why[2 * SHOWN_MAX];
  int rc = ce_kube_read_file(k->cfg.token_file, 64 * 1024, &data, &n, why, sizeof(why));
  if (rc != CE_OK)
    return efmt(err, errlen, rc, "the token file: %s", why);
  while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == '\r' || data[n - 1] == ' '))
    data[--n] = '\0';
  if (!ce_kube_token_ok(data, n)) {
    OPENSSL_clear_free(data, n + 1);
    return efmt(err, errlen, CE_EINVAL,
                "the token file \"%s\" holds no token (one line of printable ASCII without "
                "spaces)",
                shown(s, k->cfg.token_file));
  }
  if (k->token != NULL)
    OPENSSL_clear_free(k->token, strlen(k->token));
  k->token = data;
  k->token_mtime = st.st_mtim;
  k->token_loaded = true;
  return CE_OK;
}

static bool cred_fresh(ce_kube_t *k) {
  if (!k->cred_valid)
    return false;
  return !k->cred.expires || time(NULL) + CRED_SLACK_S < k->cred.expiry;
}

static void plugin_start(ce_kube_t *k);

static void conn_fail_early(conn_t *cn, int code, const char *msg) {
  conn_finish(cn, code, "%s", msg);
  if (cn->kind == K_TUNNEL) {
    cn->failed = true;
    tunnel_close_local(cn);
  }
  conn_lws_gone(cn);
}

/* Credentials are at hand: connect (or fail). */
static void conn_go(conn_t *cn) {
  ce_kube_t *k = cn->k;
  char err[CE_KUBE_MSG_MAX];
  if (k->cfg.auth == CE_KUBE_AUTH_TOKEN_FILE) {
    int rc = load_token_file(k, err, sizeof(err));
    if (rc != CE_OK) {
      conn_fail_early(cn, rc, err);
      return;
    }
  }
  const char *tok = NULL;
  if (k->cfg.auth == CE_KUBE_AUTH_TOKEN)
    tok = k->cfg.token;
  else if (k->cfg.auth == CE_KUBE_AUTH_TOKEN_FILE)
    tok = k->token;
  else if (k->cfg.auth == CE_KUBE_AUTH_EXEC)
    tok = k->cred.token;
  if (tok != NULL) {
    cn->bearer = strdup(tok);
    if (cn->bearer == NULL) {
      conn_fail_early(cn, CE_ENOMEM, "out of memory");
      return;
    }
  }
  conn_connect(cn);
}

static void conn_start(conn_t *cn) {
  ce_kube_t *k = cn->k;
  if (cn->timeout_ms > 0)
    uv_timer_start(&cn->timer, on_conn_timeout, cn->timeout_ms, 0);
  if (k->cfg.auth != CE_KUBE_AUTH_EXEC || cred_fresh(k)) {
    conn_go(cn);
    return;
  }
  cn->waiting = true;
  cn->wnext = NULL;
  if (k->waiting_tail != NULL)
    k->waiting_tail->wnext = cn;
  else
    k->waiting = cn;
  k->waiting_tail = cn;
  if (k->plugin == NULL)
    plugin_start(k);
}

/* Runs (or fails) every conn waiting for credentials. */
static void waiting_release(ce_kube_t *k, int code, const char *msg) {
  conn_t *w = k->waiting;
  k->waiting = k->waiting_tail = NULL;
  while (w != NULL) {
    conn_t *nx = w->wnext;
    w->waiting = false;
    if (w->finished) /* timed out meanwhile */
      conn_lws_gone(w);
    else if (code == CE_OK)
      conn_go(w);
    else
      conn_fail_early(w, code, msg);
    w = nx;
  }
}

static void conn_retry_after_401(conn_t *cn) {
  ce_kube_t *k = cn->k;
  conn_t *nc = conn_new(k, cn->kind);
  if (nc == NULL) {
    conn_finish(cn, CE_ENOMEM, "out of memory");
    return;
  }
  /* The request moves to the new conn; the old one ends silently. */
  nc->retried = true;
  nc->hcb = cn->hcb;
  nc->harg = cn->harg;
  nc->ecb = cn->ecb;
  nc->earg = cn->earg;
  memcpy(nc->method, cn->method, sizeof(nc->method));
  nc->url = cn->url;
  cn->url = NULL;
  nc->body = cn->body;
  nc->body_len = cn->body_len;
  cn->body = NULL;
  nc->ctype = cn->ctype;
  cn->ctype = NULL;
  nc->stdin_data = cn->stdin_data;
  nc->stdin_len = cn->stdin_len;
  nc->has_stdin = cn->has_stdin;
  cn->stdin_data = NULL;
  nc->max_output = cn->max_output;
  nc->timeout_ms = cn->timeout_ms;
  cn->silent = true;
  conn_finish(cn, CE_EPERM, NULL);
  /* The credential was refused: run the plugin again, once. */
  if (k->cred_valid) {
    ce_kube_cred_free(&k->cred);
    k->cred_valid = false;
  }
  conn_start(nc);
}

static void on_plugin_closed(uv_handle_t *h) {
  plugin_t *pl = h->data;
  if (--pl->handles == 0) {
    buf_free(&pl->o);
    if (pl->e.p != NULL)
      OPENSSL_cleanse(pl->e.p, pl->e.n);
    buf_free(&pl->e);
    free(pl);
  }
}

/* SIGKILL to the plugin's process group (it runs in a session of its
 * own): what it left running goes too. */
static void plugin_kill(plugin_t *pl) {
  if (pl->spawned && pl->proc.pid > 0)
    kill(-pl->proc.pid, SIGKILL);
}

/* Closes the pipes and the timer; the process handle only once the
 * plugin was reaped (on_plugin_exit closes it otherwise: closing it
 * earlier would leave a zombie). */
static void plugin_close(plugin_t *pl) {
  if (pl->spawned && pl->exited && !uv_is_closing((uv_handle_t *)&pl->proc))
    uv_close((uv_handle_t *)&pl->proc, on_plugin_closed);
  uv_handle_t *hs[] = {(uv_handle_t *)&pl->out, (uv_handle_t *)&pl->err,
                       (uv_handle_t *)&pl->timer};
  for (size_t i = 0; i < 3; i++)
    if (!uv_is_closing(hs[i]))
      uv_close(hs[i], on_plugin_closed);
}

/* Installs a new credential; a client certificate needs a new vhost. */
static int cred_install(ce_kube_t *k, ce_kube_cred_t *cred, char *err, size_t errlen) {
  if (cred->cert_pem != NULL) {
    bool same = k->cred_valid && k->cred.cert_pem != NULL &&
                strcmp(k->cred.cert_pem, cred->cert_pem) == 0 &&
                strcmp(k->cred.key_pem, cred->key_pem) == 0;
    if (!same) {
      vhost_t *old = realloc(k->old_vh, (k->n_old_vh + 1) * sizeof(*old));
      if (old == NULL)
        return efmt(err, errlen, CE_ENOMEM, "out of memory");
      k->old_vh = old;
      vhost_t v;
      int rc = make_vhost(k, cred->cert_pem, cred->cert_len, cred->key_pem, cred->key_len, &v,
                          err, errlen);
      if (rc != CE_OK)
        return rc;
      /* Connections may still run on the old vhost: it goes at close. */
      k->old_vh[k->n_old_vh++] = k->vh;
      k->vh = v;
    }
  }
  if (k->cred_valid)
    ce_kube_cred_free(&k->cred);
  k->cred = *cred;
  memset(cred, 0, sizeof(*cred));
  k->cred_valid = true;
  return CE_OK;
}

static void plugin_done(plugin_t *pl) {
  ce_kube_t *k = pl->k;
  char err[CE_KUBE_MSG_MAX];
  int rc = CE_OK;
  char s[SHOWN_MAX], e[SHOWN_MAX];
  shown(s, k->cfg.exec.argv[0]);
  ce_text_sanitize(e, sizeof(e), pl->e.p != NULL ? pl->e.p : "", pl->e.n, 0);
  if (pl->timed_out)
    rc = efmt(err, sizeof(err), CE_ETIMEDOUT, "exec plugin \"%s\" ran over %u ms", s,
              CE_KUBE_PLUGIN_TIMEOUT_MS);
  else if (pl->too_big)
    rc = efmt(err, sizeof(err), CE_ETOOBIG, "exec plugin \"%s\" wrote over %u bytes", s,
              CE_KUBE_PLUGIN_OUTPUT_MAX);
  else if (pl->term_signal != 0 || pl->exit_status != 0)
    rc = efmt(err, sizeof(err), CE_EPERM, "exec plugin \"%s\" failed (%s %d): %s", s,
              pl->term_signal != 0 ? "signal" : "exit status",
              pl->term_signal != 0 ? pl->term_signal : (int)pl->exit_status, e);
  if (rc == CE_OK) {
    ce_kube_cred_t cred;
    char why[256];
    rc = ce_kube_cred_parse(pl->o.p != NULL ? pl->o.p : "", pl->o.n, k->cfg.exec.api_version,
                            &cred, why, sizeof(why));
    if (rc != CE_OK)
      efmt(err, sizeof(err), rc, "exec plugin \"%s\": %s", s, why);
    else
      rc = cred_install(k, &cred, err, sizeof(err));
    ce_kube_cred_free(&cred);
  }
  if (pl->o.p != NULL)
    OPENSSL_cleanse(pl->o.p, pl->o.n);
  k->plugin = NULL;
  pl->k = NULL;
  plugin_close(pl);
  waiting_release(k, rc, err);
}

static void on_plugin_timeout(uv_timer_t *t);

static void plugin_step(plugin_t *pl) {
  if (--pl->pending == 0 && pl->k != NULL)
    plugin_done(pl);
}

static void on_plugin_exit(uv_process_t *proc, int64_t status, int sig) {
  plugin_t *pl = proc->data;
  pl->exited = true;
  if (pl->k == NULL) {
    /* Abandoned (its handle was closed): reaped now, the handle goes. */
    uv_close((uv_handle_t *)&pl->proc, on_plugin_closed);
    return;
  }
  pl->exit_status = status;
  pl->term_signal = sig;
  /* Something it started may still hold its stdout or stderr: the EOFs
   * get a short grace, then what came is what there is. */
  if (pl->pending > 1)
    uv_timer_start(&pl->timer, on_plugin_timeout, CE_KUBE_PLUGIN_GRACE_MS, 0);
  plugin_step(pl);
}

static void on_plugin_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  static char chunk[65536];
  *b = uv_buf_init(chunk, sizeof(chunk));
}

static void on_plugin_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  plugin_t *pl = s->data;
  bool is_out = s == (uv_stream_t *)&pl->out;
  if (n > 0) {
    buf_t *into = is_out ? &pl->o : &pl->e;
    size_t max = is_out ? CE_KUBE_PLUGIN_OUTPUT_MAX : 4096;
    if (into->n + (size_t)n > max) {
      if (is_out)
        pl->too_big = true;
      n = (ssize_t)(max - into->n);
    }
    if (n > 0 && !buf_add(into, b->base, (size_t)n) && is_out)
      pl->too_big = true;
    return;
  }
  if (n < 0) {
    uv_read_stop(s);
    plugin_step(pl);
  }
}

static void on_plugin_timeout(uv_timer_t *t) {
  plugin_t *pl = t->data;
  if (pl->k == NULL)
    return;
  if (!pl->exited) {
    /* Over its time: the whole group is killed; the exit follows. */
    pl->timed_out = true;
    plugin_kill(pl);
    return;
  }
  /* Exited, and the grace for the EOFs is over: what is left of the
   * group goes, the pipes are closed by plugin_done(). */
  plugin_kill(pl);
  uv_read_stop((uv_stream_t *)&pl->out);
  uv_read_stop((uv_stream_t *)&pl->err);
  pl->pending = 1;
  plugin_step(pl);
}

/* KUBERNETES_EXEC_INFO, as client-go writes it. */
static char *exec_info(ce_kube_t *k) {
  json_t *spec = json_pack("{s:b}", "interactive", 0);
  if (spec != NULL && k->cfg.exec.provide_cluster_info) {
    json_t *cl = json_pack("{s:s, s:b}", "server", k->cfg.server,
                           "insecure-skip-tls-verify", k->cfg.insecure);
    if (cl != NULL && k->cfg.ca_pem != NULL) {
      size_t bl = 4 * ((k->cfg.ca_len + 2) / 3) + 1;
      unsigned char *b = malloc(bl);
      if (b != NULL) {
        EVP_EncodeBlock(b, (const unsigned char *)k->cfg.ca_pem, (int)k->cfg.ca_len);
        json_object_set_new(cl, "certificate-authority-data", json_string((char *)b));
        free(b);
      }
    }
    if (cl != NULL && k->cfg.tls_server_name != NULL)
      json_object_set_new(cl, "tls-server-name", json_string(k->cfg.tls_server_name));
    json_object_set_new(spec, "cluster", cl);
  }
  json_t *root = json_pack("{s:s, s:s, s:o}", "apiVersion", k->cfg.exec.api_version, "kind",
                           "ExecCredential", "spec", spec);
  char *s = root != NULL ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  return s;
}

static void plugin_start(ce_kube_t *k) {
  char err[CE_KUBE_MSG_MAX];
  plugin_t *pl = calloc(1, sizeof(*pl));
  char *info = exec_info(k);
  size_t nenv = 0;
  for (char **e = environ; e != NULL && *e != NULL; e++)
    nenv++;
  char **env = calloc(nenv + k->cfg.exec.envc + 2, sizeof(char *));
  char *info_kv = NULL;
  if (pl == NULL || info == NULL || env == NULL) {
    free(pl);
    free(info);
    free(env);
    waiting_release(k, CE_ENOMEM, "out of memory starting the exec plugin");
    return;
  }
  size_t ie = strlen(info) + sizeof("KUBERNETES_EXEC_INFO=");
  info_kv = malloc(ie);
  if (info_kv != NULL)
    snprintf(info_kv, ie, "KUBERNETES_EXEC_INFO=%s", info);
  free(info);
  /* The configured env wins over ours, which wins over nothing. */
  size_t m = 0;
  for (size_t i = 0; i < nenv; i++) {
    const char *e = environ[i];
    size_t nl = strcspn(e, "=");
    bool overridden = strncmp(e, "KUBERNETES_EXEC_INFO=", 21) == 0;
    for (size_t j = 0; j < k->cfg.exec.envc && !overridden; j++)
      overridden = strncmp(k->cfg.exec.env[j], e, nl + 1) == 0;
    if (!overridden)
      env[m++] = (char *)e;
  }
  for (size_t j = 0; j < k->cfg.exec.envc; j++)
    env[m++] = k->cfg.exec.env[j];
  if (info_kv != NULL)
    env[m++] = info_kv;
  env[m] = NULL;

  pl->k = k;
  uv_pipe_init(k->c->loop, &pl->out, 0);
  uv_pipe_init(k->c->loop, &pl->err, 0);
  uv_timer_init(k->c->loop, &pl->timer);
  pl->out.data = pl->err.data = pl->timer.data = pl->proc.data = pl;
  pl->handles = 3;
  uv_stdio_container_t stdio[3] = {
      {.flags = UV_IGNORE},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&pl->out},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&pl->err},
  };
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.exit_cb = on_plugin_exit;
  po.file = k->cfg.exec.argv[0];
  po.args = k->cfg.exec.argv;
  po.env = env;
  po.stdio = stdio;
  po.stdio_count = 3;
  /* A session and process group of its own: a timeout or a closed
   * handle kills the group. */
  po.flags = UV_PROCESS_DETACHED;
  int rc = uv_spawn(k->c->loop, &pl->proc, &po);
  /* The process handle is initialised even when the spawn failed, and
   * must be closed either way. */
  pl->spawned = true;
  pl->handles++;
  free(env);
  if (info_kv != NULL)
    OPENSSL_clear_free(info_kv, strlen(info_kv));
  if (rc != 0) {
    char s[SHOWN_MAX];
    pl->exited = true; /* nothing to reap */
    efmt(err, sizeof(err), CE_EPERM, "exec plugin \"%s\" cannot run: %s",
         shown(s, k->cfg.exec.argv[0]), uv_strerror(rc));
    pl->k = NULL;
    plugin_close(pl);
    waiting_release(k, CE_EPERM, err);
    return;
  }
  pl->pending = 3;
  k->plugin = pl;
  uv_read_start((uv_stream_t *)&pl->out, on_plugin_alloc, on_plugin_read);
  uv_read_start((uv_stream_t *)&pl->err, on_plugin_alloc, on_plugin_read);
  uv_timer_start(&pl->timer, on_plugin_timeout, CE_KUBE_PLUGIN_TIMEOUT_MS, 0);
}

/* ---- handles --------------------------------------------------------------------------- */

ce_kube_client_t *ce_kube_client_new(uv_loop_t *loop) {
  ce_kube_client_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->loop = loop;
  c->next_kube = 1;
  c->next_fchan = 1;
  return c;
}

int ce_kube_open(ce_kube_client_t *c, ce_kube_config_t *cfg, ce_kube_t **out, char *err,
                 size_t errlen) {
  *out = NULL;
  int rc = ensure_context(c, err, errlen);
  if (rc != CE_OK) {
    ce_kube_config_free(cfg);
    return rc;
  }
  ce_kube_t *k = calloc(1, sizeof(*k));
  if (k == NULL) {
    ce_kube_config_free(cfg);
    return efmt(err, errlen, CE_ENOMEM, "kube_open: out of memory");
  }
  k->c = c;
  k->id = c->next_kube++;
  k->cfg = *cfg;
  memset(cfg, 0, sizeof(*cfg));
  char why[300];
  rc = make_vhost(k, k->cfg.cert_pem, k->cfg.cert_len, k->cfg.key_pem, k->cfg.key_len, &k->vh,
                  why, sizeof(why));
  if (rc != CE_OK) {
    ce_kube_config_free(&k->cfg);
    free(k);
    return efmt(err, errlen, CE_ETLS, "kube_open: %s", why);
  }
  k->next = c->kubes;
  c->kubes = k;
  *out = k;
  return CE_OK;
}

ce_kube_t *ce_kube_find(ce_kube_client_t *c, uint64_t id) {
  for (ce_kube_t *k = c->kubes; k != NULL; k = k->next)
    if (k->id == id)
      return k;
  return NULL;
}

uint64_t ce_kube_id(const ce_kube_t *k) { return k->id; }

const ce_kube_config_t *ce_kube_config(const ce_kube_t *k) { return &k->cfg; }

static void on_fwd_closed(uv_handle_t *h) {
  fwd_t *f = h->data;
  free(f->path);
  free(f);
}

static void fwd_close(fwd_t *f) {
  ce_kube_client_t *c = f->c;
  for (fwd_t **pp = &c->fwds; *pp != NULL; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  f->closing = true;
  if (f->k != NULL) {
    for (conn_t *cn = f->k->conns; cn != NULL; cn = cn->next) {
      if (cn->kind != K_TUNNEL || cn->fwd != f)
        continue;
      cn->silent = true;
      cn->fwd = NULL;
      conn_finish(cn, CE_ECLOSED, NULL);
      cn->failed = true;
      tunnel_close_local(cn);
    }
  }
  if (f->is_unix && f->path != NULL)
    ce__listen_remove(f->path);
  uv_close((uv_handle_t *)&f->l, on_fwd_closed);
}

bool ce_kube_forward_close(ce_kube_client_t *c, uint64_t fchan) {
  for (fwd_t *f = c->fwds; f != NULL; f = f->next)
    if (f->id == fchan) {
      fwd_close(f);
      return true;
    }
  return false;
}

static void kube_free(ce_kube_t *k) {
  ce_kube_client_t *c = k->c;
  for (ce_kube_t **pp = &c->kubes; *pp != NULL; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  for (fwd_t *f = c->fwds, *nx; f != NULL; f = nx) {
    nx = f->next;
    if (f->k == k)
      fwd_close(f);
  }
  if (k->plugin != NULL) {
    plugin_t *pl = k->plugin;
    k->plugin = NULL;
    pl->k = NULL;
    if (!pl->exited)
      plugin_kill(pl);
    plugin_close(pl);
  }
  waiting_release(k, CE_ECLOSED, "kube: the handle was closed");
  /* Running conns end with closed; they no longer point at k. */
  for (conn_t *cn = k->conns, *nx; cn != NULL; cn = nx) {
    nx = cn->next;
    conn_finish(cn, CE_ECLOSED, "kube: the handle was closed");
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      tunnel_close_local(cn);
    }
    cn->k = NULL;
    cn->next = NULL;
    if (cn->wsi == NULL)
      conn_lws_gone(cn);
  }
  k->conns = NULL;
  for (size_t i = 0; i < k->n_old_vh; i++)
    vhost_drop(c, &k->old_vh[i]);
  free(k->old_vh);
  vhost_drop(c, &k->vh);
  if (k->token != NULL)
    OPENSSL_clear_free(k->token, strlen(k->token));
  if (k->cred_valid)
    ce_kube_cred_free(&k->cred);
  ce_kube_config_free(&k->cfg);
  free(k);
}

void ce_kube_close(ce_kube_t *k) { kube_free(k); }

void ce_kube_client_destroy(ce_kube_client_t *c) {
  if (c == NULL)
    return;
  c->destroying = true;
  while (c->fwds != NULL)
    fwd_close(c->fwds);
  /* Conns forget their wsi first: libwebsockets' own teardown then finds
   * no user data to call back into. */
  for (ce_kube_t *k = c->kubes; k != NULL; k = k->next)
    for (conn_t *cn = k->conns; cn != NULL; cn = cn->next)
      if (cn->wsi != NULL && !cn->lws_gone) {
        lws_set_opaque_user_data(cn->wsi, NULL);
        cn->wsi = NULL;
      }
  while (c->kubes != NULL) {
    ce_kube_t *k = c->kubes;
    for (conn_t *cn = k->conns; cn != NULL; cn = cn->next)
      cn->lws_gone = true;
    kube_free(k);
  }
  /* With a foreign loop this only starts: libwebsockets closes its libuv
   * handles as the loop runs on; ce_kube_client_free() finishes. */
  if (c->lws != NULL)
    lws_context_destroy(c->lws);
}

void ce_kube_client_free(ce_kube_client_t *c) {
  if (c == NULL)
    return;
  if (c->lws != NULL)
    lws_context_destroy(c->lws);
  for (size_t i = 0; i < c->n_held; i++)
    SSL_CTX_free(c->held[i]);
  free(c->held);
  free(c);
}

/* ---- operations ------------------------------------------------------------------------ */

static char *join_url(const ce_kube_t *k, const char *path) {
  size_t n = strlen(k->cfg.path_prefix) + strlen(path) + 1;
  char *u = malloc(n);
  if (u != NULL)
    snprintf(u, n, "%s%s", k->cfg.path_prefix, path);
  return u;
}

int ce_kube_request(ce_kube_t *k, const ce_kube_http_req_t *req, ce_kube_http_cb cb,
                    void *arg, char *err, size_t errlen) {
  if (strlen(req->path) + strlen(k->cfg.path_prefix) > URL_MAX)
    return efmt(err, errlen, CE_ETOOBIG, "kube_request: the path is over %u bytes", URL_MAX);
  conn_t *cn = conn_new(k, K_HTTP);
  if (cn == NULL)
    return efmt(err, errlen, CE_ENOMEM, "kube_request: out of memory");
  snprintf(cn->method, sizeof(cn->method), "%s", req->method);
  cn->hcb = cb;
  cn->harg = arg;
  cn->timeout_ms = req->timeout_ms;
  cn->url = join_url(k, req->path);
  bool oom = cn->url == NULL;
  if (req->body != NULL) {
    cn->body = malloc(req->body_len + 1);
    cn->ctype = strdup(req->content_type != NULL ? req->content_type : "application/json");
    oom = oom || cn->body == NULL || cn->ctype == NULL;
    if (cn->body != NULL)
      memcpy(cn->body, req->body, req->body_len);
    cn->body_len = req->body_len;
  }
  if (oom) {
    cn->silent = true;
    cn->finished = true;
    conn_lws_gone(cn);
    return efmt(err, errlen, CE_ENOMEM, "kube_request: out of memory");
  }
  conn_start(cn);
  return CE_OK;
}

static bool path_escape(char *u, size_t cap, size_t *used, const char *s) {
  return ce_kube_query_escape(u, cap, used, s, strlen(s));
}

static bool put(char *u, size_t cap, size_t *used, const char *s) {
  size_t n = strlen(s);
  if (*used + n >= cap)
    return false;
  memcpy(u + *used, s, n + 1);
  *used += n;
  return true;
}

int ce_kube_exec(ce_kube_t *k, const ce_kube_exec_req_t *req, ce_kube_exec_cb cb, void *arg,
                 char *err, size_t errlen) {
  char *u = malloc(URL_MAX);
  if (u == NULL)
    return efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
  size_t used = 0;
  u[0] = '\0';
  bool ok = put(u, URL_MAX, &used, k->cfg.path_prefix) &&
            put(u, URL_MAX, &used, "/api/v1/namespaces/") &&
            path_escape(u, URL_MAX, &used, req->ns) && put(u, URL_MAX, &used, "/pods/") &&
            path_escape(u, URL_MAX, &used, req->pod) &&
            put(u, URL_MAX, &used, "/exec?container=") &&
            path_escape(u, URL_MAX, &used, req->container);
  for (size_t i = 0; ok && i < req->argc; i++)
    ok = put(u, URL_MAX, &used, "&command=") && path_escape(u, URL_MAX, &used, req->argv[i]);
  ok = ok && put(u, URL_MAX, &used, req->has_stdin ? "&stdin=true" : "") &&
       put(u, URL_MAX, &used, "&stdout=true&stderr=true");
  if (!ok) {
    free(u);
    return efmt(err, errlen, CE_ETOOBIG, "kube_exec: the command makes a URL over %u bytes",
                URL_MAX);
  }
  conn_t *cn = conn_new(k, K_EXEC);
  if (cn == NULL) {
    free(u);
    return efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
  }
  cn->url = u;
  cn->ecb = cb;
  cn->earg = arg;
  cn->timeout_ms = req->timeout_ms;
  cn->max_output = req->max_output;
  cn->has_stdin = req->has_stdin;
  if (req->has_stdin) {
    cn->stdin_data = malloc(req->stdin_len + 1);
    if (cn->stdin_data == NULL) {
      cn->silent = cn->finished = true;
      conn_lws_gone(cn);
      return efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
    }
    memcpy(cn->stdin_data, req->stdin_data, req->stdin_len);
    cn->stdin_len = req->stdin_len;
  }
  conn_start(cn);
  return CE_OK;
}

static void on_refused_closed(uv_handle_t *h) { free(h); }

/* A connection over the listener's tunnel limit: accepted and closed. */
static void fwd_refuse(fwd_t *f, uv_stream_t *server) {
  uv_stream_t *s = malloc(f->is_unix ? sizeof(uv_pipe_t) : sizeof(uv_tcp_t));
  if (s == NULL)
    return;
  int rc = f->is_unix ? uv_pipe_init(f->c->loop, (uv_pipe_t *)s, 0)
                      : uv_tcp_init(f->c->loop, (uv_tcp_t *)s);
  if (rc != 0) {
    free(s);
    return;
  }
  uv_accept(server, s);
  uv_close((uv_handle_t *)s, on_refused_closed);
  char msg[128];
  snprintf(msg, sizeof(msg),
           "port-forward: a connection was refused: the listener already has %u tunnels",
           CE_KUBE_FWD_TUNNELS_MAX);
  f->cb(f->arg, f->id, msg);
}

static void on_fwd_connection(uv_stream_t *server, int status) {
  fwd_t *f = server->data;
  if (status < 0 || f->closing || f->k == NULL)
    return;
  if (f->tunnels >= CE_KUBE_FWD_TUNNELS_MAX) {
    fwd_refuse(f, server);
    return;
  }
  conn_t *cn = conn_new(f->k, K_TUNNEL);
  if (cn == NULL)
    return;
  cn->fwd = f;
  f->tunnels++;
  int rc = f->is_unix ? uv_pipe_init(f->c->loop, &cn->local.pipe, 0)
                      : uv_tcp_init(f->c->loop, &cn->local.tcp);
  if (rc != 0) {
    cn->silent = cn->finished = true;
    conn_lws_gone(cn);
    return;
  }
  cn->local.tcp.data = cn;
  cn->handles++;
  cn->local_open = true;
  if (uv_accept(server, (uv_stream_t *)&cn->local) != 0) {
    cn->silent = cn->finished = cn->failed = true;
    tunnel_close_local(cn);
    conn_lws_gone(cn);
    return;
  }
  char *u = malloc(URL_MAX);
  size_t used = 0;
  char port[16];
  snprintf(port, sizeof(port), "%u", f->port);
  bool ok = u != NULL && (u[0] = '\0', true) &&
            put(u, URL_MAX, &used, f->k->cfg.path_prefix) &&
            put(u, URL_MAX, &used, "/api/v1/namespaces/") &&
            path_escape(u, URL_MAX, &used, f->ns) && put(u, URL_MAX, &used, "/pods/") &&
            path_escape(u, URL_MAX, &used, f->pod) &&
            put(u, URL_MAX, &used, "/portforward?ports=") && put(u, URL_MAX, &used, port);
  if (!ok) {
    free(u);
    conn_fail_early(cn, CE_ENOMEM, "port-forward: out of memory");
    return;
  }
  cn->url = u;
  conn_start(cn);
}

int ce_kube_forward(ce_kube_t *k, const ce_kube_fwd_req_t *req, ce_kube_fwd_err_cb cb,
                    void *arg, uint64_t *fchan, uint16_t *bound_port, char *err,
                    size_t errlen) {
  ce_kube_client_t *c = k->c;
  ce__listen_addr_t la;
  char why[256];
  int rc = ce__listen_parse(req->listen, &la, why, sizeof(why));
  if (rc != CE_OK)
    return efmt(err, errlen, rc, "kube_forward: %s", why);
  fwd_t *f = calloc(1, sizeof(*f));
  if (f == NULL)
    return efmt(err, errlen, CE_ENOMEM, "kube_forward: out of memory");
  f->c = c;
  f->k = k;
  f->is_unix = la.is_unix;
  f->port = req->port;
  f->cb = cb;
  f->arg = arg;
  snprintf(f->ns, sizeof(f->ns), "%s", req->ns);
  snprintf(f->pod, sizeof(f->pod), "%s", req->pod);
  if (la.is_unix && (f->path = strdup(la.path)) == NULL) {
    free(f);
    return efmt(err, errlen, CE_ENOMEM, "kube_forward: out of memory");
  }
  int fd = -1, port = 0;
  /* The sidecar's own listener code: 0600 sockets, stale ones replaced,
   * live ones and other files refused. */
  rc = ce__listen_open(&la, 64, &fd, &port, why, sizeof(why));
  if (rc != CE_OK) {
    free(f->path);
    free(f);
    return efmt(err, errlen, rc, "kube_forward: %s", why);
  }
  int urc = la.is_unix ? uv_pipe_init(c->loop, &f->l.pipe, 0) : uv_tcp_init(c->loop, &f->l.tcp);
  if (urc != 0) {
    close(fd);
    if (la.is_unix)
      ce__listen_remove(la.path);
    free(f->path);
    free(f);
    return efmt(err, errlen, CE_EIO, "kube_forward: %s", uv_strerror(urc));
  }
  f->l.tcp.data = f;
  urc = la.is_unix ? uv_pipe_open(&f->l.pipe, fd) : uv_tcp_open(&f->l.tcp, fd);
  if (urc != 0)
    close(fd);
  else
    urc = uv_listen((uv_stream_t *)&f->l, 64, on_fwd_connection);
  if (urc != 0) {
    if (la.is_unix)
      ce__listen_remove(la.path);
    free(f->path);
    f->path = NULL;
    uv_close((uv_handle_t *)&f->l, on_fwd_closed);
    return efmt(err, errlen, CE_EIO, "kube_forward: cannot listen: %s", uv_strerror(urc));
  }
  *bound_port = (uint16_t)port;
  f->id = c->next_fchan++;
  f->next = c->fwds;
  c->fwds = f;
  *fchan = f->id;
  return CE_OK;
}
