/*
 * The control channel's peers (internal.h): every accepted connection
 * goes through the handshake (handshake.h) under one deadline, in a
 * pre-authentication slot; the first to prove the token becomes
 * ctl->peer, replacing and closing any earlier one. Refusals are silent
 * to the peer, counted, and reported in rate-limited control_refused
 * events.
 */
#include "control/internal.h"

#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

void ce__ctl_peer_closed_cb(uv_handle_t *h) {
  peer_t *p = h->data;
  ce_control_t *ctl = p->ctl;
  if (--p->open_handles == 0) {
    if (ctl->draining_peer == p)
      ctl->draining_peer = NULL;
    free(p->line);
    free(p);
  }
  ce__ctl_handle_closed(ctl);
}

/* The pre-authentication queue: peers in the handshake, oldest first. */
static void preauth_append(peer_t *p) {
  ce_control_t *ctl = p->ctl;
  p->pa_prev = ctl->preauth_tail;
  p->pa_next = NULL;
  if (ctl->preauth_tail != NULL)
    ctl->preauth_tail->pa_next = p;
  else
    ctl->preauth_head = p;
  ctl->preauth_tail = p;
  ctl->unauth_count++;
  p->counted = true;
}

static void preauth_remove(peer_t *p) {
  ce_control_t *ctl = p->ctl;
  if (!p->counted)
    return;
  if (p->pa_prev != NULL)
    p->pa_prev->pa_next = p->pa_next;
  else
    ctl->preauth_head = p->pa_next;
  if (p->pa_next != NULL)
    p->pa_next->pa_prev = p->pa_prev;
  else
    ctl->preauth_tail = p->pa_prev;
  p->pa_prev = p->pa_next = NULL;
  ctl->unauth_count--;
  p->counted = false;
}

void ce__ctl_peer_unlink(peer_t *p) {
  ce_control_t *ctl = p->ctl;
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    ctl->peers = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  p->prev = p->next = NULL;
  if (ctl->peer == p)
    ctl->peer = NULL;
  preauth_remove(p);
}

/* Closes a peer (idempotent). why, when not NULL, is logged. */
void ce__ctl_peer_close(peer_t *p, const char *why) {
  if (p->closing)
    return;
  p->closing = true;
  ce__ctl_peer_unlink(p);
  if (why != NULL)
    ce__ctl_log(p->ctl, CE_TRACE_INFO, "peer %llu: %s; closed", (unsigned long long)p->num, why);
  uv_close(&p->io.handle, ce__ctl_peer_closed_cb);
  uv_close((uv_handle_t *)&p->hello_timer, ce__ctl_peer_closed_cb);
}

/* RFC 3339, UTC, microseconds, as the proxy's events write it. */
static void now_rfc3339(char *out, size_t cap) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, cap - n, ".%06ldZ", ts.tv_nsec / 1000);
}

/* Emits one control_refused event for the refusals counted so far. */
static void refused_emit(ce_control_t *ctl) {
  if (ctl->refused_pending == 0 || ctl->closing)
    return;
  char at[40];
  now_rfc3339(at, sizeof(at));
  json_t *ev = json_pack("{s:s, s:s, s:s, s:I}", "event", "control_refused", "at", at, "reason",
                         ctl->refused_why, "count", (json_int_t)ctl->refused_pending);
  ctl->refused_pending = 0;
  ctl->refused_last_ms = uv_now(ctl->loop);
  ctl->refused_events++;
  ce_control_emit(ctl, ev); /* NULL (out of memory) is counted as dropped */
}

static void refused_timer_cb(uv_timer_t *t) {
  refused_emit(t->data);
}

/* Counts a refusal for the next control_refused event: at once when none
 * went out in the last REFUSED_EVENT_MS, else when that time is up. */
static void refused_note(ce_control_t *ctl, const char *why) {
  if (ctl->closing)
    return;
  ctl->refused_pending++;
  ctl->refused_why = why;
  uint64_t now = uv_now(ctl->loop);
  if (ctl->refused_last_ms == 0 || now - ctl->refused_last_ms >= REFUSED_EVENT_MS) {
    uv_timer_stop(&ctl->refused_timer);
    refused_emit(ctl);
  } else if (!uv_is_active((uv_handle_t *)&ctl->refused_timer)) {
    uv_timer_start(&ctl->refused_timer, refused_timer_cb,
                   REFUSED_EVENT_MS - (now - ctl->refused_last_ms), 0);
  }
}

/* A refused peer is closed without a word: what it was sent before (at
 * most a challenge nonce) tells it nothing about the token, and it is not
 * told why. `why` must be a static string: the refusal event keeps it. */
static void auth_fail(peer_t *p, const char *why) {
  ce_control_t *ctl = p->ctl;
  ctl->auth_failures++;
  ce__ctl_log(ctl, CE_TRACE_INFO, "peer %llu dropped before authenticating: %s",
              (unsigned long long)p->num, why);
  ce__ctl_peer_close(p, NULL);
  refused_note(ctl, why);
}

static void peer_fail(peer_t *p, const char *why) {
  if (p->state != PEER_OPEN) {
    auth_fail(p, why);
    return;
  }
  ce__ctl_log(p->ctl, CE_TRACE_WARN, "peer %llu: protocol violation (%s); closed",
              (unsigned long long)p->num, why);
  ce__ctl_peer_close(p, NULL);
}

static void peer_write_cb(uv_write_t *req, int status) {
  peer_write_t *w = (peer_write_t *)req;
  peer_t *p = req->handle->data;
  ce_control_t *ctl = p->ctl;
  for (unsigned i = 0; i < w->count; i++)
    ce__line_unref(w->lines[i]);
  free(w);
  if (status < 0) {
    if (status != UV_ECANCELED && !p->closing) {
      char why[128];
      snprintf(why, sizeof(why), "write failed (%s)", uv_strerror(status));
      ce__ctl_peer_close(p, why);
    }
    return;
  }
  /* Events held back by the soft bound go on as the queue drains. */
  if (p == ctl->peer && !ctl->closing && ctl->ring_count > 0 &&
      !uv_is_active((uv_handle_t *)&ctl->peer_timer))
    ce__ctl_peer_event_queued(ctl);
}

/* A write that cannot be made: its lines are released, its events
 * counted as dropped (the next peer's welcome says so), the peer closed. */
static void peer_write_lost(peer_t *p, peer_write_t *w, const char *why) {
  p->ctl->dropped += w->events;
  for (unsigned i = 0; i < w->count; i++)
    ce__line_unref(w->lines[i]);
  free(w);
  ce__ctl_peer_close(p, why);
}

/* Writes w's lines (bytes of them in all) with one request; takes w. */
static void peer_write(peer_t *p, peer_write_t *w, size_t bytes) {
  if (ce__ctl_queued_bytes(&p->io) + bytes > PEER_QUEUE_HARD) {
    peer_write_lost(p, w, "is not reading (over 64 MiB waiting to be written)");
    return;
  }
  uv_buf_t bufs[PEER_BATCH_LINES + 1];
  for (unsigned i = 0; i < w->count; i++)
    bufs[i] = uv_buf_init(w->lines[i]->data, (unsigned int)w->lines[i]->len);
  int rc = uv_write(&w->req, &p->io.stream, bufs, w->count, peer_write_cb);
  if (rc != 0) {
    char why[128];
    snprintf(why, sizeof(why), "write failed (%s)", uv_strerror(rc));
    peer_write_lost(p, w, why);
  }
}

/* An empty write request; NULL (the peer closed) when out of memory. */
static peer_write_t *peer_write_new(peer_t *p) {
  peer_write_t *w = malloc(sizeof(*w));
  if (w == NULL) {
    ce__ctl_peer_close(p, "out of memory for a write");
    return NULL;
  }
  w->count = 0;
  w->events = 0;
  return w;
}

void ce__ctl_peer_send(peer_t *p, ce__line_t *line) {
  if (p->closing)
    return;
  peer_write_t *w = peer_write_new(p);
  if (w == NULL)
    return;
  w->lines[w->count++] = ce__line_ref(line);
  peer_write(p, w, line->len);
}

/* Sends a frame built from a jansson object, for the few frames that are
 * not events or asks (welcome, pong). Takes ownership of obj. */
static void peer_send_obj(peer_t *p, json_t *obj) {
  ce__line_t *line = NULL;
  int rc = obj != NULL ? ce__line_encode(obj, &line) : CE_ENOMEM;
  json_decref(obj);
  if (rc != 0) {
    ce__ctl_peer_close(p, ce_strerror(rc));
    return;
  }
  ce__ctl_peer_send(p, line);
  ce__line_unref(line);
}

/* Moves buffered events to the peer, PEER_BATCH_LINES to a write, while
 * its queue is under the soft bound (the write callbacks call it again as
 * the queue drains); `then`, when given, goes last whatever the bound, in
 * the last write when it has room. */
static void flush_ring(ce_control_t *ctl, ce__line_t *then) {
  uv_timer_stop(&ctl->peer_timer);
  peer_t *p = ctl->peer;
  while (p != NULL && !p->closing) {
    bool events = ctl->ring_count > 0 && ce__ctl_queued_bytes(&p->io) < PEER_QUEUE_SOFT;
    if (!events && then == NULL)
      return;
    peer_write_t *w = peer_write_new(p);
    if (w == NULL)
      return;
    size_t bytes = 0;
    while (events && ctl->ring_count > 0 && w->count < PEER_BATCH_LINES) {
      ce__line_t *line = ce__ctl_ring_pop(ctl); /* the ring's reference, now the write's */
      bytes += line->len;
      w->lines[w->count++] = line;
      w->events++;
    }
    bool last = ctl->ring_count == 0 || !events;
    if (last && then != NULL) {
      w->lines[w->count++] = ce__line_ref(then);
      bytes += then->len;
      then = NULL;
    }
    peer_write(p, w, bytes);
    if (last && then == NULL)
      return;
    p = ctl->peer; /* NULL if the write failed and closed it */
  }
}

void ce__ctl_flush_ring(ce_control_t *ctl) { flush_ring(ctl, NULL); }

void ce__ctl_flush_ring_then(ce_control_t *ctl, ce__line_t *line) { flush_ring(ctl, line); }

static void peer_timer_cb(uv_timer_t *t) { ce__ctl_flush_ring(t->data); }

void ce__ctl_peer_event_queued(ce_control_t *ctl) {
  if (ctl->peer == NULL || ctl->peer->closing)
    return;
  /* A ring smaller than a batch (buffer_events) is flushed when full,
   * before the next event would push its oldest out. */
  if (ctl->ring_count >= PEER_BATCH_LINES || ctl->ring_count >= ctl->ring_cap)
    ce__ctl_flush_ring(ctl);
  else if (!uv_is_active((uv_handle_t *)&ctl->peer_timer))
    uv_timer_start(&ctl->peer_timer, peer_timer_cb, OUT_BATCH_MS, 0);
}

static void peer_authenticate(peer_t *p) {
  ce_control_t *ctl = p->ctl;
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  char proof_hex[2 * CE_CONTROL_PROOF_LEN + 1];
  if (ce_control_proof(ctl->token, ctl->token_len, CE_CONTROL_ROLE_SIDECAR, ctl->session_id,
                       p->peer_nonce, p->sidecar_nonce, proof) != CE_OK) {
    ce__ctl_peer_close(p, "cannot compute the sidecar's proof");
    return;
  }
  ce_control_hex(proof, sizeof(proof), proof_hex);
  p->state = PEER_OPEN;
  preauth_remove(p);
  uv_timer_stop(&p->hello_timer);
  if (ctl->peer != NULL)
    ce__ctl_peer_close(ctl->peer, "replaced by a newly authenticated peer");
  ctl->peer = p;
  ce__ctl_log(ctl, CE_TRACE_INFO, "peer %llu authenticated", (unsigned long long)p->num);

  /* The welcome first, then the asks still waiting (they are urgent: a
   * request is on hold for each), then the buffered events in order. */
  peer_send_obj(p, json_pack("{s:s, s:i, s:s, s:s, s:I}", "type", "welcome", "version",
                             CE_CONTROL_PROTOCOL_VERSION, "session_id", ctl->session_id,
                             "proof", proof_hex, "dropped", (json_int_t)ctl->dropped));
  for (ask_t *a = ctl->asks_head; a != NULL && !p->closing; a = a->next) {
    if (a->state == ASK_PENDING)
      ce__ctl_peer_send(p, a->line);
  }
  ce__ctl_flush_ring(ctl);
}

ask_t *ce__ctl_ask_find(ce_control_t *ctl, uint64_t id);
void ce__ctl_ask_finish(ask_t *a, int status, bool allow, const char *reason,
                       bool cacheable);

/* Whether the hello's ticket is valid and the first for its nonce (which
 * is then remembered). */
static bool ticket_fresh(ce_control_t *ctl, const ce_frame_t *f) {
  if (!ce_control_ticket_ok(ctl->token, ctl->token_len, ctl->session_id, f->nonce, f->ticket))
    return false;
  for (size_t i = 0; i < ctl->tickets_count; i++)
    if (memcmp(ctl->tickets_seen[i], f->nonce, CE_CONTROL_NONCE_LEN) == 0)
      return false;
  memcpy(ctl->tickets_seen[ctl->tickets_next], f->nonce, CE_CONTROL_NONCE_LEN);
  ctl->tickets_next = (ctl->tickets_next + 1) % TICKETS_SEEN;
  if (ctl->tickets_count < TICKETS_SEEN)
    ctl->tickets_count++;
  return true;
}

static void peer_frame(peer_t *p, const char *s, size_t n) {
  ce_control_t *ctl = p->ctl;
  ce_frame_t f;
  const char *why = NULL;
  int rc = ce_control_frame_parse(s, n, &f, &why);

  if (p->state == PEER_HELLO) {
    if (rc != 0) {
      auth_fail(p, why);
    } else if (f.type != CE_FRAME_HELLO) {
      auth_fail(p, "the first frame is not a hello");
    } else if (strcmp(f.session_id, ctl->session_id) != 0) {
      auth_fail(p, "hello: another session id");
    } else if (ce_control_nonce(p->sidecar_nonce) != CE_OK) {
      auth_fail(p, "no random bytes for a nonce");
    } else {
      char nonce_hex[2 * CE_CONTROL_NONCE_LEN + 1];
      memcpy(p->peer_nonce, f.nonce, sizeof(p->peer_nonce));
      p->rank = f.has_ticket && ticket_fresh(ctl, &f) ? RANK_TICKET : RANK_HELLO;
      ce_control_hex(p->sidecar_nonce, sizeof(p->sidecar_nonce), nonce_hex);
      p->state = PEER_AUTH;
      ce__ctl_log(ctl, CE_TRACE_DEBUG, "peer %llu: hello%s, challenge sent",
                  (unsigned long long)p->num, p->rank == RANK_TICKET ? " with a ticket" : "");
      peer_send_obj(p, json_pack("{s:s, s:i, s:s}", "type", "challenge", "version",
                                 CE_CONTROL_PROTOCOL_VERSION, "nonce", nonce_hex));
    }
    return;
  }
  if (p->state == PEER_AUTH) {
    if (rc != 0) {
      auth_fail(p, why);
    } else if (f.type != CE_FRAME_AUTH) {
      auth_fail(p, "the frame after the challenge is not an auth");
    } else if (!ce_control_proof_ok(ctl->token, ctl->token_len, CE_CONTROL_ROLE_PEER,
                                    ctl->session_id, p->peer_nonce, p->sidecar_nonce, f.proof)) {
      auth_fail(p, "wrong proof");
    } else {
      peer_authenticate(p);
    }
    return;
  }

  if (rc != 0) {
    peer_fail(p, why);
    return;
  }
  switch (f.type) {
  case CE_FRAME_PING:
    peer_send_obj(p, json_pack("{s:s}", "type", "pong"));
    break;
  case CE_FRAME_DECISION: {
    /* An answer for an id that timed out, was cancelled or never existed
     * is not an error: the peer cannot know that the sidecar gave up. */
    ask_t *a = ce__ctl_ask_find(ctl, f.id);
    if (a != NULL && a->state == ASK_PENDING)
      ce__ctl_ask_finish(a, CE_OK, f.allow, f.reason[0] != '\0' ? f.reason : NULL,
                         f.cacheable);
    break;
  }
  case CE_FRAME_CREDENTIAL: {
    /* A rotated secret: the proxy takes it for its next request, or
     * refuses it (no such secret, a bad value) as a violation. */
    int taken = ctl->on_credential != NULL
                    ? ctl->on_credential(ctl->credential_data, f.secret_name, f.secret_value, f.secret_value_len)
                    : CE_EINVAL;
    explicit_bzero(f.secret_value, f.secret_value_len);
    if (taken != 0)
      peer_fail(p, "credential: refused (no such secret, or a value that is not a header value)");
    else
      ce__ctl_log(ctl, CE_TRACE_INFO, "peer %llu: secret %s rotated", (unsigned long long)p->num, f.secret_name);
    break;
  }
  case CE_FRAME_HELLO:
  case CE_FRAME_AUTH:
  default:
    peer_fail(p, "a handshake frame after the handshake");
    break;
  }
}

static int line_append(peer_t *p, const char *s, size_t n) {
  size_t need = p->line_len + n;
  if (need > p->line_cap) {
    size_t ncap = p->line_cap > 0 ? p->line_cap : 4096;
    while (ncap < need)
      ncap *= 2;
    char *nline = realloc(p->line, ncap);
    if (nline == NULL)
      return CE_ENOMEM;
    p->line = nline;
    p->line_cap = ncap;
  }
  memcpy(p->line + p->line_len, s, n);
  p->line_len = need;
  return 0;
}

/* Splits what arrived into lines. A line that ends inside this read is
 * parsed in place; only the start of a line that continues in a later read
 * is copied. */
static void peer_consume(peer_t *p, const char *data, size_t n) {
  ce_control_t *ctl = p->ctl;
  while (n > 0 && !p->closing && !ctl->closing) {
    const char *nl = memchr(data, '\n', n);
    size_t take = nl != NULL ? (size_t)(nl - data) + 1 : n;
    size_t body = nl != NULL ? take - 1 : take;
    if (p->state != PEER_OPEN) {
      if (p->preauth_bytes + take > PREAUTH_MAX_BYTES) {
        auth_fail(p, "more than 4 KiB before proving the token");
        return;
      }
      p->preauth_bytes += take;
    }
    if (p->line_len + body > CE_CONTROL_MAX_FRAME - 1) {
      peer_fail(p, "a frame longer than 1 MiB");
      return;
    }
    if (nl == NULL || p->line_len > 0) {
      if (line_append(p, data, body) != 0) {
        ce__ctl_peer_close(p, "out of memory for a frame");
        return;
      }
    }
    if (nl != NULL) {
      if (p->line_len > 0) {
        peer_frame(p, p->line, p->line_len);
        p->line_len = 0;
        if (p->line_cap > LINE_KEEP_CAP) {
          free(p->line);
          p->line = NULL;
          p->line_cap = 0;
        }
      } else {
        peer_frame(p, data, body);
      }
    }
    data += take;
    n -= take;
  }
}

static void peer_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  peer_t *p = h->data;
  buf->base = p->ctl->read_buf;
  buf->len = READ_BUF_SIZE;
}

static void peer_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  peer_t *p = s->data;
  if (nread > 0) {
    peer_consume(p, buf->base, (size_t)nread);
    return;
  }
  if (nread == 0 || p->closing)
    return; /* EAGAIN, or closed by a callback */
  if (p->state != PEER_OPEN) {
    auth_fail(p, nread == UV_EOF ? "closed during the handshake"
                                 : "read failed during the handshake");
  } else if (nread == UV_EOF) {
    ce__ctl_peer_close(p, "disconnected");
  } else {
    char why[128];
    snprintf(why, sizeof(why), "read failed (%s)", uv_strerror((int)nread));
    ce__ctl_peer_close(p, why);
  }
}

static void hello_timeout_cb(uv_timer_t *t) {
  peer_t *p = t->data;
  auth_fail(p, "no handshake in time");
}

/* The oldest connection in the handshake of the lowest rank. */
static peer_t *lowest_ranked(ce_control_t *ctl) {
  peer_t *pick = ctl->preauth_head;
  for (peer_t *q = ctl->preauth_head; q != NULL && pick->rank > RANK_NONE; q = q->pa_next)
    if (q->rank < pick->rank)
      pick = q;
  return pick;
}

/* What the peer sent before it was accepted, read now rather than on the
 * loop's next turn: a hello (and its ticket) already waiting ranks the
 * connection before the next one in the same burst of accepts is taken.
 * Reading the descriptor directly is safe here: libuv buffers nothing of
 * its own and finds EAGAIN on its first read. */
static void peer_read_now(peer_t *p) {
  uv_os_fd_t fd;
  if (uv_fileno(&p->io.handle, &fd) != 0)
    return;
  ssize_t n = recv(fd, p->ctl->read_buf, READ_BUF_SIZE, MSG_DONTWAIT);
  if (n > 0)
    peer_consume(p, p->ctl->read_buf, (size_t)n);
}

void ce__ctl_on_connection(uv_stream_t *server, int status) {
  ce_control_t *ctl = server->data;
  if (status < 0) {
    ce__ctl_log(ctl, CE_TRACE_ERROR, "accept failed: %s", uv_strerror(status));
    return;
  }
  peer_t *p = calloc(1, sizeof(*p));
  if (p == NULL) {
    /* Without a handle the connection cannot be accepted, and libuv stops
     * watching the listener until it is. The process is out of memory;
     * the peer's hello times out on its side and the bridge re-dials. */
    ce__ctl_log(ctl, CE_TRACE_ERROR, "out of memory for a new peer; accepting paused");
    return;
  }
  p->ctl = ctl;
  p->num = ++ctl->next_peer_num;
  if (ctl->is_unix)
    uv_pipe_init(ctl->loop, &p->io.pipe, 0);
  else
    uv_tcp_init(ctl->loop, &p->io.tcp);
  uv_timer_init(ctl->loop, &p->hello_timer);
  p->io.handle.data = p;
  p->hello_timer.data = p;
  p->open_handles = 2;
  ctl->live_handles += 2;

  p->next = ctl->peers;
  if (ctl->peers != NULL)
    ctl->peers->prev = p;
  ctl->peers = p;

  int rc = uv_accept(server, &p->io.stream);
  if (rc != 0) {
    char why[128];
    snprintf(why, sizeof(why), "accept failed (%s)", uv_strerror(rc));
    ce__ctl_peer_close(p, why);
    return;
  }
  /* All slots taken: one goes, never the newcomer (a workspace that holds
   * connections open must not keep a newer peer out): the oldest of those
   * that ranked lowest. A peer that sent a ticket with its hello is out of
   * reach of connections that did not, however many arrive in its round
   * trip; among equals the oldest goes, so the newest still gets its
   * round trip. */
  if (ctl->unauth_count >= CE_CONTROL_MAX_PREAUTH && ctl->preauth_head != NULL)
    auth_fail(lowest_ranked(ctl), "evicted: too many connections in the handshake");
  preauth_append(p);
  ce__ctl_log(ctl, CE_TRACE_DEBUG, "peer %llu: accepted (%zu in the handshake)",
              (unsigned long long)p->num, ctl->unauth_count);
  if (!ctl->is_unix)
    uv_tcp_nodelay(&p->io.tcp, 1); /* frames are small and decisions urgent */
  uv_timer_start(&p->hello_timer, hello_timeout_cb, ctl->hello_timeout_ms, 0);
  rc = uv_read_start(&p->io.stream, peer_alloc_cb, peer_read_cb);
  if (rc != 0) {
    char why[128];
    snprintf(why, sizeof(why), "cannot read (%s)", uv_strerror(rc));
    ce__ctl_peer_close(p, why);
    return;
  }
  peer_read_now(p);
}
