/*
 * An HTTP/1.1 workspace over an h2 upstream (docs/http2.md §6, "Workspace
 * HTTP/1.1 ↔ upstream h2"): the HTTP/1.1 path offers the upstream
 * "h2, http/1.1"; when it picks h2, every exchange of the workspace's
 * connection is one stream on an nghttp2 client session over c->u.
 *
 * The request head is the one conn.c built for an HTTP/1.1 upstream
 * (c->up_head, re-parsed), turned into h2 fields by h2/headers.c; the body
 * is decoded from the workspace's framing into one stream window's buffer
 * and sent as DATA. The response comes back as an HTTP/1.1 head framed for
 * the workspace's version (content-length kept, else chunked for HTTP/1.1
 * or until the close for HTTP/1.0), its DATA written as it arrives, and its
 * trailers as chunked trailers when the body goes chunked. A chunked
 * request body's trailers go as a trailing HEADERS frame.
 *
 * Flow control: the session runs without automatic WINDOW_UPDATEs; the
 * upstream's DATA is acknowledged (nghttp2_session_consume) only while
 * the workspace's socket is under CE_CONN_HIGH_WATER, so a slow reader
 * stops the upstream within one window. The request body is read from the
 * workspace only while the stream's buffer has room.
 *
 * Runs inside conn_process(); the nghttp2 callbacks below only record and
 * write to the workspace: endings are acted on after nghttp2 returns.
 */
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/trace.h"
#include "h2/headers.h"
#include "h2/session.h"
#include "http1/writer.h"
#include "proxy/conn_internal.h"
#include "proxy/proxy.h"

/* One stream window of request body (docs/http2.md §4). */
#define H1H2_BUF 65535u
/* The window announced for the response (docs/http2.md §6). What the
 * workspace has not taken yet waits in its socket's queue, and the
 * upstream is read and acknowledged only while that queue is under
 * CE_CONN_HIGH_WATER, so a connection holds at most that plus this
 * window (one stream at a time); a 64 KiB window made a download wait for
 * a WINDOW_UPDATE every 32 KiB. */
#define H1H2_STREAM_WINDOW (1024u * 1024u)
/* The connection window (one stream at a time uses it): as the h2 path's
 * (docs/http2.md §4); what it lets in beyond the stream window is only
 * ever a stream's that ended. */
#define H1H2_CONN_WINDOW (1024 * 1024)
_Static_assert(H1H2_STREAM_WINDOW <= H1H2_CONN_WINDOW, "the connection window bounds the stream's");
/* Response header block, as HTTP/1.1 bounds a head. */
#define H1H2_MAX_HEADER_LIST CE_H1_MAX_HEAD_BYTES

struct ce_h1h2 {
  ce_conn_t *c;
  nghttp2_session *s;
  /* The current exchange's stream (0: none). */
  int32_t sid;
  bool open;               /* the stream is open in the session */
  char *up;                /* request body not yet sent: H1H2_BUF bytes of a
                              buffer of proxy->inbufs, NULL while empty */
  size_t up_len;
  /* Response fields being collected (head, interim head or trailers),
   * only while an exchange has some: the names and values, then the
   * field array, in one buffer of proxy->inbufs (an idle connection holds
   * neither). */
  char *fbuf;              /* H1H2_MAX_HEADER_LIST bytes of names and values,
                              NULL while no field is held */
  size_t fused;
  ce_h2h_field_t *f;       /* CE_H1_MAX_FIELDS entries at fbuf + H1H2_FIELDS_AT, NULL with fbuf */
  size_t fn;
  bool foverflow;
  bool head_sent;          /* the final head went to the workspace */
  bool final_seen;         /* a final (or unreadable) head came: the upstream processed the request */
  bool chunked_out;        /* ... chunked */
  bool close_out;          /* ... delimited by the close */
  bool no_body;            /* HEAD, 204, 304 */
  bool trailers;           /* f holds the trailers */
  bool ended;              /* the response ended (END_STREAM) */
  bool continued;          /* the proxy said 100 Continue itself */
  char fail[200];          /* the stream failed: why */
  size_t unconsumed;       /* DATA written to the workspace, not yet acknowledged */
  size_t unconsumed_conn;  /* ... of a stream that is gone */
  bool refused;            /* the stream was refused: nothing of it was processed */
  bool body_taken;         /* request body bytes left the workspace's buffer */
  bool goaway_error;       /* the upstream's GOAWAY carried an error */
};

typedef struct ce_h1h2 h1h2_t;

static int32_t cur_sid(nghttp2_session *session, h1h2_t *h, int32_t stream_id) {
  (void)session;
  return h->sid != 0 && stream_id == h->sid ? stream_id : 0;
}

static void set_fail(h1h2_t *h, const char *reason) {
  if (h->fail[0] == '\0')
    snprintf(h->fail, sizeof(h->fail), "%s", reason);
}

/* Where the field array starts in the fields' buffer (aligned for it). */
#define H1H2_FIELDS_AT H1H2_MAX_HEADER_LIST
_Static_assert(H1H2_FIELDS_AT % _Alignof(ce_h2h_field_t) == 0, "the field array is aligned");
_Static_assert(H1H2_BUF <= CE_CONN_INPUT_MAX &&
                   H1H2_FIELDS_AT + CE_H1_MAX_FIELDS * sizeof(ce_h2h_field_t) <= CE_CONN_INPUT_MAX,
               "h1h2's buffers come from the proxy's input pool");

/* The fields are done with: their buffer goes back to the pool. */
static void fields_reset(h1h2_t *h) {
  h->fused = 0;
  h->fn = 0;
  h->foverflow = false;
  ce_bufpool_put(&h->c->proxy->inbufs, h->fbuf);
  h->fbuf = NULL;
  h->f = NULL;
}

/* The request body buffer is empty: back to the pool. */
static void up_release(h1h2_t *h) {
  if (h->up_len > 0)
    return;
  ce_bufpool_put(&h->c->proxy->inbufs, h->up);
  h->up = NULL;
}

/* ---- callbacks ---------------------------------------------------------- */

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
  h1h2_t *h = user_data;
  if (frame->hd.type != NGHTTP2_HEADERS || cur_sid(session, h, frame->hd.stream_id) == 0 || h->foverflow)
    return 0;
  if (h->fn == CE_H1_MAX_FIELDS || namelen + valuelen > H1H2_MAX_HEADER_LIST - h->fused) {
    h->foverflow = true;
    return 0;
  }
  if (h->fbuf == NULL && (h->fbuf = ce_bufpool_get(&h->c->proxy->inbufs)) == NULL) {
    set_fail(h, "out_of_memory");
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  h->f = (ce_h2h_field_t *)(void *)(h->fbuf + H1H2_FIELDS_AT);
  char *p = h->fbuf + h->fused;
  memcpy(p, name, namelen);
  memcpy(p + namelen, value, valuelen);
  h->fused += namelen + valuelen;
  h->f[h->fn++] = (ce_h2h_field_t){p, namelen, p + namelen, valuelen};
  return 0;
}

static int status_of(const h1h2_t *h) {
  for (size_t i = 0; i < h->fn; i++)
    if (h->f[i].name_len == 7 && memcmp(h->f[i].name, ":status", 7) == 0) {
      int st = 0;
      for (size_t j = 0; j < h->f[i].value_len && j < 3; j++)
        st = st * 10 + (h->f[i].value[j] - '0');
      return st;
    }
  return 0;
}

static const ce_h2h_field_t *field(const h1h2_t *h, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < h->fn; i++)
    if (h->f[i].name_len == n && memcmp(h->f[i].name, name, n) == 0)
      return &h->f[i];
  return NULL;
}


/* Writes a head for the workspace; false when it cannot be expressed. */
static bool write_head(h1h2_t *h, int status, unsigned flags) {
  ce_conn_t *c = h->c;
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  static const ce_h2h_field_t none[1];
  int rc = ce_h2h_write_response(&w, status, h->f != NULL ? h->f : none, h->fn, flags);
  if (rc == CE_OK) {
    ce_conn_side_write(&c->c, c->proxy->head_buf, w.len);
    c->x.req.bytes_in += w.len;
  }
  return rc == CE_OK;
}

/* The final response head: framing for the workspace's version. */
static void final_head(h1h2_t *h, int status) {
  ce_conn_t *c = h->c;
  ce_h1_head_t *hd = malloc(sizeof(*hd));
  if (hd == NULL) {
    set_fail(h, "out_of_memory");
    return;
  }
  memset(hd, 0, sizeof(*hd));
  hd->is_response = true;
  hd->version_minor = 1;
  hd->status = status;
  for (size_t i = 0; i < h->fn && hd->field_count < CE_H1_MAX_FIELDS; i++) {
    if (h->f[i].name_len > 0 && h->f[i].name[0] == ':')
      continue;
    ce_h1_field_t *x = &hd->fields[hd->field_count++];
    x->name = h->f[i].name;
    x->name_len = h->f[i].name_len;
    x->value = h->f[i].value;
    x->value_len = h->f[i].value_len;
  }
  ce_reqinfo_set_response(&c->x.req, hd, c->proxy->opts);
  free(hd);

  bool head_method = strcmp(c->method, "HEAD") == 0;
  h->no_body = head_method || status == 204 || status == 304;
  bool has_len = field(h, "content-length") != NULL;
  unsigned flags = 0;
  h->chunked_out = h->close_out = false;
  if (!h->no_body) {
    if (has_len && !(c->req_te_trailers && c->req_http11)) {
      /* The length stands (nghttp2 checks the DATA against it). */
    } else if (c->req_http11) {
      h->chunked_out = true;
      flags |= CE_H2H_CHUNKED;
    } else {
      h->close_out = true;
    }
  }
  c->resp_keep_alive = c->req_keep_alive && !h->close_out && !c->proxy->draining;
  if (!c->resp_keep_alive)
    flags |= CE_H2H_CLOSE;
  if (!write_head(h, status, flags)) {
    set_fail(h, "upstream_bad_response: the response cannot be expressed in HTTP/1.1");
    return;
  }
  h->head_sent = true;
  c->resp_state = RESP_BODY;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  h1h2_t *h = user_data;
  if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR)
    h->goaway_error = true;
  if (cur_sid(session, h, frame->hd.stream_id) == 0)
    return 0;
  ce_conn_t *c = h->c;
  bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (frame->hd.type == NGHTTP2_HEADERS) {
    if (h->foverflow) {
      h->final_seen = true; /* its status is unknown: never sent again */
      set_fail(h, "upstream_bad_response: header list too large");
    } else if (!h->head_sent) {
      int status = status_of(h);
      if (status < 100 || status >= 200)
        h->final_seen = true;
      if (status >= 100 && status < 200) {
        /* An interim response (100 Continue, 103 Early Hints) goes to an
         * HTTP/1.1 workspace as it would from an HTTP/1.1 upstream; never
         * to HTTP/1.0 (RFC 9110 §15.2). */
        if (c->req_http11 && !(status == 100 && h->continued) && !write_head(h, status, 0))
          set_fail(h, "upstream_bad_response: the interim response cannot be expressed in HTTP/1.1");
      } else {
        final_head(h, status);
      }
      fields_reset(h);
    } else {
      h->trailers = true; /* kept in f until the end */
    }
  }
  if (end && (frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA))
    h->ended = true;
  return 0;
}

static int on_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                   void *user_data) {
  h1h2_t *h = user_data;
  if (cur_sid(session, h, stream_id) == 0 || !h->head_sent || h->no_body || h->fail[0] != '\0') {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  ce_conn_t *c = h->c;
  if (h->chunked_out) {
    char hdr[24];
    int n = snprintf(hdr, sizeof(hdr), "%zx\r\n", len);
    ce_conn_side_write(&c->c, hdr, (size_t)n);
  }
  ce_conn_side_write(&c->c, (const char *)data, len);
  if (h->chunked_out)
    ce_conn_side_write(&c->c, "\r\n", 2);
  c->x.req.bytes_in += len;
  h->unconsumed += len;
  return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
  h1h2_t *h = user_data;
  if (cur_sid(session, h, stream_id) == 0)
    return 0;
  h->open = false;
  h->unconsumed_conn += h->unconsumed;
  h->unconsumed = 0;
  if (!h->ended) {
    char reason[120];
    snprintf(reason, sizeof(reason), "upstream_reset: RST_STREAM %s", nghttp2_http2_strerror(error_code));
    set_fail(h, reason);
    /* RST_STREAM REFUSED_STREAM, or above the last stream id of a GOAWAY
     * (RFC 9113 §8.7): the request may go again (ce_h1h2_process). */
    h->refused = error_code == NGHTTP2_REFUSED_STREAM && !h->head_sent && !h->final_seen;
  }
  return 0;
}

/*
 * The chunked request body's trailer section (conn.c keeps it) as a
 * trailing HEADERS frame with END_STREAM (RFC 9113 §8.1): lower-cased
 * names, minus what ce_h1_trailer_allowed refuses (ce_h2h_trailer_fields).
 * True when submitted; false when there is none left or it cannot go (more
 * fields than CE_H1_MAX_FIELDS, no memory): the body then ends without
 * trailers, which a recipient may drop anyway (RFC 9110 §6.5.1).
 */
static bool submit_trailers(h1h2_t *h, nghttp2_session *session, int32_t stream_id) {
  ce_conn_t *c = h->c;
  if (c->req_trailers == NULL || c->req_body.keep == NULL || c->req_body.kept == 0)
    return false;
  ce_h2h_field_t *f = malloc(sizeof(*f) * CE_H1_MAX_FIELDS);
  nghttp2_nv *nva = malloc(sizeof(*nva) * CE_H1_MAX_FIELDS);
  char *names = malloc(CE_H1_MAX_TRAILER_BYTES);
  long n = -1;
  if (f != NULL && nva != NULL && names != NULL)
    n = ce_h2h_trailer_fields(c->req_trailers, c->req_body.kept, f, CE_H1_MAX_FIELDS, names,
                              CE_H1_MAX_TRAILER_BYTES);
  for (long i = 0; i < n; i++)
    nva[i] = (nghttp2_nv){(uint8_t *)(uintptr_t)f[i].name, (uint8_t *)(uintptr_t)f[i].value, f[i].name_len,
                          f[i].value_len, NGHTTP2_NV_FLAG_NONE};
  /* nghttp2 copies the fields. */
  bool sent = n > 0 && nghttp2_submit_trailer(session, stream_id, nva, (size_t)n) == 0;
  if (n < 0)
    CE_TRACE_D("proxy", 'c', c->id, "request trailers dropped: too many fields, or no memory");
  free(f);
  free(nva);
  free(names);
  return sent;
}

static ssize_t body_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  h1h2_t *h = user_data;
  if (cur_sid(session, h, stream_id) == 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  ce_conn_t *c = h->c;
  size_t n = h->up_len < length ? h->up_len : length;
  if (n > 0) {
    memcpy(buf, h->up, n);
    memmove(h->up, h->up + n, h->up_len - n);
    h->up_len -= n;
    c->x.req.bytes_out += n;
    ce_reqinfo_add_preview(&c->x.req, (const char *)buf, n, c->proxy->opts->body_preview);
    up_release(h);
  }
  if (h->up_len == 0 && c->req_done) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (submit_trailers(h, session, stream_id))
      *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    return (ssize_t)n;
  }
  return n == 0 ? NGHTTP2_ERR_DEFERRED : (ssize_t)n;
}

/* ---- the session -------------------------------------------------------- */

static int start(ce_conn_t *c) {
  h1h2_t *h = calloc(1, sizeof(*h));
  if (h == NULL)
    return CE_ENOMEM;
  h->c = c;
  c->h1h2 = h;
  static const ce_h2_session_params_t params = {
      .role = CE_H2_SESSION_CLIENT,
      .stream_window = H1H2_STREAM_WINDOW,
      .conn_window = H1H2_CONN_WINDOW,
      .max_header_list = H1H2_MAX_HEADER_LIST,
  };
  static const ce_h2_session_callbacks_t cbs = {
      .header = on_header,
      .frame_recv = on_frame_recv,
      .data_chunk_recv = on_data,
      .stream_close = on_stream_close,
  };
  int rc = ce_h2_session_new(&params, &cbs, h, &h->s);
  if (rc == CE_OK)
    CE_TRACE_D("proxy", 'c', c->id, "HTTP/1.1 workspace over an h2 upstream");
  return rc;
}

void ce_h1h2_free(struct ce_h1h2 *h) {
  if (h == NULL)
    return;
  nghttp2_session_del(h->s);
  h->up_len = 0;
  up_release(h);
  fields_reset(h);
  free(h);
}

bool ce_h1h2_usable(ce_conn_t *c) {
  h1h2_t *h = c->h1h2;
  return h != NULL && h->s != NULL && nghttp2_session_check_request_allowed(h->s) != 0 &&
         nghttp2_session_want_read(h->s) != 0;
}

static bool flush(h1h2_t *h);

void ce_h1h2_goaway(ce_conn_t *c) {
  h1h2_t *h = c->h1h2;
  if (h != NULL && h->s != NULL && nghttp2_session_terminate_session(h->s, NGHTTP2_NO_ERROR) == 0)
    flush(h);
}

/* Frames to the upstream while its socket has room. False on an error. */
static bool flush(h1h2_t *h) {
  ce_conn_t *c = h->c;
  while (!c->dead && c->u.open && c->u.queued < CE_CONN_HIGH_WATER) {
    const uint8_t *data;
    ssize_t n = nghttp2_session_mem_send(h->s, &data);
    if (n < 0)
      return false;
    if (n == 0)
      break;
    ce_conn_side_write(&c->u, (const char *)data, (size_t)n);
  }
  return !c->dead;
}

/* The upstream's frames. False when the session failed (or the upstream
 * closed) and the upstream must go. */
static bool recv_upstream(h1h2_t *h) {
  ce_conn_t *c = h->c;
  if (c->u.in_len > 0) {
    ssize_t n = nghttp2_session_mem_recv(h->s, (const uint8_t *)c->u.in, c->u.in_len);
    c->u.in_len = 0;
    if (n < 0) {
      char reason[120];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", nghttp2_strerror((int)n));
      set_fail(h, reason);
      return false;
    }
  }
  if (c->u.eof) {
    if (h->open)
      set_fail(h, "upstream_reset: connection closed");
    return false;
  }
  return true;
}

int ce_h1h2_begin(ce_conn_t *c) {
  if (c->h1h2 == NULL && start(c) != CE_OK) {
    ce_h1h2_free(c->h1h2);
    c->h1h2 = NULL;
    return CE_ENOMEM;
  }
  h1h2_t *h = c->h1h2;
  h->up_len = 0;
  up_release(h);
  fields_reset(h);
  h->head_sent = h->chunked_out = h->close_out = h->no_body = h->trailers = h->ended = h->continued = false;
  h->fail[0] = '\0';
  h->unconsumed = 0;
  h->refused = h->body_taken = h->final_seen = false;
  ce_h1_head_t *hd = malloc(sizeof(*hd));
  ce_h2h_field_t *f = malloc(sizeof(*f) * (CE_H1_MAX_FIELDS + 5u));
  /* The lower-cased names in the head scratch: nghttp2 copies them. */
  char *names = c->proxy->head_buf;
  nghttp2_nv *nva = malloc(sizeof(*nva) * (CE_H1_MAX_FIELDS + 5u));
  int rc = CE_ENOMEM;
  const char *why = NULL;
  if (hd == NULL || f == NULL || nva == NULL)
    goto out;
  rc = CE_EINVAL;
  if (ce_h1_parse_request(c->up_head, c->up_head_len, hd, &why) != CE_OK)
    goto out;
  long n = ce_h2h_request_fields(hd, c->req_te_trailers, f, CE_H1_MAX_FIELDS + 5u, names, CE_H1_MAX_HEAD_BYTES);
  if (n < 0)
    goto out;
  for (long i = 0; i < n; i++)
    nva[i] = (nghttp2_nv){(uint8_t *)(uintptr_t)f[i].name, (uint8_t *)(uintptr_t)f[i].value, f[i].name_len,
                          f[i].value_len, NGHTTP2_NV_FLAG_NONE};
  nghttp2_data_provider prd = {.source.ptr = h, .read_callback = body_read};
  int32_t sid = nghttp2_submit_request(h->s, NULL, nva, (size_t)n, c->req_done ? NULL : &prd,
                                       NULL);
  if (sid < 0)
    goto out;
  h->sid = sid;
  h->open = true;
  rc = CE_OK;
  if (c->req_expect_continue && c->req_http11 && !c->req_done) {
    /* Many h2 servers never answer Expect (nginx does not): the stream's
     * window bounds what the body can make the proxy hold, so the proxy
     * says 100 itself (RFC 9110 §10.1.1), and an upstream's own 100 is
     * then not repeated. */
    ce_conn_side_write(&c->c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    h->continued = true;
  }
out:
  free(hd);
  free(f);
  free(nva);
  return rc;
}

/* Moves the workspace's request body into the stream's buffer. False on
 * a malformed body (reported). */
static bool take_body(h1h2_t *h) {
  ce_conn_t *c = h->c;
  bool more = false;
  while (!c->req_done && c->c.in_len > 0 && h->up_len < H1H2_BUF) {
    size_t room = H1H2_BUF - h->up_len;
    size_t len = c->c.in_len < room ? c->c.in_len : room;
    size_t used = 0, dl = 0;
    const char *data = NULL, *why = NULL;
    int rc = ce_h1_body_next(&c->req_body, c->c.in, len, &used, &data, &dl, &why);
    if (rc < 0) {
      char reason[160];
      snprintf(reason, sizeof(reason), "bad_request: %s", why != NULL ? why : "malformed body");
      ce_conn_failed_mid_response(c, reason);
      return false;
    }
    if (dl > 0) {
      if (h->up == NULL && (h->up = ce_bufpool_get(&c->proxy->inbufs)) == NULL) {
        ce_conn_failed_mid_response(c, "out_of_memory");
        return false;
      }
      memcpy(h->up + h->up_len, data, dl);
      h->up_len += dl;
    }
    memmove(c->c.in, c->c.in + used, c->c.in_len - used);
    c->c.in_len -= used;
    more = true;
    h->body_taken = true;
    if (rc == 1)
      c->req_done = true;
    if (used == 0)
      break;
  }
  if (more && h->open)
    nghttp2_session_resume_data(h->s, h->sid);
  return true;
}

/* Acknowledges the DATA the workspace's socket took. */
static void consume(h1h2_t *h) {
  ce_conn_t *c = h->c;
  if (h->unconsumed_conn > 0) {
    nghttp2_session_consume_connection(h->s, h->unconsumed_conn);
    h->unconsumed_conn = 0;
  }
  if (h->unconsumed > 0 && h->open && c->c.queued < CE_CONN_HIGH_WATER) {
    nghttp2_session_consume(h->s, h->sid, h->unconsumed);
    h->unconsumed = 0;
  }
}

void ce_h1h2_process(ce_conn_t *c) {
  h1h2_t *h = c->h1h2;
  if (h == NULL || c->dead || h->sid == 0)
    return;
  if (!take_body(h))
    return;
  bool alive = recv_upstream(h);
  if (c->dead)
    return;
  if (h->fail[0] == '\0' && h->ended) {
    /* The response is whole: its end for the workspace, then the next
     * exchange (the stream is done with; a request body still coming
     * means the connection ends, as on HTTP/1.1). */
    if (h->chunked_out) {
      ce_h2h_field_t none[1];
      size_t cap = 5u + (h->trailers ? h->fused + 4u * h->fn : 0u);
      char *buf = malloc(cap);
      if (buf != NULL) {
        ce_h1_writer_t w;
        ce_h1_writer_init(&w, buf, cap);
        bool have = h->trailers && h->f != NULL;
        if (ce_h2h_write_trailers(&w, have ? h->f : none, have ? h->fn : 0) == CE_OK)
          ce_conn_side_write(&c->c, buf, w.len);
        free(buf);
      }
    }
    fields_reset(h); /* the trailers went out: an idle connection holds no field buffer */
    if (h->open) {
      nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, h->sid, NGHTTP2_CANCEL);
      h->unconsumed_conn += h->unconsumed;
      h->unconsumed = 0;
      h->open = false;
    }
    h->sid = 0;
    consume(h);
    bool ok = flush(h);
    if (h->close_out)
      c->resp_keep_alive = false;
    /* An upstream that ended (a GOAWAY and its close, docs/http2.md §6)
     * goes; the workspace's connection stays (its response said so), and
     * its next exchange connects again. */
    if (!ok || !alive)
      ce_conn_upstream_reset(c); /* frees h */
    ce_conn_finish_exchange(c);
    return;
  }
  if (h->fail[0] != '\0') {
    char reason[200];
    snprintf(reason, sizeof(reason), "%s", h->fail);
    if (h->refused && h->body_taken)
      snprintf(reason, sizeof(reason), "%s",
               "upstream_refused: the upstream refused the stream after the request body was read; it cannot be "
               "sent again");
    /* docs/http2.md §6: a refused stream goes again, once, over a new
     * connection when nothing of it is lost (no body read, no 100
     * Continue said) and no GOAWAY said the upstream gave up on us. */
    bool again = h->refused && !h->body_taken && !h->continued && !h->goaway_error && !c->proxy->draining &&
                 c->h1h2_retried != c->x.req.id;
    h->sid = 0;
    if (again) {
      c->h1h2_retried = c->x.req.id;
      ce_conn_retry_exchange(c); /* frees h */
      return;
    }
    ce_conn_upstream_reset(c); /* frees h */
    ce_conn_failed_mid_response(c, reason);
    return;
  }
  consume(h);
  if (!flush(h)) {
    ce_conn_upstream_reset(c);
    ce_conn_failed_mid_response(c, "upstream_bad_response: the h2 session failed");
    return;
  }
  if (!alive) {
    ce_conn_upstream_reset(c);
    ce_conn_failed_mid_response(c, "upstream_reset: the upstream ended the connection");
  }
}

void ce_h1h2_idle(ce_conn_t *c) {
  h1h2_t *h = c->h1h2;
  if (h == NULL || c->dead)
    return;
  bool alive = recv_upstream(h);
  consume(h);
  alive = flush(h) && alive;
  if (c->dead)
    return;
  if (!alive || (!nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s)))
    ce_conn_upstream_reset(c);
}
