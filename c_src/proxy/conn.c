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
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "http1/parser.h"
#include "http1/writer.h"
#include "proxy/clienthello.h"
#include "proxy/event.h"
#include "proxy/connector.h"
#include "proxy/exchange.h"
#include "proxy/netaddr.h"
#include "proxy/transport.h"
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

void conn__set_state(ce_conn_t *c, conn_state_t s) {
  if (c->state != s)
    trace(c, "-> %s", state_names[s]);
  c->state = s;
}

/* ---- forward declarations ---------------------------------------------- */

static void maybe_free(ce_conn_t *c);
static void on_handle_closed(uv_handle_t *h);
static void side_close(side_t *s);
static bool h2_connect_end(ce_conn_t *c, int status, const char *reason);
static void on_linger_shutdown(uv_shutdown_t *req, int status);
static void finish_close(ce_conn_t *c);
static void on_timer(uv_timer_t *t);
static void conn_release_idle(ce_conn_t *c);
static void conn_release_idle_h2(ce_conn_t *c);
static void h2_rest_arm(ce_conn_t *c);
static bool socket_has_input(side_t *s);
static void on_write(uv_write_t *req, int status);
static void upstream_ready(ce_conn_t *c);
static void upstream_failed(ce_conn_t *c, int status, const char *reason);
static void up_close(ce_connector_t *k);
static void up_flush(ce_connector_t *k);
static void up_reading(ce_connector_t *k);
static void up_resolved(ce_connector_t *k);
static void up_done(ce_connector_t *k, int status, const char *reason);
static void upstream_connect(ce_conn_t *c);
static void client_handshake(ce_conn_t *c);
static void start_preconnect(ce_conn_t *c);
static void preconnect_done(ce_conn_t *c, bool ok);
static void start_client_tls(ce_conn_t *c, const ce_clienthello_t *hello);
static void mint_and_handshake(ce_conn_t *c);
static void process_hello(ce_conn_t *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void pump_input(side_t *s);
static void on_read_common(side_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_client_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_upstream_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void update_reading(ce_conn_t *c);

/* ---- events -------------------------------------------------------------- */

void ce_conn_exchange_conn(const ce_conn_t *c, ce_exchange_conn_t *out) {
  *out = (ce_exchange_conn_t){
      .proxy = c->proxy,
      .channel = c->proxy->channel != NULL ? c->proxy->channel : &ce_exchange_control_channel,
      .channel_ctx = c->proxy->channel != NULL ? c->proxy->channel_ctx : c->proxy->control,
      .conn_id = c->id,
      .tls = c->tls,
      .port = c->port,
      .sni_raw = c->sni_raw,
      .name = &c->sni,
  };
}

/* A request record for a failure that happens before any request head
 * (TLS with the workspace, a missing ClientHello): what is known is the
 * destination and the SNI. */
void conn__begin_connection_record(ce_conn_t *c) {
  if (ce_exchange_is_open(&c->x))
    return;
  ce_exchange_conn_t info;
  ce_conn_exchange_conn(c, &info);
  ce_exchange_open(&c->x, &info, 0);
}

void conn__end_request(ce_conn_t *c) {
  if (!ce_exchange_is_open(&c->x))
    return;
  ce_exchange_end(&c->x);
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
}

/* request_failed once per request; the record ends with it. */
void conn__report_failed(ce_conn_t *c, const char *reason) {
  if (c->abort_reason[0] == '\0')
    snprintf(c->abort_reason, sizeof(c->abort_reason), "%s", reason);
  conn__begin_connection_record(c);
  ce_exchange_finish(&c->x, reason);
}

/* ---- buffers ------------------------------------------------------------- */

void conn__consume(side_t *s, size_t n) {
  if (n >= s->in_len) {
    s->in_len = 0;
    return;
  }
  memmove(s->in, s->in + n, s->in_len - n);
  s->in_len -= n;
}

/* An input buffer for s, from the proxy's pool (docs/proxy.md "Memory").
 * False when none can be had: the caller fails the connection. */
bool conn__take_input(side_t *s) {
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

bool conn__take_record(side_t *s) {
  ce_bufpool_t *pool = &s->conn->proxy->recbufs;
  if (pool->size == 0)
    ce_bufpool_init(pool, CE_CONN_RECORD, CE_CONN_SPARE_RECORDS);
  if (s->rec == NULL)
    s->rec = ce_bufpool_get(pool);
  return s->rec != NULL;
}

void conn__release_record(side_t *s) {
  if (s->rec == NULL || s->rec_len > 0)
    return;
  ce_bufpool_put(&s->conn->proxy->recbufs, s->rec);
  s->rec = NULL;
}

/* ---- closing ------------------------------------------------------------- */

static void maybe_free(ce_conn_t *c) {
  if (c->handles > 0)
    return;
  ce_proxy_t *p = c->proxy;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    p->conns = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  conn__end_request(c);
  ce_h2conn_free(c->h2);
  ce_h1h2_free(c->h1h2);
  ce_tlsconn_free(c->c.tls);
  ce_tlsconn_free(c->u.tls);
  c->c.in_len = c->u.in_len = 0;
  ce_conn_release_input(&c->c);
  ce_conn_release_input(&c->u);
  c->c.rec_len = c->u.rec_len = 0;
  conn__release_record(&c->c);
  conn__release_record(&c->u);
  ce_connector_reset(&c->uk);
  free(c);
  ce_proxy_conn_gone(p);
}

static void on_handle_closed(uv_handle_t *h) {
  ce_conn_t *c = h->data;
  c->handles--;
  if (h == (uv_handle_t *)&c->u.tcp) {
    c->u.closing = false;
    /* The next upstream address (or host) may use the handle now. */
    ce_connector_closed(&c->uk);
  }
  maybe_free(c);
}

void ce_conn_side_close(side_t *s, uv_close_cb closed) {
  if (!s->open)
    return;
  /* What the side was given this turn goes to the socket first, as if it
   * had been written when given (an answer followed by an abort); a
   * failed write closes the side itself. */
  conn__side_flush(s);
  if (!s->open)
    return;
  s->open = false;
  s->reading = false;
  s->closing = true;
  /* The writes still queued on this handle come back cancelled (or done)
   * after it is gone; their bytes no longer count (see on_write). */
  s->gen++;
  s->queued = 0;
  s->pending = 0;
  uv_close((uv_handle_t *)&s->tcp, closed);
}

static void side_close(side_t *s) { ce_conn_side_close(s, on_handle_closed); }

/* Drops the upstream connection (a new host on a plain connection, or a
 * broken one); the connection itself lives on. */
void conn__upstream_reset(ce_conn_t *c) {
  ce_h1h2_free(c->h1h2);
  c->h1h2 = NULL;
  ce_connector_reset(&c->uk);
  side_close(&c->u);
  ce_transport_reset(&c->u);
  ce_conn_release_input(&c->u);
  c->up_h2 = false;
  c->up_host[0] = '\0';
}

void conn__abort(ce_conn_t *c) {
  if (c->dead)
    return;
  /* Every open h2 stream gets its closing event (docs/http2.md §5). */
  if (c->state == ST_H2)
    ce_h2conn_abort(c, c->abort_reason[0] != '\0' ? c->abort_reason : "connection_aborted");
  c->dead = true;
  trace(c, "abort");
  ce_exchange_cancel(&c->x);
  side_close(&c->c);
  side_close(&c->u);
  ce_h2conn_close_handles(c);
  if (!uv_is_closing((uv_handle_t *)&c->timer))
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* An HTTP/1.1 upstream asked for h2 streams (ce_conn_h2_connect) is ready
 * (status 0) or failed: tell the HTTP/2 path. False when none was being made. */
static bool h2_connect_end(ce_conn_t *c, int status, const char *reason) {
  if (c->up_for != CE_UP_FOR_H2_STREAMS || c->dead)
    return false;
  c->up_for = CE_UP_FOR_REQUEST;
  if (status != 0)
    conn__upstream_reset(c);
  conn__arm(c, c->proxy->opts->idle_ms);
  ce_h2conn_upstream_done(c, status, reason);
  conn__process(c);
  return true;
}

static void on_linger_shutdown(uv_shutdown_t *req, int status) {
  ce_conn_t *c = ((side_t *)req->data)->conn;
  c->c.shut = SIDE_SHUT;
  if (!c->dead && status < 0)
    conn__abort(c);
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
  if (c->lingering || c->c.eof || !c->c.open || c->c.shut != SIDE_WRITING) {
    conn__abort(c);
    return;
  }
  conn__upstream_reset(c);
  /* The close_notify the caller queued goes ahead of the FIN. */
  conn__side_flush(&c->c);
  if (c->dead)
    return;
  c->c.shut = SIDE_SHUTTING;
  c->c.shut_req.data = &c->c;
  if (uv_shutdown(&c->c.shut_req, (uv_stream_t *)&c->c.tcp, on_linger_shutdown) != 0) {
    conn__abort(c);
    return;
  }
  trace(c, "lingering close");
  c->lingering = true;
  c->c.in_len = 0;
  conn__arm(c, CE_CONN_LINGER_MS);
  update_reading(c);
}

/* Closes once everything queued to the workspace has been written, under
 * the idle timeout (a client that reads nothing cannot hold it open). */
void conn__close_after_flush(ce_conn_t *c) {
  conn__set_state(c, ST_CLOSING);
  conn__arm(c, c->proxy->opts->idle_ms);
  int rc = c->c.shut == SIDE_WRITING ? ce_transport_close_notify(&c->c) : CE_EAGAIN;
  if (rc == CE_OK) {
    /* Written now, so that it counts in what is queued: the close waits
     * for it like for the rest. */
    conn__side_write(&c->c, NULL, 0);
    conn__side_flush(&c->c);
  } else if (rc != CE_EAGAIN) {
    /* The end of the answer is lost: not a clean end. */
    conn__write_failed(&c->c);
  }
  if (c->dead)
    return;
  c->c.close_after_flush = true;
  if (c->c.queued == 0)
    finish_close(c);
}

/* ---- timers -------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  ce_conn_t *c = t->data;
  trace(c, "%s", c->release_due ? "idle release due" : "timeout");
  switch (c->state) {
  case ST_HELLO:
    /* With no byte there is no telling TLS from plain HTTP: the port the
     * workspace dialled is the best guess for the record's scheme. */
    if (c->c.in_len == 0)
      c->tls = c->port == 443;
    conn__report_failed(c, "client_hello_timeout");
    break;
  case ST_HANDSHAKE:
    conn__report_failed(c, "tls_client_handshake_timeout");
    break;
  case ST_HEAD:
    if (c->release_due && c->c.in_len == 0 && !c->denied_discard && !ce_exchange_is_open(&c->x)) {
      /* --idle-release-ms of the idle timeout passed: the connection
       * rests, then waits out the rest of the timeout. */
      conn_release_idle(c);
      if (!c->dead)
        conn__arm(c, c->proxy->opts->idle_ms - c->proxy->opts->release_ms);
      return;
    }
    /* A refused request whose body never came was answered already; an
     * idle keep-alive connection simply ends: neither is a failure. */
    if (c->c.in_len > 0 && !c->denied_discard) {
      conn__begin_connection_record(c);
      conn__report_failed(c, "request_header_timeout");
    }
    break;
  case ST_CONNECTING:
    if (c->up_for == CE_UP_FOR_PRECONNECT) {
      preconnect_done(c, false);
      return;
    }
    ce_connector_reset(&c->uk); /* a late lookup or connect is dropped */
    conn__report_failed(c, "upstream_unreachable: connect timed out");
    h1__answer(c, 504, "condukt: upstream_unreachable: connect timed out\n", false);
    conn__close_after_flush(c);
    return;
  case ST_DECIDING:
    /* The control channel owns the decide timeout; the timer runs only
     * while the question waits for the body it carries. */
    ce_exchange_body(&c->x, true);
    conn__process(c);
    return;
  case ST_CLOSING:
    /* Flushing or lingering took too long: the request was reported. */
    break;
  case ST_H2:
    if (c->release_due) {
      /* --idle-release-ms at rest (h2_rest_arm): the upstreams go, then
       * what is left of the idle timeout runs. Not when the workspace's
       * bytes wait in the socket (libuv runs timers before it reads): a
       * stream that came would only have to connect again; the read
       * starts the wait over. */
      uint32_t left = c->idle_after_release;
      if (ce_h2conn_releasable(c) && !socket_has_input(&c->c))
        conn_release_idle_h2(c);
      if (!c->dead)
        conn__arm(c, left); /* clears release_due */
      return;
    }
    if (!c->hard_deadline && h2_connect_end(c, 504, "upstream_unreachable: connect timed out"))
      return;
    ce_h2conn_timeout(c);
    return;
  default:
    conn__report_failed(c, c->resp_state != RESP_WAIT_HEAD ? "upstream_timeout: response body stalled"
                                       : "upstream_timeout: no response");
    break;
  }
  conn__abort(c);
}

void conn__arm(ce_conn_t *c, uint32_t ms) {
  c->release_due = false;
  if (!c->dead && !c->hard_deadline)
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

void conn__await_request(ce_conn_t *c) {
  conn__set_state(c, ST_HEAD);
  uint32_t idle = c->proxy->opts->idle_ms, release = c->proxy->opts->release_ms;
  bool rest = release > 0 && release < idle && c->c.in_len == 0 && !c->denied_discard && !c->hard_deadline;
  conn__arm(c, rest ? release : idle);
  c->release_due = rest;
}

/* ---- idle connections ---------------------------------------------------- */

/* The heap pages the releases freed go back to the system a moment after
 * the last of them (glibc keeps freed memory in the middle of its heap
 * otherwise: a thousand connections released one by one would leave their
 * upstreams' memory counted in the process's RSS). One malloc_trim per
 * CE_CONN_TRIM_MS at most, whatever the number of releases. */
#define CE_CONN_TRIM_MS 200u

static void trim_arm(ce_proxy_t *p);

static void on_trim_closed(uv_handle_t *h) {
  ce_proxy_t *p = h->data;
  p->trim_state = 0;
  if (p->trim_again) {
    p->trim_again = false;
    trim_arm(p);
  }
}

static void on_trim(uv_timer_t *t) {
  ce_proxy_t *p = t->data;
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  p->trim_state = 2;
  uv_close((uv_handle_t *)&p->trim_timer, on_trim_closed);
}

static void trim_arm(ce_proxy_t *p) {
  if (p->trim_state == 2)
    p->trim_again = true;
  if (p->trim_state != 0 || p->draining)
    return;
  uv_timer_init(p->loop, &p->trim_timer);
  p->trim_timer.data = p;
  uv_timer_start(&p->trim_timer, on_trim, CE_CONN_TRIM_MS, 0);
  p->trim_state = 1;
}

/*
 * A keep-alive connection idle for --idle-release-ms gives back what only
 * an exchange needs (docs/proxy.md, "Idle connections"): its upstream
 * connection (nghttp2 session, TLS and socket; an h2 upstream gets its
 * GOAWAY and a TLS one its close_notify first) and the room of its TLS
 * buffers. The next request
 * connects again on its own path (resolver, private-address rule, marked
 * socket, TLS verified for the host, resumed from the session store),
 * after its own evaluation, as the first request did.
 */
/* The workspace's TLS ciphertext buffers (a few KiB after a small
 * exchange, the BIOs' room) go; the next request grows them again. Not at
 * every exchange's end: they would re-grow per request. True when there
 * was room to release (the connection may be dead after: a failed flush). */
static bool release_workspace_tls(ce_conn_t *c) {
  if (ce_tlsconn_releasable(c->c.tls) == 0)
    return false;
  /* Only empty buffers are released: what this turn gathered goes first. */
  conn__side_flush(&c->c);
  if (c->dead)
    return false;
  ce_tlsconn_release(c->c.tls);
  return true;
}

static void conn_release_idle(ce_conn_t *c) {
  c->release_due = false;
  bool released = false;
  if (c->u.open || ce_connector_busy(&c->uk)) {
    if (ce_transport_ready(&c->u) && c->u.shut == SIDE_WRITING && !c->u.eof) {
      if (c->h1h2 != NULL)
        ce_h1h2_goaway(c);
      /* Nothing of an exchange is in flight: a failure only loses the
       * close_notify of a connection that goes anyway. */
      if (ce_transport_close_notify(&c->u) == CE_OK)
        conn__side_write(&c->u, NULL, 0);
      if (c->dead)
        return;
    }
    trace(c, "idle: the upstream %s:%u is released", c->up_host, (unsigned)c->up_port);
    conn__upstream_reset(c);
    released = true;
  }
  if (release_workspace_tls(c))
    released = true;
  if (released && !c->dead)
    trim_arm(c->proxy);
}

/*
 * The same for an h2 workspace connection with no stream left
 * (ce_h2conn_releasable): every upstream connection of its pool goes, and
 * the workspace's TLS buffers' room. Its session with the workspace stays
 * as it is (no GOAWAY: the connection is not closing).
 */
static void conn_release_idle_h2(ce_conn_t *c) {
  bool released = ce_h2conn_release_idle(c);
  if (c->dead)
    return;
  if (release_workspace_tls(c))
    released = true;
  if (released && !c->dead)
    trim_arm(c->proxy);
}

/* ST_H2: a connection that came to rest with something to release gets
 * its release --idle-release-ms later (on_timer), unless a byte read
 * before that re-arms the idle timeout (conn__arm clears release_due). At
 * rest nothing else runs the timer: no stream waits for a preview, no
 * connect is under way, no failure's deadline is set. */
static void h2_rest_arm(ce_conn_t *c) {
  uint32_t idle = c->proxy->opts->idle_ms, release = c->proxy->opts->release_ms;
  if (c->release_due || release == 0 || release >= idle || !ce_h2conn_releasable(c))
    return;
  /* The idle timeout runs from the last byte read and keeps its end: the
   * release comes within it, or not at all when it ends first. */
  uint64_t due = uv_is_active((uv_handle_t *)&c->timer) ? uv_timer_get_due_in(&c->timer) : 0;
  if (due <= release)
    return;
  conn__arm(c, release);
  c->release_due = true;
  c->idle_after_release = (uint32_t)(due - release);
}

/* Bytes from the peer wait in the side's socket and will be read in this
 * turn of the loop (the side is being read: not held back by a full
 * buffer on the other side). */
static bool socket_has_input(side_t *s) {
  uv_os_fd_t fd;
  int n = 0;
  return s->open && s->reading && uv_fileno((uv_handle_t *)&s->tcp, &fd) == 0 && ioctl(fd, FIONREAD, &n) == 0 &&
         n > 0;
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
      conn__process(c);
      return;
    }
    if (s == &c->c)
      conn__report_failed(c, "client_reset");
    else
      conn__report_failed(c, "conn__upstream_reset");
    conn__abort(c);
    return;
  }
  /* Once lingering, the workspace's side is done: a write that completes
   * after (nothing should be queued then) must not close it a second time
   * and end the linger with a reset. */
  if (s->queued == 0 && s->close_after_flush && !(s == &c->c && c->lingering)) {
    if (s == &c->c)
      finish_close(c);
    else
      side_close(s);
    return;
  }
  conn__process(c);
}

/* A failed write ends the connection, reported unless it is ending
 * already (the last output of an aborted connection written on close). */
write_req_t *conn__wire_new(side_t *s, size_t n) {
  write_req_t *w = malloc(sizeof(*w) + n);
  if (w == NULL && !s->conn->dead) {
    conn__report_failed(s->conn, "out_of_memory");
    conn__abort(s->conn);
  }
  return w;
}

bool conn__wire_send(side_t *s, write_req_t *w, size_t n) {
  ce_conn_t *c = s->conn;
  w->side = s;
  w->gen = s->gen;
  w->len = n;
  uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->req, (uv_stream_t *)&s->tcp, &b, 1, on_write) < 0) {
    free(w);
    if (!c->dead) {
      conn__report_failed(c, s == &c->c ? "client_reset" : "conn__upstream_reset");
      conn__abort(c);
    }
    return false;
  }
  s->queued += n;
  return true;
}

bool conn__wire_write(side_t *s, const char *data, size_t n, bool direct) {
  size_t done = 0;
  if (direct) {
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)n);
    int r = uv_try_write((uv_stream_t *)&s->tcp, &b, 1);
    /* UV_EAGAIN (full, or writes queued before) and errors alike go on
     * through uv_write, whose callback reports a failure as before. */
    if (r > 0)
      done = (size_t)r;
  }
  if (done == n)
    return true;
  write_req_t *w = conn__wire_new(s, n - done);
  if (w == NULL)
    return false;
  memcpy(w->data, data + done, n - done);
  return conn__wire_send(s, w, n - done);
}

char *conn__wire_scratch(side_t *s) {
  ce_proxy_t *p = s->conn->proxy;
  if (p->wire_scratch == NULL)
    p->wire_scratch = malloc(CE_CONN_READ_CHUNK);
  return p->wire_scratch;
}

/*
 * One write per socket per turn of the loop. Every write of a side is
 * gathered (transport.c) and the side put on the proxy's flush list; after
 * the I/O callbacks of a turn (uv_check), and before the loop waits again
 * (uv_prepare: writes from timers and other callbacks), each listed side's
 * output goes in one uv_write. A response head and its body, or the h2
 * frames of a turn, leave in one TCP send and as few TLS records as their
 * size needs. The gathered bytes count in the side's queued bytes from the
 * moment they are given, so the back-pressure bounds (CE_CONN_HIGH_WATER)
 * hold as before.
 */
static void flush_unlist(side_t *s) {
  if (!s->flush_listed)
    return;
  ce_proxy_t *p = s->conn->proxy;
  if (s->flush_prev != NULL)
    s->flush_prev->flush_next = s->flush_next;
  else
    p->flush_list = s->flush_next;
  if (s->flush_next != NULL)
    s->flush_next->flush_prev = s->flush_prev;
  s->flush_prev = s->flush_next = NULL;
  s->flush_listed = false;
}

void conn__write_failed(side_t *s) {
  ce_conn_t *c = s->conn;
  if (c->dead)
    return;
  conn__report_failed(c, s == &c->c ? "tls_client_error" : "upstream_tls: write failed");
  conn__abort(c);
}

void conn__side_flush(side_t *s) {
  flush_unlist(s);
  if (!s->open)
    return;
  if (ce_transport_flush(s) == CE_ETLS)
    conn__write_failed(s);
}

static void flush_all(ce_proxy_t *p) {
  side_t *s;
  while ((s = p->flush_list) != NULL)
    conn__side_flush(s);
  uv_prepare_stop(&p->flush_prepare);
  uv_check_stop(&p->flush_check);
}

static void on_flush_prepare(uv_prepare_t *h) { flush_all(h->data); }
static void on_flush_check(uv_check_t *h) { flush_all(h->data); }

static void flush_later(side_t *s) {
  if (s->flush_listed)
    return;
  ce_proxy_t *p = s->conn->proxy;
  if (!p->flush_handles) {
    uv_prepare_init(p->loop, &p->flush_prepare);
    uv_check_init(p->loop, &p->flush_check);
    p->flush_prepare.data = p->flush_check.data = p;
    p->flush_handles = true;
  }
  if (p->flush_list == NULL) {
    uv_prepare_start(&p->flush_prepare, on_flush_prepare);
    uv_check_start(&p->flush_check, on_flush_check);
  }
  s->flush_prev = NULL;
  s->flush_next = p->flush_list;
  if (p->flush_list != NULL)
    p->flush_list->flush_prev = s;
  p->flush_list = s;
  s->flush_listed = true;
}

void ce_conn_writes_close(ce_proxy_t *p) {
  if (p->flush_handles) {
    if (!uv_is_closing((uv_handle_t *)&p->flush_prepare))
      uv_close((uv_handle_t *)&p->flush_prepare, NULL);
    if (!uv_is_closing((uv_handle_t *)&p->flush_check))
      uv_close((uv_handle_t *)&p->flush_check, NULL);
    p->flush_handles = false;
  }
  p->flush_list = NULL;
  ce_bufpool_clear(&p->recbufs);
  free(p->wire_scratch);
  p->wire_scratch = NULL;
}

/* Gives plaintext to a side through its transport (data NULL: only what
 * the transport has pending, such as a handshake flight); it is written at
 * the end of the turn. */
/* After a transport call on s: a TLS failure ends the connection,
 * gathered output is written at the end of the turn. */
static void side_wrote(side_t *s, int rc) {
  ce_conn_t *c = s->conn;
  if (rc == CE_ETLS) {
    conn__report_failed(c, s == &c->c ? "tls_client_error" : "upstream_tls: write failed");
    conn__abort(c);
    return;
  }
  if (!c->dead && s->open && ce_transport_has_output(s))
    flush_later(s);
}

void conn__side_write(side_t *s, const char *data, size_t len) {
  if (s->conn->dead || !s->open)
    return;
  side_wrote(s, ce_transport_send(s, data, len));
}
void conn__side_printf(side_t *s, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  conn__side_write(s, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static void upstream_ready(ce_conn_t *c) {
  if (h2_connect_end(c, 0, NULL))
    return;
  /* Only a connection still waiting for its upstream starts the exchange:
   * one that timed out (504, CLOSING) was answered already. */
  if (c->state != ST_CONNECTING)
    return;
  trace(c, "upstream %s:%u ready", c->up_host, (unsigned)c->up_port);
  if (c->up_for == CE_UP_FOR_PRECONNECT) {
    preconnect_done(c, true);
    return;
  }
  h1__start_exchange(c);
}

/* The upstream could not be had: the pre-connect just goes (the first
 * request meets the failure again on its own path), an h2 workspace's
 * streams are told, a request is answered in words. */
static void upstream_failed(ce_conn_t *c, int status, const char *reason) {
  if (c->up_for == CE_UP_FOR_PRECONNECT) {
    preconnect_done(c, false);
    return;
  }
  if (h2_connect_end(c, status, reason))
    return;
  /* Answered meanwhile (the connect timeout's 504). */
  if (c->state != ST_CONNECTING)
    return;
  if (status == 403) {
    /* Every address is private and nothing names it: a policy refusal
     * (a failure for a request said allowed already, sent again). */
    ce_exchange_refuse_private(&c->x, reason);
    return;
  }
  conn__report_failed(c, reason);
  char body[CE_EXCHANGE_TEXT_MAX];
  ce_exchange_text(body, sizeof(body), reason);
  h1__answer(c, status, body, false);
  conn__close_after_flush(c);
}

/* The connector's ops for every upstream of a connection (c->u here, the
 * h2 pool's own connections in http2/pool.c): the lookup and the handle are
 * counted in c->handles, like every handle of the connection. */
void ce_conn_connector_hold(ce_connector_t *k) { k->s->conn->handles++; }
void ce_conn_connector_release(ce_connector_t *k) { ce_conn_release(k->s->conn); }
bool ce_conn_connector_alive(ce_connector_t *k) { return !k->s->conn->dead; }
static void up_close(ce_connector_t *k) { side_close(&((ce_conn_t *)k->owner)->u); }
static void up_flush(ce_connector_t *k) { conn__side_write(&((ce_conn_t *)k->owner)->u, NULL, 0); }

static void up_reading(ce_connector_t *k) {
  ce_conn_t *c = k->owner;
  c->u.reading = true;
  uv_read_start((uv_stream_t *)&c->u.tcp, on_alloc, on_upstream_read);
  if (c->tls)
    conn__arm(c, c->proxy->opts->handshake_ms);
}

/* The addresses passed the private-address rule: the request is allowed
 * to go (a request sent again said so already). */
static void up_resolved(ce_connector_t *k) {
  ce_conn_t *c = k->owner;
  if (c->up_for == CE_UP_FOR_REQUEST && c->state == ST_CONNECTING)
    ce_exchange_allowed(&c->x);
}

static void up_done(ce_connector_t *k, int status, const char *reason) {
  ce_conn_t *c = k->owner;
  if (c->dead)
    return;
  if (status == 0)
    upstream_ready(c);
  else
    upstream_failed(c, status, reason);
  conn__process(c);
}

static const ce_connector_ops_t up_ops = {
    .hold = ce_conn_connector_hold,
    .release = ce_conn_connector_release,
    .alive = ce_conn_connector_alive,
    .close = up_close,
    .flush = up_flush,
    .reading = up_reading,
    .resolved = up_resolved,
    .done = up_done,
};

/* Connects c->u to c->up_host (the connection's timer, set by the caller,
 * bounds it). A pre-connect and a connection for an HTTP/1.1 workspace
 * ask for h2 first (docs/http2.md §1, §6: an h2-only upstream is reached
 * by translation); the HTTP/1.1 upstreams of an h2 workspace's streams
 * and a WebSocket upgrade (no extended CONNECT here) ask for HTTP/1.1
 * only, except the new connection after an h2 upstream's GOAWAY. */
static void upstream_connect(ce_conn_t *c) {
  bool both = c->up_for == CE_UP_FOR_PRECONNECT ||
              (c->up_for == CE_UP_FOR_H2_STREAMS ? c->h2_offer : !c->req_upgrade);
  int rc = ce_connector_start(&c->uk, c->up_host, c->up_port, c->tls, both ? CE_ALPN_H2_HTTP11 : CE_ALPN_HTTP11);
  if (rc == CE_OK)
    return;
  char reason[200];
  snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
           rc == CE_EAGAIN ? "the resolver is busy" : ce_strerror(rc));
  upstream_failed(c, 502, reason);
}

/* Connects to the request's host (reusing a live upstream to the same
 * host and port), then starts the exchange. The allowed event is sent
 * once the resolved addresses passed the private-address check. */
void conn__connect_upstream(ce_conn_t *c) {
  bool h2_ok = !ce_transport_speaks_h2(&c->u) || (!c->req_upgrade && (c->h1h2 == NULL || ce_h1h2_usable(c)));
  if (c->u.open && c->u.connected && !c->u.eof && c->u.in_len == 0 && strcmp(c->up_host, c->x.req.host) == 0 &&
      c->up_port == c->port && ce_transport_ready(&c->u) && h2_ok) {
    ce_exchange_allowed(&c->x);
    h1__start_exchange(c);
    return;
  }
  if (c->u.open)
    conn__upstream_reset(c);
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->x.req.host);
  c->up_port = c->port;
  conn__set_state(c, ST_CONNECTING);
  conn__arm(c, c->proxy->opts->connect_ms);
  upstream_connect(c);
}

/* ---- TLS with the workspace --------------------------------------------- */

static void client_handshake(ce_conn_t *c) {
  int rc = ce_tlsconn_handshake(c->c.tls);
  conn__side_write(&c->c, NULL, 0);
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
      conn__set_state(c, ST_H2);
      conn__arm(c, c->proxy->opts->idle_ms);
      if (ce_h2conn_start(c) != CE_OK) {
        conn__report_failed(c, "out_of_memory");
        conn__abort(c);
      }
      return;
    }
    /* An h2 upstream for a workspace that did not take h2 is of no use
     * to the HTTP/1.1 path: the first request connects again. */
    if (c->up_h2)
      conn__upstream_reset(c);
    conn__await_request(c);
    return;
  }
  if (rc == CE_EAGAIN)
    return;
  /* The seeds' reason for a workspace that does not trust the session CA:
   * it answered our certificate with a fatal alert. */
  if (ce_tlsconn_peer_rejected_cert(c->c.tls)) {
    conn__report_failed(c, "tls_client_rejected_ca");
  } else {
    char reason[300];
    snprintf(reason, sizeof(reason), "tls_client_error: %s", ce_tlsconn_error(c->c.tls));
    conn__report_failed(c, reason);
  }
  conn__abort(c);
}

/* docs/http2.md §1: a workspace that offers h2 for a host the policy
 * allows learns what the upstream speaks before it is answered. */
static void start_preconnect(ce_conn_t *c) {
  c->up_for = CE_UP_FOR_PRECONNECT;
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->sni.text);
  c->up_port = c->port;
  conn__set_state(c, ST_CONNECTING);
  conn__arm(c, c->proxy->opts->connect_ms);
  trace(c, "pre-connecting to %s for its ALPN", c->up_host);
  upstream_connect(c);
}

/* The pre-connect ended: on success the upstream stays (h2, or the first
 * HTTP/1.1 request's upstream); on failure it goes, and the first request
 * meets the failure again on its own path, answered in words. */
static void preconnect_done(ce_conn_t *c, bool ok) {
  if (c->up_for != CE_UP_FOR_PRECONNECT || c->dead)
    return;
  c->up_for = CE_UP_FOR_REQUEST;
  c->up_h2 = false;
  if (ok) {
    c->up_h2 = ce_transport_speaks_h2(&c->u);
  } else {
    conn__upstream_reset(c);
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
      conn__begin_connection_record(c);
      snprintf(c->x.req.host, sizeof(c->x.req.host), "%.*s", (int)(hello->sni_len < 200 ? hello->sni_len : 200),
               hello->sni);
      ce_exchange_refuse_as(&c->x, "request_denied", 0, "invalid_host", NULL);
      conn__abort(c);
      return;
    }
  } else {
    /* No SNI: the only name this connection has is the address dialled;
     * a request is allowed only when a rule names that IP literal. */
    ce_verdict_t v;
    ce_policy_eval_host(c->proxy->policy, c->sni.text, c->sni.len, &v);
    if (v.decision != CE_DECISION_ALLOW || v.rule_index < 0) {
      conn__begin_connection_record(c);
      c->x.req.matched_rule = v.rule_index;
      c->x.req.matched_kind = v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL;
      ce_exchange_refuse_as(&c->x, "request_denied", 0, "no_sni", NULL);
      conn__abort(c);
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
    conn__report_failed(c, "tls_client_error: cannot mint a certificate");
    conn__abort(c);
    return;
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  /* The hello bytes (and anything after them) go to OpenSSL now. */
  if (ce_tlsconn_feed(c->c.tls, (const uint8_t *)c->c.in, c->c.in_len) != CE_OK) {
    conn__report_failed(c, "out_of_memory");
    conn__abort(c);
    return;
  }
  c->c.in_len = 0;
  conn__set_state(c, ST_HANDSHAKE);
  conn__arm(c, c->proxy->opts->handshake_ms);
  client_handshake(c);
}

static void process_hello(ce_conn_t *c) {
  if (c->c.in_len == 0) {
    if (c->c.eof)
      conn__abort(c);
    return;
  }
  if ((unsigned char)c->c.in[0] != 22) {
    /* Plain HTTP (any other first byte): the Host header names the target,
     * and its head has begun: the header timeout runs from here. */
    c->tls = false;
    conn__set_state(c, ST_HEAD);
    c->head_started = true;
    conn__arm(c, c->proxy->opts->header_ms);
    return;
  }
  /* The buffer only grows while in HELLO: resume where the last read left
   * off (linear in the hello's size however it is split). */
  ce_clienthello_t hello;
  int rc = ce_clienthello_resume(&c->hello_state, (const uint8_t *)c->c.in, c->c.in_len, &hello);
  if (rc == CE_EAGAIN) {
    if (c->c.eof)
      conn__abort(c);
    return;
  }
  if (rc != CE_OK) {
    c->tls = true;
    conn__begin_connection_record(c);
    ce_exchange_refuse_as(&c->x, "request_denied", 0, rc == CE_ETOOBIG ? "client_hello_too_large" : "bad_client_hello",
                          NULL);
    conn__abort(c);
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
  *buf = uv_buf_init(c->proxy->read_buf, (unsigned)ce_transport_read_room(s, CE_CONN_READ_CHUNK));
}

/* Moves the bytes the transport holds (decrypted TLS) into the input. */
static void pump_input(side_t *s) {
  ce_conn_t *c = s->conn;
  if (c->dead)
    return;
  int rc = ce_transport_pump(s);
  if (rc == CE_EAGAIN)
    return;
  if (rc == CE_ENOMEM) {
    conn__report_failed(c, "out_of_memory");
    conn__abort(c);
    return;
  }
  if (rc != CE_OK) {
    if (s != &c->c && c->state == ST_H2 && (s != &c->u || c->up_for != CE_UP_FOR_H2_STREAMS)) {
      /* The streams on it fail; the workspace's connection goes on. */
      s->eof = true;
      return;
    }
    char reason[300];
    snprintf(reason, sizeof(reason), "%s: %s", s == &c->c ? "tls_client_error" : "upstream_tls",
             ce_transport_error(s));
    conn__report_failed(c, reason);
    conn__abort(c);
    return;
  }
  /* Reading may have produced output (TLS 1.3 key updates, alerts). */
  conn__side_write(s, NULL, 0);
}

static void on_read_common(side_t *s, ssize_t nread, const uv_buf_t *buf) {
  ce_conn_t *c = s->conn;
  if (c->dead)
    return;
  if (c->lingering) {
    /* Dropped unread; the client's end (or an error) ends the linger. */
    if (nread < 0)
      conn__abort(c);
    return;
  }
  if (nread == 0)
    return;
  if (nread < 0) {
    if (nread != UV_EOF) {
      trace(c, "%s read error: %s", s->name, uv_strerror((int)nread));
      if (s == &c->u && c->state == ST_EXCHANGE) {
        h1__upstream_failed_mid_response(c, "conn__upstream_reset: connection reset");
        return;
      }
      if (s == &c->c && ce_exchange_is_open(&c->x) && c->state != ST_HEAD) {
        conn__report_failed(c, "client_reset");
        conn__abort(c);
        return;
      }
    }
    s->eof = true;
    s->peer_reset = nread != UV_EOF;
    uv_read_stop((uv_stream_t *)&s->tcp);
    s->reading = false;
    if (s == &c->c && c->state == ST_HANDSHAKE) {
      /* A client that hangs up in the middle of our handshake most often
       * did so because it did not trust the certificate we showed. */
      if (ce_transport_peer_rejected_cert(&c->c))
        conn__report_failed(c, "tls_client_rejected_ca");
      else
        conn__report_failed(c, "tls_client_closed_during_handshake");
      conn__abort(c);
      return;
    }
    if (s == &c->u && ce_connector_busy(&c->uk)) {
      ce_connector_fail(&c->uk, 502, "upstream_tls: the server closed during the handshake");
      return;
    }
    if (s == &c->u && c->state == ST_HEAD) {
      /* An idle upstream keep-alive connection went away: fine. */
      conn__upstream_reset(c);
      return;
    }
    conn__process(c);
    return;
  }
  if (c->state == ST_EXCHANGE || c->state == ST_TUNNEL || c->state == ST_H2)
    conn__arm(c, c->proxy->opts->idle_ms);
  /* on_alloc bounded nread by what the transport can take. */
  int rc = ce_transport_received(s, buf->base, (size_t)nread);
  if (rc != CE_OK) {
    conn__report_failed(c, rc == CE_ENOMEM ? "out_of_memory" : "input_overflow");
    conn__abort(c);
    return;
  }
  if (ce_transport_handshaking(s)) {
    if (s == &c->c)
      client_handshake(c);
    else
      ce_connector_handshake(&c->uk);
    if (c->dead)
      return;
  }
  conn__process(c);
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
    if (ce_transport_input_full(s))
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

void conn__process(ce_conn_t *c) {
  if (c->processing) {
    c->again = true;
    return;
  }
  c->processing = true;
  do {
    c->again = false;
    if (c->dead)
      break;
    pump_input(&c->c);
    pump_input(&c->u);
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
        h1__drop_stray_upstream(c);
      if (c->denied_discard)
        h1__discard_request_body(c);
      else
        h1__process_head(c);
      break;
    case ST_DECIDING:
      if (c->h1h2 != NULL)
        ce_h1h2_idle(c);
      else
        h1__drop_stray_upstream(c);
      /* Body bytes for the question's preview. */
      ce_exchange_body(&c->x, false);
      break;
    case ST_CONNECTING:
      break;
    case ST_EXCHANGE:
      if (c->h1h2 != NULL) {
        ce_h1h2_process(c);
      } else {
        h1__pump_request_body(c);
        h1__pump_response(c);
      }
      if (c->state == ST_EXCHANGE && c->c.eof && !c->req_done) {
        conn__report_failed(c, "client_reset: closed inside the request body");
        conn__abort(c);
      }
      break;
    case ST_TUNNEL:
      h1__pump_tunnel(c);
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
  if (c->state == ST_H2 && !c->dead)
    h2_rest_arm(c);
}

/* ---- accepting ----------------------------------------------------------- */

/* A new connection on the proxy's list, its client handle initialised and
 * counted (NULL: out of memory). */
static ce_conn_t *conn_new(ce_proxy_t *p) {
  ce_conn_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->proxy = p;
  c->id = ++p->next_conn_id;
  c->c.conn = c->u.conn = c;
  c->c.name = "client";
  c->u.name = "upstream";
  ce_connector_init(&c->uk, &up_ops, c, p, c->id, &c->u);
  ce_exchange_init(&c->x, &h1__ops, c, NULL);
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
  return c;
}

/* The workspace's socket is up and what it dialled is known: the first
 * bytes are awaited. */
static void conn_start(ce_conn_t *c, const struct sockaddr *dialled) {
  memcpy(&c->orig_dst, dialled, dialled->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
  c->port = ce_addr_port((struct sockaddr *)&c->orig_dst);
  /* Until a name is known, the connection is named by the address dialled. */
  char text[CE_ADDR_TEXT_MAX];
  size_t n = ce_addr_text((struct sockaddr *)&c->orig_dst, text);
  if (ce_host_normalize(text, n, &c->sni) != 0)
    snprintf(c->sni.text, sizeof(c->sni.text), "%s", text);
  uv_tcp_nodelay(&c->c.tcp, 1);
  trace(c, "accepted, original destination %s port %u", text, (unsigned)c->port);
  c->state = ST_HELLO;
  conn__arm(c, c->proxy->opts->clienthello_ms);
  c->c.reading = true;
  uv_read_start((uv_stream_t *)&c->c.tcp, on_alloc, on_client_read);
}

int ce_conn_adopt(ce_proxy_t *p, uv_os_sock_t fd, const struct sockaddr *dialled) {
  if (dialled->sa_family != AF_INET && dialled->sa_family != AF_INET6) {
    close(fd);
    return CE_EINVAL;
  }
  ce_conn_t *c = conn_new(p);
  if (c == NULL) {
    close(fd);
    return CE_ENOMEM;
  }
  if (uv_tcp_open(&c->c.tcp, fd) != 0) {
    close(fd);
    conn__abort(c);
    return CE_EIO;
  }
  conn_start(c, dialled);
  return CE_OK;
}

void ce_conn_accept(ce_proxy_t *p, uv_stream_t *listener) {
  ce_conn_t *c = conn_new(p);
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
  if (uv_accept(listener, (uv_stream_t *)&c->c.tcp) != 0) {
    conn__abort(c);
    return;
  }
  if (p->conn_count > p->opts->max_connections || p->draining) {
    CE_TRACE_W("proxy", 'c', c->id, "connection limit (%u) reached; resetting a new connection",
               (unsigned)p->opts->max_connections);
    uv_tcp_close_reset(&c->c.tcp, on_handle_closed);
    c->c.open = false;
    conn__abort(c);
    return;
  }
  uv_os_fd_t fd;
  uv_fileno((uv_handle_t *)&c->c.tcp, &fd);
  struct sockaddr_storage dst;
  int rc = ce_original_dst(fd, &dst);
  struct sockaddr_storage local;
  int llen = sizeof(local);
  uv_tcp_getsockname(&c->c.tcp, (struct sockaddr *)&local, &llen);
  if (rc != CE_OK || ce_addr_equal((struct sockaddr *)&dst, (struct sockaddr *)&local)) {
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
    conn__abort(c);
    return;
  }
  conn_start(c, (struct sockaddr *)&dst);
}

void ce_conn_drain_all(ce_proxy_t *p) {
  for (ce_conn_t *c = p->conns; c != NULL; c = c->next) {
    if (c->dead)
      continue;
    if (c->state == ST_HEAD && c->c.in_len == 0 && !ce_exchange_is_open(&c->x)) {
      conn__abort(c);
    } else if (c->state == ST_HELLO) {
      conn__abort(c);
    } else if (c->state == ST_H2) {
      ce_h2conn_drain(c);
    } else if (c->state == ST_HEAD && c->denied_discard) {
      /* Skipping a refused request's body is waiting for the next request:
       * idle too. Its answer goes out first, then a lingering close. */
      c->denied_discard = false;
      conn__end_request(c);
      conn__close_after_flush(c);
    }
  }
}

void ce_conn_abort_all(ce_proxy_t *p) {
  for (ce_conn_t *c = p->conns; c != NULL; c = c->next) {
    if (c->dead)
      continue;
    if (c->state == ST_H2)
      ce_h2conn_abort(c, "proxy_shutdown");
    else if (ce_exchange_is_open(&c->x))
      conn__report_failed(c, "proxy_shutdown");
    conn__abort(c);
  }
}

/* ---- for the HTTP/2 path (conn_internal.h) -------------------------------- */

void ce_conn_side_write(side_t *s, const char *data, size_t len) { conn__side_write(s, data, len); }

void ce_conn_side_seal(side_t *s) {
  if (s->conn->dead || !s->open)
    return;
  side_wrote(s, ce_transport_seal(s));
}
void ce_conn_report_failed(ce_conn_t *c, const char *reason) { conn__report_failed(c, reason); }
void ce_conn_abort(ce_conn_t *c) { conn__abort(c); }
void ce_conn_close_after_flush(ce_conn_t *c) { conn__close_after_flush(c); }
void ce_conn_hard_deadline(ce_conn_t *c) {
  if (c->dead || c->hard_deadline)
    return;
  uint32_t ms = c->proxy->opts->idle_ms < CE_CONN_LINGER_MS ? c->proxy->opts->idle_ms : CE_CONN_LINGER_MS;
  conn__arm(c, ms);
  c->hard_deadline = true;
}
void ce_conn_upstream_reset(ce_conn_t *c) { conn__upstream_reset(c); }
void ce_conn_process(ce_conn_t *c) { conn__process(c); }
void ce_conn_pump_input(side_t *s) { pump_input(s); }
void ce_conn_release(ce_conn_t *c) {
  c->handles--;
  maybe_free(c);
}
void ce_conn_wake_in(ce_conn_t *c, uint32_t ms) {
  /* Not while an upstream for the streams is being connected: the timer
   * is that connect's timeout then (the wait is checked as frames come). */
  if (c->up_for == CE_UP_FOR_H2_STREAMS ||
      (!c->release_due && uv_is_active((uv_handle_t *)&c->timer) && uv_timer_get_due_in(&c->timer) <= ms))
    return;
  conn__arm(c, ms);
}
void ce_conn_touch(ce_conn_t *c) {
  if (c->state == ST_H2)
    conn__arm(c, c->proxy->opts->idle_ms);
}
void ce_conn_failed_mid_response(ce_conn_t *c, const char *reason) { h1__upstream_failed_mid_response(c, reason); }
void ce_conn_finish_exchange(ce_conn_t *c) { h1__finish_exchange(c); }
void ce_conn_retry_exchange(ce_conn_t *c) {
  conn__upstream_reset(c);
  trace(c, "the upstream refused the stream; connecting again for %s", c->x.req.host);
  conn__connect_upstream(c);
}

void ce_conn_h2_connect(ce_conn_t *c, bool offer_h2) {
  if (c->dead || c->up_for == CE_UP_FOR_H2_STREAMS)
    return;
  c->h2_offer = offer_h2;
  if (c->u.open)
    conn__upstream_reset(c);
  snprintf(c->up_host, sizeof(c->up_host), "%s", c->sni.text);
  c->up_port = c->port;
  c->up_for = CE_UP_FOR_H2_STREAMS;
  trace(c, "h2: connecting upstream connection 0 to %s (%s)", c->up_host, offer_h2 ? "h2 or HTTP/1.1" : "HTTP/1.1");
  conn__arm(c, c->proxy->opts->connect_ms);
  upstream_connect(c);
}
