/*
 * HTTP/2 between the workspace and an h2 upstream (docs/http2.md): a
 * server session over the workspace's TLS, a client session over the
 * upstream's, and one record per stream. Every stream is evaluated on its
 * own; bytes move through bounded per-stream buffers, and a window is
 * opened again (nghttp2_session_consume) only when its bytes were taken by
 * the other side, so a slow reader stops the writer within one window.
 *
 * Runs inside conn_process() (conn.c), never re-entered: every callback
 * below only changes records and submits frames; bytes move in
 * ce_h2conn_process().
 */
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
#include "http1/writer.h"
#include "proxy/conn_internal.h"
#include "proxy/netaddr.h"
#include "proxy/proxy.h"
#include "tls/context.h"

/* Per stream and direction: one stream window (docs/http2.md §4). */
#define CE_H2_STREAM_BUF 65535u
#define CE_H2_CONN_WINDOW (1024 * 1024)
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
/* Buffers grow in steps of this size up to CE_H2_STREAM_BUF. */
#define CE_H2_BUF_STEP 4096u
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

typedef struct {
  uint8_t *data;           /* cap bytes (≤ CE_H2_STREAM_BUF), grown on use, freed when empty */
  size_t len, cap;
  bool eof;
} sbuf_t;

struct h1slot;

typedef struct h2s {
  struct h2s *next, *prev;
  struct ce_h2conn *h;
  int32_t cid;             /* the workspace's stream */
  int32_t uid;             /* the upstream's, 0 when none (or closed) */
  ce_reqinfo_t req;
  bool have_req;
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
  bool event_done;         /* the closing event (or a denial) was sent */
  char fail[200];          /* the reason for request_failed, when set */
  /* A pending decision (docs/http2.md §3). */
  uint64_t ask_id;
  bool ask_wait;           /* waiting for one of the connection's CE_H2_MAX_ASKS */
  int32_t decide_rule;
  bool decide_cache;
  /* Over an HTTP/1.1 upstream (docs/http2.md §6). */
  struct h2s *qnext;
  bool queued;             /* waiting for an upstream connection */
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
  bool on_h2;              /* went to an h2 upstream (uid 0 then: its stream closed) */
  bool allowed_sent;       /* request_allowed went out */
  bool retried;            /* refused once and sent again: never twice */
  size_t up_sent;          /* request body bytes handed to an h2 upstream */
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
  bool resolving;          /* a ce_conn_resolve is in flight (counted in c->handles) */
  bool connect_pending;    /* the next address waits for the old handle's close */
  ce_dns_addrs_t *addrs;   /* from ce_conn_resolve, owned */
  size_t next_addr;
  uv_connect_t creq;
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
  size_t asks;             /* decision questions outstanding (≤ CE_H2_MAX_ASKS) */
  bool closing;            /* the session is over: closing after the flush */
  bool draining;
  /* HTTP/1.1 upstreams: a pool, one stream at a time on each, the others queued. */
  h1slot_t slots[CE_H2_H1_POOL];
  h2s_t *qhead, *qtail;
  size_t qlen;
  ce_h1_head_t *head;      /* scratch for a parsed response head */
  size_t down_held;        /* Σ down.cap over the streams (CE_H2_DOWN_BUDGET) */
  size_t rq_held;          /* Σ rq.cap over the streams (CE_H2_HEAD_BUDGET) */
  uint64_t blocked_at;     /* since when (ms) the queue waits with every connection draining, or 0 */
  bool down_stalled;       /* an HTTP/1.1 upstream waits for the budget */
};

typedef struct ce_h2conn h2_t;

static void slot_reset(h1slot_t *sl);
static void slot_drop(h1slot_t *sl);
static void slot_connect_next(h1slot_t *sl);
static void slot_timeout(uv_timer_t *t);
static int up_session_new(struct ce_h2conn *h, nghttp2_session **out);

/* The session a stream's uid belongs to, or NULL. */
static nghttp2_session *stream_up(const h2s_t *s) {
  return s->uslot != NULL ? s->uslot->sess : NULL;
}

/* The h2 upstream connection that takes new streams, or NULL. */
static h1slot_t *up_current(h2_t *h) {
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (h->slots[i].sess != NULL && !h->slots[i].goaway)
      return &h->slots[i];
  return NULL;
}

static h1slot_t *slot_of_session(h2_t *h, nghttp2_session *session) {
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (h->slots[i].sess == session)
      return &h->slots[i];
  return NULL;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- header sets ---------------------------------------------------------- */

static void hset_reset(hset_t *s) {
  s->used = 0;
  s->n = 0;
  s->list_bytes = 0;
  s->overflow = false;
}

static void hset_free(hset_t *s) {
  free(s->buf);
  memset(s, 0, sizeof(*s));
}

/* Adds a field; past CE_H2_MAX_FIELDS or CE_H2_MAX_HEADER_LIST the set is
 * marked overflowed. False (nothing changed) when the buffer would have to
 * grow beyond max_cap bytes. */
static bool hset_add(hset_t *s, const uint8_t *name, size_t nl, const uint8_t *value, size_t vl, size_t max_cap) {
  if (s->overflow)
    return true;
  size_t cost = nl + vl + 32u;
  if (s->n == CE_H2_MAX_FIELDS || s->list_bytes + cost > CE_H2_MAX_HEADER_LIST) {
    s->overflow = true;
    return true;
  }
  if (s->used + nl + vl > s->cap) {
    size_t cap = s->cap == 0 ? 1024 : s->cap;
    while (cap < s->used + nl + vl)
      cap *= 2;
    if (cap > max_cap)
      return false;
    char *nb = realloc(s->buf, cap);
    if (nb == NULL) {
      s->overflow = true;
      return true;
    }
    s->buf = nb;
    s->cap = cap;
  }
  s->f[s->n].no = (uint32_t)s->used;
  s->f[s->n].nl = (uint32_t)nl;
  memcpy(s->buf + s->used, name, nl);
  s->used += nl;
  s->f[s->n].vo = (uint32_t)s->used;
  s->f[s->n].vl = (uint32_t)vl;
  memcpy(s->buf + s->used, value, vl);
  s->used += vl;
  s->n++;
  s->list_bytes += cost;
  return true;
}

/* The value of a field (first one), or NULL. */
static const char *hset_get(const hset_t *s, const char *name, size_t *len) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < s->n; i++)
    if (s->f[i].nl == nl && memcmp(s->buf + s->f[i].no, name, nl) == 0) {
      *len = s->f[i].vl;
      return s->buf + s->f[i].vo;
    }
  return NULL;
}

/* nghttp2_nv entries for every field of a head (pseudo ones first, as
 * received), or of a trailer section: then no pseudo field and only what
 * a trailer may carry (ce_h1_trailer_allowed, the one list every trailer
 * path filters with: no Host, framing or credentials in trailers). */
static size_t hset_nva(const hset_t *s, nghttp2_nv *out, size_t cap, bool trailers) {
  size_t k = 0;
  for (size_t i = 0; i < s->n && k < cap; i++) {
    const char *name = s->buf + s->f[i].no;
    if (trailers && ((s->f[i].nl > 0 && name[0] == ':') || !ce_h1_trailer_allowed(name, s->f[i].nl)))
      continue;
    out[k].name = (uint8_t *)(uintptr_t)name;
    out[k].namelen = s->f[i].nl;
    out[k].value = (uint8_t *)(uintptr_t)(s->buf + s->f[i].vo);
    out[k].valuelen = s->f[i].vl;
    out[k].flags = NGHTTP2_NV_FLAG_NONE;
    k++;
  }
  return k;
}

/* A parsed-head view of a set (regular fields only) for the event record. */
static void hset_head(const hset_t *s, ce_h1_head_t *hd) {
  memset(hd, 0, sizeof(*hd));
  hd->version_minor = 1;
  for (size_t i = 0; i < s->n && hd->field_count < CE_H1_MAX_FIELDS; i++) {
    const char *name = s->buf + s->f[i].no;
    if (s->f[i].nl > 0 && name[0] == ':')
      continue;
    ce_h1_field_t *f = &hd->fields[hd->field_count++];
    f->name = name;
    f->name_len = s->f[i].nl;
    f->value = s->buf + s->f[i].vo;
    f->value_len = s->f[i].vl;
  }
}

static size_t hset_bytes(const hset_t *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++)
    n += s->f[i].nl + s->f[i].vl;
  return n;
}

/* ---- streams ---------------------------------------------------------------- */

static bool sbuf_put(sbuf_t *b, const uint8_t *data, size_t len) {
  if (len == 0)
    return true;
  if (len > CE_H2_STREAM_BUF - b->len)
    return false;
  if (b->len + len > b->cap) {
    size_t cap = (b->len + len + CE_H2_BUF_STEP - 1) / CE_H2_BUF_STEP * CE_H2_BUF_STEP;
    if (cap > CE_H2_STREAM_BUF)
      cap = CE_H2_STREAM_BUF;
    uint8_t *nb = realloc(b->data, cap);
    if (nb == NULL)
      return false;
    b->data = nb;
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, len);
  b->len += len;
  return true;
}

/* An empty buffer gives its memory back. */
static void sbuf_trim(sbuf_t *b) {
  if (b->len == 0 && b->data != NULL) {
    free(b->data);
    b->data = NULL;
    b->cap = 0;
  }
}

static size_t sbuf_take(sbuf_t *b, uint8_t *out, size_t cap) {
  size_t n = b->len < cap ? b->len : cap;
  if (n == 0)
    return 0;
  memcpy(out, b->data, n);
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  sbuf_trim(b);
  return n;
}

/* The down buffer, counted in h->down_held (CE_H2_DOWN_BUDGET). */
static bool down_put(h2_t *h, h2s_t *s, const uint8_t *data, size_t len) {
  size_t before = s->down.cap;
  bool ok = sbuf_put(&s->down, data, len);
  h->down_held += s->down.cap - before;
  return ok;
}

static size_t down_take(h2_t *h, h2s_t *s, uint8_t *out, size_t cap) {
  size_t before = s->down.cap;
  size_t n = sbuf_take(&s->down, out, cap);
  h->down_held -= before - s->down.cap;
  return n;
}

static void down_drop(h2_t *h, h2s_t *s) {
  h->down_held -= s->down.cap;
  s->down.len = 0;
  sbuf_trim(&s->down);
}

/* ---- request heads, counted in h->rq_held (CE_H2_HEAD_BUDGET) ---------------- */

/* Test builds: the count is the sum over the streams, within the budget. */
static void rq_check(const h2_t *h) {
#ifdef CE_H2_CHECK_HEADS
  size_t sum = 0;
  for (const h2s_t *s = h->streams; s != NULL; s = s->next)
    sum += s->rq.cap;
  if (sum != h->rq_held || h->rq_held > CE_H2_HEAD_BUDGET + CE_H2_HEAD_PEEK) {
    fprintf(stderr, "h2conn: request-head accounting broken: held %zu, streams %zu, budget %u\n", h->rq_held, sum,
            CE_H2_HEAD_BUDGET);
    abort();
  }
#else
  (void)h;
#endif
}

/* Every path that is done with a request head comes here: stream_free,
 * sent upstream as HTTP/1.1, the h2 response head, a refusal by the
 * upstream, a local answer, a refused or shed head. */
static void rq_drop(h2_t *h, h2s_t *s) {
  if (s->rq.cap > h->rq_held) {
    /* Cannot happen: the accounting is exact (rq_check). */
#ifdef CE_H2_CHECK_HEADS
    fprintf(stderr, "h2conn: request-head accounting broken: held %zu, dropping %zu\n", h->rq_held, s->rq.cap);
    abort();
#endif
    h->rq_held = 0;
  } else {
    h->rq_held -= s->rq.cap;
  }
  hset_free(&s->rq);
  rq_check(h);
}

/* A stream whose head is kept only to send it again if the h2 upstream
 * refuses the stream (docs/http2.md §4): on an upstream stream without a
 * response head yet. The oldest (the list is newest first): the newest are
 * the likeliest to be above a GOAWAY's last stream id. */
static h2s_t *rq_kept_for_resend(h2_t *h, const h2s_t *except) {
  h2s_t *found = NULL;
  for (h2s_t *o = h->streams; o != NULL; o = o->next)
    if (o != except && o->on_h2 && o->uid > 0 && !o->rs_head_done && o->rq.cap > 0)
      found = o;
  return found;
}

/* A field of s's request head, within CE_H2_HEAD_BUDGET: when the buffer
 * cannot grow, heads kept for a resend are dropped first (those streams
 * are no longer sent again: up_stream_close), then s is marked refused
 * (stream_request refuses it at the end of its header block) and keeps
 * only what fits in CE_H2_HEAD_PEEK, for its events. */
static void rq_add(h2_t *h, h2s_t *s, const uint8_t *name, size_t nl, const uint8_t *value, size_t vl) {
  size_t before = s->rq.cap;
  for (;;) {
    size_t others = h->rq_held - before;
    size_t room = others < CE_H2_HEAD_BUDGET ? CE_H2_HEAD_BUDGET - others : 0;
    if (s->rq_refused)
      room = CE_H2_HEAD_PEEK;
    if (hset_add(&s->rq, name, nl, value, vl, room) || s->rq_refused)
      break;
    h2s_t *o = rq_kept_for_resend(h, s);
    if (o == NULL) {
      s->rq_refused = true;
      continue;
    }
    CE_TRACE_D("proxy", 'c', h->c->id, "h2: head budget: stream %d is no longer kept for a resend", (int)o->cid);
    rq_drop(h, o);
  }
  h->rq_held += s->rq.cap - before;
  rq_check(h);
}

/* Bytes s still holds were counted against the flow-control windows when
 * they arrived: when they will never be forwarded (the stream turned
 * local or closes), the windows get them back, or a few dropped uploads
 * would close the connection's window for good. nghttp2 credits the
 * connection even when the stream is gone. */
static void stream_release_windows(h2_t *h, h2s_t *s) {
  if (s->up.len > 0) {
    nghttp2_session_consume(h->srv, s->cid, s->up.len);
    s->up.len = 0;
  }
  nghttp2_session *us = stream_up(s);
  if (s->down.len > 0 && us != NULL) {
    if (s->uid > 0)
      nghttp2_session_consume(us, s->uid, s->down.len);
    else
      nghttp2_session_consume_connection(us, s->down.len);
    down_drop(h, s);
  }
}

static h2s_t *stream_new(h2_t *h, int32_t cid) {
  h2s_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return NULL;
  s->h = h;
  s->cid = cid;
  s->next = h->streams;
  if (h->streams != NULL)
    h->streams->prev = s;
  h->streams = s;
  h->nstreams++;
  return s;
}

static void stream_free(h2_t *h, h2s_t *s) {
  if (s->prev != NULL)
    s->prev->next = s->next;
  else
    h->streams = s->next;
  if (s->next != NULL)
    s->next->prev = s->prev;
  h->nstreams--;
  stream_release_windows(h, s);
  if (s->have_req)
    ce_reqinfo_clear(&s->req);
  if (s->ask_id != 0) {
    ce_control_cancel(h->c->proxy->control, s->ask_id);
    h->asks--;
  }
  rq_drop(h, s);
  hset_free(&s->rqt);
  hset_free(&s->rs);
  free(s->up.data);
  down_drop(h, s);
  free(s->local_body);
  free(s->h1_trailers);
  free(s);
}

static void stream_event(h2s_t *s, const char *name, const char *reason) {
  if (!s->have_req)
    return;
  ce_conn_emit(s->h->c, &s->req, name, reason);
}

/* The closing event, once. */
static void stream_finish_event(h2s_t *s, const char *failed_reason) {
  if (s->event_done || !s->have_req)
    return;
  s->event_done = true;
  s->req.closed_at_us = ce_now_us();
  if (failed_reason != NULL)
    stream_event(s, "request_failed", failed_reason);
  else
    stream_event(s, "request_closed", NULL);
}

/* ---- local answers ------------------------------------------------------------ */

static ssize_t local_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                          uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL || s->local_body == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  size_t n = s->local_len - s->local_off;
  if (n > length)
    n = length;
  memcpy(buf, s->local_body + s->local_off, n);
  s->local_off += n;
  if (s->local_off == s->local_len)
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

/* Answers a stream itself: status and a short text body, with the same
 * fields as an HTTP/1.1 refusal. */
static void local_answer(h2s_t *s, int status, const char *text) {
  h2_t *h = s->h;
  s->local = true;
  stream_release_windows(h, s);
  /* The head goes nowhere now (the event record has its own copy). */
  rq_drop(h, s);
  free(s->local_body);
  s->local_body = strdup(text);
  if (s->local_body == NULL) {
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  s->local_len = strlen(text);
  s->local_off = 0;
  char st[8], cl[24];
  snprintf(st, sizeof(st), "%d", status);
  snprintf(cl, sizeof(cl), "%zu", s->local_len);
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
  nghttp2_nv nva[] = {NV(":status", st), NV("content-type", "text/plain; charset=utf-8"),
                      NV("content-length", cl), NV("cache-control", "no-store"),
                      NV("x-condukt-egress", "refused")};
#undef NV
  nghttp2_data_provider prd = {.source.ptr = s, .read_callback = local_read};
  if (nghttp2_submit_response(h->srv, s->cid, nva, sizeof(nva) / sizeof(nva[0]), &prd) != 0)
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
  if (s->have_req) {
    s->req.status = status;
    s->req.bytes_in += s->local_len;
    if (s->req.responded_at_us == 0)
      s->req.responded_at_us = ce_now_us();
  }
  /* Nothing more from the upstream for this stream. */
  if (s->uid > 0 && stream_up(s) != NULL) {
    nghttp2_session_set_stream_user_data(stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
    s->uid = 0;
  }
}

static void plain(char *dst, size_t cap, const char *src) {
  size_t w = 0;
  for (size_t i = 0; src[i] != '\0' && w + 1 < cap; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[w++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  dst[w] = '\0';
}

/* A refusal: request_denied, then the answer. */
static void refuse(h2s_t *s, int status, const char *reason, const char *text) {
  s->req.closed_at_us = ce_now_us();
  s->req.status = status;
  stream_event(s, "request_denied", reason);
  s->event_done = true;
  local_answer(s, status, text);
}

/* A failure before any response byte: request_failed, then the status. */
static void fail_with(h2s_t *s, int status, const char *reason) {
  char safe[200], text[260];
  plain(safe, sizeof(safe), reason);
  snprintf(text, sizeof(text), "condukt: %s\n", safe);
  local_answer(s, status, text);
  stream_finish_event(s, reason);
}

static void fail_502(h2s_t *s, const char *reason) { fail_with(s, 502, reason); }

/* ---- the upstream's data, to the workspace ------------------------------------ */

static ssize_t down_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  h2_t *h = s->h;
  size_t n = down_take(h, s, buf, length);
  if (n > 0) {
    s->req.bytes_in += n;
    /* The bytes left the proxy: the upstream may send as many again. */
    nghttp2_session *us = stream_up(s);
    if (us != NULL) {
      if (s->uid > 0)
        nghttp2_session_consume(us, s->uid, n);
      else
        nghttp2_session_consume_connection(us, n);
    }
  }
  if (s->down.len == 0 && s->down.eof) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (s->rs_trailers) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, true /* trailers */);
      if (nghttp2_submit_trailer(session, stream_id, nva, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return (ssize_t)n;
  }
  if (n == 0)
    return NGHTTP2_ERR_DEFERRED;
  return (ssize_t)n;
}

/* ---- the workspace's data, to the upstream -------------------------------------- */

static ssize_t up_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                       uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  h2_t *h = s->h;
  size_t n = sbuf_take(&s->up, buf, length);
  if (n > 0) {
    s->up_sent += n; /* gone: a refused stream cannot be sent again */
    s->req.bytes_out += n;
    ce_reqinfo_add_preview(&s->req, (const char *)buf, n, h->c->proxy->opts->body_preview);
    nghttp2_session_consume(h->srv, s->cid, n);
  }
  if (s->up.len == 0 && s->up.eof) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (s->rq_trailers) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = hset_nva(&s->rqt, nva, CE_H2_MAX_FIELDS, true /* trailers */);
      if (nghttp2_submit_trailer(session, stream_id, nva, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return (ssize_t)n;
  }
  if (n == 0)
    return NGHTTP2_ERR_DEFERRED;
  return (ssize_t)n;
}

/* ---- a request head: evaluate and forward ----------------------------------------- */

/* ---- HTTP/1.1 upstream: the queue ------------------------------------------------- */

/* The streams that may wait: over HTTP/1.1, CE_H2_H1_QUEUE; for an h2
 * upstream, every stream the workspace may have open (the queue holds
 * streams that exist anyway: no memory of its own), so that the streams a
 * GOAWAY refused all find room (docs/http2.md §6). */
static bool h1_queue_full(const h2_t *h) {
  return h->qlen >= (h->h2up ? CE_H2_MAX_STREAMS : CE_H2_H1_QUEUE);
}

static void h1_enqueue(h2s_t *s) {
  h2_t *h = s->h;
  if (h1_queue_full(h)) {
    fail_with(s, 503, "upstream_busy: too many streams wait for the upstream connection");
    return;
  }
  s->queued = true;
  s->qnext = NULL;
  if (h->qtail != NULL)
    h->qtail->qnext = s;
  else
    h->qhead = s;
  h->qtail = s;
  h->qlen++;
}

static void h1_unqueue(h2_t *h, h2s_t *s) {
  if (!s->queued)
    return;
  h2s_t **pp = &h->qhead, *prev = NULL;
  while (*pp != NULL && *pp != s) {
    prev = *pp;
    pp = &(*pp)->qnext;
  }
  if (*pp == s) {
    *pp = s->qnext;
    if (h->qtail == s)
      h->qtail = prev;
    h->qlen--;
  }
  s->queued = false;
  s->qnext = NULL;
}

static h2s_t *h1_pop(h2_t *h) {
  h2s_t *s = h->qhead;
  if (s != NULL)
    h1_unqueue(h, s);
  return s;
}

/* request_allowed, once (a stream sent again after a refusal said it). */
static void stream_allowed(h2s_t *s) {
  if (s->allowed_sent)
    return;
  s->allowed_sent = true;
  stream_event(s, "request_allowed", NULL);
}

/* A new stream on the h2 upstream connection sl. */
static void stream_submit(h2s_t *s, h1slot_t *sl) {
  /* Pseudo-headers first, as received (nghttp2 checked them), then the
   * rest: nghttp2 already refused connection-specific fields. */
  nghttp2_nv nva[CE_H2_MAX_FIELDS];
  size_t k = hset_nva(&s->rq, nva, CE_H2_MAX_FIELDS, false);
  nghttp2_data_provider prd = {.source.ptr = s, .read_callback = up_read};
  bool body = !(s->up.eof && s->up.len == 0) || s->rq_trailers;
  int32_t uid = nghttp2_submit_request(sl->sess, NULL, nva, k, body ? &prd : NULL, s);
  stream_allowed(s);
  if (uid < 0) {
    fail_502(s, "upstream_unreachable: cannot open an upstream stream");
    return;
  }
  s->uid = uid;
  s->uslot = sl;
  s->on_h2 = true;
  /* nghttp2 copied the fields; the head stays until the response head
   * comes, for a refused stream to be sent again (up_stream_close). */
}

/* An allowed stream goes upstream: a new h2 stream, or the queue (for an
 * HTTP/1.1 connection, or an h2 one being opened after a GOAWAY). */
static void stream_forward(h2s_t *s) {
  h2_t *h = s->h;
  if (h->draining) {
    stream_allowed(s);
    fail_502(s, "upstream_unreachable: the proxy is draining");
    return;
  }
  if (h->h2up && h->up_fail[0] != '\0') {
    stream_allowed(s);
    fail_502(s, h->up_fail);
    return;
  }
  h1slot_t *sl = h->h2up ? up_current(h) : NULL;
  if (sl == NULL) {
    /* request_allowed when an upstream connection takes it (h1_pump,
     * up_take_queue): the private-address rule may still refuse it
     * (fail_queue). */
    h1_enqueue(s);
    return;
  }
  stream_submit(s, sl);
}

/* ---- decisions ------------------------------------------------------------------------- */

static void stream_decided(h2s_t *s, bool allow, const char *reason) {
  s->req.matched_rule = s->decide_rule;
  s->req.matched_kind = "decide";
  if (allow) {
    stream_forward(s);
    return;
  }
  char text[CE_CONN_DENY_TEXT_MAX], who[CE_CONN_DENY_WHO_MAX];
  snprintf(who, sizeof(who), "the decider of rule %d", (int)s->decide_rule);
  ce_conn_deny_text(text, sizeof(text), s->req.host, who, reason);
  refuse(s, 403, reason, text);
}

static void ask_next(h2_t *h);

static void on_stream_decision(void *data, int status, bool allow, const char *reason, bool cacheable) {
  h2s_t *s = data;
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  s->ask_id = 0;
  h->asks--;
  if (c->dead)
    return;
  if (s->h->failed || s->h->closing) {
    /* The connection is ending: the stream is never forwarded. */
    stream_finish_event(s, "connection_closed");
    return;
  }
  const char *why;
  bool ok = ce_conn_decision_outcome(c->proxy, status, allow, reason, cacheable, s->decide_cache, s->decide_rule,
                                     s->req.host, &why);
  stream_decided(s, ok, why);
  ask_next(h);
  ce_conn_process(c);
}

/* A decide rule: this stream asks the control channel and waits; the
 * connection's other streams go on. */
static void stream_ask(h2s_t *s, int32_t rule) {
  ce_conn_t *c = s->h->c;
  s->decide_rule = rule;
  ce_rule_info_t info;
  if (ce_policy_rule(c->proxy->policy, (size_t)rule, &info) != 0) {
    stream_decided(s, false, "decider_error");
    return;
  }
  s->decide_cache = info.cache;
  bool allow;
  const char *reason;
  if (info.cache && ce_decision_cache_get(c->proxy, rule, s->req.host, &allow, &reason)) {
    stream_decided(s, allow, allow ? NULL : reason);
    return;
  }
  if (s->h->asks >= CE_H2_MAX_ASKS) {
    /* Asked again (the cache first) when an answer comes: ask_next. */
    s->ask_wait = true;
    return;
  }
  s->ask_id = ce_event_ask(c->proxy->control, &s->req, rule, info.timeout_ms, on_stream_decision, s);
  if (s->ask_id == 0) {
    stream_decided(s, false, "control_channel_unavailable");
    return;
  }
  s->h->asks++;
}

/* An answer came or a stream asking went away: the waiting streams ask, in
 * turn, while there is room. A scan per question over ≤ CE_H2_MAX_STREAMS
 * streams; the list may change under stream_ask, hence from the head. */
static void ask_next(h2_t *h) {
  while (!h->c->dead && !h->failed && !h->closing && h->asks < CE_H2_MAX_ASKS) {
    h2s_t *s = h->streams;
    while (s != NULL && !s->ask_wait)
      s = s->next;
    if (s == NULL)
      return;
    s->ask_wait = false;
    stream_ask(s, s->decide_rule);
  }
}


static void stream_request(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  ce_reqinfo_init(&s->req, ++c->proxy->next_request_id, c->id);
  s->have_req = true;
  s->req.scheme = "https";
  s->req.port = c->port;
  s->req.stream_id = s->cid;
  snprintf(s->req.sni, sizeof(s->req.sni), "%s", c->sni_raw);

  size_t ml = 0, pl = 0, al = 0;
  const char *method = hset_get(&s->rq, ":method", &ml);
  const char *path = hset_get(&s->rq, ":path", &pl);
  const char *auth = hset_get(&s->rq, ":authority", &al);
  size_t hl = 0;
  const char *host = hset_get(&s->rq, "host", &hl);

  ce_h1_head_t *hd = malloc(sizeof(*hd));
  if (hd == NULL) {
    snprintf(s->fail, sizeof(s->fail), "out_of_memory");
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  hset_head(&s->rq, hd);
  hd->method = method != NULL ? method : "GET";
  hd->method_len = method != NULL ? ml : 3;
  hd->path = path;
  hd->path_len = pl;
  if (ce_reqinfo_set_request(&s->req, hd, c->proxy->opts) != CE_OK) {
    free(hd);
    snprintf(s->fail, sizeof(s->fail), "out_of_memory");
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  free(hd);
  s->req.http_version = "HTTP/2";
  s->req.bytes_out = hset_bytes(&s->rq);

  if (s->rq.overflow) {
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    refuse(s, 431, "request_header_too_large", "condukt: the request header list is too large\n");
    return;
  }
  if (s->rq_refused) {
    /* The connection's request heads would exceed CE_H2_HEAD_BUDGET
     * (docs/http2.md §5): refused before evaluation, nothing processed,
     * so REFUSED_STREAM (RFC 9113 §8.7) and the workspace may retry, as
     * past MAX_CONCURRENT_STREAMS. Counted as a proxy-sent reset. */
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    s->req.closed_at_us = ce_now_us();
    char reason[160];
    snprintf(reason, sizeof(reason),
             "request_header_budget: the request heads held on this connection would exceed %u bytes",
             CE_H2_HEAD_BUDGET);
    stream_event(s, "request_denied", reason);
    s->event_done = true;
    rq_drop(h, s);
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_REFUSED_STREAM);
    return;
  }
  /* RFC 9113 §8.3.1: :authority names the target; a Host that differs
   * would let the upstream see another name than the policy did. */
  if (auth == NULL) {
    auth = host;
    al = hl;
  } else if (host != NULL && (hl != al || strncasecmp(host, auth, al) != 0)) {
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    refuse(s, 400, "bad_request: host differs from :authority",
           "condukt: malformed request: host differs from :authority\n");
    return;
  }
  if (method != NULL && ml == 7 && memcmp(method, "CONNECT", 7) == 0) {
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    refuse(s, 400, "bad_request: connect_not_supported",
           "condukt: CONNECT is not supported: this connection already goes where it was dialled\n");
    return;
  }
  /* RFC 9113 §8.3.1: the target is origin-form, or "*" for OPTIONS.
   * nghttp2 checks the leading "/" only for the schemes http and https:
   * an absolute-form :path (or an authority) under another :scheme
   * would name the upstream a host the policy never saw (an HTTP/1.1
   * upstream routes by the request line). Refused before evaluation. */
  size_t scl = 0;
  const char *scheme = hset_get(&s->rq, ":scheme", &scl);
  bool star = method != NULL && ml == 7 && memcmp(method, "OPTIONS", 7) == 0 && path != NULL && pl == 1 &&
              path[0] == '*';
  if (scheme == NULL || scl != 5 || memcmp(scheme, "https", 5) != 0 || path == NULL || pl == 0 ||
      (path[0] != '/' && !star)) {
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    refuse(s, 400, "bad_request: target_not_origin_form",
           "condukt: malformed request: :scheme must be https and :path an origin-form target\n");
    return;
  }
  /* As on HTTP/1.1: a method the records can keep whole. */
  if (method != NULL && ml > CE_H1_MAX_METHOD_BYTES) {
    snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
    stream_event(s, "request_opened", NULL);
    refuse(s, 400, "bad_request: method too long", "condukt: malformed request: :method is too long\n");
    return;
  }
  /* The target is URI text (RFC 3986 §2): visible ASCII only, as the
   * HTTP/1.1 parser demands of a request line. nghttp2 lets other bytes
   * through; the policy matcher and the upstream might read them
   * differently. */
  for (size_t k = 0; k < pl; k++) {
    unsigned char b = (unsigned char)path[k];
    if (b <= 0x20 || b >= 0x7f) {
      snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
      stream_event(s, "request_opened", NULL);
      refuse(s, 400, "bad_request: invalid byte in :path",
             "condukt: malformed request: :path must be visible ASCII (percent-encode other bytes)\n");
      return;
    }
  }
  /* Present, valid, and the connection's own name and port (coalescing:
   * one connection, one name; DESIGN §4). */
  ce_target_check_t t;
  ce_conn_check_target(c, auth, al, method, method != NULL ? ml : 0, path, pl, ":authority", s->req.host,
                       sizeof(s->req.host), &t);
  stream_event(s, "request_opened", NULL);
  if (t.status != 0) {
    char safe[700], text[720];
    plain(safe, sizeof(safe), t.detail);
    snprintf(text, sizeof(text), "condukt: %s\n", safe);
    refuse(s, t.status, t.reason, text);
    return;
  }
  ce_verdict_t v = t.verdict;
  s->req.matched_rule = v.rule_index;
  s->req.matched_kind = v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL;
  if (v.decision == CE_DECISION_DECIDE && v.rule_index >= 0) {
    stream_ask(s, v.rule_index);
    return;
  }
  if (v.decision != CE_DECISION_ALLOW) {
    const char *reason = v.decision == CE_DECISION_DENY ? ce_reason_name(v.reason) : "decider_error";
    /* In the words of the HTTP/1.1 path (conn.c refuse_policy). */
    char text[CE_CONN_DENY_TEXT_MAX], who[CE_CONN_DENY_WHO_MAX];
    if (v.rule_index >= 0)
      snprintf(who, sizeof(who), "rule %d (%s)", (int)v.rule_index, ce_rule_kind_name(v.rule_kind));
    else
      snprintf(who, sizeof(who), "the policy default");
    ce_conn_deny_text(text, sizeof(text), s->req.host, who, reason);
    refuse(s, 403, reason, text);
    return;
  }
  stream_forward(s);
}

/* ---- server session callbacks (the workspace) ----------------------------------- */

static int srv_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  h2_t *h = user_data;
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  h2s_t *s = stream_new(h, frame->hd.stream_id);
  if (s == NULL)
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, s);
  return 0;
}

static int srv_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                      const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (s == NULL)
    return 0;
  if (s->rq_head_done)
    hset_add(&s->rqt, name, namelen, value, valuelen, SIZE_MAX);
  else
    rq_add(s->h, s, name, namelen, value, valuelen);
  return 0;
}

static int srv_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (s == NULL)
    return 0;
  bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (frame->hd.type == NGHTTP2_HEADERS) {
    if (!s->rq_head_done) {
      s->rq_head_done = true;
      s->up.eof = end;
      stream_request(s);
      return 0;
    }
    /* Trailers (nghttp2 makes sure they end the stream). */
    if (s->rqt.overflow) {
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_ENHANCE_YOUR_CALM);
      return 0;
    }
    s->rq_trailers = !s->local;
  }
  if (end && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA)) {
    s->up.eof = true;
    if (s->uid > 0 && stream_up(s) != NULL)
      nghttp2_session_resume_data(stream_up(s), s->uid);
  }
  return 0;
}

static int srv_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                    void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL || s->local || s->h1_abandon || (s->uid == 0 && s->rq_head_done && s->have_req && s->event_done)) {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  if (!sbuf_put(&s->up, data, len)) {
    /* More than the window we gave, or out of memory. */
    nghttp2_session_consume(session, stream_id, len);
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_FLOW_CONTROL_ERROR);
    return 0;
  }
  if (s->uid > 0 && stream_up(s) != NULL)
    nghttp2_session_resume_data(stream_up(s), s->uid);
  return 0;
}

static void conn_fail(h2_t *h, uint32_t code, const char *reason);

/* RFC 9113 §8.1: the response is complete and the rest of the request can
 * go nowhere (answered locally, the upstream's stream closed, or the
 * HTTP/1.1 response ended first): RST_STREAM(NO_ERROR) tells a workspace
 * still sending to stop, and the stream ends. */
static void stream_end_early(h2s_t *s) {
  h2_t *h = s->h;
  if (!s->resp_end_sent || h->failed || nghttp2_session_get_stream_remote_close(h->srv, s->cid) != 0)
    return;
  if (!s->local && !s->h1_abandon && !(s->on_h2 && s->uid == 0))
    return;
  nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_NO_ERROR);
}

static int srv_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  /* A stream the proxy resets (a stream error the client provoked, or a
   * refusal of its trailers) cost an evaluation and events like one the
   * client reset: counted in the same window (MadeYouReset). Not the
   * proxy's own failures (INTERNAL_ERROR) nor an upstream's reset passed on. */
  if (frame->hd.type == NGHTTP2_RST_STREAM && frame->rst_stream.error_code != NGHTTP2_NO_ERROR &&
      frame->rst_stream.error_code != NGHTTP2_INTERNAL_ERROR && !h->failed &&
      (s == NULL || strncmp(s->fail, "upstream_", 9) != 0)) {
    ce_h2g_verdict_t v = ce_h2_guard_note_reset(&h->guard, now_ms());
    if (v != CE_H2G_OK)
      conn_fail(h, NGHTTP2_ENHANCE_YOUR_CALM, ce_h2_guard_reason(v));
  }
  /* What the client will acknowledge with WINDOW_UPDATE frames (§5). */
  if (frame->hd.type == NGHTTP2_DATA)
    ce_h2_guard_note_sent(&h->guard, frame->hd.length, now_ms());
  if (s != NULL && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    s->resp_end_sent = true;
    stream_end_early(s);
  }
  return 0;
}

/* A stream that closed before its request head was taken (nghttp2 refused
 * it as malformed, a stream error): request_opened and request_denied on
 * the connection's name, as a malformed HTTP/1.1 request. */
static void stream_malformed(h2s_t *s, uint32_t code) {
  ce_conn_t *c = s->h->c;
  if (s->have_req)
    return;
  ce_reqinfo_init(&s->req, ++c->proxy->next_request_id, c->id);
  s->have_req = true;
  s->req.scheme = "https";
  s->req.port = c->port;
  s->req.stream_id = s->cid;
  s->req.http_version = "HTTP/2";
  snprintf(s->req.sni, sizeof(s->req.sni), "%s", c->sni_raw);
  snprintf(s->req.host, sizeof(s->req.host), "%s", c->sni.text);
  char reason[120];
  snprintf(reason, sizeof(reason), "bad_request: malformed stream (RST_STREAM %s)", nghttp2_http2_strerror(code));
  stream_event(s, "request_opened", NULL);
  s->req.closed_at_us = ce_now_us();
  stream_event(s, "request_denied", reason);
  s->event_done = true;
}

static int srv_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return 0;
  nghttp2_session_set_stream_user_data(session, stream_id, NULL);
  if (!s->have_req)
    stream_malformed(s, error_code);
  if (s->fail[0] != '\0') {
    stream_finish_event(s, s->fail);
  } else if (error_code == NGHTTP2_NO_ERROR && s->resp_end_sent) {
    stream_finish_event(s, NULL);
  } else {
    char reason[80];
    snprintf(reason, sizeof(reason), "client_reset: RST_STREAM %s", nghttp2_http2_strerror(error_code));
    stream_finish_event(s, reason);
  }
  if (s->uid > 0 && stream_up(s) != NULL) {
    nghttp2_session_set_stream_user_data(stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
  }
  h1_unqueue(h, s);
  if (s->slot != NULL && s->slot->cur == s) {
    /* A half-done HTTP/1.1 exchange cannot be reused. */
    slot_drop(s->slot);
  }
  bool asked = s->ask_id != 0;
  stream_free(h, s);
  if (asked)
    ask_next(h);
  return 0;
}

/* ---- client session callbacks (the upstream) --------------------------------------- */

static int up_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (s == NULL || frame->hd.type != NGHTTP2_HEADERS)
    return 0;
  hset_add(&s->rs, name, namelen, value, valuelen, SIZE_MAX);
  return 0;
}

static void upstream_response(h2s_t *s, bool end) {
  h2_t *h = s->h;
  size_t sl = 0;
  const char *st = hset_get(&s->rs, ":status", &sl);
  int status = 0;
  for (size_t i = 0; st != NULL && i < sl && i < 3; i++)
    status = status * 10 + (st[i] - '0');
  if (status >= 100 && status < 200) {
    /* Interim responses (100 Continue, 103 Early Hints) go to the
     * workspace as non-final HEADERS (docs/http2.md §3); nghttp2 refuses
     * a 101 on h2 before this is reached. */
    if (status != 101 && !s->rs.overflow) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, false);
      nghttp2_submit_headers(h->srv, NGHTTP2_FLAG_NONE, s->cid, NULL, nva, k, NULL);
    }
    hset_reset(&s->rs);
    return;
  }
  if (s->rs.overflow) {
    s->fail[0] = '\0';
    snprintf(s->fail, sizeof(s->fail), "upstream_bad_response: header list too large");
    nghttp2_session_set_stream_user_data(stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
    s->uid = 0;
    fail_502(s, s->fail);
    return;
  }
  ce_h1_head_t *hd = malloc(sizeof(*hd));
  if (hd != NULL) {
    hset_head(&s->rs, hd);
    hd->is_response = true;
    hd->status = status;
    ce_reqinfo_set_response(&s->req, hd, h->c->proxy->opts);
    free(hd);
  }
  s->req.bytes_in += hset_bytes(&s->rs);
  nghttp2_nv nva[CE_H2_MAX_FIELDS];
  size_t k = hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, false);
  nghttp2_data_provider prd = {.source.ptr = s, .read_callback = down_read};
  s->down.eof = end;
  int rc = nghttp2_submit_response(h->srv, s->cid, nva, k, end ? NULL : &prd);
  s->rs_head_done = true;
  hset_reset(&s->rs);
  /* Answered: the stream will not be sent again (up_stream_close). */
  rq_drop(h, s);
  if (rc != 0)
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
}

static int up_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  h2_t *h = user_data;
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    /* docs/http2.md §6 "GOAWAY": the streams up to its last stream id
     * finish on this connection, which closes after them; nghttp2 closes
     * the others (REFUSED_STREAM, up_stream_close sends them again) and
     * new streams wait for a new connection. Only a NO_ERROR GOAWAY gets
     * one: an error says the upstream gave up on us. An error from a
     * connection that was already draining (a second GOAWAY) ends only
     * that connection's streams, not the current connection's. */
    h1slot_t *sl = slot_of_session(h, session);
    uint32_t code = frame->goaway.error_code;
    bool was_current = sl == NULL || !sl->goaway;
    if (sl != NULL) {
      sl->goaway = true;
      sl->goaway_last = frame->goaway.last_stream_id;
      if (code != NGHTTP2_NO_ERROR)
        sl->goaway_error = true;
    }
    CE_TRACE_D("proxy", 'c', h->c->id, "h2: upstream connection %d sent GOAWAY %s, last stream %d",
               sl != NULL ? (int)(sl - h->slots) : -1, nghttp2_http2_strerror(code),
               (int)frame->goaway.last_stream_id);
    if (code != NGHTTP2_NO_ERROR && was_current && h->up_fail[0] == '\0')
      snprintf(h->up_fail, sizeof(h->up_fail), "upstream_unreachable: the upstream sent GOAWAY %s",
               nghttp2_http2_strerror(code));
    return 0;
  }
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (s == NULL)
    return 0;
  bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (frame->hd.type == NGHTTP2_HEADERS) {
    if (!s->rs_head_done) {
      upstream_response(s, end);
      return 0;
    }
    s->rs_trailers = !s->rs.overflow;
  }
  if (end && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA)) {
    s->down.eof = true;
    nghttp2_session_resume_data(h->srv, s->cid);
  }
  return 0;
}

static int up_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                   void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL || s->local) {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  if (!down_put(h, s, data, len)) {
    nghttp2_session_consume(session, stream_id, len);
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_FLOW_CONTROL_ERROR);
    return 0;
  }
  nghttp2_session_resume_data(h->srv, s->cid);
  return 0;
}

static int up_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return 0;
  nghttp2_session_set_stream_user_data(session, stream_id, NULL);
  s->uid = 0;
  if (error_code == NGHTTP2_NO_ERROR && s->down.eof) {
    stream_end_early(s);
    return 0;
  }
  char reason[120];
  snprintf(reason, sizeof(reason), "upstream_reset: RST_STREAM %s", nghttp2_http2_strerror(error_code));
  if (error_code == NGHTTP2_REFUSED_STREAM && !s->rs_head_done && !s->local) {
    /* Refused (RST_STREAM REFUSED_STREAM, or above the last stream id of
     * a GOAWAY): nothing was processed (RFC 9113 §8.7). Sent again when
     * all of it is still here (the head, and no body byte gone): over a
     * new connection after a GOAWAY (docs/http2.md §6). As often as the
     * refusing connection took streams before its GOAWAY (its last stream
     * id > 0: progress, as after nginx's keepalive_requests); else once. */
    h1slot_t *rsl = slot_of_session(h, session);
    bool progress = rsl != NULL && rsl->goaway && stream_id > rsl->goaway_last && rsl->goaway_last > 0;
    /* A full queue (an HTTP/1.1 connection took over meanwhile): the
     * workspace is told REFUSED_STREAM below and may retry itself. */
    if ((!s->retried || progress) && s->up_sent == 0 && s->rq.n > 0 && !s->rq.overflow &&
        (rsl == NULL || !rsl->goaway_error) && h->up_fail[0] == '\0' && !h->draining && !h->failed &&
        !h->closing && !h1_queue_full(h)) {
      s->retried = true;
      CE_TRACE_D("proxy", 'c', h->c->id, "h2: stream %d refused by the upstream; sending it again",
                 (int)s->cid);
      /* Until a connection takes it again: it may be served over
       * HTTP/1.1 if the new connection picks that (stream_submit sets
       * both again for an h2 one). */
      s->on_h2 = false;
      s->uslot = NULL;
      h1_enqueue(s);
      return 0;
    }
    rq_drop(h, s);
    if (s->up_sent > 0) {
      /* Part of its body went and is gone: never a partial request. */
      char why[200];
      snprintf(why, sizeof(why),
               "upstream_refused: the upstream refused the stream after %zu bytes of its request body were "
               "sent; they cannot be sent again",
               s->up_sent);
      fail_502(s, why);
      return 0;
    }
    /* The workspace may retry itself. */
    snprintf(s->fail, sizeof(s->fail), "%s", reason);
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  rq_drop(h, s);
  if (!s->rs_head_done && !s->local) {
    fail_502(s, reason);
    return 0;
  }
  snprintf(s->fail, sizeof(s->fail), "%s", reason);
  uint32_t code = error_code == NGHTTP2_NO_ERROR ? NGHTTP2_INTERNAL_ERROR : error_code;
  nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, code);
  return 0;
}

/* ---- HTTP/1.1 upstream: one exchange at a time on c->u (docs/http2.md §6) ---- */

static void in_consume(side_t *u, size_t n) {
  if (n >= u->in_len) {
    u->in_len = 0;
    return;
  }
  memmove(u->in, u->in + n, u->in_len - n);
  u->in_len -= n;
}

/* The upstream connection broke or misbehaved during s's exchange. */
static void h1_broke(h2s_t *s, const char *reason) {
  h2_t *h = s->h;
  if (s->slot != NULL)
    slot_drop(s->slot);
  if (!s->h1_resp_head) {
    fail_502(s, reason);
    return;
  }
  snprintf(s->fail, sizeof(s->fail), "%s", reason);
  nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
}

/* Writes s's request head to the upstream. */
static bool h1_start(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  size_t cl = 0;
  bool has_len = hset_get(&s->rq, "content-length", &cl) != NULL;
  bool body = !(s->up.eof && s->up.len == 0);
  s->h1_chunked = body && !has_len;
  ce_h2h_field_t f[CE_H2_MAX_FIELDS];
  for (size_t i = 0; i < s->rq.n; i++) {
    f[i].name = s->rq.buf + s->rq.f[i].no;
    f[i].name_len = s->rq.f[i].nl;
    f[i].value = s->rq.buf + s->rq.f[i].vo;
    f[i].value_len = s->rq.f[i].vl;
  }
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  int rc = ce_h2h_write_request(&w, f, s->rq.n, s->h1_chunked);
  if (rc != CE_OK) {
    fail_with(s, 400, "bad_request: the request cannot be expressed in HTTP/1.1");
    return false;
  }
  ce_conn_side_write(s->slot->s, c->proxy->head_buf, w.len);
  /* The head is written (s->req keeps what the events show): only the
   * method matters from here on, for the response's framing. */
  size_t ml = 0;
  const char *method = hset_get(&s->rq, ":method", &ml);
  s->h1_head_req = method != NULL && ml == 4 && memcmp(method, "HEAD", 4) == 0;
  rq_drop(h, s);
  return !c->dead;
}

static void h1_send_body(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  side_t *u = s->slot->s;
  if (s->h1_req_done || s->h1_abandon)
    return;
  while (s->up.len > 0 && u->open && u->queued < CE_CONN_HIGH_WATER && !c->dead) {
    size_t n = s->up.len < 16384u ? s->up.len : 16384u;
    if (s->h1_chunked) {
      char hdr[24];
      int hl = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
      ce_conn_side_write(u, hdr, (size_t)hl);
    }
    ce_conn_side_write(u, (const char *)s->up.data, n);
    if (s->h1_chunked)
      ce_conn_side_write(u, "\r\n", 2);
    s->req.bytes_out += n;
    ce_reqinfo_add_preview(&s->req, (const char *)s->up.data, n, c->proxy->opts->body_preview);
    memmove(s->up.data, s->up.data + n, s->up.len - n);
    s->up.len -= n;
    /* The bytes left the proxy: the workspace may send as many again. */
    nghttp2_session_consume(h->srv, s->cid, n);
  }
  sbuf_trim(&s->up);
  if (s->up.len > 0 || !s->up.eof || c->dead)
    return;
  if (s->h1_chunked) {
    /* The last chunk, and the request's trailers as chunked trailers. */
    size_t cap = 5u + s->rqt.used + 4u * s->rqt.n + 2u;
    char *buf = malloc(cap);
    if (buf == NULL) {
      h1_broke(s, "out_of_memory");
      return;
    }
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, buf, cap);
    memcpy(buf, "0\r\n", 3);
    w.len = 3;
    for (size_t i = 0; s->rq_trailers && i < s->rqt.n; i++) {
      const char *name = s->rqt.buf + s->rqt.f[i].no;
      if (!ce_h1_trailer_allowed(name, s->rqt.f[i].nl) || (s->rqt.f[i].nl > 0 && name[0] == ':'))
        continue;
      size_t before = w.len;
      if (ce_h1_write_field(&w, name, s->rqt.f[i].nl, s->rqt.buf + s->rqt.f[i].vo, s->rqt.f[i].vl) != CE_OK) {
        w.err = 0;
        w.len = before;
      }
    }
    memcpy(buf + w.len, "\r\n", 2);
    ce_conn_side_write(u, buf, w.len + 2);
    free(buf);
  }
  s->h1_req_done = true;
}

/* The chunked body's trailers, as the response's trailers. */
static void h1_take_trailers(h2s_t *s) {
  if (s->h1_trailers == NULL || s->h1_body.kept == 0)
    return;
  ce_h2h_field_t f[CE_H2_MAX_FIELDS];
  char *names = malloc(CE_H1_MAX_TRAILER_BYTES);
  long n = names != NULL ? ce_h2h_trailer_fields(s->h1_trailers, s->h1_body.kept, f, CE_H2_MAX_FIELDS, names,
                                                 CE_H1_MAX_TRAILER_BYTES)
                         : -1;
  hset_reset(&s->rs);
  for (long i = 0; i < n; i++)
    hset_add(&s->rs, (const uint8_t *)f[i].name, f[i].name_len, (const uint8_t *)f[i].value, f[i].value_len,
             SIZE_MAX);
  free(names);
  s->rs_trailers = n > 0 && !s->rs.overflow;
}

/* How many more response bytes s may take from its HTTP/1.1 upstream:
 * what its buffer has room for, within the connection's budget
 * (CE_H2_DOWN_BUDGET). Past the budget, only what the workspace's windows
 * let go out at once while its socket is not backed up, so a stream the
 * workspace reads is never starved by the ones it leaves unread. */
static size_t down_allowance(h2_t *h, const h2s_t *s) {
  size_t room = CE_H2_STREAM_BUF - s->down.len;
  if (h->down_held < CE_H2_DOWN_BUDGET) {
    size_t left = CE_H2_DOWN_BUDGET - h->down_held;
    return left < room ? left : room;
  }
  if (h->c->c.queued >= CE_CONN_HIGH_WATER)
    return 0;
  int32_t sw = nghttp2_session_get_stream_remote_window_size(h->srv, s->cid);
  int32_t cw = nghttp2_session_get_remote_window_size(h->srv);
  int32_t w = sw < cw ? sw : cw;
  if (w <= 0 || (size_t)w <= s->down.len)
    return 0;
  size_t open = (size_t)w - s->down.len;
  return open < room ? open : room;
}

/* Reads s's response from u-> True when s is done with the upstream. */
static bool h1_read_response(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  h1slot_t *sl = s->slot;
  side_t *u = sl->s;
  while (!s->h1_resp_head) {
    if (u->in_len == 0) {
      if (u->eof) {
        h1_broke(s, "upstream_reset: connection closed before the response");
        return true;
      }
      return false;
    }
    /* CONNECT never gets here (a 400 in stream_request). */
    const char *why = NULL;
    int rc = ce_h1_parse_response(u->in, u->in_len, s->h1_head_req ? "HEAD" : "GET", s->h1_head_req ? 4u : 3u,
                                  h->head, &why);
    if (rc == CE_EAGAIN) {
      if (u->eof) {
        h1_broke(s, "upstream_bad_response: connection closed inside the response head");
        return true;
      }
      return false;
    }
    if (rc != CE_OK) {
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed head");
      h1_broke(s, reason);
      return true;
    }
    ce_h1_head_t *hd = h->head;
    if (hd->status >= 100 && hd->status < 200 && hd->status != 101) {
      /* Interim responses go to the workspace as non-final HEADERS
       * (docs/http2.md §3, §6), as the HTTP/1.1 path forwards them. */
      ce_h2h_field_t f[CE_H1_MAX_FIELDS];
      long k = ce_h2h_response_fields(hd, f, CE_H1_MAX_FIELDS, c->proxy->head_buf, CE_H1_MAX_HEAD_BYTES);
      if (k >= 0) {
        nghttp2_nv nva[CE_H1_MAX_FIELDS + 1];
        char st[8];
        snprintf(st, sizeof(st), "%d", hd->status);
        nva[0] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)st, 7, strlen(st), NGHTTP2_NV_FLAG_NONE};
        for (long i = 0; i < k; i++)
          nva[i + 1] = (nghttp2_nv){(uint8_t *)(uintptr_t)f[i].name, (uint8_t *)(uintptr_t)f[i].value,
                                    f[i].name_len, f[i].value_len, NGHTTP2_NV_FLAG_NONE};
        nghttp2_submit_headers(h->srv, NGHTTP2_FLAG_NONE, s->cid, NULL, nva, (size_t)k + 1, NULL);
      }
      in_consume(u, hd->head_len);
      continue;
    }
    if (hd->status == 101) {
      h1_broke(s, "upstream_bad_response: a 101 cannot be expressed in HTTP/2");
      return true;
    }
    ce_h2h_field_t f[CE_H1_MAX_FIELDS];
    long k = ce_h2h_response_fields(hd, f, CE_H1_MAX_FIELDS, c->proxy->head_buf, CE_H1_MAX_HEAD_BYTES);
    if (k < 0) {
      h1_broke(s, "upstream_bad_response: header list too large");
      return true;
    }
    nghttp2_nv nva[CE_H1_MAX_FIELDS + 1];
    char st[8];
    snprintf(st, sizeof(st), "%d", hd->status);
    nva[0] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)st, 7, strlen(st), NGHTTP2_NV_FLAG_NONE};
    size_t hbytes = 0;
    for (long i = 0; i < k; i++) {
      nva[i + 1] = (nghttp2_nv){(uint8_t *)(uintptr_t)f[i].name, (uint8_t *)(uintptr_t)f[i].value, f[i].name_len,
                                f[i].value_len, NGHTTP2_NV_FLAG_NONE};
      hbytes += f[i].name_len + f[i].value_len;
    }
    ce_reqinfo_set_response(&s->req, hd, c->proxy->opts);
    s->req.bytes_in += hbytes;
    s->h1_framing = hd->framing;
    s->h1_keep = hd->keep_alive;
    ce_h1_body_init(&s->h1_body, hd->framing, hd->content_length);
    if (hd->framing == CE_H1_BODY_CHUNKED) {
      /* Its trailers become a trailing HEADERS frame (docs/http2.md §6). */
      if (s->h1_trailers == NULL)
        s->h1_trailers = malloc(CE_H1_MAX_TRAILER_BYTES);
      if (s->h1_trailers != NULL)
        ce_h1_body_keep_trailers(&s->h1_body, s->h1_trailers);
    }
    bool nobody = hd->framing == CE_H1_BODY_NONE;
    s->down.eof = nobody;
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = down_read};
    int src = nghttp2_submit_response(h->srv, s->cid, nva, (size_t)k + 1, nobody ? NULL : &prd);
    in_consume(u, hd->head_len);
    s->h1_resp_head = true;
    s->rs_head_done = true;
    if (src != 0) {
      h1_broke(s, "upstream_bad_response: the response cannot be expressed in HTTP/2");
      return true;
    }
  }
  while (!s->down.eof) {
    size_t room = down_allowance(h, s);
    if (room == 0) {
      /* The workspace reads slower (this stream's buffer is full) or the
       * connection holds its budget: wait; the upstream's input fills and
       * its socket is not read until bytes leave (ce_h2conn_process). */
      h->down_stalled = true;
      return false;
    }
    if (u->in_len == 0) {
      if (!u->eof)
        return false;
      if (s->h1_framing != CE_H1_BODY_CLOSE) {
        h1_broke(s, "upstream_reset: connection closed inside the response body");
        return true;
      }
      /* RFC 8446 §6.1, RFC 9112 §9.8: over TLS only a close_notify ends a
       * close-delimited body; any other end (a TCP FIN alone, a TLS or
       * read error) is a truncation, as on the HTTP/1.1 path. */
      if (u->tls == NULL || !u->close_notify) {
        h1_broke(s, "upstream_tls: truncated: the server closed without close_notify");
        return true;
      }
      s->down.eof = true;
      s->h1_keep = false;
      break;
    }
    size_t len = u->in_len < room ? u->in_len : room;
    size_t used = 0, dl = 0;
    const char *data = NULL, *why = NULL;
    int rc = ce_h1_body_next(&s->h1_body, u->in, len, &used, &data, &dl, &why);
    if (rc < 0) {
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed body");
      h1_broke(s, reason);
      return true;
    }
    if (dl > 0) {
      if (!down_put(h, s, (const uint8_t *)data, dl)) {
        h1_broke(s, "out_of_memory");
        return true;
      }
      nghttp2_session_resume_data(h->srv, s->cid);
    }
    in_consume(u, used);
    if (rc == 1) {
      s->down.eof = true;
      h1_take_trailers(s);
    }
  }
  nghttp2_session_resume_data(h->srv, s->cid);
  /* The response is whole (it may still wait in s->down for the
   * workspace): the upstream connection is free. */
  if (!s->h1_req_done) {
    s->h1_abandon = true;
    s->h1_keep = false;
  }
  sl->cur = NULL;
  s->slot = NULL;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    h->slots[i].cooldown = false;
  if (!s->h1_keep || u->in_len > 0)
    slot_reset(sl);
  return true;
}

/* ---- the pool of HTTP/1.1 upstream connections ------------------------------------ */

static h1slot_t *slot_of_handle(uv_handle_t *hd) {
  return (h1slot_t *)((char *)hd - offsetof(h1slot_t, own.tcp));
}

static bool slot_open(const h1slot_t *sl) {
  return sl->s->open;
}

static bool slot_connecting(const h1slot_t *sl) {
  return sl->conn_slot ? sl->h->c->h2_connecting : sl->connecting;
}

/* Connected, verified, idle and clean: it may take a stream (over
 * HTTP/1.1; an h2 connection takes its streams in up_take_queue). */
static bool slot_ready(const h1slot_t *sl) {
  const side_t *u = sl->s;
  return sl->cur == NULL && sl->sess == NULL && !slot_connecting(sl) && u->open && u->connected && u->handshaken &&
         !u->eof && u->in_len == 0;
}

static void own_handle_closed(uv_handle_t *hd) {
  h1slot_t *sl = slot_of_handle(hd);
  ce_conn_t *c = sl->h->c;
  sl->own.closing = false;
  bool again = sl->connect_pending && !c->dead;
  sl->connect_pending = false;
  if (again)
    slot_connect_next(sl);
  if (!c->dead)
    ce_conn_process(c); /* the slot may be used (or opened) again */
  ce_conn_release(c);   /* last: it may free the connection */
}

static void own_close_handle(h1slot_t *sl) {
  side_t *u = &sl->own;
  if (!u->open)
    return;
  u->open = false;
  u->reading = false;
  u->closing = true;
  u->gen++;
  u->queued = 0;
  uv_close((uv_handle_t *)&u->tcp, own_handle_closed);
}

/* The slot's connection goes (a stream it served cannot be finished). */
static void slot_reset(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  sl->cur = NULL;
  if (sl->conn_slot) {
    ce_conn_upstream_reset(c);
    return;
  }
  sl->connecting = false;
  sl->connect_pending = false;
  if (sl->timer_init && !sl->timer_closing)
    uv_timer_stop(&sl->timer);
  own_close_handle(sl);
  ce_tlsconn_free(sl->own.tls);
  sl->own.tls = NULL;
  sl->own.connected = sl->own.handshaken = sl->own.eof = sl->own.close_notify = false;
  sl->own.in_len = 0;
  free(sl->addrs);
  sl->addrs = NULL;
  sl->next_addr = 0;
}

/* The stream the slot served is gone half-way: the connection goes too. */
static void slot_drop(h1slot_t *sl) {
  if (sl->cur != NULL)
    sl->cur->slot = NULL;
  slot_reset(sl);
}

/* Fails the queued streams with the reason a connection could not be had. */
static void fail_queue(h2_t *h, int status, const char *reason) {
  char why[300];
  snprintf(why, sizeof(why), "%s", reason != NULL ? reason : "upstream_unreachable");
  h2s_t *s;
  while ((s = h1_pop(h)) != NULL) {
    if (status == 403 && !s->allowed_sent) {
      char text[600], safe[400];
      plain(safe, sizeof(safe), why);
      snprintf(text, sizeof(text), "condukt: the network policy of this sandbox refused the request: %s\n", safe);
      /* A refusal by the policy (an address it keeps private): denied. */
      s->req.closed_at_us = ce_now_us();
      s->req.status = 403;
      stream_event(s, "request_denied", why);
      s->event_done = true;
      local_answer(s, 403, text);
    } else {
      fail_with(s, status, why);
    }
  }
}

/* A slot's connection could not be had: when no other connection is up or
 * coming, the waiting streams fail with its reason (docs/http2.md §6). */
static void slot_failed(h1slot_t *sl, int status, const char *reason) {
  h2_t *h = sl->h;
  if (!sl->conn_slot)
    slot_reset(sl);
  /* No storm of connects to an upstream that refuses more: the slot waits
   * until a stream ends on another one. */
  sl->cooldown = true;
  CE_TRACE_D("proxy", 'c', h->c->id, "h2: upstream connection %d failed: %s", (int)(sl - h->slots), reason);
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    const h1slot_t *o = &h->slots[i];
    if (o != sl && (o->cur != NULL || slot_connecting(o) || slot_ready(o) || (o->sess != NULL && !o->goaway)))
      return;
  }
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    h->slots[i].cooldown = false;
  fail_queue(h, status, reason);
}

static void own_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  h1slot_t *sl = slot_of_handle(hd);
  /* The proxy's one read buffer: own_read feeds the bytes to TLS at once. */
  *buf = uv_buf_init(sl->h->c->proxy->read_buf, CE_CONN_READ_CHUNK);
}

static void own_handshake(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  int rc = ce_tlsconn_handshake(sl->own.tls);
  ce_conn_side_write(&sl->own, NULL, 0);
  if (c->dead || rc == CE_EAGAIN)
    return;
  if (rc != CE_OK) {
    char reason[400];
    snprintf(reason, sizeof(reason), "upstream_tls: %s", ce_tlsconn_error(sl->own.tls));
    slot_failed(sl, 502, reason);
    return;
  }
  sl->own.handshaken = true;
  sl->connecting = false;
  uv_timer_stop(&sl->timer);
  if (sl->want_h2) {
    /* A connection opened after a GOAWAY (docs/http2.md §6): h2 again, or
     * HTTP/1.1 from now on if that is what the upstream picked. */
    sl->want_h2 = false;
    size_t n = 0;
    const char *p = ce_tlsconn_alpn(sl->own.tls, &n);
    if (p != NULL && n == 2 && memcmp(p, "h2", 2) == 0) {
      if (up_session_new(sl->h, &sl->sess) != CE_OK) {
        slot_failed(sl, 502, "out_of_memory");
        return;
      }
      CE_TRACE_D("proxy", 'c', c->id, "h2: upstream connection %d ready (h2)", (int)(sl - sl->h->slots));
      return;
    }
    sl->h->h2up = false;
  }
  CE_TRACE_D("proxy", 'c', c->id, "h2: upstream connection %d ready", (int)(sl - sl->h->slots));
}

static void own_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  h1slot_t *sl = slot_of_handle((uv_handle_t *)st);
  ce_conn_t *c = sl->h->c;
  if (c->dead || nread == 0)
    return;
  if (nread < 0) {
    sl->own.eof = true;
    uv_read_stop(st);
    sl->own.reading = false;
    if (sl->connecting)
      slot_failed(sl, 502, "upstream_tls: the server closed during the handshake");
    ce_conn_process(c);
    return;
  }
  ce_conn_touch(c);
  if (ce_tlsconn_feed(sl->own.tls, (const uint8_t *)buf->base, (size_t)nread) != CE_OK) {
    slot_failed(sl, 502, "out_of_memory");
  } else if (!sl->own.handshaken) {
    own_handshake(sl);
  }
  ce_conn_process(c);
}

static void own_connected(uv_connect_t *req, int status) {
  h1slot_t *sl = req->data;
  ce_conn_t *c = sl->h->c;
  if (c->dead || !sl->connecting || status == UV_ECANCELED)
    return;
  if (status < 0) {
    sl->last_err = status;
    own_close_handle(sl);
    slot_connect_next(sl);
    ce_conn_process(c);
    return;
  }
  sl->own.connected = true;
  uv_tcp_nodelay(&sl->own.tcp, 1);
  sl->own.reading = true;
  uv_read_start((uv_stream_t *)&sl->own.tcp, own_alloc, own_read);
  static const unsigned char alpn_h1[] = "\x08http/1.1";
  static const unsigned char alpn_both[] = "\x02h2\x08http/1.1";
  const unsigned char *alpn = sl->want_h2 ? alpn_both : alpn_h1;
  size_t alpn_len = sl->want_h2 ? sizeof(alpn_both) - 1 : sizeof(alpn_h1) - 1;
  SSL *ssl;
  if (ce_tls_client_ssl_new(c->proxy->client_ctx, c->sni.text, alpn, alpn_len, &ssl) != CE_OK ||
      ce_tlsconn_new(ssl, false, &sl->own.tls) != CE_OK) {
    slot_failed(sl, 502, "upstream_tls: cannot create a TLS session");
    ce_conn_process(c);
    return;
  }
  uv_timer_start(&sl->timer, slot_timeout, c->proxy->opts->handshake_ms, 0);
  own_handshake(sl);
  ce_conn_process(c);
}

/* The next resolved address, else the slot failed. */
static void slot_connect_next(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  if (sl->own.closing) {
    sl->connect_pending = true;
    return;
  }
  if (sl->addrs == NULL || sl->next_addr >= sl->addrs->count) {
    char reason[200];
    snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
             sl->last_err != 0 ? uv_strerror(sl->last_err) : "no address");
    slot_failed(sl, 502, reason);
    return;
  }
  const struct sockaddr *sa = (const struct sockaddr *)&sl->addrs->addrs[sl->next_addr++];
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    sl->last_err = uv_translate_sys_error(errno);
    slot_connect_next(sl);
    return;
  }
  /* The mark exempts the socket from the REDIRECT (docs/netfilter.md): fail closed. */
  if (ce_set_mark(fd, c->proxy->opts->mark) != CE_OK) {
    close(fd);
    slot_failed(sl, 502, "upstream_unreachable: cannot set SO_MARK (the sidecar needs CAP_NET_ADMIN)");
    return;
  }
  uv_tcp_init(c->proxy->loop, &sl->own.tcp);
  sl->own.tcp.data = c;
  c->handles++;
  sl->own.open = true;
  int rc = uv_tcp_open(&sl->own.tcp, fd);
  if (rc == 0) {
    sl->creq.data = sl;
    rc = uv_tcp_connect(&sl->creq, &sl->own.tcp, sa, own_connected);
  } else {
    close(fd);
  }
  if (rc < 0) {
    sl->last_err = rc;
    own_close_handle(sl);
    slot_connect_next(sl);
  }
}

/* The slot's lookup ended (ce_conn_resolve: the same resolver and
 * private-address rule as conn.c). */
static void own_resolved(void *data, int status, ce_dns_addrs_t *keep, const char *reason) {
  h1slot_t *sl = data;
  ce_conn_t *c = sl->h->c;
  sl->resolving = false;
  if (c->dead || !sl->connecting) {
    free(keep);
    ce_conn_release(c); /* last: it may free the connection */
    return;
  }
  if (keep == NULL) {
    slot_failed(sl, status, reason);
  } else {
    sl->addrs = keep;
    sl->next_addr = 0;
    sl->last_err = 0;
    slot_connect_next(sl);
  }
  ce_conn_process(c);
  ce_conn_release(c);
}

static void slot_timeout(uv_timer_t *t) {
  h1slot_t *sl = t->data;
  ce_conn_t *c = sl->h->c;
  if (c->dead || !sl->connecting)
    return;
  slot_failed(sl, 504, "upstream_unreachable: connect timed out");
  ce_conn_process(c);
}

static void own_timer_closed(uv_handle_t *hd) {
  h1slot_t *sl = hd->data;
  ce_conn_release(sl->h->c); /* last: it may free the connection */
}

/* Starts connecting an own slot (docs/http2.md §6). */
static void own_connect(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  if (sl->resolving || sl->own.closing)
    return; /* the last attempt's lookup or handle is still going away */
  if (!sl->timer_init) {
    uv_timer_init(c->proxy->loop, &sl->timer);
    sl->timer.data = sl;
    sl->timer_init = true;
    c->handles++;
  }
  sl->connecting = true;
  sl->last_err = 0;
  uv_timer_start(&sl->timer, slot_timeout, c->proxy->opts->connect_ms, 0);
  int rc = ce_conn_resolve(c, c->sni.text, c->port, own_resolved, sl);
  if (rc != CE_OK) {
    char reason[200];
    snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
             rc == CE_EAGAIN ? "the resolver is busy" : ce_strerror(rc));
    slot_failed(sl, 502, reason);
    return;
  }
  sl->resolving = true;
  c->handles++;
  CE_TRACE_D("proxy", 'c', c->id, "h2: connecting upstream connection %d", (int)(sl - sl->h->slots));
}

static void slot_connect(h1slot_t *sl) {
  if (sl->conn_slot)
    ce_conn_h2_connect(sl->h->c, sl->want_h2);
  else
    own_connect(sl);
}

/* Serves sl's stream as far as the bytes allow. True when it is free again. */
static bool slot_serve(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  while (!c->dead && sl->cur != NULL) {
    h2s_t *s = sl->cur;
    h1_send_body(s);
    if (c->dead || sl->cur != s)
      continue;
    if (!h1_read_response(s))
      return false;
  }
  return !c->dead;
}

/* Streams wait for an h2 connection while none can be opened: every slot
 * holds a connection draining after its GOAWAY (kept by long streams),
 * and none is coming. */
static bool queue_blocked(const h2_t *h) {
  if (!h->h2up || h->qhead == NULL)
    return false;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    const h1slot_t *sl = &h->slots[i];
    if (sl->sess == NULL || !sl->goaway)
      return false;
  }
  return true;
}

/* The queue's deadline (docs/http2.md §6 "GOAWAY"): streams that waited
 * the connect timeout while every connection drained fail with 503. */
static void queue_timeout(uv_timer_t *t) {
  h1slot_t *sl = t->data;
  h2_t *h = sl->h;
  ce_conn_t *c = h->c;
  if (c->dead)
    return;
  if (!queue_blocked(h)) {
    h->blocked_at = 0;
    return;
  }
  uint64_t limit = c->proxy->opts->connect_ms, waited = now_ms() - h->blocked_at;
  if (waited < limit) {
    uv_timer_start(t, queue_timeout, limit - waited, 0);
    return;
  }
  h->blocked_at = 0;
  CE_TRACE_D("proxy", 'c', c->id, "h2: every upstream connection drains; the waiting streams fail");
  fail_queue(h, 503,
             "upstream_busy: every upstream connection is draining after a GOAWAY; no new one could be opened "
             "within the connect timeout");
  ce_conn_process(c);
}

/* The queue is blocked: its deadline runs on an own slot's timer (idle
 * while its connection is up; a slot that connects again restarts it for
 * its connect, and then the queue is no longer blocked). */
static void queue_wait(h2_t *h) {
  if (!queue_blocked(h))
    return;
  if (h->blocked_at == 0)
    h->blocked_at = now_ms();
  for (size_t i = 1; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &h->slots[i];
    if (!sl->timer_init || sl->timer_closing || sl->connecting)
      continue;
    if (!uv_is_active((uv_handle_t *)&sl->timer))
      uv_timer_start(&sl->timer, queue_timeout, h->c->proxy->opts->connect_ms, 0);
    return;
  }
}

static void h1_pump(h2_t *h) {
  ce_conn_t *c = h->c;
  if (h->blocked_at != 0 && !queue_blocked(h))
    h->blocked_at = 0;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    if (sl->sess != NULL)
      continue; /* an h2 connection: up_links */
    if (!sl->conn_slot && sl->own.open && sl->own.handshaken) {
      /* Decrypted input while there is room; a full buffer that the
       * stream drains is filled again at once. */
      for (int round = 0; round < 64 && !c->dead; round++) {
        ce_conn_pump_tls_input(&sl->own);
        bool full = sl->own.in_len == CE_CONN_INPUT_MAX;
        if (c->dead || sl->cur == NULL)
          break;
        slot_serve(sl);
        if (!full || sl->own.in_len == CE_CONN_INPUT_MAX)
          break;
      }
    } else if (sl->cur != NULL) {
      slot_serve(sl);
    }
    if (c->dead)
      return;
    /* Nothing asked of an idle upstream: stray bytes or its close end it. */
    if (sl->cur == NULL && !slot_connecting(sl) && slot_open(sl) && sl->s->handshaken &&
        (sl->s->eof || sl->s->in_len > 0))
      slot_reset(sl);
  }
  /* Waiting streams take the idle connections, then new ones are opened
   * while more streams wait than connections are coming. */
  while (!c->dead && h->qhead != NULL) {
    h1slot_t *ready = NULL;
    size_t coming = 0;
    for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
      if (ready == NULL && slot_ready(&h->slots[i]))
        ready = &h->slots[i];
      if (slot_connecting(&h->slots[i]))
        coming++;
    }
    if (ready != NULL) {
      h2s_t *s = h1_pop(h);
      stream_allowed(s);
      ready->cur = s;
      s->slot = ready;
      s->h1_resp_head = false;
      if (!h1_start(s)) {
        /* Nothing of s was written: the connection stays good for the
         * next stream (a reset would cost a fresh TLS connection). */
        if (ready->cur == s) {
          ready->cur = NULL;
          s->slot = NULL;
        }
        continue;
      }
      slot_serve(ready);
      continue;
    }
    if (coming >= h->qlen)
      return;
    /* After a GOAWAY of an h2 upstream: one new connection at a time,
     * offering h2 (slot 0 too, once its first connection is gone). */
    if (h->h2up && (coming > 0 || up_current(h) != NULL))
      return;
    h1slot_t *idle = NULL;
    for (size_t i = 0; i < CE_H2_H1_POOL && idle == NULL; i++) {
      h1slot_t *sl = &h->slots[i];
      bool busy = sl->conn_slot ? (c->resolving || c->u.closing) : (sl->resolving || sl->own.closing);
      if (sl->cur == NULL && sl->sess == NULL && !slot_connecting(sl) && !slot_open(sl) && !busy && !sl->cooldown)
        idle = sl;
    }
    if (idle == NULL) {
      queue_wait(h);
      return;
    }
    idle->want_h2 = h->h2up;
    slot_connect(idle);
    if (!slot_connecting(idle))
      return; /* it failed at once (and said so), or must wait: no loop */
  }
}

void ce_h2conn_upstream_done(ce_conn_t *c, int status, const char *reason) {
  h2_t *h = c->h2;
  if (h == NULL)
    return;
  h1slot_t *sl = &h->slots[0];
  bool want_h2 = sl->want_h2;
  sl->want_h2 = false;
  if (status != 0) {
    slot_failed(sl, status, reason);
    return;
  }
  if (!want_h2)
    return;
  /* Slot 0 connected again after a GOAWAY (docs/http2.md §6): h2, or
   * HTTP/1.1 from now on if that is what the upstream picked. */
  size_t n = 0;
  const char *p = c->u.tls != NULL ? ce_tlsconn_alpn(c->u.tls, &n) : NULL;
  if (p != NULL && n == 2 && memcmp(p, "h2", 2) == 0) {
    if (up_session_new(h, &sl->sess) != CE_OK) {
      ce_conn_upstream_reset(c);
      slot_failed(sl, 502, "out_of_memory");
      return;
    }
    CE_TRACE_D("proxy", 'c', c->id, "h2: upstream connection 0 ready (h2)");
    return;
  }
  h->h2up = false;
}

/* Own slots' reading: while their input has room (as conn.c's update_reading). */
void ce_h2conn_update_reading(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL || c->dead)
    return;
  for (size_t i = 1; i < CE_H2_H1_POOL; i++) {
    side_t *u = &h->slots[i].own;
    ce_conn_release_input(u); /* drained: back to the pool */
    if (!u->open || !u->connected)
      continue;
    bool want = !u->eof && u->in_len < CE_CONN_INPUT_MAX - 1;
    if (want && !u->reading) {
      uv_read_start((uv_stream_t *)&u->tcp, own_alloc, own_read);
      u->reading = true;
    } else if (!want && u->reading) {
      uv_read_stop((uv_stream_t *)&u->tcp);
      u->reading = false;
    }
  }
}

/* conn_abort: the own slots' handles and lookups go with the connection. */
void ce_h2conn_close_handles(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL)
    return;
  for (size_t i = 1; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &h->slots[i];
    sl->connecting = false;
    own_close_handle(sl);
    if (sl->timer_init && !sl->timer_closing) {
      sl->timer_closing = true;
      uv_close((uv_handle_t *)&sl->timer, own_timer_closed);
    }
  }
}

/* ---- sessions ------------------------------------------------------------------------ */

/* A client session towards an h2 upstream connection, its SETTINGS
 * submitted (h2/session.h). */
static int up_session_new(h2_t *h, nghttp2_session **out) {
  static const ce_h2_session_params_t params = {
      .role = CE_H2_SESSION_CLIENT,
      .stream_window = CE_H2_STREAM_BUF,
      .conn_window = CE_H2_CONN_WINDOW,
      .max_header_list = CE_H2_MAX_HEADER_LIST,
  };
  static const ce_h2_session_callbacks_t cbs = {
      .header = up_header,
      .frame_recv = up_frame_recv,
      .data_chunk_recv = up_data,
      .stream_close = up_stream_close,
  };
  return ce_h2_session_new(&params, &cbs, h, out);
}

static int new_sessions(h2_t *h) {
  static const ce_h2_session_params_t params = {
      .role = CE_H2_SESSION_SERVER,
      .stream_window = CE_H2_STREAM_BUF,
      .conn_window = CE_H2_CONN_WINDOW,
      .max_header_list = CE_H2_MAX_HEADER_LIST,
      .max_streams = CE_H2_MAX_STREAMS,
  };
  static const ce_h2_session_callbacks_t cbs = {
      .begin_headers = srv_begin_headers,
      .header = srv_header,
      .frame_recv = srv_frame_recv,
      .data_chunk_recv = srv_data,
      .frame_send = srv_frame_send,
      .stream_close = srv_stream_close,
  };
  if (ce_h2_session_new(&params, &cbs, h, &h->srv) != CE_OK)
    return CE_ENOMEM;
  /* The pre-connected upstream spoke h2: its session on slot 0 (c->u). */
  if (h->h2up && up_session_new(h, &h->slots[0].sess) != CE_OK)
    return CE_ENOMEM;
  return CE_OK;
}

int ce_h2conn_start(ce_conn_t *c) {
  h2_t *h = calloc(1, sizeof(*h));
  if (h == NULL)
    return CE_ENOMEM;
  h->c = c;
  c->h2 = h;
  ce_h2_guard_init(&h->guard);
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &h->slots[i];
    sl->h = h;
    sl->conn_slot = i == 0;
    sl->s = i == 0 ? &c->u : &sl->own;
    sl->own.conn = c;
    sl->own.name = "upstream";
  }
  /* Without an h2 upstream (it speaks HTTP/1.1, or is not connected yet)
   * streams are translated (docs/http2.md §6). */
  h->h2up = c->up_h2;
  h->head = malloc(sizeof(*h->head));
  if (h->head == NULL || new_sessions(h) != CE_OK)
    return CE_ENOMEM;
  CE_TRACE_D("proxy", 'c', c->id, "h2 with the workspace and the upstream");
  return CE_OK;
}

void ce_h2conn_held(const struct ce_h2conn *h, size_t *queued, size_t *streams) {
  size_t q = 0, up = 0;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (!h->slots[i].conn_slot)
      q += h->slots[i].own.queued;
  for (const h2s_t *s = h->streams; s != NULL; s = s->next)
    up += s->up.cap;
  *queued = q;
  *streams = h->down_held + h->rq_held + up;
}

void ce_h2conn_free(struct ce_h2conn *h) {
  if (h == NULL)
    return;
  /* Deleting the sessions runs no stream callbacks: a stream still
   * without its closing event gets one, then the records go. */
  for (h2s_t *s = h->streams; s != NULL; s = s->next)
    stream_finish_event(s, "connection_closed");
  while (h->streams != NULL)
    stream_free(h, h->streams);
  rq_check(h);
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &h->slots[i];
    nghttp2_session_del(sl->sess);
    sl->sess = NULL;
    if (sl->conn_slot)
      continue;
    ce_tlsconn_free(sl->own.tls);
    sl->own.in_len = 0;
    ce_conn_release_input(&sl->own);
    free(sl->addrs);
  }
  nghttp2_session_del(h->srv);
  free(h->head);
  free(h);
}

/* An h2 upstream connection is over: streams it still carried fail, and
 * its connection closes. A GOAWAY'd one whose streams all ended goes this
 * way quietly. */
static void up_gone(h1slot_t *sl, const char *reason) {
  h2_t *h = sl->h;
  if (sl->sess == NULL)
    return;
  for (h2s_t *s = h->streams; s != NULL; s = s->next) {
    if (s->uslot != sl)
      continue;
    s->uslot = NULL;
    if (s->uid == 0)
      continue;
    s->uid = 0;
    if (!s->rs_head_done && !s->local) {
      fail_502(s, reason);
    } else if (!s->down.eof) {
      snprintf(s->fail, sizeof(s->fail), "%s", reason);
      nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
    }
  }
  CE_TRACE_D("proxy", 'c', h->c->id, "h2: upstream connection %d closed: %s", (int)(sl - h->slots), reason);
  nghttp2_session_del(sl->sess);
  sl->sess = NULL;
  sl->goaway = false;
  sl->goaway_last = 0;
  sl->goaway_error = false;
  if (sl->conn_slot)
    ce_conn_upstream_reset(h->c);
  else
    slot_reset(sl);
}

/* A session that failed: its connection goes, and (fail closed) no new
 * h2 connection replaces it: new streams get 502 with the reason. Only
 * the current connection's failure says so: a draining one's (after its
 * GOAWAY) ends only its own streams. */
static void up_failed(h1slot_t *sl, const char *reason) {
  h2_t *h = sl->h;
  if (!sl->goaway && h->up_fail[0] == '\0')
    snprintf(h->up_fail, sizeof(h->up_fail), "%s", reason);
  up_gone(sl, reason);
}

/* The frames of every h2 upstream connection; one that closed goes. */
static void up_links(h2_t *h) {
  ce_conn_t *c = h->c;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    side_t *u = sl->s;
    /* c->u's decrypted input comes from conn_process; an own connection's
     * is moved here, a buffer at a time. */
    for (int round = 0; round < 64 && sl->sess != NULL && !c->dead; round++) {
      if (!sl->conn_slot)
        ce_conn_pump_tls_input(u);
      if (c->dead || u->in_len == 0)
        break;
      ssize_t n = nghttp2_session_mem_recv(sl->sess, (const uint8_t *)u->in, u->in_len);
      u->in_len = 0;
      if (n < 0) {
        char reason[120];
        snprintf(reason, sizeof(reason), "upstream_bad_response: %s", nghttp2_strerror((int)n));
        up_failed(sl, reason);
      }
      if (sl->conn_slot)
        break;
    }
    if (sl->sess != NULL && !c->dead && (u->eof || !u->open))
      up_gone(sl, "upstream_reset: connection closed");
  }
}

/* Streams waiting for an h2 connection (opened after a GOAWAY, or
 * refused and sent again) go on the one that takes streams. */
static void up_take_queue(h2_t *h) {
  h1slot_t *sl;
  while (!h->c->dead && h->h2up && h->qhead != NULL && (sl = up_current(h)) != NULL)
    stream_submit(h1_pop(h), sl);
  /* The h2 upstream failed for good: no connection comes for them. */
  if (!h->c->dead && h->h2up && h->up_fail[0] != '\0' && h->qhead != NULL)
    fail_queue(h, 502, h->up_fail);
}

/* A connection-level failure: GOAWAY, the event, close after the flush. */
static void conn_fail(h2_t *h, uint32_t code, const char *reason) {
  ce_conn_t *c = h->c;
  if (!h->failed) {
    h->failed = true;
    ce_conn_report_failed(c, reason);
    CE_TRACE_W("proxy", 'c', c->id, "h2: %s", reason);
    /* The session ends here: no stream of it completes. */
    for (h2s_t *s = h->streams; s != NULL; s = s->next)
      stream_finish_event(s, reason);
    /* A workspace that never reads its GOAWAY (docs/http2.md §5) does not
     * hold the connection: it ends by a fixed deadline. */
    ce_conn_hard_deadline(c);
  }
  nghttp2_session_terminate_session(h->srv, code);
}

static void flush(h2_t *h) {
  ce_conn_t *c = h->c;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    while (!c->dead && sl->sess != NULL && sl->s->open && sl->s->queued < CE_CONN_HIGH_WATER) {
      const uint8_t *data;
      ssize_t n = nghttp2_session_mem_send(sl->sess, &data);
      if (n < 0) {
        char reason[120];
        snprintf(reason, sizeof(reason), "upstream_bad_response: %s", nghttp2_strerror((int)n));
        up_failed(sl, reason);
        break;
      }
      if (n == 0)
        break;
      ce_conn_side_write(sl->s, (const char *)data, (size_t)n);
    }
    /* A GOAWAY'd connection whose streams all ended (a drain), or a
     * session that is over: it closes. */
    if (!c->dead && sl->sess != NULL && !nghttp2_session_want_read(sl->sess) &&
        !nghttp2_session_want_write(sl->sess))
      up_gone(sl, "upstream_reset: the upstream ended the connection (GOAWAY)");
  }
  while (!c->dead && c->c.open && c->c.queued < CE_CONN_HIGH_WATER) {
    const uint8_t *data;
    ssize_t n = nghttp2_session_mem_send(h->srv, &data);
    if (n < 0) {
      conn_fail(h, NGHTTP2_INTERNAL_ERROR, "h2_internal_error");
      ce_conn_abort(c);
      return;
    }
    if (n == 0)
      break;
    ce_conn_side_write(&c->c, (const char *)data, (size_t)n);
  }
}

void ce_h2conn_process(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL || c->dead)
    return;
  /* The workspace's frames: through the guard, then nghttp2. */
  if (c->c.in_len > 0 && !h->failed) {
    ce_h2g_verdict_t v = ce_h2_guard_feed(&h->guard, (const uint8_t *)c->c.in, c->c.in_len, now_ms());
    if (v != CE_H2G_OK) {
      conn_fail(h, v == CE_H2G_BAD_PREFACE ? NGHTTP2_PROTOCOL_ERROR : NGHTTP2_ENHANCE_YOUR_CALM,
                ce_h2_guard_reason(v));
    } else {
      ssize_t n = nghttp2_session_mem_recv(h->srv, (const uint8_t *)c->c.in, c->c.in_len);
      if (n < 0) {
        char reason[120];
        snprintf(reason, sizeof(reason), "h2_protocol_error: %s", nghttp2_strerror((int)n));
        conn_fail(h, n == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR, reason);
      }
    }
  }
  c->c.in_len = 0;
  /* The h2 upstream connections' frames, then the HTTP/1.1 ones and the
   * streams waiting for a connection (docs/http2.md §6). */
  up_links(h);
  if (c->dead)
    return;
  up_take_queue(h);
  h->down_stalled = false;
  h1_pump(h);
  size_t held = h->down_held;
  flush(h);
  /* Bytes the workspace took make room in the budget: the stalled
   * upstreams go on at once (the write's completion would do it too). */
  if (!c->dead && h->down_stalled && h->down_held < held) {
    h->down_stalled = false;
    h1_pump(h);
    flush(h);
  }
  /* A stream refused while frames were sent waits for a connection. */
  if (!c->dead && h->h2up && h->qhead != NULL) {
    up_take_queue(h);
    h1_pump(h);
    flush(h);
  }
  if (c->dead)
    return;
  if (c->c.eof) {
    /* The workspace is gone: its streams with it. */
    for (h2s_t *s = h->streams; s != NULL; s = s->next)
      stream_finish_event(s, "client_reset: connection closed");
    ce_conn_abort(c);
    return;
  }
  if (!nghttp2_session_want_read(h->srv) && !nghttp2_session_want_write(h->srv)) {
    h->closing = true;
    ce_conn_close_after_flush(c);
  }
}

void ce_h2conn_timeout(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h != NULL) {
    for (h2s_t *s = h->streams; s != NULL; s = s->next)
      stream_finish_event(s, s->rs_head_done ? "upstream_timeout: response body stalled"
                                             : "upstream_timeout: no response");
    if (h->streams == NULL) {
      /* Idle: a GOAWAY and no event (docs/http2.md §5). */
      nghttp2_session_terminate_session(h->srv, NGHTTP2_NO_ERROR);
      flush(h);
    }
  }
  ce_conn_abort(c);
}

void ce_h2conn_drain(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL || h->draining)
    return;
  h->draining = true;
  nghttp2_submit_goaway(h->srv, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(h->srv),
                        NGHTTP2_NO_ERROR, NULL, 0);
  if (h->streams == NULL) {
    flush(h);
    h->closing = true;
    ce_conn_close_after_flush(c);
    return;
  }
  flush(h);
}

void ce_h2conn_abort(ce_conn_t *c, const char *reason) {
  h2_t *h = c->h2;
  if (h == NULL)
    return;
  for (h2s_t *s = h->streams; s != NULL; s = s->next)
    stream_finish_event(s, reason);
}
