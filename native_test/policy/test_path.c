/* Tests for c_src/policy/path.c: request path normalisation (every refused
 * spelling, every escape attempt), path patterns and the path glob
 * (docs/path-matching.md). */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "policy/path.h"

static void norm_is(const char *in, const char *want) {
  char out[CE_PATH_MAX + 1];
  size_t n = 0;
  int rc = ce_path_normalize(in, strlen(in), out, sizeof(out), &n);
  cr_expect_eq(rc, 0, "\"%s\" refused", in);
  if (rc == 0) {
    cr_expect_eq(n, strlen(out), "\"%s\": length", in);
    cr_expect_str_eq(out, want, "\"%s\"", in);
  }
}

static void norm_refused(const char *in) {
  char out[CE_PATH_MAX + 1];
  size_t n = 0;
  cr_expect_eq(ce_path_normalize(in, strlen(in), out, sizeof(out), &n), CE_EINVAL, "\"%s\" accepted", in);
}

Test(path_normalize, plain_and_query) {
  norm_is("/", "/");
  norm_is("/repos/myorg/x", "/repos/myorg/x");
  norm_is("/repos/myorg/x/", "/repos/myorg/x/");
  norm_is("/repos?x=/../../etc", "/repos");
  norm_is("/?", "/");
  norm_is("/a;b=c/d", "/a;b=c/d");
  norm_is("/Repos/MyOrg", "/Repos/MyOrg");
}

Test(path_normalize, percent_decoding) {
  norm_is("/%72epos/%6d%79org", "/repos/myorg");
  norm_is("/a%2d%2E%5f%7E", "/a-._~");
  norm_is("/a%20b", "/a%20b");
  norm_is("/a%3ab%3Fc", "/a%3Ab%3Fc");
  norm_is("/a%25b", "/a%25b");
  norm_is("/a%252e%252e/x", "/a%252e%252e/x");
}

Test(path_normalize, dot_segments) {
  norm_is("/repos/myorg/../x", "/repos/x");
  norm_is("/repos/myorg/%2e%2e/x", "/repos/x");
  norm_is("/repos/myorg/%2E%2e/x", "/repos/x");
  norm_is("/repos/myorg/.%2e/x", "/repos/x");
  norm_is("/repos/./myorg/./x", "/repos/myorg/x");
  norm_is("/repos/myorg/.", "/repos/myorg/");
  norm_is("/repos/myorg/..", "/repos/");
  norm_is("/a/..", "/");
  norm_is("/a/b/../../c", "/c");
  norm_is("/a/...", "/a/...");
  norm_is("/a/..b/.c", "/a/..b/.c");
}

Test(path_normalize, refused) {
  norm_refused("");
  norm_refused("*");
  norm_refused("repos");
  norm_refused("http://h/x");
  norm_refused("/..");
  norm_refused("/a/../..");
  norm_refused("/%2e%2e/x");
  norm_refused("/repos/myorg/%2E%2E%2Fx");
  norm_refused("/repos/myorg/%2e%2e%2fx");
  norm_refused("/repos/myorg%2F..%2Fx");
  norm_refused("/a%5C..%5Cb");
  norm_refused("/a%5c");
  norm_refused("/a\\b");
  norm_refused("/a%00b");
  norm_refused("/a%");
  norm_refused("/a%2");
  norm_refused("/a%zz");
  norm_refused("/a%g0");
  norm_refused("/a#frag");
  norm_refused("/a b");
  norm_refused("/a\tb");
  norm_refused("/a\x7f");
  norm_refused("/a\xc3\xa9");
  norm_refused("//a");
  norm_refused("/a//b");
  norm_refused("/repos/myorg//../x");
  norm_refused("/a/..;/b");
  norm_refused("/a/.;x/b");
  norm_refused("/a/%2e%2e;/b");
}

Test(path_normalize, limits) {
  static char big[CE_PATH_MAX + 2];
  memset(big, 'a', sizeof(big) - 1);
  big[0] = '/';
  char out[CE_PATH_MAX + 1];
  size_t n;
  cr_expect_eq(ce_path_normalize(big, CE_PATH_MAX, out, sizeof(out), &n), 0);
  cr_expect_eq(n, CE_PATH_MAX);
  cr_expect_eq(ce_path_normalize(big, CE_PATH_MAX + 1, out, sizeof(out), &n), CE_EINVAL);
  /* The query does not count. */
  big[CE_PATH_MAX] = '?';
  cr_expect_eq(ce_path_normalize(big, CE_PATH_MAX + 1, out, sizeof(out), &n), 0);
  /* A buffer too small is refused, never overrun. */
  cr_expect_eq(ce_path_normalize("/abc", 4, out, 4, &n), CE_EINVAL);
  cr_expect_eq(ce_path_normalize("/abc", 4, out, 5, &n), 0);
}

static void pattern_is(const char *in, const char *want) {
  char out[CE_PATH_PATTERN_MAX + 1];
  size_t n = 0;
  ce_path_pattern_err_t err = CE_PATH_PATTERN_STARS;
  int rc = ce_path_pattern_normalize(in, strlen(in), out, sizeof(out), &n, &err);
  cr_expect_eq(rc, 0, "\"%s\" refused: %s", in, ce_path_pattern_err_code(err));
  cr_expect_eq(err, CE_PATH_PATTERN_OK);
  if (rc == 0)
    cr_expect_str_eq(out, want, "\"%s\"", in);
}

static void pattern_refused(const char *in, ce_path_pattern_err_t want) {
  char out[CE_PATH_PATTERN_MAX + 1];
  size_t n = 0;
  ce_path_pattern_err_t err = CE_PATH_PATTERN_OK;
  cr_expect_eq(ce_path_pattern_normalize(in, strlen(in), out, sizeof(out), &n, &err), CE_EINVAL, "\"%s\"", in);
  cr_expect_eq(err, want, "\"%s\": %s, expected %s", in, ce_path_pattern_err_code(err),
               ce_path_pattern_err_code(want));
  cr_expect_str_neq(ce_path_pattern_err_hint(err), "unknown error");
}

Test(path_pattern, accepted) {
  pattern_is("/", "/");
  pattern_is("/**", "/**");
  pattern_is("/repos/myorg/**", "/repos/myorg/**");
  pattern_is("/repos/*/issues", "/repos/*/issues");
  pattern_is("/v1/*.json", "/v1/*.json");
  pattern_is("/%72epos/%3a", "/repos/%3A");
  pattern_is("/a/**/b/**", "/a/**/b/**");
  pattern_is("/a/", "/a/");
}

Test(path_pattern, refused) {
  pattern_refused("", CE_PATH_PATTERN_EMPTY);
  pattern_refused("repos", CE_PATH_PATTERN_NOT_ABSOLUTE);
  pattern_refused("*", CE_PATH_PATTERN_NOT_ABSOLUTE);
  pattern_refused("/a?b", CE_PATH_PATTERN_QUERY);
  pattern_refused("/a#b", CE_PATH_PATTERN_QUERY);
  pattern_refused("/a b", CE_PATH_PATTERN_BYTE);
  pattern_refused("/a\\b", CE_PATH_PATTERN_BYTE);
  pattern_refused("/a%zz", CE_PATH_PATTERN_BYTE);
  pattern_refused("/a%2F", CE_PATH_PATTERN_SEPARATOR);
  pattern_refused("/a//b", CE_PATH_PATTERN_EMPTY_SEGMENT);
  pattern_refused("/a/../b", CE_PATH_PATTERN_DOT_SEGMENT);
  pattern_refused("/a/./b", CE_PATH_PATTERN_DOT_SEGMENT);
  pattern_refused("/a/%2e%2e", CE_PATH_PATTERN_DOT_SEGMENT);
  pattern_refused("/a/..;x", CE_PATH_PATTERN_DOT_SEGMENT);
  pattern_refused("/a**", CE_PATH_PATTERN_STARS);
  pattern_refused("/**a", CE_PATH_PATTERN_STARS);
  pattern_refused("/a/***", CE_PATH_PATTERN_STARS);
  pattern_refused("/a/**b/c", CE_PATH_PATTERN_STARS);
  static char big[CE_PATH_PATTERN_MAX + 2];
  memset(big, 'a', sizeof(big) - 1);
  big[0] = '/';
  pattern_refused(big, CE_PATH_PATTERN_TOO_LONG);
  cr_expect_str_eq(ce_path_pattern_err_code((ce_path_pattern_err_t)99), "unknown");
  cr_expect_str_eq(ce_path_pattern_err_hint((ce_path_pattern_err_t)99), "unknown error");
  cr_expect_str_eq(ce_path_pattern_err_code(CE_PATH_PATTERN_OK), "ok");
}

static bool m(const char *pat, const char *path) {
  return ce_path_match(pat, strlen(pat), path, strlen(path));
}

Test(path_match, globs) {
  cr_expect(m("/", "/"));
  cr_expect(!m("/", "/a"));
  cr_expect(m("/a", "/a"));
  cr_expect(!m("/a", "/a/"));
  cr_expect(!m("/a", "/A"));
  cr_expect(!m("/a/", "/a"));
  cr_expect(m("/**", "/"));
  cr_expect(m("/**", "/a/b/c"));
  cr_expect(m("/repos/myorg/**", "/repos/myorg"));
  cr_expect(m("/repos/myorg/**", "/repos/myorg/"));
  cr_expect(m("/repos/myorg/**", "/repos/myorg/x/y/z"));
  cr_expect(!m("/repos/myorg/**", "/repos/myorgx"));
  cr_expect(!m("/repos/myorg/**", "/repos/myorgx/y"));
  cr_expect(!m("/repos/myorg/**", "/repos/x"));
  cr_expect(!m("/repos/myorg/**", "/repos"));
  cr_expect(m("/repos/*/issues", "/repos/a/issues"));
  cr_expect(m("/repos/*/issues", "/repos//issues") == true); /* never reaches here normalised */
  cr_expect(!m("/repos/*/issues", "/repos/a/b/issues"));
  cr_expect(m("/a/*", "/a/"));
  cr_expect(m("/a/*", "/a/x"));
  cr_expect(!m("/a/*", "/a"));
  cr_expect(!m("/a/*", "/a/x/y"));
  cr_expect(m("/v1/*.json", "/v1/x.json"));
  cr_expect(m("/v1/*.json", "/v1/.json"));
  cr_expect(!m("/v1/*.json", "/v1/x.jsonx"));
  cr_expect(!m("/v1/*.json", "/v1/a/x.json"));
  cr_expect(m("/v1/a*b*c", "/v1/aXbYbZc"));
  cr_expect(!m("/v1/a*b*c", "/v1/aXbYbZ"));
  cr_expect(m("/a/**/b", "/a/b"));
  cr_expect(m("/a/**/b", "/a/x/y/b"));
  cr_expect(!m("/a/**/b", "/a/x/y/bb"));
  cr_expect(m("/a/**/b/**", "/a/x/b/y/b/z"));
  cr_expect(m("/**/b", "/x/y/b"));
  cr_expect(!m("/**/b", "/x/y/c"));
  cr_expect(m("/**/*.git/**", "/x/y.git/info/refs"));
  cr_expect(!m("", "/"));
  cr_expect(!m("/", ""));
  cr_expect(!m("a", "/a"));
}

Test(path_match, long_inputs_stay_linear_enough) {
  static char path[CE_PATH_MAX + 1];
  for (size_t i = 0; i < CE_PATH_MAX; i += 2) {
    path[i] = '/';
    path[i + 1] = 'a';
  }
  cr_expect(!m("/**/a/**/a/**/a/**/a/**/b", path));
  cr_expect(m("/**/a/**/a/**/a/**/a/**", path));
}
