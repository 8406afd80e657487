/* Tests for c_src/dns/hosts.c: the hosts(5) syntax, lookups, and the
 * files that are refused whole. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "dns/hosts.h"

static ce_hosts_t *load(const char *text) {
  ce_hosts_t *h = NULL;
  char err[CE_HOSTS_ERROR_MAX];
  cr_assert_eq(ce_hosts_load_buffer(text, strlen(text), &h, err, sizeof(err)), CE_OK, "%s", err);
  return h;
}

Test(dns_hosts, lookup_in_file_order_case_insensitive) {
  ce_hosts_t *h = load("# a comment\n"
                       "10.0.0.5\tgit.internal   Git.Example.  # trailing comment\n"
                       "\n"
                       "  fd00::5 git.internal\r\n"
                       "10.0.0.5 git.internal\n"
                       "10.0.0.6 other.internal");
  ce_hosts_addr_t a[CE_HOSTS_MAX_ADDRS];
  size_t n = ce_hosts_lookup(h, "GIT.internal.", 13, a, CE_HOSTS_MAX_ADDRS);
  cr_assert_eq(n, 2, "the repeated address counts once");
  cr_expect_eq(a[0].family, 4);
  cr_expect_eq(memcmp(a[0].addr, "\x0a\x00\x00\x05", 4), 0);
  cr_expect_eq(a[1].family, 6);
  cr_expect_eq(a[1].addr[0], 0xfd);
  cr_expect_eq(ce_hosts_lookup(h, "git.example", 11, a, CE_HOSTS_MAX_ADDRS), 1);
  cr_expect_eq(ce_hosts_lookup(h, "other.internal", 14, a, CE_HOSTS_MAX_ADDRS), 1, "a last line without newline");
  cr_expect_eq(ce_hosts_lookup(h, "git", 3, a, CE_HOSTS_MAX_ADDRS), 0);
  cr_expect_eq(ce_hosts_lookup(h, "git.internal", 12, a, 1), 1, "cap respected");
  cr_expect_eq(ce_hosts_lookup(NULL, "git.internal", 12, a, 1), 0);
  ce_hosts_free(h);
}

Test(dns_hosts, refused_files) {
  static const char *const bad[] = {"10.0.0.300 x\n", "10.0.0.1\n", "fe80::1%eth0 x\n", "10.0.0.1 a..b\n",
                                    "10.0.0.1 ok bad_label_that_is_far_too_long_for_dns_because_it_has_more_than_63_bytes\n",
                                    "example.com 10.0.0.1\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_hosts_t *h = NULL;
    char err[CE_HOSTS_ERROR_MAX] = "";
    cr_expect_eq(ce_hosts_load_buffer(bad[i], strlen(bad[i]), &h, err, sizeof(err)), CE_EPARSE, "%s", bad[i]);
    cr_expect_null(h);
    cr_expect_eq(strncmp(err, "line 1: ", 8), 0, "%s", err);
  }
  ce_hosts_t *h = NULL;
  cr_expect_eq(ce_hosts_load_buffer("", CE_HOSTS_MAX_BYTES + 1, &h, NULL, 0), CE_ETOOBIG);
}

Test(dns_hosts, too_many_entries) {
  size_t cap = (CE_HOSTS_MAX_ENTRIES + 1) * 20 + 1;
  char *buf = malloc(cap);
  size_t o = 0;
  for (unsigned i = 0; i <= CE_HOSTS_MAX_ENTRIES; i++)
    o += (size_t)snprintf(buf + o, cap - o, "1.1.1.1 h%u\n", i % 100000);
  ce_hosts_t *h = NULL;
  cr_expect_eq(ce_hosts_load_buffer(buf, o, &h, NULL, 0), CE_ETOOBIG);
  free(buf);
}

Test(dns_hosts, load_file) {
  char path[] = "/tmp/ce_test_hosts_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "192.0.2.7 a.test\n", 17), 17);
  close(fd);
  ce_hosts_t *h = NULL;
  char err[CE_HOSTS_ERROR_MAX];
  cr_assert_eq(ce_hosts_load_file(path, &h, err, sizeof(err)), CE_OK);
  ce_hosts_addr_t a[1];
  cr_expect_eq(ce_hosts_lookup(h, "a.test", 6, a, 1), 1);
  ce_hosts_free(h);
  unlink(path);
  cr_expect_eq(ce_hosts_load_file(path, &h, err, sizeof(err)), CE_ENOENT);
  cr_expect_eq(ce_hosts_load_file("/", &h, err, sizeof(err)), CE_EIO);
}
