/* Allocation-failure tests for c_src/policy/policy.c: every allocation of
 * a load fails in turn, and the load must report CE_ENOMEM, leave *out
 * untouched and free what it built (LSan checks at exit). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "policy/policy.h"
#include "support/failalloc.h"

static const char doc[] =
    "{\"version\":1,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"api.example.com\",\"*.example.org\","
    "\"10.0.0.1\",\"[2001:db8::1]\",\"b\\u00fccher.example\",\"a-rather-long-name-that-makes-the-arena-grow.example.com\"]},"
    "{\"index\":1,\"kind\":\"deny\",\"hosts\":[\"evil.example\"]},"
    "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":500,\"cache\":true}]}";

/* Version 2: entry objects whose methods and paths fill the text table
 * past its first capacity (16). */
static const char doc_v2[] =
    "{\"version\":2,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"allow\",\"hosts\":[{\"host\":\"api.example.com\","
    "\"methods\":[\"GET\",\"HEAD\",\"OPTIONS\",\"PROPFIND\",\"M-SEARCH\"],"
    "\"paths\":[\"/a/**\",\"/b/*/c\",\"/%64/e\",\"/f\",\"/g\",\"/h\",\"/i\",\"/j\",\"/k\",\"/l\",\"/m\","
    "\"/n\",\"/o\",\"/p\"]},\"b.example\"]},"
    "{\"index\":1,\"kind\":\"deny\",\"hosts\":[{\"host\":\"*.example.org\",\"paths\":[\"/admin/**\"]}]},"
    "{\"index\":2,\"kind\":\"allow\",\"hosts\":[\"*.example.org\"]}]}";

static void expect_nomem(int rc, size_t n) {
  cr_assert_eq(rc, CE_ENOMEM, "allocation %zu failed: %s", n, ce_err_name(rc));
}

static void load_buffer_loop(const char *d, bool from) {
  size_t n;
  for (n = 0;; n++) {
    ce_policy_t *p = (ce_policy_t *)0x1;
    ce_policy_error_t err;
    if (from)
      ce_failalloc_arm_from(n);
    else
      ce_failalloc_arm(n);
    int rc = ce_policy_load_buffer(d, strlen(d), &p, &err);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, 0, "%s", err.message);
      cr_assert_eq(ce_policy_rule_count(p), 3);
      ce_verdict_t v;
      cr_assert_eq(ce_policy_eval_request(p, "api.example.com", 15, "HEAD", 4, "/d/e", 4, &v), 0);
      cr_assert_eq(v.decision, CE_DECISION_ALLOW);
      ce_policy_free(p);
      break;
    }
    if (rc == 0) {
      /* A failure that was absorbed must not change the result. */
      cr_assert_eq(ce_policy_rule_count(p), 3, "allocation %zu", n);
      ce_policy_free(p);
      continue;
    }
    expect_nomem(rc, n);
    cr_assert_eq(err.code, rc);
    cr_assert_eq(p, (ce_policy_t *)0x1, "*out written on failure");
  }
  cr_assert_gt(n, 5, "the load made only %zu allocations", n);
}

Test(policy_failalloc, load_buffer_each_allocation) { load_buffer_loop(doc, false); }
Test(policy_failalloc, load_buffer_from_each_allocation) { load_buffer_loop(doc, true); }
Test(policy_failalloc, load_v2_each_allocation) { load_buffer_loop(doc_v2, false); }
Test(policy_failalloc, load_v2_from_each_allocation) { load_buffer_loop(doc_v2, true); }

Test(policy_failalloc, load_file_each_allocation) {
  char path[] = "/tmp/ce-policy-failalloc-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  fputs(doc, f);
  fclose(f);
  for (size_t n = 0;; n++) {
    ce_policy_t *p = (ce_policy_t *)0x1;
    ce_policy_error_t err;
    ce_failalloc_arm(n);
    int rc = ce_policy_load_file(path, &p, &err);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, 0, "%s", err.message);
      ce_policy_free(p);
      break;
    }
    if (rc == 0) {
      ce_policy_free(p);
      continue;
    }
    expect_nomem(rc, n);
    cr_assert_eq(p, (ce_policy_t *)0x1);
  }
  unlink(path);
}

Test(policy_failalloc, eval_each_allocation) {
  ce_policy_t *p;
  cr_assert_eq(ce_policy_load_buffer(doc, strlen(doc), &p, NULL), 0);
  for (size_t n = 0;; n++) {
    ce_verdict_t v;
    ce_failalloc_arm(n);
    int rc = ce_policy_eval_host(p, "B\xc3\x9c" "CHER.example", 15, &v);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, 0);
      cr_assert_eq(v.decision, CE_DECISION_ALLOW);
      break;
    }
    if (rc == 0)
      continue;
    cr_assert_eq(rc, CE_ENOMEM);
    /* policy.h: a caller that ignores the code fails closed. */
    cr_assert_eq(v.decision, CE_DECISION_DENY);
    cr_assert_eq(v.reason, CE_REASON_INVALID_HOST);
  }
  ce_policy_free(p);
}
