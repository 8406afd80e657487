/* Tests for c_src/proxy/event.c: request records, redaction and the event
 * JSON every lifecycle step emits. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
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

  char *dump = json_dumps(r.headers, JSON_COMPACT);
  cr_expect_null(strstr(dump, "sk-secret"));
  cr_expect_null(strstr(dump, "session=abc"));
  cr_expect_null(strstr(dump, "k-123"));
  cr_expect_str_eq(dump, "[[\"Host\",\"api.example.com\"],[\"Authorization\",\"[redacted]\"],"
                         "[\"cookie\",\"[redacted]\"],[\"X-Api-Key\",\"[redacted]\"],[\"Accept\",\"*/*\"]]");
  free(dump);
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

Test(event, event_carries_every_field) {
  ce_h1_head_t h;
  request_head(&h, "/p");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 42, 9);
  r.scheme = "https";
  r.port = 443;
  strcpy(r.host, "api.example.com");
  strcpy(r.sni, "api.example.com");
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  r.matched_rule = 2;
  r.matched_kind = "deny";
  r.bytes_out = 120;
  ce_reqinfo_add_preview(&r, "hello world", 11, 5);
  ce_reqinfo_add_preview(&r, "more", 4, 5);

  json_t *ev = ce_event_new("request_denied", &r, "denied_by_rule");
  cr_assert_not_null(ev);
  cr_expect_str_eq(json_string_value(json_object_get(ev, "event")), "request_denied");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "id")), "42");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "connection_id")), "9");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "scheme")), "https");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "method")), "POST");
  cr_expect_eq(json_integer_value(json_object_get(ev, "port")), 443);
  cr_expect_str_eq(json_string_value(json_object_get(ev, "reason")), "denied_by_rule");
  cr_expect_eq(json_integer_value(json_object_get(ev, "bytes_out")), 120);
  cr_expect(json_is_null(json_object_get(ev, "status")));
  cr_expect(json_is_null(json_object_get(ev, "query")));
  json_t *rule = json_object_get(ev, "matched_rule");
  cr_expect_eq(json_integer_value(json_object_get(rule, "index")), 2);
  cr_expect_str_eq(json_string_value(json_object_get(rule, "kind")), "deny");
  cr_expect_str_eq(json_string_value(json_object_get(ev, "body_preview")), "aGVsbG8=", "5 bytes capped");
  const char *at = json_string_value(json_object_get(ev, "at"));
  cr_assert_not_null(at);
  cr_expect_eq(strlen(at), 27, "%s", at);
  cr_expect_eq(at[10], 'T');
  cr_expect_eq(at[26], 'Z');
  json_decref(ev);
  ce_reqinfo_clear(&r);
}

Test(event, lifecycle_events_have_null_rule_and_reason) {
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  json_t *ev = ce_event_new("request_opened", &r, NULL);
  cr_assert_not_null(ev);
  cr_expect(json_is_null(json_object_get(ev, "matched_rule")));
  cr_expect(json_is_null(json_object_get(ev, "reason")));
  cr_expect(json_is_null(json_object_get(ev, "method")));
  cr_expect(json_is_array(json_object_get(ev, "headers")));
  cr_expect_null(json_object_get(ev, "body_preview"));
  json_decref(ev);
  ce_reqinfo_clear(&r);
}

Test(event, non_utf8_header_values_stay_valid_json) {
  ce_h1_head_t h;
  memset(&h, 0, sizeof(h));
  h.method = "GET";
  h.method_len = 3;
  h.target = "/";
  h.target_len = 1;
  field(&h, "X-Bin", "caf\xe9");
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  cr_assert_eq(ce_reqinfo_set_request(&r, &h, NULL), CE_OK);
  const char *v = json_string_value(json_array_get(json_array_get(r.headers, 0), 1));
  cr_expect_str_eq(v, "caf\xef\xbf\xbd");
  ce_reqinfo_clear(&r);
}

Test(event, time_format) {
  char buf[40];
  ce_format_time(1763788179123456LL, buf, sizeof(buf));
  cr_expect_str_eq(buf, "2025-11-22T05:09:39.123456Z");
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
