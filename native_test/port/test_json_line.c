/* Tests for c_src/port/json_line.c: a control-channel line to a term in
 * one pass. The term must be byte for byte the one jansson's parse and
 * ce_json_to_term() give (the path it replaces), every refusal must say
 * where and why, the text is never read past its end, and a failed
 * allocation is reported. */
#include <criterion/criterion.h>
#include <ei.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "control/control.h"
#include "port/etf.h"
#include "port/json_line.h"
#include "port/json_term.h"
#include "support/failalloc.h"
#include "support/term.h"

static void setup(void) { ei_init(); }

TestSuite(port_json_line, .init = setup);

/* The text in a heap buffer of exactly its length (no NUL after it), so
 * that ASan sees a read past the end. */
static int convert(const char *text, size_t n, ei_x_buff *x, char *err, size_t errlen) {
  char *copy = malloc(n > 0 ? n : 1);
  cr_assert_not_null(copy);
  memcpy(copy, text, n);
  cr_assert_eq(ei_x_new_with_version(x), 0);
  int rc = ce_json_line_to_term(copy, n, x, err, errlen);
  free(copy);
  return rc;
}

/* The term the old path gives: jansson's parse, then the mapping. */
static void reference(const char *text, ei_x_buff *x) {
  json_error_t jerr;
  json_t *v = json_loadb(text, strlen(text), JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(v, "%s: %s", text, jerr.text);
  cr_assert_eq(ei_x_new_with_version(x), 0);
  char err[256];
  cr_assert_eq(ce_json_to_term(v, x, err, sizeof(err)), CE_OK, "%s", err);
  json_decref(v);
}

static void assert_same_as_jansson(const char *text) {
  ei_x_buff got, want;
  char err[256];
  cr_assert_eq(convert(text, strlen(text), &got, err, sizeof(err)), CE_OK, "%s: %s", text,
               err);
  reference(text, &want);
  cr_assert_eq(ce_etf_check(got.buff, (size_t)got.index, err, sizeof(err)), CE_OK, "%s", err);
  char *g = ce_test_term_str(got.buff, (size_t)got.index);
  char *w = ce_test_term_str(want.buff, (size_t)want.index);
  cr_assert_str_eq(g, w, "%s", text);
  cr_assert_eq(got.index, want.index, "%s", text);
  cr_assert_eq(memcmp(got.buff, want.buff, (size_t)got.index), 0, "%s: other bytes", text);
  free(g);
  free(w);
  ei_x_free(&got);
  ei_x_free(&want);
}

static void assert_term(const char *text, const char *term) {
  ei_x_buff x;
  char err[256];
  cr_assert_eq(convert(text, strlen(text), &x, err, sizeof(err)), CE_OK, "%s: %s", text, err);
  char *s = ce_test_term_str(x.buff, (size_t)x.index);
  cr_assert_str_eq(s, term, "%s", text);
  free(s);
  ei_x_free(&x);
}

static void assert_refused_n(const char *text, size_t n, int code, const char *message) {
  ei_x_buff x;
  char err[256];
  int rc = convert(text, n, &x, err, sizeof(err));
  ei_x_free(&x);
  cr_assert_eq(rc, code, "%.*s: %d (%s)", (int)n, text, rc, err);
  cr_assert_str_eq(err, message, "%.*s: %s", (int)n, text, err);
}

static void assert_refused(const char *text, const char *message) {
  assert_refused_n(text, strlen(text), CE_EPARSE, message);
}

Test(port_json_line, the_mapping) {
  assert_term("{\"type\":\"event\",\"seq\":41,\"ok\":true,\"no\":false,\"q\":null,\"r\":1.5,"
              "\"neg\":-9223372036854775808,\"h\":[[\"a\",\"b\"]],\"e\":[],\"o\":{}}",
              "#{<<\"type\">> => <<\"event\">>,<<\"seq\">> => 41,<<\"ok\">> => true,"
              "<<\"no\">> => false,<<\"q\">> => nil,<<\"r\">> => 1.5,"
              "<<\"neg\">> => -9223372036854775808,<<\"h\">> => [[<<\"a\">>,<<\"b\">>]],"
              "<<\"e\">> => [],<<\"o\">> => #{}}");
  assert_term(" \t\r\n{ } \n", "#{}");
}

Test(port_json_line, the_same_bytes_as_jansson_and_the_mapping) {
  static const char *texts[] = {
      "{}",
      "{\"type\":\"decision_request\",\"id\":\"17\",\"request\":{\"method\":\"GET\","
      "\"host\":\"example.com\",\"port\":443,\"path\":\"/a?b=c\",\"headers\":[[\"user-agent\","
      "\"curl/8\"],[\"accept\",\"*/*\"]]},\"rule\":\"r1\",\"seq\":12}",
      "{\"n\":[0,-0,1,-1,255,256,-128,2147483647,2147483648,-2147483648,-2147483649,"
      "9223372036854775807,-9223372036854775808]}",
      "{\"r\":[0.0,-0.0,1e3,1E-3,2.5e+10,-1.25,1e-400,123456789012345678901234567890.5,"
      "0.1,1.7976931348623157e308]}",
      "{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"u\":\"\\u00e9\\u20AC\\ud83d\\ude00\",\"raw\":\"é€😀\"}",
      "{\"a\":{\"b\":{\"c\":[[],[{}],[1,[2,[3]]]]}},\"\\u0061b\":\"ab\"}",
      "{\"\":\"\",\"k\":\"with \\\"quotes\\\" in\"}",
  };
  for (size_t k = 0; k < sizeof(texts) / sizeof(texts[0]); k++)
    assert_same_as_jansson(texts[k]);
}

Test(port_json_line, many_members_in_order) {
  char text[4096];
  size_t len = 0;
  text[len++] = '{';
  for (int k = 0; k < 100; k++)
    len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\"m%d\":%d", k ? "," : "",
                            (k * 37) % 100, k);
  text[len++] = '}';
  text[len] = '\0';
  assert_same_as_jansson(text);
}

Test(port_json_line, not_an_object) {
  assert_refused("", "byte 0: not a JSON object");
  assert_refused("  ", "byte 2: not a JSON object");
  assert_refused("[1]", "byte 0: not a JSON object");
  assert_refused("\"s\"", "byte 0: not a JSON object");
  assert_refused("1", "byte 0: not a JSON object");
  assert_refused("{} {}", "byte 3: text after the object");
  assert_refused("{}x", "byte 2: text after the object");
}

Test(port_json_line, malformed_structure) {
  assert_refused("{", "byte 1: a member name (a string) expected");
  assert_refused("{\"a\"}", "byte 4: ':' expected after a member name");
  assert_refused("{\"a\":}", "byte 5: not a JSON value");
  assert_refused("{\"a\":1,}", "byte 7: a member name (a string) expected");
  assert_refused("{\"a\":1 \"b\":2}", "byte 7: ',' or '}' expected in an object");
  assert_refused("{a:1}", "byte 1: a member name (a string) expected");
  assert_refused("{1:1}", "byte 1: a member name (a string) expected");
  assert_refused("{\"a\":[1,]}", "byte 8: not a JSON value");
  assert_refused("{\"a\":[1 2]}", "byte 8: ',' or ']' expected in an array");
  assert_refused("{\"a\":[", "byte 6: the text ends where a value was expected");
  assert_refused("{\"a\":tru}", "byte 5: not a JSON value");
  assert_refused("{\"a\":nul", "byte 5: not a JSON value");
  assert_refused("{\"a\":True}", "byte 5: not a JSON value");
  assert_refused("{\"a\":NaN}", "byte 5: not a JSON value");
  assert_refused("{\"a\":'x'}", "byte 5: not a JSON value");
  assert_refused("{\"a\":\f1}", "byte 5: not a JSON value");
}

Test(port_json_line, malformed_numbers) {
  assert_refused("{\"a\":01}", "byte 6: ',' or '}' expected in an object");
  assert_refused("{\"a\":-}", "byte 6: a number needs a digit here");
  assert_refused("{\"a\":+1}", "byte 5: not a JSON value");
  assert_refused("{\"a\":.5}", "byte 5: not a JSON value");
  assert_refused("{\"a\":1.}", "byte 7: a number needs a digit after its '.'");
  assert_refused("{\"a\":1e}", "byte 7: a number needs a digit in its exponent");
  assert_refused("{\"a\":1e+}", "byte 8: a number needs a digit in its exponent");
  assert_refused("{\"a\":9223372036854775808}", "byte 5: an integer outside -2^63..2^63-1");
  assert_refused("{\"a\":-9223372036854775809}", "byte 5: an integer outside -2^63..2^63-1");
  assert_refused("{\"a\":99999999999999999999999}",
                 "byte 5: an integer outside -2^63..2^63-1");
  assert_refused("{\"a\":1e400}", "byte 5: a number outside the range of a double");
  assert_refused("{\"a\":-1e400}", "byte 5: a number outside the range of a double");
}

/* A real longer than the inline copy goes to the heap, and is the same. */
Test(port_json_line, a_long_real) {
  char text[512] = "{\"a\":1.";
  size_t len = strlen(text);
  for (int k = 0; k < 300; k++)
    text[len++] = (char)('0' + k % 10);
  text[len++] = '}';
  text[len] = '\0';
  assert_same_as_jansson(text);
}

Test(port_json_line, malformed_strings) {
  assert_refused("{\"a\":\"x}", "byte 5: a string without its closing quote");
  assert_refused("{\"a\":\"x\\", "byte 7: the text ends inside a string");
  assert_refused("{\"a\":\"\\x\"}", "byte 6: an unknown escape in a string");
  assert_refused("{\"a\":\"\\'\"}", "byte 6: an unknown escape in a string");
  assert_refused("{\"a\":\"\\u12\"}", "byte 8: a \\u escape needs four hex digits");
  assert_refused("{\"a\":\"\\u12g4\"}", "byte 8: a \\u escape needs four hex digits");
  assert_refused("{\"a\":\"\\u0000\"}", "byte 6: \\u0000 in a string (NUL bytes are refused)");
  assert_refused("{\"a\":\"\\udc00\"}",
                 "byte 6: a low surrogate escape without a high one before it");
  assert_refused("{\"a\":\"\\ud800\"}",
                 "byte 6: a high surrogate escape not followed by a low one");
  assert_refused("{\"a\":\"\\ud800\\u0041\"}",
                 "byte 6: a high surrogate escape not followed by a low one");
  assert_refused("{\"a\":\"\\ud800x\"}",
                 "byte 6: a high surrogate escape not followed by a low one");
  assert_refused("{\"a\":\"tab\there\"}", "byte 9: a control character in a string (escape it)");
  assert_refused("{\"a\":\"\\n\there\"}",
                 "byte 8: a control character in a string (escape it)");
  /* Raw bytes: a lone continuation byte, an overlong '/', a surrogate
   * encoded in UTF-8, a code point past U+10FFFF, a cut sequence. */
  assert_refused("{\"a\":\"\x80\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"a\":\"\xc0\xaf\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"a\":\"\xed\xa0\x80\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"a\":\"\xf4\x90\x80\x80\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"a\":\"\xe2\x82\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"a\":\"\xe2\\u0041\"}", "byte 5: a string that is not valid UTF-8");
  assert_refused("{\"\xff\":1}", "byte 1: a string that is not valid UTF-8");
  /* A NUL byte in the text itself. */
  assert_refused_n("{\"a\":\"x\0\"}", 10, CE_EPARSE,
                   "byte 7: a control character in a string (escape it)");
  assert_refused_n("{\"a\":1\0}", 8, CE_EPARSE, "byte 6: ',' or '}' expected in an object");
}

Test(port_json_line, duplicate_members) {
  assert_refused("{\"a\":1,\"a\":2}", "byte 0: the member \"a\" appears twice in an object");
  /* Spelled differently, the same name. */
  assert_refused("{\"type\":1,\"t\\u0079pe\":2}",
                 "byte 0: the member \"type\" appears twice in an object");
  /* Past the pairwise bound (sorted), and in a nested object. */
  assert_refused("{\"x\":{\"a\":1,\"b\":1,\"c\":1,\"d\":1,\"e\":1,\"f\":1,\"g\":1,\"h\":1,"
                 "\"i\":1,\"e\":1}}",
                 "byte 5: the member \"e\" appears twice in an object");
  /* The same name in two objects, or in an object and its parent, is fine. */
  assert_same_as_jansson("{\"a\":{\"a\":{\"a\":1}},\"b\":{\"a\":2}}");
  /* A prefix is another name. */
  assert_same_as_jansson("{\"a\":1,\"ab\":2,\"b\":3,\"ba\":4,\"c\":5,\"d\":6,\"e\":7,\"f\":8,"
                         "\"g\":9,\"h\":10,\"i\":11}");
}

static char *nested(int depth) {
  /* {"a": followed by depth-1 arrays around a 1 */
  size_t cap = 16 + 2 * (size_t)depth;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  size_t len = (size_t)snprintf(s, cap, "{\"a\":");
  for (int k = 1; k < depth; k++)
    s[len++] = '[';
  s[len++] = '1';
  for (int k = 1; k < depth; k++)
    s[len++] = ']';
  s[len++] = '}';
  s[len] = '\0';
  return s;
}

/* The root is at depth 0: a scalar at depth 32 is the deepest value. */
Test(port_json_line, nesting_is_bounded) {
  char *ok = nested(32);
  assert_same_as_jansson(ok);
  free(ok);
  char *deep = nested(33);
  ei_x_buff x;
  char err[256];
  int rc = convert(deep, strlen(deep), &x, err, sizeof(err));
  ei_x_free(&x);
  cr_assert_eq(rc, CE_EINVAL);
  cr_assert_str_eq(err, "byte 37: nested deeper than 32");
  free(deep);
  /* Far deeper text stops at the bound, without recursing further. */
  char *very = nested(100000);
  rc = convert(very, strlen(very), &x, err, sizeof(err));
  ei_x_free(&x);
  cr_assert_eq(rc, CE_EINVAL);
  free(very);
}

Test(port_json_line, over_the_line_limit) {
  size_t n = CE_CONTROL_MAX_FRAME + 1;
  char *big = malloc(n);
  cr_assert_not_null(big);
  memset(big, ' ', n);
  big[0] = '{';
  big[n - 1] = '}';
  ei_x_buff x;
  char err[256];
  cr_assert_eq(ei_x_new_with_version(&x), 0);
  cr_assert_eq(ce_json_line_to_term(big, n, &x, err, sizeof(err)), CE_ETOOBIG);
  cr_assert_str_eq(err, "byte 0: a line longer than 1048576 bytes");
  ei_x_free(&x);
  /* At the limit it is a line like any other. */
  cr_assert_eq(ei_x_new_with_version(&x), 0);
  cr_assert_eq(ce_json_line_to_term(big + 1, n - 1, &x, err, sizeof(err)), CE_EPARSE);
  ei_x_free(&x);
  free(big);
}

/* Every cut of a valid line is refused, and none is read past its end
 * (each goes in a buffer of exactly its length). */
Test(port_json_line, every_prefix_is_refused) {
  const char *text = "{\"type\":\"decision_request\",\"id\":\"1\",\"h\":[[\"a\",\"\\u00e9\\ud83d"
                     "\\ude00\"]],\"n\":-12.5e3,\"t\":true,\"f\":false,\"z\":null}";
  size_t n = strlen(text);
  for (size_t k = 0; k < n; k++) {
    ei_x_buff x;
    char err[256];
    int rc = convert(text, k, &x, err, sizeof(err));
    ei_x_free(&x);
    cr_assert_eq(rc, CE_EPARSE, "prefix of %zu bytes: %d", k, rc);
    cr_assert_neq(err[0], '\0');
  }
  assert_same_as_jansson(text);
}

/* Each allocation the conversion makes (the term's growth, a name list
 * past its inline room, a decoded string, a long real) may fail: that is
 * CE_ENOMEM, nothing leaks (LSan), and once none fails the term is right. */
Test(port_json_line, allocation_failures) {
  char text[8192];
  size_t len = (size_t)snprintf(text, sizeof(text), "{\"s\":\"\\u00e9\",\"r\":1.");
  for (int k = 0; k < 100; k++)
    text[len++] = '5';
  text[len++] = ',';
  for (int k = 0; k < 40; k++)
    len += (size_t)snprintf(text + len, sizeof(text) - len, "\"k%d\":\"%040d\",", k, k);
  len += (size_t)snprintf(text + len, sizeof(text) - len, "\"end\":[1,2,3]}");
  ei_x_buff want;
  reference(text, &want);
  for (size_t n = 0;; n++) {
    ei_x_buff x;
    cr_assert_eq(ei_x_new_with_version(&x), 0);
    char err[256];
    ce_failalloc_arm(n);
    int rc = ce_json_line_to_term(text, len, &x, err, sizeof(err));
    bool failed = ce_failalloc_failures() > 0;
    ce_failalloc_disarm();
    if (failed) {
      cr_assert_eq(rc, CE_ENOMEM, "allocation %zu failed but the code is %d", n, rc);
      cr_assert_str_eq(err, "out of memory");
      ei_x_free(&x);
      continue;
    }
    cr_assert_eq(rc, CE_OK, "%s", err);
    cr_assert_eq(x.index, want.index);
    cr_assert_eq(memcmp(x.buff, want.buff, (size_t)x.index), 0);
    ei_x_free(&x);
    cr_assert_gt(n, 2, "the test made too few allocations to mean anything");
    break;
  }
  ei_x_free(&want);
}
