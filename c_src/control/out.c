/*
 * The control channel's audit trail on stdout (internal.h): every event
 * line, gathered and written when the batch is full or OUT_BATCH_MS after
 * its first line (a timer flushes it), to a file descriptor with write(2) or to a
 * pipe or TTY through libuv; past STDOUT_QUEUE_MAX waiting, lines are
 * dropped and counted rather than stall the loop.
 */
#include "control/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

static void out_write_cb(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  ce_control_t *ctl = req->handle->data;
  ce__line_unref(w->line);
  free(w);
  if (status < 0 && status != UV_ECANCELED && !ctl->out_broken) {
    ctl->out_broken = true;
    ce__ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
                uv_strerror(status));
  }
}

static void out_drop(ce_control_t *ctl, const char *why) {
  if (ctl->stdout_dropped++ == 0)
    ce__ctl_log(ctl, CE_TRACE_WARN, "dropping events from stdout: %s", why);
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
      ce__ctl_log(ctl, CE_TRACE_WARN,
                  "stdout write failed (%s); events are no longer written there",
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
    ce__ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
                uv_strerror(status));
  }
}

/* Queues data (events lines) on the stdout stream, in a copy when line is
 * NULL, else by reference to line. */
static void out_write_stream(ce_control_t *ctl, const char *data, size_t len, uint64_t events,
                             ce__line_t *line) {
  if (ce__ctl_queued_bytes(&ctl->out) + len > STDOUT_QUEUE_MAX) {
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
    ce__ctl_log(ctl, CE_TRACE_WARN, "stdout write failed (%s); events are no longer written there",
                uv_strerror(rc));
  }
}

/* Writes out whatever the batch holds. */
void ce__ctl_out_flush(ce_control_t *ctl) {
  if (ctl->out_batch_len == 0)
    return;
  size_t len = ctl->out_batch_len;
  uint64_t events = ctl->out_batch_events;
  ctl->out_batch_len = 0;
  ctl->out_batch_events = 0;
  if (ctl->out_flush_handles)
    uv_timer_stop(&ctl->out_timer);
  if (ctl->out_broken) {
    ctl->stdout_dropped += events;
    return;
  }
  if (ctl->out_kind == OUT_FILE)
    out_write_file(ctl, ctl->out_batch, len, events);
  else
    out_write_stream(ctl, ctl->out_batch, len, events, NULL);
}

static void out_timer_cb(uv_timer_t *h) { ce__ctl_out_flush(h->data); }

void ce__ctl_out_write(ce_control_t *ctl, ce__line_t *line) {
  if (ctl->out_kind == OUT_NONE)
    return;
  if (ctl->out_broken || ctl->out_draining) {
    ctl->stdout_dropped++;
    return;
  }
  if (ctl->out_batch_len + line->len > OUT_BATCH_CAP)
    ce__ctl_out_flush(ctl);
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
  if (ctl->out_batch_len == 0)
    uv_timer_start(&ctl->out_timer, out_timer_cb, OUT_BATCH_MS, 0);
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
int ce__ctl_out_prepare(ce_control_t *ctl, int fd, int *own_fd, uv_handle_type *type,
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
      ce__ctl_set_err(err, errlen, "stdout_fd %d: cannot duplicate: %s", fd, strerror(errno));
      return CE_EINVAL;
    }
    if (*type == UV_TCP)
      *type = UV_NAMED_PIPE; /* a uv_pipe_t writes any stream socket */
    ctl->out_kind = OUT_STREAM;
    *own_fd = nfd;
    return 0;
  }
  default:
    ce__ctl_set_err(err, errlen, "stdout_fd %d is not an open, writable descriptor", fd);
    return CE_EINVAL;
  }
}

/* Takes own_fd in every case. */
int ce__ctl_out_open(ce_control_t *ctl, int own_fd, uv_handle_type type) {
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
