/* HTTP/2 with the workspace: the server session and its streams (h2_internal.h). */
#include "proxy/http2/h2_internal.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>

static void hset_free(hset_t *s);
static void down_taken(h2_t *h, h2s_t *s, size_t n);
static void down_drop(h2_t *h, h2s_t *s);
static void rq_check(const h2_t *h);
static h2s_t *rq_kept_for_resend(h2_t *h, const h2s_t *except);
static void rq_add(h2_t *h, h2s_t *s, const uint8_t *name, size_t nl, const uint8_t *value, size_t vl);
static void stream_release_windows(h2_t *h, h2s_t *s);
static h2s_t *stream_new(h2_t *h, int32_t cid);
static void stream_free(h2_t *h, h2s_t *s);
static ssize_t local_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                          uint32_t *data_flags, nghttp2_data_source *source, void *user_data);
static void local_answer(h2s_t *s, int status, const char *text);
static void h2_forward(ce_exchange_t *x);
static void h2_respond(ce_exchange_t *x, int status, const char *text);
static bool h2_answer_wanted(ce_exchange_t *x);
static void h2_answered(ce_exchange_t *x);
static void ask_next(h2_t *h);
static int srv_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
static int srv_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                      const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data);
static int srv_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
static int srv_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                    void *user_data);
static int srv_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
static void stream_malformed(h2s_t *s, uint32_t code);
static int srv_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data);
static int new_sessions(h2_t *h);
static void conn_fail(h2_t *h, uint32_t code, const char *reason);
static const ce_exchange_ops_t h2_ops;
static bool previews(h2_t *h, bool final);

/* The session a stream's uid belongs to, or NULL. */
nghttp2_session *h2__stream_up(const h2s_t *s) {
  return s->uslot != NULL ? s->uslot->sess : NULL;
}

/* The h2 upstream connection that takes new streams, or NULL. */
h1slot_t *h2__up_current(h2_t *h) {
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (h->slots[i].sess != NULL && !h->slots[i].goaway)
      return &h->slots[i];
  return NULL;
}

h1slot_t *h2__slot_of_session(h2_t *h, nghttp2_session *session) {
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (h->slots[i].sess == session)
      return &h->slots[i];
  return NULL;
}

uint64_t h2__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- header sets ---------------------------------------------------------- */

void h2__hset_reset(hset_t *s) {
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
bool h2__hset_add(hset_t *s, const uint8_t *name, size_t nl, const uint8_t *value, size_t vl, size_t max_cap) {
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

int64_t h2__length(const char *v, size_t n) {
  if (n == 0 || n > 18)
    return -1;
  int64_t len = 0;
  for (size_t i = 0; i < n && len >= 0; i++)
    len = v[i] >= '0' && v[i] <= '9' ? len * 10 + (v[i] - '0') : -1;
  return len;
}

/* The value of a field (first one), or NULL. */
const char *h2__hset_get(const hset_t *s, const char *name, size_t *len) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < s->n; i++)
    if (s->f[i].nl == nl && memcmp(s->buf + s->f[i].no, name, nl) == 0) {
      *len = s->f[i].vl;
      return s->buf + s->f[i].vo;
    }
  return NULL;
}


/* The fields of an allowed stream as they go upstream (h2 or HTTP/1.1):
 * its request's, with the credentials the policy gives it
 * (policy/credential.h; the event record keeps what the workspace sent).
 * Values may point into the secrets: used within this loop turn. Returns
 * the count, or CE_ETOOBIG / CE_EINVAL / CE_ENOMEM (refuse the stream). */
long h2__rq_fields(h2s_t *s, ce_h1_field_t *f, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < s->rq.n && n < cap; i++, n++)
    f[n] = (ce_h1_field_t){s->rq.buf + s->rq.f[i].no, s->rq.f[i].nl, s->rq.buf + s->rq.f[i].vo, s->rq.f[i].vl};
  size_t ml = 0, pl = 0;
  const char *method = h2__hset_get(&s->rq, ":method", &ml);
  const char *path = h2__hset_get(&s->rq, ":path", &pl);
  ce_credential_request_t cred = {s->x.req.host, strlen(s->x.req.host), method, ml, path, pl, true};
  int rc = ce_credential_apply(s->h->c->proxy->policy, s->h->c->proxy->secrets, &cred, f, &n, cap);
  return rc < 0 ? rc : (long)n;
}
/* nghttp2_nv entries for every field of a head (pseudo ones first, as
 * received), or of a trailer section: then no pseudo field and only what
 * a trailer may carry (ce_h1_trailer_allowed, the one list every trailer
 * path filters with: no Host, framing or credentials in trailers). */
size_t h2__hset_nva(const hset_t *s, nghttp2_nv *out, size_t cap, bool trailers) {
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
void h2__hset_head(const hset_t *s, ce_h1_head_t *hd) {
  /* Everything but the fields array (4 KiB, of which only the first
   * field_count entries are ever read): this runs twice per stream. */
  _Static_assert(offsetof(ce_h1_head_t, field_count) ==
                     offsetof(ce_h1_head_t, fields) + sizeof(((ce_h1_head_t *)0)->fields),
                 "the two memsets below clear every member but fields[]");
  memset(hd, 0, offsetof(ce_h1_head_t, fields));
  memset(&hd->field_count, 0, sizeof(*hd) - offsetof(ce_h1_head_t, field_count));
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

size_t h2__hset_bytes(const hset_t *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++)
    n += s->f[i].nl + s->f[i].vl;
  return n;
}

/* ---- streams ---------------------------------------------------------------- */

/* The down buffer, counted in h->down_held (CE_H2_DOWN_BUDGET). */
bool h2__down_put(h2_t *h, h2s_t *s, const uint8_t *data, size_t len) {
  size_t before = s->down.cap;
  int rc = ce_h2buf_put(&s->down, data, len, CE_H2_UP_STREAM_WINDOW);
  h->down_held += s->down.cap - before;
  return rc == CE_OK;
}

/* n bytes of the down buffer went to the workspace (a DATA frame): they
 * leave the buffer, count as the response's, and the upstream may send as
 * many again. */
static void down_taken(h2_t *h, h2s_t *s, size_t n) {
  size_t before = s->down.cap;
  ce_h2buf_drop(&s->down, n);
  h->down_held -= before - s->down.cap;
  s->x.req.bytes_in += n;
  s->down_sent += n;
  nghttp2_session *us = h2__stream_up(s);
  if (us != NULL) {
    if (s->uid > 0)
      nghttp2_session_consume(us, s->uid, n);
    else
      nghttp2_session_consume_connection(us, n);
  }
}

size_t h2__orphaned(const h2_t *h) {
  size_t n = 0;
  for (const h2s_t *s = h->streams; s != NULL; s = s->next)
    if (s->route == H2S_ROUTE_H2 && s->uslot == NULL)
      n += s->down.len;
  return n;
}

static void down_drop(h2_t *h, h2s_t *s) {
  h->down_held -= s->down.cap;
  ce_h2buf_clear(&s->down);
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
void h2__rq_drop(h2_t *h, h2s_t *s) {
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
    if (o != except && o->route == H2S_ROUTE_H2 && o->uid > 0 && !o->rs_head_done && o->rq.cap > 0)
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
    if (h2__hset_add(&s->rq, name, nl, value, vl, room) || s->rq_refused)
      break;
    h2s_t *o = rq_kept_for_resend(h, s);
    if (o == NULL) {
      s->rq_refused = true;
      continue;
    }
    CE_TRACE_D("proxy", 'c', h->c->id, "h2: head budget: stream %d is no longer kept for a resend", (int)o->cid);
    h2__rq_drop(h, o);
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
    ce_h2buf_clear(&s->up);
  }
  nghttp2_session *us = h2__stream_up(s);
  if (s->down.len > 0 && us != NULL) {
    if (s->uid > 0)
      nghttp2_session_consume(us, s->uid, s->down.len);
    else
      nghttp2_session_consume_connection(us, s->down.len);
    down_drop(h, s);
  }
}

static h2s_t *stream_new(h2_t *h, int32_t cid) {
  /* The scratch head comes with the first stream after a rest (the idle
   * release frees it: ce_h2conn_release_idle). */
  if (h->head == NULL && (h->head = malloc(sizeof(*h->head))) == NULL)
    return NULL;
  h2s_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return NULL;
  s->h = h;
  s->cid = cid;
  s->rq_length = -1;
  s->rs_length = -1;
  ce_exchange_init(&s->x, &h2_ops, s, &h->asks);
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
  ce_exchange_end(&s->x);
  h2__rq_drop(h, s);
  hset_free(&s->rqt);
  hset_free(&s->rs);
  ce_h2buf_clear(&s->up);
  down_drop(h, s);
  free(s->local_body);
  free(s->h1_trailers);
  free(s);
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
  h2__rq_drop(h, s);
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
  if (ce_exchange_is_open(&s->x)) {
    s->x.req.status = status;
    s->x.req.bytes_in += s->local_len;
    if (s->x.req.responded_at_us == 0)
      s->x.req.responded_at_us = ce_now_us();
  }
  /* Nothing more from the upstream for this stream. */
  if (s->uid > 0 && h2__stream_up(s) != NULL) {
    nghttp2_session_set_stream_user_data(h2__stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(h2__stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
    s->uid = 0;
  }
}

/* A failure before any response byte: request_failed, then the status. */
void h2__fail_with(h2s_t *s, int status, const char *reason) {
  char text[CE_EXCHANGE_TEXT_MAX];
  ce_exchange_text(text, sizeof(text), reason);
  local_answer(s, status, text);
  ce_exchange_finish(&s->x, reason);
}

void h2__fail_502(h2s_t *s, const char *reason) { h2__fail_with(s, 502, reason); }

/* ---- the upstream's data, to the workspace ------------------------------------ */

/* The response's DATA is not copied into nghttp2's frame buffer: the read
 * callback only says how much goes (NGHTTP2_DATA_FLAG_NO_COPY), and
 * srv_send_data writes the frame from the down buffer, its header in the
 * buffer's headroom (h2/streambuf.h), in one piece. */
ssize_t h2__down_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  /* A frame goes out in one piece: at most the bytes of the buffer's
   * first chunk (h2/streambuf.h). */
  size_t front = ce_h2buf_front(&s->down);
  size_t n = front < length ? front : length;
  if (n > 0)
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (s->down.len == n && s->down.eof) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (s->rs_trailers) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = h2__hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, true /* trailers */);
      if (nghttp2_submit_trailer(session, stream_id, nva, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return (ssize_t)n;
  }
  if (n == 0)
    return NGHTTP2_ERR_DEFERRED;
  return (ssize_t)n;
}

/* Writes a DATA frame h2__down_read announced: the 9-byte header, then
 * `length` bytes from the front of the stream's down buffer (no padding:
 * the session has no padding callback). Like the frames of mem_send, it
 * goes only while the workspace's socket is under its high-water mark;
 * else nghttp2 offers the same frame again at the next flush. */
static int srv_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                         nghttp2_data_source *source, void *user_data) {
  h2_t *h = user_data;
  ce_conn_t *c = h->c;
  if (c->dead || !c->c.open || c->c.queued >= CE_CONN_HIGH_WATER)
    return NGHTTP2_ERR_WOULDBLOCK;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  /* The bytes it announced are gone (the stream was reset meanwhile). */
  if (s == NULL || ce_h2buf_front(&s->down) < length || frame->data.padlen != 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (length == 0) {
    ce_conn_side_write(&c->c, (const char *)framehd, CE_H2BUF_HEADROOM);
    return 0;
  }
  /* A whole record: what was gathered before it (a HEADERS frame, the
   * rest of a chunk) goes as a short record of its own rather than being
   * filled with this frame's bytes, a copy of up to 16 KiB per frame
   * that would shift every later frame off the records. */
  if (CE_H2BUF_HEADROOM + length == CE_CONN_RECORD && c->c.rec_len > 0) {
    ce_conn_side_seal(&c->c);
    if (c->dead)
      return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  const uint8_t *wire = ce_h2buf_frame(&s->down, framehd);
  ce_conn_side_write(&c->c, (const char *)wire, CE_H2BUF_HEADROOM + length);
  down_taken(h, s, length);
  return 0;
}

/* DATA frames to the workspace carry at most one chunk's bytes (a frame
 * goes out in one piece from its chunk, h2/streambuf.h): a whole chunk and
 * its header make one TLS record, sealed straight from the buffer
 * (srv_send_data). */
_Static_assert(CE_H2BUF_CHUNK == CE_CONN_RECORD, "a whole chunk's frame is one TLS record");
static ssize_t srv_data_length(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                               int32_t session_remote_window_size, int32_t stream_remote_window_size,
                               uint32_t remote_max_frame_size, void *user_data) {
  size_t most = CE_H2BUF_CHUNK - CE_H2BUF_HEADROOM;
  return (ssize_t)(most < remote_max_frame_size ? most : remote_max_frame_size);
}

/* ---- the exchange's ops (proxy/exchange.h) --------------------------------------- */

static void h2_forward(ce_exchange_t *x) { h2__stream_forward(x->owner); }

static void h2_respond(ce_exchange_t *x, int status, const char *text) { local_answer(x->owner, status, text); }

/* An answer for a stream of a connection that is ending: the stream is
 * never forwarded. */
static bool h2_answer_wanted(ce_exchange_t *x) {
  h2s_t *s = x->owner;
  if (s->h->c->dead)
    return false;
  if (s->h->failed || s->h->closing) {
    ce_exchange_finish(x, "connection_closed");
    return false;
  }
  return true;
}

static void h2_answered(ce_exchange_t *x) {
  h2s_t *s = x->owner;
  ask_next(s->h);
  ce_conn_process(s->h->c);
}

/* The first DATA bytes of the stream, not yet forwarded (s->up holds
 * them from its start until the stream is allowed), into the record. */
static bool h2_preview(ce_exchange_t *x, bool final) {
  h2s_t *s = x->owner;
  size_t cap = s->h->c->proxy->opts->body_preview;
  ce_reqinfo_t *r = &x->req;
  ce_reqinfo_reset_preview(r);
  const uint8_t *p;
  size_t n;
  for (size_t k = 0; (n = ce_h2buf_piece(&s->up, k, &p)) > 0 && r->body_preview_len < cap; k++)
    ce_reqinfo_add_preview(r, (const char *)p, n, cap);
  return final || s->up.eof || r->body_preview_len >= cap || r->body_preview_lost || s->up.len >= CE_H2_STREAM_BUF;
}

/* The question waits for DATA under the connection's timer (its expiry
 * asks every waiting stream: ce_h2conn_timeout). */
static void h2_previewing(ce_exchange_t *x) {
  h2s_t *s = x->owner;
  ce_conn_wake_in(s->h->c, CE_EXCHANGE_PREVIEW_WAIT_MS);
}

static const ce_exchange_ops_t h2_ops = {
    .forward = h2_forward,
    .respond = h2_respond,
    .preview = h2_preview,
    .previewing = h2_previewing,
    .answer_wanted = h2_answer_wanted,
    .answered = h2_answered,
};

/* An answer came or a stream asking went away: the waiting streams ask
 * (docs/http2.md §3), in turn, while there is room. A scan per question
 * over ≤ CE_H2_MAX_STREAMS streams; the list may change under a refusal,
 * hence from the head. */
static void ask_next(h2_t *h) {
  while (!h->c->dead && !h->failed && !h->closing && h->asks.out < h->asks.max) {
    h2s_t *s = h->streams;
    while (s != NULL && s->x.state != CE_EXCHANGE_WAITING)
      s = s->next;
    if (s == NULL || !ce_exchange_resume(&s->x))
      return;
  }
}

void h2__stream_request(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  ce_exchange_conn_t info;
  ce_conn_exchange_conn(c, &info);
  ce_exchange_open(&s->x, &info, s->cid);

  size_t ml = 0, pl = 0, al = 0;
  const char *method = h2__hset_get(&s->rq, ":method", &ml);
  const char *path = h2__hset_get(&s->rq, ":path", &pl);
  const char *auth = h2__hset_get(&s->rq, ":authority", &al);
  size_t hl = 0;
  const char *host = h2__hset_get(&s->rq, "host", &hl);

  /* The connection's scratch head: ce_reqinfo_set_request copies what it
   * keeps, so it is free again when this returns. */
  ce_h1_head_t *hd = h->head;
  h2__hset_head(&s->rq, hd);
  hd->method = method != NULL ? method : "GET";
  hd->method_len = method != NULL ? ml : 3;
  hd->path = path;
  hd->path_len = pl;
  if (ce_reqinfo_set_request(&s->x.req, hd, c->proxy->opts) != CE_OK) {
    snprintf(s->fail, sizeof(s->fail), "out_of_memory");
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_INTERNAL_ERROR);
    return;
  }
  s->x.req.http_version = "HTTP/2";
  s->x.req.bytes_out = h2__hset_bytes(&s->rq);

  if (s->rq.overflow) {
    ce_exchange_reject(&s->x, 431, "request_header_too_large",
                       "the request header list is too large");
    return;
  }
  if (s->rq_refused) {
    /* The connection's request heads would exceed CE_H2_HEAD_BUDGET
     * (docs/http2.md §5): refused before evaluation, nothing processed,
     * so REFUSED_STREAM (RFC 9113 §8.7) and the workspace may retry, as
     * past MAX_CONCURRENT_STREAMS. Counted as a proxy-sent reset. */
    char reason[160];
    snprintf(reason, sizeof(reason),
             "request_header_budget: the request heads held on this connection would exceed %u bytes",
             CE_H2_HEAD_BUDGET);
    ce_exchange_reject(&s->x, 0, reason, NULL);
    h2__rq_drop(h, s);
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_REFUSED_STREAM);
    return;
  }
  /* RFC 9113 §8.3.1: :authority names the target; a Host that differs
   * would let the upstream see another name than the policy did. */
  if (auth == NULL) {
    auth = host;
    al = hl;
  } else if (host != NULL && (hl != al || strncasecmp(host, auth, al) != 0)) {
    ce_exchange_reject(&s->x, 400, "bad_request: host differs from :authority",
                       "malformed request: host differs from :authority");
    return;
  }
  if (method != NULL && ml == 7 && memcmp(method, "CONNECT", 7) == 0) {
    ce_exchange_reject(&s->x, 400, "bad_request: connect_not_supported",
                       "CONNECT is not supported: this connection already goes where it was dialled");
    return;
  }
  /* RFC 9113 §8.3.1: the target is origin-form, or "*" for OPTIONS.
   * nghttp2 checks the leading "/" only for the schemes http and https:
   * an absolute-form :path (or an authority) under another :scheme
   * would name the upstream a host the policy never saw (an HTTP/1.1
   * upstream routes by the request line). Refused before evaluation. */
  size_t scl = 0;
  const char *scheme = h2__hset_get(&s->rq, ":scheme", &scl);
  bool star = method != NULL && ml == 7 && memcmp(method, "OPTIONS", 7) == 0 && path != NULL && pl == 1 &&
              path[0] == '*';
  if (scheme == NULL || scl != 5 || memcmp(scheme, "https", 5) != 0 || path == NULL || pl == 0 ||
      (path[0] != '/' && !star)) {
    ce_exchange_reject(&s->x, 400, "bad_request: target_not_origin_form",
                       "malformed request: :scheme must be https and :path an origin-form target");
    return;
  }
  /* As on HTTP/1.1: a method the records can keep whole. */
  if (method != NULL && ml > CE_H1_MAX_METHOD_BYTES) {
    ce_exchange_reject(&s->x, 400, "bad_request: method too long",
                       "malformed request: :method is too long");
    return;
  }
  /* The target is URI text (RFC 3986 §2): visible ASCII only, as the
   * HTTP/1.1 parser demands of a request line. nghttp2 lets other bytes
   * through; the policy matcher and the upstream might read them
   * differently. */
  for (size_t k = 0; k < pl; k++) {
    unsigned char b = (unsigned char)path[k];
    if (b <= 0x20 || b >= 0x7f) {
      ce_exchange_reject(&s->x, 400, "bad_request: invalid byte in :path",
                         "malformed request: :path must be visible ASCII (percent-encode other bytes)");
      return;
    }
  }
  /* Present, valid, and the connection's own name and port (coalescing:
   * one connection, one name; DESIGN §4). */
  if (ce_exchange_admit(&s->x, auth, al, method, method != NULL ? ml : 0, path, pl, ":authority"))
    ce_exchange_decide(&s->x);
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
  if (s->rq_head_done) {
    h2__hset_add(&s->rqt, name, namelen, value, valuelen, SIZE_MAX);
    return 0;
  }
  rq_add(s->h, s, name, namelen, value, valuelen);
  /* nghttp2 has checked it (digits; DATA will be held to it). */
  if (namelen == 14 && memcmp(name, "content-length", 14) == 0)
    s->rq_length = h2__length((const char *)value, valuelen);
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
      h2__stream_request(s);
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
    if (s->uid > 0 && h2__stream_up(s) != NULL)
      nghttp2_session_resume_data(h2__stream_up(s), s->uid);
  }
  return 0;
}

static int srv_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                    void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s != NULL)
    s->rq_seen += len;
  if (s == NULL || s->local || s->h1_abandon || (s->uid == 0 && s->rq_head_done && ce_exchange_is_open(&s->x) && s->x.ended)) {
    nghttp2_session_consume(session, stream_id, len);
    if (s != NULL)
      h2__stream_end_early(s);
    return 0;
  }
  if (ce_h2buf_put(&s->up, data, len, CE_H2_STREAM_BUF) != CE_OK) {
    /* More than the window we gave, or out of memory. */
    nghttp2_session_consume(session, stream_id, len);
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_FLOW_CONTROL_ERROR);
    return 0;
  }
  if (s->uid > 0 && h2__stream_up(s) != NULL)
    nghttp2_session_resume_data(h2__stream_up(s), s->uid);
  return 0;
}

/* RFC 9113 §8.1: the response is complete and the rest of the request can
 * go nowhere (answered locally, the upstream's stream closed, or the
 * HTTP/1.1 response ended first): RST_STREAM(NO_ERROR) tells a workspace
 * still sending to stop, and the stream ends. Not while what its
 * content-length says is left fits one stream window: such a body is let
 * come (its bytes dropped, its window given back) and ends the stream
 * itself. A reset there gains nothing, and some clients report it instead
 * of the response they got (curl 7.88, Debian 12's, when the answer
 * came before it sent its body: a refusal from the cache does). Called
 * when the response ends and for each dropped DATA frame after it. */
void h2__stream_end_early(h2s_t *s) {
  h2_t *h = s->h;
  if (!s->resp_end_sent || s->end_early_sent || h->failed ||
      nghttp2_session_get_stream_remote_close(h->srv, s->cid) != 0)
    return;
  if (!s->local && !s->h1_abandon && !(s->route == H2S_ROUTE_H2 && s->uid == 0))
    return;
  if (s->rq_length >= 0 && (uint64_t)s->rq_length >= s->rq_seen &&
      (uint64_t)s->rq_length - s->rq_seen <= CE_H2_STREAM_BUF)
    return;
  s->end_early_sent = true;
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
    ce_h2g_verdict_t v = ce_h2_guard_note_reset(&h->guard, h2__now_ms());
    if (v != CE_H2G_OK)
      conn_fail(h, NGHTTP2_ENHANCE_YOUR_CALM, ce_h2_guard_reason(v));
  }
  /* What the client will acknowledge with WINDOW_UPDATE frames (§5). */
  if (frame->hd.type == NGHTTP2_DATA)
    ce_h2_guard_note_sent(&h->guard, frame->hd.length, h2__now_ms());
  if (s != NULL && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    s->resp_end_sent = true;
    h2__stream_end_early(s);
  }
  return 0;
}

/* A stream that closed before its request head was taken (nghttp2 refused
 * it as malformed, a stream error): request_opened and request_denied on
 * the connection's name, as a malformed HTTP/1.1 request. */
static void stream_malformed(h2s_t *s, uint32_t code) {
  ce_conn_t *c = s->h->c;
  if (ce_exchange_is_open(&s->x))
    return;
  ce_exchange_conn_t info;
  ce_conn_exchange_conn(c, &info);
  ce_exchange_open(&s->x, &info, s->cid);
  s->x.req.http_version = "HTTP/2";
  char reason[120];
  snprintf(reason, sizeof(reason), "bad_request: malformed stream (RST_STREAM %s)", nghttp2_http2_strerror(code));
  ce_exchange_reject(&s->x, 0, reason, NULL);
}

static int srv_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return 0;
  nghttp2_session_set_stream_user_data(session, stream_id, NULL);
  if (!ce_exchange_is_open(&s->x))
    stream_malformed(s, error_code);
  if (s->fail[0] != '\0') {
    ce_exchange_finish(&s->x, s->fail);
  } else if (error_code == NGHTTP2_NO_ERROR && s->resp_end_sent) {
    ce_exchange_finish(&s->x, NULL);
  } else {
    char reason[80];
    snprintf(reason, sizeof(reason), "client_reset: RST_STREAM %s", nghttp2_http2_strerror(error_code));
    ce_exchange_finish(&s->x, reason);
  }
  if (s->uid > 0 && h2__stream_up(s) != NULL) {
    nghttp2_session_set_stream_user_data(h2__stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(h2__stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
  }
  h2__h1_unqueue(h, s);
  if (s->slot != NULL && s->slot->cur == s) {
    /* A half-done HTTP/1.1 exchange cannot be reused. */
    h2__slot_drop(s->slot);
  }
  bool asked = s->x.ask_id != 0;
  stream_free(h, s);
  if (asked)
    ask_next(h);
  return 0;
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
      .send_data = srv_send_data,
      .data_length = srv_data_length,
  };
  if (ce_h2_session_new(&params, &cbs, h, &h->srv) != CE_OK)
    return CE_ENOMEM;
  /* The pre-connected upstream spoke h2: its session on slot 0 (c->u). */
  if (h->h2up && h2__up_session_new(h, &h->slots[0].sess) != CE_OK)
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
    ce_connector_init(&sl->k, &h2__own_ops, sl, c->proxy, c->id, &sl->own);
  }
  /* Without an h2 upstream (it speaks HTTP/1.1, or is not connected yet)
   * streams are translated (docs/http2.md §6). */
  h->h2up = c->up_h2;
  h->asks.max = CE_H2_MAX_ASKS;
  if (new_sessions(h) != CE_OK)
    return CE_ENOMEM;
  CE_TRACE_D("proxy", 'c', c->id, "h2 with the workspace and the upstream");
  return CE_OK;
}

void ce_h2conn_held(const struct ce_h2conn *h, size_t *queued, size_t *streams, size_t *upstreams, size_t *tls) {
  size_t q = 0, up = 0, open = 0, room = 0;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (!h->slots[i].conn_slot) {
      q += h->slots[i].own.queued;
      open += h->slots[i].own.open;
      room += ce_tlsconn_held(h->slots[i].own.tls);
    }
  for (const h2s_t *s = h->streams; s != NULL; s = s->next)
    up += s->up.cap;
  *queued = q;
  *streams = h->down_held + h->rq_held + up;
  *upstreams = open;
  *tls = room;
}

void ce_h2conn_free(struct ce_h2conn *h) {
  if (h == NULL)
    return;
  /* Deleting the sessions runs no stream callbacks: a stream still
   * without its closing event gets one, then the records go. */
  for (h2s_t *s = h->streams; s != NULL; s = s->next)
    ce_exchange_finish(&s->x, "connection_closed");
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
    ce_connector_reset(&sl->k);
  }
  nghttp2_session_del(h->srv);
  free(h->head);
  free(h);
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
      ce_exchange_finish(&s->x, reason);
    /* A workspace that never reads its GOAWAY (docs/http2.md §5) does not
     * hold the connection: it ends by a fixed deadline. */
    ce_conn_hard_deadline(c);
  }
  nghttp2_session_terminate_session(h->srv, code);
}

/* The frames every h2 upstream session has to send. */
static void up_send(h2_t *h) {
  ce_conn_t *c = h->c;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    while (!c->dead && sl->sess != NULL && sl->s->open && sl->s->queued < CE_CONN_HIGH_WATER) {
      const uint8_t *data;
      ssize_t n = nghttp2_session_mem_send(sl->sess, &data);
      if (n < 0) {
        char reason[120];
        snprintf(reason, sizeof(reason), "upstream_bad_response: %s", nghttp2_strerror((int)n));
        h2__up_failed(sl, reason);
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
      h2__up_gone(sl, "upstream_reset: the upstream ended the connection (GOAWAY)");
  }
}

/* The frames of the workspace's session, while its socket takes them. */
static void srv_send(h2_t *h) {
  ce_conn_t *c = h->c;
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

void h2__flush(h2_t *h) {
  ce_conn_t *c = h->c;
  up_send(h);
  srv_send(h);
  /* The DATA just written to the workspace gave the upstreams their
   * windows back (down_taken): the WINDOW_UPDATEs go in this turn, not
   * with the next event. A connection that closed meanwhile may have
   * reset streams towards the workspace: those frames go too. */
  up_send(h);
  if (!c->dead && nghttp2_session_want_write(h->srv))
    srv_send(h);
}

/* The workspace had the whole exchange of s and closed with a FIN: its
 * request ended, the response's head and as many body bytes as its
 * content-length said went out, and the workspace acknowledged every byte
 * written to it (nothing in the socket's send queue). A reset, a response
 * without a length (or of an HTTP/1.1 upstream, which ends its streams
 * itself) never counts; a HEAD's or a 304's only with a length of 0. */
static bool stream_served(const ce_conn_t *c, const h2s_t *s) {
  if (!s->rs_head_done || s->local || s->fail[0] != '\0' || s->rs_length < 0 ||
      s->down_sent != (uint64_t)s->rs_length || s->down.len != 0 || c->c.queued != 0 || c->c.peer_reset ||
      nghttp2_session_get_stream_remote_close(s->h->srv, s->cid) != 1)
    return false;
  uv_os_fd_t fd;
  int unacked = -1;
  return uv_fileno((const uv_handle_t *)&c->c.tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &unacked) == 0 && unacked == 0;
}

void ce_h2conn_process(ce_conn_t *c) {
  h2_t *h = c->h2;
  if (h == NULL || c->dead)
    return;
  /* The workspace's frames: through the guard, then nghttp2. */
  if (c->c.in_len > 0 && !h->failed) {
    ce_h2g_verdict_t v = ce_h2_guard_feed(&h->guard, (const uint8_t *)c->c.in, c->c.in_len, h2__now_ms());
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
  /* DATA (or the end) for questions that wait for their body preview. */
  previews(h, false);
  if (c->dead)
    return;
  /* The h2 upstream connections' frames, then the HTTP/1.1 ones and the
   * streams waiting for a connection (docs/http2.md §6). */
  h2__up_links(h);
  if (c->dead)
    return;
  h2__up_take_queue(h);
  h->down_stalled = false;
  h2__h1_pump(h);
  size_t held = h->down_held;
  h2__flush(h);
  /* Bytes the workspace took make room in the budget: the stalled
   * upstreams go on at once (the write's completion would do it too). */
  if (!c->dead && h->down_stalled && h->down_held < held) {
    h->down_stalled = false;
    h2__h1_pump(h);
    h2__flush(h);
  }
  /* A stream refused while frames were sent waits for a connection. */
  if (!c->dead && h->h2up && h->qhead != NULL) {
    h2__up_take_queue(h);
    h2__h1_pump(h);
    h2__flush(h);
  }
  if (c->dead)
    return;
  if (c->c.eof) {
    /* The workspace is gone: its streams with it. One that had its whole
     * response was served (the client closed before the upstream's end of
     * the stream came, which it did not need). */
    for (h2s_t *s = h->streams; s != NULL; s = s->next)
      ce_exchange_finish(&s->x, stream_served(c, s) ? NULL : "client_reset: connection closed");
    ce_conn_abort(c);
    return;
  }
  if (!nghttp2_session_want_read(h->srv) && !nghttp2_session_want_write(h->srv)) {
    h->closing = true;
    ce_conn_close_after_flush(c);
  }
}

/* Streams whose question waits for its body preview: asked now when the
 * bytes came or the wait is over (final). True when there was one. */
static bool previews(h2_t *h, bool final) {
  bool any = false;
  if (h->c->proxy->opts->body_preview == 0)
    return false;
  for (h2s_t *s = h->streams, *next; s != NULL; s = next) {
    next = s->next;
    if (s->x.state == CE_EXCHANGE_PREVIEWING) {
      any = true;
      ce_exchange_body(&s->x, final);
    }
  }
  return any;
}

void ce_h2conn_timeout(ce_conn_t *c) {
  h2_t *h = c->h2;
  /* The timer was the preview wait's: the waiting streams are asked. */
  if (h != NULL && !h->failed && !c->hard_deadline && previews(h, true)) {
    ce_conn_touch(c);
    ce_conn_process(c);
    return;
  }
  if (h != NULL) {
    for (h2s_t *s = h->streams; s != NULL; s = s->next)
      ce_exchange_finish(&s->x, s->rs_head_done ? "upstream_timeout: response body stalled"
                                             : "upstream_timeout: no response");
    if (h->streams == NULL) {
      /* Idle: a GOAWAY and no event (docs/http2.md §5). */
      nghttp2_session_terminate_session(h->srv, NGHTTP2_NO_ERROR);
      h2__flush(h);
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
    h2__flush(h);
    h->closing = true;
    ce_conn_close_after_flush(c);
    return;
  }
  h2__flush(h);
}

void ce_h2conn_abort(ce_conn_t *c, const char *reason) {
  h2_t *h = c->h2;
  if (h == NULL)
    return;
  for (h2s_t *s = h->streams; s != NULL; s = s->next)
    ce_exchange_finish(&s->x, reason);
}
