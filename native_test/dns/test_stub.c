/* Tests for c_src/dns/stub.c over real sockets on loopback: a fake
 * upstream (fake_upstream.c) on the same loop, which the loop pumps in
 * small steps under a deadline (so a failing test cannot hang). Each test
 * closes the stub and checks that uv_loop_close() finds nothing left. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "dns/fake_upstream.h"
#include "dns/stub.h"

#define WAIT_MS 5000

static uv_loop_t loop;
static ce_dns_stub_t *stub;
static fake_upstream_t fakes[2];
static size_t nfakes;

typedef struct {
  int calls;
  int status;
  ce_dns_result_t res;
  ce_dns_addrs_t addrs;
} got_t;

static void setup(void) {
  alarm(60);
  cr_assert_eq(uv_loop_init(&loop), 0);
  stub = NULL;
  nfakes = 0;
}

static void teardown(void) {
  for (size_t i = 0; i < nfakes; i++)
    fake_stop(&fakes[i]);
  if (stub != NULL)
    ce_dns_stub_close(stub);
  for (int i = 0; i < 50; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  cr_expect_eq(uv_loop_close(&loop), 0, "handles left on the loop");
}

TestSuite(dns_stub, .init = setup, .fini = teardown);

static void pump_until(const int *flag, int want) {
  uint64_t end = uv_hrtime() + (uint64_t)WAIT_MS * 1000000u;
  while (*flag < want && uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(*flag, want, "no answer in time");
}

static void on_query(void *data, int status, const ce_dns_result_t *res) {
  got_t *g = data;
  g->calls++;
  g->status = status;
  if (res != NULL)
    g->res = *res;
}

static void on_addrs(void *data, int status, const ce_dns_addrs_t *a) {
  got_t *g = data;
  g->calls++;
  g->status = status;
  g->addrs = *a;
}

/* Asks one query and waits for its callback. */
static got_t ask(const char *name, uint16_t type) {
  got_t g = {0};
  cr_assert_eq(ce_dns_stub_query(stub, name, strlen(name), type, on_query, &g), CE_OK);
  cr_expect_eq(g.calls, 0, "never from within the call");
  pump_until(&g.calls, 1);
  return g;
}

/* Looks one host up and waits for its callback. */
static got_t lookup(const char *host, uint16_t port) {
  got_t g = {0};
  cr_assert_eq(ce_dns_stub_lookup(stub, host, port, on_addrs, &g), CE_OK);
  pump_until(&g.calls, 1);
  return g;
}

/* A stub asking the fakes started with these modes, in order. */
static void start(const fake_mode_t *modes, size_t n, const ce_hosts_t *hosts, uint32_t attempt_ms) {
  ce_dns_stub_opts_t o;
  memset(&o, 0, sizeof(o));
  for (size_t i = 0; i < n; i++) {
    fake_start(&loop, &fakes[i], modes[i]);
    o.upstreams[i] = fakes[i].addr;
  }
  nfakes = n;
  o.upstream_count = n;
  o.hosts = hosts;
  o.attempt_ms = attempt_ms;
  o.deadline_ms = attempt_ms * 4;
  cr_assert_eq(ce_dns_stub_new(&loop, &o, &stub), CE_OK);
}

Test(dns_stub, answers_a_and_aaaa) {
  fake_mode_t m[] = {FAKE_ANSWER};
  start(m, 1, NULL, 1000);
  got_t g = ask("Www.Example.test.", CE_DNS_TYPE_A);
  cr_assert_eq(g.status, CE_OK);
  cr_expect_eq(g.res.rcode, CE_DNS_RCODE_NOERROR);
  cr_assert_eq(g.res.count, 1);
  cr_expect_eq(memcmp(g.res.rrs[0].addr, "\xc0\x00\x02\x01", 4), 0);
  cr_expect_str_eq(fakes[0].last_name, "www.example.test");
  got_t l = lookup("www.example.test", 443);
  cr_assert_eq(l.status, CE_OK);
  cr_assert_eq(l.addrs.count, 2, "A then AAAA");
  cr_expect_eq(l.addrs.addrs[0].ss_family, AF_INET);
  cr_expect_eq(ntohs(((struct sockaddr_in *)&l.addrs.addrs[0])->sin_port), 443);
  cr_expect_eq(l.addrs.addrs[1].ss_family, AF_INET6);
  cr_expect_eq(ce_dns_stub_inflight(stub), 0);
}

Test(dns_stub, forged_answers_are_dropped) {
  fake_mode_t m[] = {FAKE_FORGED_FIRST};
  start(m, 1, NULL, 1000);
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_assert_eq(g.status, CE_OK);
  cr_expect_eq(fakes[0].udp_queries, 1, "the forged ones did not end the attempt");
  cr_assert_eq(g.res.count, 1);
  cr_expect_eq(g.res.rrs[0].type, CE_DNS_TYPE_A);
}

Test(dns_stub, truncated_goes_to_tcp) {
  fake_mode_t m[] = {FAKE_TRUNCATE};
  start(m, 1, NULL, 1000);
  got_t g = ask("big.test", CE_DNS_TYPE_AAAA);
  cr_assert_eq(g.status, CE_OK);
  cr_expect_eq(fakes[0].udp_queries, 1);
  cr_expect_eq(fakes[0].tcp_queries, 1);
  cr_assert_eq(g.res.count, 1);
  cr_expect_eq(g.res.rrs[0].type, CE_DNS_TYPE_AAAA);
}

Test(dns_stub, servfail_moves_to_the_next_upstream) {
  fake_mode_t m[] = {FAKE_SERVFAIL, FAKE_ANSWER};
  start(m, 2, NULL, 1000);
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_assert_eq(g.status, CE_OK);
  cr_expect_eq(fakes[0].udp_queries, 1);
  cr_expect_eq(fakes[1].udp_queries, 1);
}

Test(dns_stub, every_upstream_failing_is_unavail) {
  fake_mode_t m[] = {FAKE_SERVFAIL};
  start(m, 1, NULL, 1000);
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_expect_eq(g.status, CE_EUNAVAIL);
  cr_expect_eq(fakes[0].udp_queries, 2, "each upstream twice");
}

Test(dns_stub, silence_times_out) {
  fake_mode_t m[] = {FAKE_SILENT};
  start(m, 1, NULL, 100);
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_expect_eq(g.status, CE_ETIMEDOUT);
  cr_expect_eq(fakes[0].udp_queries, 2);
}

Test(dns_stub, refused_port_is_unavail) {
  /* A port nobody listens on: ICMP port unreachable, ECONNREFUSED. */
  fake_mode_t m[] = {FAKE_ANSWER};
  start(m, 1, NULL, 1000);
  uv_close((uv_handle_t *)&fakes[0].udp, NULL);
  uv_close((uv_handle_t *)&fakes[0].tcp, NULL);
  nfakes = 0;
  for (int i = 0; i < 5; i++)
    uv_run(&loop, UV_RUN_NOWAIT); /* the sockets are closed once their callbacks ran */
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_expect_eq(g.status, CE_EUNAVAIL);
}

Test(dns_stub, cname_chain_followed_and_bounded) {
  fake_mode_t m[] = {FAKE_ANSWER};
  start(m, 1, NULL, 1000);
  got_t g = ask("cname.test", CE_DNS_TYPE_A);
  cr_assert_eq(g.status, CE_OK);
  cr_assert_eq(g.res.count, 2, "the CNAME and the target's A; the record off the chain is ignored");
  cr_expect_eq(g.res.rrs[0].type, CE_DNS_TYPE_CNAME);
  cr_expect_str_eq(g.res.rrs[1].name, "target.test");
  got_t l = ask("long.test", CE_DNS_TYPE_A);
  cr_expect_eq(l.status, CE_EPROTO);
  got_t lp = ask("loop.test", CE_DNS_TYPE_A);
  cr_expect_eq(lp.status, CE_EPROTO);
}

Test(dns_stub, nxdomain_and_nodata) {
  fake_mode_t m[] = {FAKE_ANSWER};
  start(m, 1, NULL, 1000);
  got_t g = ask("nx.test", CE_DNS_TYPE_A);
  cr_assert_eq(g.status, CE_OK);
  cr_expect_eq(g.res.rcode, CE_DNS_RCODE_NXDOMAIN);
  got_t l = lookup("nx.test", 80);
  cr_expect_eq(l.status, CE_ENOENT);
  got_t e = lookup("empty.test", 80);
  cr_expect_eq(e.status, CE_ENOENT);
}

Test(dns_stub, hosts_table_and_literals_never_reach_upstream) {
  fake_mode_t m[] = {FAKE_ANSWER};
  ce_hosts_t *h = NULL;
  const char *text = "10.1.2.3 git.internal\nfd00::7 git.internal\n";
  cr_assert_eq(ce_hosts_load_buffer(text, strlen(text), &h, NULL, 0), CE_OK);
  start(m, 1, h, 1000);
  got_t g = lookup("GIT.internal", 8080);
  cr_assert_eq(g.status, CE_OK);
  cr_assert_eq(g.addrs.count, 2);
  cr_expect_eq(ntohs(((struct sockaddr_in *)&g.addrs.addrs[0])->sin_port), 8080);
  got_t q = ask("git.internal", CE_DNS_TYPE_AAAA);
  cr_assert_eq(q.status, CE_OK);
  cr_expect(q.res.from_hosts);
  cr_assert_eq(q.res.count, 1);
  cr_expect_eq(q.res.rrs[0].addr[0], 0xfd);
  got_t v4 = {0}, v6 = {0};
  cr_assert_eq(ce_dns_stub_lookup(stub, "192.0.2.9", 80, on_addrs, &v4), CE_OK);
  cr_assert_eq(ce_dns_stub_lookup(stub, "[2001:db8::9]", 80, on_addrs, &v6), CE_OK);
  pump_until(&v4.calls, 1);
  pump_until(&v6.calls, 1);
  cr_expect_eq(v4.addrs.count, 1);
  cr_expect_eq(v6.addrs.addrs[0].ss_family, AF_INET6);
  cr_expect_eq(fakes[0].udp_queries, 0);
  ce_dns_stub_close(stub);
  stub = NULL;
  for (int i = 0; i < 20; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  ce_hosts_free(h);
}

Test(dns_stub, no_upstream_is_unavail_and_bad_names_refused) {
  ce_dns_stub_opts_t o;
  memset(&o, 0, sizeof(o));
  cr_assert_eq(ce_dns_stub_new(&loop, &o, &stub), CE_OK);
  got_t g = ask("a.test", CE_DNS_TYPE_A);
  cr_expect_eq(g.status, CE_EUNAVAIL);
  cr_expect_eq(ce_dns_stub_query(stub, "a..test", 7, CE_DNS_TYPE_A, on_query, &g), CE_EINVAL);
  o.upstream_count = 1;
  o.upstreams[0].ss_family = AF_UNIX;
  ce_dns_stub_t *bad = NULL;
  cr_expect_eq(ce_dns_stub_new(&loop, &o, &bad), CE_EINVAL);
}

Test(dns_stub, close_calls_every_pending_back) {
  fake_mode_t m[] = {FAKE_SILENT};
  start(m, 1, NULL, 1000);
  got_t g = {0}, l = {0}, lit = {0};
  cr_assert_eq(ce_dns_stub_query(stub, "a.test", 6, CE_DNS_TYPE_A, on_query, &g), CE_OK);
  cr_assert_eq(ce_dns_stub_lookup(stub, "b.test", 80, on_addrs, &l), CE_OK);
  cr_assert_eq(ce_dns_stub_lookup(stub, "192.0.2.1", 80, on_addrs, &lit), CE_OK);
  uv_run(&loop, UV_RUN_NOWAIT);
  ce_dns_stub_close(stub);
  stub = NULL;
  cr_expect_eq(g.calls, 1);
  cr_expect_eq(g.status, CE_ECLOSED);
  cr_expect_eq(l.calls, 1);
  cr_expect_eq(l.status, CE_ECLOSED);
  cr_expect_eq(lit.calls, 1);
}

Test(dns_stub, inflight_is_bounded) {
  fake_mode_t m[] = {FAKE_SILENT};
  start(m, 1, NULL, 1000);
  static got_t g[CE_DNS_STUB_MAX_INFLIGHT + 1];
  memset(g, 0, sizeof(g));
  for (unsigned i = 0; i < CE_DNS_STUB_MAX_INFLIGHT; i++)
    cr_assert_eq(ce_dns_stub_query(stub, "a.test", 6, CE_DNS_TYPE_A, on_query, &g[i]), CE_OK);
  cr_expect_eq(ce_dns_stub_query(stub, "a.test", 6, CE_DNS_TYPE_A, on_query, &g[CE_DNS_STUB_MAX_INFLIGHT]),
               CE_EAGAIN);
  ce_dns_stub_close(stub);
  stub = NULL;
  for (unsigned i = 0; i < CE_DNS_STUB_MAX_INFLIGHT; i++)
    cr_expect_eq(g[i].status, CE_ECLOSED);
}

Test(dns_stub, upstream_and_resolv_conf_parsing) {
  struct sockaddr_storage ss;
  cr_expect_eq(ce_dns_upstream_parse("10.96.0.10", &ss), CE_OK);
  cr_expect_eq(ntohs(((struct sockaddr_in *)&ss)->sin_port), 53);
  cr_expect_eq(ce_dns_upstream_parse("10.96.0.10:5353", &ss), CE_OK);
  cr_expect_eq(ntohs(((struct sockaddr_in *)&ss)->sin_port), 5353);
  cr_expect_eq(ce_dns_upstream_parse("fd00::10", &ss), CE_OK);
  cr_expect_eq(ss.ss_family, AF_INET6);
  cr_expect_eq(ce_dns_upstream_parse("[fd00::10]:54", &ss), CE_OK);
  cr_expect_eq(ce_dns_upstream_parse("dns.example", &ss), CE_EINVAL);
  cr_expect_eq(ce_dns_upstream_parse("10.0.0.1:0", &ss), CE_EINVAL);
  cr_expect_eq(ce_dns_upstream_parse("", &ss), CE_EINVAL);
  const char *conf = "# generated\nsearch default.svc.cluster.local\nnameserver 10.96.0.10\n"
                     "nameserver   fe80::1%eth0\n nameserver fd00::53 # v6\nnameserver 1.1.1.1\nnameserver 8.8.8.8\n"
                     "nameserver 9.9.9.9\noptions ndots:5\n";
  ce_dns_stub_opts_t o;
  memset(&o, 0, sizeof(o));
  cr_expect_eq(ce_dns_resolv_conf_parse(conf, strlen(conf), &o), 4, "the scoped one skipped, at most four");
  cr_expect_eq(o.upstreams[1].ss_family, AF_INET6);
}
