/* Tests for c_src/proxy/netaddr.c and the CIDR helpers of options.c: the
 * address classes the proxy refuses as upstreams (DESIGN §4). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "proxy/netaddr.h"
#include "proxy/options.h"

static bool private_text(const char *text) {
  struct sockaddr_storage ss;
  char buf[80];
  snprintf(buf, sizeof(buf), strchr(text, ':') != NULL ? "[%s]:1" : "%s:1", text);
  cr_assert_eq(ce_addr_parse(buf, &ss), CE_OK, "%s", buf);
  return ce_addr_is_private((struct sockaddr *)&ss);
}

Test(netaddr, private_ranges_are_refused) {
  static const char *const priv[] = {
      "0.0.0.0",     "10.0.0.1",        "10.255.255.255", "127.0.0.1",   "127.9.9.9",    "100.64.0.1",
      "100.127.255.254", "169.254.169.254", "172.16.0.1", "172.31.255.255", "192.168.1.1", "192.0.0.8",
      "224.0.0.1",   "255.255.255.255", "::",             "::1",         "fe80::1",      "febf::1",
      "fc00::1",     "fd00:ce::2",      "ff02::1",        "::ffff:10.0.0.1", "::ffff:169.254.169.254",
      "64:ff9b::a00:1", "fec0::1"};
  for (size_t i = 0; i < sizeof(priv) / sizeof(priv[0]); i++)
    cr_expect(private_text(priv[i]), "%s should be private", priv[i]);
}

Test(netaddr, public_addresses_are_not_private) {
  static const char *const pub[] = {"1.1.1.1",     "8.8.8.8",   "100.63.255.255", "100.128.0.1",
                                    "172.15.255.255", "172.32.0.1", "192.169.0.1", "169.253.0.1",
                                    "2001:db8::1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"};
  for (size_t i = 0; i < sizeof(pub) / sizeof(pub[0]); i++)
    cr_expect(!private_text(pub[i]), "%s should be public", pub[i]);
}

/* Prefixes that embed or stand for addresses the proxy must not reach:
 * local-use NAT64 (RFC 8215), 6to4 with a private IPv4 inside (RFC 3056
 * §2), the deprecated IPv4-compatible ::/96 (RFC 4291 §2.5.5.1) and the
 * benchmarking range 198.18.0.0/15 (RFC 2544, RFC 6890). */
Test(netaddr, embedded_and_special_ranges) {
  static const char *const priv[] = {"64:ff9b:1::1",      "64:ff9b:1:ffff::a00:1", "64:ff9b:1::808:808",
                                     "2002:a00:1::1",     "2002:7f00:1::",         "2002:a9fe:a9fe::1",
                                     "2002:c0a8:101::1",  "::a00:1",               "::808:808",
                                     "198.18.0.1",            "198.19.255.255",
                                     "::ffff:198.18.0.1", "2002:c612:1::1"};
  for (size_t i = 0; i < sizeof(priv) / sizeof(priv[0]); i++)
    cr_expect(private_text(priv[i]), "%s should be private", priv[i]);
  static const char *const pub[] = {"2002:808:808::1", "2002:101:101::", "198.17.255.255", "198.20.0.1",
                                    "64:ff9b:2::1",    "64:ff9a:1::1"};
  for (size_t i = 0; i < sizeof(pub) / sizeof(pub[0]); i++)
    cr_expect(!private_text(pub[i]), "%s should be public", pub[i]);
}

/* A not-redirected connection from these is the pod's own (the startupProbe):
 * c_src/proxy/conn.c logs it at debug level only. */
Test(netaddr, loopback) {
  static const char *const lo[] = {"127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1"};
  static const char *const not_lo[] = {"128.0.0.1", "10.0.0.1", "::", "::2", "::ffff:10.0.0.1",
                                       "fe80::1", "0.0.0.0", "126.255.255.255"};
  struct sockaddr_storage ss;
  char buf[80];
  for (size_t i = 0; i < sizeof(lo) / sizeof(lo[0]); i++) {
    snprintf(buf, sizeof(buf), strchr(lo[i], ':') != NULL ? "[%s]:1" : "%s:1", lo[i]);
    cr_assert_eq(ce_addr_parse(buf, &ss), CE_OK, "%s", buf);
    cr_expect(ce_addr_is_loopback((struct sockaddr *)&ss), "%s should be loopback", lo[i]);
  }
  for (size_t i = 0; i < sizeof(not_lo) / sizeof(not_lo[0]); i++) {
    snprintf(buf, sizeof(buf), strchr(not_lo[i], ':') != NULL ? "[%s]:1" : "%s:1", not_lo[i]);
    cr_assert_eq(ce_addr_parse(buf, &ss), CE_OK, "%s", buf);
    cr_expect(!ce_addr_is_loopback((struct sockaddr *)&ss), "%s should not be loopback", not_lo[i]);
  }
  struct sockaddr unix_sa = {.sa_family = AF_UNIX};
  cr_expect(!ce_addr_is_loopback(&unix_sa));
}

Test(netaddr, parse_and_format) {
  struct sockaddr_storage ss;
  char text[CE_ADDR_TEXT_MAX];
  cr_assert_eq(ce_addr_parse("127.0.0.1:15001", &ss), CE_OK);
  cr_expect_eq(ce_addr_port((struct sockaddr *)&ss), 15001);
  ce_addr_text((struct sockaddr *)&ss, text);
  cr_expect_str_eq(text, "127.0.0.1");
  cr_assert_eq(ce_addr_parse("[::1]:443", &ss), CE_OK);
  cr_expect_eq(ss.ss_family, AF_INET6);
  ce_addr_text((struct sockaddr *)&ss, text);
  cr_expect_str_eq(text, "::1");
  static const char *const bad[] = {"", "127.0.0.1", "::1:80", "[::1]80", "[::1]:", "host:80", "1.2.3.4:65536",
                                    "1.2.3.4:-1", "1.2.3.4:8x", "[::1]:123456", "01.2.3.4:80"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    cr_expect_eq(ce_addr_parse(bad[i], &ss), CE_EINVAL, "'%s'", bad[i]);
}

Test(netaddr, equality) {
  struct sockaddr_storage a, b;
  ce_addr_parse("10.0.0.1:80", &a);
  ce_addr_parse("10.0.0.1:80", &b);
  cr_expect(ce_addr_equal((struct sockaddr *)&a, (struct sockaddr *)&b));
  ce_addr_parse("10.0.0.1:81", &b);
  cr_expect(!ce_addr_equal((struct sockaddr *)&a, (struct sockaddr *)&b));
  ce_addr_parse("[::1]:80", &b);
  cr_expect(!ce_addr_equal((struct sockaddr *)&a, (struct sockaddr *)&b));
}

Test(cidr, parse_and_contains) {
  ce_cidr_t c;
  uint8_t a[16];
  cr_assert_eq(ce_cidr_parse("10.233.0.0/16", &c), CE_OK);
  inet_pton(AF_INET, "10.233.7.9", a);
  cr_expect(ce_cidr_contains(&c, 4, a));
  inet_pton(AF_INET, "10.234.0.1", a);
  cr_expect(!ce_cidr_contains(&c, 4, a));
  inet_pton(AF_INET6, "::ffff:10.233.0.1", a);
  cr_expect(!ce_cidr_contains(&c, 6, a), "families never mix");

  cr_assert_eq(ce_cidr_parse("fd00:ce::/33", &c), CE_OK);
  inet_pton(AF_INET6, "fd00:ce:7fff::1", a);
  cr_expect(ce_cidr_contains(&c, 6, a));
  inet_pton(AF_INET6, "fd00:ce:8000::1", a);
  cr_expect(!ce_cidr_contains(&c, 6, a), "bit 33 differs");

  cr_assert_eq(ce_cidr_parse("169.254.169.254", &c), CE_OK);
  cr_expect_eq(c.prefix, 32);
  cr_assert_eq(ce_cidr_parse("0.0.0.0/0", &c), CE_OK);
  inet_pton(AF_INET, "8.8.8.8", a);
  cr_expect(ce_cidr_contains(&c, 4, a));

  static const char *const bad[] = {"", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8x",
                                    "example.com", "10.0.0/8", "10.0.0.0/ 8"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    cr_expect_eq(ce_cidr_parse(bad[i], &c), CE_EINVAL, "'%s'", bad[i]);
}
