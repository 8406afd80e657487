/* Tests for c_src/netfilter/rules.c: the option parsers, the resolv.conf
 * reader and the exact iptables-restore text (docs/netfilter.md). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "netfilter/rules.h"

static char text[CE_NF_TEXT_MAX];

static const char *rules(const ce_nf_config_t *cfg, ce_nf_family_t family) {
  size_t len = 0;
  cr_assert_eq(ce_nf_rules_text(cfg, family, text, sizeof(text), &len), 0);
  cr_assert_eq(len, strlen(text));
  return text;
}

static const char *const V4_DEFAULT =
    "*nat\n"
    ":CONDUKT_NAT - [0:0]\n"
    "-A CONDUKT_NAT -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j CONNMARK --set-xmark 0x539/0xffffffff\n"
    "-A CONDUKT_NAT -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -o lo -j RETURN\n"
    "-A CONDUKT_NAT -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 15001\n"
    "-A CONDUKT_NAT -p udp --dport 53 -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -p tcp --dport 53 -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -p udp --dport 53 -j REDIRECT --to-ports 15053\n"
    "-A CONDUKT_NAT -p tcp --dport 53 -j REDIRECT --to-ports 15053\n"
    "COMMIT\n"
    "*filter\n"
    ":CONDUKT_FILTER - [0:0]\n"
    "-A CONDUKT_FILTER -o lo -j ACCEPT\n"
    "-A CONDUKT_FILTER -d 127.0.0.1/32 -p tcp --dport 15001 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -d 127.0.0.1/32 -p udp --dport 15053 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -d 127.0.0.1/32 -p tcp --dport 15053 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j ACCEPT\n"
    "-A CONDUKT_FILTER -m mark --mark 0x539/0xffffffff -m connmark --mark 0x539/0xffffffff "
    "-m owner ! --socket-exists -j ACCEPT\n"
    "-A CONDUKT_FILTER -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT\n"
    "-A CONDUKT_FILTER -p tcp -j REJECT --reject-with tcp-reset\n"
    "-A CONDUKT_FILTER -j REJECT --reject-with icmp-admin-prohibited\n"
    "COMMIT\n";

static const char *const V6_DEFAULT =
    "*nat\n"
    ":CONDUKT_NAT - [0:0]\n"
    "-A CONDUKT_NAT -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j CONNMARK --set-xmark 0x539/0xffffffff\n"
    "-A CONDUKT_NAT -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -o lo -j RETURN\n"
    "-A CONDUKT_NAT -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 15001\n"
    "-A CONDUKT_NAT -p udp --dport 53 -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -p tcp --dport 53 -m owner --uid-owner 1337 -j RETURN\n"
    "-A CONDUKT_NAT -p udp --dport 53 -j REDIRECT --to-ports 15053\n"
    "-A CONDUKT_NAT -p tcp --dport 53 -j REDIRECT --to-ports 15053\n"
    "COMMIT\n"
    "*filter\n"
    ":CONDUKT_FILTER - [0:0]\n"
    "-A CONDUKT_FILTER -o lo -j ACCEPT\n"
    "-A CONDUKT_FILTER -d ::1/128 -p tcp --dport 15001 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -d ::1/128 -p udp --dport 15053 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -d ::1/128 -p tcp --dport 15053 -m conntrack --ctstate DNAT -j ACCEPT\n"
    "-A CONDUKT_FILTER -m mark --mark 0x539/0xffffffff -m owner --uid-owner 1337 -j ACCEPT\n"
    "-A CONDUKT_FILTER -m mark --mark 0x539/0xffffffff -m connmark --mark 0x539/0xffffffff "
    "-m owner ! --socket-exists -j ACCEPT\n"
    "-A CONDUKT_FILTER -m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT\n"
    "-A CONDUKT_FILTER -p ipv6-icmp -m icmp6 --icmpv6-type neighbour-solicitation -m hl --hl-eq 255 -j ACCEPT\n"
    "-A CONDUKT_FILTER -p ipv6-icmp -m icmp6 --icmpv6-type neighbour-advertisement -m hl --hl-eq 255 -j ACCEPT\n"
    "-A CONDUKT_FILTER -d ff02::/16 -p ipv6-icmp -m icmp6 --icmpv6-type router-solicitation -m hl --hl-eq 255 -j ACCEPT\n"
    "-A CONDUKT_FILTER -p tcp -j REJECT --reject-with tcp-reset\n"
    "-A CONDUKT_FILTER -j REJECT --reject-with icmp6-adm-prohibited\n"
    "COMMIT\n";

Test(nf_rules, defaults_exact_text) {
  ce_nf_config_t cfg;
  ce_nf_config_init(&cfg);
  cr_assert_eq(cfg.proxy_port, 15001);
  cr_assert_eq(cfg.mark, 0x539u);
  cr_assert_eq(cfg.sidecar_uid, 1337u);
  cr_assert_eq(cfg.dns_port, 15053);
  cr_assert_eq(cfg.nports, 2);
  cr_assert_eq(cfg.ndns, 0);
  cr_assert_not(cfg.dns_any);
  cr_assert_str_eq(rules(&cfg, CE_NF_IPV4), V4_DEFAULT);
  cr_assert_str_eq(rules(&cfg, CE_NF_IPV6), V6_DEFAULT);
}

Test(nf_rules, custom_port_mark_ports_dns) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_port("8443", &cfg.proxy_port, &err), 0);
  cr_assert_eq(ce_nf_parse_mark("0xDEADbeef", &cfg.mark, &err), 0);
  cr_assert_eq(ce_nf_parse_ports("8080", &cfg, &err), 0);
  cr_assert_eq(ce_nf_parse_dns("10.96.0.10,fd00::a,fe80::1%eth0", &cfg, &err), 0);
  cr_assert_eq(ce_nf_parse_uid("4242", &cfg.sidecar_uid, &err), 0);
  cr_assert_eq(ce_nf_parse_port("5353", &cfg.dns_port, &err), 0);

  const char *v4 = rules(&cfg, CE_NF_IPV4);
  cr_assert_not_null(strstr(v4, "-A CONDUKT_NAT -m mark --mark 0xdeadbeef/0xffffffff -m owner --uid-owner 4242 "
                                "-j RETURN\n"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-A CONDUKT_NAT -m mark --mark 0xdeadbeef/0xffffffff -m owner --uid-owner 4242 "
                                "-j CONNMARK --set-xmark 0xdeadbeef/0xffffffff\n"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-A CONDUKT_NAT -p udp --dport 53 -m owner --uid-owner 4242 -j RETURN\n"
                                "-A CONDUKT_NAT -p tcp --dport 53 -m owner --uid-owner 4242 -j RETURN\n"
                                "-A CONDUKT_NAT -p udp --dport 53 -j REDIRECT --to-ports 5353\n"
                                "-A CONDUKT_NAT -p tcp --dport 53 -j REDIRECT --to-ports 5353\n"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-d 127.0.0.1/32 -p udp --dport 5353 -m conntrack --ctstate DNAT"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-m connmark --mark 0xdeadbeef/0xffffffff -m owner ! --socket-exists"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-A CONDUKT_NAT -p tcp -m multiport --dports 8080 -j REDIRECT --to-ports 8443\n"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-d 127.0.0.1/32 -p tcp --dport 8443 -m conntrack --ctstate DNAT"), "%s", v4);
  cr_assert_not_null(strstr(v4, "-A CONDUKT_FILTER -m mark --mark 0xdeadbeef/0xffffffff -m owner --uid-owner 4242 "
                                "-j ACCEPT\n"), "%s", v4);
  cr_assert_not_null(strstr(v4,
      "-A CONDUKT_FILTER -d 10.96.0.10/32 -p udp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"
      "-A CONDUKT_FILTER -d 10.96.0.10/32 -p tcp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"
      "-A CONDUKT_FILTER -p tcp -j REJECT"), "%s", v4);
  /* No rule opens anything on the mark alone, nor on the uid alone
   * beyond port 53 of the resolvers. */
  for (const char *l = v4; (l = strstr(l, "--mark 0xdeadbeef/0xffffffff -j")) != NULL; l++)
    cr_assert_fail("a rule on the mark alone: %s", v4);
  cr_assert_null(strstr(v4, "-A CONDUKT_FILTER -m owner"), "%s", v4);
  /* IPv6 resolvers never reach the IPv4 rules, nor the reverse. */
  cr_assert_null(strstr(v4, "fd00"), "%s", v4);

  const char *v6 = rules(&cfg, CE_NF_IPV6);
  cr_assert_null(strstr(v6, "10.96.0.10"), "%s", v6);
  cr_assert_not_null(strstr(v6,
      "-A CONDUKT_FILTER -d fd00::a/128 -p udp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"
      "-A CONDUKT_FILTER -d fe80::1/128 -o eth0 -p udp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"
      "-A CONDUKT_FILTER -d fd00::a/128 -p tcp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"
      "-A CONDUKT_FILTER -d fe80::1/128 -o eth0 -p tcp --dport 53 -m owner --uid-owner 4242 -j ACCEPT\n"), "%s", v6);
  cr_assert_not_null(strstr(v6, "-d ::1/128 -p tcp --dport 5353 -m conntrack --ctstate DNAT"), "%s", v6);
  cr_assert_not_null(strstr(v6, "-d ::1/128 -p tcp --dport 8443 -m conntrack --ctstate DNAT"), "%s", v6);
}

Test(nf_rules, dns_any_and_none) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("any", &cfg, &err), 0);
  cr_assert(cfg.dns_any);
  const char *v4 = rules(&cfg, CE_NF_IPV4);
  cr_assert_not_null(strstr(v4,
      "-A CONDUKT_FILTER -p udp --dport 53 -j ACCEPT\n"
      "-A CONDUKT_FILTER -p tcp --dport 53 -j ACCEPT\n"), "%s", v4);
  /* The escape hatch redirects nothing: no REDIRECT to the DNS port, no
   * rule for it, no uid rule for port 53. */
  cr_assert_null(strstr(v4, "15053"), "%s", v4);
  cr_assert_null(strstr(v4, "--dport 53 -m owner"), "%s", v4);
  const char *v6 = rules(&cfg, CE_NF_IPV6);
  cr_assert_not_null(strstr(v6, "-A CONDUKT_FILTER -p udp --dport 53 -j ACCEPT\n"), "%s", v6);
  cr_assert_null(strstr(v6, "15053"), "%s", v6);

  cr_assert_eq(ce_nf_parse_dns("none", &cfg, &err), 0);
  cr_assert_not(cfg.dns_any);
  cr_assert_eq(cfg.ndns, 0);
  cr_assert_str_eq(rules(&cfg, CE_NF_IPV4), V4_DEFAULT);
}

Test(nf_rules, ipv6_mode_and_kernel) {
  ce_nf_ipv6_mode_t m;
  ce_nf_error_t err;
  bool v6 = false;
  cr_assert_eq(ce_nf_parse_ipv6_mode("auto", &m, &err), 0);
  cr_assert_eq(m, CE_NF_IPV6_AUTO);
  cr_assert_eq(ce_nf_ipv6_wanted(m, true, &v6), 0);
  cr_assert(v6);
  cr_assert_eq(ce_nf_ipv6_wanted(m, false, &v6), 0);
  cr_assert_not(v6);

  cr_assert_eq(ce_nf_parse_ipv6_mode("on", &m, &err), 0);
  cr_assert_eq(ce_nf_ipv6_wanted(m, true, &v6), 0);
  cr_assert(v6);
  v6 = true;
  cr_assert_eq(ce_nf_ipv6_wanted(m, false, &v6), CE_EUNAVAIL);
  cr_assert(v6, "untouched on failure");

  cr_assert_eq(ce_nf_parse_ipv6_mode("off", &m, &err), 0);
  cr_assert_eq(ce_nf_ipv6_wanted(m, true, &v6), 0);
  cr_assert_not(v6);

  m = CE_NF_IPV6_ON;
  cr_assert_eq(ce_nf_parse_ipv6_mode("yes", &m, &err), CE_EINVAL);
  cr_assert_eq(m, CE_NF_IPV6_ON);
  cr_assert_str_eq(err.word, "yes");
  cr_assert_str_eq(err.what, "IPv6 mode");
}

Test(nf_rules, ports_good) {
  ce_nf_error_t err;
  uint16_t p = 7;
  cr_assert_eq(ce_nf_parse_port("1", &p, &err), 0);
  cr_assert_eq(p, 1);
  cr_assert_eq(ce_nf_parse_port("65535", &p, &err), 0);
  cr_assert_eq(p, 65535);

  ce_nf_config_t cfg;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_ports("443,80,8443", &cfg, &err), 0);
  cr_assert_eq(cfg.nports, 3);
  cr_assert_eq(cfg.ports[0], 443);
  cr_assert_eq(cfg.ports[2], 8443);
  cr_assert_eq(ce_nf_parse_ports("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", &cfg, &err), 0);
  cr_assert_eq(cfg.nports, 15);
}

Test(nf_rules, bad_ports_name_the_word) {
  static const char *const bad[] = {"0", "65536", "abc", "", "+80", " 80", "80 ",
                                    "-1", "123456", "0x50", "8o"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_nf_error_t err;
    uint16_t p = 7;
    cr_expect_eq(ce_nf_parse_port(bad[i], &p, &err), CE_EINVAL, "'%s'", bad[i]);
    cr_expect_eq(p, 7, "'%s' touched the output", bad[i]);
    cr_expect_str_eq(err.word, bad[i]);
    cr_expect_str_eq(err.what, "port");
  }

  static const struct {
    const char *list, *word, *what;
  } lists[] = {
      {"80,,443", "", "port"},
      {"80,443,", "", "port"},
      {"80,65536", "65536", "port"},
      {"80,abc", "abc", "port"},
      {"80,443,80", "80", "port"},
      {"", "", "port"},
      {"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
       "port list"},
  };
  for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
    ce_nf_config_t cfg;
    ce_nf_error_t err;
    ce_nf_config_init(&cfg);
    cr_expect_eq(ce_nf_parse_ports(lists[i].list, &cfg, &err), CE_EINVAL, "'%s'", lists[i].list);
    cr_expect_str_eq(err.word, lists[i].word, "'%s'", lists[i].list);
    cr_expect_str_eq(err.what, lists[i].what, "'%s'", lists[i].list);
    cr_expect_eq(cfg.nports, 2, "'%s' touched the config", lists[i].list);
  }
}

Test(nf_rules, marks) {
  static const struct {
    const char *s;
    uint32_t v;
  } good[] = {{"0x539", 0x539}, {"1337", 1337}, {"0XFFFFFFFF", 0xffffffffu},
              {"4294967295", 0xffffffffu}, {"1", 1}, {"0x00000001", 1}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    ce_nf_error_t err;
    uint32_t m = 0;
    cr_expect_eq(ce_nf_parse_mark(good[i].s, &m, &err), 0, "'%s'", good[i].s);
    cr_expect_eq(m, good[i].v, "'%s'", good[i].s);
  }
  static const char *const bad[] = {"0",   "0x0", "00",   "010",         "0x",
                                    "0x100000000", "4294967296", "junk", "-1",
                                    "1e3", "",    "0x53g", " 1",        "0x1/0xff"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_nf_error_t err;
    uint32_t m = 42;
    cr_expect_eq(ce_nf_parse_mark(bad[i], &m, &err), CE_EINVAL, "'%s'", bad[i]);
    cr_expect_eq(m, 42, "'%s' touched the output", bad[i]);
    cr_expect_str_eq(err.word, bad[i]);
    cr_expect_str_eq(err.what, "mark");
  }
  ce_nf_error_t err;
  uint32_t m;
  ce_nf_parse_mark("0x0", &m, &err);
  cr_assert_not_null(strstr(err.why, "every unmarked packet"), "%s", err.why);
}

Test(nf_rules, uids) {
  static const struct {
    const char *s;
    uint32_t v;
  } good[] = {{"1337", 1337}, {"1", 1}, {"4294967294", 4294967294u}, {"65534", 65534}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    ce_nf_error_t err;
    uint32_t u = 0;
    cr_expect_eq(ce_nf_parse_uid(good[i].s, &u, &err), 0, "'%s'", good[i].s);
    cr_expect_eq(u, good[i].v, "'%s'", good[i].s);
  }
  static const char *const bad[] = {"0", "00", "01337", "4294967295", "4294967296", "99999999999",
                                    "-1", "+1", "1337 ", "0x539", "", "root"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_nf_error_t err;
    uint32_t u = 42;
    cr_expect_eq(ce_nf_parse_uid(bad[i], &u, &err), CE_EINVAL, "'%s'", bad[i]);
    cr_expect_eq(u, 42, "'%s' touched the output", bad[i]);
    cr_expect_str_eq(err.word, bad[i]);
    cr_expect_str_eq(err.what, "uid");
  }
  ce_nf_error_t err;
  uint32_t u;
  ce_nf_parse_uid("0", &u, &err);
  cr_assert_not_null(strstr(err.why, "workspace may be root"), "%s", err.why);
}

/* Only neighbour discovery leaves among ICMPv6: no MLD type (130 query,
 * 131 and 143 reports, 132 done) has a rule, by number or by name. */
Test(nf_rules, no_mld_rule) {
  ce_nf_config_t cfg;
  ce_nf_config_init(&cfg);
  const char *v6 = rules(&cfg, CE_NF_IPV6);
  static const char *const mld[] = {"type 130", "type 131", "type 132", "type 143", "listener", "hl-eq 1 "};
  for (size_t i = 0; i < sizeof(mld) / sizeof(mld[0]); i++)
    cr_expect_null(strstr(v6, mld[i]), "%s in %s", mld[i], v6);
  size_t icmp = 0;
  for (const char *l = v6; (l = strstr(l, "-p ipv6-icmp")) != NULL; l++)
    icmp++;
  cr_assert_eq(icmp, 3, "NS, NA and RS only: %s", v6);
}

Test(nf_rules, dns_lists) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  char a[CE_NF_ADDR_TEXT_MAX + 1];
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("10.0.0.10,FD00:0:0::A,::ffff:192.0.2.1,10.0.0.10,"
                               "fe80::1%eth0,fe80::1%eth1",
                               &cfg, &err),
               0);
  /* The duplicate 10.0.0.10 is dropped; the same link-local address on
   * two interfaces is two resolvers. */
  cr_assert_eq(cfg.ndns, 5);
  const char *want[] = {"10.0.0.10", "fd00::a", "192.0.2.1", "fe80::1%eth0", "fe80::1%eth1"};
  for (size_t i = 0; i < 5; i++) {
    ce_nf_addr_format(&cfg.dns[i], a);
    cr_expect_str_eq(a, want[i]);
  }
  cr_assert_eq(cfg.dns[2].family, CE_NF_IPV4, "an IPv4-mapped address counts as IPv4");

  cr_assert_eq(ce_nf_parse_dns("1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,"
                               "1.1.1.8,1.1.1.1",
                               &cfg, &err),
               0);
  cr_assert_eq(cfg.ndns, 8);
}

Test(nf_rules, bad_dns_name_the_word) {
  static const struct {
    const char *list, *word;
  } bad[] = {
      {"dns.google", "dns.google"},
      {"10.0.0.256", "10.0.0.256"},
      {"010.0.0.1", "010.0.0.1"},   /* octal or decimal? refused */
      {"10.1", "10.1"},             /* inet_aton shorthand: only in resolv.conf */
      {"10.0.0.1,", ""},
      {",10.0.0.1", ""},
      {"10.0.0.1 ", "10.0.0.1 "},
      {"fe80::1%", "fe80::1%"},
      {"fe80::1%eth+", "fe80::1%eth+"},     /* '+' is an iptables wildcard */
      {"fe80::1%2", "fe80::1%2"},           /* an index, not a name */
      {"fe80::1%abcdefghijklmnop", "fe80::1%abcdefghijklmnop"},
      {"fe80::1%eth 0", "fe80::1%eth 0"},
      {"fe80::1%..", "fe80::1%.."},
      {"10.0.0.1%eth0", "10.0.0.1%eth0"},
      {"::ffff:10.0.0.1%eth0", "::ffff:10.0.0.1%eth0"},
      {"10.0.0.1,any", "any"},
      {"none,10.0.0.1", "none"},
      {"10.0.0.0/8", "10.0.0.0/8"},
      {"1::2::3", "1::2::3"},
      {"\x1b[31m", "\\x1b[31m"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ce_nf_config_t cfg;
    ce_nf_error_t err;
    ce_nf_config_init(&cfg);
    cfg.ndns = 1;
    cr_expect_eq(ce_nf_parse_dns(bad[i].list, &cfg, &err), CE_EINVAL, "'%s'", bad[i].list);
    cr_expect_str_eq(err.word, bad[i].word, "'%s'", bad[i].list);
    cr_expect_str_eq(err.what, "resolver address", "'%s'", bad[i].list);
    cr_expect_eq(cfg.ndns, 1, "'%s' touched the config", bad[i].list);
  }
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,"
                               "1.1.1.8,1.1.1.9",
                               &cfg, &err),
               CE_EINVAL);
  cr_assert_str_eq(err.what, "resolver list");
}

typedef struct {
  char log[2048];
} skips_t;

static void on_skip(void *ctx, size_t line, const char *word, const char *why) {
  skips_t *s = ctx;
  size_t n = strlen(s->log);
  snprintf(s->log + n, sizeof(s->log) - n, "%zu:%s;", line, word);
  cr_assert_not_null(why);
}

static void resolv(const char *conf, ce_nf_config_t *cfg, skips_t *skips) {
  ce_nf_config_init(cfg);
  memset(skips, 0, sizeof(*skips));
  cr_assert_eq(ce_nf_parse_resolv_conf(conf, strlen(conf), cfg, on_skip, skips), 0);
}

static void expect_dns(const ce_nf_config_t *cfg, const char *const *want, size_t n) {
  cr_assert_eq(cfg->ndns, n, "got %zu resolvers", cfg->ndns);
  for (size_t i = 0; i < n; i++) {
    char a[CE_NF_ADDR_TEXT_MAX + 1];
    ce_nf_addr_format(&cfg->dns[i], a);
    cr_expect_str_eq(a, want[i]);
  }
}

Test(nf_rules, resolv_conf_like_res_init) {
  ce_nf_config_t cfg;
  skips_t s;
  resolv("# generated by kubelet\n"
         "; also a comment\n"
         "search default.svc.cluster.local svc.cluster.local\n"
         "#nameserver 9.9.9.9\n"
         "  nameserver 8.8.8.8\n"          /* not at the line start: ignored */
         "nameservers 8.8.4.4\n"           /* another keyword */
         "nameserver\t10.96.0.10 # cluster DNS\n"
         "nameserver fd00::a;comment\n"
         "options ndots:5\n"
         "nameserver fe80::1%eth0\r\n",
         &cfg, &s);
  expect_dns(&cfg, (const char *const[]){"10.96.0.10", "fd00::a", "fe80::1%eth0"}, 3);
  cr_assert_str_empty(s.log);
  cr_assert_eq(cfg.dns[2].family, CE_NF_IPV6);
  cr_assert_str_eq(cfg.dns[2].zone, "eth0");
}

Test(nf_rules, resolv_conf_skips_what_libc_skips) {
  ce_nf_config_t cfg;
  skips_t s;
  resolv("nameserver dns.google\n"    /* not an address: skipped, not counted */
         "nameserver 10.1\n"          /* inet_aton: 10.0.0.1 */
         "nameserver fe80::1%2\n"     /* numeric zone: we cannot name it */
         "nameserver\n"               /* no blank after the keyword */
         "nameserver \n"              /* no address */
         "nameserver ::ffff:192.0.2.7\n"
         "nameserver 10.1\n"          /* a repeat still counts toward three */
         "nameserver 1.1.1.1\n"       /* the fourth: never queried */
         "nameserver 1.0.0.1\n",
         &cfg, &s);
  expect_dns(&cfg, (const char *const[]){"10.0.0.1", "192.0.2.7"}, 2);
  cr_assert_str_eq(s.log, "1:dns.google;3:fe80::1%2;5:;8:1.1.1.1;9:1.0.0.1;");
}

Test(nf_rules, resolv_conf_empty_or_without_nameservers) {
  ce_nf_config_t cfg;
  skips_t s;
  resolv("", &cfg, &s);
  cr_assert_eq(cfg.ndns, 0);
  resolv("search example.com\noptions edns0", &cfg, &s);
  cr_assert_eq(cfg.ndns, 0);
  cr_assert_not(cfg.dns_any);
  /* No trailing newline, and not NUL-terminated: the length is what counts. */
  const char conf[] = "nameserver 192.0.2.53XXXX";
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_resolv_conf(conf, strlen(conf) - 4, &cfg, NULL, NULL), 0);
  expect_dns(&cfg, (const char *const[]){"192.0.2.53"}, 1);
}

Test(nf_rules, resolv_conf_replaces_any) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("any", &cfg, &err), 0);
  const char conf[] = "nameserver 192.0.2.53\n";
  cr_assert_eq(ce_nf_parse_resolv_conf(conf, strlen(conf), &cfg, NULL, NULL), 0);
  cr_assert_not(cfg.dns_any);
}

Test(nf_rules, jumps_flush_delete_text) {
  size_t len;
  cr_assert_eq(ce_nf_jumps_text(3, text, sizeof(text), &len), 0);
  cr_assert_str_eq(text, "*nat\n-I OUTPUT 1 -j CONDUKT_NAT\nCOMMIT\n"
                         "*filter\n-I OUTPUT 1 -j CONDUKT_FILTER\nCOMMIT\n");
  cr_assert_eq(ce_nf_jumps_text(2, text, sizeof(text), &len), 0);
  cr_assert_str_eq(text, "*filter\n-I OUTPUT 1 -j CONDUKT_FILTER\nCOMMIT\n");
  cr_assert_eq(ce_nf_jumps_text(0, text, sizeof(text), &len), 0);
  cr_assert_str_eq(text, "");
  cr_assert_eq(len, 0);

  cr_assert_eq(ce_nf_flush_text(text, sizeof(text), &len), 0);
  cr_assert_str_eq(text, "*nat\n:CONDUKT_NAT - [0:0]\nCOMMIT\n"
                         "*filter\n:CONDUKT_FILTER - [0:0]\nCOMMIT\n");
  cr_assert_eq(ce_nf_delete_text(text, sizeof(text), &len), 0);
  cr_assert_str_eq(text, "*nat\n:CONDUKT_NAT - [0:0]\n-X CONDUKT_NAT\nCOMMIT\n"
                         "*filter\n:CONDUKT_FILTER - [0:0]\n-X CONDUKT_FILTER\nCOMMIT\n");
}

Test(nf_rules, the_largest_config_fits_and_small_buffers_fail) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_ports("65535,65534,65533,65532,65531,65530,65529,65528,65527,"
                                 "65526,65525,65524,65523,65522,65521",
                                 &cfg, &err),
               0);
  cr_assert_eq(ce_nf_parse_mark("0xffffffff", &cfg.mark, &err), 0);
  cr_assert_eq(ce_nf_parse_dns("fe80:1:2:3:4:5:6:1%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:2%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:3%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:4%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:5%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:6%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:7%abcdefghijklmno,"
                               "fe80:1:2:3:4:5:6:8%abcdefghijklmno",
                               &cfg, &err),
               0, "%s: %s", err.word, err.why);
  size_t len;
  cr_assert_eq(ce_nf_rules_text(&cfg, CE_NF_IPV6, text, sizeof(text), &len), 0);
  cr_assert_lt(len, sizeof(text) / 2, "the limit leaves room to spare: %zu", len);

  char small[64];
  cr_assert_eq(ce_nf_rules_text(&cfg, CE_NF_IPV4, small, sizeof(small), &len), CE_ETOOBIG);
  cr_assert_lt(strlen(small), sizeof(small));
  cr_assert_eq(ce_nf_rules_text(&cfg, CE_NF_IPV4, small, 0, &len), CE_ETOOBIG);
  cr_assert_eq(ce_nf_flush_text(small, 10, &len), CE_ETOOBIG);
}

Test(nf_rules, error_words_are_sanitised) {
  ce_nf_error_t err;
  uint16_t p;
  cr_assert_eq(ce_nf_parse_port("\x1b]0;pwn\x07", &p, &err), CE_EINVAL);
  cr_assert_null(strchr(err.word, '\x1b'));
  cr_assert_str_eq(err.word, "\\x1b]0;pwn\\x07");
}
