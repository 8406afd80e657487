/* Tests for c_src/control/frame.c: what ce_control_frame_parse() accepts
 * and refuses (docs/control-channel.md, "Peer to sidecar"), and the line
 * encoder the sidecar writes with. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "control/frame.h"

/* Every frame parsed here is also judged as a jansson value by
 * ce_control_frame_check() (the port program's check before it writes a
 * frame), which must agree: the same code, the same reason, the same
 * frame. Text that jansson alone refuses has no value to judge. */
static void check_agrees(const char *text, int rc, const ce_frame_t *f, const char *why) {
  json_error_t jerr;
  json_t *v = json_loadb(text, strlen(text), JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (v == NULL || rc == CE_ETOOBIG) {
    json_decref(v);
    return;
  }
  ce_frame_t g;
  memset(&g, 0, sizeof(g));
  const char *why2 = "unset";
  int rc2 = ce_control_frame_check(v, &g, &why2);
  json_decref(v);
  cr_assert_eq(rc2, rc, "%s: the check says %s, the parser %s", text, ce_err_name(rc2),
               ce_err_name(rc));
  if (rc != CE_OK) {
    cr_assert_str_eq(why2, why, "%s", text);
    return;
  }
  cr_assert_null(why2);
  cr_assert_eq(memcmp(&g, f, sizeof(g)), 0, "%s: the check gives another frame", text);
}

static int parse(const char *text, ce_frame_t *f, const char **why) {
  ce_frame_t zeroed;
  memset(&zeroed, 0, sizeof(zeroed));
  const char *why1 = NULL;
  int rc = ce_control_frame_parse(text, strlen(text), &zeroed, &why1);
  check_agrees(text, rc, &zeroed, why1);
  rc = ce_control_frame_parse(text, strlen(text), f, why);
  return rc;
}

static ce_frame_t parse_ok(const char *text) {
  ce_frame_t f;
  const char *why = "unset";
  int rc = parse(text, &f, &why);
  cr_assert_eq(rc, CE_OK, "%s: %s (%s)", text, why, ce_err_name(rc));
  cr_assert_null(why);
  return f;
}

/* Refusals leave *out untouched: the test fills it with a marker first. */
static void refused(const char *text, int code, const char *why_part) {
  ce_frame_t f;
  memset(&f, 0x5a, sizeof(f));
  const char *why = NULL;
  int rc = parse(text, &f, &why);
  cr_assert_eq(rc, code, "%s: got %s, want %s", text, ce_err_name(rc), ce_err_name(code));
  cr_assert_not_null(why, "%s: no reason", text);
  cr_assert_not_null(strstr(why, why_part), "%s: reason \"%s\" lacks \"%s\"", text, why,
                     why_part);
  for (size_t i = 0; i < sizeof(f); i++)
    cr_assert_eq(((unsigned char *)&f)[i], 0x5a, "%s: *out was touched", text);
}

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define HELLO(rest) "{\"type\":\"hello\",\"version\":2," rest "}"

Test(frame, hello_accepted) {
  ce_frame_t f = parse_ok(HELLO("\"session_id\":\"ws-7f3a\",\"nonce\":\"" H64 "\""));
  cr_assert_eq(f.type, CE_FRAME_HELLO);
  cr_assert_eq(f.version, 2);
  cr_assert_str_eq(f.session_id, "ws-7f3a");
  cr_assert_eq(f.nonce[0], 0x01);
  cr_assert_eq(f.nonce[31], 0xef);
}

/* The optional ticket: 64 lowercase hex digits, or absent (null too). */
Test(frame, hello_ticket) {
  ce_frame_t f = parse_ok(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "\""));
  cr_assert_not(f.has_ticket);
  f = parse_ok(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "\",\"ticket\":null"));
  cr_assert_not(f.has_ticket);
  f = parse_ok(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "\",\"ticket\":\"" H64 "\""));
  cr_assert(f.has_ticket);
  cr_assert_eq(f.ticket[0], 0x01);
  cr_assert_eq(f.ticket[31], 0xef);
  refused(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "\",\"ticket\":\"abcd\""), CE_EPARSE,
          "\"ticket\" must be 64");
  refused(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "\",\"ticket\":7"), CE_EPARSE,
          "\"ticket\" must be 64");
  /* Only a hello has one. */
  f = parse_ok("{\"type\":\"ping\",\"ticket\":\"" H64 "\"}");
  cr_assert_not(f.has_ticket);
}

Test(frame, hello_with_unknown_members_and_whitespace) {
  ce_frame_t f = parse_ok(" {\"nonce\":\"" H64 "\", \"future\":{\"x\":[1,2,{}]},"
                          "\"type\":\"hello\",\"session_id\":\"s\",\"version\":2}\r");
  cr_assert_eq(f.type, CE_FRAME_HELLO);
  cr_assert_str_eq(f.session_id, "s");
}

Test(frame, hello_longest_session_id) {
  char text[600];
  char sid[258];
  memset(sid, 'e', 256);
  sid[256] = '\0';
  snprintf(text, sizeof(text), HELLO("\"session_id\":\"%s\",\"nonce\":\"" H64 "\""), sid);
  ce_frame_t f = parse_ok(text);
  cr_assert_str_eq(f.session_id, sid);
  sid[256] = 'e';
  sid[257] = '\0';
  snprintf(text, sizeof(text), HELLO("\"session_id\":\"%s\",\"nonce\":\"" H64 "\""), sid);
  refused(text, CE_EPARSE, "1 to 256 bytes");
}

Test(frame, hello_refusals) {
  refused("{\"type\":\"hello\",\"session_id\":\"s\",\"nonce\":\"" H64 "\"}", CE_EPARSE,
          "missing \"version\"");
  /* The first protocol sent the token itself: it is refused, never read. */
  refused("{\"type\":\"hello\",\"version\":1,\"token\":\"" H64 "\"}", CE_EPARSE,
          "unsupported version");
  refused("{\"type\":\"hello\",\"version\":3,\"session_id\":\"s\",\"nonce\":\"" H64 "\"}",
          CE_EPARSE, "unsupported version");
  refused("{\"type\":\"hello\",\"version\":2.0,\"session_id\":\"s\",\"nonce\":\"" H64 "\"}",
          CE_EPARSE, "must be an integer");
  refused("{\"type\":\"hello\",\"version\":\"2\",\"session_id\":\"s\",\"nonce\":\"" H64 "\"}",
          CE_EPARSE, "must be an integer");
  refused(HELLO("\"nonce\":\"" H64 "\""), CE_EPARSE, "missing \"session_id\"");
  refused(HELLO("\"session_id\":7,\"nonce\":\"" H64 "\""), CE_EPARSE, "must be a string");
  refused(HELLO("\"session_id\":\"\",\"nonce\":\"" H64 "\""), CE_EPARSE, "1 to 256");
  refused(HELLO("\"session_id\":\"s\""), CE_EPARSE, "\"nonce\" must be 64");
  refused(HELLO("\"session_id\":\"s\",\"nonce\":null"), CE_EPARSE, "\"nonce\" must be 64");
  refused(HELLO("\"session_id\":\"s\",\"nonce\":\"abcd\""), CE_EPARSE, "\"nonce\" must be 64");
  refused(HELLO("\"session_id\":\"s\",\"nonce\":\"" H64 "00\""), CE_EPARSE,
          "\"nonce\" must be 64");
  refused(HELLO("\"session_id\":\"s\",\"nonce\":\"0123456789ABCDEF0123456789abcdef0123456789abcdef"
                "0123456789abcdef\""),
          CE_EPARSE, "\"nonce\" must be 64");
  refused(HELLO("\"session_id\":\"s\\u0000\",\"nonce\":\"" H64 "\""), CE_EPARSE,
          "not valid JSON");
}

Test(frame, auth_accepted_and_refused) {
  ce_frame_t f = parse_ok("{\"type\":\"auth\",\"proof\":\"" H64 "\",\"more\":1}");
  cr_assert_eq(f.type, CE_FRAME_AUTH);
  cr_assert_eq(f.proof[0], 0x01);
  cr_assert_eq(f.proof[31], 0xef);
  refused("{\"type\":\"auth\"}", CE_EPARSE, "\"proof\" must be 64");
  refused("{\"type\":\"auth\",\"proof\":\"" H64 "0\"}", CE_EPARSE, "\"proof\" must be 64");
  refused("{\"type\":\"auth\",\"proof\":[1]}", CE_EPARSE, "\"proof\" must be 64");
  refused("{\"type\":\"auth\",\"proof\":\"" H64 "\",\"proof\":\"" H64 "\"}", CE_EPARSE,
          "duplicate");
}

Test(frame, decision_accepted) {
  ce_frame_t f = parse_ok("{\"type\":\"decision\",\"id\":\"42\",\"decision\":\"deny\","
                          "\"reason\":\"no thanks \\u00e9\",\"cache\":false}");
  cr_assert_eq(f.type, CE_FRAME_DECISION);
  cr_assert_eq(f.id, 42);
  cr_assert_not(f.allow);
  cr_assert_str_eq(f.reason, "no thanks \xc3\xa9");
  cr_assert_not(f.cacheable);

  f = parse_ok("{\"type\":\"decision\",\"id\":\"18446744073709551615\",\"decision\":\"allow\"}");
  cr_assert_eq(f.id, UINT64_MAX);
  cr_assert(f.allow);
  cr_assert_str_empty(f.reason);
  cr_assert_not(f.cacheable, "cache defaults to false");

  f = parse_ok("{\"type\":\"decision\",\"id\":\"0\",\"decision\":\"allow\","
               "\"reason\":null,\"cache\":null,\"extra\":[1]}");
  cr_assert_eq(f.id, 0);
  cr_assert_str_empty(f.reason);
  cr_assert_not(f.cacheable, "null means absent");

  f = parse_ok("{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"cache\":true}");
  cr_assert(f.cacheable);
}

Test(frame, decision_reason_limit) {
  char text[700];
  char reason[514];
  memset(reason, 'r', 512);
  reason[512] = '\0';
  snprintf(text, sizeof(text),
           "{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"reason\":\"%s\"}",
           reason);
  ce_frame_t f = parse_ok(text);
  cr_assert_eq(strlen(f.reason), 512);
  snprintf(text, sizeof(text),
           "{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"reason\":\"%sr\"}",
           reason);
  refused(text, CE_EPARSE, "longer than 512 bytes");
}

Test(frame, decision_refusals) {
  refused("{\"type\":\"decision\",\"decision\":\"allow\"}", CE_EPARSE, "missing \"id\"");
  refused("{\"type\":\"decision\",\"id\":7,\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"07\",\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"+7\",\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"-7\",\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"\",\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"7 \",\"decision\":\"allow\"}", CE_EPARSE,
          "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"18446744073709551616\",\"decision\":\"allow\"}",
          CE_EPARSE, "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"184467440737095516150\",\"decision\":\"allow\"}",
          CE_EPARSE, "decimal string");
  refused("{\"type\":\"decision\",\"id\":\"1\"}", CE_EPARSE, "missing \"decision\"");
  refused("{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"Allow\"}", CE_EPARSE,
          "\"allow\" or \"deny\"");
  refused("{\"type\":\"decision\",\"id\":\"1\",\"decision\":true}", CE_EPARSE,
          "\"allow\" or \"deny\"");
  refused("{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"reason\":5}",
          CE_EPARSE, "\"reason\" must be a string");
  refused("{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"cache\":\"yes\"}",
          CE_EPARSE, "\"cache\" must be a boolean");
  refused("{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"deny\",\"cache\":1}",
          CE_EPARSE, "\"cache\" must be a boolean");
}

Test(frame, ping) {
  ce_frame_t f = parse_ok("{\"type\":\"ping\"}");
  cr_assert_eq(f.type, CE_FRAME_PING);
  f = parse_ok("{\"type\":\"ping\",\"at\":\"2026-01-01T00:00:00Z\"}");
  cr_assert_eq(f.type, CE_FRAME_PING);
}

Test(frame, envelope_refusals) {
  refused("", CE_EPARSE, "not valid JSON");
  refused("   ", CE_EPARSE, "not valid JSON");
  refused("nul", CE_EPARSE, "not valid JSON");
  refused("\"hello\"", CE_EPARSE, "not a JSON object");
  refused("42", CE_EPARSE, "not a JSON object");
  refused("null", CE_EPARSE, "not a JSON object");
  refused("[{\"type\":\"ping\"}]", CE_EPARSE, "not a JSON object");
  refused("{\"type\":\"ping\"} {\"type\":\"ping\"}", CE_EPARSE, "not valid JSON");
  refused("{\"type\":\"ping\"", CE_EPARSE, "not valid JSON");
  refused("{}", CE_EPARSE, "missing \"type\"");
  refused("{\"type\":1}", CE_EPARSE, "\"type\" must be a string");
  refused("{\"type\":null}", CE_EPARSE, "\"type\" must be a string");
  refused("{\"type\":\"PING\"}", CE_EPARSE, "unknown type");
  refused("{\"type\":\"pong\"}", CE_EPARSE, "unknown type");
  refused("{\"type\":\"event\"}", CE_EPARSE, "unknown type");
  refused("{\"type\":\"ping\",\"type\":\"ping\"}", CE_EPARSE, "duplicate");
  refused("{\"type\":\"hello\",\"version\":2,\"session_id\":\"a\",\"session_id\":\"b\"}",
          CE_EPARSE, "duplicate");
  refused("{\"type\":\"ping\xff\"}", CE_EPARSE, "not valid JSON");
}

Test(frame, embedded_nul_byte_refused) {
  static const char text[] = "{\"type\":\"ping\"}\0";
  ce_frame_t f;
  const char *why = NULL;
  cr_assert_eq(ce_control_frame_parse(text, sizeof(text) - 1, &f, &why), CE_EPARSE);
}

Test(frame, depth_bound) {
  /* 15 arrays inside the object (depth 16) pass; 16 (depth 17) do not. */
  char text[200];
  snprintf(text, sizeof(text), "{\"type\":\"ping\",\"x\":%.15s%.15s}",
           "[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]");
  parse_ok(text);
  snprintf(text, sizeof(text), "{\"type\":\"ping\",\"x\":%.16s%.16s}",
           "[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]");
  refused(text, CE_EPARSE, "deeper than 16");
  /* Nesting is judged before the root's type (the port's check agrees). */
  snprintf(text, sizeof(text), "%.17s%.17s", "[[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]]");
  refused(text, CE_EPARSE, "deeper than 16");
  /* Brackets inside strings do not count. */
  parse_ok("{\"type\":\"ping\",\"x\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"[[[[\"}");
}

Test(frame, size_bound) {
  size_t n = CE_CONTROL_MAX_FRAME + 1;
  char *text = malloc(n);
  cr_assert_not_null(text);
  memset(text, ' ', n);
  memcpy(text, "{\"type\":\"ping\"}", 15);
  ce_frame_t f;
  const char *why = NULL;
  cr_assert_eq(ce_control_frame_parse(text, n, &f, &why), CE_ETOOBIG);
  cr_assert_not_null(why);
  cr_assert_eq(ce_control_frame_parse(text, n - 1, &f, &why), CE_OK, "1 MiB exactly is fine");
  free(text);
}

Test(frame, why_may_be_null) {
  ce_frame_t f;
  cr_assert_eq(ce_control_frame_parse("{}", 2, &f, NULL), CE_EPARSE);
  cr_assert_eq(ce_control_frame_parse("{\"type\":\"ping\"}", 15, &f, NULL), CE_OK);
}

Test(frame, line_encoding) {
  json_t *obj = json_pack("{s:s, s:s}", "type", "event", "text", "a\nb\r\"c\"\x01");
  ce__line_t *line = NULL;
  cr_assert_eq(ce__line_encode(obj, &line), CE_OK);
  json_decref(obj);
  const char *want = "{\"type\":\"event\",\"text\":\"a\\nb\\r\\\"c\\\"\\u0001\"}\n";
  cr_assert_eq(line->len, strlen(want));
  cr_assert_eq(memcmp(line->data, want, line->len), 0, "%.*s", (int)line->len, line->data);
  cr_assert_null(memchr(line->data, '\n', line->len - 1), "only the last byte is a newline");
  cr_assert_eq(ce__line_ref(line), line);
  ce__line_unref(line);
  ce__line_unref(line);
  ce__line_unref(NULL);
}

Test(frame, line_too_big) {
  size_t n = CE_CONTROL_MAX_FRAME;
  char *big = malloc(n);
  cr_assert_not_null(big);
  memset(big, 'x', n - 1);
  big[n - 1] = '\0';
  json_t *obj = json_pack("{s:s}", "x", big);
  free(big);
  ce__line_t *line = NULL;
  cr_assert_eq(ce__line_encode(obj, &line), CE_ETOOBIG);
  cr_assert_null(line);
  json_decref(obj);
}

Test(frame, frame_encoding_orders_and_replaces) {
  json_t *fields = json_pack("{s:s, s:i, s:s, s:i}", "event", "request_opened", "seq", 99,
                             "type", "bogus", "port", 443);
  ce__line_t *line = NULL;
  cr_assert_eq(ce__line_encode_frame("event", "seq", 7, false, fields, &line), CE_OK);
  const char *want = "{\"type\":\"event\",\"seq\":7,\"event\":\"request_opened\",\"port\":443}\n";
  cr_assert_eq(line->len, strlen(want));
  cr_assert_eq(memcmp(line->data, want, line->len), 0, "%.*s", (int)line->len, line->data);
  ce__line_unref(line);

  cr_assert_eq(ce__line_encode_frame("decision_request", "id", UINT64_MAX, true, fields, &line),
               CE_OK);
  want = "{\"type\":\"decision_request\",\"id\":\"18446744073709551615\",\"event\":"
         "\"request_opened\",\"seq\":99,\"port\":443}\n";
  cr_assert_eq(line->len, strlen(want));
  cr_assert_eq(memcmp(line->data, want, line->len), 0, "%.*s", (int)line->len, line->data);
  ce__line_unref(line);
  json_decref(fields);

  /* Only "type" and "seq" present: nothing after the envelope. */
  fields = json_pack("{s:s}", "type", "x");
  cr_assert_eq(ce__line_encode_frame("event", "seq", 0, false, fields, &line), CE_OK);
  want = "{\"type\":\"event\",\"seq\":0}\n";
  cr_assert_eq(memcmp(line->data, want, strlen(want)), 0, "%.*s", (int)line->len, line->data);
  ce__line_unref(line);
  json_decref(fields);

  line = (ce__line_t *)0x1;
  cr_assert_eq(ce__line_encode_frame("event", "seq", 1, false, NULL, &line), CE_EINVAL);
  json_t *arr = json_array();
  cr_assert_eq(ce__line_encode_frame("event", "seq", 1, false, arr, &line), CE_EINVAL);
  cr_assert_eq(line, (ce__line_t *)0x1);
  json_decref(arr);
}

/* The line is the same text jansson writes for the same object. */
Test(frame, frame_encoding_matches_jansson) {
  json_t *fields = json_pack(
      "{s:s s:i s:I s:f s:b s:b s:n s:[s s {s:[]}] s:{} s:s}", "s", "\"q\" \\ \t\x1f\x7f caf\xc3\xa9 \xf0\x9f\x98\x80",
      "i", -5, "big", (json_int_t)INT64_MIN, "r", 1.5, "t", 1, "f", 0, "n", "a", "x", "\n",
      "o", "empty", "k\x01", "v");
  cr_assert_not_null(fields);
  ce__line_t *line = NULL;
  cr_assert_eq(ce__line_encode_frame("event", "seq", 3, false, fields, &line), CE_OK);
  json_t *env = json_pack("{s:s s:i}", "type", "event", "seq", 3);
  json_object_update(env, fields);
  char *want = json_dumps(env, JSON_COMPACT);
  cr_assert_not_null(want);
  cr_assert_eq(line->len, strlen(want) + 1);
  cr_assert_eq(memcmp(line->data, want, line->len - 1), 0, "%.*s\n%s", (int)line->len, line->data,
               want);
  free(want);
  json_decref(env);
  ce__line_unref(line);
  json_decref(fields);
}

Test(frame, line_nested_too_deep) {
  json_t *root = json_array();
  json_t *cur = root;
  for (int i = 0; i < CE_JSONW_MAX_DEPTH + 1; i++) {
    json_t *next = json_array();
    json_array_append_new(cur, next);
    cur = next;
  }
  ce__line_t *line = (ce__line_t *)0x1;
  cr_assert_eq(ce__line_encode(root, &line), CE_EINVAL);
  cr_assert_eq(line, (ce__line_t *)0x1);
  json_decref(root);
}

/* ---- frames written as text (ce__line_encode_frame_with) ------------------ */

static void write_members(ce_jsonw_t *w, const void *arg) {
  ce_jsonw_raw(w, ",\"event\":", 9);
  ce_jsonw_string(w, arg, strlen(arg));
  ce_jsonw_raw(w, ",\"port\":443", 11);
}

static void write_nothing(ce_jsonw_t *w, const void *arg) {}

static void write_failure(ce_jsonw_t *w, const void *arg) {
  ce_jsonw_raw(w, ",\"a\":1", 6);
  ce_jsonw_fail(w, *(const int *)arg);
}

static void write_too_much(ce_jsonw_t *w, const void *arg) {
  char chunk[4096];
  memset(chunk, 'x', sizeof(chunk));
  ce_jsonw_raw(w, ",\"pad\":\"", 8);
  for (size_t i = 0; i <= CE_CONTROL_MAX_FRAME / sizeof(chunk); i++)
    ce_jsonw_raw(w, chunk, sizeof(chunk));
  ce_jsonw_raw(w, "\"", 1);
}

Test(frame, frame_written_as_text) {
  ce__line_t *line = NULL;
  cr_assert_eq(ce__line_encode_frame_with("event", "seq", 7, false, write_members,
                                          "request_\"opened\"", &line),
               CE_OK);
  const char *want =
      "{\"type\":\"event\",\"seq\":7,\"event\":\"request_\\\"opened\\\"\",\"port\":443}\n";
  cr_assert_eq(line->len, strlen(want));
  cr_assert_eq(memcmp(line->data, want, line->len), 0, "%.*s", (int)line->len, line->data);
  ce__line_unref(line);

  cr_assert_eq(ce__line_encode_frame_with("decision_request", "id", UINT64_MAX, true,
                                          write_nothing, NULL, &line),
               CE_OK);
  want = "{\"type\":\"decision_request\",\"id\":\"18446744073709551615\"}\n";
  cr_assert_eq(line->len, strlen(want));
  cr_assert_eq(memcmp(line->data, want, line->len), 0, "%.*s", (int)line->len, line->data);
  ce__line_unref(line);

  /* Text that is not UTF-8 is refused as jansson refuses it. */
  line = (ce__line_t *)0x1;
  cr_assert_eq(ce__line_encode_frame_with("event", "seq", 1, false, write_members, "caf\xe9",
                                          &line),
               CE_EINVAL);
  cr_assert_eq(line, (ce__line_t *)0x1, "*out written on failure");
}

Test(frame, frame_written_as_text_fails_closed) {
  ce__line_t *line = (ce__line_t *)0x1;
  int err = CE_EINVAL;
  cr_assert_eq(ce__line_encode_frame_with("event", "seq", 1, false, write_failure, &err, &line),
               CE_EINVAL);
  err = CE_ETOOBIG;
  cr_assert_eq(ce__line_encode_frame_with("event", "seq", 1, false, write_failure, &err, &line),
               CE_ETOOBIG);
  cr_assert_eq(ce__line_encode_frame_with("event", "seq", 1, false, write_too_much, NULL, &line),
               CE_ETOOBIG);
  cr_assert_eq(line, (ce__line_t *)0x1, "*out written on failure");
}

Test(frame, credential_accepted_and_refused) {
  ce_frame_t f = parse_ok("{\"type\":\"credential\",\"name\":\"github-token\",\"value\":\"Bearer x y\",\"extra\":1}");
  cr_assert_eq(f.type, CE_FRAME_CREDENTIAL);
  cr_assert_str_eq(f.secret_name, "github-token");
  cr_assert_str_eq(f.secret_value, "Bearer x y");
  cr_assert_eq(f.secret_value_len, 10);

  refused("{\"type\":\"credential\",\"value\":\"v\"}", CE_EPARSE, "\"name\" must be a string");
  refused("{\"type\":\"credential\",\"name\":1,\"value\":\"v\"}", CE_EPARSE, "\"name\" must be a string");
  refused("{\"type\":\"credential\",\"name\":\"n\"}", CE_EPARSE, "\"value\" must be a string");
  refused("{\"type\":\"credential\",\"name\":\"n\",\"value\":null}", CE_EPARSE, "\"value\" must be a string");
  refused("{\"type\":\"credential\",\"name\":\"\",\"value\":\"v\"}", CE_EPARSE, "1 to 128 bytes");
  refused("{\"type\":\"credential\",\"name\":\"n\",\"value\":\"\"}", CE_EPARSE, "1 to 8192 bytes");

  /* The longest of each is taken; one byte more is not. */
  size_t cap = 64 + CE_CONTROL_SECRET_NAME_MAX + CE_CONTROL_SECRET_VALUE_MAX + 2;
  char *doc = malloc(cap);
  char name[CE_CONTROL_SECRET_NAME_MAX + 2], value[CE_CONTROL_SECRET_VALUE_MAX + 2];
  memset(name, 'n', sizeof(name));
  memset(value, 'v', sizeof(value));
  snprintf(doc, cap, "{\"type\":\"credential\",\"name\":\"%.*s\",\"value\":\"%.*s\"}", CE_CONTROL_SECRET_NAME_MAX, name,
           CE_CONTROL_SECRET_VALUE_MAX, value);
  f = parse_ok(doc);
  cr_assert_eq(f.secret_value_len, CE_CONTROL_SECRET_VALUE_MAX);
  cr_assert_eq(strlen(f.secret_name), CE_CONTROL_SECRET_NAME_MAX);
  snprintf(doc, cap, "{\"type\":\"credential\",\"name\":\"%.*s\",\"value\":\"v\"}", CE_CONTROL_SECRET_NAME_MAX + 1,
           name);
  refused(doc, CE_EPARSE, "1 to 128 bytes");
  snprintf(doc, cap, "{\"type\":\"credential\",\"name\":\"n\",\"value\":\"%.*s\"}", CE_CONTROL_SECRET_VALUE_MAX + 1,
           value);
  refused(doc, CE_EPARSE, "1 to 8192 bytes");
  free(doc);
}
