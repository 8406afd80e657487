/* Tests for c_src/port/etf.c: the bounded walk that guards every packet
 * before erl_interface reads it, and the small readers. */
#include <criterion/criterion.h>
#include <ei.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "port/etf.h"
#include "support/term.h"

static void setup(void) { ei_init(); }

TestSuite(port_etf, .init = setup);

static int check_text(const char *text) {
  ei_x_buff x;
  ce_test_term(&x, text);
  char err[256];
  int rc = ce_etf_check(x.buff, (size_t)x.index, err, sizeof(err));
  ei_x_free(&x);
  return rc;
}

static int check_bytes(const void *b, size_t n, char *err, size_t errlen) {
  return ce_etf_check(b, n, err, errlen);
}

Test(port_etf, accepts_every_ordinary_term) {
  cr_assert_eq(check_text("{call, 1, {version}}"), CE_OK);
  cr_assert_eq(check_text("#{<<\"a\">> => [1, -2, 3.5, \"str\", 'Quoted atom', <<1,2>>]}"), CE_OK);
  cr_assert_eq(check_text("[]"), CE_OK);
  cr_assert_eq(check_text("18446744073709551615"), CE_OK);
  cr_assert_eq(check_text("-9223372036854775808"), CE_OK);
}

Test(port_etf, accepts_pids_refs_ports_funs_bitstrings) {
  ei_x_buff x;
  ei_x_new_with_version(&x);
  ei_x_encode_list_header(&x, 4);
  erlang_pid pid = {"node@host", 1, 2, 3};
  ei_x_encode_pid(&x, &pid);
  erlang_ref ref;
  memset(&ref, 0, sizeof(ref));
  strcpy(ref.node, "node@host");
  ref.len = 3;
  ei_x_encode_ref(&x, &ref);
  erlang_port port;
  memset(&port, 0, sizeof(port));
  strcpy(port.node, "node@host");
  ei_x_encode_port(&x, &port);
  ei_x_encode_bitstring(&x, "\xff", 0, 3);
  ei_x_encode_empty_list(&x);
  char err[256];
  cr_assert_eq(ce_etf_check(x.buff, (size_t)x.index, err, sizeof(err)), CE_OK, "%s", err);
  ei_x_free(&x);
  /* EXPORT_EXT fun lists:map/2 and a NEW_FUN_EXT whose body is skipped by size. */
  const unsigned char export_fun[] = {131, 'q', 'w', 5, 'l', 'i', 's', 't', 's',
                                      'w', 3,  'm', 'a', 'p', 'a', 2};
  cr_assert_eq(check_bytes(export_fun, sizeof(export_fun), err, sizeof(err)), CE_OK, "%s", err);
  const unsigned char new_fun[] = {131, 'p', 0, 0, 0, 7, 1, 2, 3};
  cr_assert_eq(check_bytes(new_fun, sizeof(new_fun), err, sizeof(err)), CE_OK, "%s", err);
  /* FLOAT_EXT: 31 bytes of text after the tag; one byte short is refused. */
  unsigned char old_float[2 + 31] = {131, 'c', '1', '.', '5'};
  cr_assert_eq(check_bytes(old_float, sizeof(old_float), err, sizeof(err)), CE_OK, "%s", err);
  cr_assert_eq(check_bytes(old_float, sizeof(old_float) - 1, err, sizeof(err)), CE_EPARSE);
}

Test(port_etf, refuses_every_truncation) {
  ei_x_buff x;
  ce_test_term(&x, "{call, 12345678901, {control_send, 1, #{<<\"type\">> => <<\"ping\">>, "
                   "<<\"n\">> => [1.5, \"ab\", -70000, 'x', []]}}}");
  char err[256];
  for (int n = 0; n < x.index; n++)
    cr_assert_eq(ce_etf_check(x.buff, (size_t)n, err, sizeof(err)), CE_EPARSE,
                 "a %d-byte prefix was accepted", n);
  cr_assert_eq(ce_etf_check(x.buff, (size_t)x.index, err, sizeof(err)), CE_OK);
  ei_x_free(&x);
}

Test(port_etf, refusals_name_the_problem) {
  char err[256];
  cr_assert_eq(check_bytes("", 0, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "empty") != NULL, "%s", err);
  const unsigned char wrong_version[] = {130, 'j'};
  cr_assert_eq(check_bytes(wrong_version, 2, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "131") != NULL, "%s", err);
  const unsigned char trailing[] = {131, 'j', 'j'};
  cr_assert_eq(check_bytes(trailing, 3, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "1 bytes after the term") != NULL, "%s", err);
  const unsigned char compressed[] = {131, 'P', 0, 0, 0, 1, 0x78, 0x9c};
  cr_assert_eq(check_bytes(compressed, sizeof(compressed), err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "compressed") != NULL, "%s", err);
  const unsigned char unknown[] = {131, 'z'};
  cr_assert_eq(check_bytes(unknown, 2, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "unknown term tag 122 at byte 1") != NULL, "%s", err);
  const unsigned char huge_list[] = {131, 'l', 0xff, 0xff, 0xff, 0xff, 'j'};
  cr_assert_eq(check_bytes(huge_list, sizeof(huge_list), err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "4294967295 elements") != NULL, "%s", err);
  const unsigned char huge_map[] = {131, 't', 0x80, 0, 0, 0, 'j', 'j'};
  cr_assert_eq(check_bytes(huge_map, sizeof(huge_map), err, sizeof(err)), CE_EPARSE);
  const unsigned char bad_bits[] = {131, 'M', 0, 0, 0, 1, 0, 0xff};
  cr_assert_eq(check_bytes(bad_bits, sizeof(bad_bits), err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "bitstring") != NULL, "%s", err);
  const unsigned char pid_bad_node[] = {131, 'g', 'a', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  cr_assert_eq(check_bytes(pid_bad_node, sizeof(pid_bad_node), err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "atom") != NULL, "%s", err);
  const unsigned char small_fun[] = {131, 'p', 0, 0, 0, 2};
  cr_assert_eq(check_bytes(small_fun, sizeof(small_fun), err, sizeof(err)), CE_EPARSE);
  /* err may be NULL. */
  cr_assert_eq(ce_etf_check((const char *)unknown, 2, NULL, 0), CE_EPARSE);
}

Test(port_etf, refuses_nesting_beyond_the_limit) {
  char buf[2 * CE_ETF_MAX_DEPTH + 16];
  size_t n = 0;
  buf[n++] = (char)131;
  for (int d = 0; d <= CE_ETF_MAX_DEPTH + 1; d++) {
    buf[n++] = 'h';
    buf[n++] = 1;
  }
  buf[n++] = 'j';
  char err[256];
  cr_assert_eq(ce_etf_check(buf, n, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "deeper than 64") != NULL, "%s", err);
  /* Exactly at the limit is fine. */
  n = 0;
  buf[n++] = (char)131;
  for (int d = 0; d < CE_ETF_MAX_DEPTH; d++) {
    buf[n++] = 'h';
    buf[n++] = 1;
  }
  buf[n++] = 'j';
  cr_assert_eq(ce_etf_check(buf, n, err, sizeof(err)), CE_OK, "%s", err);
}

Test(port_etf, readers) {
  ei_x_buff x;
  ce_test_term(&x, "{18446744073709551615, -1, <<\"bin\">>, abc, #{a => 1}, \"s\"}");
  cr_assert_eq(ce_etf_check(x.buff, (size_t)x.index, NULL, 0), CE_OK);
  int i = 1, arity = 0;
  cr_assert(ce_etf_tuple(x.buff, &i, &arity));
  cr_assert_eq(arity, 6);
  uint64_t v = 0;
  cr_assert(ce_etf_u64(x.buff, &i, &v));
  cr_assert_eq(v, UINT64_MAX);
  int at = i;
  cr_assert_not(ce_etf_u64(x.buff, &i, &v), "a negative integer is not a u64");
  cr_assert_eq(i, at, "the index moved on failure");
  cr_assert_not(ce_etf_binary(x.buff, &i, &(const char *){NULL}, &(size_t){0}));
  ce_etf_skip(x.buff, &i);
  const char *b = NULL;
  size_t n = 0;
  cr_assert(ce_etf_binary(x.buff, &i, &b, &n));
  cr_assert_eq(n, 3);
  cr_assert(memcmp(b, "bin", 3) == 0);
  cr_assert(ce_etf_is_atom(x.buff, i, "abc"));
  cr_assert_not(ce_etf_is_atom(x.buff, i, "abd"));
  char name[CE_ETF_ATOM_MAX];
  cr_assert(ce_etf_atom(x.buff, &i, name));
  cr_assert_str_eq(name, "abc");
  cr_assert_not(ce_etf_tuple(x.buff, &i, &arity));
  cr_assert(ce_etf_map(x.buff, &i, &arity));
  cr_assert_eq(arity, 1);
  ce_etf_skip(x.buff, &i);
  ce_etf_skip(x.buff, &i);
  cr_assert_not(ce_etf_map(x.buff, &i, &arity));
  ce_etf_skip(x.buff, &i);
  cr_assert_eq(i, x.index);
  ei_x_free(&x);
  /* A bitstring with a partial byte is not a binary. */
  ei_x_new_with_version(&x);
  ei_x_encode_bitstring(&x, "\xff", 0, 3);
  i = 1;
  cr_assert_not(ce_etf_binary(x.buff, &i, &b, &n));
  ei_x_free(&x);
}

Test(port_etf, string_and_bool_readers) {
  ei_x_buff x;
  ce_test_term(&x, "{<<\"path\">>, <<>>, <<97, 0, 98>>, <<\"toolong\">>, abc, true, false, maybe}");
  cr_assert_eq(ce_etf_check(x.buff, (size_t)x.index, NULL, 0), CE_OK);
  int i = 1, arity = 0;
  cr_assert(ce_etf_tuple(x.buff, &i, &arity));
  const char *why = NULL;
  char *s = ce_etf_string(x.buff, &i, 4, &why);
  cr_assert_str_eq(s, "path");
  free(s);
  struct {
    size_t max;
    const char *why;
  } bad[] = {{4, "has the wrong length"}, {4, "contains a NUL byte"}, {6, "has the wrong length"},
             {4, "must be a binary"}};
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    int at = i;
    why = NULL;
    cr_assert_null(ce_etf_string(x.buff, &i, bad[k].max, &why), "case %zu", k);
    cr_assert_str_eq(why, bad[k].why, "case %zu", k);
    cr_assert_eq(i, at, "the index moved on failure (case %zu)", k);
    ce_etf_skip(x.buff, &i);
  }
  bool b = false;
  cr_assert(ce_etf_bool(x.buff, &i, &b));
  cr_assert(b);
  cr_assert(ce_etf_bool(x.buff, &i, &b));
  cr_assert_not(b);
  int at = i;
  cr_assert_not(ce_etf_bool(x.buff, &i, &b), "maybe is not a boolean");
  cr_assert_eq(i, at);
  ei_x_free(&x);
}

Test(port_etf, error_codes_are_lower_case_names) {
  ei_x_buff x;
  ei_x_new_with_version(&x);
  ei_x_encode_tuple_header(&x, 3);
  ce_etf_encode_err_code(&x, CE_EINVAL);
  ce_etf_encode_err_code(&x, CE_ETIMEDOUT);
  ce_etf_encode_text(&x, "hi");
  char *s = ce_test_term_str(x.buff, (size_t)x.index);
  cr_assert_str_eq(s, "{inval,timedout,<<\"hi\">>}");
  free(s);
  ei_x_free(&x);
}
