/*
 * What the files of the control channel share (control.h is the public
 * side):
 *
 *   control.c  start, close, stats, events and the ring that keeps them
 *              while no peer is attached; small helpers
 *   out.c      the audit trail on stdout, batched and written at most once
 *              per millisecond
 *   peer.c     accepted connections: the handshake, the pre-authentication
 *              slots, frames from the authenticated peer, writes to it
 *   ask.c      decision requests: the decide queue, in id order, each with
 *              its own deadline
 *
 * Everything runs on one libuv loop. Memory that a handle lives in is
 * freed only in that handle's close callback (ctl->live_handles counts
 * them); the channel itself is freed when the count reaches zero.
 */
#ifndef CE_CONTROL_INTERNAL_H
#define CE_CONTROL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/trace.h"
#include "control/control.h"
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
/* Event lines for stdout are gathered here and written when the batch is
 * full or OUT_BATCH_MS after its first line (one write(2) or uv_write for
 * all of them) instead of once per event, or once per turn of the loop
 * (two writes per request at one request in flight); a line that does not
 * fit after a flush, or any line when the batch cannot be allocated, is
 * written on its own as before. ce_control_close writes what is left. */
#define OUT_BATCH_CAP (64u * 1024u)
#define OUT_BATCH_MS 1u
/* Events for the authenticated peer wait in the ring, in order, and go
 * to it in one write when PEER_BATCH_LINES have gathered or OUT_BATCH_MS
 * after the first (peer_timer), and at once ahead of a decision request,
 * which travels in the same write: a request's events are not written
 * (waking the peer's reader) between reading its decision and forwarding
 * it, and its request_opened and decision_request leave together. */
#define PEER_BATCH_LINES 64u
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

/* How a connection in the handshake ranks when every pre-authentication
 * slot is taken and a new one arrives: the oldest of the lowest rank goes
 * (docs/control-channel.md, "Pre-authentication slots"). */
typedef enum {
  RANK_NONE,                 /* no valid hello yet */
  RANK_HELLO,                /* a valid hello: the session's id, a nonce */
  RANK_TICKET                /* a hello with a valid ticket of a nonce not seen before */
} peer_rank_t;

/* Nonces of the tickets ranked, remembered so that a recorded ticket
 * ranks once (a ring; older ones are forgotten). */
#define TICKETS_SEEN 256

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
  peer_rank_t rank;          /* which go first when the slots are full */
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

/* One uv_write of up to PEER_BATCH_LINES + 1 lines to the peer (a batch of
 * events, and the decision request that follows them); each line stays
 * referenced until the callback. */
typedef struct {
  uv_write_t req;
  unsigned count;
  unsigned events;           /* how many of the lines are events (counted as dropped if lost here) */
  ce__line_t *lines[PEER_BATCH_LINES + 1];
} peer_write_t;

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
  uint8_t tickets_seen[TICKETS_SEEN][CE_CONTROL_NONCE_LEN];
  size_t tickets_next;       /* the ring's next slot */
  size_t tickets_count;      /* slots filled (up to TICKETS_SEEN) */
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
  uv_timer_t out_timer;      /* flushes the batch OUT_BATCH_MS after its first line */
  bool out_flush_handles;    /* out_timer initialised (stdout not OUT_NONE) */

  ask_t *asks_head, *asks_tail;
  size_t pending;            /* asks in ASK_PENDING */
  uint64_t next_id;

  uint64_t seq, events, dropped, stdout_dropped, auth_failures;

  uv_timer_t peer_timer;     /* flushes the ring to the peer (PEER_BATCH_LINES) */

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

/* ---- control.c ---- */

/* A log line through common/trace.h under a burst limit (LOG_BURST a
 * second): a misbehaving peer can cause one per frame. */
void ce__ctl_log(ce_control_t *ctl, ce_trace_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Formats into err unless it is NULL or errlen is 0. */
void ce__ctl_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ce__ctl_close_if_open(uv_handle_t *h, uv_close_cb cb);
/* Every close callback ends here (see control.c). */
void ce__ctl_handle_closed(ce_control_t *ctl);
/* A close callback for handles whose data is the channel. */
void ce__ctl_closed_cb(uv_handle_t *h);
size_t ce__ctl_queued_bytes(stream_u *s);
ce__line_t *ce__ctl_ring_pop(ce_control_t *ctl);
void ce__ctl_ring_push(ce_control_t *ctl, ce__line_t *line);
void ce__ctl_ring_clear(ce_control_t *ctl);
void ce__ctl_finish_close(ce_control_t *ctl);

/* ---- out.c ---- */

/* Checks and takes the stdout descriptor before any handle exists. */
int ce__ctl_out_prepare(ce_control_t *ctl, int fd, int *own_fd, uv_handle_type *type,
                        char *err, size_t errlen);
int ce__ctl_out_open(ce_control_t *ctl, int own_fd, uv_handle_type type);
/* Queues one event line for stdout (batched, see OUT_BATCH_CAP). */
void ce__ctl_out_write(ce_control_t *ctl, ce__line_t *line);
void ce__ctl_out_flush(ce_control_t *ctl);

/* ---- peer.c ---- */

void ce__ctl_on_connection(uv_stream_t *server, int status);
void ce__ctl_peer_send(peer_t *p, ce__line_t *line);
/* Moves buffered events to the peer while its queue is under the soft
 * bound. */
void ce__ctl_flush_ring(ce_control_t *ctl);
/* The same, then `line` (a decision request) whatever the soft bound, in
 * the same write as the last events when they fit. */
void ce__ctl_flush_ring_then(ce_control_t *ctl, ce__line_t *line);
/* An event was queued in the ring: flushes it when the batch is full,
 * else makes sure peer_timer will. */
void ce__ctl_peer_event_queued(ce_control_t *ctl);
void ce__ctl_peer_close(peer_t *p, const char *why);
void ce__ctl_peer_unlink(peer_t *p);
void ce__ctl_peer_closed_cb(uv_handle_t *h);

/* ---- ask.c ---- */

ask_t *ce__ctl_ask_find(ce_control_t *ctl, uint64_t id);
/* Delivers an ask's answer (or failure) and forgets it. */
void ce__ctl_ask_finish(ask_t *a, int status, bool allow, const char *reason, bool cacheable);

#endif
