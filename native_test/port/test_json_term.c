/* Tests for c_src/port/json_term.c: the JSON <-> term mapping of
 * docs/port-protocol.md, round trips, and every refusal with the path it
 * names. */
#include <criterion/criterion.h>
#include <ei.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "port/etf.h"
#include "port/json_term.h"
#include "support/term.h"

static void setup(void) { ei_init(); }

TestSuite(port_json_term, .init = setup);

/* JSON text -> term text (what the BEAM receives). */
static char *json_to_term_text(const char *json) {
  json_error_t jerr;
  json_t *v = json_loads(json, JSON_DECODE_ANY, &jerr);
  cr_assert_not_null(v, "%s: %s", json, jerr.text);
  ei_x_buff x;
  ei_x_new_with_version(&x);
  char err[256];
  cr_assert_eq(ce_json_to_term(v, &x, err, sizeof(err)), CE_OK, "%s", err);
  json_decref(v);
  char *s = ce_test_term_str(x.buff, (size_t)x.index);
  ei_x_free(&x);
  return s;
}

/* Term bytes (checked) -> JSON, returning the code; *json gets compact text. */
static int term_bytes_to_json(const char *buf, size_t len, char **json, char *err) {
  cr_assert_eq(ce_etf_check(buf, len, err, 256), CE_OK, "%s", err);
  int i = 1;
  json_t *v = NULL;
  int rc = ce_term_to_json(buf, &i, "frame", &v, err, 256);
  if (rc == CE_OK) {
    cr_assert_eq((size_t)i, len, "the index is not past the term");
    *json = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(v);
  } else {
    cr_assert_eq(i, 1, "the index moved on failure");
  }
  return rc;
}

static int term_to_json_text(const char *term, char **json, char *err) {
  ei_x_buff x;
  ce_test_term(&x, term);
  int rc = term_bytes_to_json(x.buff, (size_t)x.index, json, err);
  ei_x_free(&x);
  return rc;
}

static void assert_refused(const char *term, const char *message) {
  char *json = NULL, err[256];
  cr_assert_eq(term_to_json_text(term, &json, err), CE_EINVAL, "%s was accepted", term);
  cr_assert_str_eq(err, message, "%s", term);
}

static void assert_json(const char *term, const char *expected) {
  char *json = NULL, err[256];
  cr_assert_eq(term_to_json_text(term, &json, err), CE_OK, "%s: %s", term, err);
  cr_assert_str_eq(json, expected, "%s", term);
  free(json);
}

Test(port_json_term, json_to_term_mapping) {
  char *s = json_to_term_text(
      "{\"type\":\"event\",\"seq\":41,\"ok\":true,\"no\":false,\"query\":null,"
      "\"r\":1.5,\"neg\":-9223372036854775808,\"headers\":[[\"a\",\"b\"]],\"e\":[],\"o\":{}}");
  cr_assert_str_eq(s, "#{<<\"type\">> => <<\"event\">>,<<\"seq\">> => 41,<<\"ok\">> => true,"
                      "<<\"no\">> => false,<<\"query\">> => nil,<<\"r\">> => 1.5,"
                      "<<\"neg\">> => -9223372036854775808,"
                      "<<\"headers\">> => [[<<\"a\">>,<<\"b\">>]],<<\"e\">> => [],"
                      "<<\"o\">> => #{}}");
  free(s);
  s = json_to_term_text("\"\\u00e9t\\u00e9\"");
  cr_assert_str_eq(s, "<<\"\xc3\xa9t\xc3\xa9\">>");
  free(s);
}

Test(port_json_term, term_to_json_mapping) {
  assert_json("#{<<\"type\">> => <<\"decision\">>, id => <<\"17\">>, cache => true, "
              "reason => nil, x => null, f => false}",
              "{\"type\":\"decision\",\"id\":\"17\",\"cache\":true,\"reason\":null,\"x\":null,"
              "\"f\":false}");
  assert_json("[1, -1, 9223372036854775807, -9223372036854775808, 2.5, allow, <<>>]",
              "[1,-1,9223372036854775807,-9223372036854775808,2.5,\"allow\",\"\"]");
  assert_json("\"abc\"", "[97,98,99]"); /* a charlist is a list of integers */
  assert_json("[]", "[]");
  assert_json("#{}", "{}");
  assert_json("'caf\xc3\xa9'", "\"caf\xc3\xa9\"");
}

Test(port_json_term, round_trips) {
  const char *docs[] = {
      "{\"type\":\"welcome\",\"version\":1,\"session_id\":\"ws-7f3a\",\"dropped\":0}",
      "{\"a\":[1,2.5,\"x\",true,false,null,{\"b\":[]}],\"c\":{}}",
      "[[[[[]]]]]",
      "{\"unicode\":\"\xe2\x9c\x93 \\\"quoted\\\" \\\\ \\n\"}",
  };
  for (size_t k = 0; k < sizeof(docs) / sizeof(docs[0]); k++) {
    json_t *v = json_loads(docs[k], 0, NULL);
    cr_assert_not_null(v, "%s", docs[k]);
    ei_x_buff x;
    ei_x_new_with_version(&x);
    cr_assert_eq(ce_json_to_term(v, &x, NULL, 0), CE_OK);
    char *back = NULL, err[256];
    cr_assert_eq(term_bytes_to_json(x.buff, (size_t)x.index, &back, err), CE_OK, "%s", err);
    json_t *w = json_loads(back, 0, NULL);
    cr_assert(json_equal(v, w), "%s came back as %s", docs[k], back);
    json_decref(v);
    json_decref(w);
    free(back);
    ei_x_free(&x);
  }
}

Test(port_json_term, refusals_name_the_path) {
  assert_refused("#{<<\"request\">> => #{<<\"headers\">> => [a, b, {c, d}]}}",
                 "frame.request.headers[2]: a tuple is not JSON");
  assert_refused("[1 , [2, [3 , {}]]]", "frame[1][1][1]: a tuple is not JSON");
  assert_refused("#{1 => 2}", "frame: a map key must be a binary or an atom, not this term");
  assert_refused("#{{a} => 2}", "frame: a map key must be a binary or an atom, not a tuple");
  assert_refused("#{<<\"a\">> => 1, a => 2}",
                 "frame.a: the key appears twice (as a binary and as an atom)");
  assert_refused("<<255>>", "frame: a binary is not valid UTF-8");
  assert_refused("<<\"a\\x00b\">>", "frame: a binary contains a NUL byte");
  assert_refused("#{<<\"k\\x00\">> => 1}", "frame: a map key contains a NUL byte");
  assert_refused("#{<<255>> => 1}", "frame: a map key is not valid UTF-8");
  assert_refused("[9223372036854775808]",
                 "frame[0]: an integer outside -2^63..2^63-1 (JSON integers here are 64-bit)");
  assert_refused("#{<<\"weird \\\"key\\\"\\n\">> => {}}",
                 "frame.weird \"key\"\\x0a: a tuple is not JSON");
}

Test(port_json_term, refuses_other_types) {
  char *json = NULL, err[256];
  ei_x_buff x;
  erlang_pid pid = {"n@h", 1, 2, 3};
  erlang_ref ref;
  memset(&ref, 0, sizeof(ref));
  strcpy(ref.node, "n@h");
  ref.len = 1;
  erlang_port port;
  memset(&port, 0, sizeof(port));
  strcpy(port.node, "n@h");
  const char *expect[] = {"frame: a pid is not JSON", "frame: a reference is not JSON",
                          "frame: a port is not JSON", "frame: a bitstring is not JSON",
                          "frame: an improper list is not JSON",
                          "frame: a float that is not finite", "frame: a fun is not JSON"};
  for (int k = 0; k < 7; k++) {
    ei_x_new_with_version(&x);
    if (k == 0)
      ei_x_encode_pid(&x, &pid);
    else if (k == 1)
      ei_x_encode_ref(&x, &ref);
    else if (k == 2)
      ei_x_encode_port(&x, &port);
    else if (k == 3)
      ei_x_encode_bitstring(&x, "\xff", 0, 5);
    else if (k == 4) {
      ei_x_encode_list_header(&x, 1);
      ei_x_encode_atom(&x, "a");
      ei_x_encode_atom(&x, "tail");
    } else if (k == 5) {
      const unsigned char nan[] = {'F', 0x7f, 0xf8, 0, 0, 0, 0, 0, 0};
      ei_x_append_buf(&x, (const char *)nan, sizeof(nan));
    } else {
      const unsigned char fun[] = {'q', 'w', 1, 'm', 'w', 1, 'f', 'a', 0};
      ei_x_append_buf(&x, (const char *)fun, sizeof(fun));
    }
    cr_assert_eq(term_bytes_to_json(x.buff, (size_t)x.index, &json, err), CE_EINVAL, "%d", k);
    cr_assert_str_eq(err, expect[k]);
    ei_x_free(&x);
  }
}

Test(port_json_term, old_float_ext) {
  /* FLOAT_EXT, which no current BEAM writes, but which is valid ETF. */
  unsigned char buf[2 + 31] = {131, 'c'};
  memset(buf + 2, '7', 31); /* no NUL padding: must not be read past */
  char *json = NULL, err[256];
  cr_assert_eq(term_bytes_to_json((const char *)buf, sizeof(buf), &json, err), CE_OK, "%s", err);
  cr_assert(strncmp(json, "7.7777", 6) == 0, "%s", json);
  free(json);
  memset(buf + 2, 'x', 31);
  cr_assert_eq(term_bytes_to_json((const char *)buf, sizeof(buf), &json, err), CE_EINVAL);
  cr_assert_str_eq(err, "frame: a malformed float");
}

Test(port_json_term, depth_is_bounded_both_ways) {
  /* term -> JSON: 33 nested lists are one too many. */
  ei_x_buff x;
  ei_x_new_with_version(&x);
  for (int d = 0; d <= CE_JSON_TERM_MAX_DEPTH; d++)
    ei_x_encode_list_header(&x, 1);
  ei_x_encode_empty_list(&x);
  for (int d = 0; d <= CE_JSON_TERM_MAX_DEPTH; d++)
    ei_x_encode_empty_list(&x);
  char *json = NULL, err[256];
  cr_assert_eq(term_bytes_to_json(x.buff, (size_t)x.index, &json, err), CE_EINVAL);
  cr_assert(strstr(err, "nested deeper than 32") != NULL, "%s", err);
  ei_x_free(&x);

  /* JSON -> term. */
  json_t *v = json_array();
  for (int d = 0; d <= CE_JSON_TERM_MAX_DEPTH; d++) {
    json_t *outer = json_array();
    json_array_append_new(outer, v);
    v = outer;
  }
  ei_x_new_with_version(&x);
  cr_assert_eq(ce_json_to_term(v, &x, err, sizeof(err)), CE_EINVAL);
  cr_assert(strstr(err, "deeper than 32") != NULL, "%s", err);
  ei_x_free(&x);
  json_decref(v);
  ei_x_new_with_version(&x);
  cr_assert_eq(ce_json_to_term(NULL, &x, err, sizeof(err)), CE_EINVAL);
  ei_x_free(&x);
}

Test(port_json_term, long_paths_are_cut) {
  /* 60 nested single-key maps with 30-byte keys: the path is cut with "...". */
  ei_x_buff x;
  ei_x_new_with_version(&x);
  for (int d = 0; d < 20; d++) {
    ei_x_encode_map_header(&x, 1);
    ei_x_encode_binary(&x, "abcdefghijklmnopqrstuvwxyz0123", 30);
  }
  ei_x_encode_tuple_header(&x, 0);
  char *json = NULL, err[512];
  cr_assert_eq(term_bytes_to_json(x.buff, (size_t)x.index, &json, err), CE_EINVAL);
  cr_assert(strstr(err, "...: a tuple is not JSON") != NULL, "%s", err);
  cr_assert(strlen(err) < CE_JSON_TERM_PATH_MAX + 40, "%s", err);
  ei_x_free(&x);
}
