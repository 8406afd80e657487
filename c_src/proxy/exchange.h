/*
 * One request, whatever the protocol it came in (docs/proxy.md, "One
 * request pipeline"): the HTTP/1.1 connection (conn.c) and the h2 stream
 * (http2/server.c) each hold a ce_exchange_t for the request they carry, and
 * everything that decides its fate is here, once:
 *
 *   the record      ce_reqinfo_t, opened with the connection's identity
 *   the target      Host / absolute-form authority / :authority checked
 *                   against the connection (present, valid, the TLS
 *                   server name and the port dialled: DESIGN §4 against
 *                   domain fronting and coalescing)
 *   the verdict     the policy's, for host, method and path
 *   the decide      the decision cache, then one question to the decider
 *                   over the control channel, its answer mapped fail-closed
 *   the refusals    the deny page that names the rule, in the same words
 *                   on every protocol
 *   the events      request_opened / allowed / denied / closed / failed,
 *                   each closing event at most once per request
 *
 * What differs per protocol sits behind ce_exchange_ops_t: how the
 * request goes upstream (forward) and how the proxy answers it itself
 * (respond). The protocol code never builds a deny page, asks a decider
 * or chooses an event name.
 *
 * The upstream header block of a request is built in exactly one place
 * per workspace protocol. HTTP/1.1: build_upstream_head (h1exchange.c),
 * when the head is admitted (the parsed head lives in the input buffer
 * only until then); its extra-fields argument is where fields the proxy
 * adds go, and h1h2.c turns that same head into h2 fields. h2: the
 * stream's field set (s->rq), final when ops->forward runs (h2_forward,
 * http2/server.c), from which stream_submit (an h2 upstream) and h1_start
 * (an HTTP/1.1 upstream) both build. ops->forward is the one point every
 * allowed request passes, after ce_exchange_decide said allow.
 *
 * Ownership: the exchange owns its record (paths, header lists, preview)
 * until ce_exchange_end. Its ops are called synchronously from the
 * functions below or from the decider's callback; an op may end the
 * request (refuse it, close the connection) but must not free the
 * exchange itself: the owner frees it after the call returns.
 */
#ifndef CE_PROXY_EXCHANGE_H
#define CE_PROXY_EXCHANGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/control.h"
#include "policy/host.h"
#include "policy/policy.h"
#include "proxy/event.h"
#include "proxy/proxy.h"

typedef struct ce_exchange ce_exchange_t;

/* Where events and questions go: the control channel in the sidecar
 * (ce_exchange_control_channel), a recorder in the unit tests. ask has
 * ce_control_ask_with's contract: an id, or 0 when nothing was sent (no
 * callback then); the callback runs once, later, unless cancelled. */
typedef struct ce_exchange_channel {
  void (*emit)(void *ctx, const char *name, const ce_reqinfo_t *r, const char *reason);
  uint64_t (*ask)(void *ctx, const ce_reqinfo_t *r, int32_t rule, uint32_t timeout_ms, ce_control_decision_cb cb,
                  void *data);
  void (*cancel)(void *ctx, uint64_t id);
} ce_exchange_channel_t;

/* The control channel as a channel (ctx: the ce_control_t). */
extern const ce_exchange_channel_t ce_exchange_control_channel;

/* What a request knows of the connection it came on. Pointers must
 * outlive the exchange (they point into the connection). */
typedef struct {
  ce_proxy_t *proxy;        /* policy, options, decision cache, request ids */
  const ce_exchange_channel_t *channel;
  void *channel_ctx;
  uint64_t conn_id;
  bool tls;                 /* the workspace speaks TLS */
  uint16_t port;            /* the port it dialled */
  const char *sni_raw;      /* the server name as sent ("" when none) */
  const ce_host_t *name;    /* the connection's name: the normalised SNI, or the IP dialled */
} ce_exchange_conn_t;

typedef enum {
  CE_EXCHANGE_IDLE = 0,     /* no request */
  CE_EXCHANGE_OPEN,         /* a record, not yet decided */
  CE_EXCHANGE_PREVIEWING,   /* a decide rule; the first body bytes are awaited for the question */
  CE_EXCHANGE_WAITING,      /* a decide rule; the connection has no room for another question yet */
  CE_EXCHANGE_DECIDING,     /* the question is out */
  CE_EXCHANGE_ALLOWED,      /* handed to ops->forward */
  CE_EXCHANGE_REFUSED,      /* answered by the proxy: ops->respond */
} ce_exchange_state_t;

typedef struct {
  /* The request is allowed: send it upstream. The op says
   * ce_exchange_allowed when an upstream takes it (after the
   * private-address rule), or fails it. */
  void (*forward)(ce_exchange_t *x);
  /* The proxy answers the request itself with status and text (a short
   * text/plain body); its event went out already. */
  void (*respond)(ce_exchange_t *x, int status, const char *text);
  /* The decider's question carries the body preview (--body-preview):
   * put the first bytes of the request body buffered so far into
   * x->req's preview (replacing what is there) and say whether it is
   * complete: the preview size reached, the body ended, no body will come
   * before an answer (Expect: 100-continue), the buffer is full, or final
   * (the wait is over). NULL: questions carry no preview. */
  bool (*preview)(ce_exchange_t *x, bool final);
  /* The exchange waits for body bytes (PREVIEWING) until
   * ce_exchange_body says they came or the wait is over: the protocol
   * calls ce_exchange_body(x, true) at the latest after
   * CE_EXCHANGE_PREVIEW_WAIT_MS (NULL: nothing to do). */
  void (*previewing)(ce_exchange_t *x);
  /* A question is about to go to the decider (NULL: nothing to do). */
  void (*asking)(ce_exchange_t *x);
  /* An answer came back: false when the request cannot take it any more
   * (its connection is ending; the op emits what it must); the answer is
   * then dropped. NULL: always wanted. */
  bool (*answer_wanted)(ce_exchange_t *x);
  /* After an answer was acted on (NULL: nothing to do). */
  void (*answered)(ce_exchange_t *x);
} ce_exchange_ops_t;

/* Questions outstanding on one connection, and its bound. */
typedef struct {
  size_t out;
  size_t max;
} ce_exchange_asks_t;

/* What the exchange keeps of the policy's verdict (ce_verdict_t without
 * the normalised host, which the record has). */
typedef struct {
  ce_decision_t decision;
  ce_reason_t reason;
  int32_t rule_index;
  ce_rule_kind_t rule_kind;
} ce_exchange_verdict_t;

struct ce_exchange {
  const ce_exchange_ops_t *ops;
  void *owner;              /* the connection or stream, for the ops */
  ce_exchange_asks_t *asks; /* the connection's count, or NULL: unbounded */
  ce_exchange_conn_t conn;
  ce_exchange_state_t state;
  ce_reqinfo_t req;
  ce_exchange_verdict_t verdict; /* set by ce_exchange_admit */
  bool ended;               /* the closing event (closed, failed, denied) went out */
  bool allowed_sent;        /* request_allowed went out */
  uint64_t ask_id;          /* the question out, 0 = none */
  int32_t decide_rule;
  bool decide_cache;
  bool previewed;           /* the question's preview was taken */
  uint64_t preview_until;   /* PREVIEWING: the wait ends then (CLOCK_MONOTONIC ms) */
};

/* How long a decide question waits for the first body bytes it carries
 * (--body-preview): a client that sends its body late is asked about
 * without it (or with what came), rather than held. */
#define CE_EXCHANGE_PREVIEW_WAIT_MS 1000u

/* The 403 text of a policy refusal, in the same words on every protocol:
 * the host, who refused ("rule 2 (deny)", "the policy default", "the
 * decider of rule 2") and the reason. The reason is kept whole up to
 * CE_EXCHANGE_DENY_REASON_MAX bytes, the control channel's limit on a
 * decider's reason; bytes outside printable ASCII become '?'. out holds
 * CE_EXCHANGE_DENY_TEXT_MAX bytes. */
#define CE_EXCHANGE_DENY_REASON_MAX CE_CONTROL_MAX_REASON
#define CE_EXCHANGE_DENY_WHO_MAX 64u
#define CE_EXCHANGE_DENY_TEXT_MAX (128u + CE_HOST_TEXT_MAX + CE_EXCHANGE_DENY_WHO_MAX + CE_EXCHANGE_DENY_REASON_MAX)
void ce_exchange_deny_text(char *out, size_t cap, const char *host, const char *who, const char *reason);

/* A text the proxy answers with: "condukt: DETAIL\n", DETAIL made
 * printable ASCII. out holds CE_EXCHANGE_TEXT_MAX bytes. */
#define CE_EXCHANGE_TEXT_MAX 900u
void ce_exchange_text(char *out, size_t cap, const char *detail);

/* Sets the ops once (the exchange is IDLE after). */
void ce_exchange_init(ce_exchange_t *x, const ce_exchange_ops_t *ops, void *owner, ce_exchange_asks_t *asks);

/* Opens a request record (a new id) on the connection conn (copied);
 * stream_id is the h2 stream, 0 for none. An open exchange is ended
 * first. */
void ce_exchange_open(ce_exchange_t *x, const ce_exchange_conn_t *conn, int32_t stream_id);
static inline bool ce_exchange_is_open(const ce_exchange_t *x) { return x->state != CE_EXCHANGE_IDLE; }

/* Ends the request: a question out is cancelled, the record freed; IDLE.
 * No event. */
void ce_exchange_end(ce_exchange_t *x);

/* Cancels a question out (the connection is aborting); the record stays
 * for its last event. */
void ce_exchange_cancel(ce_exchange_t *x);

/* One event of the record (nothing when no record is open). */
void ce_exchange_emit(ce_exchange_t *x, const char *name, const char *reason);
/* request_allowed, once per request. */
void ce_exchange_allowed(ce_exchange_t *x);
/* The closing event, once per request: request_failed with reason, or
 * request_closed when reason is NULL. False when one went out already. */
bool ce_exchange_finish(ce_exchange_t *x, const char *reason);

/* Checks the target the request names (auth: the Host / authority /
 * :authority, label its name for the answer; method and target, the path
 * and query, for the policy's method and path rules; method may be NULL),
 * fills the record's host and x->verdict, and emits request_opened. On a
 * bad target the request is refused (400 or 421, request_denied) and the
 * result is false; true: go on to ce_exchange_decide. */
bool ce_exchange_admit(ce_exchange_t *x, const char *auth, size_t len, const char *method, size_t method_len,
                       const char *target, size_t target_len, const char *label);

/* A request refused before it became a policy question (malformed,
 * misdirected, too large): the record's host is the connection's name,
 * request_opened, then request_denied with reason and ops->respond with
 * status and "condukt: DETAIL\n" (detail NULL: the caller resets the
 * stream itself, ops->respond is not called). */
void ce_exchange_reject(ce_exchange_t *x, int status, const char *reason, const char *detail);

/* Every address of the host is private, loopback or link-local and the
 * policy names none of them (DESIGN §4): 403 in the same words on every
 * protocol; request_denied, or request_failed for a request said allowed
 * already (taken again after its upstream went). reason is the event's
 * ("upstream_private_address: ADDR"). */
void ce_exchange_refuse_private(ce_exchange_t *x, const char *reason);

/* Refuses the open request: event (request_denied, or request_failed for
 * a request already allowed) with reason, then ops->respond(status, text),
 * which may end the exchange. text NULL: the caller answers (or resets)
 * itself and ops->respond is not called. */
void ce_exchange_refuse_as(ce_exchange_t *x, const char *event, int status, const char *reason, const char *text);
/* ... with the text "condukt: DETAIL\n". */
void ce_exchange_refuse(ce_exchange_t *x, const char *event, int status, const char *reason, const char *detail);

/* Acts on x->verdict: allow (ops->forward), deny (the deny page naming
 * the rule, 403), decide (the cache, else a question; the answer later
 * allows or denies the same way; without an answer: fail closed). */
void ce_exchange_decide(ce_exchange_t *x);

/* Body bytes came (or the wait is over: final) for a PREVIEWING
 * exchange: when its preview is complete (or final, or
 * CE_EXCHANGE_PREVIEW_WAIT_MS passed since the wait began), the question
 * goes. */
void ce_exchange_body(ce_exchange_t *x, bool final);

/* A WAITING exchange asks now if the connection has room (the owner calls
 * this when a question ends). True when it did (or was decided from the
 * cache meanwhile). */
bool ce_exchange_resume(ce_exchange_t *x);

/* The check of ce_exchange_admit on its own (host_cap bytes of host
 * receive the normalised host, the raw authority when invalid, the
 * connection's name when there is none). */
typedef struct {
  int status;               /* 0: go on to the verdict; else 400 or 421 */
  const char *reason;       /* the event's reason when refused (static) */
  char detail[700];         /* the answer's words when refused */
  ce_verdict_t verdict;     /* the policy's verdict (status 0) */
} ce_target_check_t;
void ce_exchange_check_target(const ce_exchange_conn_t *conn, const char *auth, size_t len, const char *method,
                              size_t method_len, const char *target, size_t target_len, const char *label,
                              char *host, size_t host_cap, ce_target_check_t *t);

/* A decider's answer (the control channel's status, allow, reason,
 * cacheable) as the request's outcome: true to allow; *why the deny
 * reason (NULL when allowed): the decider's words, "denied_by_decider",
 * "decider_timeout" or "control_channel_unavailable" (fail closed). A
 * cacheable answer is cached when the rule caches (cache). */
bool ce_exchange_decision_outcome(ce_proxy_t *p, int status, bool allow, const char *reason, bool cacheable,
                                  bool cache, int32_t rule, const char *host, const char **why);

#endif
