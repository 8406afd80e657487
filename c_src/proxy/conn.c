/*
 * A proxied connection: see conn.h for the state machine and ownership.
 *
 * Re-entrancy: libuv callbacks (read, write, timer, resolver, connect) and
 * the control channel's decision callback all end in conn_process(), which
 * runs the state machine until it stops making progress. A flag on the
 * connection makes a nested call only ask the running one for another
 * round, so the state machine never runs inside itself (the h2o habit).
 * Closing is deferred the same way: conn_abort() only marks the connection
 * and closes its handles; memory goes in the last close callback.
 */
#include "proxy/conn_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "http1/parser.h"
#include "http1/writer.h"
#include "proxy/clienthello.h"
#include "proxy/event.h"
#include "proxy/netaddr.h"
#include "tls/context.h"
#include "tls/tlsconn.h"

/* ---- tracing ------------------------------------------------------------ */

static const char *const state_names[] = {"hello",    "handshake", "head",    "deciding", "connecting",
                                          "exchange", "tunnel",    "closing", "h2"};

/* Every state change goes through set_state() and is traced at debug
 * level with the connection id (common/trace.h). The macro wrapper keeps
 * the arguments unevaluated when debug traces are off. */
#define trace(c, fmt, ...) \
  CE_TRACE_D("proxy", 'c', (c)->id, "[%s] " fmt, state_names[(c)->state], ##__VA_ARGS__)

static void set_state(ce_conn_t *c, conn_state_t s) {
  if (c->state != s)
    trace(c, "-> %s", state_names[s]);
  c->state = s;
}

/* ---- forward declarations ---------------------------------------------- */

static void conn_process(ce_conn_t *c);
static void conn_abort(ce_conn_t *c);
static void side_write(side_t *s, const char *data, size_t len);
static void start_exchange(ce_conn_t *c);
static void upstream_failed_mid_response(ce_conn_t *c, const char *reason);
static void connect_next(ce_conn_t *c);
static void answer(ce_conn_t *c, int status, const char *body, bool keep);
static void preconnect_done(ce_conn_t *c, bool ok);
static void resolve_upstream(ce_conn_t *c);

/* ---- events -------------------------------------------------------------- */

static void emit(ce_conn_t *c, const char *name, const char *reason) {
  ce_event_emit(c->proxy->control, name, &c->req, reason);
}

/* A request record for a failure that happens before any request head
 * (TLS with the workspace, a missing ClientHello): what is known is the
 * destination and the SNI. */
static void begin_connection_record(ce_conn_t *c) {
  if (c->have_req)
    return;
  ce_reqinfo_init(&c->req, ++c->proxy->next_request_id, c->id);
  c->have_req = true;
  c->req.scheme = c->tls ? "https" : "http";
  c->req.port = c->port;
  snprintf(c->req.sni, sizeof(c->req.sni), "%s", c->sni_raw);
  snprintf(c->req.host, sizeof(c->req.host), "%s", c->sni.text);
}

static void end_request(ce_conn_t *c) {
  if (!c->have_req)
    return;
  ce_reqinfo_clear(&c->req);
  c->have_req = false;
  free(c->up_head);
  c->up_head = NULL;
  c->up_head_len = 0;
  /* The decoders keep no pointer into a freed buffer: a body still being
   * read (a connection closing) drops its trailers. */
  free(c->req_trailers);
  c->req_trailers = NULL;
  ce_h1_body_keep_trailers(&c->req_body, NULL);
  free(c->resp_trailers);
  c->resp_trailers = NULL;
  ce_h1_body_keep_trailers(&c->resp_body, NULL);
  c->failed_reported = false;
}

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

/* request_failed once per request; the record ends with it. */
static void report_failed(ce_conn_t *c, const char *reason) {
  if (c->abort_reason[0] == '\0')
    snprintf(c->abort_reason, sizeof(c->abort_reason), "%s", reason);
  begin_connection_record(c);
  if (c->failed_reported)
    return;
  c->failed_reported = true;
  c->req.closed_at_us = ce_now_us();
  emit(c, "request_failed", reason);
}

/* ---- buffers ------------------------------------------------------------- */

static void consume(side_t *s, size_t n) {
  if (n >= s->in_len) {
    s->in_len = 0;
    return;
  }
  memmove(s->in, s->in + n, s->in_len - n);
  s->in_len -= n;
}

/* An input buffer for s, from the proxy's pool (docs/proxy.md "Memory").
 * False when none can be had: the caller fails the connection. */
static bool take_input(side_t *s) {
  if (s->in == NULL)
    s->in = ce_bufpool_get(&s->conn->proxy->inbufs);
  return s->in != NULL;
}

void ce_conn_release_input(side_t *s) {
  if (s->in == NULL || s->in_len > 0)
    return;
  ce_bufpool_put(&s->conn->proxy->inbufs, s->in);
  s->in = NULL;
}

/* ---- closing ------------------------------------------------------------- */

static void maybe_free(ce_conn_t *c) {
  if (c->handles > 0 || c->resolving)
    return;
  ce_proxy_t *p = c->proxy;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    p->conns = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  end_request(c);
  ce_h2conn_free(c->h2);
  ce_h1h2_free(c->h1h2);
  ce_tlsconn_free(c->c.tls);
  ce_tlsconn_free(c->u.tls);
  c->c.in_len = c->u.in_len = 0;
  ce_conn_release_input(&c->c);
  ce_conn_release_input(&c->u);
  free(c->addrs);
  free(c);
  ce_proxy_conn_gone(p);
}

static void on_handle_closed(uv_handle_t *h) {
  ce_conn_t *c = h->data;
  c->handles--;
  if (h == (uv_handle_t *)&c->u.tcp) {
    c->u.closing = false;
    /* The next upstream address (or host) may use the handle now. */
    if (c->connect_pending && !c->dead) {
      c->connect_pending = false;
      connect_next(c);
    }
  }
  maybe_free(c);
}

static void side_close(side_t *s) {
  if (!s->open)
    return;
  s->open = false;
  s->reading = false;
  s->closing = true;
  /* The writes still queued on this handle come back cancelled (or done)
   * after it is gone; their bytes no longer count (see on_write). */
  s->gen++;
  s->queued = 0;
  uv_close((uv_handle_t *)&s->tcp, on_handle_closed);
}

/* Drops the upstream connection (a new host on a plain connection, or a
 * broken one); the connection itself lives on. */
static void upstream_reset(ce_conn_t *c) {
  ce_h1h2_free(c->h1h2);
  c->h1h2 = NULL;
  side_close(&c->u);
  ce_tlsconn_free(c->u.tls);
  c->u.tls = NULL;
  c->u.handshaken = false;
  c->u.connected = false;
  c->u.eof = false;
  c->u.close_notify = false;
  c->u.shut = c->u.shut_done = false;
  c->u.in_len = 0;
  ce_conn_release_input(&c->u);
  c->u.close_after_flush = false;
  c->up_h2 = false;
  c->up_host[0] = '\0';
}

static void conn_abort(ce_conn_t *c) {
  if (c->dead)
    return;
  /* Every open h2 stream gets its closing event (docs/http2.md §5). */
  if (c->state == ST_H2)
    ce_h2conn_abort(c, c->abort_reason[0] != '\0' ? c->abort_reason : "connection_aborted");
  c->dead = true;
  trace(c, "abort");
  if (c->ask_id != 0) {
    ce_control_cancel(c->proxy->control, c->ask_id);
    c->ask_id = 0;
  }
  side_close(&c->c);
  side_close(&c->u);
  ce_h2conn_close_handles(c);
  if (!uv_is_closing((uv_handle_t *)&c->timer))
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void update_reading(ce_conn_t *c);
static void arm(ce_conn_t *c, uint32_t ms);

/* An HTTP/1.1 upstream asked for h2 streams (ce_conn_h2_connect) is ready
 * (status 0) or failed: tell h2conn.c. False when none was being made. */
static bool h2_connect_end(ce_conn_t *c, int status, const char *reason) {
  if (!c->h2_connecting || c->dead)
    return false;
  c->h2_connecting = false;
  if (status != 0)
    upstream_reset(c);
  arm(c, c->proxy->opts->idle_ms);
  ce_h2conn_upstream_done(c, status, reason);
  conn_process(c);
  return true;
}

static void on_linger_shutdown(uv_shutdown_t *req, int status) {
  ce_conn_t *c = ((side_t *)req->data)->conn;
  c->c.shut_done = true;
  if (!c->dead && status < 0)
    conn_abort(c);
}

/*
 * Everything for the workspace has been written: close. A client that may
 * still be sending (an upload answered early, a refused body) first gets a
 * lingering close (RFC 9112 §9.6: a server should not close both halves at
 * once while the client may still be sending, or the reset that follows
 * can take the response with it): the write side is shut (the client sees
 * the end of the response), the upstream goes, and the client's input is
 * read and dropped until it closes or CE_CONN_LINGER_MS pass.
 */
static void finish_close(ce_conn_t *c) {
  if (c->dead)
    return;
  if (c->lingering || c->c.eof || !c->c.open || c->c.shut) {
    conn_abort(c);
    return;
  }
  upstream_reset(c);
  c->c.shut = true;
  c->c.shut_req.data = &c->c;
  if (uv_shutdown(&c->c.shut_req, (uv_stream_t *)&c->c.tcp, on_linger_shutdown) != 0) {
    conn_abort(c);
    return;
  }
  trace(c, "lingering close");
  c->lingering = true;
  c->c.in_len = 0;
  arm(c, CE_CONN_LINGER_MS);
  update_reading(c);
}

/* Closes once everything queued to the workspace has been written, under
 * the idle timeout (a client that reads nothing cannot hold it open). */
static void close_after_flush(ce_conn_t *c) {
  set_state(c, ST_CLOSING);
  arm(c, c->proxy->opts->idle_ms);
  if (c->c.tls != NULL && c->c.handshaken && c->c.open && !c->c.shut) {
    ce_tlsconn_shutdown(c->c.tls);
    side_write(&c->c, NULL, 0);
  }
  c->c.close_after_flush = true;
  if (c->c.queued == 0)
    finish_close(c);
}

/* ---- timers -------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  ce_conn_t *c = t->data;
  trace(c, "timeout");
  switch (c->state) {
  case ST_HELLO:
    /* With no byte there is no telling TLS from plain HTTP: the port the
     * workspace dialled is the best guess for the record's scheme. */
    if (c->c.in_len == 0)
      c->tls = c->port == 443;
    report_failed(c, "client_hello_timeout");
    break;
  case ST_HANDSHAKE:
    report_failed(c, "tls_client_handshake_timeout");
    break;
  case ST_HEAD:
    /* A refused request whose body never came was answered already; an
     * idle keep-alive connection simply ends: neither is a failure. */
    if (c->c.in_len > 0 && !c->denied_discard) {
      begin_connection_record(c);
      report_failed(c, "request_header_timeout");
    }
    break;
  case ST_CONNECTING:
    if (c->preconnecting) {
      preconnect_done(c, false);
      return;
    }
    report_failed(c, "upstream_unreachable: connect timed out");
    answer(c, 504, "condukt: upstream_unreachable: connect timed out\n", false);
    close_after_flush(c);
    return;
  case ST_DECIDING:
    /* The control channel owns the decide timeout; this cannot fire. */
    return;
  case ST_CLOSING:
    /* Flushing or lingering took too long: the request was reported. */
    break;
  case ST_H2:
    if (!c->hard_deadline && h2_connect_end(c, 504, "upstream_unreachable: connect timed out"))
      return;
    ce_h2conn_timeout(c);
    return;
  default:
    report_failed(c, c->resp_head_done ? "upstream_timeout: response body stalled"
                                       : "upstream_timeout: no response");
    break;
  }
  conn_abort(c);
}

static void arm(ce_conn_t *c, uint32_t ms) {
  if (!c->dead && !c->hard_deadline)
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ---- writing ------------------------------------------------------------- */

static void on_write(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  side_t *s = w->side;
  ce_conn_t *c = s->conn;
  /* A write from a handle closed since (an upstream dropped for another
   * host, or after a failure) is none of the current handle's business:
   * its bytes were uncounted when it closed, and its UV_ECANCELED is the
   * close the proxy asked for, not an error. */
  bool current = w->gen == s->gen;
  if (current)
    s->queued -= w->len;
  free(w);
  if (c->dead || !current || status == UV_ECANCELED)
    return;
  if (status < 0) {
    trace(c, "%s write failed: %s", s->name, uv_strerror(status));
    if (s != &c->c && c->state == ST_H2) {
      /* An upstream of h2 streams: they fail, the workspace goes on. */
      s->eof = true;
      conn_process(c);
      return;
    }
    if (s == &c->c)
      report_failed(c, "client_reset");
    else
      report_failed(c, "upstream_reset");
    conn_abort(c);
    return;
  }
  if (s->queued == 0 && s->close_after_flush) {
    if (s == &c->c)
      finish_close(c);
    else
      side_close(s);
    return;
  }
  conn_process(c);
}

static void raw_write(side_t *s, const char *data, size_t len) {
  ce_conn_t *c = s->conn;
  if (len == 0 || !s->open)
    return;
  write_req_t *w = malloc(sizeof(*w) + len);
  if (w == NULL) {
    report_failed(c, "out_of_memory");
    conn_abort(c);
    return;
  }
  memcpy(w->data, data, len);
  w->side = s;
  w->gen = s->gen;
  w->len = len;
  uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&s->tcp, &b, 1, on_write);
  if (rc < 0) {
    free(w);
    report_failed(c, s == &c->c ? "client_reset" : "upstream_reset");
    conn_abort(c);
    return;
  }
  s->queued += len;
}

/* Sends plaintext on a side (through TLS when the side has it) and any
 * TLS output that is pending (data NULL: only flush). */
static void side_write(side_t *s, const char *data, size_t len) {
  ce_conn_t *c = s->conn;
  if (c->dead || !s->open)
    return;
  if (s->tls == NULL) {
    raw_write(s, data, len);
    return;
  }
  if (len > 0 && ce_tlsconn_write(s->tls, (const uint8_t *)data, len) != CE_OK) {
    report_failed(c, s == &c->c ? "tls_client_error" : "upstream_tls: write failed");
    conn_abort(c);
    return;
  }
  size_t pending;
  while ((pending = ce_tlsconn_pending_out(s->tls)) > 0 && !c->dead) {
    write_req_t *w = malloc(sizeof(*w) + pending);
    if (w == NULL) {
      report_failed(c, "out_of_memory");
      conn_abort(c);
      return;
    }
    size_t n = ce_tlsconn_take_out(s->tls, (uint8_t *)w->data, pending);
    w->side = s;
    w->gen = s->gen;
    w->len = n;
    uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&s->tcp, &b, 1, on_write) < 0) {
      free(w);
      report_failed(c, s == &c->c ? "client_reset" : "upstream_reset");
      conn_abort(c);
      return;
    }
    s->queued += n;
  }
}

static void side_printf(side_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void side_printf(side_t *s, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  side_write(s, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
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
static void answer(ce_conn_t *c, int status, const char *body, bool keep) {
  size_t blen = strlen(body);
  side_printf(&c->c,
              "HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %zu\r\n"
              "cache-control: no-store\r\nx-condukt-egress: refused\r\n%s\r\n",
              status, status_phrase(status), blen, keep ? "" : "connection: close\r\n");
  side_write(&c->c, body, blen);
  if (c->have_req) {
    c->req.status = status;
    c->req.bytes_in += blen;
    if (c->req.responded_at_us == 0)
      c->req.responded_at_us = ce_now_us();
  }
}

/* Sanitised copy of text for a response body: printable ASCII only. */
static void plain(char *dst, size_t cap, const char *src) {
  size_t w = 0;
  for (size_t i = 0; src[i] != '\0' && w + 1 < cap; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[w++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  dst[w] = '\0';
}

/* Refuses the current request: the event (request_denied, or
 * request_failed for one already allowed), then 403/4xx in words. */
static void refuse_as(ce_conn_t *c, const char *event, int status, const char *event_reason, const char *text) {
  c->req.closed_at_us = ce_now_us();
  c->req.status = status;
  if (strcmp(event, "request_failed") == 0)
    c->failed_reported = true;
  emit(c, event, event_reason);
  /* A request whose body has not been read cannot be followed by another
   * on this connection unless the body is small enough to skip. A client
   * that sent Expect: 100-continue gets no 100 from a refusal and need not
   * send the body at all (RFC 9110 §10.1.1): waiting to skip it would take
   * its next request for the body, so that connection closes. During a
   * drain nothing more is taken: the answer says connection: close. */
  bool keep = c->req_keep_alive && !c->req_upgrade && !c->proxy->draining &&
              (c->req_framing == CE_H1_BODY_NONE ||
               (c->req_framing == CE_H1_BODY_LENGTH && !c->req_expect_continue &&
                c->req_body.remaining <= CE_CONN_DISCARD_MAX));
  answer(c, status, text, keep);
  if (keep && c->req_framing != CE_H1_BODY_NONE) {
    /* The body is skipped in ST_HEAD, whichever state refused (a decider
     * answers in ST_DECIDING), and under a timer like any wait for bytes. */
    c->denied_discard = true;
    set_state(c, ST_HEAD);
    arm(c, c->proxy->opts->idle_ms);
    return;
  }
  end_request(c);
  if (keep) {
    set_state(c, ST_HEAD);
    arm(c, c->proxy->opts->idle_ms);
  } else {
    close_after_flush(c);
  }
}

static void refuse(ce_conn_t *c, int status, const char *event_reason, const char *text) {
  refuse_as(c, "request_denied", status, event_reason, text);
}

void ce_conn_deny_text(char *out, size_t cap, const char *host, const char *who, const char *reason) {
  char h[CE_HOST_TEXT_MAX + 1], why[CE_CONN_DENY_REASON_MAX + 1];
  plain(h, sizeof(h), host);
  plain(why, sizeof(why), reason);
  snprintf(out, cap,
           "condukt: the network policy of this sandbox refused the request to %s\n"
           "refused by: %s\nreason: %s\n",
           h, who, why);
}

static void refuse_policy(ce_conn_t *c, int32_t rule, const char *kind, const char *reason) {
  char who[CE_CONN_DENY_WHO_MAX], text[CE_CONN_DENY_TEXT_MAX];
  if (rule >= 0)
    snprintf(who, sizeof(who), "rule %d (%s)", (int)rule, kind);
  else
    snprintf(who, sizeof(who), "the policy default");
  c->req.matched_rule = rule;
  c->req.matched_kind = kind;
  ce_conn_deny_text(text, sizeof(text), c->req.host, who, reason);
  refuse(c, 403, reason, text);
}

/* Refuses a request that never became a policy question (malformed,
 * misdirected). The event is request_denied with the reason given. */
static void refuse_request(ce_conn_t *c, int status, const char *reason, const char *detail) {
  char text[900], d[700];
  plain(d, sizeof(d), detail);
  snprintf(text, sizeof(text), "condukt: %s\n", d);
  refuse(c, status, reason, text);
}

/* Refuses a request already allowed (the private-address rule on its
 * retried connect): request_failed with the reason, the same answer. */
static void refuse_failed(ce_conn_t *c, int status, const char *reason, const char *detail) {
  char text[900], d[700];
  plain(d, sizeof(d), detail);
  snprintf(text, sizeof(text), "condukt: %s\n", d);
  refuse_as(c, "request_failed", status, reason, text);
}

/* An error before the head could be read fully: 400/431 and close. */
static void reject_head(ce_conn_t *c, int status, const char *why) {
  begin_connection_record(c);
  char reason[160];
  snprintf(reason, sizeof(reason), "%s: %s", status == 431 ? "request_header_too_large" : "bad_request", why);
  c->req.closed_at_us = ce_now_us();
  c->req.status = status;
  emit(c, "request_denied", reason);
  char text[300];
  snprintf(text, sizeof(text), "condukt: malformed request: %s\n", why);
  answer(c, status, text, false);
  close_after_flush(c);
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
   * An HTTP/1.1 upstream gets this head, an h2 one its fields (h1h2.c). */
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

/* ---- the upstream: resolve, check, connect, TLS ------------------------- */

/* Is addr usable as an upstream? Public addresses are; private, loopback
 * and link-local ones only when the policy allows their IP literal by an
 * allow rule or an --allow-private range covers them (DESIGN §4). */
static bool upstream_addr_ok(ce_conn_t *c, const struct sockaddr *sa, char *why, size_t cap) {
  if (!ce_addr_is_private(sa))
    return true;
  const ce_proxy_options_t *o = c->proxy->opts;
  const uint8_t *bytes;
  int family;
  if (sa->sa_family == AF_INET) {
    bytes = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
    family = 4;
  } else {
    bytes = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    family = 6;
  }
  for (size_t i = 0; i < o->allow_private_count; i++)
    if (ce_cidr_contains(&o->allow_private[i], family, bytes))
      return true;
  char text[CE_ADDR_TEXT_MAX];
  size_t n = ce_addr_text(sa, text);
  ce_verdict_t v;
  if (ce_policy_eval_host(c->proxy->policy, text, n, &v) == 0 && v.decision == CE_DECISION_ALLOW &&
      v.rule_index >= 0 && v.rule_kind == CE_RULE_ALLOW)
    return true;
  snprintf(why, cap, "upstream_private_address: %s", text);
  return false;
}

static void on_upstream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

static void upstream_ready(ce_conn_t *c) {
  if (h2_connect_end(c, 0, NULL))
    return;
  /* Only a connection still waiting for its upstream starts the exchange:
   * one that timed out (504, CLOSING) was answered already. */
  if (c->state != ST_CONNECTING)
    return;
  trace(c, "upstream %s:%u ready", c->up_host, (unsigned)c->up_port);
  if (c->preconnecting) {
    preconnect_done(c, true);
    return;
  }
  start_exchange(c);
}

static void upstream_handshake(ce_conn_t *c) {
  int rc = ce_tlsconn_handshake(c->u.tls);
  side_write(&c->u, NULL, 0);
  if (c->dead)
    return;
  if (rc == CE_OK) {
    c->u.handshaken = true;
    upstream_ready(c);
  } else if (rc != CE_EAGAIN) {
    if (c->preconnecting) {
      preconnect_done(c, false);
      return;
    }
    char reason[400];
    snprintf(reason, sizeof(reason), "upstream_tls: %s", ce_tlsconn_error(c->u.tls));
    if (h2_connect_end(c, 502, reason))
      return;
    report_failed(c, reason);
    char text[500];
    plain(text, sizeof(text), reason);
    char body[600];
    snprintf(body, sizeof(body), "condukt: %s\n", text);
    answer(c, 502, body, false);
    close_after_flush(c);
  }
}

/* A connect attempt failed (at once or later): the next address, else 502. */
static void connect_failed(ce_conn_t *c, int err) {
  trace(c, "connect failed: %s", uv_strerror(err));
  if (c->addrs != NULL && c->next_addr < c->addrs->count) {
    connect_next(c);
    return;
  }
  if (c->preconnecting) {
    preconnect_done(c, false);
    return;
  }
  char reason[200], body[300];
  snprintf(reason, sizeof(reason), "upstream_unreachable: %s", uv_strerror(err));
  if (h2_connect_end(c, 502, reason))
    return;
  report_failed(c, reason);
  snprintf(body, sizeof(body), "condukt: %s\n", reason);
  answer(c, 502, body, false);
  close_after_flush(c);
}

static void on_connected(uv_connect_t *req, int status) {
  ce_conn_t *c = req->data;
  /* After a timeout (504 sent, CLOSING) the attempt is moot: its handle
   * goes with the connection. */
  if (c->dead || (c->state != ST_CONNECTING && !c->h2_connecting) || (c->h2_connecting && status == UV_ECANCELED))
    return;
  if (status < 0) {
    side_close(&c->u);
    connect_failed(c, status);
    return;
  }
  c->u.connected = true;
  uv_tcp_nodelay(&c->u.tcp, 1);
  c->u.reading = true;
  uv_read_start((uv_stream_t *)&c->u.tcp, on_alloc, on_upstream_read);
  if (!c->tls) {
    upstream_ready(c);
    conn_process(c);
    return;
  }
  SSL *ssl;
  /* A pre-connect and a connection for an HTTP/1.1 workspace ask for h2
   * first (docs/http2.md §1, §6: an h2-only upstream is reached by
   * translation); the HTTP/1.1 upstreams of an h2 workspace's streams and
   * a WebSocket upgrade (no extended CONNECT here) ask for HTTP/1.1 only,
   * except the new connection after an h2 upstream's GOAWAY (h2_offer). */
  static const unsigned char alpn_h1[] = "\x08http/1.1";
  static const unsigned char alpn_both[] = "\x02h2\x08http/1.1";
  bool both = c->preconnecting || (c->h2_connecting ? c->h2_offer : !c->req_upgrade);
  const unsigned char *alpn = both ? alpn_both : alpn_h1;
  size_t alpn_len = both ? sizeof(alpn_both) - 1 : sizeof(alpn_h1) - 1;
  if (ce_tls_client_ssl_new(c->proxy->client_ctx, c->up_host, alpn, alpn_len, &ssl) != CE_OK ||
      ce_tlsconn_new(ssl, false, &c->u.tls) != CE_OK) {
    report_failed(c, "upstream_tls: cannot create a TLS session");
    conn_abort(c);
    return;
  }
  arm(c, c->proxy->opts->handshake_ms);
  upstream_handshake(c);
}

static void connect_next(ce_conn_t *c) {
  /* A uv_tcp_t may be initialised again only after its close callback:
   * until then the loop still holds it (after a failed connect, or an
   * upstream dropped for another host). on_handle_closed resumes here. */
  if (c->u.closing) {
    c->connect_pending = true;
    return;
  }
  if (c->addrs == NULL || c->next_addr >= c->addrs->count)
    return;
  const struct sockaddr *sa = (const struct sockaddr *)&c->addrs->addrs[c->next_addr++];
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    connect_failed(c, uv_translate_sys_error(errno));
    return;
  }
  /* The mark exempts this socket from the REDIRECT (docs/netfilter.md). A
   * sidecar that cannot set it would loop into itself: fail closed. */
  if (ce_set_mark(fd, c->proxy->opts->mark) != CE_OK) {
    close(fd);
    if (c->preconnecting) {
      preconnect_done(c, false);
      return;
    }
    if (h2_connect_end(c, 502, "upstream_unreachable: cannot set SO_MARK (the sidecar needs CAP_NET_ADMIN)"))
      return;
    report_failed(c, "upstream_unreachable: cannot set SO_MARK (the sidecar needs CAP_NET_ADMIN)");
    answer(c, 502, "condukt: the egress sidecar cannot mark its sockets (CAP_NET_ADMIN missing)\n", false);
    close_after_flush(c);
    return;
  }
  uv_tcp_init(c->proxy->loop, &c->u.tcp);
  c->u.tcp.data = c;
  c->handles++;
  c->u.open = true;
  int rc = uv_tcp_open(&c->u.tcp, fd);
  if (rc < 0) {
    close(fd);
    side_close(&c->u);
    connect_failed(c, rc);
    return;
  }
  c->connect_req.data = c;
  char text[CE_ADDR_TEXT_MAX];
  ce_addr_text(sa, text);
  trace(c, "connecting to %s port %u", text, (unsigned)c->up_port);
  /* An error at once (ENETUNREACH for a route-less or broadcast address)
   * is handled as a refused connect: the next address, else 502. */
  rc = uv_tcp_connect(&c->connect_req, &c->u.tcp, sa, on_connected);
  if (rc < 0) {
    side_close(&c->u);
    connect_failed(c, rc);
  }
}

/* ---- resolving (docs/dns.md) -------------------------------------------- */

typedef struct {
  ce_conn_t *c;
  ce_conn_resolved_cb cb;
  void *data;
  char host[256];
} resolve_ctx_t;

/* The words after "cannot resolve HOST: " for a lookup's status. */
static const char *lookup_error(int status) {
  switch (status) {
  case CE_ENOENT:
    return "no such host";
  case CE_ETIMEDOUT:
    return "the resolvers did not answer in time";
  case CE_EPROTO:
    return "a CNAME chain too long";
  case CE_ECLOSED:
    return "the proxy is shutting down";
  case CE_EUNAVAIL:
    return "no resolver answered";
  default:
    return ce_strerror(status);
  }
}

static void on_lookup(void *data, int status, const ce_dns_addrs_t *addrs) {
  resolve_ctx_t *x = data;
  ce_conn_t *c = x->c;
  ce_conn_resolved_cb cb = x->cb;
  void *cb_data = x->data;
  char reason[400] = "";
  ce_dns_addrs_t *keep = NULL;
  int outcome = 0;
  if (status != CE_OK) {
    snprintf(reason, sizeof(reason), "upstream_unreachable: cannot resolve %s: %s", x->host, lookup_error(status));
    outcome = 502;
  } else if ((keep = malloc(sizeof(*keep))) == NULL) {
    snprintf(reason, sizeof(reason), "upstream_unreachable: cannot resolve %s: out of memory", x->host);
    outcome = 502;
  } else {
    /* Keep only the addresses the proxy may use, in resolver order. */
    char why[200] = "";
    keep->count = 0;
    for (size_t i = 0; i < addrs->count; i++)
      if (upstream_addr_ok(c, (const struct sockaddr *)&addrs->addrs[i], why, sizeof(why)))
        keep->addrs[keep->count++] = addrs->addrs[i];
    if (keep->count == 0) {
      free(keep);
      keep = NULL;
      snprintf(reason, sizeof(reason), "%s", why[0] != '\0' ? why : "upstream_unreachable: no address");
      outcome = 403;
    }
  }
  free(x);
  cb(cb_data, outcome, keep, reason);
}

int ce_conn_resolve(ce_conn_t *c, const char *host, uint16_t port, ce_conn_resolved_cb cb, void *data) {
  resolve_ctx_t *x = malloc(sizeof(*x));
  if (x == NULL)
    return CE_ENOMEM;
  x->c = c;
  x->cb = cb;
  x->data = data;
  snprintf(x->host, sizeof(x->host), "%s", host);
  trace(c, "resolving %s", host);
  int rc = ce_dns_stub_lookup(c->proxy->dns, host, port, on_lookup, x);
  if (rc != CE_OK)
    free(x);
  return rc;
}

static void on_resolved(void *data, int status, ce_dns_addrs_t *keep, const char *reason) {
  ce_conn_t *c = data;
  c->resolving = false;
  if (c->dead || (c->state != ST_CONNECTING && !c->h2_connecting)) {
    /* Aborted, or answered meanwhile (the connect timeout's 504). */
    free(keep);
    maybe_free(c);
    return;
  }
  if (status != 0 && c->preconnecting) {
    preconnect_done(c, false);
    return;
  }
  if (status == 502) {
    char body[500];
    if (h2_connect_end(c, 502, reason))
      return;
    report_failed(c, reason);
    snprintf(body, sizeof(body), "condukt: %s\n", reason);
    answer(c, 502, body, false);
    close_after_flush(c);
    return;
  }
  /* A request connected again after its stream was refused (its
   * request_allowed went out): tied to the request, never to the next. */
  bool retry = c->retrying != 0 && c->have_req && c->retrying == c->req.id;
  c->retrying = 0;
  if (keep == NULL && h2_connect_end(c, 403, reason))
    return;
  if (keep == NULL) {
    /* Every address is private and nothing names it: a policy refusal;
     * for a retried request, that was allowed already, a failure (as
     * the h2 path's fail_queue). */
    const char *detail = "the network policy of this sandbox refused the request: the host resolves to a private, "
                         "loopback or link-local address that the policy does not name";
    if (retry)
      refuse_failed(c, 403, reason, detail);
    else
      refuse_request(c, 403, reason, detail);
    return;
  }
  c->addrs = keep;
  c->next_addr = 0;
  if (!c->preconnecting && !c->h2_connecting && !retry)
    emit(c, "request_allowed", NULL);
  connect_next(c);
}

/* Connects to the request's host (reusing a live upstream to the same
 * host and port), then starts the exchange. The allowed event is sent
 * once the resolved addresses passed the private-address check. */
static bool upstream_speaks_h2(ce_conn_t *c) {
  size_t n = 0;
  const char *p = c->u.tls != NULL ? ce_tlsconn_alpn(c->u.tls, &n) : NULL;
  return p != NULL && n == 2 && memcmp(p, "h2", 2) == 0;
}

static void connect_upstream(ce_conn_t *c) {
  bool h2_ok = !upstream_speaks_h2(c) || (!c->req_upgrade && (c->h1h2 == NULL || ce_h1h2_usable(c)));
  if (c->u.open && c->u.connected && !c->u.eof && c->u.in_len == 0 && strcmp(c->up_host, c->req.host) == 0 &&
      c->up_port == c->port && (!c->tls || c->u.handshaken) && h2_ok) {
    emit(c, "request_allowed", NULL);
    start_exchange(c);
    return;
  }
  if (c->u.open)
    upstream_reset(c);
  free(c->addrs);
  c->addrs = NULL;
  if (c->resolving) {
    /* A pre-connect's lookup still runs (it timed out): its request
     * structure is busy. */
    report_failed(c, "upstream_unreachable: the resolver is busy");
    answer(c, 502, "condukt: upstream_unreachable: the resolver is busy\n", false);
    close_after_flush(c);
    return;
  }
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->req.host);
  c->up_port = c->port;
  set_state(c, ST_CONNECTING);
  arm(c, c->proxy->opts->connect_ms);
  resolve_upstream(c);
}

static void resolve_upstream(ce_conn_t *c) {
  int rc = ce_conn_resolve(c, c->up_host, c->up_port, on_resolved, c);
  if (rc != CE_OK && c->preconnecting) {
    preconnect_done(c, false);
    return;
  }
  if (rc != CE_OK) {
    char reason[200];
    snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
             rc == CE_EAGAIN ? "the resolver is busy" : ce_strerror(rc));
    if (h2_connect_end(c, 502, reason))
      return;
    report_failed(c, reason);
    conn_abort(c);
    return;
  }
  c->resolving = true;
}

/* ---- decisions ----------------------------------------------------------- */

static void decided(ce_conn_t *c, bool allow, const char *reason) {
  c->req.matched_rule = c->decide_rule;
  c->req.matched_kind = "decide";
  if (allow) {
    connect_upstream(c);
  } else {
    char text[CE_CONN_DENY_TEXT_MAX], who[CE_CONN_DENY_WHO_MAX];
    snprintf(who, sizeof(who), "the decider of rule %d", (int)c->decide_rule);
    ce_conn_deny_text(text, sizeof(text), c->req.host, who, reason);
    refuse(c, 403, reason, text);
  }
}

bool ce_conn_decision_outcome(ce_proxy_t *p, int status, bool allow, const char *reason, bool cacheable,
                              bool cache, int32_t rule, const char *host, const char **why) {
  if (status != CE_OK) {
    *why = status == CE_ETIMEDOUT ? "decider_timeout" : "control_channel_unavailable";
    return false;
  }
  *why = allow ? NULL : (reason != NULL && reason[0] != '\0' ? reason : "denied_by_decider");
  if (cache && cacheable)
    ce_decision_cache_put(p, rule, host, allow, *why != NULL ? *why : "");
  return allow;
}

static void on_decision(void *data, int status, bool allow, const char *reason, bool cacheable) {
  ce_conn_t *c = data;
  c->ask_id = 0;
  if (c->dead || c->state != ST_DECIDING)
    return;
  const char *why;
  bool ok = ce_conn_decision_outcome(c->proxy, status, allow, reason, cacheable, c->decide_cache, c->decide_rule,
                                     c->req.host, &why);
  decided(c, ok, why);
  conn_process(c);
}

static void ask_decider(ce_conn_t *c, int32_t rule) {
  ce_rule_info_t info;
  if (ce_policy_rule(c->proxy->policy, (size_t)rule, &info) != 0) {
    refuse_policy(c, rule, "decide", "decider_error");
    return;
  }
  c->decide_rule = rule;
  c->decide_cache = info.cache;
  bool allow;
  const char *reason;
  if (info.cache && ce_decision_cache_get(c->proxy, rule, c->req.host, &allow, &reason)) {
    trace(c, "decision cache hit for %s", c->req.host);
    decided(c, allow, allow ? NULL : reason);
    return;
  }
  set_state(c, ST_DECIDING);
  uv_timer_stop(&c->timer);
  /* A request that cannot be written (out of memory, too long) fails the
   * ask: the callback denies with control_channel_unavailable. */
  c->ask_id = ce_event_ask(c->proxy->control, &c->req, rule, info.timeout_ms, on_decision, c);
  /* No ask (out of memory, the channel closing): no callback will come. */
  if (c->ask_id == 0)
    decided(c, false, "control_channel_unavailable");
}

/* ---- requests ------------------------------------------------------------ */

/* Splits "host", "host:port", "[v6]" or "[v6]:port". Returns false when the
 * port is malformed. */
static bool split_authority(const char *a, size_t n, size_t *host_len, long *port) {
  *port = -1;
  size_t hl = n;
  if (n > 0 && a[0] == '[') {
    const char *close = memchr(a, ']', n);
    if (close == NULL)
      return false;
    hl = (size_t)(close - a) + 1;
  } else {
    const char *colon = memchr(a, ':', n);
    if (colon != NULL)
      hl = (size_t)(colon - a);
  }
  if (hl < n) {
    if (a[hl] != ':' || hl + 1 == n || n - hl - 1 > 5)
      return false;
    long p = 0;
    for (size_t i = hl + 1; i < n; i++) {
      if (a[i] < '0' || a[i] > '9')
        return false;
      p = p * 10 + (a[i] - '0');
    }
    if (p == 0 || p > 65535)
      return false;
    *port = p;
  }
  *host_len = hl;
  return true;
}

void ce_conn_check_target(const ce_conn_t *c, const char *auth, size_t len, const char *method, size_t method_len,
                          const char *target, size_t target_len, const char *label, char *host,
                          size_t host_cap, ce_target_check_t *t) {
  memset(t, 0, sizeof(*t));
  if (auth == NULL || len == 0) {
    snprintf(host, host_cap, "%s", c->sni.text);
    t->status = 400;
    t->reason = "bad_request: missing host";
    snprintf(t->detail, sizeof(t->detail), "malformed request: the request names no host");
    return;
  }
  size_t host_len;
  long port;
  bool port_ok = split_authority(auth, len, &host_len, &port);
  ce_policy_eval_request(c->proxy->policy, auth, port_ok ? host_len : len, method, method_len, target, target_len,
                         &t->verdict);
  if (!port_ok || !t->verdict.host_valid) {
    size_t n = len < host_cap - 1 ? len : host_cap - 1;
    memcpy(host, auth, n);
    host[n] = '\0';
    t->status = 400;
    t->reason = "invalid_host";
    snprintf(t->detail, sizeof(t->detail), "malformed request: the %s is not a valid host name or address", label);
    return;
  }
  snprintf(host, host_cap, "%s", t->verdict.host.text);
  /* DESIGN §4: the request must name the host the connection was opened
   * for (TLS: the SNI, or the IP dialled when there was none) and its
   * port; anything else is domain fronting or coalescing: 421 (RFC 9110
   * §15.5.20). Plain HTTP may name any host per request: its upstream is
   * the host named, resolved by the proxy. */
  if (c->tls && strcmp(t->verdict.host.text, c->sni.text) != 0) {
    t->status = 421;
    t->reason = "misdirected_request";
    snprintf(t->detail, sizeof(t->detail),
             "misdirected request: the %s %s is not the TLS server name %s of this connection", label,
             t->verdict.host.text, c->sni.text);
    return;
  }
  if (port >= 0 && port != c->port) {
    t->status = 421;
    t->reason = "misdirected_request";
    snprintf(t->detail, sizeof(t->detail),
             "misdirected request: the %s names port %ld but this connection is to port %u", label, port,
             (unsigned)c->port);
    return;
  }
}

static void handle_request(ce_conn_t *c, const ce_h1_head_t *h) {
  ce_reqinfo_init(&c->req, ++c->proxy->next_request_id, c->id);
  c->have_req = true;
  c->req.scheme = c->tls ? "https" : "http";
  c->req.port = c->port;
  snprintf(c->req.sni, sizeof(c->req.sni), "%s", c->sni_raw);
  if (ce_reqinfo_set_request(&c->req, h, c->proxy->opts) != CE_OK) {
    report_failed(c, "out_of_memory");
    conn_abort(c);
    return;
  }
  c->req.bytes_out = h->head_len;
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
  c->resp_head_done = c->resp_done = false;
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
    snprintf(c->req.host, sizeof(c->req.host), "%s", c->sni.text);
    emit(c, "request_opened", NULL);
    refuse_request(c, 400, "bad_request: connect_not_supported",
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
  ce_target_check_t t;
  ce_conn_check_target(c, auth, auth_len, h->method, h->method_len, target, target_len, "Host", c->req.host,
                       sizeof(c->req.host), &t);
  emit(c, "request_opened", NULL);
  if (t.status != 0) {
    refuse_request(c, t.status, t.reason, t.detail);
    return;
  }
  ce_verdict_t v = t.verdict;
  ce_credential_request_t cred = {c->req.host, strlen(c->req.host), h->method, h->method_len, target, target_len, c->tls};
  int built = build_upstream_head(c, h, v.decision != CE_DECISION_DENY ? &cred : NULL);
  if (built == CE_ETOOBIG) {
    refuse_request(c, 431, "request_header_too_large", "the request head is too large to forward");
    return;
  }
  if (built != CE_OK) {
    refuse_request(c, 400, "bad_request: cannot be forwarded", "malformed request: it cannot be forwarded");
    return;
  }
  switch (v.decision) {
  case CE_DECISION_ALLOW:
    c->req.matched_rule = v.rule_index;
    c->req.matched_kind = v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL;
    connect_upstream(c);
    break;
  case CE_DECISION_DENY:
    refuse_policy(c, v.rule_index, v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL,
                  ce_reason_name(v.reason));
    break;
  case CE_DECISION_DECIDE:
    ask_decider(c, v.rule_index);
    break;
  }
}

static void process_head(ce_conn_t *c) {
  if (c->c.in_len == 0) {
    if (c->c.eof)
      close_after_flush(c);
    return;
  }
  const char *why = NULL;
  int rc = ce_h1_parse_request(c->c.in, c->c.in_len, &c->head, &why);
  if (rc == CE_EAGAIN) {
    if (c->c.eof) {
      begin_connection_record(c);
      report_failed(c, "client_reset: closed inside a request head");
      conn_abort(c);
      return;
    }
    /* The head started: from now on the header timeout applies, from its
     * first byte, whatever ran before (idle, or nothing). */
    if (!c->head_started) {
      c->head_started = true;
      arm(c, c->proxy->opts->header_ms);
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
  size_t head_len = c->head.head_len;
  handle_request(c, &c->head);
  /* Everything the proxy keeps from the head was copied: drop it. */
  consume(&c->c, head_len);
}

/* ---- the exchange -------------------------------------------------------- */

static void start_exchange(ce_conn_t *c) {
  set_state(c, ST_EXCHANGE);
  arm(c, c->proxy->opts->idle_ms);
  if (upstream_speaks_h2(c)) {
    /* docs/http2.md §6: the exchange is one stream of the upstream's
     * session (h1h2.c). */
    int rc = ce_h1h2_begin(c);
    if (rc != CE_OK) {
      upstream_reset(c);
      upstream_failed_mid_response(c, rc == CE_ENOMEM ? "out_of_memory"
                                                      : "bad_request: the request cannot be expressed in HTTP/2");
      return;
    }
    trace(c, "forwarded %s %s as an h2 stream", c->method, c->req.path != NULL ? c->req.path : "");
    return;
  }
  side_write(&c->u, c->up_head, c->up_head_len);
  trace(c, "forwarded %s %s", c->method, c->req.path != NULL ? c->req.path : "");
}

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

static bool gather_init(ce_conn_t *c, gather_t *g, size_t cap) {
  g->len = 0;
  g->buf = malloc(CE_CONN_CHUNK_HDR_MAX + cap + 7);
  if (g->buf == NULL) {
    report_failed(c, "out_of_memory");
    conn_abort(c);
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
  side_write(s, start, (size_t)(end - start));
  free(g->buf);
  g->buf = NULL;
  if (trailers) {
    _Static_assert(CE_H1_TRAILER_OUT_MAX <= CE_CONN_HEAD_OUT_MAX, "trailers are written in the head scratch");
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
    if (ce_h1_write_last_chunk_trailers(&w, body->keep, body->kept) != CE_OK) /* bounded: never */
      ce_h1_write_last_chunk(&w);
    side_write(s, w.buf, w.len);
  }
}

/* Moves request body bytes from the workspace to upstream. */
static void pump_request_body(ce_conn_t *c) {
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
      report_failed(c, reason);
      if (!c->resp_head_done) {
        char text[200];
        snprintf(text, sizeof(text), "condukt: malformed request body: %s\n", why != NULL ? why : "?");
        answer(c, 400, text, false);
        close_after_flush(c);
      } else {
        conn_abort(c);
      }
      return;
    }
    if (dlen > 0) {
      ce_reqinfo_add_preview(&c->req, data, dlen, c->proxy->opts->body_preview);
      gather_add(&g, data, dlen);
      c->req.bytes_out += dlen;
    }
    off += used;
    if (rc == 1) {
      c->req_done = true;
      break;
    }
    if (used == 0)
      break;
  }
  consume(&c->c, off);
  gather_flush(c, &g, &c->u, c->req_framing == CE_H1_BODY_CHUNKED, c->req_done, &c->req_body);
}

/* Discards the body of a refused request so the connection can go on. */
static void discard_request_body(ce_conn_t *c) {
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
  consume(&c->c, off);
  if (rc < 0 || (rc == 0 && c->c.eof && c->c.in_len == 0)) {
    /* Malformed, or the client stopped before the end: nothing follows. */
    c->denied_discard = false;
    end_request(c);
    close_after_flush(c);
    return;
  }
  if (rc == 1) {
    c->denied_discard = false;
    end_request(c);
    set_state(c, ST_HEAD);
    arm(c, c->proxy->opts->idle_ms);
  }
}

/* The response head as written to the workspace. */
static int forward_response_head(ce_conn_t *c, const ce_h1_head_t *h) {
  unsigned flags = 0;
  bool interim = h->status >= 100 && h->status < 200;
  if (h->status == 101) {
    flags |= CE_H1_W_UPGRADE;
  } else if (!interim) {
    c->resp_chunked_out = false;
    c->resp_close_out = false;
    if (!c->req_http11 && (h->framing == CE_H1_BODY_CHUNKED || h->framing == CE_H1_BODY_CLOSE)) {
      /* RFC 9112 §6.1: chunked must not be sent to an HTTP/1.0 client; it
       * gets the decoded body, delimited by the close (§6.3). */
      c->resp_close_out = true;
      if (h->framing == CE_H1_BODY_CHUNKED)
        flags |= CE_H1_W_DECHUNK;
    } else if (h->framing == CE_H1_BODY_CHUNKED) {
      c->resp_chunked_out = true;
    } else if (h->framing == CE_H1_BODY_CLOSE) {
      /* A body that ends at close goes to an HTTP/1.1 client chunked,
       * which keeps the connection usable. */
      c->resp_chunked_out = true;
    }
    if (c->resp_chunked_out)
      flags |= CE_H1_W_CHUNKED;
    c->resp_keep_alive = h->keep_alive && c->req_keep_alive && !c->resp_close_out && c->req_done &&
                         !c->proxy->draining;
    if (!c->resp_keep_alive)
      flags |= CE_H1_W_CLOSE;
  }
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, c->proxy->head_buf, CE_CONN_HEAD_OUT_MAX);
  int rc = ce_h1_write_response_head(&w, h, flags);
  if (rc == CE_OK)
    side_write(&c->c, c->proxy->head_buf, w.len);
  return rc;
}

static void finish_exchange(ce_conn_t *c) {
  c->resp_done = true;
  c->req.closed_at_us = ce_now_us();
  emit(c, "request_closed", NULL);
  bool keep = c->resp_keep_alive && c->req_done && !c->c.eof && !c->proxy->draining;
  end_request(c);
  /* A rest point: the TLS engines give back the room of their largest
   * read and write (docs/proxy.md "Memory of an idle connection"). */
  ce_tlsconn_trim(c->c.tls);
  ce_tlsconn_trim(c->u.tls);
  /* Bytes after a complete response (a HEAD or 304 answered with a body,
   * a Content-Length shorter than what came) would be read as the next
   * request's response (RFC 9112 §6.3 leaves no way to frame them): such
   * an upstream is not used again. */
  if (c->u.open && c->u.in_len > 0) {
    trace(c, "upstream sent %zu bytes after the response; not reusing it", c->u.in_len);
    upstream_reset(c);
  }
  if (!c->u.eof && c->u.open && !keep)
    upstream_reset(c);
  if (!keep) {
    close_after_flush(c);
    return;
  }
  set_state(c, ST_HEAD);
  arm(c, c->proxy->opts->idle_ms);
}

/* An idle upstream (between exchanges, or while a request is decided)
 * has nothing to say: whatever it sends cannot be a response to a request
 * it has not seen yet, so that upstream is dropped. */
static void drop_stray_upstream(ce_conn_t *c) {
  if (c->u.open && c->u.in_len > 0) {
    trace(c, "upstream sent %zu bytes between exchanges; dropping it", c->u.in_len);
    upstream_reset(c);
  }
}

static void upstream_failed_mid_response(ce_conn_t *c, const char *reason) {
  report_failed(c, reason);
  if (!c->resp_head_done) {
    char text[300];
    snprintf(text, sizeof(text), "condukt: %s\n", reason);
    answer(c, 502, text, false);
    close_after_flush(c);
  } else {
    /* The workspace already has part of the response: only a reset tells
     * it the body is incomplete. */
    conn_abort(c);
  }
}

/* Moves one round of response body to the workspace; finishes the
 * exchange at its end. */
static void pump_response_body(ce_conn_t *c) {
  if (c->u.in_len == 0) {
    if (!c->u.eof)
      return;
    if (c->resp_body.framing != CE_H1_BODY_CLOSE) {
      upstream_failed_mid_response(c, "upstream_reset: closed inside the response body");
      return;
    }
    /* RFC 8446 §6.1, RFC 9112 §9.8: over TLS only a close_notify ends a
     * body delimited by the close; a bare TCP close may be an attacker's
     * (or a crash) cutting it short. The workspace must not see a clean
     * end: the chunked body gets no last chunk, the connection a reset. */
    if (c->u.tls != NULL && !c->u.close_notify) {
      upstream_failed_mid_response(c, "upstream_tls: truncated: the server closed without close_notify");
      return;
    }
    if (c->resp_chunked_out)
      side_write(&c->c, "0\r\n\r\n", 5);
    c->resp_keep_alive = c->resp_keep_alive && c->resp_chunked_out;
    finish_exchange(c);
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
      consume(&c->u, off);
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed body");
      upstream_failed_mid_response(c, reason);
      return;
    }
    if (dlen > 0) {
      gather_add(&g, data, dlen);
      c->req.bytes_in += dlen;
    }
    off += used;
    if (rc == 1 || used == 0)
      break;
  }
  consume(&c->u, off);
  gather_flush(c, &g, &c->c, c->resp_chunked_out, rc == 1, &c->resp_body);
  if (rc == 1)
    finish_exchange(c);
}

static void pump_response(ce_conn_t *c) {
  while (!c->dead && c->state == ST_EXCHANGE && !c->resp_done) {
    if (c->resp_head_done) {
      pump_response_body(c);
      return;
    }
    if (c->u.in_len == 0) {
      if (c->u.eof)
        upstream_failed_mid_response(c, "upstream_reset: closed before a response");
      return;
    }
    const char *why = NULL;
    int rc = ce_h1_parse_response(c->u.in, c->u.in_len, c->method, strlen(c->method), &c->head, &why);
    if (rc == CE_EAGAIN) {
      if (c->u.eof)
        upstream_failed_mid_response(c, "upstream_reset: closed inside the response head");
      return;
    }
    if (rc != CE_OK) {
      char reason[200];
      snprintf(reason, sizeof(reason), "upstream_bad_response: %s", why != NULL ? why : "malformed");
      upstream_failed_mid_response(c, reason);
      return;
    }
    const ce_h1_head_t *h = &c->head;
    /* A 101 is checked before anything of it reaches the workspace: it
     * must not see "101 Switching Protocols" and then an error. */
    if (h->status == 101 && !c->req_upgrade) {
      upstream_failed_mid_response(c, "upstream_bad_response: 101 without an upgrade request");
      return;
    }
    ce_reqinfo_set_response(&c->req, h, c->proxy->opts);
    c->req.bytes_in += h->head_len;
    bool interim = h->status >= 100 && h->status < 200 && h->status != 101;
    /* RFC 9110 §15.2: a proxy must not forward a 1xx to an HTTP/1.0
     * client (it would take it for the final response). */
    if (!(interim && !c->req_http11) && forward_response_head(c, h) != CE_OK) {
      upstream_failed_mid_response(c, "upstream_bad_response: cannot be forwarded");
      return;
    }
    consume(&c->u, h->head_len);
    if (interim)
      continue; /* interim (100 Continue, 103): the final one follows */
    if (h->status == 101) {
      set_state(c, ST_TUNNEL);
      c->req_done = true;
      trace(c, "websocket tunnel");
      return;
    }
    c->resp_head_done = true;
    ce_h1_body_init(&c->resp_body, h->framing, h->content_length);
    /* An HTTP/1.0 workspace gets the body decoded: no place for trailers. */
    if (h->framing == CE_H1_BODY_CHUNKED && c->resp_chunked_out)
      keep_trailers(c, &c->resp_body, &c->resp_trailers);
    if (h->framing == CE_H1_BODY_NONE) {
      finish_exchange(c);
      return;
    }
  }
}

static void on_tunnel_shutdown(uv_shutdown_t *req, int status) {
  side_t *s = req->data;
  (void)status; /* done either way: the peer is gone or has our FIN */
  s->shut_done = true;
  if (!s->conn->dead)
    conn_process(s->conn);
}

/* No more bytes go to s: its TLS close_notify, then the TCP FIN once
 * everything queued is written (uv_shutdown waits for the writes). */
static void shutdown_side(side_t *s) {
  if (s->shut)
    return;
  s->shut = true;
  if (s->tls != NULL && s->handshaken && s->open) {
    ce_tlsconn_shutdown(s->tls);
    side_write(s, NULL, 0);
  }
  s->shut_req.data = s;
  if (!s->open || uv_shutdown(&s->shut_req, (uv_stream_t *)&s->tcp, on_tunnel_shutdown) != 0)
    s->shut_done = true;
}

/* After a 101: bytes both ways. Each direction ends on its own (TCP
 * half-close, as a WebSocket close handshake or a CONNECT-style stream
 * may use it): the end of one side's input is passed on as a shutdown of
 * the other's output once its bytes are written, and the other direction
 * keeps flowing. The tunnel is over when both directions are. */
static void pump_tunnel(ce_conn_t *c) {
  if (c->c.in_len > 0 && c->u.queued < CE_CONN_HIGH_WATER && !c->u.shut) {
    side_write(&c->u, c->c.in, c->c.in_len);
    c->req.bytes_out += c->c.in_len;
    c->c.in_len = 0;
  }
  if (c->u.in_len > 0 && c->c.queued < CE_CONN_HIGH_WATER && !c->c.shut) {
    side_write(&c->c, c->u.in, c->u.in_len);
    c->req.bytes_in += c->u.in_len;
    c->u.in_len = 0;
  }
  if (c->dead)
    return;
  if (c->c.eof && c->c.in_len == 0)
    shutdown_side(&c->u);
  if (c->u.eof && c->u.in_len == 0)
    shutdown_side(&c->c);
  if (c->c.shut_done && c->u.shut_done) {
    c->req.closed_at_us = ce_now_us();
    emit(c, "request_closed", NULL);
    end_request(c);
    set_state(c, ST_CLOSING);
    conn_abort(c);
  }
}

/* ---- TLS with the workspace --------------------------------------------- */

static void client_handshake(ce_conn_t *c) {
  int rc = ce_tlsconn_handshake(c->c.tls);
  side_write(&c->c, NULL, 0);
  if (c->dead)
    return;
  if (rc == CE_OK) {
    c->c.handshaken = true;
    trace(c, "TLS with the workspace established for %s", c->sni.text);
    size_t alen = 0;
    const char *ap = ce_tlsconn_alpn(c->c.tls, &alen);
    bool client_h2 = ap != NULL && alen == 2 && memcmp(ap, "h2", 2) == 0;
    /* With translation (docs/http2.md §6) the workspace gets h2 whatever
     * the upstream speaks. */
    if (client_h2) {
      set_state(c, ST_H2);
      arm(c, c->proxy->opts->idle_ms);
      if (ce_h2conn_start(c) != CE_OK) {
        report_failed(c, "out_of_memory");
        conn_abort(c);
      }
      return;
    }
    /* An h2 upstream for a workspace that did not take h2 is of no use
     * to the HTTP/1.1 path: the first request connects again. */
    if (c->up_h2)
      upstream_reset(c);
    set_state(c, ST_HEAD);
    arm(c, c->proxy->opts->idle_ms);
    return;
  }
  if (rc == CE_EAGAIN)
    return;
  /* The seeds' reason for a workspace that does not trust the session CA:
   * it answered our certificate with a fatal alert. */
  if (ce_tlsconn_peer_rejected_cert(c->c.tls)) {
    report_failed(c, "tls_client_rejected_ca");
  } else {
    char reason[300];
    snprintf(reason, sizeof(reason), "tls_client_error: %s", ce_tlsconn_error(c->c.tls));
    report_failed(c, reason);
  }
  conn_abort(c);
}

static void mint_and_handshake(ce_conn_t *c);

/* docs/http2.md §1: a workspace that offers h2 for a host the policy
 * allows learns what the upstream speaks before it is answered. */
static void start_preconnect(ce_conn_t *c) {
  c->preconnecting = true;
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->sni.text);
  c->up_port = c->port;
  set_state(c, ST_CONNECTING);
  arm(c, c->proxy->opts->connect_ms);
  trace(c, "pre-connecting to %s for its ALPN", c->up_host);
  resolve_upstream(c);
}

/* The pre-connect ended: on success the upstream stays (h2, or the first
 * HTTP/1.1 request's upstream); on failure it goes, and the first request
 * meets the failure again on its own path, answered in words. */
static void preconnect_done(ce_conn_t *c, bool ok) {
  if (!c->preconnecting || c->dead)
    return;
  c->preconnecting = false;
  c->up_h2 = false;
  if (ok && c->u.tls != NULL) {
    size_t n = 0;
    const char *p = ce_tlsconn_alpn(c->u.tls, &n);
    c->up_h2 = p != NULL && n == 2 && memcmp(p, "h2", 2) == 0;
  } else {
    upstream_reset(c);
  }
  trace(c, "pre-connect %s; upstream speaks %s", ok ? "done" : "failed", c->up_h2 ? "h2" : "http/1.1");
  uv_timer_stop(&c->timer);
  mint_and_handshake(c);
}

/* The ClientHello is complete: decide what certificate to show. */
static void start_client_tls(ce_conn_t *c, const ce_clienthello_t *hello) {
  c->tls = true;
  if (hello->has_sni) {
    snprintf(c->sni_raw, sizeof(c->sni_raw), "%s", hello->sni);
    c->has_sni = true;
    if (ce_host_normalize(hello->sni, hello->sni_len, &c->sni) != 0) {
      /* Not a name the policy could ever allow; nothing HTTP-framed can be
       * answered before TLS, so the connection is reset (DESIGN §4). */
      snprintf(c->sni.text, sizeof(c->sni.text), "%s", "");
      begin_connection_record(c);
      snprintf(c->req.host, sizeof(c->req.host), "%.*s", (int)(hello->sni_len < 200 ? hello->sni_len : 200),
               hello->sni);
      c->req.closed_at_us = ce_now_us();
      emit(c, "request_denied", "invalid_host");
      conn_abort(c);
      return;
    }
  } else {
    /* No SNI: the only name this connection has is the address dialled;
     * a request is allowed only when a rule names that IP literal. */
    ce_verdict_t v;
    ce_policy_eval_host(c->proxy->policy, c->sni.text, c->sni.len, &v);
    if (v.decision != CE_DECISION_ALLOW || v.rule_index < 0) {
      begin_connection_record(c);
      c->req.closed_at_us = ce_now_us();
      c->req.matched_rule = v.rule_index;
      c->req.matched_kind = v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL;
      emit(c, "request_denied", "no_sni");
      conn_abort(c);
      return;
    }
  }
  c->offers_h2 = hello->offers_h2;
  if (hello->offers_h2 && hello->has_sni && !c->proxy->draining) {
    ce_verdict_t v;
    ce_policy_eval_host(c->proxy->policy, c->sni.text, c->sni.len, &v);
    if (v.decision == CE_DECISION_ALLOW) {
      start_preconnect(c);
      return;
    }
  }
  mint_and_handshake(c);
}

/* Mints (or finds) the leaf and starts the handshake with the workspace,
 * offering the protocol the upstream chose (docs/http2.md §1). */
static void mint_and_handshake(ce_conn_t *c) {
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  SSL *ssl = NULL;
  static const unsigned char alpn_h1[] = "\x08http/1.1";
  static const unsigned char alpn_h2[] = "\x02h2";
  bool h2 = c->offers_h2 && c->has_sni;
  const unsigned char *alpn = h2 ? alpn_h2 : alpn_h1;
  size_t alpn_len = h2 ? sizeof(alpn_h2) - 1 : sizeof(alpn_h1) - 1;
  if (ce_leaf_get(c->proxy->leaves, c->sni.text, &cert, &key) != CE_OK ||
      ce_tls_server_ssl_new(c->proxy->server_ctx, cert, key, alpn, alpn_len, &ssl) != CE_OK ||
      ce_tlsconn_new(ssl, true, &c->c.tls) != CE_OK) {
    X509_free(cert);
    EVP_PKEY_free(key);
    report_failed(c, "tls_client_error: cannot mint a certificate");
    conn_abort(c);
    return;
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  /* The hello bytes (and anything after them) go to OpenSSL now. */
  if (ce_tlsconn_feed(c->c.tls, (const uint8_t *)c->c.in, c->c.in_len) != CE_OK) {
    report_failed(c, "out_of_memory");
    conn_abort(c);
    return;
  }
  c->c.in_len = 0;
  set_state(c, ST_HANDSHAKE);
  arm(c, c->proxy->opts->handshake_ms);
  client_handshake(c);
}

static void process_hello(ce_conn_t *c) {
  if (c->c.in_len == 0) {
    if (c->c.eof)
      conn_abort(c);
    return;
  }
  if ((unsigned char)c->c.in[0] != 22) {
    /* Plain HTTP (any other first byte): the Host header names the target,
     * and its head has begun: the header timeout runs from here. */
    c->tls = false;
    set_state(c, ST_HEAD);
    c->head_started = true;
    arm(c, c->proxy->opts->header_ms);
    return;
  }
  /* The buffer only grows while in HELLO: resume where the last read left
   * off (linear in the hello's size however it is split). */
  ce_clienthello_t hello;
  int rc = ce_clienthello_resume(&c->hello_state, (const uint8_t *)c->c.in, c->c.in_len, &hello);
  if (rc == CE_EAGAIN) {
    if (c->c.eof)
      conn_abort(c);
    return;
  }
  if (rc != CE_OK) {
    c->tls = true;
    begin_connection_record(c);
    c->req.closed_at_us = ce_now_us();
    emit(c, "request_denied", rc == CE_ETOOBIG ? "client_hello_too_large" : "bad_client_hello");
    conn_abort(c);
    return;
  }
  start_client_tls(c, &hello);
}

/* ---- reading ------------------------------------------------------------- */

/* Every read goes into the proxy's one read buffer: on_read_common feeds
 * the bytes to TLS or copies them into the side's input before it
 * returns. A plain side reads no more than its input has room for. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  ce_conn_t *c = h->data;
  side_t *s = (h == (uv_handle_t *)&c->c.tcp) ? &c->c : &c->u;
  size_t room = CE_CONN_READ_CHUNK;
  if (s->tls == NULL && CE_CONN_INPUT_MAX - s->in_len < room)
    room = CE_CONN_INPUT_MAX - s->in_len;
  *buf = uv_buf_init(c->proxy->read_buf, (unsigned)room);
}

/* Moves decrypted bytes into the input buffer while there is room. */
static void pump_tls_input(side_t *s) {
  ce_conn_t *c = s->conn;
  if (s->tls == NULL || !s->handshaken || c->dead)
    return;
  if (s->in_len < CE_CONN_INPUT_MAX && !s->eof && !take_input(s)) {
    report_failed(c, "out_of_memory");
    conn_abort(c);
    return;
  }
  while (s->in_len < CE_CONN_INPUT_MAX && !s->eof) {
    size_t n = 0;
    int rc = ce_tlsconn_read(s->tls, (uint8_t *)s->in + s->in_len, CE_CONN_INPUT_MAX - s->in_len, &n);
    if (rc == CE_OK) {
      s->in_len += n;
      continue;
    }
    if (rc == CE_EAGAIN)
      break;
    if (rc == CE_ECLOSED) {
      s->eof = true;
      s->close_notify = true;
      break;
    }
    if (s != &c->c && c->state == ST_H2 && (s != &c->u || !c->h2_connecting)) {
      /* The streams on it fail; the workspace's connection goes on. */
      s->eof = true;
      break;
    }
    char reason[300];
    if (s == &c->c)
      snprintf(reason, sizeof(reason), "tls_client_error: %s", ce_tlsconn_error(s->tls));
    else
      snprintf(reason, sizeof(reason), "upstream_tls: %s", ce_tlsconn_error(s->tls));
    report_failed(c, reason);
    conn_abort(c);
    return;
  }
  /* Reading may have produced output (TLS 1.3 key updates, alerts). */
  side_write(s, NULL, 0);
}

static void on_read_common(side_t *s, ssize_t nread, const uv_buf_t *buf) {
  ce_conn_t *c = s->conn;
  if (c->dead)
    return;
  if (c->lingering) {
    /* Dropped unread; the client's end (or an error) ends the linger. */
    if (nread < 0)
      conn_abort(c);
    return;
  }
  if (nread == 0)
    return;
  if (nread < 0) {
    if (nread != UV_EOF) {
      trace(c, "%s read error: %s", s->name, uv_strerror((int)nread));
      if (s == &c->u && c->state == ST_EXCHANGE) {
        upstream_failed_mid_response(c, "upstream_reset: connection reset");
        return;
      }
      if (s == &c->c && c->have_req && c->state != ST_HEAD) {
        report_failed(c, "client_reset");
        conn_abort(c);
        return;
      }
    }
    s->eof = true;
    uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
    if (s == &c->c && c->state == ST_HANDSHAKE) {
      /* A client that hangs up in the middle of our handshake most often
       * did so because it did not trust the certificate we showed. */
      if (ce_tlsconn_peer_rejected_cert(c->c.tls))
        report_failed(c, "tls_client_rejected_ca");
      else
        report_failed(c, "tls_client_closed_during_handshake");
      conn_abort(c);
      return;
    }
    if (s == &c->u && c->state == ST_CONNECTING && c->preconnecting) {
      preconnect_done(c, false);
      return;
    }
    if (s == &c->u && c->h2_connecting) {
      h2_connect_end(c, 502, "upstream_tls: the server closed during the handshake");
      return;
    }
    if (s == &c->u && c->state == ST_CONNECTING && c->u.tls != NULL && !c->u.handshaken) {
      report_failed(c, "upstream_tls: the server closed during the handshake");
      answer(c, 502, "condukt: upstream_tls: the server closed during the handshake\n", false);
      close_after_flush(c);
      return;
    }
    if (s == &c->u && c->state == ST_HEAD) {
      /* An idle upstream keep-alive connection went away: fine. */
      upstream_reset(c);
      return;
    }
    conn_process(c);
    return;
  }
  if (c->state == ST_EXCHANGE || c->state == ST_TUNNEL || c->state == ST_H2)
    arm(c, c->proxy->opts->idle_ms);
  if (s->tls == NULL) {
    /* on_alloc bounded nread by the input's room. */
    if (!take_input(s)) {
      report_failed(c, "out_of_memory");
      conn_abort(c);
      return;
    }
    memcpy(s->in + s->in_len, buf->base, (size_t)nread);
    s->in_len += (size_t)nread;
  } else {
    if (ce_tlsconn_feed(s->tls, (const uint8_t *)buf->base, (size_t)nread) != CE_OK) {
      report_failed(c, "out_of_memory");
      conn_abort(c);
      return;
    }
    if (!s->handshaken) {
      if (s == &c->c)
        client_handshake(c);
      else
        upstream_handshake(c);
      if (c->dead)
        return;
    }
  }
  conn_process(c);
}

static void on_client_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  ce_conn_t *c = st->data;
  on_read_common(&c->c, nread, buf);
}

static void on_upstream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  ce_conn_t *c = st->data;
  on_read_common(&c->u, nread, buf);
}

/* Reads from a side only while its input has room and the other side is
 * not backed up: this is all the flow control HTTP/1.1 needs. */
static void update_reading(ce_conn_t *c) {
  if (c->dead)
    return;
  side_t *sides[2] = {&c->c, &c->u};
  for (int i = 0; i < 2; i++) {
    side_t *s = sides[i], *other = sides[1 - i];
    if (!s->open || (s == &c->u && !c->u.connected))
      continue;
    bool want = !s->eof && s->in_len < CE_CONN_INPUT_MAX && other->queued < CE_CONN_HIGH_WATER &&
                (c->state != ST_CLOSING || (c->lingering && s == &c->c));
    /* With TLS, bytes can wait inside OpenSSL: stop reading the socket
     * while the plaintext buffer is full. */
    if (s->tls != NULL && s->in_len >= CE_CONN_INPUT_MAX - 1)
      want = false;
    if (want && !s->reading) {
      uv_read_start((uv_stream_t *)&s->tcp, on_alloc, s == &c->c ? on_client_read : on_upstream_read);
      s->reading = true;
    } else if (!want && s->reading) {
      uv_read_stop((uv_stream_t *)&s->tcp);
      s->reading = false;
    }
  }
  if (c->state == ST_H2)
    ce_h2conn_update_reading(c);
}

/* ---- the driver ---------------------------------------------------------- */

static void conn_process(ce_conn_t *c) {
  if (c->processing) {
    c->again = true;
    return;
  }
  c->processing = true;
  do {
    c->again = false;
    if (c->dead)
      break;
    pump_tls_input(&c->c);
    pump_tls_input(&c->u);
    if (c->dead)
      break;
    conn_state_t before = c->state;
    size_t cin = c->c.in_len, uin = c->u.in_len;
    switch (c->state) {
    case ST_HELLO:
      process_hello(c);
      break;
    case ST_HANDSHAKE:
      break;
    case ST_HEAD:
      if (c->h1h2 != NULL)
        ce_h1h2_idle(c);
      else
        drop_stray_upstream(c);
      if (c->denied_discard)
        discard_request_body(c);
      else
        process_head(c);
      break;
    case ST_DECIDING:
      if (c->h1h2 != NULL)
        ce_h1h2_idle(c);
      else
        drop_stray_upstream(c);
      break;
    case ST_CONNECTING:
      break;
    case ST_EXCHANGE:
      if (c->h1h2 != NULL) {
        ce_h1h2_process(c);
      } else {
        pump_request_body(c);
        pump_response(c);
      }
      if (c->state == ST_EXCHANGE && c->c.eof && !c->req_done) {
        report_failed(c, "client_reset: closed inside the request body");
        conn_abort(c);
      }
      break;
    case ST_TUNNEL:
      pump_tunnel(c);
      break;
    case ST_CLOSING:
      break;
    case ST_H2:
      ce_h2conn_process(c);
      break;
    }
    if (c->state != before || c->c.in_len != cin || c->u.in_len != uin)
      c->again = true;
  } while (c->again && !c->dead);
  c->processing = false;
  /* Drained inputs go back to the pool: an idle connection holds none. */
  ce_conn_release_input(&c->c);
  ce_conn_release_input(&c->u);
  update_reading(c);
}

/* ---- accepting ----------------------------------------------------------- */

void ce_conn_accept(ce_proxy_t *p, uv_stream_t *listener) {
  ce_conn_t *c = calloc(1, sizeof(*c));
  if (c == NULL) {
    /* Accept and drop so the listener does not spin on a pending socket. */
    uv_tcp_t tmp;
    uv_tcp_init(p->loop, &tmp);
    if (uv_accept(listener, (uv_stream_t *)&tmp) == 0)
      uv_close((uv_handle_t *)&tmp, NULL);
    uv_run(p->loop, UV_RUN_NOWAIT);
    CE_TRACE_E("proxy", 0, 0, "out of memory accepting a connection");
    return;
  }
  c->proxy = p;
  c->id = ++p->next_conn_id;
  c->c.conn = c->u.conn = c;
  c->c.name = "client";
  c->u.name = "upstream";
  c->decide_rule = -1;
  ce_clienthello_init(&c->hello_state);
  uv_tcp_init(p->loop, &c->c.tcp);
  c->c.tcp.data = c;
  c->c.open = true;
  c->handles++;
  uv_timer_init(p->loop, &c->timer);
  c->timer.data = c;
  c->handles++;
  c->next = p->conns;
  if (p->conns != NULL)
    p->conns->prev = c;
  p->conns = c;
  p->conn_count++;

  if (uv_accept(listener, (uv_stream_t *)&c->c.tcp) != 0) {
    conn_abort(c);
    return;
  }
  if (p->conn_count > p->opts->max_connections || p->draining) {
    CE_TRACE_W("proxy", 'c', c->id, "connection limit (%u) reached; resetting a new connection",
               (unsigned)p->opts->max_connections);
    uv_tcp_close_reset(&c->c.tcp, on_handle_closed);
    c->c.open = false;
    conn_abort(c);
    return;
  }
  uv_os_fd_t fd;
  uv_fileno((uv_handle_t *)&c->c.tcp, &fd);
  int rc = ce_original_dst(fd, &c->orig_dst);
  struct sockaddr_storage local;
  int llen = sizeof(local);
  uv_tcp_getsockname(&c->c.tcp, (struct sockaddr *)&local, &llen);
  if (rc != CE_OK || ce_addr_equal((struct sockaddr *)&c->orig_dst, (struct sockaddr *)&local)) {
    /* Not redirected: someone dialled the proxy port itself. There is no
     * destination to go to, and looping into ourselves must not happen.
     * From loopback that is one of the pod's own containers, every start
     * the sidecar's startupProbe (`condukt-egress ready`): closed all the
     * same, with a debug line only. Anything else is worth a warning. */
    struct sockaddr_storage peer;
    int plen = sizeof(peer);
    if (uv_tcp_getpeername(&c->c.tcp, (struct sockaddr *)&peer, &plen) == 0 &&
        ce_addr_is_loopback((struct sockaddr *)&peer))
      CE_TRACE_D("proxy", 'c', c->id, "not redirected, from loopback (a readiness check?); closing");
    else
      CE_TRACE_W("proxy", 'c', c->id, "not redirected (no original destination); closing");
    conn_abort(c);
    return;
  }
  c->port = ce_addr_port((struct sockaddr *)&c->orig_dst);
  /* Until a name is known, the connection is named by the address dialled. */
  char text[CE_ADDR_TEXT_MAX];
  size_t n = ce_addr_text((struct sockaddr *)&c->orig_dst, text);
  if (ce_host_normalize(text, n, &c->sni) != 0)
    snprintf(c->sni.text, sizeof(c->sni.text), "%s", text);
  uv_tcp_nodelay(&c->c.tcp, 1);
  trace(c, "accepted, original destination %s port %u", text, (unsigned)c->port);
  c->state = ST_HELLO;
  arm(c, p->opts->clienthello_ms);
  c->c.reading = true;
  uv_read_start((uv_stream_t *)&c->c.tcp, on_alloc, on_client_read);
}

void ce_conn_drain_all(ce_proxy_t *p) {
  for (ce_conn_t *c = p->conns; c != NULL; c = c->next) {
    if (c->dead)
      continue;
    if (c->state == ST_HEAD && c->c.in_len == 0 && !c->have_req) {
      conn_abort(c);
    } else if (c->state == ST_HELLO) {
      conn_abort(c);
    } else if (c->state == ST_H2) {
      ce_h2conn_drain(c);
    } else if (c->state == ST_HEAD && c->denied_discard) {
      /* Skipping a refused request's body is waiting for the next request:
       * idle too. Its answer goes out first, then a lingering close. */
      c->denied_discard = false;
      end_request(c);
      close_after_flush(c);
    }
  }
}

void ce_conn_abort_all(ce_proxy_t *p) {
  for (ce_conn_t *c = p->conns; c != NULL; c = c->next) {
    if (c->dead)
      continue;
    if (c->state == ST_H2)
      ce_h2conn_abort(c, "proxy_shutdown");
    else if (c->have_req)
      report_failed(c, "proxy_shutdown");
    conn_abort(c);
  }
}

/* ---- for h2conn.c (conn_internal.h) -------------------------------------- */

void ce_conn_side_write(side_t *s, const char *data, size_t len) { side_write(s, data, len); }
void ce_conn_report_failed(ce_conn_t *c, const char *reason) { report_failed(c, reason); }
void ce_conn_abort(ce_conn_t *c) { conn_abort(c); }
void ce_conn_close_after_flush(ce_conn_t *c) { close_after_flush(c); }
void ce_conn_hard_deadline(ce_conn_t *c) {
  if (c->dead || c->hard_deadline)
    return;
  uint32_t ms = c->proxy->opts->idle_ms < CE_CONN_LINGER_MS ? c->proxy->opts->idle_ms : CE_CONN_LINGER_MS;
  arm(c, ms);
  c->hard_deadline = true;
}
void ce_conn_upstream_reset(ce_conn_t *c) { upstream_reset(c); }
void ce_conn_process(ce_conn_t *c) { conn_process(c); }
void ce_conn_pump_tls_input(side_t *s) { pump_tls_input(s); }
void ce_conn_release(ce_conn_t *c) {
  c->handles--;
  maybe_free(c);
}
void ce_conn_touch(ce_conn_t *c) {
  if (c->state == ST_H2)
    arm(c, c->proxy->opts->idle_ms);
}
void ce_conn_failed_mid_response(ce_conn_t *c, const char *reason) { upstream_failed_mid_response(c, reason); }
void ce_conn_finish_exchange(ce_conn_t *c) { finish_exchange(c); }
void ce_conn_retry_exchange(ce_conn_t *c) {
  upstream_reset(c);
  c->retrying = c->req.id;
  trace(c, "the upstream refused the stream; connecting again for %s", c->req.host);
  connect_upstream(c);
}

void ce_conn_h2_connect(ce_conn_t *c, bool offer_h2) {
  if (c->dead || c->h2_connecting)
    return;
  c->h2_offer = offer_h2;
  if (c->u.open)
    upstream_reset(c);
  free(c->addrs);
  c->addrs = NULL;
  if (c->resolving) {
    ce_h2conn_upstream_done(c, 502, "upstream_unreachable: the resolver is busy");
    return;
  }
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->sni.text);
  c->up_port = c->port;
  c->h2_connecting = true;
  trace(c, "h2: connecting %s for HTTP/1.1 streams", c->up_host);
  arm(c, c->proxy->opts->connect_ms);
  resolve_upstream(c);
}

void ce_conn_emit(ce_conn_t *c, const ce_reqinfo_t *r, const char *name, const char *reason) {
  ce_event_emit(c->proxy->control, name, r, reason);
}

