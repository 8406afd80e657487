/* Allocation-failure tests for c_src/dns: every allocation of a hosts
 * load, a stub, a query or lookup, and a server start fails in turn. Each
 * must report CE_ENOMEM with nothing left behind, or (an allocation of a
 * query's later attempt) still end in exactly one callback; LSan checks at
 * exit that nothing leaked. */
#include <criterion/criterion.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "dns/fake_upstream.h"
#include "dns/hosts.h"
#include "dns/server.h"
#include "dns/stub.h"
#include "policy/policy.h"
#include "support/failalloc.h"

static void on_query(void *data, int status, const ce_dns_result_t *res) {
  (void)status;
  (void)res;
  (*(int *)data)++;
}

static void on_addrs(void *data, int status, const ce_dns_addrs_t *a) {
  (void)status;
  (void)a;
  (*(int *)data)++;
}

static void pump_until(uv_loop_t *loop, const int *calls, int want) {
  uint64_t end = uv_hrtime() + 5000u * 1000000u;
  while (*calls < want && uv_hrtime() < end) {
    uv_run(loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(*calls, want);
}

static void drain(uv_loop_t *loop) {
  for (int i = 0; i < 50; i++) {
    uv_run(loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(uv_loop_close(loop), 0, "handles left on the loop");
}

Test(dns_failalloc, hosts_load) {
  const char text[] = "10.0.0.5 a.test b.test\nfd00::1 a.test\n";
  for (size_t n = 0;; n++) {
    ce_hosts_t *h = (ce_hosts_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce_hosts_load_buffer(text, strlen(text), &h, NULL, 0);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      ce_hosts_free(h);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu", n);
    cr_assert_eq(h, (ce_hosts_t *)0x1, "untouched on failure");
  }
}

Test(dns_failalloc, stub_queries_and_lookups) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  fake_upstream_t fake;
  fake_start(&loop, &fake, FAKE_ANSWER);
  ce_dns_stub_opts_t o;
  memset(&o, 0, sizeof(o));
  o.upstreams[0] = fake.addr;
  o.upstream_count = 1;
  o.attempt_ms = 50;
  o.deadline_ms = 2000;
  for (size_t n = 0;; n++) {
    ce_dns_stub_t *s = (ce_dns_stub_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce_dns_stub_new(&loop, &o, &s);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      ce_dns_stub_close(s);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM);
    cr_assert_eq(s, (ce_dns_stub_t *)0x1);
  }
  ce_dns_stub_t *s = NULL;
  cr_assert_eq(ce_dns_stub_new(&loop, &o, &s), CE_OK);
  /* A query and a lookup: a failure while starting is CE_ENOMEM with no
   * callback; one in a later step (an attempt's transport) is retried
   * by the next attempt, and the callback still comes once. */
  for (int kind = 0; kind < 2; kind++) {
    for (size_t n = 0;; n++) {
      int calls = 0;
      ce_failalloc_arm(n);
      int rc = kind == 0 ? ce_dns_stub_query(s, "a.test", 6, CE_DNS_TYPE_A, on_query, &calls)
                         : ce_dns_stub_lookup(s, "a.test", 80, on_addrs, &calls);
      bool failed_at_start = ce_failalloc_failures() > 0;
      if (rc != CE_OK) {
        ce_failalloc_disarm();
        cr_assert(failed_at_start);
        cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
        continue;
      }
      /* Later allocations (inside the loop) may fail too, once. */
      uint64_t end = uv_hrtime() + 50u * 1000000u;
      while (uv_hrtime() < end && calls == 0)
        uv_run(&loop, UV_RUN_NOWAIT);
      ce_failalloc_disarm();
      bool any = ce_failalloc_failures() > 0;
      pump_until(&loop, &calls, 1);
      if (!any)
        break;
    }
  }
  ce_dns_stub_close(s);
  fake_stop(&fake);
  drain(&loop);
}

Test(dns_failalloc, server_start) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ce_dns_stub_opts_t so;
  memset(&so, 0, sizeof(so));
  ce_dns_stub_t *stub = NULL;
  cr_assert_eq(ce_dns_stub_new(&loop, &so, &stub), CE_OK);
  const char doc[] = "{\"version\":1,\"default\":\"deny\",\"rules\":[]}";
  ce_policy_t *policy = NULL;
  cr_assert_eq(ce_policy_load_buffer(doc, strlen(doc), &policy, NULL), 0);
  uint64_t id = 0;
  static const char *const listen[] = {"127.0.0.1:0"};
  ce_dns_server_opts_t o = {.listen = listen, .listen_count = 1, .policy = policy, .stub = stub, .next_id = &id};
  for (size_t n = 0;; n++) {
    ce_dns_server_t *srv = (ce_dns_server_t *)0x1;
    char e[128];
    ce_failalloc_arm(n);
    int rc = ce_dns_server_start(&loop, &o, &srv, e, sizeof(e));
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      if (rc == CE_EIO)
        continue; /* the port was taken for TCP: another try */
      cr_assert_eq(rc, CE_OK, "%s", e);
      ce_dns_server_close(srv);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM);
    cr_assert_eq(srv, (ce_dns_server_t *)0x1);
  }
  ce_dns_stub_close(stub);
  drain(&loop);
  ce_policy_free(policy);
}
