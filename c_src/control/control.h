/*
 * The sidecar's side of the control channel (DESIGN §5, docs/control-channel.md).
 *
 * A listener on loopback TCP or a Unix socket. A peer must prove that it
 * holds the per-session token (control/handshake.h) within
 * CE_CONTROL_HELLO_TIMEOUT_MS, else it is dropped without a word. One
 * authenticated peer at a time: a newly authenticated peer replaces the
 * old one (the BEAM's bridge re-dials after a drop).
 *
 * Frames are NDJSON, one JSON object per line, at most
 * CE_CONTROL_MAX_FRAME bytes. Events are written to stdout as JSON lines
 * (the audit trail of last resort; gathered and written when 64 KiB are
 * there or a millisecond after the first, and by ce_control_close) and to the peer; with no peer, or a peer
 * that does not read, they wait in a bounded buffer and what overflows is
 * counted and reported in the next welcome frame.
 *
 * Everything runs on the proxy's libuv loop; no function may be called from
 * another thread. Callbacks may call any function of this header, including
 * ce_control_close().
 *
 * The process must ignore SIGPIPE (signal(SIGPIPE, SIG_IGN)): libuv writes
 * to sockets and pipes with write(2), and a peer or a log reader that goes
 * away would otherwise kill the sidecar.
 */
#ifndef CE_CONTROL_CONTROL_H
#define CE_CONTROL_CONTROL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/jsonw.h"

#define CE_CONTROL_PROTOCOL_VERSION 2
#define CE_CONTROL_MAX_FRAME (1024u * 1024u)      /* one NDJSON line, '\n' included */
/* From accept to a valid proof: a peer needs one round trip for it. */
#define CE_CONTROL_HELLO_TIMEOUT_MS 3000u
/* Connections that have not proven the token yet. When a new one arrives
 * and all are taken, the oldest of the lowest rank is dropped (no valid
 * hello, then no valid ticket, then any), never the newcomer: a workspace
 * that holds connections open can never keep a newer peer out, and one
 * that opens more cannot push out a peer whose hello carried a ticket. */
#define CE_CONTROL_MAX_PREAUTH 128u
#define CE_CONTROL_DEFAULT_BUFFER_EVENTS 4096u   /* events kept with no peer */
#define CE_CONTROL_MAX_PENDING_ASKS 1024u        /* decisions waiting at once */
#define CE_CONTROL_TOKEN_MIN 16u                 /* token bytes */
#define CE_CONTROL_TOKEN_MAX 128u                /* 256 hex digits on the wire */
#define CE_CONTROL_MAX_REASON 512u               /* decision reason bytes */
#define CE_CONTROL_NONCE_LEN 32u                 /* handshake nonces (control/handshake.h) */
#define CE_CONTROL_PROOF_LEN 32u                 /* HMAC-SHA256 */
#define CE_CONTROL_SESSION_ID_MAX 256u           /* bytes of UTF-8 */
#define CE_CONTROL_SECRET_NAME_MAX 128u          /* credential frame: secret name bytes */
#define CE_CONTROL_SECRET_VALUE_MAX 8192u        /* credential frame: value bytes */

typedef struct ce_control ce_control_t;

typedef struct {
  const char *listen;          /* "unix:/path", "127.0.0.1:PORT" or "[::1]:PORT" */
  const uint8_t *token;        /* the session token (bytes), required; copied */
  size_t token_len;            /* CE_CONTROL_TOKEN_MIN..CE_CONTROL_TOKEN_MAX */
  const char *session_id;      /* 1 to 256 bytes of UTF-8, required; the peer must name it; copied */
  size_t buffer_events;        /* 0 = CE_CONTROL_DEFAULT_BUFFER_EVENTS */
  int stdout_fd;               /* where JSON lines go; -1 = none (tests) */
  uint32_t hello_timeout_ms;   /* handshake deadline; 0 = CE_CONTROL_HELLO_TIMEOUT_MS (tests shorten it) */
  /* A "credential" frame of the authenticated peer (a rotated secret):
   * returns 0 when the value was taken, anything else to refuse the frame
   * as a protocol violation. NULL: every such frame is one. value is
   * valid during the call only, and wiped after it. */
  int (*on_credential)(void *data, const char *name, const char *value, size_t value_len);
  void *credential_data;
} ce_control_opts_t;

/* Parsed peer → sidecar frames (the fuzz target's unit). */
typedef enum {
  CE_FRAME_HELLO = 1,          /* {"type":"hello","version":2,"session_id":"..","nonce":"<64 hex>",
                                   "ticket":"<64 hex>" (optional)} */
  CE_FRAME_AUTH,               /* {"type":"auth","proof":"<64 hex>"} */
  CE_FRAME_DECISION,           /* {"type":"decision","id":"..","decision":"allow"|"deny","reason":"..","cache":true} */
  CE_FRAME_PING,               /* {"type":"ping"} → {"type":"pong"} */
  CE_FRAME_CREDENTIAL          /* {"type":"credential","name":"..","value":".."} */
} ce_frame_type_t;

typedef struct {
  ce_frame_type_t type;
  int version;                 /* hello: always CE_CONTROL_PROTOCOL_VERSION */
  char session_id[CE_CONTROL_SESSION_ID_MAX + 1]; /* hello: 1 to 256 bytes, NUL-terminated */
  uint8_t nonce[CE_CONTROL_NONCE_LEN];  /* hello: the peer's nonce */
  bool has_ticket;             /* hello: a ticket came (control/handshake.h) */
  uint8_t ticket[CE_CONTROL_PROOF_LEN]; /* hello: the ticket, when has_ticket */
  uint8_t proof[CE_CONTROL_PROOF_LEN];  /* auth: the peer's proof (control/handshake.h) */
  uint64_t id;                 /* decision: the decision_request id */
  bool allow;                  /* decision */
  char reason[CE_CONTROL_MAX_REASON + 1]; /* decision: NUL-terminated UTF-8, may be empty */
  bool cacheable;              /* decision: may the sidecar cache it (default true) */
  char secret_name[CE_CONTROL_SECRET_NAME_MAX + 1];   /* credential: NUL-terminated */
  char secret_value[CE_CONTROL_SECRET_VALUE_MAX + 1]; /* credential: NUL-terminated, 1 to 8192 bytes */
  size_t secret_value_len;
} ce_frame_t;

/*
 * Parses one line (without its '\n') into *out. Pure: no allocation
 * survives the call, no global state, safe on any bytes (the fuzz target).
 * The schema is strict for the members it knows and ignores unknown
 * members (docs/control-channel.md, "Peer to sidecar"). Returns CE_OK,
 * CE_EPARSE (not JSON, nested deeper than 16, duplicate member, not an
 * object, unknown type, missing or mistyped member, member too long,
 * unsupported version), CE_ETOOBIG (longer than CE_CONTROL_MAX_FRAME),
 * CE_ENOMEM (out of memory). On failure *out is untouched and *why (when why is not NULL) names the
 * problem in a static string; on success *why is NULL.
 */
int ce_control_frame_parse(const char *line, size_t len, ce_frame_t *out,
                           const char **why);

/*
 * Judges a frame given as a jansson value as ce_control_frame_parse()
 * judges its text: an object nested at most 16 deep, then the same rules
 * for its type and members. For a writer that builds the frame as a
 * value (the port program) and must not send what the sidecar would
 * refuse, without writing and parsing the text again. What only text can
 * get wrong (its size, duplicate members, UTF-8, NUL bytes) is the
 * builder's to rule out. Returns CE_OK or CE_EPARSE, with *out and *why
 * as ce_control_frame_parse() leaves them; root is not consumed.
 */
int ce_control_frame_check(const json_t *root, ce_frame_t *out, const char **why);

/* Starts listening. Returns CE_OK, CE_EINVAL (bad or non-loopback listen
 * address, bad token or session id, unusable stdout_fd, a path that exists
 * and is not a socket; *err explains), CE_EIO (bind/listen failed or the
 * Unix socket is in use by a live listener, *err explains), CE_ENOMEM.
 * On failure *out is untouched and nothing is left on the loop, with one
 * exception: if libuv refuses a descriptor that is already bound (which
 * does not happen in practice), the handles created so far close on the
 * loop's next turn, so run the loop once before uv_loop_close(). err may
 * be NULL when errlen is 0. */
int ce_control_start(uv_loop_t *loop, const ce_control_opts_t *opts,
                     ce_control_t **out, char *err, size_t errlen);

/* The bound TCP port (useful with "127.0.0.1:0"), or 0 for a Unix socket. */
int ce_control_port(const ce_control_t *ctl);

/* Emits one event: `event` is an object; the channel puts "type":"event"
 * and "seq" (1, 2, ... across the channel's life, dropped events included,
 * so a gap in seq is a loss) first, replacing any members of those names,
 * and writes it to stdout and to the peer (or the buffer). Takes ownership
 * of `event`. Never blocks; never fails: an event that is NULL, not an
 * object, not encodable or longer than CE_CONTROL_MAX_FRAME is counted as
 * dropped (and logged to stderr). After ce_control_close it only frees. */
void ce_control_emit(ce_control_t *ctl, json_t *event);

/* Writes the members of a frame after its envelope, each as ,"name":value
 * (common/jsonw.h); it may fail the frame with ce_jsonw_fail(). It must not
 * write members named "type" or the envelope's key ("seq", "id"), and must
 * not call ce_control_* functions. */
typedef void (*ce_control_write_fn)(ce_jsonw_t *w, const void *arg);

/* ce_control_emit without an object: the event's members are written as
 * text by write(w, arg), straight into the line (the proxy's events,
 * proxy/event.h). The same seq, order and bounds; a failed or too long
 * text is counted as dropped. */
void ce_control_emit_with(ce_control_t *ctl, ce_control_write_fn write, const void *arg);

/* The answer to a decision request. status is CE_OK with allow/cacheable
 * set from the peer and reason the peer's reason (NULL when it gave none
 * or an empty one), or a failure with allow false and reason NULL:
 * CE_ETIMEDOUT (no answer in time), CE_EUNAVAIL (too many pending asks, or
 * the channel is closing), CE_EINVAL (request NULL, not an object or too
 * large to send), CE_ENOMEM. reason is valid only during the callback. The
 * callback may call any ce_control_* function. */
typedef void (*ce_control_decision_cb)(void *data, int status, bool allow,
                                       const char *reason, bool cacheable);

/*
 * Sends {"type":"decision_request","id":"N",...request fields} to the peer
 * now, or as soon as one authenticates, and calls cb exactly once: with the
 * answer, or CE_ETIMEDOUT after timeout_ms (a peer that drops mid-decision
 * changes nothing: the timeout still fires unless another peer answers;
 * every newly authenticated peer is sent every pending request). Takes
 * ownership of `request` ("type" and "id" members in it are replaced).
 * Returns the id (> 0, increasing from 1); the callback never runs before
 * ce_control_ask returns, failures included. Returns 0, and never calls
 * cb, only when memory for the ask itself runs out or the channel is
 * closing: the caller must then fail closed on its own.
 */
uint64_t ce_control_ask(ce_control_t *ctl, json_t *request, uint32_t timeout_ms,
                        ce_control_decision_cb cb, void *data);

/* ce_control_ask with the request's members written as text by
 * write(w, arg) (see ce_control_write_fn), called before it returns. A
 * failed or too long text fails the ask with CE_EINVAL (CE_ENOMEM when
 * memory ran out), delivered through cb as for ce_control_ask. */
uint64_t ce_control_ask_with(ce_control_t *ctl, ce_control_write_fn write, const void *arg,
                             uint32_t timeout_ms, ce_control_decision_cb cb, void *data);

/* Forgets a pending ask (its requester went away); cb will not be called.
 * Unknown ids, and asks already answered, are ignored. A later answer from
 * the peer for that id is ignored too. */
void ce_control_cancel(ce_control_t *ctl, uint64_t id);

/* Counters for tests and the drain log. */
typedef struct {
  uint64_t events;            /* ce_control_emit calls */
  uint64_t dropped;           /* events no peer will ever receive (buffer overflow, bad event) */
  uint64_t stdout_dropped;    /* events not written to stdout (queue full or stdout broken) */
  uint64_t auth_failures;     /* peers dropped before proving the token (bad, missing or slow
                                 handshake, a wrong proof, evicted as the oldest waiting) */
  uint64_t refused_events;    /* control_refused events emitted (a rate-limited summary) */
  uint64_t pending_asks;      /* asks waiting for an answer */
  bool peer_connected;        /* an authenticated peer is attached */
} ce_control_stats_t;
void ce_control_stats(const ce_control_t *ctl, ce_control_stats_t *out);

/* Answers pending asks with CE_EUNAVAIL (synchronously, before returning),
 * stops accepting, gives stdout and the peer up to CE_CONTROL_CLOSE_FLUSH_MS
 * to take what is already queued, closes every handle, frees the channel
 * from the last close callback and then calls done(data) (done may be
 * NULL). Events still in the buffer are discarded (they are on stdout).
 * Call it once; ctl is not to be used after it returns, except by callbacks
 * that run during it. A Unix socket file is removed. */
#define CE_CONTROL_CLOSE_FLUSH_MS 2000u
void ce_control_close(ce_control_t *ctl, void (*done)(void *data), void *data);

#endif
