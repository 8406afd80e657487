/* Tests for the DNS options of c_src/proxy/options.c (docs/dns.md):
 * --hosts, --dns-upstream, --resolv-conf, --dns-listen. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "proxy/options.h"

#define REQUIRED "--policy", "p.json", "--ca-cert", "ca.pem", "--ca-key", "ca.key", "--session-id", "s1", \
                 "--token-file", "tok"

static void clear_env(void) {
  static const char *const vars[] = {"CONDUKT_EGRESS_HOSTS", "CONDUKT_EGRESS_DNS_UPSTREAM",
                                     "CONDUKT_EGRESS_RESOLV_CONF", "CONDUKT_EGRESS_DNS_LISTEN", "CONDUKT_EGRESS_DNS_STATE",
                                     "CONDUKT_EGRESS_LISTEN"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
    unsetenv(vars[i]);
}

/* Parses REQUIRED plus extra (NULL-terminated); stderr goes nowhere. */
static int parse_with(ce_proxy_options_t *o, const char *const *extra) {
  const char *argv[32] = {"proxy", REQUIRED};
  int argc = 11;
  for (size_t i = 0; extra != NULL && extra[i] != NULL; i++)
    argv[argc++] = extra[i];
  FILE *saved = stderr;
  stderr = fopen("/dev/null", "w");
  int rc = ce_proxy_options_parse(argc, (char **)argv, o);
  fclose(stderr);
  stderr = saved;
  return rc;
}

static uint16_t port_of(const struct sockaddr_storage *ss) {
  return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                         : ((const struct sockaddr_in *)ss)->sin_port);
}

Test(proxy_options_dns, defaults, .init = clear_env) {
  ce_proxy_options_t o;
  cr_assert_eq(parse_with(&o, NULL), CE_EXIT_OK);
  cr_expect_null(o.hosts_path);
  cr_expect_null(o.dns_state_path);
  cr_expect_eq(o.dns_upstream_count, 0);
  cr_expect_str_eq(o.resolv_conf_path, "/etc/resolv.conf");
  cr_assert_eq(o.dns_listen_count, 2);
  cr_expect_str_eq(o.dns_listen[0], "127.0.0.1:15053");
  cr_expect_str_eq(o.dns_listen[1], "[::1]:15053");
  cr_expect_not(o.dns_listen_off);
  ce_proxy_options_free(&o);
}

Test(proxy_options_dns, flags, .init = clear_env) {
  const char *extra[] = {"--hosts", "/etc/condukt-egress/hosts", "--dns-upstream", "10.96.0.10,[fd00::a]:5353",
                         "--dns-upstream=1.1.1.1", "--resolv-conf", "/x/resolv.conf", "--dns-listen",
                         "127.0.0.1:53", "--dns-state", "/run/condukt-egress/resolvers", NULL};
  ce_proxy_options_t o;
  cr_assert_eq(parse_with(&o, extra), CE_EXIT_OK);
  cr_expect_str_eq(o.hosts_path, "/etc/condukt-egress/hosts");
  cr_assert_eq(o.dns_upstream_count, 3);
  cr_expect_eq(port_of(&o.dns_upstreams[0]), 53);
  cr_expect_eq(o.dns_upstreams[1].ss_family, AF_INET6);
  cr_expect_eq(port_of(&o.dns_upstreams[1]), 5353);
  cr_expect_str_eq(o.resolv_conf_path, "/x/resolv.conf");
  cr_expect_str_eq(o.dns_state_path, "/run/condukt-egress/resolvers");
  cr_assert_eq(o.dns_listen_count, 1);
  cr_expect_str_eq(o.dns_listen[0], "127.0.0.1:53");
  ce_proxy_options_free(&o);
}

Test(proxy_options_dns, environment, .init = clear_env) {
  setenv("CONDUKT_EGRESS_DNS_UPSTREAM", "10.0.0.1,10.0.0.2", 1);
  setenv("CONDUKT_EGRESS_DNS_LISTEN", "none", 1);
  setenv("CONDUKT_EGRESS_HOSTS", "/h", 1);
  ce_proxy_options_t o;
  cr_assert_eq(parse_with(&o, NULL), CE_EXIT_OK);
  cr_expect_eq(o.dns_upstream_count, 2);
  cr_expect(o.dns_listen_off);
  cr_expect_eq(o.dns_listen_count, 0);
  cr_expect_str_eq(o.hosts_path, "/h");
  ce_proxy_options_free(&o);
}

Test(proxy_options_dns, usage_errors, .init = clear_env) {
  static const char *const bad[][3] = {
      {"--dns-upstream", "dns.example", NULL},
      {"--dns-upstream", "10.0.0.1,", NULL},
      {"--dns-upstream", "1.1.1.1,2.2.2.2,3.3.3.3,4.4.4.4,5.5.5.5", NULL},
      {"--dns-upstream", "10.0.0.1:0", NULL},
      {"--dns-upstream", "fe80::1%eth0", NULL},
      {"--hosts", "", NULL},
      {"--dns-listen", "", NULL},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_proxy_options_t o;
    cr_expect_eq(parse_with(&o, bad[i]), CE_EXIT_USAGE, "%s %s", bad[i][0], bad[i][1]);
    ce_proxy_options_free(&o);
  }
  const char *mixed[] = {"--dns-listen", "none", "--dns-listen", "127.0.0.1:53", NULL};
  ce_proxy_options_t o;
  cr_expect_eq(parse_with(&o, mixed), CE_EXIT_USAGE);
  ce_proxy_options_free(&o);
}
