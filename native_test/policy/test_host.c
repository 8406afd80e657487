/* Tests for c_src/policy/host.c: docs/host-matching.md §1 (request hosts)
 * and §2 (patterns), including the order in which errors are reported. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "policy/host.h"

typedef struct {
  const char *in;
  const char *out; /* NULL: invalid */
  ce_host_kind_t kind;
} host_case_t;

static void check_hosts(const host_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ce_host_t h;
    int rc = ce_host_normalize(cases[i].in, strlen(cases[i].in), &h);
    if (cases[i].out == NULL) {
      cr_expect_eq(rc, CE_EINVAL, "host \"%s\" should be invalid, got \"%s\"",
                   cases[i].in, rc == 0 ? h.text : "");
      continue;
    }
    cr_expect_eq(rc, 0, "host \"%s\" should be valid", cases[i].in);
    if (rc != 0)
      continue;
    cr_expect_str_eq(h.text, cases[i].out, "host \"%s\"", cases[i].in);
    cr_expect_eq(h.len, strlen(h.text), "host \"%s\"", cases[i].in);
    cr_expect_eq(h.kind, cases[i].kind, "host \"%s\"", cases[i].in);
  }
}

Test(host, names_ports_and_trailing_dots) {
  static const host_case_t cases[] = {
      {"example.com", "example.com", CE_HOST_NAME},
      {"Example.COM.", "example.com", CE_HOST_NAME},
      {"Example.COM.:8443", "example.com", CE_HOST_NAME},
      {"api.github.com:443", "api.github.com", CE_HOST_NAME},
      {"a:0", "a", CE_HOST_NAME},
      {"a:65535", "a", CE_HOST_NAME},
      {"a:00443", "a", CE_HOST_NAME},
      {"under_score.example", "under_score.example", CE_HOST_NAME},
      {"-lead.example", "-lead.example", CE_HOST_NAME},
      {"localhost", "localhost", CE_HOST_NAME},
      {"a.b.c.d.e", "a.b.c.d.e", CE_HOST_NAME},
      {"0xg.example.0xg", "0xg.example.0xg", CE_HOST_NAME},
      {"1.2.3.4.example", "1.2.3.4.example", CE_HOST_NAME},
      {"x.1a", "x.1a", CE_HOST_NAME},
      {"", NULL, 0},
      {".", NULL, 0},
      {"..", NULL, 0},
      {"a..b", NULL, 0},
      {".a", NULL, 0},
      {"a..", NULL, 0},
      {":443", NULL, 0},
      {".:443", NULL, 0},
      {"a:", NULL, 0},
      {"a:65536", NULL, 0},
      {"a:123456", NULL, 0},
      {"a:-1", NULL, 0},
      {"a:+1", NULL, 0},
      {"a:1x", NULL, 0},
      {"a b", NULL, 0},
      {"a@b", NULL, 0},
      {"a/b", NULL, 0},
      {"a\\b", NULL, 0},
      {"*.example.com", NULL, 0},
      {"a]b", NULL, 0},
      {"a\x7f", NULL, 0},
  };
  check_hosts(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(host, ip_literals) {
  static const host_case_t cases[] = {
      {"127.0.0.1", "127.0.0.1", CE_HOST_IPV4},
      {"127.0.0.1:8080", "127.0.0.1", CE_HOST_IPV4},
      {"127.0.0.1.", "127.0.0.1", CE_HOST_IPV4},
      {"[::1]", "::1", CE_HOST_IPV6},
      {"[::1]:443", "::1", CE_HOST_IPV6},
      {"::1", "::1", CE_HOST_IPV6},
      {"[2001:DB8:0:0:0:0:0:1]", "2001:db8::1", CE_HOST_IPV6},
      {"2001:db8::1", "2001:db8::1", CE_HOST_IPV6},
      {"[::ffff:10.0.0.1]", "10.0.0.1", CE_HOST_IPV4},
      {"[::FFFF:a00:1]:80", "10.0.0.1", CE_HOST_IPV4},
      {"::ffff:0:0", "0.0.0.0", CE_HOST_IPV4},
      {"0:0:0:0:0:ffff:7f00:1", "127.0.0.1", CE_HOST_IPV4},
      /* Resolver-only IPv4 spellings (§1 step 9). */
      {"127.1", NULL, 0},
      {"0x7f.0.0.1", NULL, 0},
      {"010.0.0.1", NULL, 0},
      {"256.0.0.1", NULL, 0},
      {"2130706433", NULL, 0},
      {"0x7f000001", NULL, 0},
      {"0X7F000001", NULL, 0},
      {"example.0x", NULL, 0},
      {"example.123", NULL, 0},
      {"1.2.3.4.5", NULL, 0},
      /* Brackets and colons. */
      {"[::1", NULL, 0},
      {"[::1]x", NULL, 0},
      {"[::1]:", NULL, 0},
      {"[::1]:99999", NULL, 0},
      {"[::1]]", NULL, 0},
      {"[]", NULL, 0},
      {"[1.2.3.4]", NULL, 0},
      {"[fe80::1%eth0]", NULL, 0},
      {"[fe80::1%25eth0]:80", NULL, 0},
      {"::1:443x", NULL, 0},
      {"a:b:c", NULL, 0},
      {"example.com:443:1", NULL, 0},
      {"[example.com]", NULL, 0},
  };
  check_hosts(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(host, unicode_names) {
  static const host_case_t cases[] = {
      {"b\xc3\xbc" "cher.example", "xn--bcher-kva.example", CE_HOST_NAME},
      {"B\xc3\x9c" "CHER.Example", "xn--bcher-kva.example", CE_HOST_NAME},
      /* NFC: u + COMBINING DIAERESIS composes to ü. */
      {"bu\xcc\x88" "cher.example", "xn--bcher-kva.example", CE_HOST_NAME},
      /* KELVIN SIGN lower-cases to ASCII 'k': an ASCII label. */
      {"\xe2\x84\xaa" "ey.example", "key.example", CE_HOST_NAME},
      /* ß stays ß under lower-casing (full case folding would give "ss"). */
      {"stra\xc3\x9f" "e.de", "xn--strae-oqa.de", CE_HOST_NAME},
      /* Capital sigma maps to σ everywhere, without the Final_Sigma
       * context rule. */
      {"\xce\xa3\xce\x91\xce\xa3.gr", "xn--mxa9ab.gr", CE_HOST_NAME},
      {"\xcf\x83\xce\xb1\xcf\x83.gr", "xn--mxa9ab.gr", CE_HOST_NAME},
      {"\xe4\xbe\x8b\xe3\x81\x88.\xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88",
       "xn--r8jz45g.xn--zckzah", CE_HOST_NAME},
      /* Invalid UTF-8: a lone continuation byte, an overlong '/', a
       * truncated sequence, a surrogate. */
      {"a\x80.example", NULL, 0},
      {"\xc0\xaf.example", NULL, 0},
      {"\xc3.example", NULL, 0},
      {"\xed\xa0\x80.example", NULL, 0},
      /* ASCII characters in a Unicode label must still be label bytes. */
      {"b\xc3\xbc" "cher!.example", NULL, 0},
      {"b\xc3\xbc" "*.example", NULL, 0},
      /* A fullwidth full stop is not a label separator here; it becomes
       * part of the label (and a non-ASCII code point). */
      {"a\xef\xbc\x8e" "b", "xn--ab-yu3n", CE_HOST_NAME},
  };
  check_hosts(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(host, length_limits) {
  char buf[1200];
  ce_host_t h;

  /* 63-byte label ok, 64 not. */
  memset(buf, 'a', 63);
  memcpy(buf + 63, ".com", 5);
  cr_expect_eq(ce_host_normalize(buf, strlen(buf), &h), 0);
  memset(buf, 'a', 64);
  memcpy(buf + 64, ".com", 5);
  cr_expect_eq(ce_host_normalize(buf, strlen(buf), &h), CE_EINVAL);

  /* 253 bytes ok (with or without the trailing dot), 254 not. */
  size_t o = 0;
  for (int i = 0; i < 3; i++) {
    memset(buf + o, 'a', 63);
    o += 63;
    buf[o++] = '.';
  }
  memset(buf + o, 'b', 61);
  o += 61;
  buf[o] = '\0';
  cr_assert_eq(o, 253);
  cr_expect_eq(ce_host_normalize(buf, o, &h), 0);
  cr_expect_eq(h.len, 253);
  buf[o] = '.';
  cr_expect_eq(ce_host_normalize(buf, o + 1, &h), 0);
  buf[o] = 'b';
  cr_expect_eq(ce_host_normalize(buf, o + 1, &h), CE_EINVAL);

  /* A label of 21 'ü' converts to "xn--tdaaa..." of more than 63 bytes. */
  o = 0;
  for (int i = 0; i < 60; i++) {
    buf[o++] = '\xc3';
    buf[o++] = '\xbc';
  }
  cr_expect_eq(ce_host_normalize(buf, o, &h), CE_EINVAL);
  /* A huge non-ASCII label is refused without converting it. */
  o = 0;
  while (o + 2 <= 1100) {
    buf[o++] = '\xc3';
    buf[o++] = '\xbc';
  }
  cr_expect_eq(ce_host_normalize(buf, o, &h), CE_EINVAL);
  /* 63 KELVIN SIGNs (189 bytes) shrink to 63 'k': a valid label. */
  o = 0;
  for (int i = 0; i < 63; i++) {
    memcpy(buf + o, "\xe2\x84\xaa", 3);
    o += 3;
  }
  cr_expect_eq(ce_host_normalize(buf, o, &h), 0);
  cr_expect_eq(h.len, 63);
  memcpy(buf + o, "\xe2\x84\xaa", 3);
  cr_expect_eq(ce_host_normalize(buf, o + 3, &h), CE_EINVAL);
}

Test(host, reads_only_the_given_span) {
  ce_host_t h;
  const char *sni = "api.github.comGARBAGE";
  cr_assert_eq(ce_host_normalize(sni, 14, &h), 0);
  cr_assert_str_eq(h.text, "api.github.com");
}

typedef struct {
  const char *in;
  const char *out;      /* NULL: error */
  ce_pattern_err_t err; /* when out is NULL */
} pat_case_t;

static void check_patterns(const pat_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ce_host_t h;
    ce_pattern_err_t err = CE_PATTERN_BAD_IP;
    int rc = ce_pattern_normalize(cases[i].in, strlen(cases[i].in), &h, &err);
    if (cases[i].out == NULL) {
      cr_expect_eq(rc, CE_EINVAL, "pattern \"%s\" should fail", cases[i].in);
      cr_expect_str_eq(ce_pattern_err_code(err), ce_pattern_err_code(cases[i].err),
                       "pattern \"%s\"", cases[i].in);
      continue;
    }
    cr_expect_eq(rc, 0, "pattern \"%s\" should be valid, got %s", cases[i].in,
                 ce_pattern_err_code(err));
    cr_expect_eq(err, CE_PATTERN_OK, "pattern \"%s\"", cases[i].in);
    if (rc == 0)
      cr_expect_str_eq(h.text, cases[i].out, "pattern \"%s\"", cases[i].in);
  }
}

Test(pattern, valid_patterns) {
  static const pat_case_t fixed[] = {
      {"*.Example.COM.", "*.example.com", 0},
      {"api.github.com", "api.github.com", 0},
      {"**.example.com", "**.example.com", 0},
      {"api*.example.com", "api*.example.com", 0},
      {"*", "*", 0},
      {"**", "**", 0},
      {"*.*", "*.*", 0},
      {"a**b", "a**b", 0},
      {"*.*.example.com", "*.*.example.com", 0},
      {"10.0.0.1", "10.0.0.1", 0},
      {"10.0.0.1.", "10.0.0.1", 0},
      {"[::1]", "::1", 0},
      {"::1", "::1", 0},
      {"[2001:DB8::0:1]", "2001:db8::1", 0},
      {"::ffff:10.0.0.1", "10.0.0.1", 0},
      {"[::ffff:a00:1]", "10.0.0.1", 0},
      {"B\xc3\xbc" "cher.example", "xn--bcher-kva.example", 0},
      {"*.b\xc3\xbc" "cher.example", "*.xn--bcher-kva.example", 0},
      {"\xe2\x84\xaa" "ey.example", "key.example", 0},
      {"x.0xg", "x.0xg", 0},
      {"x.1*", "x.1*", 0},
      {"x.0x*", "x.0x*", 0},
      /* '*' next to a non-ASCII label elsewhere in the name is fine. */
      {"*.\xe2\x84\xaa" "ey.example", "*.key.example", 0},
  };
  check_patterns(fixed, sizeof(fixed) / sizeof(fixed[0]));
}

Test(pattern, every_error_code) {
  static const pat_case_t cases[] = {
      {"", NULL, CE_PATTERN_EMPTY},
      {"https://example.com", NULL, CE_PATTERN_SCHEME},
      {"://", NULL, CE_PATTERN_SCHEME},
      {"example.com/", NULL, CE_PATTERN_PATH},
      {"example.com?x", NULL, CE_PATTERN_PATH},
      {"example.com#x", NULL, CE_PATTERN_PATH},
      {"10.0.0.0/8", NULL, CE_PATTERN_CIDR},
      {"192.168.1.1/32", NULL, CE_PATTERN_CIDR},
      {"fd00::/8", NULL, CE_PATTERN_CIDR},
      {"::/0", NULL, CE_PATTERN_CIDR},
      {"[2001:db8::]/32", NULL, CE_PATTERN_CIDR},
      {"::ffff:10.0.0.0/104", NULL, CE_PATTERN_CIDR},
      /* Not ADDR/N: a path after all. */
      {"10.0.0.0/", NULL, CE_PATTERN_PATH},
      {"10.0.0.0/1234", NULL, CE_PATTERN_PATH},
      {"10.0.0.0/8/9", NULL, CE_PATTERN_PATH},
      {"10.0.0.0/x", NULL, CE_PATTERN_PATH},
      {"10.0.0/8", NULL, CE_PATTERN_PATH},
      {"010.0.0.0/8", NULL, CE_PATTERN_PATH},
      {"example.com/8", NULL, CE_PATTERN_PATH},
      {"[::1/128]", NULL, CE_PATTERN_PATH},
      {"[::1]x/8", NULL, CE_PATTERN_PATH},
      {"10.0.0.0?8", NULL, CE_PATTERN_PATH},
      {"example.com:443", NULL, CE_PATTERN_PORT},
      {"*:443", NULL, CE_PATTERN_PORT},
      {"***.example.com", NULL, CE_PATTERN_STAR_RUN},
      {"a****", NULL, CE_PATTERN_STAR_RUN},
      {".", NULL, CE_PATTERN_EMPTY_LABEL},
      {"..", NULL, CE_PATTERN_EMPTY_LABEL},
      {".example.com", NULL, CE_PATTERN_EMPTY_LABEL},
      {"a..b", NULL, CE_PATTERN_EMPTY_LABEL},
      {"a@b.com", NULL, CE_PATTERN_BAD_CHAR},
      {"a b.com", NULL, CE_PATTERN_BAD_CHAR},
      {"a\\b.com", NULL, CE_PATTERN_BAD_CHAR},
      {"a]b", NULL, CE_PATTERN_BAD_CHAR},
      {"b\xc3\xbc" "cher!.example", NULL, CE_PATTERN_BAD_CHAR},
      {"a\xff.com", NULL, CE_PATTERN_BAD_UTF8},
      {"\xc3.com", NULL, CE_PATTERN_BAD_UTF8},
      {"*b\xc3\xbc" "cher.example", NULL, CE_PATTERN_WILDCARD_IDN},
      {"\xe2\x84\xaa*.example", NULL, CE_PATTERN_WILDCARD_IDN},
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.com",
       NULL, CE_PATTERN_LABEL_TOO_LONG},
      {"[::1]:443", NULL, CE_PATTERN_BAD_IP},
      {"[::1", NULL, CE_PATTERN_BAD_IP},
      {"[", NULL, CE_PATTERN_BAD_IP},
      {"[]", NULL, CE_PATTERN_BAD_IP},
      {"[1.2.3.4]", NULL, CE_PATTERN_BAD_IP},
      {"[example.com]", NULL, CE_PATTERN_BAD_IP},
      {"[fe80::1%eth0]", NULL, CE_PATTERN_BAD_IP},
      {"1:2:3", NULL, CE_PATTERN_BAD_IP},
      {"*::1", NULL, CE_PATTERN_BAD_IP},
      {"127.1", NULL, CE_PATTERN_BAD_IP},
      {"256.1.1.1", NULL, CE_PATTERN_BAD_IP},
      {"010.0.0.1", NULL, CE_PATTERN_BAD_IP},
      {"0x7f.0.0.1", NULL, CE_PATTERN_BAD_IP},
      {"*.0.0.1", NULL, CE_PATTERN_BAD_IP},
      {"example.0x", NULL, CE_PATTERN_BAD_IP},
      {"example.0XAB", NULL, CE_PATTERN_BAD_IP},
  };
  check_patterns(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(pattern, errors_follow_the_step_order) {
  char big[400];
  static const pat_case_t cases[] = {
      /* scheme (step 2) before path (3) before port (5). */
      {"https://a/b:1", NULL, CE_PATTERN_SCHEME},
      {"a/b:1", NULL, CE_PATTERN_PATH},
      /* path (3) before the bracket check (4). */
      {"[::1]/x", NULL, CE_PATTERN_PATH},
      /* ... and cidr (3) too; scheme (2) before it. */
      {"[::1]/128", NULL, CE_PATTERN_CIDR},
      {"https://10.0.0.0/8", NULL, CE_PATTERN_SCHEME},
      /* port (5) before star_run (6) before labels (9). */
      {"***:1", NULL, CE_PATTERN_PORT},
      {"***..", NULL, CE_PATTERN_STAR_RUN},
      {"a@***", NULL, CE_PATTERN_STAR_RUN},
      /* Labels are checked left to right. */
      {"a..b@", NULL, CE_PATTERN_EMPTY_LABEL},
      {"a@..b", NULL, CE_PATTERN_BAD_CHAR},
      {"\xff..", NULL, CE_PATTERN_BAD_UTF8},
      /* Inside a label: bad_char before label_too_long. */
      {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa@", NULL,
       CE_PATTERN_BAD_CHAR},
      /* bad_utf8 before wildcard_idn. */
      {"*\xff", NULL, CE_PATTERN_BAD_UTF8},
      /* A label error anywhere beats bad_ip on the last label. */
      {"a@.1", NULL, CE_PATTERN_BAD_CHAR},
  };
  check_patterns(cases, sizeof(cases) / sizeof(cases[0]));

  /* name_too_long (step 10) comes after every label check, and before
   * the numeric last-label check (step 11). */
  ce_host_t h;
  ce_pattern_err_t err;
  size_t o = 0;
  for (int i = 0; i < 5; i++) {
    memset(big + o, 'a', 60);
    o += 60;
    big[o++] = '.';
  }
  memcpy(big + o, "x@", 2);
  cr_expect_eq(ce_pattern_normalize(big, o + 2, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_BAD_CHAR, "label errors past the 253rd byte win");
  memcpy(big + o, "1", 1);
  cr_expect_eq(ce_pattern_normalize(big, o + 1, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_NAME_TOO_LONG);
  memcpy(big + o, "x", 1);
  cr_expect_eq(ce_pattern_normalize(big, o + 1, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_NAME_TOO_LONG);
  /* A non-ASCII label far past the cap is still checked. */
  memcpy(big + o, "\xff", 1);
  cr_expect_eq(ce_pattern_normalize(big, o + 1, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_BAD_UTF8);
}

Test(pattern, unicode_label_limits) {
  char buf[4096];
  ce_host_t h;
  ce_pattern_err_t err;
  size_t o = 0;
  /* 2000 bytes of 'ü' and one '!': the input is too long to convert, yet
   * the bad character is still reported first. */
  while (o < 2000) {
    buf[o++] = '\xc3';
    buf[o++] = '\xbc';
  }
  buf[o++] = '!';
  cr_expect_eq(ce_pattern_normalize(buf, o, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_BAD_CHAR);
  cr_expect_eq(ce_pattern_normalize(buf, o - 1, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_LABEL_TOO_LONG);
  /* U+0130 lower-cases to two code points (three bytes), so 500 of them
   * (1000 bytes, under the conversion cut-off) map to 1500 bytes: still
   * converted, and far too long. */
  o = 0;
  for (int i = 0; i < 500; i++) {
    buf[o++] = '\xc4';
    buf[o++] = '\xb0';
  }
  cr_expect_eq(ce_pattern_normalize(buf, o, &h, &err), CE_EINVAL);
  cr_expect_eq(err, CE_PATTERN_LABEL_TOO_LONG);
}

Test(pattern, null_err_is_allowed) {
  ce_host_t h;
  cr_assert_eq(ce_pattern_normalize("https://x", 9, &h, NULL), CE_EINVAL);
  cr_assert_eq(ce_pattern_normalize("x.com", 5, &h, NULL), 0);
}

Test(pattern, code_names_and_hints) {
  cr_assert_str_eq(ce_pattern_err_code(CE_PATTERN_EMPTY), "empty");
  cr_assert_str_eq(ce_pattern_err_code(CE_PATTERN_WILDCARD_IDN), "wildcard_idn");
  cr_assert_str_eq(ce_pattern_err_code(CE_PATTERN_BAD_IP), "bad_ip");
  cr_assert_str_eq(ce_pattern_err_code(CE_PATTERN_OK), "ok");
  cr_assert_str_eq(ce_pattern_err_code((ce_pattern_err_t)999), "unknown");
  cr_assert_str_eq(ce_pattern_err_hint(CE_PATTERN_SCHEME),
                   "write the host only, without \"://\"");
  cr_assert_not_null(ce_pattern_err_hint((ce_pattern_err_t)999));
}
