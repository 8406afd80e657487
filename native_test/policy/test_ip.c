/* Tests for c_src/policy/ip.c: strict IPv4, RFC 4291 §2.2 parsing and
 * RFC 5952 formatting. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "policy/ip.h"

static const char *v6_roundtrip(const char *in, char *buf) {
  uint8_t a[16];
  if (ce_ipv6_parse(in, strlen(in), a) != 0)
    return NULL;
  ce_ipv6_format(a, buf);
  return buf;
}

Test(ip, ipv4_accepts_strict_dotted_quads) {
  static const struct {
    const char *in;
    uint8_t out[4];
  } ok[] = {
      {"0.0.0.0", {0, 0, 0, 0}},
      {"127.0.0.1", {127, 0, 0, 1}},
      {"255.255.255.255", {255, 255, 255, 255}},
      {"10.20.30.40", {10, 20, 30, 40}},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    uint8_t a[4] = {9, 9, 9, 9};
    cr_expect_eq(ce_ipv4_parse(ok[i].in, strlen(ok[i].in), a), 0, "%s", ok[i].in);
    cr_expect_arr_eq(a, ok[i].out, 4, "%s", ok[i].in);
  }
}

Test(ip, ipv4_rejects_every_loose_spelling) {
  static const char *bad[] = {
      "",        "127.1",      "127.0.1",    "1.2.3.4.5",  "01.2.3.4",
      "1.2.3.04", "00.0.0.0",  "256.0.0.1",  "1.2.3.999",  "0x7f.0.0.1",
      "1.2.3.",  ".1.2.3",     "1..2.3",     "1.2.3.4 ",   " 1.2.3.4",
      "1.2.3.a", "1.2.3.0004", "1.2.3.+4",   "1.2.3.-4",   "1234.1.1.1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint8_t a[4] = {9, 9, 9, 9};
    cr_expect_eq(ce_ipv4_parse(bad[i], strlen(bad[i]), a), CE_EINVAL, "%s", bad[i]);
    cr_expect_eq(a[0], 9, "out must be untouched for %s", bad[i]);
  }
}

Test(ip, ipv4_reads_only_the_given_length) {
  uint8_t a[4];
  cr_assert_eq(ce_ipv4_parse("1.2.3.4xyz", 7, a), 0);
  cr_assert_eq(a[3], 4);
}

Test(ip, ipv6_forms_of_rfc4291_and_rfc5952_text) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"::", "::"},
      {"::1", "::1"},
      {"1::", "1::"},
      {"2001:DB8:0:0:0:0:0:1", "2001:db8::1"},
      {"2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"},
      {"2001:db8::0:1", "2001:db8::1"},
      /* RFC 5952 §4.2.2: a single zero group is not compressed. */
      {"2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"},
      /* §4.2.3: the longest run wins, the first one on a tie. */
      {"2001:0:0:1:0:0:0:1", "2001:0:0:1::1"},
      {"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},
      {"1:0:0:2:0:0:3:4", "1::2:0:0:3:4"},
      {"0:0:1:2:3:4:5:6", "::1:2:3:4:5:6"},
      {"1:2:3:4:5:6:0:0", "1:2:3:4:5:6::"},
      {"1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0"},
      {"::2:3:4:5:6:7:8", "0:2:3:4:5:6:7:8"},
      {"1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"},
      {"FFFF:ffff:FfFf:ffff:ffff:ffff:ffff:ffff",
       "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
      /* A dotted tail is read but never written back. */
      {"::1.2.3.4", "::102:304"},
      {"64:ff9b::192.0.2.33", "64:ff9b::c000:221"},
      {"1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304"},
      {"::ffff:1.2.3.4", "::ffff:102:304"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char buf[CE_IPV6_TEXT_MAX + 1];
    const char *got = v6_roundtrip(cases[i].in, buf);
    cr_expect(got != NULL, "%s should parse", cases[i].in);
    if (got != NULL)
      cr_expect_str_eq(got, cases[i].out, "%s", cases[i].in);
  }
}

Test(ip, ipv6_rejects_malformed_text) {
  static const char *bad[] = {
      "",          ":",          ":::",         "1:2",          ":1::",
      "::1:",      "1:::2",      "1::2::3",     "12345::",      "1:2:3:4:5:6:7",
      "1:2:3:4:5:6:7:8:9",      "1:2:3:4:5:6:7:8::",           "::1:2:3:4:5:6:7:8",
      "1::2:3:4:5:6:7:8",       "g::1",        "::1%eth0",     "fe80::1%25eth0",
      "::1.2.3",   "::1.2.3.4.5", "::01.2.3.4", "1.2.3.4::",    "::1.2.3.4:1",
      "1:2:3:4:5:6:7:1.2.3.4",  "[::1]",       " ::1",         "::1 ",
      "1:2:3:4:5:6:7:8:",       "::256.1.1.1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint8_t a[16];
    memset(a, 7, sizeof(a));
    cr_expect_eq(ce_ipv6_parse(bad[i], strlen(bad[i]), a), CE_EINVAL, "%s", bad[i]);
    cr_expect_eq(a[0], 7, "out must be untouched for %s", bad[i]);
  }
}

Test(ip, v4_mapped_detection) {
  uint8_t a[16];
  cr_assert_eq(ce_ipv6_parse("::ffff:7f00:1", 13, a), 0);
  cr_expect(ce_ipv6_is_v4_mapped(a));
  cr_assert_eq(ce_ipv6_parse("::fffe:7f00:1", 13, a), 0);
  cr_expect(!ce_ipv6_is_v4_mapped(a));
  cr_assert_eq(ce_ipv6_parse("::1.2.3.4", 9, a), 0);
  cr_expect(!ce_ipv6_is_v4_mapped(a), "IPv4-compatible is not IPv4-mapped");
}

Test(ip, ipv4_format) {
  char buf[CE_IPV4_TEXT_MAX + 1];
  uint8_t a[4] = {255, 0, 10, 255};
  cr_assert_eq(ce_ipv4_format(a, buf), 12);
  cr_assert_str_eq(buf, "255.0.10.255");
}
