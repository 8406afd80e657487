/*
 * Request records and the events built from them (docs/proxy.md, "Events").
 *
 * A ce_reqinfo_t collects what the proxy learns about one request as it
 * goes: the head the workspace sent, the decision, the response head, the
 * byte counts and the timestamps. Each lifecycle step writes it as one
 * event, as JSON text straight into the control channel's line
 * (ce_event_emit; no JSON objects on the way: bench/README.md, "Events as
 * text"). Header values named in the redaction list are replaced by
 * "[redacted]" when the record is filled, so a secret never reaches an
 * event, stdout or the BEAM.
 */
#ifndef CE_PROXY_EVENT_H
#define CE_PROXY_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jsonw.h"
#include "control/control.h"
#include "http1/parser.h"
#include "proxy/options.h"

typedef struct {
  uint64_t id;               /* unique in this sidecar */
  uint64_t connection_id;
  const char *scheme;        /* "http" or "https" (static) */
  char method[32];
  char host[256];            /* normalised host, or the raw SNI/IP when invalid */
  uint16_t port;
  char *path;                /* owned; path without the query */
  char *query;               /* owned; NULL when there is none */
  const char *http_version;  /* "HTTP/1.1" (static) */
  char sni[256];             /* empty when none */
  /* The header lists are kept as their JSON text, [["name","value"],...],
   * written once when the record is filled (redacted; bytes that are not
   * UTF-8 as U+FFFD) and copied into every event; at most
   * CE_CONTROL_MAX_FRAME bytes each. */
  char *headers;             /* owned; NULL = none yet (the events say []) */
  size_t headers_len;
  int status;                /* 0 until a response head arrived */
  char *response_headers;    /* owned; NULL until a response (null) */
  size_t response_headers_len;
  /* CE_ETOOBIG when a list did not fit in a frame: every event of the
   * record is then dropped (counted by the channel), as one too long is. */
  int headers_err;
  uint64_t bytes_in;         /* from upstream to the workspace (heads + bodies) */
  uint64_t bytes_out;        /* from the workspace to upstream (heads + bodies) */
  int64_t opened_at_us;      /* CLOCK_REALTIME microseconds; 0 = unknown */
  int64_t responded_at_us;
  int64_t closed_at_us;
  /* CLOCK_MONOTONIC microseconds when the record was opened; 0 = unknown.
   * request_closed and request_failed carry duration_us from it (a clock
   * step does not change a duration). */
  int64_t opened_mono_us;
  int32_t matched_rule;      /* -1 = none (default or lifecycle) */
  const char *matched_kind;  /* "allow" | "deny" | "decide" (static) */
  char *body_preview;        /* owned; up to the configured cap */
  size_t body_preview_len;
  bool body_preview_lost;    /* its buffer could not be had: none, rather than one that skips bytes */
  int32_t stream_id;         /* HTTP/2 stream of the workspace; 0 = none */
} ce_reqinfo_t;

void ce_reqinfo_init(ce_reqinfo_t *r, uint64_t id, uint64_t connection_id);
void ce_reqinfo_clear(ce_reqinfo_t *r);

/* Copies method, target (split into path and query) and the fields of a
 * parsed request head, redacting as the options say. Returns CE_OK or
 * CE_ENOMEM. */
int ce_reqinfo_set_request(ce_reqinfo_t *r, const ce_h1_head_t *head,
                           const ce_proxy_options_t *opts);
int ce_reqinfo_set_response(ce_reqinfo_t *r, const ce_h1_head_t *head,
                            const ce_proxy_options_t *opts);
/* Appends body bytes to the preview, up to cap. When its buffer cannot be
 * allocated the record has no preview from then on (a later piece never
 * starts one that would skip the body's first bytes). */
void ce_reqinfo_add_preview(ce_reqinfo_t *r, const char *data, size_t len, size_t cap);
/* Drops the preview: the body is previewed again from its start. */
void ce_reqinfo_reset_preview(ce_reqinfo_t *r);

/* Writes the event's members, {"event": name, "at": ..., "id": ..., ...}
 * without the braces, each as ,"name":value (ce_control_write_fn). reason
 * may be NULL. Fails the text (ce_jsonw_fail) when the record cannot be
 * carried: a header list too long, a path or method that is not UTF-8. */
void ce_event_write(ce_jsonw_t *w, const char *name, const ce_reqinfo_t *r, const char *reason);

/* The members of a decision_request frame: ,"request":{the event
 * "decision_request"},"rule":{"index":rule,"kind":"decide"}. */
void ce_event_write_decision_request(ce_jsonw_t *w, const ce_reqinfo_t *r, int32_t rule);

/* Emits the event (ce_control_emit_with): never fails; an event that
 * cannot be written is counted as dropped by the channel. */
void ce_event_emit(ce_control_t *ctl, const char *name, const ce_reqinfo_t *r,
                   const char *reason);

/* Asks the decider about the record (ce_control_ask_with; the same return
 * and callback contract). */
uint64_t ce_event_ask(ce_control_t *ctl, const ce_reqinfo_t *r, int32_t rule,
                      uint32_t timeout_ms, ce_control_decision_cb cb, void *data);

/* Microseconds since the epoch (CLOCK_REALTIME). */
int64_t ce_now_us(void);

/* "2026-11-22T05:09:39.123456Z" into out (at least 28 bytes). */
void ce_format_time(int64_t us, char *out, size_t cap);

/* Is this header redacted (case-insensitive; the built-in four plus the
 * configured ones)? */
bool ce_header_redacted(const char *name, size_t len, const ce_proxy_options_t *opts);

#endif
