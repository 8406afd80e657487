/* Runs the shared vector file native_test/vectors/policy_vectors.json,
 * which ExUnit runs too: both evaluators must agree on every entry
 * (docs/host-matching.md). Each mismatch is reported with its group and
 * input through cr_expect, so one run shows all of them. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "common/error.h"
#include "policy/host.h"
#include "policy/path.h"
#include "policy/policy.h"

#define VECTOR_FILE CE_SOURCE_ROOT "/native_test/vectors/policy_vectors.json"
/* The file is meant to cover the spec broadly; fewer group cases than this
 * means it was truncated or replaced by a stub. */
#define MIN_GROUP_CASES 300

static json_t *load_vectors(void) {
  json_error_t jerr;
  json_t *root = json_load_file(VECTOR_FILE, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  cr_assert_not_null(root,
                     "cannot load the shared vector file %s: %s (line %d). The "
                     "vectors are required; this test does not skip.",
                     VECTOR_FILE, jerr.text, jerr.line);
  cr_assert(json_is_object(root), "%s: top level must be an object", VECTOR_FILE);
  cr_assert_eq(json_integer_value(json_object_get(root, "version")), 1,
               "%s: unknown vector file version", VECTOR_FILE);
  return root;
}

/* A string member, or NULL when it is JSON null or absent. */
static const char *str_or_null(const json_t *obj, const char *key) {
  return json_string_value(json_object_get(obj, key));
}

static int same(const char *a, const char *b) {
  if (a == NULL || b == NULL)
    return a == b;
  return strcmp(a, b) == 0;
}

static const char *show(const char *s) { return s != NULL ? s : "null"; }

Test(vectors, patterns) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "patterns");
  cr_assert(json_is_array(list), "\"patterns\" must be an array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const json_t *pj = json_object_get(v, "pattern");
    cr_assert(json_is_string(pj), "patterns[%zu]: no \"pattern\" string", i);
    const char *pat = json_string_value(pj);
    const char *want = str_or_null(v, "normalized");
    const char *want_err = str_or_null(v, "error");
    ce_host_t h;
    ce_pattern_err_t perr;
    int rc = ce_pattern_normalize(pat, json_string_length(pj), &h, &perr);
    const char *got = rc == 0 ? h.text : NULL;
    const char *got_err = rc == CE_EINVAL ? ce_pattern_err_code(perr) : NULL;
    cr_expect(rc == 0 || rc == CE_EINVAL, "patterns[%zu] \"%s\": %s", i, pat,
              ce_err_name(rc));
    cr_expect(same(got, want) && same(got_err, want_err),
              "patterns[%zu] \"%s\": expected normalized=%s error=%s, got "
              "normalized=%s error=%s",
              i, pat, show(want), show(want_err), show(got), show(got_err));
  }
  json_decref(root);
}

Test(vectors, hosts) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "hosts");
  cr_assert(json_is_array(list), "\"hosts\" must be an array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const json_t *hj = json_object_get(v, "host");
    cr_assert(json_is_string(hj), "hosts[%zu]: no \"host\" string", i);
    const char *host = json_string_value(hj);
    const char *want = str_or_null(v, "normalized");
    ce_host_t h;
    int rc = ce_host_normalize(host, json_string_length(hj), &h);
    const char *got = rc == 0 ? h.text : NULL;
    cr_expect(same(got, want), "hosts[%zu] \"%s\": expected %s, got %s", i, host,
              show(want), show(got));
  }
  json_decref(root);
}

Test(vectors, groups) {
  json_t *root = load_vectors();
  const json_t *groups = json_object_get(root, "groups");
  cr_assert(json_is_array(groups), "\"groups\" must be an array");
  size_t total = 0, gi;
  const json_t *g;

  json_array_foreach(groups, gi, g) {
    const char *name = show(str_or_null(g, "name"));
    const json_t *pol = json_object_get(g, "policy");
    char *doc = json_dumps(pol, JSON_COMPACT);
    cr_assert_not_null(doc, "group \"%s\": no policy object", name);
    ce_policy_t *p = NULL;
    ce_policy_error_t err;
    int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
    free(doc);
    cr_expect_eq(rc, 0, "group \"%s\": policy refused: %s", name, err.message);
    if (rc != 0)
      continue;

    const json_t *rules = json_object_get(pol, "rules");
    const json_t *cases = json_object_get(g, "cases");
    size_t ci;
    const json_t *c;
    json_array_foreach(cases, ci, c) {
      const json_t *ij = json_object_get(c, "input");
      cr_assert(json_is_string(ij), "group \"%s\" case %zu: no input", name, ci);
      const char *input = json_string_value(ij);
      total++;

      ce_verdict_t v;
      const json_t *mj = json_object_get(c, "method");
      const char *method = json_string_value(mj);
      rc = ce_policy_eval_input(p, input, json_string_length(ij), method, method != NULL ? json_string_length(mj) : 0,
                                &v);
      cr_expect_eq(rc, 0, "group \"%s\" input \"%s\": %s", name, input, ce_err_name(rc));

      const char *want_decision = str_or_null(c, "decision");
      const char *want_reason = str_or_null(c, "reason");
      const char *want_host = str_or_null(c, "host");
      const json_t *mr = json_object_get(c, "matched_rule");
      long long want_rule = json_is_integer(mr) ? (long long)json_integer_value(mr) : -1;
      const char *want_kind =
          want_rule >= 0
              ? json_string_value(json_object_get(json_array_get(rules, (size_t)want_rule), "kind"))
              : NULL;

      const char *got_decision = ce_decision_name(v.decision);
      const char *got_reason = ce_reason_name(v.reason);
      const char *got_host = v.host_valid ? v.host.text : NULL;
      const char *got_kind = v.rule_index >= 0 ? ce_rule_kind_name(v.rule_kind) : NULL;

      cr_expect(same(got_decision, want_decision) && same(got_reason, want_reason) &&
                    (long long)v.rule_index == want_rule && same(got_kind, want_kind) &&
                    same(got_host, want_host),
                "group \"%s\" input \"%s\": expected %s/%s rule %lld host %s, got "
                "%s/%s rule %d host %s",
                name, input, show(want_decision), show(want_reason), want_rule,
                show(want_host), got_decision, show(got_reason), (int)v.rule_index,
                show(got_host));

      /* "credentials": the entries the request would get, by index. */
      const json_t *want_creds = json_object_get(c, "credentials");
      if (want_creds != NULL) {
        size_t idx[CE_POLICY_MAX_CREDENTIALS];
        int n = ce_policy_eval_input_credentials(p, input, json_string_length(ij), method,
                                                 method != NULL ? json_string_length(mj) : 0, v.decision, idx,
                                                 CE_POLICY_MAX_CREDENTIALS);
        bool ok = json_is_array(want_creds) && n >= 0 && (size_t)n == json_array_size(want_creds);
        for (size_t k = 0; ok && k < (size_t)n; k++)
          ok = (long long)idx[k] == (long long)json_integer_value(json_array_get(want_creds, k));
        cr_expect(ok, "group \"%s\" input \"%s\" method %s: expected credentials %zu long, got %d (first %lld)", name,
                  input, show(method), json_array_size(want_creds), n, n > 0 ? (long long)idx[0] : -1LL);
      }
    }
    ce_policy_free(p);
  }
  cr_expect_geq(total, MIN_GROUP_CASES,
                "%s has only %zu group cases; at least %d are expected", VECTOR_FILE,
                total, MIN_GROUP_CASES);
  json_decref(root);
}

/* Policies both loaders refuse: a rule after a decide rule. */
Test(vectors, unreachable) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "unreachable");
  cr_assert(json_is_array(list) && json_array_size(list) > 0, "\"unreachable\" must be a non-empty array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const char *name = show(str_or_null(v, "name"));
    char *doc = json_dumps(json_object_get(v, "policy"), JSON_COMPACT);
    cr_assert_not_null(doc, "unreachable \"%s\": no policy object", name);
    char want[128];
    snprintf(want, sizeof(want), "$.rules[%lld]: unreachable: rule %lld (decide) ",
             (long long)json_integer_value(json_object_get(v, "rule_index")),
             (long long)json_integer_value(json_object_get(v, "decide_index")));
    ce_policy_t *p = NULL;
    ce_policy_error_t err;
    int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
    free(doc);
    cr_expect_eq(rc, CE_EINVAL, "unreachable \"%s\": loaded (%s)", name, ce_err_name(rc));
    cr_expect(rc != 0 && strncmp(err.message, want, strlen(want)) == 0,
              "unreachable \"%s\": expected a message starting %s, got %s", name, want,
              rc != 0 ? err.message : "none");
    ce_policy_free(p);
  }
  json_decref(root);
}

/* docs/path-matching.md §1: request targets and their normalised paths. */
Test(vectors, paths) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "paths");
  cr_assert(json_is_array(list) && json_array_size(list) > 0, "\"paths\" must be a non-empty array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const json_t *pj = json_object_get(v, "path");
    cr_assert(json_is_string(pj), "paths[%zu]: no \"path\" string", i);
    const char *want = str_or_null(v, "normalized");
    char out[CE_PATH_MAX + 1];
    size_t n = 0;
    int rc = ce_path_normalize(json_string_value(pj), json_string_length(pj), out, sizeof(out), &n);
    const char *got = rc == 0 ? out : NULL;
    cr_expect(same(got, want), "paths[%zu] \"%s\": expected %s, got %s", i, json_string_value(pj), show(want),
              show(got));
  }
  json_decref(root);
}

/* docs/path-matching.md §2: path patterns, normalised or refused. */
Test(vectors, path_patterns) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "path_patterns");
  cr_assert(json_is_array(list) && json_array_size(list) > 0, "\"path_patterns\" must be a non-empty array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const json_t *pj = json_object_get(v, "pattern");
    cr_assert(json_is_string(pj), "path_patterns[%zu]: no \"pattern\" string", i);
    char out[CE_PATH_PATTERN_MAX + 1];
    size_t n = 0;
    ce_path_pattern_err_t err;
    int rc = ce_path_pattern_normalize(json_string_value(pj), json_string_length(pj), out, sizeof(out), &n, &err);
    const char *got = rc == 0 ? out : NULL;
    const char *got_err = rc != 0 ? ce_path_pattern_err_code(err) : NULL;
    cr_expect(same(got, str_or_null(v, "normalized")) && same(got_err, str_or_null(v, "error")),
              "path_patterns[%zu] \"%.40s\": expected %s/%s, got %s/%s", i, json_string_value(pj),
              show(str_or_null(v, "normalized")), show(str_or_null(v, "error")), show(got), show(got_err));
  }
  json_decref(root);
}

/* docs/path-matching.md §3: the path glob. */
Test(vectors, path_matches) {
  json_t *root = load_vectors();
  const json_t *list = json_object_get(root, "path_matches");
  cr_assert(json_is_array(list) && json_array_size(list) > 0, "\"path_matches\" must be a non-empty array");
  size_t i;
  const json_t *v;
  json_array_foreach(list, i, v) {
    const char *pat = str_or_null(v, "pattern");
    const char *path = str_or_null(v, "path");
    cr_assert(pat != NULL && path != NULL, "path_matches[%zu]: pattern and path are strings", i);
    bool want = json_is_true(json_object_get(v, "match"));
    cr_expect_eq(ce_path_match(pat, strlen(pat), path, strlen(path)), want, "path_matches[%zu] %s ~ %s: expected %d",
                 i, pat, path, want);
  }
  json_decref(root);
}
