/*
 * The sidecar's side of the control channel (DESIGN §5, docs/control-channel.md).
 *
 * A listener on loopback TCP or a Unix socket. A peer must send a hello
 * frame carrying the per-session token within CE_CONTROL_HELLO_TIMEOUT_MS,
 * else it is dropped; the token is compared in constant time. One
 * authenticated peer at a time: a newly authenticated peer replaces the old
 * one (the BEAM's bridge re-dials after a drop).
 *
 * Frames are NDJSON, one JSON object per line, at most
 * CE_CONTROL_MAX_FRAME bytes. Events are written to stdout as JSON lines
 * (the audit trail of last resort) and to the peer; with no peer they wait
 * in a bounded buffer and what overflows is counted and reported.
 *
 * Everything runs on the proxy's libuv loop; no function may be called from
 * another thread.
 */
#ifndef CE_CONTROL_CONTROL_H
#define CE_CONTROL_CONTROL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define CE_CONTROL_PROTOCOL_VERSION 1
#define CE_CONTROL_MAX_FRAME (1024u * 1024u)      /* one NDJSON line */
#define CE_CONTROL_HELLO_TIMEOUT_MS 5000u
#define CE_CONTROL_DEFAULT_BUFFER_EVENTS 4096u   /* events kept with no peer */
#define CE_CONTROL_MAX_PENDING_ASKS 1024u        /* decisions waiting at once */

typedef struct ce_control ce_control_t;

typedef struct {
  const char *listen;          /* "unix:/path", "127.0.0.1:PORT" or "[::1]:PORT" */
  const uint8_t *token;        /* the session token (bytes), required */
  size_t token_len;            /* >= 16 */
  const char *session_id;      /* echoed in the welcome frame */
  size_t buffer_events;        /* 0 = CE_CONTROL_DEFAULT_BUFFER_EVENTS */
  int stdout_fd;               /* where JSON lines go; -1 = none (tests) */
} ce_control_opts_t;

/* Parsed peer → sidecar frames (the fuzz target's unit). */
typedef enum {
  CE_FRAME_HELLO = 1,          /* {"type":"hello","version":1,"token":"..."} */
  CE_FRAME_DECISION,           /* {"type":"decision","id":"..","decision":"allow"|"deny","reason":"..","cache":true} */
  CE_FRAME_PING                /* {"type":"ping"} → {"type":"pong"} */
} ce_frame_type_t;

typedef struct {
  ce_frame_type_t type;
  int version;                 /* hello */
  char token[257];             /* hello: the token as sent (hex), NUL-terminated */
  size_t token_len;
  uint64_t id;                 /* decision: the decision_request id */
  bool allow;                  /* decision */
  char reason[513];            /* decision: NUL-terminated, may be empty */
  bool cacheable;              /* decision: may the sidecar cache it (default true) */
} ce_frame_t;

/*
 * Parses one line (without its '\n') into *out. Returns CE_OK, CE_EPARSE
 * (not JSON, not an object, unknown type, missing or mistyped field, field
 * too long; *why names it), CE_ETOOBIG (longer than CE_CONTROL_MAX_FRAME).
 */
int ce_control_frame_parse(const char *line, size_t len, ce_frame_t *out,
                           const char **why);

/* Starts listening. Returns CE_OK, CE_EINVAL (bad listen address or
 * token, *err explains), CE_EIO (bind/listen failed, *err explains). */
int ce_control_start(uv_loop_t *loop, const ce_control_opts_t *opts,
                     ce_control_t **out, char *err, size_t errlen);

/* Emits one event: `event` is an object without "type"; the channel adds
 * "type":"event" and writes it to stdout and to the peer (or the buffer).
 * Takes ownership of `event`. Never blocks; never fails (overflow is counted). */
void ce_control_emit(ce_control_t *ctl, json_t *event);

/* The answer to a decision request. status is CE_OK with allow/reason/
 * cacheable set from the peer, or CE_ETIMEDOUT (no answer in time),
 * CE_EUNAVAIL (too many pending asks, or the channel is closing). reason is
 * valid only during the callback. */
typedef void (*ce_control_decision_cb)(void *data, int status, bool allow,
                                       const char *reason, bool cacheable);

/*
 * Sends {"type":"decision_request","id":"N",...request fields} to the peer
 * now, or as soon as one authenticates, and calls cb exactly once: with the
 * answer, or CE_ETIMEDOUT after timeout_ms (a peer that drops mid-decision
 * changes nothing: the timeout still fires unless another peer answers).
 * Takes ownership of `request`. Returns the id (> 0); the callback never
 * runs before ce_control_ask returns.
 */
uint64_t ce_control_ask(ce_control_t *ctl, json_t *request, uint32_t timeout_ms,
                        ce_control_decision_cb cb, void *data);

/* Forgets a pending ask (its requester went away); cb will not be called.
 * Unknown ids are ignored. */
void ce_control_cancel(ce_control_t *ctl, uint64_t id);

/* Counters for tests and the drain log. */
typedef struct {
  uint64_t events;            /* emitted */
  uint64_t dropped;           /* lost to the bounded buffer */
  uint64_t auth_failures;     /* peers dropped for a bad or missing hello */
  bool peer_connected;
} ce_control_stats_t;
void ce_control_stats(const ce_control_t *ctl, ce_control_stats_t *out);

/* Flushes what it can, answers pending asks with CE_EUNAVAIL, closes every
 * handle and frees the channel from a close callback, then calls done. */
void ce_control_close(ce_control_t *ctl, void (*done)(void *data), void *data);

#endif
