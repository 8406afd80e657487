/* HTTP/2 with an h2 upstream: client sessions and their streams (h2_internal.h). */
#include "proxy/http2/h2_internal.h"

static ssize_t up_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                       uint32_t *data_flags, nghttp2_data_source *source, void *user_data);
static void stream_submit(h2s_t *s, h1slot_t *sl);
static int up_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data);
static void upstream_response(h2s_t *s, bool end);
static int up_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data);
static int up_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                   void *user_data);

/* ---- the workspace's data, to the upstream -------------------------------------- */

static ssize_t up_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                       uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  h2_t *h = s->h;
  size_t n = ce_h2buf_take(&s->up, buf, length);
  if (n > 0) {
    s->up_sent += n; /* gone: a refused stream cannot be sent again */
    s->x.req.bytes_out += n;
    ce_reqinfo_add_preview(&s->x.req, (const char *)buf, n, h->c->proxy->opts->body_preview);
    nghttp2_session_consume(h->srv, s->cid, n);
  }
  if (s->up.len == 0 && s->up.eof) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (s->rq_trailers) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = h2__hset_nva(&s->rqt, nva, CE_H2_MAX_FIELDS, true /* trailers */);
      if (nghttp2_submit_trailer(session, stream_id, nva, k) == 0)
        *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return (ssize_t)n;
  }
  if (n == 0)
    return NGHTTP2_ERR_DEFERRED;
  return (ssize_t)n;
}

/* A new stream on the h2 upstream connection sl. */
static void stream_submit(h2s_t *s, h1slot_t *sl) {
  /* Pseudo-headers first, as received (nghttp2 checked them), then the
   * rest: nghttp2 already refused connection-specific fields. */
  nghttp2_nv nva[CE_H2_MAX_FIELDS];
  ce_h1_field_t f[CE_H2_MAX_FIELDS];
  long n = h2__rq_fields(s, f, CE_H2_MAX_FIELDS);
  if (n < 0) {
    ce_exchange_allowed(&s->x);
    h2__fail_502(s, "bad_request: the request's credential cannot be added");
    return;
  }
  size_t k = (size_t)n;
  for (size_t i = 0; i < k; i++)
    nva[i] = (nghttp2_nv){(uint8_t *)(uintptr_t)f[i].name, (uint8_t *)(uintptr_t)f[i].value, f[i].name_len,
                          f[i].value_len, NGHTTP2_NV_FLAG_NONE};
  nghttp2_data_provider prd = {.source.ptr = s, .read_callback = up_read};
  bool body = !(s->up.eof && s->up.len == 0) || s->rq_trailers;
  int32_t uid = nghttp2_submit_request(sl->sess, NULL, nva, k, body ? &prd : NULL, s);
  ce_exchange_allowed(&s->x);
  if (uid < 0) {
    h2__fail_502(s, "upstream_unreachable: cannot open an upstream stream");
    return;
  }
  s->uid = uid;
  s->uslot = sl;
  s->route = H2S_ROUTE_H2;
  /* nghttp2 copied the fields; the head stays until the response head
   * comes, for a refused stream to be sent again (up_stream_close). */
}

/* An allowed stream goes upstream: a new h2 stream, or the queue (for an
 * HTTP/1.1 connection, or an h2 one being opened after a GOAWAY). */
void h2__stream_forward(h2s_t *s) {
  h2_t *h = s->h;
  if (h->draining) {
    ce_exchange_allowed(&s->x);
    h2__fail_502(s, "upstream_unreachable: the proxy is draining");
    return;
  }
  if (h->h2up && h->up_fail[0] != '\0') {
    ce_exchange_allowed(&s->x);
    h2__fail_502(s, h->up_fail);
    return;
  }
  h1slot_t *sl = h->h2up ? h2__up_current(h) : NULL;
  if (sl == NULL) {
    /* request_allowed when an upstream connection takes it (h1_pump,
     * up_take_queue): the private-address rule may still refuse it
     * (fail_queue). */
    h2__h1_enqueue(s);
    return;
  }
  stream_submit(s, sl);
}

/* ---- client session callbacks (the upstream) --------------------------------------- */

static int up_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
  h2s_t *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (s == NULL || frame->hd.type != NGHTTP2_HEADERS)
    return 0;
  h2__hset_add(&s->rs, name, namelen, value, valuelen, SIZE_MAX);
  return 0;
}

static void upstream_response(h2s_t *s, bool end) {
  h2_t *h = s->h;
  size_t sl = 0;
  const char *st = h2__hset_get(&s->rs, ":status", &sl);
  int status = 0;
  for (size_t i = 0; st != NULL && i < sl && i < 3; i++)
    status = status * 10 + (st[i] - '0');
  if (status >= 100 && status < 200) {
    /* Interim responses (100 Continue, 103 Early Hints) go to the
     * workspace as non-final HEADERS (docs/http2.md §3); nghttp2 refuses
     * a 101 on h2 before this is reached. */
    if (status != 101 && !s->rs.overflow) {
      nghttp2_nv nva[CE_H2_MAX_FIELDS];
      size_t k = h2__hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, false);
      nghttp2_submit_headers(h->srv, NGHTTP2_FLAG_NONE, s->cid, NULL, nva, k, NULL);
    }
    h2__hset_reset(&s->rs);
    return;
  }
  if (s->rs.overflow) {
    s->fail[0] = '\0';
    snprintf(s->fail, sizeof(s->fail), "upstream_bad_response: header list too large");
    nghttp2_session_set_stream_user_data(h2__stream_up(s), s->uid, NULL);
    nghttp2_submit_rst_stream(h2__stream_up(s), NGHTTP2_FLAG_NONE, s->uid, NGHTTP2_CANCEL);
    s->uid = 0;
    h2__fail_502(s, s->fail);
    return;
  }
  /* Its length, for a workspace that closes once it has it all (nghttp2
   * checked it: digits, and the DATA will be held to it). */
  size_t cl = 0;
  const char *len = h2__hset_get(&s->rs, "content-length", &cl);
  if (len != NULL)
    s->rs_length = h2__length(len, cl);
  /* The connection's scratch head (set_response copies what it keeps). */
  ce_h1_head_t *hd = h->head;
  h2__hset_head(&s->rs, hd);
  hd->is_response = true;
  hd->status = status;
  ce_reqinfo_set_response(&s->x.req, hd, h->c->proxy->opts);
  s->x.req.bytes_in += h2__hset_bytes(&s->rs);
  nghttp2_nv nva[CE_H2_MAX_FIELDS];
  size_t k = h2__hset_nva(&s->rs, nva, CE_H2_MAX_FIELDS, false);
  nghttp2_data_provider prd = {.source.ptr = s, .read_callback = h2__down_read};
  s->down.eof = end;
  int rc = nghttp2_submit_response(h->srv, s->cid, nva, k, end ? NULL : &prd);
  s->rs_head_done = true;
  h2__hset_reset(&s->rs);
  /* Answered: the stream will not be sent again (up_stream_close). */
  h2__rq_drop(h, s);
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
    h1slot_t *sl = h2__slot_of_session(h, session);
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
  if (!h2__down_put(h, s, data, len)) {
    nghttp2_session_consume(session, stream_id, len);
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_FLOW_CONTROL_ERROR);
    return 0;
  }
  nghttp2_session_resume_data(h->srv, s->cid);
  return 0;
}

int h2__up_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
  h2_t *h = user_data;
  h2s_t *s = nghttp2_session_get_stream_user_data(session, stream_id);
  if (s == NULL)
    return 0;
  nghttp2_session_set_stream_user_data(session, stream_id, NULL);
  s->uid = 0;
  if (error_code == NGHTTP2_NO_ERROR && s->down.eof) {
    h2__stream_end_early(s);
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
    h1slot_t *rsl = h2__slot_of_session(h, session);
    bool progress = rsl != NULL && rsl->goaway && stream_id > rsl->goaway_last && rsl->goaway_last > 0;
    /* A full queue (an HTTP/1.1 connection took over meanwhile): the
     * workspace is told REFUSED_STREAM below and may retry itself. */
    if ((!s->retried || progress) && s->up_sent == 0 && s->rq.n > 0 && !s->rq.overflow &&
        (rsl == NULL || !rsl->goaway_error) && h->up_fail[0] == '\0' && !h->draining && !h->failed &&
        !h->closing && !h2__h1_queue_full(h)) {
      s->retried = true;
      CE_TRACE_D("proxy", 'c', h->c->id, "h2: stream %d refused by the upstream; sending it again",
                 (int)s->cid);
      /* Until a connection takes it again: it may be served over
       * HTTP/1.1 if the new connection picks that (stream_submit sets
       * both again for an h2 one). */
      s->route = H2S_ROUTE_NONE;
      s->uslot = NULL;
      h2__h1_enqueue(s);
      return 0;
    }
    h2__rq_drop(h, s);
    if (s->up_sent > 0) {
      /* Part of its body went and is gone: never a partial request. */
      char why[200];
      snprintf(why, sizeof(why),
               "upstream_refused: the upstream refused the stream after %zu bytes of its request body were "
               "sent; they cannot be sent again",
               s->up_sent);
      h2__fail_502(s, why);
      return 0;
    }
    /* The workspace may retry itself. */
    snprintf(s->fail, sizeof(s->fail), "%s", reason);
    nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  h2__rq_drop(h, s);
  if (!s->rs_head_done && !s->local) {
    h2__fail_502(s, reason);
    return 0;
  }
  snprintf(s->fail, sizeof(s->fail), "%s", reason);
  uint32_t code = error_code == NGHTTP2_NO_ERROR ? NGHTTP2_INTERNAL_ERROR : error_code;
  nghttp2_submit_rst_stream(h->srv, NGHTTP2_FLAG_NONE, s->cid, code);
  return 0;
}

/* ---- sessions ------------------------------------------------------------------------ */

/* A client session towards an h2 upstream connection, its SETTINGS
 * submitted (h2/session.h). */
int h2__up_session_new(h2_t *h, nghttp2_session **out) {
  static const ce_h2_session_params_t params = {
      .role = CE_H2_SESSION_CLIENT,
      .stream_window = CE_H2_UP_STREAM_WINDOW,
      .conn_window = CE_H2_CONN_WINDOW,
      .max_header_list = CE_H2_MAX_HEADER_LIST,
  };
  static const ce_h2_session_callbacks_t cbs = {
      .header = up_header,
      .frame_recv = up_frame_recv,
      .data_chunk_recv = up_data,
      .stream_close = h2__up_stream_close,
  };
  return ce_h2_session_new(&params, &cbs, h, out);
}

/* An h2 upstream connection is over: streams it still carried fail, and
 * its connection closes. A GOAWAY'd one whose streams all ended goes this
 * way quietly. */
void h2__up_gone(h1slot_t *sl, const char *reason) {
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
      h2__fail_502(s, reason);
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
    h2__slot_reset(sl);
}

/* A session that failed: its connection goes, and (fail closed) no new
 * h2 connection replaces it: new streams get 502 with the reason. Only
 * the current connection's failure says so: a draining one's (after its
 * GOAWAY) ends only its own streams. */
void h2__up_failed(h1slot_t *sl, const char *reason) {
  h2_t *h = sl->h;
  if (!sl->goaway && h->up_fail[0] == '\0')
    snprintf(h->up_fail, sizeof(h->up_fail), "%s", reason);
  h2__up_gone(sl, reason);
}

/* The frames of every h2 upstream connection; one that closed goes. */
void h2__up_links(h2_t *h) {
  ce_conn_t *c = h->c;
  for (size_t i = 0; i < CE_H2_H1_POOL && !c->dead; i++) {
    h1slot_t *sl = &h->slots[i];
    side_t *u = sl->s;
    /* c->u's decrypted input comes from conn_process; an own connection's
     * is moved here, a buffer at a time. */
    for (int round = 0; round < 64 && sl->sess != NULL && !c->dead; round++) {
      if (!sl->conn_slot)
        ce_conn_pump_input(u);
      if (c->dead || u->in_len == 0)
        break;
      ssize_t n = nghttp2_session_mem_recv(sl->sess, (const uint8_t *)u->in, u->in_len);
      u->in_len = 0;
      if (n < 0) {
        char reason[120];
        snprintf(reason, sizeof(reason), "upstream_bad_response: %s", nghttp2_strerror((int)n));
        h2__up_failed(sl, reason);
      }
      if (sl->conn_slot)
        break;
    }
    if (sl->sess != NULL && !c->dead && (u->eof || !u->open))
      h2__up_gone(sl, "upstream_reset: connection closed");
  }
}

/* Streams waiting for an h2 connection (opened after a GOAWAY, or
 * refused and sent again) go on the one that takes streams. */
void h2__up_take_queue(h2_t *h) {
  h1slot_t *sl;
  while (!h->c->dead && h->h2up && h->qhead != NULL && (sl = h2__up_current(h)) != NULL)
    stream_submit(h2__h1_pop(h), sl);
  /* The h2 upstream failed for good: no connection comes for them. */
  if (!h->c->dead && h->h2up && h->up_fail[0] != '\0' && h->qhead != NULL)
    h2__fail_queue(h, 502, h->up_fail);
}
