/* HTTP/1.1 upstream connections for the workspace's h2 streams (h2_internal.h). */
#include "proxy/http2/h2_internal.h"

static void in_consume(side_t *u, size_t n);
static void h1_broke(h2s_t *s, const char *reason);
static bool h1_start(h2s_t *s);
static void h1_send_body(h2s_t *s);
static void h1_take_trailers(h2s_t *s);
static size_t down_allowance(h2_t *h, const h2s_t *s);
static bool h1_read_response(h2s_t *s);
static h1slot_t *slot_of_handle(uv_handle_t *hd);
static bool slot_open(const h1slot_t *sl);
static bool slot_connecting(const h1slot_t *sl);
static bool slot_ready(const h1slot_t *sl);
static void own_handle_closed(uv_handle_t *hd);
static void own_close_handle(h1slot_t *sl);
static void slot_failed(h1slot_t *sl, int status, const char *reason);
static void own_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf);
static void own_close(ce_connector_t *k);
static void own_flush(ce_connector_t *k);
static void own_reading(ce_connector_t *k);
static void own_done(ce_connector_t *k, int status, const char *reason);
static void own_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void slot_timeout(uv_timer_t *t);
static void own_timer_closed(uv_handle_t *hd);
static void own_connect(h1slot_t *sl);
static void slot_connect(h1slot_t *sl);
static bool slot_serve(h1slot_t *sl);
static bool queue_blocked(h2_t *h);
static void queue_timeout(uv_timer_t *t);
static void queue_wait(h2_t *h);

/* ---- a request head: evaluate and forward ----------------------------------------- */

/* ---- HTTP/1.1 upstream: the queue ------------------------------------------------- */

/* The streams that may wait: over HTTP/1.1, CE_H2_H1_QUEUE; for an h2
 * upstream, every stream the workspace may have open (the queue holds
 * streams that exist anyway: no memory of its own), so that the streams a
 * GOAWAY refused all find room (docs/http2.md §6). */
bool h2__h1_queue_full(const h2_t *h) {
  return h->qlen >= (h->h2up ? CE_H2_MAX_STREAMS : CE_H2_H1_QUEUE);
}

void h2__h1_enqueue(h2s_t *s) {
  h2_t *h = s->h;
  if (h2__h1_queue_full(h)) {
    h2__fail_with(s, 503, "upstream_busy: too many streams wait for the upstream connection");
    return;
  }
  s->route = H2S_ROUTE_QUEUED;
  s->qnext = NULL;
  if (h->qtail != NULL)
    h->qtail->qnext = s;
  else
    h->qhead = s;
  h->qtail = s;
  h->qlen++;
}

void h2__h1_unqueue(h2_t *h, h2s_t *s) {
  if (s->route != H2S_ROUTE_QUEUED)
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
  s->route = H2S_ROUTE_NONE;
  s->qnext = NULL;
}

h2s_t *h2__h1_pop(h2_t *h) {
  h2s_t *s = h->qhead;
  if (s != NULL)
    h2__h1_unqueue(h, s);
  return s;
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
    h2__slot_drop(s->slot);
  if (!s->h1_resp_head) {
    h2__fail_502(s, reason);
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
  bool has_len = h2__hset_get(&s->rq, "content-length", &cl) != NULL;
  bool body = !(s->up.eof && s->up.len == 0);
  s->h1_chunked = body && !has_len;
  ce_h2h_field_t f[CE_H2_MAX_FIELDS];
  long n = h2__rq_fields(s, f, CE_H2_MAX_FIELDS);
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  int rc = n < 0 ? (int)n : ce_h2h_write_request(&w, f, (size_t)n, s->h1_chunked);
  if (rc != CE_OK) {
    h2__fail_with(s, 400, "bad_request: the request cannot be expressed in HTTP/1.1");
    return false;
  }
  ce_conn_side_write(s->slot->s, c->proxy->head_buf, w.len);
  /* The head is written (s->req keeps what the events show): only the
   * method matters from here on, for the response's framing. */
  size_t ml = 0;
  const char *method = h2__hset_get(&s->rq, ":method", &ml);
  s->h1_head_req = method != NULL && ml == 4 && memcmp(method, "HEAD", 4) == 0;
  h2__rq_drop(h, s);
  return !c->dead;
}

static void h1_send_body(h2s_t *s) {
  h2_t *h = s->h;
  ce_conn_t *c = h->c;
  side_t *u = s->slot->s;
  if (s->h1_req_done || s->h1_abandon)
    return;
  while (s->up.len > 0 && u->open && u->queued < CE_CONN_HIGH_WATER && !c->dead) {
    size_t n = ce_h2buf_front(&s->up);
    n = n < 16384u ? n : 16384u;
    if (s->h1_chunked) {
      char hdr[24];
      int hl = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
      ce_conn_side_write(u, hdr, (size_t)hl);
    }
    ce_conn_side_write(u, (const char *)ce_h2buf_bytes(&s->up), n);
    if (s->h1_chunked)
      ce_conn_side_write(u, "\r\n", 2);
    s->x.req.bytes_out += n;
    ce_reqinfo_add_preview(&s->x.req, (const char *)ce_h2buf_bytes(&s->up), n, c->proxy->opts->body_preview);
    ce_h2buf_drop(&s->up, n);
    /* The bytes left the proxy: the workspace may send as many again. */
    nghttp2_session_consume(h->srv, s->cid, n);
  }
  ce_h2buf_trim(&s->up);
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
  h2__hset_reset(&s->rs);
  for (long i = 0; i < n; i++)
    h2__hset_add(&s->rs, (const uint8_t *)f[i].name, f[i].name_len, (const uint8_t *)f[i].value, f[i].value_len,
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
    ce_reqinfo_set_response(&s->x.req, hd, c->proxy->opts);
    s->x.req.bytes_in += hbytes;
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
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = h2__down_read};
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
      if (!ce_transport_clean_end(u)) {
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
      if (!h2__down_put(h, s, (const uint8_t *)data, dl)) {
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
    h2__slot_reset(sl);
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
  return sl->conn_slot ? sl->h->c->up_for == CE_UP_FOR_H2_STREAMS : sl->connecting;
}

/* Connected, verified, idle and clean: it may take a stream (over
 * HTTP/1.1; an h2 connection takes its streams in up_take_queue). */
static bool slot_ready(const h1slot_t *sl) {
  const side_t *u = sl->s;
  return sl->cur == NULL && sl->sess == NULL && !slot_connecting(sl) && ce_transport_ready(u) &&
         !u->eof && u->in_len == 0;
}

static void own_handle_closed(uv_handle_t *hd) {
  h1slot_t *sl = slot_of_handle(hd);
  ce_conn_t *c = sl->h->c;
  sl->own.closing = false;
  ce_connector_closed(&sl->k);
  if (!c->dead)
    ce_conn_process(c); /* the slot may be used (or opened) again */
  ce_conn_release(c);   /* last: it may free the connection */
}

static void own_close_handle(h1slot_t *sl) { ce_conn_side_close(&sl->own, own_handle_closed); }

/* The slot's connection goes (a stream it served cannot be finished). */
void h2__slot_reset(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  sl->cur = NULL;
  if (sl->conn_slot) {
    ce_conn_upstream_reset(c);
    return;
  }
  sl->connecting = false;
  ce_connector_reset(&sl->k);
  if (sl->timer_init && !sl->timer_closing)
    uv_timer_stop(&sl->timer);
  own_close_handle(sl);
  ce_transport_reset(&sl->own);
}

/* The stream the slot served is gone half-way: the connection goes too. */
void h2__slot_drop(h1slot_t *sl) {
  if (sl->cur != NULL)
    sl->cur->slot = NULL;
  h2__slot_reset(sl);
}

/* Fails the queued streams with the reason a connection could not be had. */
void h2__fail_queue(h2_t *h, int status, const char *reason) {
  char why[300];
  snprintf(why, sizeof(why), "%s", reason != NULL ? reason : "upstream_unreachable");
  h2s_t *s;
  while ((s = h2__h1_pop(h)) != NULL) {
    if (status == 403) {
      ce_exchange_refuse_private(&s->x, why);
    } else {
      h2__fail_with(s, status, why);
    }
  }
}

/* A slot's connection could not be had: when no other connection is up or
 * coming, the waiting streams fail with its reason (docs/http2.md §6). */
static void slot_failed(h1slot_t *sl, int status, const char *reason) {
  h2_t *h = sl->h;
  if (!sl->conn_slot)
    h2__slot_reset(sl);
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
  h2__fail_queue(h, status, reason);
}

static void own_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  h1slot_t *sl = slot_of_handle(hd);
  /* The proxy's one read buffer: own_read gives the bytes to the transport at once. */
  *buf = uv_buf_init(sl->h->c->proxy->read_buf, (unsigned)ce_transport_read_room(&sl->own, CE_CONN_READ_CHUNK));
}

/* The connector's ops for an own slot (proxy/connector.h); its lookup and
 * handle are counted as every handle of the connection (conn.c). */
static void own_close(ce_connector_t *k) { own_close_handle(k->owner); }
static void own_flush(ce_connector_t *k) { ce_conn_side_write(&((h1slot_t *)k->owner)->own, NULL, 0); }

static void own_reading(ce_connector_t *k) {
  h1slot_t *sl = k->owner;
  ce_conn_t *c = sl->h->c;
  sl->own.reading = true;
  uv_read_start((uv_stream_t *)&sl->own.tcp, own_alloc, own_read);
  uv_timer_start(&sl->timer, slot_timeout, c->proxy->opts->handshake_ms, 0);
}

/* The slot's connection is ready (TLS done) or could not be had. */
static void own_done(ce_connector_t *k, int status, const char *reason) {
  h1slot_t *sl = k->owner;
  ce_conn_t *c = sl->h->c;
  if (!sl->connecting)
    return;
  if (status != 0) {
    slot_failed(sl, status, reason);
    ce_conn_process(c);
    return;
  }
  sl->connecting = false;
  uv_timer_stop(&sl->timer);
  if (sl->want_h2) {
    /* A connection opened after a GOAWAY (docs/http2.md §6): h2 again, or
     * HTTP/1.1 from now on if that is what the upstream picked. */
    sl->want_h2 = false;
    if (ce_transport_speaks_h2(&sl->own)) {
      if (h2__up_session_new(sl->h, &sl->sess) != CE_OK) {
        slot_failed(sl, 502, "out_of_memory");
        ce_conn_process(c);
        return;
      }
      CE_TRACE_D("proxy", 'c', c->id, "h2: upstream connection %d ready (h2)", (int)(sl - sl->h->slots));
      ce_conn_process(c);
      return;
    }
    sl->h->h2up = false;
  }
  CE_TRACE_D("proxy", 'c', c->id, "h2: upstream connection %d ready", (int)(sl - sl->h->slots));
  ce_conn_process(c);
}

const ce_connector_ops_t h2__own_ops = {
    .hold = ce_conn_connector_hold,
    .release = ce_conn_connector_release,
    .alive = ce_conn_connector_alive,
    .close = own_close,
    .flush = own_flush,
    .reading = own_reading,
    .done = own_done,
};

static void own_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  h1slot_t *sl = slot_of_handle((uv_handle_t *)st);
  ce_conn_t *c = sl->h->c;
  if (c->dead || nread == 0)
    return;
  if (nread < 0) {
    sl->own.eof = true;
    uv_read_stop(st);
    sl->own.reading = false;
    ce_connector_fail(&sl->k, 502, "upstream_tls: the server closed during the handshake");
    ce_conn_process(c);
    return;
  }
  ce_conn_touch(c);
  if (ce_transport_received(&sl->own, buf->base, (size_t)nread) != CE_OK)
    slot_failed(sl, 502, "out_of_memory");
  else if (!sl->own.handshaken)
    ce_connector_handshake(&sl->k);
  ce_conn_process(c);
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

/* An own slot's timer, once (it closes with the connection:
 * ce_h2conn_close_handles). */
static void slot_timer_init(h1slot_t *sl) {
  if (sl->timer_init)
    return;
  ce_conn_t *c = sl->h->c;
  uv_timer_init(c->proxy->loop, &sl->timer);
  sl->timer.data = sl;
  sl->timer_init = true;
  c->handles++;
}

/* Starts connecting an own slot (docs/http2.md §6). */
static void own_connect(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  if (sl->own.closing)
    return; /* the last attempt's handle is still going away */
  slot_timer_init(sl);
  sl->connecting = true;
  uv_timer_start(&sl->timer, slot_timeout, c->proxy->opts->connect_ms, 0);
  int rc = ce_connector_start(&sl->k, c->sni.text, c->port, true, sl->want_h2 ? CE_ALPN_H2_HTTP11 : CE_ALPN_HTTP11);
  if (rc != CE_OK) {
    char reason[200];
    snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
             rc == CE_EAGAIN ? "the resolver is busy" : ce_strerror(rc));
    slot_failed(sl, 502, reason);
    return;
  }
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

/* No new h2 upstream connection (a fresh connection window) while the
 * responses of closed ones wait unread past CE_H2_ORPHAN_BUDGET. A
 * connection already being opened (before they passed it) serves the
 * queue once it is up: that is no hold. */
static bool orphans_hold(h2_t *h) {
  if (!h->h2up || h2__up_current(h) != NULL || h2__orphaned(h) <= CE_H2_ORPHAN_BUDGET)
    return false;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    if (slot_connecting(&h->slots[i]))
      return false;
  return true;
}

/* Streams wait for an h2 connection while none can be opened: every slot
 * holds a connection draining after its GOAWAY (kept by long streams),
 * and none is coming; or the unread responses of closed connections hold
 * new ones back. */
static bool queue_blocked(h2_t *h) {
  if (!h->h2up || h->qhead == NULL)
    return false;
  if (orphans_hold(h))
    return true;
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
  /* Blocked again after a pause (a connection was being opened): the
   * deadline counts from now. */
  if (h->blocked_at == 0)
    h->blocked_at = h2__now_ms();
  uint64_t limit = c->proxy->opts->connect_ms, waited = h2__now_ms() - h->blocked_at;
  if (waited < limit) {
    uv_timer_start(t, queue_timeout, limit - waited, 0);
    return;
  }
  h->blocked_at = 0;
  if (orphans_hold(h)) {
    CE_TRACE_D("proxy", 'c', c->id, "h2: unread responses of closed upstream connections; the waiting streams fail");
    char why[240];
    snprintf(why, sizeof(why),
             "upstream_busy: responses of closed upstream connections wait unread (more than %zu bytes); no new "
             "upstream connection is opened until they are read, and none was within the connect timeout",
             (size_t)CE_H2_ORPHAN_BUDGET);
    h2__fail_queue(h, 503, why);
  } else {
    CE_TRACE_D("proxy", 'c', c->id, "h2: every upstream connection drains; the waiting streams fail");
    h2__fail_queue(h, 503,
                   "upstream_busy: every upstream connection is draining after a GOAWAY; no new one could be opened "
                   "within the connect timeout");
  }
  ce_conn_process(c);
}

/* The queue is blocked: its deadline runs on an own slot's timer (idle
 * while its connection is up; a slot that connects again restarts it for
 * its connect, and then the queue is no longer blocked). */
static void queue_wait(h2_t *h) {
  if (!queue_blocked(h))
    return;
  if (h->blocked_at == 0)
    h->blocked_at = h2__now_ms();
  for (size_t i = 1; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &h->slots[i];
    if (!sl->timer_init || sl->timer_closing || sl->connecting)
      continue;
    if (!uv_is_active((uv_handle_t *)&sl->timer))
      uv_timer_start(&sl->timer, queue_timeout, h->c->proxy->opts->connect_ms, 0);
    return;
  }
  /* No own slot was used yet (held back by unread responses, the
   * connections so far were all slot 0's): the first one's timer. */
  h1slot_t *sl = &h->slots[1];
  if (!sl->timer_init && !sl->own.closing) {
    slot_timer_init(sl);
    uv_timer_start(&sl->timer, queue_timeout, h->c->proxy->opts->connect_ms, 0);
  }
}

void h2__h1_pump(h2_t *h) {
  ce_conn_t *c = h->c;
  if (h->blocked_at != 0 && !queue_blocked(h))
    h->blocked_at = 0;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    if (sl->sess != NULL)
      continue; /* an h2 connection: h2__up_links */
    if (!sl->conn_slot && ce_transport_ready(&sl->own)) {
      /* Decrypted input while there is room; a full buffer that the
       * stream drains is filled again at once. */
      for (int round = 0; round < 64 && !c->dead; round++) {
        ce_conn_pump_input(&sl->own);
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
    if (sl->cur == NULL && !slot_connecting(sl) && ce_transport_ready(sl->s) &&
        (sl->s->eof || sl->s->in_len > 0))
      h2__slot_reset(sl);
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
      h2s_t *s = h2__h1_pop(h);
      ce_exchange_allowed(&s->x);
      ready->cur = s;
      s->slot = ready;
      s->route = H2S_ROUTE_H1;
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
    if (h->h2up && (coming > 0 || h2__up_current(h) != NULL))
      return;
    if (orphans_hold(h)) {
      if (h->blocked_at == 0)
        CE_TRACE_D("proxy", 'c', c->id, "h2: responses of closed upstream connections unread; new streams wait");
      queue_wait(h);
      return;
    }
    h1slot_t *idle = NULL;
    for (size_t i = 0; i < CE_H2_H1_POOL && idle == NULL; i++) {
      h1slot_t *sl = &h->slots[i];
      bool busy = sl->conn_slot ? c->u.closing : sl->own.closing;
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
  if (ce_transport_speaks_h2(&c->u)) {
    if (h2__up_session_new(h, &sl->sess) != CE_OK) {
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

/* ---- rest: --idle-release-ms (docs/proxy.md "Idle connections") -------------------- */

/* No stream of any kind (open, queued, asking, previewing, answered
 * locally: each is a record on h->streams), no connect under way, nothing
 * read and not consumed, no failure or drain running. What is pending
 * towards the workspace (a WINDOW_UPDATE, a PING's ACK) does not count: a
 * workspace that reads nothing must not keep its upstreams that way. */
static bool at_rest(const ce_conn_t *c) {
  const h2_t *h = c->h2;
  if (c->state != ST_H2 || h == NULL || c->dead || c->hard_deadline || h->failed || h->closing || h->draining)
    return false;
  if (h->streams != NULL || c->c.in_len > 0 || c->up_for == CE_UP_FOR_H2_STREAMS || ce_connector_busy(&c->uk))
    return false;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    const h1slot_t *sl = &h->slots[i];
    if (sl->cur != NULL || (!sl->conn_slot && (sl->connecting || ce_connector_busy(&sl->k))))
      return false;
  }
  return true;
}

bool ce_h2conn_releasable(const ce_conn_t *c) {
  if (!at_rest(c))
    return false;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    const h1slot_t *sl = &c->h2->slots[i];
    if (sl->sess != NULL || slot_open(sl))
      return true;
  }
  return c->h2->head != NULL || ce_tlsconn_releasable(c->c.tls) > 0;
}

/* The slot's connection ends on purpose: an h2 one with its GOAWAY
 * (NO_ERROR, RFC 9113 §9.1), a TLS one with its close_notify, both written
 * as far as the socket takes them now (best effort: the connection goes
 * anyway). */
static void slot_release(h1slot_t *sl) {
  ce_conn_t *c = sl->h->c;
  side_t *u = sl->s;
  if (sl->sess != NULL && u->open) {
    nghttp2_session_terminate_session(sl->sess, NGHTTP2_NO_ERROR);
    for (int round = 0; round < 8 && !c->dead && u->open; round++) {
      const uint8_t *data;
      ssize_t n = nghttp2_session_mem_send(sl->sess, &data);
      if (n <= 0)
        break;
      ce_conn_side_write(u, (const char *)data, (size_t)n);
    }
  }
  if (!c->dead && ce_transport_ready(u) && u->shut == SIDE_WRITING && !u->eof &&
      ce_transport_close_notify(u) == CE_OK)
    ce_conn_side_write(u, NULL, 0);
  if (c->dead)
    return;
  CE_TRACE_D("proxy", 'c', c->id, "h2: idle: upstream connection %d released", (int)(sl - sl->h->slots));
  if (sl->sess != NULL)
    h2__up_gone(sl, "idle: released"); /* no stream is on it: only the session and the connection go */
  else
    h2__slot_reset(sl);
}

bool ce_h2conn_release_idle(ce_conn_t *c) {
  if (!at_rest(c))
    return false;
  h2_t *h = c->h2;
  bool released = false;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    if (sl->sess == NULL && !slot_open(sl))
      continue;
    slot_release(sl);
    released = true;
  }
  /* A cooldown waits for a stream to end on another connection: none is
   * left, so the next stream may open any. */
  for (size_t i = 0; i < CE_H2_H1_POOL; i++)
    h->slots[i].cooldown = false;
  /* Its scratch head is a stream's: none runs (stream_new makes it again). */
  free(h->head);
  h->head = NULL;
  return released;
}
