/* Tests for c_src/policy/policy.c: every refusal of the loader (with the
 * JSON path it names), file handling, limits, and evaluation per
 * docs/host-matching.md §5. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "policy/policy.h"

static const char *SEED =
    "{\"version\":1,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"*.internal.example.com\"]},"
    "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"api.github.com\",\"*.openai.com\","
    "\"10.0.0.1\",\"[2001:db8::1]\",\"**.cdn.example\",\"B\xc3\xbc" "cher.example\"]},"
    "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":5000,\"cache\":true}]}";

static const char *show_s(const char *s) { return s != NULL ? s : "null"; }

static ce_policy_t *load_ok(const char *doc) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
  cr_assert_eq(rc, 0, "load failed: %s (%s)", err.message, ce_err_name(rc));
  cr_assert_eq(err.code, 0);
  cr_assert_str_empty(err.message);
  cr_assert_not_null(p);
  return p;
}

static void load_fails(const char *doc, int code, const char *message) {
  ce_policy_t *p = (ce_policy_t *)0x1;
  ce_policy_error_t err;
  int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
  cr_expect_eq(rc, code, "doc %s: expected %s, got %s (%s)", doc, ce_err_name(code),
               ce_err_name(rc), err.message);
  cr_expect_eq(err.code, rc);
  cr_expect_str_eq(err.message, message, "doc %s", doc);
  cr_expect_eq(p, (ce_policy_t *)0x1, "*out must be untouched on failure");
}

/* Wraps one rule object into an otherwise valid document. */
static void rule_fails(const char *rule, int code, const char *message) {
  char doc[1024];
  snprintf(doc, sizeof(doc), "{\"version\":1,\"default\":\"allow\",\"rules\":[%s]}", rule);
  load_fails(doc, code, message);
}

Test(policy_load, seed_document) {
  ce_policy_t *p = load_ok(SEED);
  cr_assert_eq(ce_policy_default(p), CE_DECISION_DENY);
  cr_assert_eq(ce_policy_rule_count(p), 3);
  ce_rule_info_t r;
  cr_assert_eq(ce_policy_rule(p, 0, &r), 0);
  cr_assert_eq(r.kind, CE_RULE_DENY);
  cr_assert_eq(r.host_count, 1);
  cr_assert_eq(ce_policy_rule(p, 1, &r), 0);
  cr_assert_eq(r.kind, CE_RULE_ALLOW);
  cr_assert_eq(r.host_count, 6);
  cr_assert_eq(ce_policy_rule(p, 2, &r), 0);
  cr_assert_eq(r.kind, CE_RULE_DECIDE);
  cr_assert_eq(r.timeout_ms, 5000);
  cr_assert(r.cache);
  r.timeout_ms = 77;
  cr_assert_eq(ce_policy_rule(p, 3, &r), CE_EINVAL);
  cr_assert_eq(r.timeout_ms, 77);
  ce_policy_free(p);
}

Test(policy_load, minimal_documents) {
  ce_policy_t *p = load_ok("{\"version\":1,\"default\":\"allow\",\"rules\":[]}");
  cr_assert_eq(ce_policy_default(p), CE_DECISION_ALLOW);
  cr_assert_eq(ce_policy_rule_count(p), 0);
  ce_policy_free(p);
  /* Member order does not matter and whitespace is fine. */
  p = load_ok(" {\n\"rules\" : [ ] , \"default\":\"deny\", \"version\" : 1 }\n");
  ce_policy_free(p);
  ce_policy_free(NULL);
}

Test(policy_load, document_level_errors) {
  load_fails("[]", CE_EINVAL, "$: expected an object");
  load_fails("{}", CE_EINVAL, "$: missing member \"version\"");
  load_fails("{\"version\":\"1\"}", CE_EINVAL, "$.version: expected an integer");
  load_fails("{\"version\":1.0}", CE_EINVAL, "$.version: expected an integer");
  load_fails("{\"version\":1e0}", CE_EINVAL, "$.version: expected an integer");
  load_fails("{\"version\":true}", CE_EINVAL, "$.version: expected an integer");
  load_fails("{\"version\":null}", CE_EINVAL, "$.version: expected an integer");
  load_fails("{\"version\":4}", CE_EVERSION,
             "$.version: unsupported version 4 (this build reads versions 1 to 3)");
  load_fails("{\"version\":0,\"bogus\":1}", CE_EVERSION,
             "$.version: unsupported version 0 (this build reads versions 1 to 3)");
  load_fails("{\"version\":-1}", CE_EVERSION,
             "$.version: unsupported version -1 (this build reads versions 1 to 3)");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":[],\"extra\":0}",
             CE_EINVAL, "$.extra: unknown member");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":[],\"a b\":0}",
             CE_EINVAL, "$[\"a b\"]: unknown member");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":[],\"\\\"\":0}",
             CE_EINVAL, "$[\"\\\"\"]: unknown member");
  load_fails("{\"version\":1,\"rules\":[]}", CE_EINVAL,
             "$: missing member \"default\"");
  load_fails("{\"version\":1,\"default\":\"Deny\",\"rules\":[]}", CE_EINVAL,
             "$.default: expected \"allow\" or \"deny\"");
  load_fails("{\"version\":1,\"default\":\"decide\",\"rules\":[]}", CE_EINVAL,
             "$.default: expected \"allow\" or \"deny\"");
  load_fails("{\"version\":1,\"default\":false,\"rules\":[]}", CE_EINVAL,
             "$.default: expected \"allow\" or \"deny\"");
  load_fails("{\"version\":1,\"default\":\"deny\"}", CE_EINVAL,
             "$: missing member \"rules\"");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":{}}", CE_EINVAL,
             "$.rules: expected an array");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":null}", CE_EINVAL,
             "$.rules: expected an array");
}

Test(policy_load, rule_level_errors) {
  rule_fails("1", CE_EINVAL, "$.rules[0]: expected an object");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timout_ms\":5,\"cache\":true}",
             CE_EINVAL, "$.rules[0].timout_ms: unknown member");
  rule_fails("{\"kind\":\"decide\"}", CE_EINVAL, "$.rules[0]: missing member \"index\"");
  rule_fails("{\"index\":\"0\",\"kind\":\"decide\"}", CE_EINVAL,
             "$.rules[0].index: expected an integer");
  rule_fails("{\"index\":0.0,\"kind\":\"decide\"}", CE_EINVAL,
             "$.rules[0].index: expected an integer");
  rule_fails("{\"index\":false,\"kind\":\"decide\"}", CE_EINVAL,
             "$.rules[0].index: expected an integer");
  rule_fails("{\"index\":1,\"kind\":\"decide\"}", CE_EINVAL,
             "$.rules[0].index: must equal the rule's position 0, not 1");
  rule_fails("{\"index\":0}", CE_EINVAL, "$.rules[0]: missing member \"kind\"");
  rule_fails("{\"index\":0,\"kind\":\"Allow\"}", CE_EINVAL,
             "$.rules[0].kind: expected \"allow\", \"deny\" or \"decide\"");
  rule_fails("{\"index\":0,\"kind\":[\"allow\"]}", CE_EINVAL,
             "$.rules[0].kind: expected \"allow\", \"deny\" or \"decide\"");
  /* allow / deny rules. */
  rule_fails("{\"index\":0,\"kind\":\"allow\"}", CE_EINVAL,
             "$.rules[0]: missing member \"hosts\"");
  rule_fails("{\"index\":0,\"kind\":\"deny\",\"hosts\":[]}", CE_EINVAL,
             "$.rules[0].hosts: expected a non-empty array of strings");
  rule_fails("{\"index\":0,\"kind\":\"deny\",\"hosts\":\"a.com\"}", CE_EINVAL,
             "$.rules[0].hosts: expected a non-empty array of strings");
  rule_fails("{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"a.com\",7]}", CE_EINVAL,
             "$.rules[0].hosts[1]: expected a string");
  rule_fails("{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"a.com\"],\"timeout_ms\":5}",
             CE_EINVAL, "$.rules[0].timeout_ms: only a decide rule has this member");
  rule_fails("{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"a.com\"],\"cache\":true}",
             CE_EINVAL, "$.rules[0].cache: only a decide rule has this member");
  /* decide rules. */
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"hosts\":[\"a\"],\"timeout_ms\":5,"
             "\"cache\":true}",
             CE_EINVAL,
             "$.rules[0].hosts: a decide rule matches every request and has no hosts");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"cache\":true}", CE_EINVAL,
             "$.rules[0]: missing member \"timeout_ms\"");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":\"5\",\"cache\":true}",
             CE_EINVAL, "$.rules[0].timeout_ms: expected an integer");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5.5,\"cache\":true}",
             CE_EINVAL, "$.rules[0].timeout_ms: expected an integer");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":0,\"cache\":true}",
             CE_EINVAL, "$.rules[0].timeout_ms: must be between 1 and 3600000, not 0");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":3600001,\"cache\":true}",
             CE_EINVAL,
             "$.rules[0].timeout_ms: must be between 1 and 3600000, not 3600001");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":-5,\"cache\":true}",
             CE_EINVAL, "$.rules[0].timeout_ms: must be between 1 and 3600000, not -5");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5}", CE_EINVAL,
             "$.rules[0]: missing member \"cache\"");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":1}",
             CE_EINVAL, "$.rules[0].cache: expected true or false");
  rule_fails("{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":\"true\"}",
             CE_EINVAL, "$.rules[0].cache: expected true or false");

  /* Bounds that are fine. */
  ce_policy_t *p = load_ok(
      "{\"version\":1,\"default\":\"deny\",\"rules\":["
      "{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":1,\"cache\":false}]}");
  ce_rule_info_t r;
  cr_assert_eq(ce_policy_rule(p, 0, &r), 0);
  cr_assert_eq(r.timeout_ms, 1);
  cr_assert(!r.cache);
  ce_policy_free(p);
  p = load_ok("{\"version\":1,\"default\":\"deny\",\"rules\":["
              "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"a.com\"]},"
              "{\"index\":1,\"kind\":\"decide\",\"timeout_ms\":3600000,\"cache\":true}]}");
  cr_assert_eq(ce_policy_rule(p, 1, &r), 0);
  cr_assert_eq(r.timeout_ms, 3600000);
  cr_assert(r.cache);
  ce_policy_free(p);
}

/* A decide rule answers every request that reaches it: a rule after it
 * could never match and the document is refused, naming both. */
Test(policy_load, rules_after_a_decide_rule_are_unreachable) {
  static const char *const after[] = {
      "{\"index\":2,\"kind\":\"allow\",\"hosts\":[\"c.example\"]}",
      "{\"index\":2,\"kind\":\"deny\",\"hosts\":[\"**\"]}",
      "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true}",
  };
  for (size_t k = 0; k < sizeof(after) / sizeof(after[0]); k++) {
    char doc[512], want[256];
    const char *rule = after[k];
    snprintf(doc, sizeof(doc),
             "{\"version\":1,\"default\":\"deny\",\"rules\":["
             "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"b.example\"]},"
             "{\"index\":1,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true},%s]}",
             rule);
    snprintf(want, sizeof(want),
             "$.rules[2]: unreachable: rule 1 (decide) before it answers every request that "
             "reaches it, so this rule is never consulted; move it before rule 1, or remove it");
    load_fails(doc, CE_EINVAL, want);
  }
  /* The rule's own error comes first. */
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":["
             "{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true},"
             "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"10.0.0.0/8\"]}]}",
             CE_EINVAL,
             "$.rules[1].hosts[0]: bad pattern \"10.0.0.0/8\" (cidr): CIDR ranges are not host "
             "patterns; a rule names host names and single IP addresses, so list the addresses "
             "one by one (\"10.0.0.1\") or name the hosts (private ranges are refused anyway "
             "unless --allow-private covers them)");
  /* Last is fine, and so are rules before it. */
  ce_policy_t *p = load_ok("{\"version\":1,\"default\":\"allow\",\"rules\":["
                           "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"b.example\"]},"
                           "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"a.example\"]},"
                           "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true}]}");
  cr_assert_eq(ce_policy_rule_count(p), 3);
  ce_policy_free(p);
}

Test(policy_load, later_rules_name_their_index) {
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":["
             "{\"index\":0,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true},"
             "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"ok.com\",\"https://api.github.com\"]}]}",
             CE_EINVAL,
             "$.rules[1].hosts[1]: bad pattern \"https://api.github.com\" (scheme): "
             "write the host only, without \"://\"");
  load_fails("{\"version\":1,\"default\":\"deny\",\"rules\":["
             "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"a.com\"]},"
             "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"b.com\"]},"
             "{\"index\":1,\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true}]}",
             CE_EINVAL, "$.rules[2].index: must equal the rule's position 2, not 1");
}

Test(policy_load, every_pattern_code_surfaces) {
  static const struct {
    const char *json_pattern;
    ce_pattern_err_t code;
    const char *message;
  } cases[] = {
      {"\"\"", CE_PATTERN_EMPTY, "bad pattern \"\" (empty): a pattern cannot be empty"},
      {"\"https://x\"", CE_PATTERN_SCHEME,
       "bad pattern \"https://x\" (scheme): write the host only, without \"://\""},
      {"\"x/y\"", CE_PATTERN_PATH, NULL},
      {"\"10.0.0.0/8\"", CE_PATTERN_CIDR, NULL},
      {"\"[fd00::]/8\"", CE_PATTERN_CIDR, NULL},
      {"\"x:1\"", CE_PATTERN_PORT, NULL},
      {"\"***.x\"", CE_PATTERN_STAR_RUN, NULL},
      {"\"a..b\"", CE_PATTERN_EMPTY_LABEL, NULL},
      {"\"a@b\"", CE_PATTERN_BAD_CHAR, "bad pattern \"a@b\" (bad_char): a label may only "
                                       "contain letters, digits, \"-\", \"_\" and \"*\""},
      {"\"*\xc3\xbc\"", CE_PATTERN_WILDCARD_IDN, NULL},
      {"\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
       CE_PATTERN_LABEL_TOO_LONG, NULL},
      {"\"127.1\"", CE_PATTERN_BAD_IP, NULL},
      /* Control characters and quotes are escaped in the message. */
      {"\"a\\tb\\\"c\"", CE_PATTERN_BAD_CHAR,
       "bad pattern \"a\\x09b\\\"c\" (bad_char): a label may only contain letters, "
       "digits, \"-\", \"_\" and \"*\""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char doc[512];
    snprintf(doc, sizeof(doc),
             "{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,"
             "\"kind\":\"deny\",\"hosts\":[\"ok.com\",%s]}]}",
             cases[i].json_pattern);
    ce_policy_t *p = NULL;
    ce_policy_error_t err;
    int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
    cr_expect_eq(rc, CE_EINVAL, "%s", cases[i].json_pattern);
    cr_expect_eq(err.pattern_err, cases[i].code, "%s: %s", cases[i].json_pattern,
                 err.message);
    const char *prefix = "$.rules[0].hosts[1]: bad pattern ";
    cr_expect_eq(strncmp(err.message, prefix, strlen(prefix)), 0, "%s", err.message);
    char code[64];
    snprintf(code, sizeof(code), "(%s): ", ce_pattern_err_code(cases[i].code));
    cr_expect_not_null(strstr(err.message, code), "%s", err.message);
    if (cases[i].message != NULL)
      cr_expect_str_eq(err.message + strlen("$.rules[0].hosts[1]: "), cases[i].message);
    cr_expect_null(p);
  }
}

Test(policy_load, bad_utf8_and_long_patterns_are_quoted_safely) {
  /* JSON text must be UTF-8, so jansson refuses raw invalid bytes before
   * the pattern check; a bad_utf8 pattern can only come from the
   * normaliser itself (see test_host.c). */
  const char doc[] = "{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,"
                     "\"kind\":\"deny\",\"hosts\":[\"a\xff\"]}]}";
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  cr_expect_eq(ce_policy_load_buffer(doc, strlen(doc), &p, &err), CE_EPARSE);

  /* A 3000-byte pattern is cut in the message. */
  static char big[4096];
  int n = snprintf(big, sizeof(big),
                   "{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,"
                   "\"kind\":\"deny\",\"hosts\":[\"");
  memset(big + n, 'a', 3000);
  strcpy(big + n + 3000, "@\"]}]}");
  cr_expect_eq(ce_policy_load_buffer(big, strlen(big), &p, &err), CE_EINVAL);
  cr_expect_eq(err.pattern_err, CE_PATTERN_BAD_CHAR);
  cr_expect_not_null(strstr(err.message, "aaaa...\" (bad_char)"), "%s", err.message);
  cr_expect_lt(strlen(err.message), CE_POLICY_ERROR_MAX);

  /* A long unknown member name is cut too. */
  n = snprintf(big, sizeof(big), "{\"version\":1,\"");
  memset(big + n, 'k', 2000);
  strcpy(big + n + 2000, "\":1}");
  cr_expect_eq(ce_policy_load_buffer(big, strlen(big), &p, &err), CE_EINVAL);
  cr_expect_eq(strncmp(err.message, "$[\"kkkk", 7), 0, "%s", err.message);
  cr_expect_not_null(strstr(err.message, "...\"]: unknown member"), "%s", err.message);
}

Test(policy_load, json_syntax_and_duplicates) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  static const char *bad[] = {
      "",
      "{",
      "{\"version\":1,}",
      "{\"version\":1} trailing",
      "{\"version\":1,\"version\":1,\"default\":\"deny\",\"rules\":[]}",
      ("{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,\"index\":0,"
       "\"kind\":\"decide\",\"timeout_ms\":5,\"cache\":true}]}"),
      "{\"version\":1,\"default\":\"deny\\u0000\",\"rules\":[]}",
      "{\"version\":99999999999999999999999}",
      "1",
      "\"x\"",
      "null",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = ce_policy_load_buffer(bad[i], strlen(bad[i]), &p, &err);
    cr_expect_eq(rc, CE_EPARSE, "%s: %s", bad[i], err.message);
    cr_expect_eq(strncmp(err.message, "invalid JSON at line ", 21), 0, "%s", err.message);
    cr_expect_null(p);
  }
  const char *dup = bad[4];
  cr_assert_eq(ce_policy_load_buffer(dup, strlen(dup), &p, &err), CE_EPARSE);
  cr_expect_not_null(strstr(err.message, "duplicate object key"), "%s", err.message);
  /* An embedded NUL byte ends the JSON text early: refused. */
  const char nul[] = "{\"version\":1,\"default\":\"deny\",\"rules\":[]}\0junk";
  cr_expect_eq(ce_policy_load_buffer(nul, sizeof(nul) - 1, &p, &err), CE_EPARSE);
  /* jansson quotes raw input in its messages; ours stay one clean line. */
  static const char *raw[] = {"{\"a\":\"x\x01\n\x02\"}", "{\"a\":\"\xff\xfe\"}",
                              "{\"a\x1b[31m\":1}", "{\"a\":tru\x07e}"};
  for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
    cr_expect_eq(ce_policy_load_buffer(raw[i], strlen(raw[i]), &p, &err), CE_EPARSE);
    for (const unsigned char *c = (const unsigned char *)err.message; *c; c++)
      cr_expect(*c >= 0x20 && *c < 0x7f, "raw byte 0x%02x in: %s", *c, err.message);
  }
  /* A NULL err is allowed. */
  cr_expect_eq(ce_policy_load_buffer("{", 1, &p, NULL), CE_EPARSE);
}

Test(policy_load, size_limit_on_buffers) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  size_t n = CE_POLICY_MAX_BYTES + 1;
  char *doc = malloc(n);
  cr_assert_not_null(doc);
  /* A valid document padded with whitespace to exactly the limit loads. */
  const char *core = "{\"version\":1,\"default\":\"deny\",\"rules\":[]}";
  memset(doc, ' ', n);
  memcpy(doc, core, strlen(core));
  cr_expect_eq(ce_policy_load_buffer(doc, CE_POLICY_MAX_BYTES, &p, &err), 0, "%s",
               err.message);
  ce_policy_free(p);
  p = NULL;
  cr_expect_eq(ce_policy_load_buffer(doc, n, &p, &err), CE_ETOOBIG);
  cr_expect_str_eq(err.message, "the document is larger than 4 MiB (4194304 bytes)");
  cr_expect_null(p);
  free(doc);
}

/* Builds {"rules":[...]} with nrules rules (allow rules, the last one a
 * decide rule), or one deny rule with nhosts patterns. */
static char *build_doc(size_t nrules, size_t nhosts) {
  size_t cap = 64 + nrules * 80 + nhosts * 16;
  char *doc = malloc(cap);
  cr_assert_not_null(doc);
  size_t o = (size_t)snprintf(doc, cap, "{\"version\":1,\"default\":\"deny\",\"rules\":[");
  for (size_t i = 0; i < nrules; i++)
    o += (size_t)snprintf(doc + o, cap - o,
                          i + 1 < nrules
                              ? "%s{\"index\":%zu,\"kind\":\"allow\",\"hosts\":[\"r.com\"]}"
                              : "%s{\"index\":%zu,\"kind\":\"decide\",\"timeout_ms\":5,"
                                "\"cache\":true}",
                          i ? "," : "", i);
  if (nhosts > 0) {
    o += (size_t)snprintf(doc + o, cap - o, "{\"index\":0,\"kind\":\"deny\",\"hosts\":[");
    for (size_t j = 0; j < nhosts; j++)
      o += (size_t)snprintf(doc + o, cap - o, "%s\"h%zu.com\"", j ? "," : "", j);
    o += (size_t)snprintf(doc + o, cap - o, "]}");
  }
  snprintf(doc + o, cap - o, "]}");
  return doc;
}

Test(policy_load, rule_and_host_count_limits) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  char *doc = build_doc(CE_POLICY_MAX_RULES, 0);
  cr_expect_eq(ce_policy_load_buffer(doc, strlen(doc), &p, &err), 0, "%s", err.message);
  cr_expect_eq(ce_policy_rule_count(p), CE_POLICY_MAX_RULES);
  ce_policy_free(p);
  p = NULL;
  free(doc);
  doc = build_doc(CE_POLICY_MAX_RULES + 1, 0);
  cr_expect_eq(ce_policy_load_buffer(doc, strlen(doc), &p, &err), CE_EINVAL);
  cr_expect_str_eq(err.message, "$.rules: more than 4096 rules");
  free(doc);

  doc = build_doc(0, CE_POLICY_MAX_HOSTS);
  cr_expect_eq(ce_policy_load_buffer(doc, strlen(doc), &p, &err), 0, "%s", err.message);
  ce_verdict_t v;
  cr_expect_eq(ce_policy_eval_host(p, "h4095.com", 9, &v), 0);
  cr_expect_eq(v.reason, CE_REASON_DENIED_BY_RULE);
  cr_expect_eq(ce_policy_eval_host(p, "h4096.com", 9, &v), 0);
  cr_expect_eq(v.reason, CE_REASON_DEFAULT_DENY);
  ce_policy_free(p);
  p = NULL;
  free(doc);
  doc = build_doc(0, CE_POLICY_MAX_HOSTS + 1);
  cr_expect_eq(ce_policy_load_buffer(doc, strlen(doc), &p, &err), CE_EINVAL);
  cr_expect_str_eq(err.message, "$.rules[0].hosts: more than 4096 patterns");
  free(doc);
}

/* ---- files ---------------------------------------------------------------- */

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/ce_test_policy_XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(data, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

Test(policy_file, load_file_paths) {
  char path[128];
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  make_tmpdir();

  snprintf(path, sizeof(path), "%s/ok.json", tmpdir);
  write_file(path, SEED, strlen(SEED));
  cr_expect_eq(ce_policy_load_file(path, &p, &err), 0, "%s", err.message);
  cr_expect_eq(ce_policy_rule_count(p), 3);
  ce_policy_free(p);
  p = NULL;
  unlink(path);

  snprintf(path, sizeof(path), "%s/missing.json", tmpdir);
  cr_expect_eq(ce_policy_load_file(path, &p, &err), CE_ENOENT);
  cr_expect_str_eq(err.message, "cannot open: No such file or directory");
  cr_expect_null(p);

  /* A directory opens but cannot be read. */
  cr_expect_eq(ce_policy_load_file(tmpdir, &p, &err), CE_EIO);
  cr_expect_eq(strncmp(err.message, "cannot read: ", 13), 0, "%s", err.message);

  /* Exactly at the limit loads; one byte more does not. */
  size_t n = CE_POLICY_MAX_BYTES + 1;
  char *doc = malloc(n);
  cr_assert_not_null(doc);
  memset(doc, '\n', n);
  memcpy(doc, SEED, strlen(SEED));
  snprintf(path, sizeof(path), "%s/big.json", tmpdir);
  write_file(path, doc, CE_POLICY_MAX_BYTES);
  cr_expect_eq(ce_policy_load_file(path, &p, &err), 0, "%s", err.message);
  ce_policy_free(p);
  p = NULL;
  write_file(path, doc, n);
  cr_expect_eq(ce_policy_load_file(path, &p, &err), CE_ETOOBIG);
  cr_expect_str_eq(err.message, "the document is larger than 4 MiB (4194304 bytes)");
  unlink(path);
  free(doc);

  snprintf(path, sizeof(path), "%s/bad.json", tmpdir);
  write_file(path, "{\"version\":4}", 13);
  cr_expect_eq(ce_policy_load_file(path, &p, &err), CE_EVERSION);
  cr_expect_str_eq(err.message, "$.version: unsupported version 4 (this build reads versions 1 to 3)");
  cr_expect_eq(ce_policy_load_file(path, &p, NULL), CE_EVERSION);
  unlink(path);

  cr_expect_eq(rmdir(tmpdir), 0);
}

/* ---- evaluation ----------------------------------------------------------- */

typedef struct {
  const char *input;
  ce_decision_t decision;
  ce_reason_t reason;
  int rule;          /* -1: none */
  const char *host;  /* NULL: invalid */
} eval_case_t;

static void check_eval(const ce_policy_t *p, const eval_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ce_verdict_t v;
    memset(&v, 0xAB, sizeof(v));
    int rc = ce_policy_eval_input(p, cases[i].input, strlen(cases[i].input), NULL, 0, &v);
    cr_expect_eq(rc, 0, "%s", cases[i].input);
    cr_expect_eq(v.decision, cases[i].decision, "%s: decision %s", cases[i].input,
                 ce_decision_name(v.decision));
    cr_expect_eq(v.reason, cases[i].reason, "%s: reason %s", cases[i].input,
                 ce_reason_name(v.reason) ? ce_reason_name(v.reason) : "null");
    cr_expect_eq(v.rule_index, cases[i].rule, "%s: rule", cases[i].input);
    if (cases[i].host == NULL) {
      cr_expect(!v.host_valid, "%s", cases[i].input);
    } else {
      cr_expect(v.host_valid, "%s", cases[i].input);
      cr_expect_str_eq(v.host.text, cases[i].host, "%s", cases[i].input);
    }
  }
}

Test(policy_eval, seed_policy) {
  ce_policy_t *p = load_ok(SEED);
  static const eval_case_t cases[] = {
      {"https://api.github.com/repos", CE_DECISION_ALLOW, CE_REASON_NONE, 1,
       "api.github.com"},
      {"API.GitHub.com.:443", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "api.github.com"},
      {"x.internal.example.com", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 0,
       "x.internal.example.com"},
      /* One '*' does not cross labels, so this falls to the decide rule. */
      {"a.b.internal.example.com", CE_DECISION_DECIDE, CE_REASON_NONE, 2,
       "a.b.internal.example.com"},
      {"chat.openai.com", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "chat.openai.com"},
      {"openai.com", CE_DECISION_DECIDE, CE_REASON_NONE, 2, "openai.com"},
      {"a.b.cdn.example", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "a.b.cdn.example"},
      {"10.0.0.1", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "10.0.0.1"},
      {"[::ffff:10.0.0.1]:443", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "10.0.0.1"},
      {"http://[2001:DB8:0::1]:80/x", CE_DECISION_ALLOW, CE_REASON_NONE, 1, "2001:db8::1"},
      {"xn--bcher-kva.example", CE_DECISION_ALLOW, CE_REASON_NONE, 1,
       "xn--bcher-kva.example"},
      {"wss://b\xc3\xbc" "cher.example/", CE_DECISION_ALLOW, CE_REASON_NONE, 1,
       "xn--bcher-kva.example"},
      {"10.0.0.2", CE_DECISION_DECIDE, CE_REASON_NONE, 2, "10.0.0.2"},
      {"127.1", CE_DECISION_DENY, CE_REASON_INVALID_HOST, -1, NULL},
      {"", CE_DECISION_DENY, CE_REASON_INVALID_HOST, -1, NULL},
      {"https://", CE_DECISION_DENY, CE_REASON_INVALID_HOST, -1, NULL},
      {"https://a..b/", CE_DECISION_DENY, CE_REASON_INVALID_HOST, -1, NULL},
      {"ftp://api.github.com", CE_DECISION_DENY, CE_REASON_INVALID_URL, -1, NULL},
      {"https://evil.net\\@api.github.com", CE_DECISION_DENY, CE_REASON_INVALID_URL, -1,
       NULL},
      {"https://evil.net@api.github.com", CE_DECISION_ALLOW, CE_REASON_NONE, 1,
       "api.github.com"},
  };
  check_eval(p, cases, sizeof(cases) / sizeof(cases[0]));
  ce_policy_free(p);
}

Test(policy_eval, defaults_and_invalid_hosts_under_allow) {
  ce_policy_t *p = load_ok(
      "{\"version\":1,\"default\":\"allow\",\"rules\":["
      "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"169.254.169.254\",\"::1\",\"*\"]}]}");
  static const eval_case_t cases[] = {
      {"a.b", CE_DECISION_ALLOW, CE_REASON_NONE, -1, "a.b"},
      {"localhost", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 0, "localhost"},
      {"169.254.169.254", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 0,
       "169.254.169.254"},
      {"[::1]:8080", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 0, "::1"},
      /* Globs never match IP literals: '*' does not cover 127.0.0.1. */
      {"127.0.0.1", CE_DECISION_ALLOW, CE_REASON_NONE, -1, "127.0.0.1"},
      /* IPv4 patterns do not match IPv6 hosts that are not v4-mapped. */
      {"::a9fe:a9fe", CE_DECISION_ALLOW, CE_REASON_NONE, -1, "::a9fe:a9fe"},
      /* Invalid hosts are denied even under default allow. */
      {"0x7f.1", CE_DECISION_DENY, CE_REASON_INVALID_HOST, -1, NULL},
      {"gopher://a.b", CE_DECISION_DENY, CE_REASON_INVALID_URL, -1, NULL},
  };
  check_eval(p, cases, sizeof(cases) / sizeof(cases[0]));
  ce_policy_free(p);
}

Test(policy_eval, first_match_wins_and_empty_policy) {
  ce_policy_t *p = load_ok(
      "{\"version\":1,\"default\":\"deny\",\"rules\":["
      "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"a.com\"]},"
      "{\"index\":1,\"kind\":\"deny\",\"hosts\":[\"a.com\",\"b.com\"]},"
      "{\"index\":2,\"kind\":\"allow\",\"hosts\":[\"b.com\",\"c.com\"]}]}");
  static const eval_case_t cases[] = {
      {"a.com", CE_DECISION_ALLOW, CE_REASON_NONE, 0, "a.com"},
      {"b.com", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 1, "b.com"},
      {"c.com", CE_DECISION_ALLOW, CE_REASON_NONE, 2, "c.com"},
      {"d.com", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1, "d.com"},
  };
  check_eval(p, cases, sizeof(cases) / sizeof(cases[0]));
  ce_policy_free(p);

  p = load_ok("{\"version\":1,\"default\":\"deny\",\"rules\":[]}");
  static const eval_case_t none[] = {
      {"a.com", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1, "a.com"},
  };
  check_eval(p, none, 1);
  ce_policy_free(p);
}

Test(policy_eval, host_path_reads_only_its_span) {
  ce_policy_t *p = load_ok(SEED);
  ce_verdict_t v;
  /* An SNI value is not NUL-terminated; "://" past the span is ignored
   * and eval_host never treats its input as a URL. */
  const char *buf = "api.github.com://junk";
  cr_assert_eq(ce_policy_eval_host(p, buf, 14, &v), 0);
  cr_assert_eq(v.decision, CE_DECISION_ALLOW);
  cr_assert_eq(v.rule_kind, CE_RULE_ALLOW);
  cr_assert_eq(ce_policy_eval_host(p, "https://api.github.com", 22, &v), 0);
  cr_assert_eq(v.reason, CE_REASON_INVALID_HOST);
  ce_policy_free(p);
}

Test(policy_eval, names) {
  cr_assert_str_eq(ce_decision_name(CE_DECISION_ALLOW), "allow");
  cr_assert_str_eq(ce_decision_name(CE_DECISION_DENY), "deny");
  cr_assert_str_eq(ce_decision_name(CE_DECISION_DECIDE), "decide");
  cr_assert_str_eq(ce_decision_name((ce_decision_t)9), "unknown");
  cr_assert_str_eq(ce_rule_kind_name(CE_RULE_ALLOW), "allow");
  cr_assert_str_eq(ce_rule_kind_name(CE_RULE_DENY), "deny");
  cr_assert_str_eq(ce_rule_kind_name(CE_RULE_DECIDE), "decide");
  cr_assert_str_eq(ce_rule_kind_name((ce_rule_kind_t)9), "unknown");
  cr_assert_null(ce_reason_name(CE_REASON_NONE));
  cr_assert_str_eq(ce_reason_name(CE_REASON_DENIED_BY_RULE), "denied_by_rule");
  cr_assert_str_eq(ce_reason_name(CE_REASON_DEFAULT_DENY), "default_deny");
  cr_assert_str_eq(ce_reason_name(CE_REASON_INVALID_HOST), "invalid_host");
  cr_assert_str_eq(ce_reason_name(CE_REASON_INVALID_URL), "invalid_url");
  cr_assert_str_eq(ce_reason_name((ce_reason_t)9), "unknown");
}

/* ---- version 2: methods and paths (docs/path-matching.md) ---------------- */

static const char *MP =
    "{\"version\":2,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"deny\",\"hosts\":[{\"host\":\"api.github.com\",\"methods\":[\"DELETE\"]}]},"
    "{\"index\":1,\"kind\":\"allow\",\"hosts\":[{\"host\":\"api.github.com\",\"methods\":[\"GET\",\"HEAD\"],"
    "\"paths\":[\"/repos/myorg/**\",\"/user\"]}]},"
    "{\"index\":2,\"kind\":\"deny\",\"hosts\":[{\"host\":\"*.example.com\",\"paths\":[\"/admin/**\"]}]},"
    "{\"index\":3,\"kind\":\"allow\",\"hosts\":[\"*.example.com\",{\"host\":\"only-post.test\","
    "\"methods\":[\"POST\"]}]}]}";

static void req_is(const ce_policy_t *p, const char *host, const char *method, const char *target,
                   ce_decision_t d, ce_reason_t reason, int rule) {
  ce_verdict_t v;
  cr_assert_eq(ce_policy_eval_request(p, host, strlen(host), method, method ? strlen(method) : 0, target,
                                      target ? strlen(target) : 0, &v),
               0);
  cr_expect(v.decision == d && v.reason == reason && v.rule_index == rule,
            "%s %s %s: expected %s/%s rule %d, got %s/%s rule %d", show_s(method), host, show_s(target),
            ce_decision_name(d), show_s(ce_reason_name(reason)), rule, ce_decision_name(v.decision),
            show_s(ce_reason_name(v.reason)), (int)v.rule_index);
}

Test(policy_conditions, methods_and_paths) {
  ce_policy_t *p = load_ok(MP);
  req_is(p, "api.github.com", "GET", "/repos/myorg/x", CE_DECISION_ALLOW, CE_REASON_NONE, 1);
  req_is(p, "api.github.com:443", "HEAD", "/repos/myorg?x=1", CE_DECISION_ALLOW, CE_REASON_NONE, 1);
  req_is(p, "api.github.com", "GET", "/user", CE_DECISION_ALLOW, CE_REASON_NONE, 1);
  req_is(p, "api.github.com", "GET", "/user/", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  /* methods are case-sensitive */
  req_is(p, "api.github.com", "get", "/repos/myorg/x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "api.github.com", "POST", "/repos/myorg/x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "api.github.com", "DELETE", "/repos/myorg/x", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 0);
  /* unknown method or path: conditions do not match */
  req_is(p, "api.github.com", NULL, "/repos/myorg/x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "api.github.com", "GET", NULL, CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  /* paths are case-sensitive */
  req_is(p, "api.github.com", "GET", "/Repos/myorg/x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "only-post.test", "POST", "/anything", CE_DECISION_ALLOW, CE_REASON_NONE, 3);
  req_is(p, "only-post.test", "GET", "/anything", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  ce_policy_free(p);
}

Test(policy_conditions, escapes_fail) {
  ce_policy_t *p = load_ok(MP);
  req_is(p, "api.github.com", "GET", "/repos/myorg/../x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "api.github.com", "GET", "/repos/myorg/%2e%2e/x", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  req_is(p, "api.github.com", "GET", "/repos/myorg/%2E%2E%2Fx", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "/repos/myorg%2F..%2Fx", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "/repos/myorg/..;/x", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "/repos//myorg/x", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "/../repos/myorg/x", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "*", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 1);
  req_is(p, "api.github.com", "GET", "/repos/myorgx/y", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  /* the dot segments resolve inside the allowed tree: allowed */
  req_is(p, "api.github.com", "GET", "/repos/x/../myorg/y", CE_DECISION_ALLOW, CE_REASON_NONE, 1);
  /* A deny by path cannot be slipped with an encoding: the invalid path
   * is denied at the deny rule, before the allow after it. */
  req_is(p, "a.example.com", "GET", "/admin/x", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 2);
  req_is(p, "a.example.com", "GET", "/x/../admin/x", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 2);
  req_is(p, "a.example.com", "GET", "/%61dmin/x", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 2);
  req_is(p, "a.example.com", "GET", "/admin", CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE, 2);
  req_is(p, "a.example.com", "GET", "//admin/x", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 2);
  req_is(p, "a.example.com", "GET", "/x/..%2Fadmin", CE_DECISION_DENY, CE_REASON_INVALID_PATH, 2);
  req_is(p, "a.example.com", "GET", "/public", CE_DECISION_ALLOW, CE_REASON_NONE, 3);
  /* a method condition that does not apply leaves the path alone */
  req_is(p, "api.github.com", "POST", "/a//b", CE_DECISION_DENY, CE_REASON_DEFAULT_DENY, -1);
  ce_policy_free(p);
}

Test(policy_conditions, host_level_answers) {
  ce_policy_t *p = load_ok(MP);
  ce_verdict_t v;
  /* the most some request could get: the conditional allow counts, the
   * conditional deny (DELETE only) does not refuse the host */
  cr_assert_eq(ce_policy_eval_host(p, "api.github.com", 14, &v), 0);
  cr_expect_eq(v.decision, CE_DECISION_ALLOW);
  cr_expect_eq(v.rule_index, 1);
  cr_expect_eq(ce_policy_could_allow(p, "api.github.com", 14, &v), CE_DECISION_ALLOW);
  cr_expect_eq(ce_policy_could_allow(p, "only-post.test", 14, &v), CE_DECISION_ALLOW);
  cr_expect_eq(ce_policy_could_allow(p, "a.example.com", 13, &v), CE_DECISION_ALLOW);
  cr_expect_eq(v.rule_index, 3);
  cr_expect_eq(ce_policy_could_allow(p, "b.test", 6, &v), CE_DECISION_DENY);
  /* a dry run on a bare host has no path */
  cr_assert_eq(ce_policy_eval_input(p, "api.github.com", 14, "GET", 3, &v), 0);
  cr_expect_eq(v.decision, CE_DECISION_DENY);
  cr_expect_eq(v.reason, CE_REASON_DEFAULT_DENY);
  cr_assert_eq(ce_policy_eval_input(p, "https://api.github.com/user#x", 29, "GET", 3, &v), 0);
  cr_expect_eq(v.decision, CE_DECISION_ALLOW);
  cr_assert_eq(ce_policy_eval_input(p, "https://api.github.com?x", 24, "GET", 3, &v), 0);
  cr_expect_eq(v.reason, CE_REASON_DEFAULT_DENY);
  cr_expect_str_eq(ce_reason_name(CE_REASON_INVALID_PATH), "invalid_path");
  ce_policy_free(p);
}

static void v2_rule_fails(const char *hosts, const char *message) {
  char doc[4096];
  snprintf(doc, sizeof(doc), "{\"version\":2,\"default\":\"allow\",\"rules\":[{\"index\":0,\"kind\":\"allow\","
                             "\"hosts\":%s}]}", hosts);
  load_fails(doc, CE_EINVAL, message);
}

Test(policy_conditions, load_errors) {
  load_fails("{\"version\":1,\"default\":\"allow\",\"rules\":[{\"index\":0,\"kind\":\"allow\","
             "\"hosts\":[{\"host\":\"a.com\",\"methods\":[\"GET\"]}]}]}",
             CE_EINVAL, "$.rules[0].hosts[0]: an entry object (methods, paths) needs a version 2 document");
  v2_rule_fails("[1]", "$.rules[0].hosts[0]: expected a string or an entry object");
  v2_rule_fails("[{\"host\":\"a.com\"}]",
                "$.rules[0].hosts[0]: an entry object names \"methods\" or \"paths\"; write a plain host string "
                "otherwise");
  v2_rule_fails("[{\"methods\":[\"GET\"]}]", "$.rules[0].hosts[0]: missing member \"host\"");
  v2_rule_fails("[{\"host\":1,\"methods\":[\"GET\"]}]", "$.rules[0].hosts[0].host: expected a string");
  v2_rule_fails("[{\"host\":\"a.com\",\"method\":[\"GET\"]}]", "$.rules[0].hosts[0].method: unknown member");
  /* The host is checked before the conditions, as new/1 does. */
  v2_rule_fails("[{\"host\":\"a.com/x\",\"methods\":[\"get\"]}]",
                "$.rules[0].hosts[0].host: bad pattern \"a.com/x\" (path): write the host only, without a path, query or fragment");
  v2_rule_fails("[{\"host\":\"a.com\",\"methods\":[]}]",
                "$.rules[0].hosts[0].methods: expected a non-empty array of strings");
  v2_rule_fails("[{\"host\":\"a.com\",\"methods\":\"GET\"}]",
                "$.rules[0].hosts[0].methods: expected a non-empty array of strings");
  v2_rule_fails("[{\"host\":\"a.com\",\"methods\":[1]}]", "$.rules[0].hosts[0].methods[0]: expected a string");
  v2_rule_fails("[{\"host\":\"a.com\",\"methods\":[\"get\"]}]",
                "$.rules[0].hosts[0].methods[0]: bad method \"get\": an upper-case token of A-Z, 0-9, '-' and '_', "
                "at most 32 bytes");
  v2_rule_fails("[{\"host\":\"a.com\",\"methods\":[\"\"]}]",
                "$.rules[0].hosts[0].methods[0]: bad method \"\": an upper-case token of A-Z, 0-9, '-' and '_', "
                "at most 32 bytes");
  v2_rule_fails("[{\"host\":\"a.com\",\"paths\":[\"/a/../b\"]}]",
                "$.rules[0].hosts[0].paths[0]: bad path pattern \"/a/../b\" (dot_segment): request paths are "
                "matched with \".\" and \"..\" removed; write the path they lead to");
  v2_rule_fails("[{\"host\":\"a.com\",\"paths\":[]}]",
                "$.rules[0].hosts[0].paths: expected a non-empty array of strings");
  char many[64 * 8 + 128], *w = many;
  w += sprintf(w, "[{\"host\":\"a.com\",\"methods\":[");
  for (int i = 0; i < 65; i++)
    w += sprintf(w, "%s\"M%d\"", i ? "," : "", i);
  sprintf(w, "]}]");
  v2_rule_fails(many, "$.rules[0].hosts[0].methods: more than 64 entries");
}
