/*
 * HTTP/2 between the workspace and its upstreams (docs/http2.md): the
 * types and limits shared by the files of this folder, which is internal
 * to the proxy (nothing outside c_src/proxy includes it).
 *
 *   server.c    the workspace's session: streams, their request heads,
 *               local answers, the exchange's ops, the connection's driver
 *   upstream.c  h2 upstream connections: client sessions, their streams,
 *               GOAWAY and the resend of refused streams
 *   pool.c      HTTP/1.1 upstream connections for h2 streams: the queue,
 *               the pool (each connection made by the upstream connector),
 *               one exchange at a time on each
 *   h1h2.c      the other way round: an HTTP/1.1 workspace over an h2 upstream
 *
 * Every stream is evaluated on its own (proxy/exchange.h); bytes move
 * through bounded per-stream buffers, and a window is opened again
 * (nghttp2_session_consume) only when its bytes were taken by the other
 * side, so a slow reader stops the writer within one window. Everything
 * runs inside conn_process() (conn.c), never re-entered: the nghttp2
 * callbacks only change records and submit frames; bytes move in
 * ce_h2conn_process().
 */
#ifndef CE_PROXY_HTTP2_INTERNAL_H
#define CE_PROXY_HTTP2_INTERNAL_H

#include <errno.h>
#include <nghttp2/nghttp2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "h2/guard.h"
#include "h2/headers.h"
#include "h2/session.h"
#include "h2/streambuf.h"
#include "http1/writer.h"
#include "proxy/conn_internal.h"
#include "proxy/netaddr.h"
#include "proxy/proxy.h"
#include "proxy/transport.h"
#include "tls/context.h"

/* Per stream and direction: one stream window (docs/http2.md §4). The
 * workspace gets CE_H2_STREAM_BUF: what a stream's request body buffer
 * (up) holds, and an HTTP/1.1 upstream's response buffer (down). An h2
 * upstream gets CE_H2_UP_STREAM_WINDOW, the bound of a down buffer: 1 MiB
 * took a 1 GiB download in two fifths of the time of 64 KiB
 * (bench/PROFILE.md "Bulk: windows and copies"). What the down buffers
 * hold together is bounded by the upstream connections' windows (1 MiB
 * each) and CE_H2_ORPHAN_BUDGET; what they allocate follows what they
 * hold (h2/streambuf.h: chunks freed as they are taken). */
#define CE_H2_STREAM_BUF 65535u
#define CE_H2_CONN_WINDOW (1024 * 1024)
#define CE_H2_UP_STREAM_WINDOW CE_H2_CONN_WINDOW
/* The response bytes held for streams whose h2 upstream connection is
 * gone (h2__orphaned): past it no new upstream connection is opened (a
 * fresh connection window) until the workspace reads them; the streams
 * wait in the queue, and fail with 503 after the connect timeout. One
 * closing connection leaves at most one window, so this only holds back
 * a workspace that leaves the responses of several closed connections
 * unread. */
#define CE_H2_ORPHAN_BUDGET ((size_t)CE_H2_CONN_WINDOW)
_Static_assert(CE_H2_UP_STREAM_WINDOW >= CE_H2_STREAM_BUF, "a down buffer also holds an HTTP/1.1 response's");
_Static_assert(CE_H2_UP_STREAM_WINDOW <= CE_H2_CONN_WINDOW, "the connection window bounds every stream's");
#define CE_H2_MAX_STREAMS 100u
/* Decoded header list (RFC 9113 §6.5.2 counting) and fields per block. */
#define CE_H2_MAX_HEADER_LIST 65536u
#define CE_H2_MAX_FIELDS 128u
/* Streams waiting for an HTTP/1.1 upstream connection (docs/http2.md §6). */
#define CE_H2_H1_QUEUE 64u
/* HTTP/1.1 upstream connections per workspace connection (docs/http2.md §6). */
#define CE_H2_H1_POOL 6u
/* Decision questions outstanding at once per workspace connection
 * (docs/http2.md §3): the streams beyond wait for an answer to come. */
#define CE_H2_MAX_ASKS 8u
/* Response bytes held in the streams' down buffers per workspace
 * connection (their allocated size, docs/http2.md §5): past it the
 * HTTP/1.1 upstreams are not read, except for bytes the workspace can
 * take at once (its windows are open). */
#define CE_H2_DOWN_BUDGET (1024u * 1024u)
/* Request-head bytes held per workspace connection (docs/http2.md §4, §5):
 * the allocated size of the decoded heads of its streams, whether they
 * wait for a decision, for an upstream connection, or are kept for a
 * resend until their h2 response head comes. A head that does not fit,
 * once the kept-for-resend copies are dropped, is refused before
 * evaluation with RST_STREAM REFUSED_STREAM. */
#define CE_H2_HEAD_BUDGET (1024u * 1024u)
/* A refused head keeps its first fields (the pseudo-headers: method and
 * path) within this much for its events, until its header block ends:
 * one stream at a time decodes, so the bound is budget + this. */
#define CE_H2_HEAD_PEEK 1024u
_Static_assert(CE_H2_HEAD_BUDGET >= 2u * CE_H2_MAX_HEADER_LIST, "a head of the largest size must fit");

/* The sanitizer (test) and fuzzing builds check the head accounting after
 * every change (gcc says __SANITIZE_ADDRESS__, clang __has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define CE_H2_CHECK_HEADS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CE_H2_CHECK_HEADS 1
#endif
#endif

typedef struct {
  char *buf;
  size_t used, cap;
  struct {
    uint32_t no, nl, vo, vl;
  } f[CE_H2_MAX_FIELDS];
  size_t n;
  size_t list_bytes;
  bool overflow;
} hset_t;

/* A stream's buffer of one direction (h2/streambuf.h): up ≤ CE_H2_STREAM_BUF,
 * down ≤ CE_H2_UP_STREAM_WINDOW bytes, grown on use, freed when empty. */
typedef ce_h2buf_t sbuf_t;

struct h1slot;

/* Where an allowed stream's request went (docs/http2.md §6). */
typedef enum {
  H2S_ROUTE_NONE,   /* nowhere (yet): not allowed, or answered by the proxy */
  H2S_ROUTE_QUEUED, /* waiting for an HTTP/1.1 upstream connection (qnext) */
  H2S_ROUTE_H1,     /* to an HTTP/1.1 upstream connection (slot while it serves it) */
  H2S_ROUTE_H2,     /* a stream of an h2 upstream connection (uid, uslot; uid 0 once closed) */
} h2s_route_t;

typedef struct h2s {
  struct h2s *next, *prev;
  struct ce_h2conn *h;
  int32_t cid;             /* the workspace's stream */
  int32_t uid;             /* the upstream's, 0 when none (or closed) */
  ce_exchange_t x;         /* the request (proxy/exchange.h) */
  hset_t rq;               /* request head, its cap counted in h->rq_held */
  bool rq_refused;         /* the head did not fit CE_H2_HEAD_BUDGET: the rest is not stored */
  hset_t rqt;              /* request trailers */
  hset_t rs;               /* response head; then response trailers */
  bool rq_head_done, rs_head_done;
  bool rq_trailers, rs_trailers;
  sbuf_t up, down;
  bool local;              /* answered by the proxy: input is dropped */
  char *local_body;
  size_t local_len, local_off;
  bool resp_end_sent;
  char fail[200];          /* the reason for request_failed, when set */
  /* Over an HTTP/1.1 upstream (docs/http2.md §6). */
  struct h2s *qnext;
  h2s_route_t route;
  struct h1slot *slot;     /* the upstream connection serving it, or NULL */
  bool h1_chunked;         /* the request body goes chunked */
  bool h1_req_done;        /* the whole request was written */
  bool h1_resp_head;       /* the response head was parsed and forwarded */
  bool h1_keep;            /* the upstream keeps the connection */
  bool h1_abandon;         /* the response ended first: the rest of the body is dropped */
  bool h1_head_req;        /* the request was HEAD (its head is freed once written) */
  ce_h1_framing_t h1_framing;
  ce_h1_body_t h1_body;
  char *h1_trailers;       /* CE_H1_MAX_TRAILER_BYTES: the chunked body's trailers */
  /* Over an h2 upstream connection (docs/http2.md §6 "GOAWAY"). */
  struct h1slot *uslot;    /* the connection whose session uid is on, NULL once it is gone */
  bool retried;            /* refused once and sent again: never twice */
  size_t up_sent;          /* request body bytes handed to an h2 upstream */
  int64_t rq_length;       /* the request's content-length, -1 when it declared none */
  uint64_t rq_seen;        /* request body bytes received (forwarded or dropped) */
  bool end_early_sent;     /* RST_STREAM(NO_ERROR) after the response went (h2__stream_end_early) */
  int64_t rs_length;       /* the h2 upstream response's content-length, -1 when it declared none */
  uint64_t down_sent;      /* response body bytes handed to the workspace (DATA) */
} h2s_t;

/*
 * One upstream connection of the pool (docs/http2.md §6). Slot 0 is c->u,
 * connected by conn.c (ce_conn_h2_connect, it may be the pre-connected
 * one); the others have their own handle, connected here the same way
 * (resolve, private-address rule, marked socket, verified TLS offering
 * http/1.1, or h2 and http/1.1 after an h2 upstream's GOAWAY) under their
 * own timer. A slot carries HTTP/1.1 (one stream at a time) or an h2
 * session (sess: its streams, and draining after a GOAWAY).
 */
typedef struct h1slot {
  struct ce_h2conn *h;
  side_t *s;               /* &c->u (slot 0) or &own */
  bool conn_slot;
  struct h2s *cur;         /* the stream it serves, one at a time */
  side_t own;
  bool connecting;         /* resolving, connecting or in the TLS handshake */
  ce_connector_t k;        /* connects own (proxy/connector.h) */
  uv_timer_t timer;
  bool timer_init, timer_closing;
  bool cooldown;           /* failed to open: not again until a stream ends */
  int last_err;
  /* An h2 upstream connection (docs/http2.md §6 "GOAWAY"): slot 0 when the
   * first upstream spoke h2, an own slot for each one opened after a GOAWAY. */
  nghttp2_session *sess;   /* its client session; NULL for HTTP/1.1 */
  bool goaway;             /* it sent GOAWAY: no new streams, closed once its streams end */
  int32_t goaway_last;     /* ... its last stream id */
  bool goaway_error;       /* ... one of its GOAWAYs carried an error: nothing it refused goes again */
  bool want_h2;            /* connecting: offer h2 (then http/1.1) */
} h1slot_t;

struct ce_h2conn {
  ce_conn_t *c;
  nghttp2_session *srv;    /* towards the workspace */
  /* The upstream speaks h2: new streams go to the slot whose session takes
   * them (up_current); after a GOAWAY a new connection is opened offering
   * h2, one at a time (docs/http2.md §6 "GOAWAY"). */
  bool h2up;
  char up_fail[200];       /* the h2 upstream failed for good: new streams get 502 with this */
  ce_h2_guard_t guard;
  h2s_t *streams;
  size_t nstreams;
  bool failed;             /* a connection-level failure was reported */
  ce_exchange_asks_t asks; /* decision questions outstanding (≤ CE_H2_MAX_ASKS) */
  bool closing;            /* the session is over: closing after the flush */
  bool draining;
  /* HTTP/1.1 upstreams: a pool, one stream at a time on each, the others queued. */
  h1slot_t slots[CE_H2_H1_POOL];
  h2s_t *qhead, *qtail;
  size_t qlen;
  ce_h1_head_t *head;      /* scratch: a parsed HTTP/1.1 response head, a
                              stream's request or response as a head for
                              its record; used within one call of a
                              stream's, so allocated with the first stream
                              (stream_new) and freed at rest (NULL then) */
  size_t down_held;        /* Σ down.cap over the streams (CE_H2_DOWN_BUDGET) */
  size_t rq_held;          /* Σ rq.cap over the streams (CE_H2_HEAD_BUDGET) */
  uint64_t blocked_at;     /* since when (ms) the queue waits with every connection draining, or 0 */
  bool down_stalled;       /* an HTTP/1.1 upstream waits for the budget */
};

typedef struct ce_h2conn h2_t;

/* Shared between the files of this folder (h2__: internal). */
nghttp2_session *h2__stream_up(const h2s_t *s);
h1slot_t *h2__up_current(h2_t *h);
h1slot_t *h2__slot_of_session(h2_t *h, nghttp2_session *session);
uint64_t h2__now_ms(void);
void h2__hset_reset(hset_t *s);
bool h2__hset_add(hset_t *s, const uint8_t *name, size_t nl, const uint8_t *value, size_t vl, size_t max_cap);
const char *h2__hset_get(const hset_t *s, const char *name, size_t *len);
/* A content-length value: its digits (at most 18), or -1. */
int64_t h2__length(const char *v, size_t n);
size_t h2__hset_nva(const hset_t *s, nghttp2_nv *out, size_t cap, bool trailers);
long h2__rq_fields(h2s_t *s, ce_h1_field_t *f, size_t cap);
void h2__hset_head(const hset_t *s, ce_h1_head_t *hd);
size_t h2__hset_bytes(const hset_t *s);
bool h2__down_put(h2_t *h, h2s_t *s, const uint8_t *data, size_t len);
/* Response bytes held for streams whose h2 upstream connection is gone:
 * responses the workspace has not read yet, which no connection window
 * counts any more (CE_H2_ORPHAN_BUDGET). Their allocation is at most two
 * chunks more per stream (h2/streambuf.h). */
size_t h2__orphaned(const h2_t *h);
void h2__rq_drop(h2_t *h, h2s_t *s);
void h2__fail_with(h2s_t *s, int status, const char *reason);
void h2__fail_502(h2s_t *s, const char *reason);
ssize_t h2__down_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data);
void h2__stream_request(h2s_t *s);
void h2__stream_end_early(h2s_t *s);
void h2__flush(h2_t *h);
void h2__stream_forward(h2s_t *s);
int h2__up_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data);
int h2__up_session_new(h2_t *h, nghttp2_session **out);
void h2__up_gone(h1slot_t *sl, const char *reason);
void h2__up_failed(h1slot_t *sl, const char *reason);
void h2__up_links(h2_t *h);
void h2__up_take_queue(h2_t *h);
bool h2__h1_queue_full(const h2_t *h);
void h2__h1_enqueue(h2s_t *s);
void h2__h1_unqueue(h2_t *h, h2s_t *s);
h2s_t *h2__h1_pop(h2_t *h);
void h2__slot_reset(h1slot_t *sl);
void h2__slot_drop(h1slot_t *sl);
void h2__fail_queue(h2_t *h, int status, const char *reason);
extern const ce_connector_ops_t h2__own_ops;
void h2__h1_pump(h2_t *h);

#endif
