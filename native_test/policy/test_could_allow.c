/* Tests for ce_policy_could_allow (c_src/policy/policy.c): the question the
 * workspace's DNS resolver asks of the policy (docs/dns.md). */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "policy/policy.h"

static ce_policy_t *load(const char *json) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  cr_assert_eq(ce_policy_load_buffer(json, strlen(json), &p, &err), 0, "%s", err.message);
  return p;
}

static ce_decision_t ask(const ce_policy_t *p, const char *name, ce_verdict_t *v) {
  return ce_policy_could_allow(p, name, strlen(name), v);
}

Test(policy_could_allow, rules_in_order_with_a_decide_rule) {
  ce_policy_t *p = load("{\"version\":1,\"default\":\"deny\",\"rules\":["
                        "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"*.evil.example\"]},"
                        "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"api.example.com\",\"*.cdn.example\"]},"
                        "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":1000,\"cache\":false}]}");
  ce_verdict_t v;
  cr_expect_eq(ask(p, "API.example.com.", &v), CE_DECISION_ALLOW);
  cr_expect_eq(v.rule_index, 1);
  cr_expect_eq(ask(p, "a.cdn.example", &v), CE_DECISION_ALLOW);
  cr_expect_eq(ask(p, "secret.evil.example", &v), CE_DECISION_DENY);
  cr_expect_eq(v.reason, CE_REASON_DENIED_BY_RULE);
  cr_expect_eq(v.rule_index, 0);
  cr_expect_eq(ask(p, "other.example", &v), CE_DECISION_DECIDE);
  cr_expect_eq(v.rule_index, 2);
  ce_policy_free(p);
}

Test(policy_could_allow, default_deny_and_allow) {
  ce_policy_t *p = load("{\"version\":1,\"default\":\"deny\",\"rules\":["
                        "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"ok.example\"]}]}");
  ce_verdict_t v;
  cr_expect_eq(ask(p, "ok.example", &v), CE_DECISION_ALLOW);
  cr_expect_eq(ask(p, "x.ok.example", &v), CE_DECISION_DENY);
  cr_expect_eq(v.reason, CE_REASON_DEFAULT_DENY);
  cr_expect_eq(v.rule_index, -1);
  ce_policy_free(p);
  p = load("{\"version\":1,\"default\":\"allow\",\"rules\":[]}");
  cr_expect_eq(ask(p, "anything.example", &v), CE_DECISION_ALLOW);
  ce_policy_free(p);
}

Test(policy_could_allow, literals_ports_and_junk_are_no_names) {
  ce_policy_t *p = load("{\"version\":1,\"default\":\"allow\",\"rules\":["
                        "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"10.0.0.1\"]}]}");
  ce_verdict_t v;
  static const char *const junk[] = {"10.0.0.1", "::1", "example.com:53", "[::1]", "a..b", ""};
  for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
    cr_expect_eq(ask(p, junk[i], &v), CE_DECISION_DENY, "%s", junk[i]);
    cr_expect_eq(v.reason, CE_REASON_INVALID_HOST, "%s", junk[i]);
  }
  ce_policy_free(p);
}
