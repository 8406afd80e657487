/*
 * One HTTP/1.1 request on a proxied connection (docs/proxy.md): its head
 * read and handed to the exchange (proxy/exchange.h), the head built for
 * the upstream, the answers the proxy writes itself, the request and
 * response bodies re-framed between the two sides, and the WebSocket
 * tunnel after a 101. The connection (conn.c) owns the sockets, the
 * timers and the state machine that calls in here.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/trace.h"
#include "http1/parser.h"
#include "http1/writer.h"
#include "proxy/conn_internal.h"
#include "proxy/exchange.h"
#include "proxy/transport.h"

#define trace(c, fmt, ...) CE_TRACE_D("proxy", 'c', (c)->id, fmt, ##__VA_ARGS__)

/*
 * Body spans of one round, gathered into one write (docs/proxy.md,
 * "Re-framing"). A body of tiny chunks ("1\r\na\r\n" repeated) yields one
 * span per chunk; writing each as its own chunk costs three writes (and,
 * with TLS, three records) per input byte, and consuming each by moving
 * the rest of the buffer makes the round quadratic. So the decoder walks
 * the input with an offset, the decoded bytes are copied once into one
 * buffer (at most the input's size), and the round ends in one write: one
 * chunk when re-chunking (chunk boundaries carry no meaning, RFC 9112
 * §7.1), plus the last chunk when the body ended.
 */
#define CE_CONN_CHUNK_HDR_MAX 24u /* hex size + CRLF, with room */

typedef struct {
  char *buf;                /* CE_CONN_CHUNK_HDR_MAX + cap + 7 bytes */
  size_t len;               /* decoded bytes at buf + CE_CONN_CHUNK_HDR_MAX */
} gather_t;

static void keep_trailers(ce_conn_t *c, ce_h1_body_t *body, char **buf);
static const char *status_phrase(int status);
static void h1_respond(ce_exchange_t *x, int status, const char *text);
static void refuse_request(ce_conn_t *c, int status, const char *reason, const char *detail);
static void reject_head(ce_conn_t *c, int status, const char *why);
static int build_upstream_head(ce_conn_t *c, const ce_h1_head_t *h, const ce_credential_request_t *cred);
static void h1_forward(ce_exchange_t *x);
static void h1_asking(ce_exchange_t *x);
static bool h1_answer_wanted(ce_exchange_t *x);
static void h1_answered(ce_exchange_t *x);
static void handle_request(ce_conn_t *c, const ce_h1_head_t *h);
static bool gather_init(ce_conn_t *c, gather_t *g, size_t cap);
static void gather_add(gather_t *g, const char *data, size_t len);
static void gather_flush(ce_conn_t *c, gather_t *g, side_t *s, bool chunked, bool last, const ce_h1_body_t *body);
static int forward_response_head(ce_conn_t *c, const ce_h1_head_t *h);
static void pump_response_body(ce_conn_t *c);
static void on_tunnel_shutdown(uv_shutdown_t *req, int status);
static void shutdown_side(side_t *s);

/* Keeps the trailer section of a chunked body to forward it (RFC 9110
 * §6.5: trailers are end-to-end). *buf is freed by end_request. Without
 * memory the trailers are dropped, as a recipient may (§6.5.1). */
static void keep_trailers(ce_conn_t *c, ce_h1_body_t *body, char **buf) {
  if (*buf == NULL)
    *buf = malloc(CE_H1_MAX_TRAILER_BYTES);
  if (*buf == NULL)
    trace(c, "no memory for the trailers: they are dropped");
  ce_h1_body_keep_trailers(body, *buf);
}

/* ---- answers the proxy writes itself ------------------------------------ */

static const char *status_phrase(int status) {
  switch (status) {
  case 400: return "Bad Request";
  case 403: return "Forbidden";
  case 421: return "Misdirected Request";
  case 431: return "Request Header Fields Too Large";
  case 502: return "Bad Gateway";
  case 504: return "Gateway Timeout";
  default: return "Error";
  }
}

/*
 * Writes a complete response with a short text body. keep is whether the
 * connection may carry another request afterwards (the request had no
 * unread body and the client did not ask to close).
 */
void h1__answer(ce_conn_t *c, int status, const char *body, bool keep) {
  size_t blen = strlen(body);
  conn__side_printf(&c->c,
              "HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %zu\r\n"
              "cache-control: no-store\r\nx-condukt-egress: refused\r\n%s\r\n",
              status, status_phrase(status), blen, keep ? "" : "connection: close\r\n");
  conn__side_write(&c->c, body, blen);
  if (ce_exchange_is_open(&c->x)) {
    c->x.req.status = status;
    c->x.req.bytes_in += blen;
    if (c->x.req.responded_at_us == 0)
      c->x.req.responded_at_us = ce_now_us();
  }
}

/* How the proxy answers an HTTP/1.1 request itself (the exchange's
 * respond op; its event went out). A request whose body has not been read
 * cannot be followed by another on this connection unless the body is
 * small enough to skip. A client that sent Expect: 100-continue gets no
 * 100 from a refusal and need not send the body at all (RFC 9110
 * §10.1.1): waiting to skip it would take its next request for the body,
 * so that connection closes. During a drain nothing more is taken: the
 * answer says connection: close. */
static void h1_respond(ce_exchange_t *x, int status, const char *text) {
  ce_conn_t *c = x->owner;
  bool keep = c->req_keep_alive && !c->req_upgrade && !c->proxy->draining &&
              (c->req_framing == CE_H1_BODY_NONE ||
               (c->req_framing == CE_H1_BODY_LENGTH && !c->req_expect_continue &&
                c->req_body.remaining <= CE_CONN_DISCARD_MAX));
  h1__answer(c, status, text, keep);
  if (keep && c->req_framing != CE_H1_BODY_NONE) {
    /* The body is skipped in ST_HEAD, whichever state refused (a decider
     * answers in ST_DECIDING), and under a timer like any wait for bytes. */
    c->denied_discard = true;
    conn__set_state(c, ST_HEAD);
    conn__arm(c, c->proxy->opts->idle_ms);
    return;
  }
  conn__end_request(c);
  if (keep) {
    conn__await_request(c);
  } else {
    conn__close_after_flush(c);
  }
}

/* Refuses a request that never became a policy question (malformed,
 * misdirected). The event is request_denied with the reason given. */
static void refuse_request(ce_conn_t *c, int status, const char *reason, const char *detail) {
  ce_exchange_refuse(&c->x, "request_denied", status, reason, detail);
}


/* An error before the head could be read fully: 400/431 and close. */
static void reject_head(ce_conn_t *c, int status, const char *why) {
  conn__begin_connection_record(c);
  char reason[160];
  snprintf(reason, sizeof(reason), "%s: %s", status == 431 ? "request_header_too_large" : "bad_request", why);
  ce_exchange_refuse_as(&c->x, "request_denied", status, reason, NULL);
  char text[300];
  snprintf(text, sizeof(text), "condukt: malformed request: %s\n", why);
  h1__answer(c, status, text, false);
  conn__close_after_flush(c);
}

/* ---- heads ------------------------------------------------------------- */

/* The request head as sent upstream (http1/writer.h): origin-form target,
 * Host first, hop-by-hop fields dropped, framing chosen by the proxy.
 * Written in the proxy's head scratch (CE_CONN_HEAD_OUT_MAX: the parsed
 * head's own bound plus the few fields the proxy adds), kept as an
 * exact-size copy. */
static int build_upstream_head(ce_conn_t *c, const ce_h1_head_t *h, const ce_credential_request_t *cred) {
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  unsigned flags = (h->framing == CE_H1_BODY_CHUNKED ? CE_H1_W_CHUNKED : 0) |
                   (h->upgrade && h->upgrade_websocket ? CE_H1_W_UPGRADE : 0);
  /* The credentials of a request that may go upstream (policy/credential.h),
   * on a copy of the head: the event record keeps what the workspace sent.
   * The head is only sent once the exchange allowed the request (a decide
   * rule's question is asked first); an HTTP/1.1 upstream gets this head,
   * an h2 one its fields (http2/h1h2.c). */
  ce_h1_head_t *hc = NULL;
  int rc = CE_OK;
  if (cred != NULL && ce_policy_credential_count(c->proxy->policy) > 0) {
    hc = malloc(sizeof(*hc));
    if (hc == NULL)
      return CE_ENOMEM;
    *hc = *h;
    rc = ce_credential_apply(c->proxy->policy, c->proxy->secrets, cred, hc->fields, &hc->field_count,
                             CE_H1_MAX_FIELDS);
    h = hc;
  }
  if (rc >= 0)
    rc = ce_h1_write_request_head(&w, h, NULL, 0, flags);
  free(hc);
  if (rc != CE_OK)
    return rc;
  char *copy = malloc(w.len);
  if (copy == NULL)
    return CE_ENOMEM;
  memcpy(copy, c->proxy->head_buf, w.len);
  free(c->up_head);
  c->up_head = copy;
  c->up_head_len = w.len;
  return CE_OK;
}

static void h1_forward(ce_exchange_t *x) { conn__connect_upstream(x->owner); }

/* A question went to the decider: reading goes on into the bounded
 * buffer, nothing is forwarded, and the control channel owns the timeout. */
static void h1_asking(ce_exchange_t *x) {
  ce_conn_t *c = x->owner;
  conn__set_state(c, ST_DECIDING);
  uv_timer_stop(&c->timer);
}

static bool h1_answer_wanted(ce_exchange_t *x) {
  ce_conn_t *c = x->owner;
  return !c->dead && c->state == ST_DECIDING;
}

static void h1_answered(ce_exchange_t *x) { conn__process(x->owner); }

/* The first body bytes read so far, decoded (a chunked body's framing is
 * not part of it), into the record for the decider's question. The input
 * is not consumed: the same bytes are forwarded once allowed. */
static bool h1_preview(ce_exchange_t *x, bool final) {
  ce_conn_t *c = x->owner;
  size_t cap = c->proxy->opts->body_preview;
  /* No body, or none before an answer: a client that sent Expect:
   * 100-continue waits for a 100 the decision comes before. */
  if (c->req_done || c->req_expect_continue || c->req_upgrade)
    return true;
  ce_reqinfo_t *r = &x->req;
  ce_reqinfo_reset_preview(r);
  ce_h1_body_t body = c->req_body; /* a copy: the real decoder starts at the same place later */
  ce_h1_body_keep_trailers(&body, NULL);
  size_t off = 0;
  int rc = 0;
  while (off < c->c.in_len && r->body_preview_len < cap) {
    size_t used = 0, dlen = 0;
    const char *data = NULL, *why = NULL;
    rc = ce_h1_body_next(&body, c->c.in + off, c->c.in_len - off, &used, &data, &dlen, &why);
    if (rc < 0)
      return true; /* a malformed body fails when it is forwarded */
    ce_reqinfo_add_preview(r, data, dlen, cap);
    off += used;
    if (rc == 1 || used == 0)
      break;
  }
  return final || rc == 1 || r->body_preview_len >= cap || r->body_preview_lost || c->c.eof ||
         c->c.in_len >= CE_CONN_INPUT_MAX;
}

/* The question waits for the body under the connection's timer. */
static void h1_previewing(ce_exchange_t *x) {
  ce_conn_t *c = x->owner;
  conn__set_state(c, ST_DECIDING);
  conn__arm(c, CE_EXCHANGE_PREVIEW_WAIT_MS);
}

const ce_exchange_ops_t h1__ops = {
    .forward = h1_forward,
    .respond = h1_respond,
    .preview = h1_preview,
    .previewing = h1_previewing,
    .asking = h1_asking,
    .answer_wanted = h1_answer_wanted,
    .answered = h1_answered,
};

/* ---- requests ------------------------------------------------------------ */

static void handle_request(ce_conn_t *c, const ce_h1_head_t *h) {
  ce_exchange_conn_t info;
  ce_conn_exchange_conn(c, &info);
  ce_exchange_open(&c->x, &info, 0);
  if (ce_reqinfo_set_request(&c->x.req, h, c->proxy->opts) != CE_OK) {
    conn__report_failed(c, "out_of_memory");
    conn__abort(c);
    return;
  }
  c->x.req.bytes_out = h->head_len;
  size_t mlen = h->method_len < sizeof(c->method) - 1 ? h->method_len : sizeof(c->method) - 1;
  memcpy(c->method, h->method, mlen);
  c->method[mlen] = '\0';
  c->req_framing = h->framing;
  ce_h1_body_init(&c->req_body, h->framing, h->content_length);
  if (h->framing == CE_H1_BODY_CHUNKED)
    keep_trailers(c, &c->req_body, &c->req_trailers);
  c->req_keep_alive = h->keep_alive;
  c->req_upgrade = h->upgrade && h->upgrade_websocket;
  c->req_expect_continue = h->expect_continue;
  c->req_http11 = h->version_minor >= 1;
  c->req_te_trailers = false;
  for (int i = ce_h1_find(h, "te", 0); i >= 0; i = ce_h1_find(h, "te", i + 1))
    if (h->fields[i].value_len >= 8 && memmem(h->fields[i].value, h->fields[i].value_len, "trailers", 8) != NULL)
      c->req_te_trailers = true;
  /* Content-Length: 0 is a body that is already whole (an h2 upstream
   * needs its END_STREAM now, and the connection may be kept). */
  c->req_done = h->framing == CE_H1_BODY_NONE || (h->framing == CE_H1_BODY_LENGTH && h->content_length == 0);
  c->resp_state = RESP_WAIT_HEAD;
  c->denied_discard = false;

  /* RFC 9112 §3.2.2: in absolute-form the target's authority names the
   * host and Host must then be ignored; a proxy that let Host win could be
   * steered by a client that sends both. */
  const char *auth = h->host;
  size_t auth_len = h->host_len;
  if (h->target_form == CE_H1_TARGET_ABSOLUTE) {
    auth = h->authority;
    auth_len = h->authority_len;
  } else if (h->target_form == CE_H1_TARGET_AUTHORITY) {
    /* authority-form: only CONNECT uses it, and a transparent proxy has
     * nothing to tunnel to. */
    ce_exchange_reject(&c->x, 400, "bad_request: connect_not_supported",
                       "CONNECT is not supported: this connection already goes where it was dialled");
    return;
  }
  /* absolute-form: the path may be empty or only a query (RFC 9112
   * §3.2.1: it stands for "/"). */
  const char *target = h->path;
  size_t target_len = h->path_len;
  if (target == NULL || target_len == 0 || target[0] == '?') {
    target = "/";
    target_len = 1;
  }
  if (!ce_exchange_admit(&c->x, auth, auth_len, h->method, h->method_len, target, target_len, "Host"))
    return;
  /* The head for the upstream is built (and its size checked) before the
   * verdict: a head that cannot be forwarded is refused whatever the
   * policy says. */
  ce_credential_request_t cred = {c->x.req.host, strlen(c->x.req.host), h->method, h->method_len, target, target_len,
                                  c->tls};
  int built = build_upstream_head(c, h, c->x.verdict.decision != CE_DECISION_DENY ? &cred : NULL);
  if (built == CE_ETOOBIG) {
    refuse_request(c, 431, "request_header_too_large", "the request head is too large to forward");
    return;
  }
  if (built != CE_OK) {
    refuse_request(c, 400, "bad_request: cannot be forwarded", "malformed request: it cannot be forwarded");
    return;
  }
  ce_exchange_decide(&c->x);
}

/* A parsed head's record (4 KiB, its 128 fields) for one call: it points
 * into the input, which the call consumes, so a connection keeps none
 * between calls (docs/proxy.md "Memory of an idle connection"). NULL
 * when there is no memory: the connection is failed and aborted. */
static ce_h1_head_t *head_scratch(ce_conn_t *c) {
  ce_h1_head_t *h = malloc(sizeof(*h));
  if (h == NULL) {
    conn__begin_connection_record(c);
    conn__report_failed(c, "out_of_memory");
    conn__abort(c);
  }
  return h;
}

static void process_head(ce_conn_t *c, ce_h1_head_t *head);

void h1__process_head(ce_conn_t *c) {
  if (c->c.in_len == 0) {
    if (c->c.eof)
      conn__close_after_flush(c);
    return;
  }
  ce_h1_head_t *head = head_scratch(c);
  if (head == NULL)
    return;
  process_head(c, head);
  free(head);
}

static void process_head(ce_conn_t *c, ce_h1_head_t *head) {
  const char *why = NULL;
  int rc = ce_h1_parse_request(c->c.in, c->c.in_len, head, &why);
  if (rc == CE_EAGAIN) {
    if (c->c.eof) {
      conn__begin_connection_record(c);
      conn__report_failed(c, "client_reset: closed inside a request head");
      conn__abort(c);
      return;
    }
    /* The head started: from now on the header timeout applies, from its
     * first byte, whatever ran before (idle, or nothing). */
    if (!c->head_started) {
      c->head_started = true;
      conn__arm(c, c->proxy->opts->header_ms);
    }
    return;
  }
  if (rc == CE_ETOOBIG) {
    reject_head(c, 431, why != NULL ? why : "request head too large");
    return;
  }
  if (rc != CE_OK) {
    reject_head(c, 400, why != NULL ? why : "malformed request head");
    return;
  }
  uv_timer_stop(&c->timer);
  c->head_started = false;
  size_t head_len = head->head_len;
  handle_request(c, head);
  /* Everything the proxy keeps from the head was copied: drop it. */
  conn__consume(&c->c, head_len);
}

/* ---- the exchange -------------------------------------------------------- */

void h1__start_exchange(ce_conn_t *c) {
  conn__set_state(c, ST_EXCHANGE);
  conn__arm(c, c->proxy->opts->idle_ms);
  if (ce_transport_speaks_h2(&c->u)) {
    /* docs/http2.md §6: the exchange is one stream of the upstream's
     * session (http2/h1h2.c). */
    int rc = ce_h1h2_begin(c);
    if (rc != CE_OK) {
      conn__upstream_reset(c);
      h1__upstream_failed_mid_response(c, rc == CE_ENOMEM ? "out_of_memory"
                                                      : "bad_request: the request cannot be expressed in HTTP/2");
      return;
    }
    trace(c, "forwarded %s %s as an h2 stream", c->method, c->x.req.path != NULL ? c->x.req.path : "");
    return;
  }
  conn__side_write(&c->u, c->up_head, c->up_head_len);
  trace(c, "forwarded %s %s", c->method, c->x.req.path != NULL ? c->x.req.path : "");
}


static bool gather_init(ce_conn_t *c, gather_t *g, size_t cap) {
  g->len = 0;
  g->buf = malloc(CE_CONN_CHUNK_HDR_MAX + cap + 7);
  if (g->buf == NULL) {
    conn__report_failed(c, "out_of_memory");
    conn__abort(c);
    return false;
  }
  return true;
}

static void gather_add(gather_t *g, const char *data, size_t len) {
  memcpy(g->buf + CE_CONN_CHUNK_HDR_MAX + g->len, data, len);
  g->len += len;
}

/* Writes the gathered bytes to s, as one chunk when chunked, then the
 * last chunk when last, with the allowed fields of the kept trailer
 * section body->keep (ce_h1_write_last_chunk_trailers); frees the buffer. */
static void gather_flush(ce_conn_t *c, gather_t *g, side_t *s, bool chunked, bool last, const ce_h1_body_t *body) {
  char *start = g->buf + CE_CONN_CHUNK_HDR_MAX;
  char *end = start + g->len;
  if (chunked && g->len > 0) {
    char hdr[CE_CONN_CHUNK_HDR_MAX];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, hdr, sizeof(hdr));
    if (ce_h1_write_chunk_header(&w, g->len) == CE_OK) { /* len 1..input max: always */
      start -= w.len;
      memcpy(start, hdr, w.len);
    }
    memcpy(end, "\r\n", 2);
    end += 2;
  }
  bool trailers = chunked && last && body->keep != NULL && body->kept > 0;
  if (chunked && last && !trailers) {
    memcpy(end, "0\r\n\r\n", 5);
    end += 5;
  }
  conn__side_write(s, start, (size_t)(end - start));
  free(g->buf);
  g->buf = NULL;
  if (trailers) {
    _Static_assert(CE_H1_TRAILER_OUT_MAX <= CE_CONN_HEAD_OUT_MAX, "trailers are written in the head scratch");
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
    if (ce_h1_write_last_chunk_trailers(&w, body->keep, body->kept) != CE_OK) /* bounded: never */
      ce_h1_write_last_chunk(&w);
    conn__side_write(s, w.buf, w.len);
  }
}

/* Moves request body bytes from the workspace to upstream. */
void h1__pump_request_body(ce_conn_t *c) {
  if (c->req_done || c->c.in_len == 0 || c->u.queued >= CE_CONN_HIGH_WATER || c->dead)
    return;
  gather_t g;
  if (!gather_init(c, &g, c->c.in_len))
    return;
  size_t off = 0;
  while (off < c->c.in_len) {
    size_t used = 0, dlen = 0;
    const char *data = NULL, *why = NULL;
    int rc = ce_h1_body_next(&c->req_body, c->c.in + off, c->c.in_len - off, &used, &data, &dlen, &why);
    if (rc < 0) {
      free(g.buf);
      char reason[160];
      snprintf(reason, sizeof(reason), "bad_request: %s", why != NULL ? why : "malformed body");
      conn__report_failed(c, reason);
      if (c->resp_state == RESP_WAIT_HEAD) {
        char text[200];
        snprintf(text, sizeof(text), "condukt: malformed request body: %s\n", why != NULL ? why : "?");
        h1__answer(c, 400, text, false);
        conn__close_after_flush(c);
      } else {
        conn__abort(c);
      }
      return;
    }
    if (dlen > 0) {
      ce_reqinfo_add_preview(&c->x.req, data, dlen, c->proxy->opts->body_preview);
      gather_add(&g, data, dlen);
      c->x.req.bytes_out += dlen;
    }
    off += used;
    if (rc == 1) {
      c->req_done = true;
      break;
    }
    if (used == 0)
      break;
  }
  conn__consume(&c->c, off);
  gather_flush(c, &g, &c->u, c->req_framing == CE_H1_BODY_CHUNKED, c->req_done, &c->req_body);
}

/* Discards the body of a refused request so the connection can go on. */
void h1__discard_request_body(ce_conn_t *c) {
  size_t off = 0;
  int rc = 0;
  while (off < c->c.in_len) {
    size_t used = 0, dlen = 0;
    const char *data = NULL, *why = NULL;
    rc = ce_h1_body_next(&c->req_body, c->c.in + off, c->c.in_len - off, &used, &data, &dlen, &why);
    if (rc < 0)
      break;
    off += used;
    if (rc == 1 || used == 0)
      break;
  }
  conn__consume(&c->c, off);
  if (rc < 0 || (rc == 0 && c->c.eof && c->c.in_len == 0)) {
    /* Malformed, or the client stopped before the end: nothing follows. */
    c->denied_discard = false;
    conn__end_request(c);
    conn__close_after_flush(c);
    return;
  }
  if (rc == 1) {
    c->denied_discard = false;
    conn__end_request(c);
    conn__await_request(c);
  }
}

/* The response head as written to the workspace. */
static int forward_response_head(ce_conn_t *c, const ce_h1_head_t *h) {
  unsigned flags = 0;
  bool interim = h->status >= 100 && h->status < 200;
  if (h->status == 101) {
    flags |= CE_H1_W_UPGRADE;
  } else if (!interim) {
    c->resp_out = RESP_OUT_AS_IS;
    if (!c->req_http11 && (h->framing == CE_H1_BODY_CHUNKED || h->framing == CE_H1_BODY_CLOSE)) {
      /* RFC 9112 §6.1: chunked must not be sent to an HTTP/1.0 client; it
       * gets the decoded body, delimited by the close (§6.3). */
      c->resp_out = RESP_OUT_CLOSE;
      if (h->framing == CE_H1_BODY_CHUNKED)
        flags |= CE_H1_W_DECHUNK;
    } else if (h->framing == CE_H1_BODY_CHUNKED) {
      c->resp_out = RESP_OUT_CHUNKED;
    } else if (h->framing == CE_H1_BODY_CLOSE) {
      /* A body that ends at close goes to an HTTP/1.1 client chunked,
       * which keeps the connection usable. */
      c->resp_out = RESP_OUT_CHUNKED;
    }
    if (c->resp_out == RESP_OUT_CHUNKED)
      flags |= CE_H1_W_CHUNKED;
    c->resp_keep_alive = h->keep_alive && c->req_keep_alive && c->resp_out != RESP_OUT_CLOSE && c->req_done &&
                         !c->proxy->draining;
    if (!c->resp_keep_alive)
      flags |= CE_H1_W_CLOSE;
  }
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  int rc = ce_h1_write_response_head(&w, h, flags);
  if (rc == CE_OK)
    conn__side_write(&c->c, c->proxy->head_buf, w.len);
  return rc;
}

void h1__finish_exchange(ce_conn_t *c) {
  c->resp_state = RESP_DONE;
  ce_exchange_finish(&c->x, NULL);
  bool keep = c->resp_keep_alive && c->req_done && !c->c.eof && !c->proxy->draining;
  conn__end_request(c);
  /* A rest point: the TLS engines give back the room of their largest
   * read and write (docs/proxy.md "Memory of an idle connection"). */
  conn__side_flush(&c->c);
  conn__side_flush(&c->u);
  ce_transport_rest(&c->c);
  ce_transport_rest(&c->u);
  /* Bytes after a complete response (a HEAD or 304 answered with a body,
   * a Content-Length shorter than what came) would be read as the next
   * request's response (RFC 9112 §6.3 leaves no way to frame them): such
   * an upstream is not used again. */
  if (c->u.open && c->u.in_len > 0) {
    trace(c, "upstream sent %zu bytes after the response; not reusing it", c->u.in_len);
    conn__upstream_reset(c);
  }
  if (!c->u.eof && c->u.open && !keep)
    conn__upstream_reset(c);
  if (!keep) {
    conn__close_after_flush(c);
    return;
  }
  conn__await_request(c);
}

/* An idle upstream (between exchanges, or while a request is decided)
 * has nothing to say: whatever it sends cannot be a response to a request
 * it has not seen yet, so that upstream is dropped. */
void h1__drop_stray_upstream(ce_conn_t *c) {
  if (c->u.open && c->u.in_len > 0) {
    trace(c, "upstream sent %zu bytes between exchanges; dropping it", c->u.in_len);
    conn__upstream_reset(c);
  }
}

void h1__upstream_failed_mid_response(ce_conn_t *c, const char *reason) {
  conn__report_failed(c, reason);
  if (c->resp_state == RESP_WAIT_HEAD) {
    char text[300];
    snprintf(text, sizeof(text), "condukt: %s\n", reason);
    h1__answer(c, 502, text, false);
    conn__close_after_flush(c);
  } else {
    /* The workspace already has part of the response: only a reset tells
     * it the body is incomplete. */
    conn__abort(c);
  }
}

/* Moves one round of response body to the workspace; finishes the
 * exchange at its end. */
static void pump_response_body(ce_conn_t *c) {
  if (c->u.in_len == 0) {
    if (!c->u.eof)
      return;
    if (c->resp_body.framing != CE_H1_BODY_CLOSE) {
      h1__upstream_failed_mid_response(c, "conn__upstream_reset: closed inside the response body");
      return;
    }
    /* RFC 8446 §6.1, RFC 9112 §9.8: over TLS only a close_notify ends a
     * body delimited by the close; a bare TCP close may be an attacker's
     * (or a crash) cutting it short. The workspace must not see a clean
     * end: the chunked body gets no last chunk, the connection a reset. */
    if (!ce_transport_clean_end(&c->u)) {
      h1__upstream_failed_mid_response(c, "upstream_tls: truncated: the server closed without close_notify");
      return;
    }
    if (c->resp_out == RESP_OUT_CHUNKED)
      conn__side_write(&c->c, "0\r\n\r\n", 5);
    c->resp_keep_alive = c->resp_keep_alive && c->resp_out == RESP_OUT_CHUNKED;
    h1__finish_exchange(c);
    return;
  }
  if (c->c.queued >= CE_CONN_HIGH_WATER)
    return;
  gather_t g;
  if (!gather_init(c, &g, c->u.in_len))
    return;
  size_t off = 0;
  int rc = 0;
  while (off < c->u.in_len) {
    size_t used = 0, dlen = 0;
    const char *data = NULL, *why = NULL;
    rc = ce_h1_body_next(&c->resp_body, c->u.in + off, c->u.in_len - off, &used, &data, &dlen, &why);
    if (rc < 0) {
      free(g.buf);
      conn__consume(&c->u, off);
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed body");
      h1__upstream_failed_mid_response(c, reason);
      return;
    }
    if (dlen > 0) {
      gather_add(&g, data, dlen);
      c->x.req.bytes_in += dlen;
    }
    off += used;
    if (rc == 1 || used == 0)
      break;
  }
  conn__consume(&c->u, off);
  gather_flush(c, &g, &c->c, c->resp_out == RESP_OUT_CHUNKED, rc == 1, &c->resp_body);
  if (rc == 1)
    h1__finish_exchange(c);
}

static void pump_response(ce_conn_t *c, ce_h1_head_t **scratch);

void h1__pump_response(ce_conn_t *c) {
  ce_h1_head_t *scratch = NULL;
  pump_response(c, &scratch);
  free(scratch);
}

/* *scratch: the head record, taken at the first head to parse. */
static void pump_response(ce_conn_t *c, ce_h1_head_t **scratch) {
  while (!c->dead && c->state == ST_EXCHANGE && c->resp_state != RESP_DONE) {
    if (c->resp_state == RESP_BODY) {
      pump_response_body(c);
      return;
    }
    if (c->u.in_len == 0) {
      if (c->u.eof)
        h1__upstream_failed_mid_response(c, "conn__upstream_reset: closed before a response");
      return;
    }
    if (*scratch == NULL && (*scratch = head_scratch(c)) == NULL)
      return;
    const char *why = NULL;
    int rc = ce_h1_parse_response(c->u.in, c->u.in_len, c->method, strlen(c->method), *scratch, &why);
    if (rc == CE_EAGAIN) {
      if (c->u.eof)
        h1__upstream_failed_mid_response(c, "conn__upstream_reset: closed inside the response head");
      return;
    }
    if (rc != CE_OK) {
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed");
      h1__upstream_failed_mid_response(c, reason);
      return;
    }
    const ce_h1_head_t *h = *scratch;
    /* A 101 is checked before anything of it reaches the workspace: it
     * must not see "101 Switching Protocols" and then an error. */
    if (h->status == 101 && !c->req_upgrade) {
      h1__upstream_failed_mid_response(c, "upstream_bad_response: 101 without an upgrade request");
      return;
    }
    ce_reqinfo_set_response(&c->x.req, h, c->proxy->opts);
    c->x.req.bytes_in += h->head_len;
    bool interim = h->status >= 100 && h->status < 200 && h->status != 101;
    /* RFC 9110 §15.2: a proxy must not forward a 1xx to an HTTP/1.0
     * client (it would take it for the final response). */
    if (!(interim && !c->req_http11) && forward_response_head(c, h) != CE_OK) {
      h1__upstream_failed_mid_response(c, "upstream_bad_response: cannot be forwarded");
      return;
    }
    conn__consume(&c->u, h->head_len);
    if (interim)
      continue; /* interim (100 Continue, 103): the final one follows */
    if (h->status == 101) {
      conn__set_state(c, ST_TUNNEL);
      c->req_done = true;
      trace(c, "websocket tunnel");
      return;
    }
    c->resp_state = RESP_BODY;
    ce_h1_body_init(&c->resp_body, h->framing, h->content_length);
    /* An HTTP/1.0 workspace gets the body decoded: no place for trailers. */
    if (h->framing == CE_H1_BODY_CHUNKED && c->resp_out == RESP_OUT_CHUNKED)
      keep_trailers(c, &c->resp_body, &c->resp_trailers);
    if (h->framing == CE_H1_BODY_NONE) {
      h1__finish_exchange(c);
      return;
    }
  }
}

static void on_tunnel_shutdown(uv_shutdown_t *req, int status) {
  side_t *s = req->data;
  (void)status; /* done either way: the peer is gone or has our FIN */
  s->shut = SIDE_SHUT;
  if (!s->conn->dead)
    conn__process(s->conn);
}

/* No more bytes go to s: its TLS close_notify, then the TCP FIN once
 * everything queued is written (uv_shutdown waits for the writes). */
static void shutdown_side(side_t *s) {
  if (s->shut != SIDE_WRITING)
    return;
  s->shut = SIDE_SHUTTING;
  int rc = ce_transport_close_notify(s);
  if (rc == CE_OK) {
    conn__side_write(s, NULL, 0);
  } else if (rc != CE_EAGAIN) {
    conn__write_failed(s);
    return;
  }
  /* uv_shutdown waits only for what uv_write holds. */
  conn__side_flush(s);
  s->shut_req.data = s;
  if (!s->open || uv_shutdown(&s->shut_req, (uv_stream_t *)&s->tcp, on_tunnel_shutdown) != 0)
    s->shut = SIDE_SHUT;
}

/* After a 101: bytes both ways. Each direction ends on its own (TCP
 * half-close, as a WebSocket close handshake or a CONNECT-style stream
 * may use it): the end of one side's input is passed on as a shutdown of
 * the other's output once its bytes are written, and the other direction
 * keeps flowing. The tunnel is over when both directions are. */
void h1__pump_tunnel(ce_conn_t *c) {
  if (c->c.in_len > 0 && c->u.queued < CE_CONN_HIGH_WATER && c->u.shut == SIDE_WRITING) {
    conn__side_write(&c->u, c->c.in, c->c.in_len);
    c->x.req.bytes_out += c->c.in_len;
    c->c.in_len = 0;
  }
  if (c->u.in_len > 0 && c->c.queued < CE_CONN_HIGH_WATER && c->c.shut == SIDE_WRITING) {
    conn__side_write(&c->c, c->u.in, c->u.in_len);
    c->x.req.bytes_in += c->u.in_len;
    c->u.in_len = 0;
  }
  if (c->dead)
    return;
  if (c->c.eof && c->c.in_len == 0)
    shutdown_side(&c->u);
  if (c->u.eof && c->u.in_len == 0)
    shutdown_side(&c->c);
  if (c->c.shut == SIDE_SHUT && c->u.shut == SIDE_SHUT) {
    ce_exchange_finish(&c->x, NULL);
    conn__end_request(c);
    conn__set_state(c, ST_CLOSING);
    conn__abort(c);
  }
}
