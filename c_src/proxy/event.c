#include "proxy/event.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/error.h"

static const char *const always_redacted[] = {"authorization", "proxy-authorization", "cookie",
                                              "set-cookie"};

int64_t ce_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void ce_format_time(int64_t us, char *out, size_t cap) {
  time_t secs = (time_t)(us / 1000000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char base[32];
  strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, cap, "%s.%06dZ", base, (int)(us % 1000000));
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
}

void ce_reqinfo_clear(ce_reqinfo_t *r) {
  free(r->path);
  free(r->query);
  free(r->body_preview);
  json_decref(r->headers);
  json_decref(r->response_headers);
  memset(r, 0, sizeof(*r));
  r->matched_rule = -1;
}

/* Header values are bytes; JSON strings must be UTF-8. Values that are not
 * valid UTF-8 (obs-text) are carried with each such byte as U+FFFD so that
 * the event is still valid JSON. */
static json_t *text_value(const char *s, size_t n) {
  json_t *v = json_stringn(s, n);
  if (v != NULL)
    return v;
  char *copy = malloc(n * 3 + 1);
  if (copy == NULL)
    return NULL;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      copy[w++] = (char)c;
    } else {
      copy[w++] = (char)0xef;
      copy[w++] = (char)0xbf;
      copy[w++] = (char)0xbd;
    }
  }
  v = json_stringn(copy, w);
  free(copy);
  return v;
}

static json_t *fields_json(const ce_h1_head_t *head, const ce_proxy_options_t *opts) {
  json_t *arr = json_array();
  if (arr == NULL)
    return NULL;
  for (size_t i = 0; i < head->field_count; i++) {
    const ce_h1_field_t *f = &head->fields[i];
    bool redact = ce_header_redacted(f->name, f->name_len, opts);
    /* json_array_append_new consumes its value, even NULL, and then fails. */
    json_t *pair = json_array();
    if (pair != NULL && (json_array_append_new(pair, text_value(f->name, f->name_len)) != 0 ||
                         json_array_append_new(pair, redact ? json_string("[redacted]")
                                                            : text_value(f->value, f->value_len)) != 0)) {
      json_decref(pair);
      pair = NULL;
    }
    if (pair == NULL || json_array_append_new(arr, pair) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
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
  json_decref(r->headers);
  r->headers = fields_json(head, opts);
  return r->headers != NULL ? CE_OK : CE_ENOMEM;
}

int ce_reqinfo_set_response(ce_reqinfo_t *r, const ce_h1_head_t *head, const ce_proxy_options_t *opts) {
  r->status = head->status;
  json_decref(r->response_headers);
  r->response_headers = fields_json(head, opts);
  if (r->responded_at_us == 0)
    r->responded_at_us = ce_now_us();
  return r->response_headers != NULL ? CE_OK : CE_ENOMEM;
}

void ce_reqinfo_add_preview(ce_reqinfo_t *r, const char *data, size_t len, size_t cap) {
  if (cap == 0 || r->body_preview_len >= cap || len == 0)
    return;
  if (r->body_preview == NULL) {
    r->body_preview = malloc(cap);
    if (r->body_preview == NULL)
      return; /* the preview is best effort; the request is not */
  }
  size_t take = cap - r->body_preview_len < len ? cap - r->body_preview_len : len;
  memcpy(r->body_preview + r->body_preview_len, data, take);
  r->body_preview_len += take;
}

static json_t *time_or_null(int64_t us) {
  if (us == 0)
    return json_null();
  char buf[40];
  ce_format_time(us, buf, sizeof(buf));
  return json_string(buf);
}

static json_t *maybe_string(const char *s) { return s != NULL ? json_string(s) : json_null(); }

static json_t *base64(const char *data, size_t len) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t out_len = (len + 2) / 3 * 4;
  char *out = malloc(out_len + 1);
  if (out == NULL)
    return NULL;
  size_t w = 0;
  for (size_t i = 0; i < len; i += 3) {
    uint32_t v = (uint32_t)(unsigned char)data[i] << 16;
    if (i + 1 < len)
      v |= (uint32_t)(unsigned char)data[i + 1] << 8;
    if (i + 2 < len)
      v |= (unsigned char)data[i + 2];
    out[w++] = tbl[(v >> 18) & 63];
    out[w++] = tbl[(v >> 12) & 63];
    out[w++] = i + 1 < len ? tbl[(v >> 6) & 63] : '=';
    out[w++] = i + 2 < len ? tbl[v & 63] : '=';
  }
  json_t *s = json_stringn(out, w);
  free(out);
  return s;
}

/* Sets key to v (consumed, even NULL) unless an earlier member failed. */
static void put(json_t *ev, bool *ok, const char *key, json_t *v) {
  if (!*ok) {
    json_decref(v);
    return;
  }
  /* json_object_set_new_nocheck: every key here is a literal ASCII name. */
  if (json_object_set_new_nocheck(ev, key, v) != 0)
    *ok = false;
}

json_t *ce_event_new(const char *name, const ce_reqinfo_t *r, const char *reason) {
  char id[24], cid[24];
  snprintf(id, sizeof(id), "%llu", (unsigned long long)r->id);
  snprintf(cid, sizeof(cid), "%llu", (unsigned long long)r->connection_id);
  /* The seeds: matched_rule is the provenance of a decision, so only the
   * allowed and denied events carry it (and decision requests, which
   * carry their rule separately). */
  bool decision = strcmp(name, "request_allowed") == 0 || strcmp(name, "request_denied") == 0;
  json_t *ev = json_object();
  if (ev == NULL)
    return NULL;
  /* Built member by member (json_pack's format parser was a tenth of the
   * proxy's CPU: bench/README.md). All or nothing: an event without its
   * preview would read as a request without a body. */
  bool ok = true;
  put(ev, &ok, "event", json_string(name));
  put(ev, &ok, "at", time_or_null(ce_now_us()));
  put(ev, &ok, "id", json_string(id));
  put(ev, &ok, "connection_id", json_string(cid));
  put(ev, &ok, "scheme", json_string(r->scheme));
  put(ev, &ok, "method", r->method[0] != '\0' ? json_string(r->method) : json_null());
  put(ev, &ok, "host", r->host[0] != '\0' ? text_value(r->host, strlen(r->host)) : json_null());
  put(ev, &ok, "port", json_integer((json_int_t)r->port));
  put(ev, &ok, "path", maybe_string(r->path));
  put(ev, &ok, "query", maybe_string(r->query));
  put(ev, &ok, "http_version", json_string(r->http_version));
  put(ev, &ok, "sni", r->sni[0] != '\0' ? text_value(r->sni, strlen(r->sni)) : json_null());
  put(ev, &ok, "headers", r->headers != NULL ? json_incref(r->headers) : json_array());
  put(ev, &ok, "status", r->status > 0 ? json_integer(r->status) : json_null());
  put(ev, &ok, "response_headers",
      r->response_headers != NULL ? json_incref(r->response_headers) : json_null());
  put(ev, &ok, "bytes_in", json_integer((json_int_t)r->bytes_in));
  put(ev, &ok, "bytes_out", json_integer((json_int_t)r->bytes_out));
  put(ev, &ok, "opened_at", time_or_null(r->opened_at_us));
  put(ev, &ok, "responded_at", time_or_null(r->responded_at_us));
  put(ev, &ok, "closed_at", time_or_null(r->closed_at_us));
  json_t *rule = json_null();
  if (ok && decision && r->matched_rule >= 0) {
    rule = json_object();
    if (rule != NULL) {
      bool rok = true;
      put(rule, &rok, "index", json_integer((json_int_t)r->matched_rule));
      put(rule, &rok, "kind", json_string(r->matched_kind));
      if (!rok) {
        json_decref(rule);
        rule = NULL;
      }
    }
  }
  put(ev, &ok, "matched_rule", rule);
  put(ev, &ok, "reason", maybe_string(reason));
  if (r->stream_id > 0)
    put(ev, &ok, "stream_id", json_integer(r->stream_id));
  if (r->body_preview_len > 0)
    put(ev, &ok, "body_preview", base64(r->body_preview, r->body_preview_len));
  if (!ok) {
    json_decref(ev);
    return NULL;
  }
  return ev;
}
