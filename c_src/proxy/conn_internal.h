/*
 * The connection record shared by conn.c and h2conn.c (the HTTP/2 path,
 * docs/http2.md), h1h2.c, and stats.c (which only reads it). Nothing else
 * includes this.
 */
#ifndef CE_PROXY_CONN_INTERNAL_H
#define CE_PROXY_CONN_INTERNAL_H

#include <netdb.h>
#include <stdbool.h>
#include <uv.h>

#include "control/control.h"
#include "dns/stub.h"
#include "http1/parser.h"
#include "policy/host.h"
#include "proxy/clienthello.h"
#include "proxy/conn.h"
#include "proxy/event.h"
#include "tls/tlsconn.h"

typedef enum {
  ST_HELLO = 0,
  ST_HANDSHAKE,
  ST_HEAD,
  ST_DECIDING,
  ST_CONNECTING,
  ST_EXCHANGE,
  ST_TUNNEL,
  ST_CLOSING,
  ST_H2,
} conn_state_t;


typedef struct side {
  uv_tcp_t tcp;
  struct ce_conn *conn;
  const char *name;        /* "client" or "upstream", for traces */
  bool open;               /* tcp initialised and not yet closing */
  bool closing;            /* uv_close called, its callback not yet run */
  bool connected;
  bool reading;
  bool eof;                /* the peer finished sending */
  bool close_notify;       /* TLS: the peer's eof was a close_notify */
  bool close_after_flush;
  bool shut;               /* uv_shutdown asked: nothing more is written */
  bool shut_done;          /* ...and its callback ran */
  uv_shutdown_t shut_req;
  ce_tlsconn_t *tls;
  bool handshaken;
  uint32_t gen;            /* bumped when the handle closes; writes carry it */
  size_t queued;           /* bytes given to uv_write on this handle, not yet written */
  char *in;                /* plaintext input: NULL while empty, else a
                              CE_CONN_INPUT_MAX-byte buffer of proxy->inbufs */
  size_t in_len;
} side_t;

typedef struct {
  uv_write_t req;
  side_t *side;
  uint32_t gen;            /* side->gen when written: an older one is a past handle's */
  size_t len;
  char data[];
} write_req_t;

struct ce_conn {
  ce_proxy_t *proxy;
  ce_conn_t *next;
  ce_conn_t *prev;
  uint64_t id;
  conn_state_t state;
  side_t c;                /* the workspace */
  side_t u;                /* the upstream */
  uv_timer_t timer;
  int handles;             /* open handles still to be closed */
  bool resolving;          /* a ce_conn_resolve is in flight */
  bool connect_pending;    /* connect_next waits for the old upstream handle */
  bool dead;               /* aborting: handles closing */
  bool processing;         /* conn_process is on the stack */
  bool again;
  bool lingering;          /* closing: client write side shut, its input discarded */
  bool head_started;       /* the header timeout runs for a head begun */
  ce_clienthello_state_t hello_state;

  /* What the workspace dialled. */
  struct sockaddr_storage orig_dst;
  uint16_t port;
  bool tls;                /* the workspace speaks TLS */
  bool has_sni;
  char sni_raw[CE_CLIENTHELLO_MAX_SNI + 1];
  ce_host_t sni;           /* normalised SNI, or the destination IP when none */

  /* The upstream currently connected (or being connected). */
  char up_host[256];
  uint16_t up_port;
  ce_dns_addrs_t *addrs;   /* from ce_conn_resolve, owned */
  size_t next_addr;        /* the next one of addrs to try */
  uv_connect_t connect_req;

  /* The current request. */
  bool have_req;
  ce_reqinfo_t req;
  ce_h1_head_t head;       /* scratch for the last parsed head */
  char *up_head;           /* the request head as forwarded upstream */
  size_t up_head_len;
  char method[32];
  ce_h1_framing_t req_framing;
  ce_h1_body_t req_body;
  char *req_trailers;      /* a chunked request body's trailer section, kept to
                              forward (CE_H1_MAX_TRAILER_BYTES; until the
                              request ends; NULL when not kept) */
  bool req_keep_alive;
  bool req_upgrade;
  bool req_expect_continue; /* Expect: 100-continue: the body may never come */
  bool req_http11;         /* the client speaks HTTP/1.1 (else 1.0) */
  bool req_te_trailers;    /* TE: trailers (the client takes chunked trailers) */
  bool req_done;
  bool resp_head_done;
  bool resp_done;
  bool resp_keep_alive;
  bool resp_chunked_out;   /* re-encoding the response body as chunks */
  bool resp_close_out;     /* the client's response ends at close */
  ce_h1_body_t resp_body;
  char *resp_trailers;     /* ... of a chunked response body going chunked to
                              the workspace */
  bool denied_discard;     /* reading and dropping a denied request's body */
  uint64_t ask_id;         /* pending decision, 0 = none */
  int32_t decide_rule;
  bool decide_cache;
  bool failed_reported;
  char abort_reason[160];  /* the first failure reported: the h2 streams' closing event on abort */

  /* HTTP/2 (docs/http2.md). */
  bool offers_h2;          /* the ClientHello offered h2 */
  bool preconnecting;      /* connecting upstream before answering the hello */
  bool up_h2;              /* the upstream negotiated h2 */
  struct ce_h2conn *h2;    /* the sessions, in ST_H2 */
  bool h2_connecting;      /* ST_H2: connecting an HTTP/1.1 upstream for streams */
  bool h2_offer;           /* ... offering h2 too (after an h2 upstream's GOAWAY) */
  bool hard_deadline;      /* the timer runs to a fixed end: nothing re-arms it */
  struct ce_h1h2 *h1h2;    /* HTTP/1.1 path over an h2 upstream (h1h2.c), with c->u */
  uint64_t h1h2_retried;   /* the request (id) sent again after its stream was refused */
  uint64_t retrying;       /* the request (id) being connected again: request_allowed was said */
};

/* conn.c, for h2conn.c. */
void ce_conn_side_write(side_t *s, const char *data, size_t len);
void ce_conn_report_failed(ce_conn_t *c, const char *reason);
void ce_conn_emit(ce_conn_t *c, const ce_reqinfo_t *r, const char *name, const char *reason);
void ce_conn_abort(ce_conn_t *c);
void ce_conn_close_after_flush(ce_conn_t *c);
/* The connection failed: it ends within CE_CONN_LINGER_MS (or the idle
 * timeout if shorter) whatever the workspace does; nothing re-arms the timer. */
void ce_conn_hard_deadline(ce_conn_t *c);
void ce_conn_upstream_reset(ce_conn_t *c);
/* The target a request names (HTTP/1.1: Host or the absolute-form
 * authority; h2: :authority), checked against the connection: present, a
 * valid host with a valid optional port, and (TLS) the connection's server
 * name and the port dialled. One check for both paths: it is what stops
 * domain fronting and coalescing. */
typedef struct {
  int status;           /* 0: go on to the verdict; else 400 or 421 */
  const char *reason;   /* the event's reason when refused (static) */
  char detail[700];     /* the answer's words when refused */
  ce_verdict_t verdict; /* the policy's verdict for the host (status 0) */
} ce_target_check_t;
/* host (host_cap bytes) receives the record's host: the normalised host,
 * the raw authority when it is invalid, the connection's name when there
 * is none. label names the field in the answer ("Host", ":authority").
 * method and target (the request's path and query) go to the policy's
 * method and path conditions (docs/path-matching.md); method may be NULL. */
void ce_conn_check_target(const ce_conn_t *c, const char *auth, size_t len, const char *method, size_t method_len,
                          const char *target, size_t target_len, const char *label, char *host,
                          size_t host_cap, ce_target_check_t *t);
void ce_conn_process(ce_conn_t *c);
/* A decider's answer (the control channel's status, allow, reason,
 * cacheable) as the request's outcome: true to allow; *why the deny
 * reason (NULL when allowed): the decider's words, "denied_by_decider",
 * "decider_timeout" or "control_channel_unavailable" (fail closed). A
 * cacheable answer is cached when the rule caches (cache). One mapping
 * for the HTTP/1.1 request and the h2 stream. */
bool ce_conn_decision_outcome(ce_proxy_t *p, int status, bool allow, const char *reason, bool cacheable,
                              bool cache, int32_t rule, const char *host, const char **why);
/* The 403 text of a policy refusal, in the same words on HTTP/1.1 and
 * h2: the host, who refused ("rule 2 (deny)", "the policy default", "the
 * decider of rule 2") and the reason. The reason is kept whole up to
 * CE_CONN_DENY_REASON_MAX bytes, the control channel's limit on a
 * decider's reason, so the workspace reads everything a decider said;
 * bytes outside printable ASCII become '?'. out holds
 * CE_CONN_DENY_TEXT_MAX bytes. */
#define CE_CONN_DENY_REASON_MAX CE_CONTROL_MAX_REASON
#define CE_CONN_DENY_WHO_MAX 64u
#define CE_CONN_DENY_TEXT_MAX (128u + CE_HOST_TEXT_MAX + CE_CONN_DENY_WHO_MAX + CE_CONN_DENY_REASON_MAX)
void ce_conn_deny_text(char *out, size_t cap, const char *host, const char *who, const char *reason);
/* Moves a TLS side's decrypted bytes into its input buffer. */
void ce_conn_pump_tls_input(side_t *s);
/* Gives an empty input buffer back to the proxy's pool (docs/proxy.md
 * "Memory"); a side with bytes keeps it. */
void ce_conn_release_input(side_t *s);
/* The one way an upstream host becomes addresses, for conn.c and
 * h2conn.c alike: the proxy's own resolver (docs/dns.md: the hosts table
 * of --hosts, else the --dns-upstream resolvers; never getaddrinfo, so
 * nothing the workspace can write decides where an allowed name
 * connects), then the private-address rule (loopback, private and
 * link-local addresses only when the policy names them, DESIGN §4),
 * in resolver order. The callback runs once, later: status 0 with keep
 * (at least one address, owned by the callee, free() it), or 502
 * (resolution failed: reason "upstream_unreachable: cannot resolve HOST:
 * ...") or 403 (every address refused: reason
 * "upstream_private_address: ADDR") with keep NULL. c must stay alive
 * until then (count the lookup as the callers do). Returns CE_OK, or
 * CE_EAGAIN (the resolver is busy), CE_EINVAL, CE_ENOMEM with no
 * callback. */
typedef void (*ce_conn_resolved_cb)(void *data, int status, ce_dns_addrs_t *keep, const char *reason);
int ce_conn_resolve(ce_conn_t *c, const char *host, uint16_t port, ce_conn_resolved_cb cb, void *data);
/* A handle (or lookup) of h2conn.c counted in c->handles is done: may
 * free the connection, so the caller touches nothing after. */
void ce_conn_release(ce_conn_t *c);
/* Bytes moved: the idle timer starts again. */
void ce_conn_touch(ce_conn_t *c);
/* ST_H2 without an h2 upstream: (re)connects the SNI host for HTTP/1.1
 * (resolve, private-address rule, marked socket, verified TLS offering
 * http/1.1, or h2 and http/1.1 with offer_h2: after an h2 upstream's
 * GOAWAY, docs/http2.md §6) under the connect timeout; ends in
 * ce_h2conn_upstream_done (which reads the ALPN that was picked). */
void ce_conn_h2_connect(ce_conn_t *c, bool offer_h2);

/* The current HTTP/1.1 exchange failed on the upstream's side: 502 in
 * words when no response head went out, else the connection ends. */
void ce_conn_failed_mid_response(ce_conn_t *c, const char *reason);
/* The current HTTP/1.1 exchange's response is complete. */
void ce_conn_finish_exchange(ce_conn_t *c);
/* The h2 upstream refused the current exchange's stream before it
 * processed any of it (a GOAWAY, docs/http2.md §6): the upstream goes and
 * the request is sent again over a new connection, made like the first. */
void ce_conn_retry_exchange(ce_conn_t *c);

/* h1h2.c: an HTTP/1.1 workspace over an h2 upstream (docs/http2.md §6). */
struct ce_h1h2;
/* Opens the stream for the current request (c->up_head), creating the
 * session on c->u first. CE_OK, CE_ENOMEM or CE_EINVAL (the head cannot
 * be expressed in h2). */
int ce_h1h2_begin(ce_conn_t *c);
/* ST_EXCHANGE: moves the request body, the upstream's frames and the
 * response; ends the exchange (ce_conn_finish_exchange or
 * ce_conn_failed_mid_response). */
void ce_h1h2_process(ce_conn_t *c);
/* Between exchanges: the upstream's frames (SETTINGS, PING, GOAWAY); an
 * upstream that ended goes. */
void ce_h1h2_idle(ce_conn_t *c);
/* May the session take another request? */
bool ce_h1h2_usable(ce_conn_t *c);
void ce_h1h2_free(struct ce_h1h2 *h);

/* h2conn.c. */
struct ce_h2conn;
int ce_h2conn_start(ce_conn_t *c);
void ce_h2conn_process(ce_conn_t *c);
void ce_h2conn_timeout(ce_conn_t *c);
void ce_h2conn_drain(ce_conn_t *c);
void ce_h2conn_abort(ce_conn_t *c, const char *reason);
void ce_h2conn_free(struct ce_h2conn *h);
/* What an h2 connection holds beyond c->c and c->u (stats.c): bytes
 * queued towards its own upstream connections (*queued), and its
 * streams' data buffers and request heads (*streams). */
void ce_h2conn_held(const struct ce_h2conn *h, size_t *queued, size_t *streams);
/* Reading on the pool's own upstream connections (from update_reading). */
void ce_h2conn_update_reading(ce_conn_t *c);
/* conn_abort: closes the pool's own handles and cancels its lookups. */
void ce_h2conn_close_handles(ce_conn_t *c);
/* The HTTP/1.1 upstream asked by ce_conn_h2_connect is ready (status 0) or
 * could not be had (status 502, 504 or 403 and reason). */
void ce_h2conn_upstream_done(ce_conn_t *c, int status, const char *reason);

#endif
