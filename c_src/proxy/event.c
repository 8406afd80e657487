#include "proxy/event.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/error.h"
#include "common/text.h"

static const char *const always_redacted[] = {"authorization", "proxy-authorization", "cookie",
                                              "set-cookie"};

int64_t ce_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* CLOCK_MONOTONIC in microseconds (never 0 on Linux once booted). */
static int64_t now_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void ce_format_time(int64_t us, char *out, size_t cap) {
  /* An event has up to four timestamps, mostly within the same second:
   * the date and time part of the last second is kept (per thread). */
  static _Thread_local int64_t cached_secs = -1;
  static _Thread_local char cached_base[32];
  static _Thread_local size_t cached_len;
  int64_t secs = us / 1000000;
  if (us < 0 || secs != cached_secs) {
    time_t t = (time_t)secs;
    struct tm tm;
    char base[32];
    size_t len;
    if (gmtime_r(&t, &tm) == NULL || (len = strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm)) == 0) {
      base[0] = '\0';
      len = 0;
    }
    if (us < 0) {
      snprintf(out, cap, "%s.%06dZ", base, (int)(us % 1000000));
      return;
    }
    memcpy(cached_base, base, sizeof(base));
    cached_len = len;
    cached_secs = secs;
  }
  /* the date and time, then ".uuuuuuZ": copied, not formatted (an event
   * writes up to four of these) */
  char text[sizeof(cached_base) + 8];
  memcpy(text, cached_base, cached_len);
  char *frac = text + cached_len;
  frac[0] = '.';
  int64_t f = us % 1000000;
  for (int i = 6; i >= 1; i--, f /= 10)
    frac[i] = (char)('0' + f % 10);
  frac[7] = 'Z';
  frac[8] = '\0';
  ce_text_copy(out, cap, text);
}

bool ce_header_redacted(const char *name, size_t len, const ce_proxy_options_t *opts) {
  for (size_t i = 0; i < sizeof(always_redacted) / sizeof(always_redacted[0]); i++)
    if (strlen(always_redacted[i]) == len && strncasecmp(always_redacted[i], name, len) == 0)
      return true;
  for (size_t i = 0; opts != NULL && i < opts->redact_count; i++)
    if (strlen(opts->redact[i]) == len && strncasecmp(opts->redact[i], name, len) == 0)
      return true;
  return false;
}

void ce_reqinfo_init(ce_reqinfo_t *r, uint64_t id, uint64_t connection_id) {
  memset(r, 0, sizeof(*r));
  r->id = id;
  r->connection_id = connection_id;
  r->scheme = "http";
  r->http_version = "HTTP/1.1";
  r->matched_rule = -1;
  r->opened_at_us = ce_now_us();
  r->opened_mono_us = now_mono_us();
}

void ce_reqinfo_clear(ce_reqinfo_t *r) {
  free(r->path);
  free(r->query);
  free(r->body_preview);
  free(r->headers);
  free(r->response_headers);
  memset(r, 0, sizeof(*r));
  r->matched_rule = -1;
}

/* Header lists up to this size are written on the stack and then copied
 * into one exact-size allocation. */
#define FIELDS_INLINE 4096u

/* The JSON text of a head's fields, [["name","value"],...]. Header values
 * are bytes; JSON strings must be UTF-8: names and values that are not
 * valid UTF-8 (obs-text) are carried with each such byte as U+FFFD, so the
 * event is still valid JSON. Returns CE_OK (*out, *out_len set), CE_ENOMEM
 * or CE_ETOOBIG (longer than a frame). */
static int fields_text(const ce_h1_head_t *head, const ce_proxy_options_t *opts, char **out,
                       size_t *out_len) {
  char inline_buf[FIELDS_INLINE];
  ce_jsonw_t w;
  ce_jsonw_init(&w, inline_buf, sizeof(inline_buf), CE_CONTROL_MAX_FRAME);
  ce_jsonw_raw(&w, "[", 1);
  for (size_t i = 0; i < head->field_count; i++) {
    const ce_h1_field_t *f = &head->fields[i];
    ce_jsonw_raw(&w, i == 0 ? "[" : ",[", i == 0 ? 1 : 2);
    ce_jsonw_string_lossy(&w, f->name, f->name_len);
    if (ce_header_redacted(f->name, f->name_len, opts)) {
      ce_jsonw_raw(&w, ",\"[redacted]\"]", 14);
    } else {
      ce_jsonw_raw(&w, ",", 1);
      ce_jsonw_string_lossy(&w, f->value, f->value_len);
      ce_jsonw_raw(&w, "]", 1);
    }
  }
  ce_jsonw_raw(&w, "]", 1);
  int rc = ce_jsonw_error(&w);
  if (rc == CE_OK) {
    char *text = malloc(w.len);
    if (text == NULL) {
      rc = CE_ENOMEM;
    } else {
      memcpy(text, w.buf, w.len);
      *out = text;
      *out_len = w.len;
    }
  }
  ce_jsonw_free(&w);
  return rc;
}

/* Replaces one of the record's lists. A list too long for a frame leaves
 * the list NULL and marks the record, whose events are then dropped; out
 * of memory leaves it NULL (an empty list or null in the events). */
static int set_fields(ce_reqinfo_t *r, char **list, size_t *list_len, const ce_h1_head_t *head,
                      const ce_proxy_options_t *opts) {
  free(*list);
  *list = NULL;
  *list_len = 0;
  int rc = fields_text(head, opts, list, list_len);
  if (rc == CE_ETOOBIG) {
    r->headers_err = CE_ETOOBIG;
    return CE_OK;
  }
  return rc;
}

/* A NUL-terminated copy of s[0..n). Unlike strndup, it never looks past
 * n: an h2 header value is not NUL-terminated and may end its buffer. */
static char *copy_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d == NULL)
    return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

int ce_reqinfo_set_request(ce_reqinfo_t *r, const ce_h1_head_t *head, const ce_proxy_options_t *opts) {
  size_t mlen = head->method_len < sizeof(r->method) - 1 ? head->method_len : sizeof(r->method) - 1;
  memcpy(r->method, head->method, mlen);
  r->method[mlen] = '\0';
  r->http_version = head->version_minor == 0 ? "HTTP/1.0" : "HTTP/1.1";

  /* The event shows the path and query only; the parser already split an
   * absolute-form target (RFC 9112 §3.2.2) from its authority. An empty
   * path is "/" (RFC 9112 §3.2.1). */
  const char *t = head->path;
  size_t n = head->path_len;
  if (t == NULL || n == 0) {
    t = "/";
    n = 1;
  }
  const char *q = memchr(t, '?', n);
  size_t plen = q != NULL ? (size_t)(q - t) : n;
  free(r->path);
  free(r->query);
  r->query = NULL;
  r->path = copy_n(t, plen);
  if (r->path == NULL)
    return CE_ENOMEM;
  if (q != NULL) {
    r->query = copy_n(q + 1, n - plen - 1);
    if (r->query == NULL)
      return CE_ENOMEM;
  }
  return set_fields(r, &r->headers, &r->headers_len, head, opts);
}

int ce_reqinfo_set_response(ce_reqinfo_t *r, const ce_h1_head_t *head, const ce_proxy_options_t *opts) {
  r->status = head->status;
  if (r->responded_at_us == 0)
    r->responded_at_us = ce_now_us();
  return set_fields(r, &r->response_headers, &r->response_headers_len, head, opts);
}

void ce_reqinfo_reset_preview(ce_reqinfo_t *r) {
  free(r->body_preview);
  r->body_preview = NULL;
  r->body_preview_len = 0;
  r->body_preview_lost = false;
}

void ce_reqinfo_add_preview(ce_reqinfo_t *r, const char *data, size_t len, size_t cap) {
  if (cap == 0 || r->body_preview_len >= cap || len == 0 || r->body_preview_lost)
    return;
  if (r->body_preview == NULL) {
    r->body_preview = malloc(cap);
    if (r->body_preview == NULL) {
      r->body_preview_lost = true; /* the preview is best effort; the request is not */
      return;
    }
  }
  size_t take = cap - r->body_preview_len < len ? cap - r->body_preview_len : len;
  memcpy(r->body_preview + r->body_preview_len, data, take);
  r->body_preview_len += take;
}

/* The literal text of a member's name with its leading comma and colon. */
#define KEY(w, lit) ce_jsonw_raw((w), lit, sizeof(lit) - 1)

static void time_or_null(ce_jsonw_t *w, int64_t us) {
  if (us == 0) {
    ce_jsonw_raw(w, "null", 4);
    return;
  }
  /* "2026-11-22T05:09:39.123456Z": digits and punctuation, nothing to
   * escape. */
  char buf[40];
  buf[0] = '"';
  ce_format_time(us, buf + 1, sizeof(buf) - 2);
  size_t n = strlen(buf);
  buf[n++] = '"';
  ce_jsonw_raw(w, buf, n);
}

/* A member that is always a string (a record that lacks it is a bug). */
static void string_or_fail(ce_jsonw_t *w, const char *s) {
  if (s != NULL)
    ce_jsonw_string(w, s, strlen(s));
  else
    ce_jsonw_fail(w, CE_EINVAL);
}

/* A NUL-terminated field that may have been cut inside a UTF-8 sequence
 * (host, SNI): U+FFFD for its bytes rather than no event. */
static void text_or_null(ce_jsonw_t *w, const char *s) {
  if (s[0] != '\0')
    ce_jsonw_string_lossy(w, s, strlen(s));
  else
    ce_jsonw_raw(w, "null", 4);
}

/* Text the workspace chose (method, path, query): bytes that are not
 * UTF-8 become U+FFFD, so a request can never take its own events out of
 * the audit trail by sending them. */
static void lossy_or_null(ce_jsonw_t *w, const char *s) {
  if (s != NULL)
    ce_jsonw_string_lossy(w, s, strlen(s));
  else
    ce_jsonw_raw(w, "null", 4);
}

static void base64(ce_jsonw_t *w, const char *data, size_t len) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char out[1024]; /* a multiple of 4 */
  size_t o = 0;
  ce_jsonw_raw(w, "\"", 1);
  for (size_t i = 0; i < len; i += 3) {
    uint32_t v = (uint32_t)(unsigned char)data[i] << 16;
    if (i + 1 < len)
      v |= (uint32_t)(unsigned char)data[i + 1] << 8;
    if (i + 2 < len)
      v |= (unsigned char)data[i + 2];
    out[o++] = tbl[(v >> 18) & 63];
    out[o++] = tbl[(v >> 12) & 63];
    out[o++] = i + 1 < len ? tbl[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < len ? tbl[v & 63] : '=';
    if (o == sizeof(out)) {
      ce_jsonw_raw(w, out, o);
      o = 0;
    }
  }
  ce_jsonw_raw(w, out, o);
  ce_jsonw_raw(w, "\"", 1);
}

/* The members in the order the jansson-built events had them (tests and
 * readers of stdout compare lines). With lead, the first member has its
 * comma too. */
static void write_members(ce_jsonw_t *w, const char *name, const ce_reqinfo_t *r,
                          const char *reason, bool lead) {
  if (r->headers_err != CE_OK) {
    ce_jsonw_fail(w, r->headers_err);
    return;
  }
  /* The seeds: matched_rule is the provenance of a decision, so only the
   * allowed and denied events carry it (and decision requests, which
   * carry their rule separately). */
  bool decision = strcmp(name, "request_allowed") == 0 || strcmp(name, "request_denied") == 0;
  if (lead)
    KEY(w, ",\"event\":");
  else
    KEY(w, "\"event\":");
  ce_jsonw_string(w, name, strlen(name));
  KEY(w, ",\"at\":");
  time_or_null(w, ce_now_us());
  /* The ids are strings: a uint64 does not fit every reader's numbers. */
  KEY(w, ",\"id\":\"");
  ce_jsonw_uint(w, r->id);
  KEY(w, "\",\"connection_id\":\"");
  ce_jsonw_uint(w, r->connection_id);
  KEY(w, "\",\"scheme\":");
  string_or_fail(w, r->scheme);
  KEY(w, ",\"method\":");
  lossy_or_null(w, r->method[0] != '\0' ? r->method : NULL);
  KEY(w, ",\"host\":");
  text_or_null(w, r->host);
  KEY(w, ",\"port\":");
  ce_jsonw_uint(w, r->port);
  KEY(w, ",\"path\":");
  lossy_or_null(w, r->path);
  KEY(w, ",\"query\":");
  lossy_or_null(w, r->query);
  KEY(w, ",\"http_version\":");
  string_or_fail(w, r->http_version);
  KEY(w, ",\"sni\":");
  text_or_null(w, r->sni);
  KEY(w, ",\"headers\":");
  if (r->headers != NULL)
    ce_jsonw_raw(w, r->headers, r->headers_len);
  else
    ce_jsonw_raw(w, "[]", 2);
  KEY(w, ",\"status\":");
  if (r->status > 0)
    ce_jsonw_int(w, r->status);
  else
    ce_jsonw_raw(w, "null", 4);
  KEY(w, ",\"response_headers\":");
  if (r->response_headers != NULL)
    ce_jsonw_raw(w, r->response_headers, r->response_headers_len);
  else
    ce_jsonw_raw(w, "null", 4);
  KEY(w, ",\"bytes_in\":");
  ce_jsonw_int(w, (int64_t)r->bytes_in); /* as jansson's json_int_t had it */
  KEY(w, ",\"bytes_out\":");
  ce_jsonw_int(w, (int64_t)r->bytes_out);
  KEY(w, ",\"opened_at\":");
  time_or_null(w, r->opened_at_us);
  KEY(w, ",\"responded_at\":");
  time_or_null(w, r->responded_at_us);
  KEY(w, ",\"closed_at\":");
  time_or_null(w, r->closed_at_us);
  KEY(w, ",\"matched_rule\":");
  if (decision && r->matched_rule >= 0) {
    KEY(w, "{\"index\":");
    ce_jsonw_int(w, r->matched_rule);
    KEY(w, ",\"kind\":");
    if (r->matched_kind == NULL)
      ce_jsonw_fail(w, CE_EINVAL); /* a rule without its kind: a bug */
    else
      ce_jsonw_string(w, r->matched_kind, strlen(r->matched_kind));
    ce_jsonw_raw(w, "}", 1);
  } else {
    ce_jsonw_raw(w, "null", 4);
  }
  KEY(w, ",\"reason\":");
  lossy_or_null(w, reason);
  /* How long the request took, as the sidecar measured it: only the two
   * events that end a request carry it. */
  bool ends = strcmp(name, "request_closed") == 0 || strcmp(name, "request_failed") == 0;
  if (ends && r->opened_mono_us > 0) {
    int64_t d = now_mono_us() - r->opened_mono_us;
    KEY(w, ",\"duration_us\":");
    ce_jsonw_int(w, d > 0 ? d : 0);
  }
  if (r->stream_id > 0) {
    KEY(w, ",\"stream_id\":");
    ce_jsonw_int(w, r->stream_id);
  }
  if (r->body_preview_len > 0) {
    KEY(w, ",\"body_preview\":");
    base64(w, r->body_preview, r->body_preview_len);
  }
}

void ce_event_write(ce_jsonw_t *w, const char *name, const ce_reqinfo_t *r, const char *reason) {
  write_members(w, name, r, reason, true);
}

void ce_event_write_decision_request(ce_jsonw_t *w, const ce_reqinfo_t *r, int32_t rule) {
  KEY(w, ",\"request\":{");
  write_members(w, "decision_request", r, NULL, false);
  KEY(w, "},\"rule\":{\"index\":");
  ce_jsonw_int(w, rule);
  KEY(w, ",\"kind\":\"decide\"}");
}

typedef struct {
  const char *name;
  const ce_reqinfo_t *r;
  const char *reason;
  int32_t rule;
} event_arg_t;

static void write_event(ce_jsonw_t *w, const void *arg) {
  const event_arg_t *a = arg;
  ce_event_write(w, a->name, a->r, a->reason);
}

static void write_request(ce_jsonw_t *w, const void *arg) {
  const event_arg_t *a = arg;
  ce_event_write_decision_request(w, a->r, a->rule);
}

void ce_event_emit(ce_control_t *ctl, const char *name, const ce_reqinfo_t *r,
                   const char *reason) {
  event_arg_t a = {name, r, reason, -1};
  ce_control_emit_with(ctl, write_event, &a);
}

uint64_t ce_event_ask(ce_control_t *ctl, const ce_reqinfo_t *r, int32_t rule,
                      uint32_t timeout_ms, ce_control_decision_cb cb, void *data) {
  event_arg_t a = {"decision_request", r, NULL, rule};
  return ce_control_ask_with(ctl, write_request, &a, timeout_ms, cb, data);
}
