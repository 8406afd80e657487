/*
 * Request records and the events built from them (docs/proxy.md, "Events").
 *
 * A ce_reqinfo_t collects what the proxy learns about one request as it
 * goes: the head the workspace sent, the decision, the response head, the
 * byte counts and the timestamps. Each lifecycle step turns it into one
 * JSON object for ce_control_emit(). Header values named in the redaction
 * list are replaced by "[redacted]" when the record is filled, so a
 * secret never reaches an event, stdout or the BEAM.
 */
#ifndef CE_PROXY_EVENT_H
#define CE_PROXY_EVENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

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
  json_t *headers;           /* owned: [[name, value], ...] redacted */
  int status;                /* 0 until a response head arrived */
  json_t *response_headers;  /* owned, redacted; NULL until a response */
  uint64_t bytes_in;         /* from upstream to the workspace (heads + bodies) */
  uint64_t bytes_out;        /* from the workspace to upstream (heads + bodies) */
  int64_t opened_at_us;      /* CLOCK_REALTIME microseconds; 0 = unknown */
  int64_t responded_at_us;
  int64_t closed_at_us;
  int32_t matched_rule;      /* -1 = none (default or lifecycle) */
  const char *matched_kind;  /* "allow" | "deny" | "decide" (static) */
  char *body_preview;        /* owned; up to the configured cap */
  size_t body_preview_len;
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
void ce_reqinfo_add_preview(ce_reqinfo_t *r, const char *data, size_t len, size_t cap);

/* The event object: {"event": name, "at": ..., "id": ..., ...}. reason may
 * be NULL. Returns NULL only when out of memory. */
json_t *ce_event_new(const char *name, const ce_reqinfo_t *r, const char *reason);

/* Microseconds since the epoch (CLOCK_REALTIME). */
int64_t ce_now_us(void);

/* "2026-11-22T05:09:39.123456Z" into out (at least 28 bytes). */
void ce_format_time(int64_t us, char *out, size_t cap);

/* Is this header redacted (case-insensitive; the built-in four plus the
 * configured ones)? */
bool ce_header_redacted(const char *name, size_t len, const ce_proxy_options_t *opts);

#endif
