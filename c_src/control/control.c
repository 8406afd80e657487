/*
 * The control channel (control.h, docs/control-channel.md): the core.
 * internal.h says which file does what.
 *
 * Four parts share one struct and one libuv loop:
 *
 * - the listeners (one per loopback family, or one Unix socket) and their
 *   peers: every accepted connection is a peer_t that goes through the
 *   handshake (handshake.h) under one deadline; at most
 *   CE_CONTROL_MAX_PREAUTH may be in the handshake at once, the oldest
 *   going when a new one arrives, and the first to prove the token
 *   becomes ctl->peer (replacing and closing any earlier one); refusals
 *   are counted and reported as rate-limited control_refused events;
 * - events: each is encoded once into a reference-counted line, written to
 *   stdout and either to the peer or into a ring of lines that waits for
 *   one (dropping the oldest when full);
 * - asks: a list in id order, each with its own timer, resent in full to
 *   every newly authenticated peer;
 * - closing: every handle is counted in ctl->live_handles; memory that a
 *   handle lives in is freed only in that handle's close callback, and the
 *   channel itself when the count reaches zero.
 *
 * Callbacks into the proxy (decision callbacks) may call back into this
 * file, ce_control_close() included. Nothing is freed synchronously, so
 * after such a callback the code only has to check the closing flags of
 * the channel and the peer before going on.
 */
#include "control/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"

/* ---- small helpers ---------------------------------------------------------- */

void ce__ctl_set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Log lines go through common/trace.h at `level`, under a burst limit
 * (LOG_BURST a second) because a misbehaving peer can cause one per frame. */
void ce__ctl_log(ce_control_t *ctl, ce_trace_level_t level, const char *fmt, ...) {
  if (level > ce_trace_level())
    return;
  uint64_t now = uv_now(ctl->loop);
  if (now - ctl->log_window >= 1000) {
    if (ctl->log_suppressed > 0)
      CE_TRACE_W("control", 0, 0, "%llu log lines suppressed",
                 (unsigned long long)ctl->log_suppressed);
    ctl->log_window = now;
    ctl->log_count = 0;
    ctl->log_suppressed = 0;
  }
  if (ctl->log_count >= LOG_BURST) {
    ctl->log_suppressed++;
    return;
  }
  ctl->log_count++;
  char msg[LOG_LINE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  CE_TRACE(level, "control", 0, 0, "%s", msg);
}

void ce__ctl_close_if_open(uv_handle_t *h, uv_close_cb cb) {
  if (!uv_is_closing(h))
    uv_close(h, cb);
}

/* Every close callback ends here. When the channel is closing and only the
 * flush timer is left, nothing more can be drained, so the timer goes too;
 * when nothing is left, the channel is freed. */
void ce__ctl_handle_closed(ce_control_t *ctl) {
  ctl->live_handles--;
  if (!ctl->closing)
    return;
  if (ctl->live_handles == 1 && ctl->flush_timer_open &&
      !uv_is_closing((uv_handle_t *)&ctl->flush_timer))
    uv_close((uv_handle_t *)&ctl->flush_timer, ce__ctl_closed_cb);
  if (ctl->live_handles == 0)
    ce__ctl_finish_close(ctl);
}

void ce__ctl_closed_cb(uv_handle_t *h) {
  ce__ctl_handle_closed(h->data);
}

size_t ce__ctl_queued_bytes(stream_u *s) {
  return uv_stream_get_write_queue_size(&s->stream);
}

/* ---- the event ring -------------------------------------------------------- */

ce__line_t *ce__ctl_ring_pop(ce_control_t *ctl) {
  ce__line_t *line = ctl->ring[ctl->ring_head];
  ctl->ring[ctl->ring_head] = NULL;
  ctl->ring_head = (ctl->ring_head + 1) % ctl->ring_cap;
  ctl->ring_count--;
  ctl->ring_bytes -= line->len;
  return line;
}

void ce__ctl_ring_push(ce_control_t *ctl, ce__line_t *line) {
  while (ctl->ring_count > 0 && (ctl->ring_count == ctl->ring_cap ||
                                 ctl->ring_bytes + line->len > RING_MAX_BYTES)) {
    ce__line_unref(ce__ctl_ring_pop(ctl));
    ctl->dropped++;
  }
  size_t tail = (ctl->ring_head + ctl->ring_count) % ctl->ring_cap;
  ctl->ring[tail] = ce__line_ref(line);
  ctl->ring_count++;
  ctl->ring_bytes += line->len;
}

void ce__ctl_ring_clear(ce_control_t *ctl) {
  while (ctl->ring_count > 0)
    ce__line_unref(ce__ctl_ring_pop(ctl));
}

/* ---- events ------------------------------------------------------------------ */

void ce_control_emit_with(ce_control_t *ctl, ce_control_write_fn write, const void *arg) {
  if (ctl->closing)
    return;
  ctl->events++;
  uint64_t seq = ++ctl->seq;
  ce__line_t *line = NULL;
  int rc = ce__line_encode_frame_with("event", "seq", seq, false, write, arg, &line);
  if (rc != 0) {
    ctl->dropped++;
    ctl->stdout_dropped++;
    ce__ctl_log(ctl, CE_TRACE_WARN, "event %llu dropped: %s", (unsigned long long)seq,
                rc == CE_EINVAL ? "not an encodable JSON object" : ce_strerror(rc));
    return;
  }
  ce__ctl_out_write(ctl, line);
  /* Through the ring, so the peer sees events in seq order and in batches
   * (PEER_BATCH_LINES). */
  ce__ctl_ring_push(ctl, line);
  ce__line_unref(line);
  ce__ctl_peer_event_queued(ctl);
}

void ce_control_emit(ce_control_t *ctl, json_t *event) {
  /* Anything but an object is counted as dropped. */
  ce__json_fields_t f = {event, "seq"};
  ce_control_emit_with(ctl, ce__line_write_json_fields, &f);
  json_decref(event);
}

/* ---- start -------------------------------------------------------------------- */

static int check_opts(const ce_control_opts_t *opts, char *err, size_t errlen) {
  if (opts->token == NULL || opts->token_len < CE_CONTROL_TOKEN_MIN ||
      opts->token_len > CE_CONTROL_TOKEN_MAX) {
    ce__ctl_set_err(err, errlen, "token: %u to %u bytes are required", CE_CONTROL_TOKEN_MIN,
                    CE_CONTROL_TOKEN_MAX);
    return CE_EINVAL;
  }
  if (opts->buffer_events > RING_MAX_EVENTS) {
    ce__ctl_set_err(err, errlen, "buffer_events: at most %u", RING_MAX_EVENTS);
    return CE_EINVAL;
  }
  /* The peer names the session it wants and both proofs cover it: an
   * empty id would let any session's peer match. */
  size_t n = opts->session_id != NULL ? strlen(opts->session_id) : 0;
  json_t *probe = n > 0 ? json_stringn(opts->session_id, n) : NULL; /* NULL unless UTF-8 */
  bool ok = probe != NULL && n <= CE_CONTROL_SESSION_ID_MAX;
  json_decref(probe);
  if (!ok) {
    ce__ctl_set_err(err, errlen, "session_id: 1 to %u bytes of UTF-8 are required",
                    CE_CONTROL_SESSION_ID_MAX);
    return CE_EINVAL;
  }
  return 0;
}

static void free_unstarted(ce_control_t *ctl) {
  OPENSSL_cleanse(ctl->token, sizeof(ctl->token));
  free(ctl->out_batch);
  free(ctl->ring);
  free(ctl->read_buf);
  free(ctl->session_id);
  free(ctl);
}

int ce_control_start(uv_loop_t *loop, const ce_control_opts_t *opts,
                     ce_control_t **out, char *err, size_t errlen) {
  int out_fd = -1, lfds[2] = {-1, -1}, nl = 0;
  uv_handle_type out_type = UV_UNKNOWN_HANDLE;
  ce__ctl_set_err(err, errlen, "%s", "");
  int rc = check_opts(opts, err, errlen);
  if (rc != 0)
    return rc;
  ce__listen_addr_t addr;
  rc = ce__listen_parse(opts->listen, &addr, err, errlen);
  if (rc != 0)
    return rc;

  ce_control_t *ctl = calloc(1, sizeof(*ctl));
  if (ctl == NULL)
    goto fail_nomem;
  ctl->loop = loop;
  ctl->hello_timeout_ms =
      opts->hello_timeout_ms != 0 ? opts->hello_timeout_ms : CE_CONTROL_HELLO_TIMEOUT_MS;
  ctl->ring_cap =
      opts->buffer_events != 0 ? opts->buffer_events : CE_CONTROL_DEFAULT_BUFFER_EVENTS;
  ctl->ring = calloc(ctl->ring_cap, sizeof(*ctl->ring));
  ctl->read_buf = malloc(READ_BUF_SIZE);
  ctl->session_id = strdup(opts->session_id);
  if (ctl->ring == NULL || ctl->read_buf == NULL || ctl->session_id == NULL)
    goto fail_alloc;
  memcpy(ctl->token, opts->token, opts->token_len);
  ctl->token_len = opts->token_len;
  ctl->on_credential = opts->on_credential;
  ctl->credential_data = opts->credential_data;
  ctl->log_window = uv_now(loop);

  /* Raw descriptors first: everything that can fail for an ordinary reason
   * (a bad fd, a port in use) fails before a handle exists on the loop. */
  rc = ce__ctl_out_prepare(ctl, opts->stdout_fd, &out_fd, &out_type, err, errlen);
  if (rc != 0)
    goto fail_alloc;
  ctl->is_unix = addr.is_unix;
  if (addr.is_unix)
    strcpy(ctl->unix_path, addr.path);
  rc = ce__listen_open_both(&addr, LISTEN_BACKLOG, lfds, &nl, &ctl->port, err, errlen);
  if (rc != 0)
    goto fail_out_fd;

  /* Handles now. Their open and listen calls work on descriptors that are
   * already set up, so they do not fail in practice; if one does, the
   * channel closes itself through the ordinary path, which needs one more
   * turn of the loop to finish. */
  uv_timer_init(loop, &ctl->refused_timer);
  ctl->refused_timer.data = ctl;
  ctl->live_handles++;
  uv_timer_init(loop, &ctl->peer_timer);
  ctl->peer_timer.data = ctl;
  ctl->live_handles++;
  for (int i = 0; i < nl; i++) {
    stream_u *l = &ctl->listeners[i];
    int lrc;
    if (addr.is_unix) {
      uv_pipe_init(loop, &l->pipe, 0);
      lrc = uv_pipe_open(&l->pipe, lfds[i]);
    } else {
      uv_tcp_init(loop, &l->tcp);
      lrc = uv_tcp_open(&l->tcp, lfds[i]);
    }
    l->handle.data = ctl;
    ctl->live_handles++;
    ctl->nlisteners++;
    if (lrc != 0)
      close(lfds[i]);
    else
      lrc = uv_listen(&l->stream, LISTEN_BACKLOG, ce__ctl_on_connection);
    if (rc == 0)
      rc = lrc;
  }
  int orc = ctl->out_kind == OUT_STREAM ? ce__ctl_out_open(ctl, out_fd, out_type) : 0;
  if (ctl->out_kind != OUT_NONE) {
    uv_timer_init(loop, &ctl->out_timer);
    ctl->out_timer.data = ctl;
    ctl->live_handles++;
    ctl->out_flush_handles = true;
  }
  if (rc == 0)
    rc = orc;
  if (rc != 0) {
    ce__ctl_set_err(err, errlen, "cannot attach the listener or stdout to the loop: %s",
                    uv_strerror(rc));
    ce_control_close(ctl, NULL, NULL);
    return CE_EIO;
  }
  *out = ctl;
  return 0;

fail_out_fd:
  if (out_fd >= 0)
    close(out_fd);
fail_alloc:
  free_unstarted(ctl);
  if (rc != 0)
    return rc;
fail_nomem:
  ce__ctl_set_err(err, errlen, "%s", ce_strerror(CE_ENOMEM));
  return CE_ENOMEM;
}

int ce_control_port(const ce_control_t *ctl) {
  return ctl->port;
}

void ce_control_stats(const ce_control_t *ctl, ce_control_stats_t *out) {
  out->events = ctl->events;
  out->dropped = ctl->dropped;
  out->stdout_dropped = ctl->stdout_dropped;
  out->auth_failures = ctl->auth_failures;
  out->refused_events = ctl->refused_events;
  out->pending_asks = ctl->pending;
  out->peer_connected = ctl->peer != NULL;
}

/* ---- close -------------------------------------------------------------------- */

void ce__ctl_finish_close(ce_control_t *ctl) {
  void (*done)(void *) = ctl->done;
  void *data = ctl->done_data;
  ce__ctl_ring_clear(ctl);
  free_unstarted(ctl);
  if (done != NULL)
    done(data);
}

static void out_shutdown_cb(uv_shutdown_t *req, int status) {
  ce_control_t *ctl = req->handle->data;
  ce__ctl_close_if_open(&ctl->out.handle, ce__ctl_closed_cb);
}

static void peer_shutdown_cb(uv_shutdown_t *req, int status) {
  peer_t *p = req->handle->data;
  ce__ctl_close_if_open(&p->io.handle, ce__ctl_peer_closed_cb);
}

/* The flush deadline: whatever has not drained by now is closed, and its
 * queued writes are cancelled. */
static void flush_timer_cb(uv_timer_t *t) {
  ce_control_t *ctl = t->data;
  if (ctl->draining_peer != NULL)
    ce__ctl_close_if_open(&ctl->draining_peer->io.handle, ce__ctl_peer_closed_cb);
  if (ctl->out_draining)
    ce__ctl_close_if_open(&ctl->out.handle, ce__ctl_closed_cb);
  ce__ctl_close_if_open((uv_handle_t *)&ctl->flush_timer, ce__ctl_closed_cb);
}

void ce_control_close(ce_control_t *ctl, void (*done)(void *data), void *data) {
  if (ctl->closing)
    return;
  ctl->closing = true;
  ctl->done = done;
  ctl->done_data = data;

  /* Events still in the stdout batch go out first, ahead of the stream's
   * shutdown. */
  ce__ctl_out_flush(ctl);
  if (ctl->out_flush_handles)
    ce__ctl_close_if_open((uv_handle_t *)&ctl->out_timer, ce__ctl_closed_cb);

  /* The asks first, while everything else still stands: their callbacks
   * may emit or ask, which now only frees. */
  for (;;) {
    ask_t *a = ctl->asks_head;
    if (a == NULL)
      break;
    ce__ctl_ask_finish(a, CE_EUNAVAIL, false, NULL, false);
  }

  for (int i = 0; i < ctl->nlisteners; i++)
    ce__ctl_close_if_open(&ctl->listeners[i].handle, ce__ctl_closed_cb);
  ce__ctl_close_if_open((uv_handle_t *)&ctl->refused_timer, ce__ctl_closed_cb);
  ce__ctl_close_if_open((uv_handle_t *)&ctl->peer_timer, ce__ctl_closed_cb);
  if (ctl->is_unix)
    ce__listen_remove(ctl->unix_path);

  bool draining = false;
  peer_t *authed = ctl->peer;
  for (;;) {
    peer_t *p = ctl->peers;
    if (p == NULL)
      break;
    if (p != authed) {
      ce__ctl_peer_close(p, NULL);
      continue;
    }
    /* The authenticated peer gets what is already queued for it and the
     * events of the batch, then an orderly end of stream. */
    ce__ctl_flush_ring(ctl);
    if (ctl->peer != p)
      continue; /* the write failed and closed it */
    p->closing = true;
    ce__ctl_peer_unlink(p);
    uv_read_stop(&p->io.stream);
    uv_close((uv_handle_t *)&p->hello_timer, ce__ctl_peer_closed_cb);
    p->shutdown.data = p;
    if (uv_shutdown(&p->shutdown, &p->io.stream, peer_shutdown_cb) == 0) {
      ctl->draining_peer = p;
      draining = true;
    } else {
      uv_close(&p->io.handle, ce__ctl_peer_closed_cb);
    }
  }

  if (ctl->out_kind == OUT_STREAM && !uv_is_closing(&ctl->out.handle)) {
    if (uv_shutdown(&ctl->out_shutdown, &ctl->out.stream, out_shutdown_cb) == 0) {
      ctl->out_draining = true;
      draining = true;
    } else {
      uv_close(&ctl->out.handle, ce__ctl_closed_cb);
    }
  }

  if (draining) {
    uv_timer_init(ctl->loop, &ctl->flush_timer);
    ctl->flush_timer.data = ctl;
    ctl->flush_timer_open = true;
    ctl->live_handles++;
    uv_timer_start(&ctl->flush_timer, flush_timer_cb, CE_CONTROL_CLOSE_FLUSH_MS, 0);
  }
  ce__ctl_ring_clear(ctl);
}
