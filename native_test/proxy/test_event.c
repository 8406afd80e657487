/* Tests for c_src/proxy/event.c: request records, redaction and the event
 * text every lifecycle step writes. The events are checked as the control
 * channel's lines (control/frame.h): parsed back with jansson, compared
 * with the object the jansson-built events had (member by member, in
 * order, and byte for byte with jansson's own compact text), and as exact
 * text where escapes, redaction and U+FFFD matter. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "control/frame.h"
#include "proxy/event.h"

static void field(ce_h1_head_t *h, const char *name, const char *value) {
  ce_h1_field_t *f = &h->fields[h->field_count++];
  f->name = name;
  f->name_len = strlen(name);
  f->value = value;
  f->value_len = strlen(value);
}

static void request_head(ce_h1_head_t *h, const char *target) {
  memset(h, 0, sizeof(*h));
  h->method = "POST";
  h->method_len = 4;
  h->target = target;
  h->target_len = strlen(target);
  h->version_minor = 1;
  /* The spans ce_h1_parse_request fills (http1/parser.h). */
  const char *sep = strstr(target, "://");
  if (sep == NULL) {
    h->target_form = CE_H1_TARGET_ORIGIN;
    h->path = target;
  } else {
    h->target_form = CE_H1_TARGET_ABSOLUTE;
    h->authority = sep + 3;
    h->path = strchr(sep + 3, '/');
    if (h->path == NULL)
      h->path = target + h->target_len;
    h->authority_len = (size_t)(h->path - h->authority);
  }
  h->path_len = (size_t)(target + h->target_len - h->path);
  field(h, "Host", "api.example.com");
  field(h, "Authorization", "Bearer sk-secret");
  field(h, "cookie", "session=abc");
  field(h, "X-Api-Key", "k-123");
  field(h, "Accept", "*/*");
}

/* ---- lines ---------------------------------------------------------------- */

typedef struct {
  const char *name;
  const ce_reqinfo_t *r;
  const char *reason;
  int32_t rule; /* >= 0: a decision_request frame */
} ev_arg_t;

static void write_ev(ce_jsonw_t *w, const void *arg) {
  const ev_arg_t *a = arg;
  if (a->rule >= 0)
    ce_event_write_decision_request(w, a->r, a->rule);
  else
    ce_event_write(w, a->name, a->r, a->reason);
}

/* The event's line as the channel encodes it (seq 7), or NULL with *rc. */
static ce__line_t *event_line(const char *name, const ce_reqinfo_t *r, const char *reason,
                              int *rc) {
  ev_arg_t a = {name, r, reason, -1};
  ce__line_t *line = NULL;
  *rc = ce__line_encode_frame_with("event", "seq", 7, false, write_ev, &a, &line);
  return line;
}

static ce__line_t *request_line(const ce_reqinfo_t *r, int32_t rule, int *rc) {
  ev_arg_t a = {"decision_request", r, NULL, rule};
  ce__line_t *line = NULL;
  *rc = ce__line_encode_frame_with("decision_request", "id", 5, true, write_ev, &a, &line);
  return line;
}

static bool has(const ce__line_t *line, const char *text) {
  return memmem(line->data, line->len, text, strlen(text)) != NULL;
}

/* Parses a line (one object, one final '\n', no other newline). */
static json_t *parse_line(const ce__line_t *line) {
  cr_assert_gt(line->len, 1);
  cr_assert_eq(line->data[line->len - 1], '\n');
  cr_assert_null(memchr(line->data, '\n', line->len - 1), "a raw newline inside the line");
  json_error_t jerr;
  json_t *j = json_loadb(line->data, line->len - 1, JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(j, "%s: %.*s", jerr.text, (int)line->len, line->data);
  cr_assert(json_is_object(j));
  return j;
}

/* The line is exactly jansson's compact text of want, after want's "at"
 * (and the nested request's) takes the line's value: the same members, in
 * the same order, with the same types, values and escapes. */
static void expect_line_is(const ce__line_t *line, json_t *want) {
  json_t *got = parse_line(line);
  json_t *got_at = json_object_get(got, "at");
  if (got_at != NULL)
    json_object_set(want, "at", got_at);
  json_t *req = json_object_get(want, "request");
  if (req != NULL)
    json_object_set(req, "at", json_object_get(json_object_get(got, "request"), "at"));
  cr_assert(json_equal(got, want), "%.*s", (int)line->len, line->data);
  char *text = json_dumps(want, JSON_COMPACT);
  cr_assert_not_null(text);
  cr_assert_eq(line->len, strlen(text) + 1, "%.*s\n%s", (int)line->len, line->data, text);
  cr_assert_eq(memcmp(line->data, text, line->len - 1), 0, "%.*s\n%s", (int)line->len,
               line->data, text);
  free(text);
  json_decref(got);
}

/* ---- records ---------------------------------------------------------------- */

Test(event, redaction_is_applied_when_recorded) {
  ce_proxy_options_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.redact[opts.redact_count++] = "x-api-key";
  ce_h1_head_t h;
  request_head(&h, "/v1/items?limit=5&q=a");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 7, 3);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, &opts), CE_OK);
  cr_expect_str_eq(r.method, "POST");
  cr_expect_str_eq(r.path, "/v1/items");
  cr_expect_str_eq(r.query, "limit=5&q=a");

  const char *want = "[[\"Host\",\"api.example.com\"],[\"Authorization\",\"[redacted]\"],"
                     "[\"cookie\",\"[redacted]\"],[\"X-Api-Key\",\"[redacted]\"],[\"Accept\",\"*/*\"]]";
  cr_assert_eq(r.headers_len, strlen(want), "%.*s", (int)r.headers_len, r.headers);
  cr_expect_eq(memcmp(r.headers, want, r.headers_len), 0, "%.*s", (int)r.headers_len, r.headers);

  /* And in the event: no secret anywhere in the line. */
  int rc;
  ce__line_t *line = event_line("request_opened", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_expect_not(has(line, "sk-secret"));
  cr_expect_not(has(line, "session=abc"));
  cr_expect_not(has(line, "k-123"));
  cr_expect(has(line, want));
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, response_headers_are_redacted_too) {
  ce_h1_head_t h;
  memset(&h, 0, sizeof(h));
  h.status = 200;
  field(&h, "Set-Cookie", "sid=1");
  field(&h, "Content-Type", "text/plain");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_response(&r, &h, NULL), CE_OK);
  cr_expect_eq(r.status, 200);
  cr_expect_neq(r.responded_at_us, 0);
  const char *want = "[[\"Set-Cookie\",\"[redacted]\"],[\"Content-Type\",\"text/plain\"]]";
  cr_assert_eq(r.response_headers_len, strlen(want));
  cr_expect_eq(memcmp(r.response_headers, want, strlen(want)), 0);
  /* A second response head (after a 100 Continue) replaces the list. */
  h.field_count = 0;
  field(&h, "Server", "x");
  cr_assert_eq(ce_reqinfo_set_response(&r, &h, NULL), CE_OK);
  want = "[[\"Server\",\"x\"]]";
  cr_assert_eq(r.response_headers_len, strlen(want));
  cr_expect_eq(memcmp(r.response_headers, want, strlen(want)), 0);
  ce_reqinfo_clear(&r);
}

Test(event, absolute_form_targets_show_only_path_and_query) {
  ce_h1_head_t h;
  request_head(&h, "http://api.example.com:80/a/b?x=1");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_expect_str_eq(r.path, "/a/b");
  cr_expect_str_eq(r.query, "x=1");
  ce_reqinfo_clear(&r);

  request_head(&h, "http://api.example.com");
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_expect_str_eq(r.path, "/");
  cr_expect_null(r.query);
  ce_reqinfo_clear(&r);
}

/* ---- events ------------------------------------------------------------------ */

Test(event, event_carries_every_field_in_order) {
  ce_h1_head_t h;
  request_head(&h, "/p");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 42, 9);
  r.scheme = "https";
  r.port = 443;
  strcpy(r.host, "api.example.com");
  strcpy(r.sni, "api.example.com");
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  ce_h1_head_t resp;
  memset(&resp, 0, sizeof(resp));
  resp.status = 201;
  field(&resp, "Content-Length", "0");
  cr_assert_eq(ce_reqinfo_set_response(&r, &resp, NULL), CE_OK);
  r.matched_rule = 2;
  r.matched_kind = "deny";
  r.bytes_out = 120;
  r.bytes_in = 5000000000ULL; /* past 32 bits */
  r.opened_at_us = 1763788179123456LL;
  r.responded_at_us = 1763788179200000LL;
  r.closed_at_us = 1763788180000001LL;
  r.stream_id = 3;
  ce_reqinfo_add_preview(&r, "hello world", 11, 5);
  ce_reqinfo_add_preview(&r, "more", 4, 5);

  int rc;
  ce__line_t *line = event_line("request_denied", &r, "denied_by_rule", &rc);
  cr_assert_eq(rc, CE_OK);
  /* The envelope first, then the members as the jansson-built event had
   * them (docs/control-channel.md). */
  json_t *want = json_pack(
      "{s:s s:i s:s s:s s:s s:s s:s s:s s:s s:i s:s s:n s:s s:s"
      " s:[[s s] [s s] [s s] [s s] [s s]] s:i s:[[s s]] s:I s:I s:s s:s s:s"
      " s:{s:i s:s} s:s s:i s:s}",
      "type", "event", "seq", 7, "event", "request_denied", "at", "", "id", "42",
      "connection_id", "9", "scheme", "https", "method", "POST", "host", "api.example.com",
      "port", 443, "path", "/p", "query", "http_version", "HTTP/1.1", "sni", "api.example.com",
      "headers", "Host", "api.example.com", "Authorization", "[redacted]", "cookie",
      "[redacted]", "X-Api-Key", "k-123", "Accept", "*/*", "status", 201, "response_headers",
      "Content-Length", "0", "bytes_in", (json_int_t)5000000000LL, "bytes_out", (json_int_t)120,
      "opened_at", "2025-11-22T05:09:39.123456Z", "responded_at", "2025-11-22T05:09:39.200000Z",
      "closed_at", "2025-11-22T05:09:40.000001Z", "matched_rule", "index", 2, "kind", "deny",
      "reason", "denied_by_rule", "stream_id", 3, "body_preview", "aGVsbG8=");
  cr_assert_not_null(want);
  expect_line_is(line, want);
  json_t *got = parse_line(line);
  const char *at = json_string_value(json_object_get(got, "at"));
  cr_assert_not_null(at);
  cr_expect_eq(strlen(at), 27, "%s", at);
  cr_expect_eq(at[10], 'T');
  cr_expect_eq(at[26], 'Z');
  json_decref(got);
  json_decref(want);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, lifecycle_events_have_null_rule_and_reason) {
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  r.matched_rule = 4; /* only allowed and denied events carry it */
  r.matched_kind = "allow";
  int rc;
  ce__line_t *line = event_line("request_opened", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  json_t *want = json_pack(
      "{s:s s:i s:s s:s s:s s:s s:s s:n s:n s:i s:n s:n s:s s:n s:[] s:n s:n s:i s:i s:s s:n s:n"
      " s:n s:n}",
      "type", "event", "seq", 7, "event", "request_opened", "at", "", "id", "1", "connection_id",
      "1", "scheme", "http", "method", "host", "port", 0, "path", "query", "http_version",
      "HTTP/1.1", "sni", "headers", "status", "response_headers", "bytes_in", 0, "bytes_out", 0,
      "opened_at", "", "responded_at", "closed_at", "matched_rule", "reason");
  cr_assert_not_null(want);
  /* opened_at is the record's clock: take it from the line. */
  json_t *got = parse_line(line);
  json_object_set(want, "opened_at", json_object_get(got, "opened_at"));
  cr_assert(json_is_string(json_object_get(got, "opened_at")));
  json_decref(got);
  expect_line_is(line, want);
  json_decref(want);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, only_the_events_that_end_a_request_carry_its_duration) {
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_gt(r.opened_mono_us, 0);
  /* As if opened 1.5 s ago on the monotonic clock. */
  r.opened_mono_us -= 1500000;
  const char *ends[] = {"request_closed", "request_failed"};
  for (size_t i = 0; i < 2; i++) {
    int rc;
    ce__line_t *line = event_line(ends[i], &r, NULL, &rc);
    cr_assert_eq(rc, CE_OK);
    json_t *got = parse_line(line);
    json_t *d = json_object_get(got, "duration_us");
    cr_assert(json_is_integer(d), "%.*s", (int)line->len, line->data);
    cr_expect_geq(json_integer_value(d), 1500000);
    cr_expect_lt(json_integer_value(d), 1500000 + 60 * 1000000LL);
    json_decref(got);
    ce__line_unref(line);
  }
  const char *others[] = {"request_opened", "request_allowed", "request_denied"};
  for (size_t i = 0; i < 3; i++) {
    int rc;
    r.matched_kind = "allow";
    ce__line_t *line = event_line(others[i], &r, NULL, &rc);
    cr_assert_eq(rc, CE_OK);
    cr_expect_not(has(line, "duration_us"), "%s", others[i]);
    ce__line_unref(line);
  }
  /* An unknown start (a record not from ce_reqinfo_init): no duration. */
  r.opened_mono_us = 0;
  int rc;
  ce__line_t *line = event_line("request_closed", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_expect_not(has(line, "duration_us"));
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, allowed_events_carry_their_rule) {
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  r.matched_rule = 0;
  r.matched_kind = "allow";
  int rc;
  ce__line_t *line = event_line("request_allowed", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_expect(has(line, ",\"matched_rule\":{\"index\":0,\"kind\":\"allow\"},"));
  ce__line_unref(line);
  /* A rule without its kind is a bug: no event rather than a wrong one. */
  r.matched_kind = NULL;
  line = event_line("request_allowed", &r, NULL, &rc);
  cr_expect_eq(rc, CE_EINVAL);
  cr_expect_null(line);
  ce_reqinfo_clear(&r);
}

Test(event, non_utf8_header_values_become_replacement_characters) {
  ce_h1_head_t h;
  memset(&h, 0, sizeof(h));
  h.method = "GET";
  h.method_len = 3;
  h.target = "/";
  h.target_len = 1;
  field(&h, "X-Bin", "caf\xe9");
  field(&h, "X-Utf8", "caf\xc3\xa9");
  field(&h, "X-Esc", "a\"b\\c\x01\t"); /* escaped, as jansson escapes */
  field(&h, "X-Mixed", "\xc3\xa9\xff\x7f");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  /* The host and SNI are cut to their buffers and may end mid-sequence. */
  strcpy(r.host, "ex\xc3");
  strcpy(r.sni, "ex\xc3\xa9.com");
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  const char *want = "[[\"X-Bin\",\"caf\xef\xbf\xbd\"],[\"X-Utf8\",\"caf\xc3\xa9\"],"
                     "[\"X-Esc\",\"a\\\"b\\\\c\\u0001\\t\"],"
                     "[\"X-Mixed\",\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\x7f\"]]";
  cr_assert_eq(r.headers_len, strlen(want), "%.*s", (int)r.headers_len, r.headers);
  cr_expect_eq(memcmp(r.headers, want, r.headers_len), 0, "%.*s", (int)r.headers_len, r.headers);
  int rc;
  ce__line_t *line = event_line("request_opened", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_expect(has(line, ",\"host\":\"ex\xef\xbf\xbd\","));
  cr_expect(has(line, ",\"sni\":\"ex\xc3\xa9.com\","));
  json_t *got = parse_line(line);
  const char *v = json_string_value(json_array_get(json_array_get(json_object_get(got, "headers"), 0), 1));
  cr_expect_str_eq(v, "caf\xef\xbf\xbd");
  json_decref(got);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, a_path_that_is_not_utf8_is_written_with_replacement_characters) {
  /* The jansson-built event dropped it, and so did the first text writer:
   * a workspace could take its own requests out of the audit trail with a
   * byte that is not UTF-8 (h2 lets one into :path). Now U+FFFD. */
  ce_h1_head_t h;
  request_head(&h, "/caf\xe9?q=\xff");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  int rc;
  ce__line_t *line = event_line("request_opened", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_assert_not_null(line);
  json_t *ev = parse_line(line);
  cr_expect_str_eq(json_string_value(json_object_get(ev, "path")), "/caf\xef\xbf\xbd");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "query")), "q=\xef\xbf\xbd");
  json_decref(ev);
  ce__line_unref(line);
  line = request_line(&r, 1, &rc);
  cr_assert_eq(rc, CE_OK);
  cr_assert_not_null(line);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, decision_request_frame) {
  ce_h1_head_t h;
  request_head(&h, "/upload?x=1");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 11, 4);
  r.scheme = "https";
  r.port = 443;
  strcpy(r.host, "evil.com");
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  r.opened_at_us = 1763788179123456LL;
  r.matched_rule = 2; /* not in the request: the frame's "rule" says it */
  r.matched_kind = "decide";
  int rc;
  ce__line_t *line = request_line(&r, 2, &rc);
  cr_assert_eq(rc, CE_OK);
  json_t *want = json_pack(
      "{s:s s:s s:{s:s s:s s:s s:s s:s s:s s:s s:i s:s s:s s:s s:n"
      " s:[[s s] [s s] [s s] [s s] [s s]] s:n s:n s:i s:i s:s s:n s:n s:n s:n} s:{s:i s:s}}",
      "type", "decision_request", "id", "5", "request", "event", "decision_request", "at", "",
      "id", "11", "connection_id", "4", "scheme", "https", "method", "POST", "host", "evil.com",
      "port", 443, "path", "/upload", "query", "x=1", "http_version", "HTTP/1.1", "sni",
      "headers", "Host", "api.example.com", "Authorization", "[redacted]", "cookie",
      "[redacted]", "X-Api-Key", "k-123", "Accept", "*/*", "status", "response_headers",
      "bytes_in", 0, "bytes_out", 0, "opened_at", "2025-11-22T05:09:39.123456Z",
      "responded_at", "closed_at", "matched_rule", "reason", "rule", "index", 2, "kind",
      "decide");
  cr_assert_not_null(want);
  expect_line_is(line, want);
  json_decref(want);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
}

Test(event, a_long_preview_is_written_whole) {
  /* Past the writer's inline buffer and the base64 chunk. */
  size_t n = 65536;
  char *body = malloc(n);
  cr_assert_not_null(body);
  for (size_t i = 0; i < n; i++)
    body[i] = (char)(i * 7);
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  ce_reqinfo_add_preview(&r, body, n - 1, n);
  int rc;
  ce__line_t *line = event_line("request_closed", &r, NULL, &rc);
  cr_assert_eq(rc, CE_OK);
  json_t *got = parse_line(line);
  const char *b64 = json_string_value(json_object_get(got, "body_preview"));
  cr_assert_not_null(b64);
  cr_assert_eq(strlen(b64), (n - 1 + 2) / 3 * 4);
  /* Decode and compare. */
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0;
  for (size_t i = 0; b64[i] != '\0'; i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      char c = b64[i + (size_t)k];
      v <<= 6;
      if (c == '=')
        pad++;
      else
        v |= (uint32_t)(strchr(tbl, c) - tbl);
    }
    for (int k = 0; k < 3 - pad; k++, o++)
      cr_assert_eq((unsigned char)body[o], (unsigned char)(v >> (16 - 8 * k)), "byte %zu", o);
  }
  cr_assert_eq(o, n - 1);
  json_decref(got);
  ce__line_unref(line);
  ce_reqinfo_clear(&r);
  free(body);
}

/* A header list longer than a frame: the request goes on (as it did when
 * the event was only refused at encoding), every event of it is dropped. */
Test(event, a_header_list_too_long_for_a_frame_drops_the_events) {
  size_t n = 200 * 1024;
  char *v = malloc(n + 1);
  cr_assert_not_null(v);
  memset(v, '\x01', n); /* 6 bytes each once escaped: 1.2 MB */
  v[n] = '\0';
  ce_h1_head_t h;
  request_head(&h, "/");
  field(&h, "X-Big", v);
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_expect_null(r.headers);
  cr_expect_eq(r.headers_err, CE_ETOOBIG);
  int rc;
  cr_expect_null(event_line("request_opened", &r, NULL, &rc));
  cr_expect_eq(rc, CE_ETOOBIG);
  cr_expect_null(request_line(&r, 0, &rc));
  cr_expect_eq(rc, CE_ETOOBIG);
  ce_reqinfo_clear(&r);

  free(v);

  /* Within a frame as a list, but not with the rest of the event. */
  n = CE_CONTROL_MAX_FRAME;
  v = malloc(n);
  cr_assert_not_null(v);
  memset(v, 'x', n);
  request_head(&h, "/");
  field(&h, "X-Big", "");
  h.fields[h.field_count - 1].value = v;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  size_t base = r.headers_len;
  h.fields[h.field_count - 1].value_len = CE_CONTROL_MAX_FRAME - 10 - base;
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_assert_not_null(r.headers);
  cr_assert_eq(r.headers_len, CE_CONTROL_MAX_FRAME - 10);
  cr_expect_eq(r.headers_err, CE_OK);
  cr_expect_null(event_line("request_opened", &r, NULL, &rc));
  cr_expect_eq(rc, CE_ETOOBIG);
  /* One byte more and the list itself does not fit. */
  h.fields[h.field_count - 1].value_len = CE_CONTROL_MAX_FRAME - base + 1;
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_expect_null(r.headers);
  cr_expect_eq(r.headers_err, CE_ETOOBIG);
  ce_reqinfo_clear(&r);
  free(v);
}

Test(event, time_format) {
  char buf[40];
  ce_format_time(1763788179123456LL, buf, sizeof(buf));
  cr_expect_str_eq(buf, "2025-11-22T05:09:39.123456Z");
  /* The same second (its date and time are kept), the next, and back. */
  ce_format_time(1763788179000007LL, buf, sizeof(buf));
  cr_expect_str_eq(buf, "2025-11-22T05:09:39.000007Z");
  ce_format_time(1763788180999999LL, buf, sizeof(buf));
  cr_expect_str_eq(buf, "2025-11-22T05:09:40.999999Z");
  ce_format_time(1763788179500000LL, buf, sizeof(buf));
  cr_expect_str_eq(buf, "2025-11-22T05:09:39.500000Z");
  ce_format_time(0, buf, sizeof(buf));
  cr_expect_str_eq(buf, "1970-01-01T00:00:00.000000Z");
  ce_format_time(951782400000000LL, buf, sizeof(buf)); /* a leap day */
  cr_expect_str_eq(buf, "2000-02-29T00:00:00.000000Z");
  /* Cut to the buffer, NUL-terminated. */
  char small[12];
  ce_format_time(1763788179123456LL, small, sizeof(small));
  cr_expect_str_eq(small, "2025-11-22T");
}

Test(event, a_path_that_ends_its_buffer_without_a_nul_is_copied_within_bounds) {
  /* An h2 :path is a span of a header buffer, not NUL-terminated, and may
   * be the last bytes of it (the sanitizers run with strict string
   * checks: a strndup there read past the buffer). */
  ce_h1_head_t h;
  request_head(&h, "/");
  char *buf = malloc(9);
  cr_assert_not_null(buf);
  memcpy(buf, "/p/q?a=12", 9);
  h.path = buf;
  h.path_len = 9;
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  cr_expect_str_eq(r.path, "/p/q");
  cr_expect_str_eq(r.query, "a=12");
  ce_reqinfo_clear(&r);
  free(buf);
}
