/*
 * The control channel (control.h, docs/control-channel.md).
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
#include "control/control.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "control/frame.h"
#include "control/handshake.h"
#include "control/listen.h"

/* ---- limits ---------------------------------------------------------------- */

/* The hello and auth lines are under 500 bytes together; a peer that sends
 * this much without proving the token is not a peer that knows the
 * protocol. */
#define PREAUTH_MAX_BYTES 4096
/* The bridge dials one connection at a time, but the workspace may flood
 * the port: a long accept queue keeps the peer's connection from being
 * dropped before it is accepted (the kernel caps it at somaxconn). */
#define LISTEN_BACKLOG 512
/* control_refused events: at most one per this many ms; the refusals in
 * between are counted in the next one, so a workspace that connects in a
 * loop cannot push request events out of the buffer. */
#define REFUSED_EVENT_MS 1000u
/* One read buffer shared by every peer: libuv calls alloc and read back to
 * back for one handle, and the read callback consumes the bytes before it
 * returns, so no two reads ever hold it at once. */
#define READ_BUF_SIZE (64u * 1024u)
/* A peer line buffer larger than this is given back after the frame. */
#define LINE_KEEP_CAP (64u * 1024u)
/* Bytes waiting for stdout. Past this the pod log reader is not keeping
 * up, and the loop must not stall or grow for it: events are dropped from
 * stdout (and counted) until the queue drains. */
#define STDOUT_QUEUE_MAX (8u * 1024u * 1024u)
/* Event lines for stdout are gathered here and written once per turn of
 * the loop (one write(2) or uv_write for all of them) instead of once per
 * event; a line that does not fit after a flush, or any line when the
 * batch cannot be allocated, is written on its own as before. */
#define OUT_BATCH_CAP (64u * 1024u)
/* Bytes waiting for the peer. Past the soft bound events go to the ring
 * instead (where the oldest are dropped); past the hard bound the peer is
 * taken as stuck and closed, so that a re-dialled bridge gets a fresh
 * start and the pending asks are sent to it. Asks, the welcome frame and
 * pongs ignore the soft bound: they are small in number and urgent. */
#define PEER_QUEUE_SOFT (4u * 1024u * 1024u)
#define PEER_QUEUE_HARD (64u * 1024u * 1024u)
/* The ring holds at most opts.buffer_events lines and at most this many
 * bytes, whichever is reached first. */
#define RING_MAX_BYTES (64u * 1024u * 1024u)
#define RING_MAX_EVENTS (1024u * 1024u)
/* Log lines per second before the rest are counted and summarised: a
 * process in the workspace can make the channel log at will (by
 * connecting), and stderr is the pod log. */
#define LOG_BURST 10
#define LOG_LINE_MAX 512

typedef struct peer peer_t;
typedef struct ask ask_t;

/* Any stream this file opens: the listener, a peer, stdout. */
typedef union {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
  uv_tty_t tty;
} stream_u;

/* A peer's place in the handshake (docs/control-channel.md). */
typedef enum {
  PEER_HELLO,                /* accepted; waits for hello */
  PEER_AUTH,                 /* challenge sent; waits for the peer's proof */
  PEER_OPEN                  /* proved the token */
} peer_state_t;

struct peer {
  peer_t *prev, *next;       /* ctl->peers, while not closing */
  peer_t *pa_prev, *pa_next; /* ctl->preauth_*, oldest first, while counted */
  ce_control_t *ctl;
  uint64_t num;              /* for logs: "peer 3" */
  stream_u io;
  uv_timer_t hello_timer;    /* the handshake deadline */
  uv_shutdown_t shutdown;    /* used once, when the channel closes */
  int open_handles;          /* io and hello_timer; freed at zero */
  bool counted;              /* in the pre-authentication queue */
  peer_state_t state;
  bool closing;
  uint8_t peer_nonce[CE_CONTROL_NONCE_LEN];
  uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN];
  size_t preauth_bytes;
  char *line;                /* a frame split across reads */
  size_t line_len, line_cap;
};

typedef enum { ASK_PENDING, ASK_FAILED, ASK_DONE } ask_state_t;

struct ask {
  ask_t *prev, *next;        /* ctl->asks, in id order, until answered */
  ce_control_t *ctl;
  uint64_t id;
  ask_state_t state;         /* ASK_FAILED: the timer delivers `status` */
  int status;
  ce__line_t *line;          /* the decision_request frame (PENDING only) */
  uv_timer_t timer;
  ce_control_decision_cb cb;
  void *data;
};

/* One uv_write of one line; the line stays referenced until the callback. */
typedef struct {
  uv_write_t req;
  ce__line_t *line;
} write_req_t;

typedef enum { OUT_NONE, OUT_FILE, OUT_STREAM } out_kind_t;

struct ce_control {
  int (*on_credential)(void *data, const char *name, const char *value, size_t value_len);
  void *credential_data;
  uv_loop_t *loop;

  stream_u listeners[2];     /* TCP: the given family and the other loopback */
  int nlisteners;
  bool is_unix;
  char unix_path[CE__LISTEN_PATH_MAX];
  int port;

  uint8_t token[CE_CONTROL_TOKEN_MAX];
  size_t token_len;
  char *session_id;
  uint32_t hello_timeout_ms;

  peer_t *peers;             /* every peer not closing, authenticated or not */
  peer_t *preauth_head, *preauth_tail; /* in the handshake, oldest first */
  size_t unauth_count;
  peer_t *peer;              /* the authenticated one, or NULL */
  uint64_t next_peer_num;
  char *read_buf;

  ce__line_t **ring;         /* events waiting for a peer, oldest at head */
  size_t ring_cap, ring_head, ring_count, ring_bytes;

  out_kind_t out_kind;
  int out_fd;                /* OUT_FILE: the caller's descriptor (borrowed) */
  stream_u out;              /* OUT_STREAM: owns its own descriptor */
  bool out_broken;
  uv_shutdown_t out_shutdown;
  char *out_batch;           /* OUT_BATCH_CAP bytes, allocated at the first event */
  size_t out_batch_len;
  uint64_t out_batch_events; /* lines in out_batch, for the drop count */
  uv_prepare_t out_prepare;  /* flush before the loop waits (after timers) */
  uv_check_t out_check;      /* flush after the I/O callbacks */
  bool out_flush_handles;    /* both initialised (stdout not OUT_NONE) */

  ask_t *asks_head, *asks_tail;
  size_t pending;            /* asks in ASK_PENDING */
  uint64_t next_id;

  uint64_t seq, events, dropped, stdout_dropped, auth_failures;

  /* control_refused events (REFUSED_EVENT_MS apart at most) */
  uv_timer_t refused_timer;
  uint64_t refused_pending;  /* refusals not yet in an event */
  const char *refused_why;   /* the latest one's reason (a static string) */
  uint64_t refused_last_ms;  /* when the last event went, 0 = never */
  uint64_t refused_events;

  uint64_t log_window;
  unsigned log_count;
  uint64_t log_suppressed;

  bool closing;
  unsigned live_handles;     /* initialised and not yet closed */
  uv_timer_t flush_timer;
  bool flush_timer_open;
  peer_t *draining_peer;
  bool out_draining;
  void (*done)(void *data);
  void *done_data;
};

/* ---- small helpers ---------------------------------------------------------- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Log lines go through common/trace.h at `level`, under a burst limit
 * (LOG_BURST a second) because a misbehaving peer can cause one per frame. */
static void ctl_log(ce_control_t *ctl, ce_trace_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void ctl_log(ce_control_t *ctl, ce_trace_level_t level, const char *fmt, ...) {
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

static void close_if_open(uv_handle_t *h, uv_close_cb cb) {
  if (!uv_is_closing(h))
    uv_close(h, cb);
}

static void finish_close(ce_control_t *ctl);
static void ctl_handle_closed(uv_handle_t *h);

/* Every close callback ends here. When the channel is closing and only the
 * flush timer is left, nothing more can be drained, so the timer goes too;
 * when nothing is left, the channel is freed. */
static void handle_closed(ce_control_t *ctl) {
  ctl->live_handles--;
  if (!ctl->closing)
    return;
  if (ctl->live_handles == 1 && ctl->flush_timer_open &&
      !uv_is_closing((uv_handle_t *)&ctl->flush_timer))
    uv_close((uv_handle_t *)&ctl->flush_timer, ctl_handle_closed);
  if (ctl->live_handles == 0)
    finish_close(ctl);
}

static void ctl_handle_closed(uv_handle_t *h) {
  handle_closed(h->data);
}

static size_t queued_bytes(stream_u *s) {
  return uv_stream_get_write_queue_size(&s->stream);
}

/* ---- stdout ---------------------------------------------------------------- */

static void out_write_cb(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  ce_control_t *ctl = req->handle->data;
  ce__line_unref(w->line);
  free(w);
  if (status < 0 && status != UV_ECANCELED && !ctl->out_broken) {
    ctl->out_broken = true;
    ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
            uv_strerror(status));
  }
}

static void out_drop(ce_control_t *ctl, const char *why) {
  if (ctl->stdout_dropped++ == 0)
    ctl_log(ctl, CE_TRACE_WARN, "dropping events from stdout: %s", why);
}

/* Regular files (and character devices) are not pollable, and a write to
 * them does not wait for a reader, so they are written synchronously.
 * `events` lines are in data; they count as dropped when it fails. */
static void out_write_file(ce_control_t *ctl, const char *data, size_t len, uint64_t events) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(ctl->out_fd, data + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && off == 0) {
      out_drop(ctl, "stdout would block");
      ctl->stdout_dropped += events - 1;
      return;
    }
    if (n <= 0) {
      ctl->out_broken = true;
      ctl->stdout_dropped += events;
      ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
              n < 0 ? strerror(errno) : "wrote nothing");
      return;
    }
    off += (size_t)n;
  }
}

/* One uv_write of a batch; the bytes live after the request. */
typedef struct {
  uv_write_t req;
  char data[];
} batch_req_t;

static void out_batch_cb(uv_write_t *req, int status) {
  ce_control_t *ctl = req->handle->data;
  free(req);
  if (status < 0 && status != UV_ECANCELED && !ctl->out_broken) {
    ctl->out_broken = true;
    ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
            uv_strerror(status));
  }
}

/* Queues data (events lines) on the stdout stream, in a copy when line is
 * NULL, else by reference to line. */
static void out_write_stream(ce_control_t *ctl, const char *data, size_t len, uint64_t events,
                             ce__line_t *line) {
  if (queued_bytes(&ctl->out) + len > STDOUT_QUEUE_MAX) {
    out_drop(ctl, "the stdout queue is over 8 MiB");
    ctl->stdout_dropped += events - 1;
    return;
  }
  uv_write_t *req;
  uv_buf_t buf;
  uv_write_cb cb;
  if (line != NULL) {
    write_req_t *w = malloc(sizeof(*w));
    if (w == NULL) {
      out_drop(ctl, "out of memory");
      return;
    }
    w->line = ce__line_ref(line);
    req = &w->req;
    buf = uv_buf_init(line->data, (unsigned int)line->len);
    cb = out_write_cb;
  } else {
    batch_req_t *b = malloc(sizeof(*b) + len);
    if (b == NULL) {
      out_drop(ctl, "out of memory");
      ctl->stdout_dropped += events - 1;
      return;
    }
    memcpy(b->data, data, len);
    req = &b->req;
    buf = uv_buf_init(b->data, (unsigned int)len);
    cb = out_batch_cb;
  }
  int rc = uv_write(req, &ctl->out.stream, &buf, 1, cb);
  if (rc != 0) {
    if (line != NULL)
      ce__line_unref(line);
    free(req); /* the request is the first member of either kind */
    ctl->out_broken = true;
    ctl->stdout_dropped += events;
    ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
            uv_strerror(rc));
  }
}

/* Writes out whatever the batch holds. */
static void out_flush(ce_control_t *ctl) {
  if (ctl->out_batch_len == 0)
    return;
  size_t len = ctl->out_batch_len;
  uint64_t events = ctl->out_batch_events;
  ctl->out_batch_len = 0;
  ctl->out_batch_events = 0;
  if (ctl->out_flush_handles) {
    uv_prepare_stop(&ctl->out_prepare);
    uv_check_stop(&ctl->out_check);
  }
  if (ctl->out_broken) {
    ctl->stdout_dropped += events;
    return;
  }
  if (ctl->out_kind == OUT_FILE)
    out_write_file(ctl, ctl->out_batch, len, events);
  else
    out_write_stream(ctl, ctl->out_batch, len, events, NULL);
}

static void out_prepare_cb(uv_prepare_t *h) { out_flush(h->data); }
static void out_check_cb(uv_check_t *h) { out_flush(h->data); }

static void out_write(ce_control_t *ctl, ce__line_t *line) {
  if (ctl->out_kind == OUT_NONE)
    return;
  if (ctl->out_broken || ctl->out_draining) {
    ctl->stdout_dropped++;
    return;
  }
  if (ctl->out_batch_len + line->len > OUT_BATCH_CAP)
    out_flush(ctl);
  if (ctl->out_batch == NULL && ctl->out_flush_handles)
    ctl->out_batch = malloc(OUT_BATCH_CAP); /* NULL: every line on its own */
  if (ctl->out_broken) {
    ctl->stdout_dropped++;
    return;
  }
  if (ctl->out_batch == NULL || line->len > OUT_BATCH_CAP) {
    if (ctl->out_kind == OUT_FILE)
      out_write_file(ctl, line->data, line->len, 1);
    else
      out_write_stream(ctl, line->data, line->len, 1, line);
    return;
  }
  if (ctl->out_batch_len == 0) {
    uv_prepare_start(&ctl->out_prepare, out_prepare_cb);
    uv_check_start(&ctl->out_check, out_check_cb);
  }
  memcpy(ctl->out_batch + ctl->out_batch_len, line->data, line->len);
  ctl->out_batch_len += line->len;
  ctl->out_batch_events++;
}

/*
 * Decides how stdout_fd is written and, for streams, opens a descriptor of
 * our own so that libuv may make it non-blocking and close it. A pipe is
 * reopened through /proc (a new open file description, as libuv does for
 * ttys) so that O_NONBLOCK does not leak to other writers of the same pipe,
 * such as stderr after 2>&1; anything that cannot be reopened (a socket) is
 * dup'ed. Only raw descriptors here: nothing touches the loop yet.
 */
static int out_prepare(ce_control_t *ctl, int fd, int *own_fd, uv_handle_type *type,
                       char *err, size_t errlen) {
  *own_fd = -1;
  if (fd < 0) {
    ctl->out_kind = OUT_NONE;
    return 0;
  }
  *type = uv_guess_handle(fd);
  switch (*type) {
  case UV_FILE:
    ctl->out_kind = OUT_FILE;
    ctl->out_fd = fd;
    return 0;
  case UV_TTY:
  case UV_NAMED_PIPE:
  case UV_TCP: {
    int nfd = -1;
    if (*type == UV_NAMED_PIPE) {
      char path[64];
      snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
      nfd = open(path, O_WRONLY | O_CLOEXEC);
    }
    if (nfd < 0)
      nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (nfd < 0) {
      set_err(err, errlen, "stdout_fd %d: cannot duplicate: %s", fd, strerror(errno));
      return CE_EINVAL;
    }
    if (*type == UV_TCP)
      *type = UV_NAMED_PIPE; /* a uv_pipe_t writes any stream socket */
    ctl->out_kind = OUT_STREAM;
    *own_fd = nfd;
    return 0;
  }
  default:
    set_err(err, errlen, "stdout_fd %d is not an open, writable descriptor", fd);
    return CE_EINVAL;
  }
}

/* Takes own_fd in every case. */
static int out_open(ce_control_t *ctl, int own_fd, uv_handle_type type) {
  int rc;
  if (type == UV_TTY) {
    rc = uv_tty_init(ctl->loop, &ctl->out.tty, own_fd, 0);
    if (rc != 0) {
      /* uv_tty_init fails before the handle joins the loop. */
      close(own_fd);
      ctl->out_kind = OUT_NONE;
      return rc;
    }
    /* libuv reopens the terminal by name when it can and then writes to
     * the new descriptor; ours is no longer needed. */
    uv_os_fd_t used = -1;
    uv_fileno(&ctl->out.handle, &used);
    if (used != own_fd)
      close(own_fd);
  } else {
    rc = uv_pipe_init(ctl->loop, &ctl->out.pipe, 0);
    if (rc != 0) {
      close(own_fd);
      return rc;
    }
    rc = uv_pipe_open(&ctl->out.pipe, own_fd);
    if (rc != 0)
      close(own_fd);
  }
  ctl->out.handle.data = ctl;
  ctl->live_handles++;
  return rc;
}

/* ---- the event ring -------------------------------------------------------- */

static ce__line_t *ring_pop(ce_control_t *ctl) {
  ce__line_t *line = ctl->ring[ctl->ring_head];
  ctl->ring[ctl->ring_head] = NULL;
  ctl->ring_head = (ctl->ring_head + 1) % ctl->ring_cap;
  ctl->ring_count--;
  ctl->ring_bytes -= line->len;
  return line;
}

static void ring_push(ce_control_t *ctl, ce__line_t *line) {
  while (ctl->ring_count > 0 && (ctl->ring_count == ctl->ring_cap ||
                                 ctl->ring_bytes + line->len > RING_MAX_BYTES)) {
    ce__line_unref(ring_pop(ctl));
    ctl->dropped++;
  }
  size_t tail = (ctl->ring_head + ctl->ring_count) % ctl->ring_cap;
  ctl->ring[tail] = ce__line_ref(line);
  ctl->ring_count++;
  ctl->ring_bytes += line->len;
}

static void ring_clear(ce_control_t *ctl) {
  while (ctl->ring_count > 0)
    ce__line_unref(ring_pop(ctl));
}

/* ---- peers ------------------------------------------------------------------ */

static void peer_handle_closed(uv_handle_t *h) {
  peer_t *p = h->data;
  ce_control_t *ctl = p->ctl;
  if (--p->open_handles == 0) {
    if (ctl->draining_peer == p)
      ctl->draining_peer = NULL;
    free(p->line);
    free(p);
  }
  handle_closed(ctl);
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

static void peer_unlink(peer_t *p) {
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
static void peer_close(peer_t *p, const char *why) {
  if (p->closing)
    return;
  p->closing = true;
  peer_unlink(p);
  if (why != NULL)
    ctl_log(p->ctl, CE_TRACE_INFO, "peer %llu: %s; closed", (unsigned long long)p->num, why);
  uv_close(&p->io.handle, peer_handle_closed);
  uv_close((uv_handle_t *)&p->hello_timer, peer_handle_closed);
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
  ctl_log(ctl, CE_TRACE_INFO, "peer %llu dropped before authenticating: %s",
          (unsigned long long)p->num, why);
  peer_close(p, NULL);
  refused_note(ctl, why);
}

static void peer_fail(peer_t *p, const char *why) {
  if (p->state != PEER_OPEN) {
    auth_fail(p, why);
    return;
  }
  ctl_log(p->ctl, CE_TRACE_WARN, "peer %llu: protocol violation (%s); closed",
          (unsigned long long)p->num, why);
  peer_close(p, NULL);
}

static void flush_ring(ce_control_t *ctl);

static void peer_write_cb(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  peer_t *p = req->handle->data;
  ce_control_t *ctl = p->ctl;
  ce__line_unref(w->line);
  free(w);
  if (status < 0) {
    if (status != UV_ECANCELED && !p->closing) {
      char why[128];
      snprintf(why, sizeof(why), "write failed (%s)", uv_strerror(status));
      peer_close(p, why);
    }
    return;
  }
  if (p == ctl->peer && !ctl->closing)
    flush_ring(ctl);
}

static void peer_send(peer_t *p, ce__line_t *line) {
  if (p->closing)
    return;
  if (queued_bytes(&p->io) + line->len > PEER_QUEUE_HARD) {
    peer_close(p, "is not reading (over 64 MiB waiting to be written)");
    return;
  }
  write_req_t *w = malloc(sizeof(*w));
  if (w == NULL) {
    peer_close(p, "out of memory for a write");
    return;
  }
  w->line = ce__line_ref(line);
  uv_buf_t buf = uv_buf_init(line->data, (unsigned int)line->len);
  int rc = uv_write(&w->req, &p->io.stream, &buf, 1, peer_write_cb);
  if (rc != 0) {
    ce__line_unref(w->line);
    free(w);
    char why[128];
    snprintf(why, sizeof(why), "write failed (%s)", uv_strerror(rc));
    peer_close(p, why);
  }
}

/* Sends a frame built from a jansson object, for the few frames that are
 * not events or asks (welcome, pong). Takes ownership of obj. */
static void peer_send_obj(peer_t *p, json_t *obj) {
  ce__line_t *line = NULL;
  int rc = obj != NULL ? ce__line_encode(obj, &line) : CE_ENOMEM;
  json_decref(obj);
  if (rc != 0) {
    peer_close(p, ce_strerror(rc));
    return;
  }
  peer_send(p, line);
  ce__line_unref(line);
}

/* Moves buffered events to the peer while its queue is under the soft
 * bound; the peer's write callbacks call it again as the queue drains. */
static void flush_ring(ce_control_t *ctl) {
  peer_t *p = ctl->peer;
  while (p != NULL && ctl->ring_count > 0 && queued_bytes(&p->io) < PEER_QUEUE_SOFT) {
    ce__line_t *line = ring_pop(ctl);
    peer_send(p, line);
    ce__line_unref(line);
    p = ctl->peer; /* NULL if the write failed and closed it */
  }
}

static void peer_authenticate(peer_t *p) {
  ce_control_t *ctl = p->ctl;
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  char proof_hex[2 * CE_CONTROL_PROOF_LEN + 1];
  if (ce_control_proof(ctl->token, ctl->token_len, CE_CONTROL_ROLE_SIDECAR, ctl->session_id,
                       p->peer_nonce, p->sidecar_nonce, proof) != CE_OK) {
    peer_close(p, "cannot compute the sidecar's proof");
    return;
  }
  ce_control_hex(proof, sizeof(proof), proof_hex);
  p->state = PEER_OPEN;
  preauth_remove(p);
  uv_timer_stop(&p->hello_timer);
  if (ctl->peer != NULL)
    peer_close(ctl->peer, "replaced by a newly authenticated peer");
  ctl->peer = p;
  ctl_log(ctl, CE_TRACE_INFO, "peer %llu authenticated", (unsigned long long)p->num);

  /* The welcome first, then the asks still waiting (they are urgent: a
   * request is on hold for each), then the buffered events in order. */
  peer_send_obj(p, json_pack("{s:s, s:i, s:s, s:s, s:I}", "type", "welcome", "version",
                             CE_CONTROL_PROTOCOL_VERSION, "session_id", ctl->session_id,
                             "proof", proof_hex, "dropped", (json_int_t)ctl->dropped));
  for (ask_t *a = ctl->asks_head; a != NULL && !p->closing; a = a->next) {
    if (a->state == ASK_PENDING)
      peer_send(p, a->line);
  }
  flush_ring(ctl);
}

static ask_t *ask_find(ce_control_t *ctl, uint64_t id);
static void ask_finish(ask_t *a, int status, bool allow, const char *reason,
                       bool cacheable);

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
      ce_control_hex(p->sidecar_nonce, sizeof(p->sidecar_nonce), nonce_hex);
      p->state = PEER_AUTH;
      ctl_log(ctl, CE_TRACE_DEBUG, "peer %llu: hello, challenge sent", (unsigned long long)p->num);
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
    ask_t *a = ask_find(ctl, f.id);
    if (a != NULL && a->state == ASK_PENDING)
      ask_finish(a, CE_OK, f.allow, f.reason[0] != '\0' ? f.reason : NULL,
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
      ctl_log(ctl, CE_TRACE_INFO, "peer %llu: secret %s rotated", (unsigned long long)p->num, f.secret_name);
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
        peer_close(p, "out of memory for a frame");
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
    auth_fail(p, nread == UV_EOF ? "closed during the handshake" : "read failed during the handshake");
  } else if (nread == UV_EOF) {
    peer_close(p, "disconnected");
  } else {
    char why[128];
    snprintf(why, sizeof(why), "read failed (%s)", uv_strerror((int)nread));
    peer_close(p, why);
  }
}

static void hello_timeout_cb(uv_timer_t *t) {
  peer_t *p = t->data;
  auth_fail(p, "no handshake in time");
}

static void on_connection(uv_stream_t *server, int status) {
  ce_control_t *ctl = server->data;
  if (status < 0) {
    ctl_log(ctl, CE_TRACE_ERROR, "accept failed: %s", uv_strerror(status));
    return;
  }
  peer_t *p = calloc(1, sizeof(*p));
  if (p == NULL) {
    /* Without a handle the connection cannot be accepted, and libuv stops
     * watching the listener until it is. The process is out of memory;
     * the peer's hello times out on its side and the bridge re-dials. */
    ctl_log(ctl, CE_TRACE_ERROR, "out of memory for a new peer; accepting paused");
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
    peer_close(p, why);
    return;
  }
  /* All slots taken: the oldest goes, never the newcomer. A workspace that
   * holds connections open cannot keep a peer out, since the peer's
   * connection is always the newest when it arrives and needs a slot only
   * for one round trip. */
  if (ctl->unauth_count >= CE_CONTROL_MAX_PREAUTH && ctl->preauth_head != NULL)
    auth_fail(ctl->preauth_head, "evicted: the oldest of too many connections in the handshake");
  preauth_append(p);
  ctl_log(ctl, CE_TRACE_DEBUG, "peer %llu: accepted (%zu in the handshake)",
          (unsigned long long)p->num, ctl->unauth_count);
  if (!ctl->is_unix)
    uv_tcp_nodelay(&p->io.tcp, 1); /* frames are small and decisions urgent */
  uv_timer_start(&p->hello_timer, hello_timeout_cb, ctl->hello_timeout_ms, 0);
  rc = uv_read_start(&p->io.stream, peer_alloc_cb, peer_read_cb);
  if (rc != 0) {
    char why[128];
    snprintf(why, sizeof(why), "cannot read (%s)", uv_strerror(rc));
    peer_close(p, why);
  }
}

/* ---- asks -------------------------------------------------------------------- */

static ask_t *ask_find(ce_control_t *ctl, uint64_t id) {
  /* At most CE_CONTROL_MAX_PENDING_ASKS (plus a few failed ones waiting
   * for their callback) in id order: a scan is cheaper than any index at
   * this size, and it stops at the first larger id. */
  for (ask_t *a = ctl->asks_head; a != NULL && a->id <= id; a = a->next) {
    if (a->id == id)
      return a;
  }
  return NULL;
}

static void ask_closed_cb(uv_handle_t *h) {
  ask_t *a = h->data;
  ce_control_t *ctl = a->ctl;
  ce__line_unref(a->line);
  free(a);
  handle_closed(ctl);
}

/* Takes the ask off the list and closes its timer; the ask is freed in the
 * timer's close callback. */
static void ask_forget(ask_t *a) {
  ce_control_t *ctl = a->ctl;
  if (a->prev != NULL)
    a->prev->next = a->next;
  else
    ctl->asks_head = a->next;
  if (a->next != NULL)
    a->next->prev = a->prev;
  else
    ctl->asks_tail = a->prev;
  a->prev = a->next = NULL;
  if (a->state == ASK_PENDING)
    ctl->pending--;
  a->state = ASK_DONE;
  uv_close((uv_handle_t *)&a->timer, ask_closed_cb);
}

static void ask_finish(ask_t *a, int status, bool allow, const char *reason,
                       bool cacheable) {
  ce_control_decision_cb cb = a->cb;
  void *data = a->data;
  ask_forget(a);
  if (status != CE_OK) {
    allow = false;
    reason = NULL;
    cacheable = false;
  }
  cb(data, status, allow, reason, cacheable);
}

static void ask_timer_cb(uv_timer_t *t) {
  ask_t *a = t->data;
  ask_finish(a, a->state == ASK_FAILED ? a->status : CE_ETIMEDOUT, false, NULL,
             false);
}

uint64_t ce_control_ask_with(ce_control_t *ctl, ce_control_write_fn write, const void *arg,
                             uint32_t timeout_ms, ce_control_decision_cb cb, void *data) {
  if (ctl->closing)
    return 0;
  ask_t *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return 0;
  a->ctl = ctl;
  a->id = ++ctl->next_id;
  a->cb = cb;
  a->data = data;
  uv_timer_init(ctl->loop, &a->timer);
  a->timer.data = a;
  ctl->live_handles++;

  a->prev = ctl->asks_tail;
  if (ctl->asks_tail != NULL)
    ctl->asks_tail->next = a;
  else
    ctl->asks_head = a;
  ctl->asks_tail = a;

  int status = CE_OK;
  if (ctl->pending >= CE_CONTROL_MAX_PENDING_ASKS) {
    status = CE_EUNAVAIL;
  } else {
    status = ce__line_encode_frame_with("decision_request", "id", a->id, true, write, arg,
                                        &a->line);
    if (status == CE_ETOOBIG)
      status = CE_EINVAL;
  }

  if (status != CE_OK) {
    /* Failures are delivered by a zero timer, so the callback never runs
     * inside ce_control_ask, where the caller may not be ready for it. */
    a->state = ASK_FAILED;
    a->status = status;
    uv_timer_start(&a->timer, ask_timer_cb, 0, 0);
    return a->id;
  }
  a->state = ASK_PENDING;
  ctl->pending++;
  uv_timer_start(&a->timer, ask_timer_cb, timeout_ms, 0);
  if (ctl->peer != NULL)
    peer_send(ctl->peer, a->line);
  return a->id;
}

uint64_t ce_control_ask(ce_control_t *ctl, json_t *request, uint32_t timeout_ms,
                        ce_control_decision_cb cb, void *data) {
  /* Anything but an object fails the ask with CE_EINVAL. */
  ce__json_fields_t f = {request, "id"};
  uint64_t id = ce_control_ask_with(ctl, ce__line_write_json_fields, &f, timeout_ms, cb, data);
  json_decref(request);
  return id;
}

void ce_control_cancel(ce_control_t *ctl, uint64_t id) {
  ask_t *a = ask_find(ctl, id);
  if (a != NULL)
    ask_forget(a);
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
    ctl_log(ctl, CE_TRACE_WARN, "event %llu dropped: %s", (unsigned long long)seq,
            rc == CE_EINVAL ? "not an encodable JSON object" : ce_strerror(rc));
    return;
  }
  out_write(ctl, line);
  /* Straight to the peer only when nothing older is waiting in the ring,
   * so the peer always sees events in seq order. */
  peer_t *p = ctl->peer;
  if (p != NULL && ctl->ring_count == 0 && queued_bytes(&p->io) < PEER_QUEUE_SOFT)
    peer_send(p, line);
  else
    ring_push(ctl, line);
  ce__line_unref(line);
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
    set_err(err, errlen, "token: %u to %u bytes are required", CE_CONTROL_TOKEN_MIN,
            CE_CONTROL_TOKEN_MAX);
    return CE_EINVAL;
  }
  if (opts->buffer_events > RING_MAX_EVENTS) {
    set_err(err, errlen, "buffer_events: at most %u", RING_MAX_EVENTS);
    return CE_EINVAL;
  }
  /* The peer names the session it wants and both proofs cover it: an
   * empty id would let any session's peer match. */
  size_t n = opts->session_id != NULL ? strlen(opts->session_id) : 0;
  json_t *probe = n > 0 ? json_stringn(opts->session_id, n) : NULL; /* NULL unless UTF-8 */
  bool ok = probe != NULL && n <= CE_CONTROL_SESSION_ID_MAX;
  json_decref(probe);
  if (!ok) {
    set_err(err, errlen, "session_id: 1 to %u bytes of UTF-8 are required",
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
  set_err(err, errlen, "%s", "");
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
  rc = out_prepare(ctl, opts->stdout_fd, &out_fd, &out_type, err, errlen);
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
      lrc = uv_listen(&l->stream, LISTEN_BACKLOG, on_connection);
    if (rc == 0)
      rc = lrc;
  }
  int orc = ctl->out_kind == OUT_STREAM ? out_open(ctl, out_fd, out_type) : 0;
  if (ctl->out_kind != OUT_NONE) {
    uv_prepare_init(loop, &ctl->out_prepare);
    uv_check_init(loop, &ctl->out_check);
    ctl->out_prepare.data = ctl;
    ctl->out_check.data = ctl;
    ctl->live_handles += 2;
    ctl->out_flush_handles = true;
  }
  if (rc == 0)
    rc = orc;
  if (rc != 0) {
    set_err(err, errlen, "cannot attach the listener or stdout to the loop: %s",
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
  set_err(err, errlen, "%s", ce_strerror(CE_ENOMEM));
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

static void finish_close(ce_control_t *ctl) {
  void (*done)(void *) = ctl->done;
  void *data = ctl->done_data;
  ring_clear(ctl);
  free_unstarted(ctl);
  if (done != NULL)
    done(data);
}

static void out_shutdown_cb(uv_shutdown_t *req, int status) {
  ce_control_t *ctl = req->handle->data;
  close_if_open(&ctl->out.handle, ctl_handle_closed);
}

static void peer_shutdown_cb(uv_shutdown_t *req, int status) {
  peer_t *p = req->handle->data;
  close_if_open(&p->io.handle, peer_handle_closed);
}

/* The flush deadline: whatever has not drained by now is closed, and its
 * queued writes are cancelled. */
static void flush_timer_cb(uv_timer_t *t) {
  ce_control_t *ctl = t->data;
  if (ctl->draining_peer != NULL)
    close_if_open(&ctl->draining_peer->io.handle, peer_handle_closed);
  if (ctl->out_draining)
    close_if_open(&ctl->out.handle, ctl_handle_closed);
  close_if_open((uv_handle_t *)&ctl->flush_timer, ctl_handle_closed);
}

void ce_control_close(ce_control_t *ctl, void (*done)(void *data), void *data) {
  if (ctl->closing)
    return;
  ctl->closing = true;
  ctl->done = done;
  ctl->done_data = data;

  /* Events of this turn of the loop still in the stdout batch go out
   * first, ahead of the stream's shutdown. */
  out_flush(ctl);
  if (ctl->out_flush_handles) {
    close_if_open((uv_handle_t *)&ctl->out_prepare, ctl_handle_closed);
    close_if_open((uv_handle_t *)&ctl->out_check, ctl_handle_closed);
  }

  /* The asks first, while everything else still stands: their callbacks
   * may emit or ask, which now only frees. */
  for (;;) {
    ask_t *a = ctl->asks_head;
    if (a == NULL)
      break;
    ask_finish(a, CE_EUNAVAIL, false, NULL, false);
  }

  for (int i = 0; i < ctl->nlisteners; i++)
    close_if_open(&ctl->listeners[i].handle, ctl_handle_closed);
  close_if_open((uv_handle_t *)&ctl->refused_timer, ctl_handle_closed);
  if (ctl->is_unix)
    ce__listen_remove(ctl->unix_path);

  bool draining = false;
  peer_t *authed = ctl->peer;
  for (;;) {
    peer_t *p = ctl->peers;
    if (p == NULL)
      break;
    if (p != authed) {
      peer_close(p, NULL);
      continue;
    }
    /* The authenticated peer gets what is already queued for it, then an
     * orderly end of stream. */
    p->closing = true;
    peer_unlink(p);
    uv_read_stop(&p->io.stream);
    uv_close((uv_handle_t *)&p->hello_timer, peer_handle_closed);
    p->shutdown.data = p;
    if (uv_shutdown(&p->shutdown, &p->io.stream, peer_shutdown_cb) == 0) {
      ctl->draining_peer = p;
      draining = true;
    } else {
      uv_close(&p->io.handle, peer_handle_closed);
    }
  }

  if (ctl->out_kind == OUT_STREAM && !uv_is_closing(&ctl->out.handle)) {
    if (uv_shutdown(&ctl->out_shutdown, &ctl->out.stream, out_shutdown_cb) == 0) {
      ctl->out_draining = true;
      draining = true;
    } else {
      uv_close(&ctl->out.handle, ctl_handle_closed);
    }
  }

  if (draining) {
    uv_timer_init(ctl->loop, &ctl->flush_timer);
    ctl->flush_timer.data = ctl;
    ctl->flush_timer_open = true;
    ctl->live_handles++;
    uv_timer_start(&ctl->flush_timer, flush_timer_cb, CE_CONTROL_CLOSE_FLUSH_MS, 0);
  }
  ring_clear(ctl);
}
