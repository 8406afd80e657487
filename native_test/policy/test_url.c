/* Tests for c_src/policy/url.c: the dry-run URL rules of
 * docs/host-matching.md §4. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "policy/url.h"

static void expect_host(const char *in, const char *host, bool is_url) {
  ce_url_t u;
  int rc = ce_url_split(in, strlen(in), &u);
  cr_expect_eq(rc, 0, "%s should split", in);
  if (rc != 0)
    return;
  cr_expect_eq(u.is_url, is_url, "%s", in);
  cr_expect_eq(u.host_len, strlen(host), "%s: host length", in);
  cr_expect(u.host_len == strlen(host) && memcmp(u.host, host, u.host_len) == 0,
            "%s: host should be \"%s\", got \"%.*s\"", in, host, (int)u.host_len,
            u.host);
}

static void expect_invalid(const char *in) {
  ce_url_t u;
  cr_expect_eq(ce_url_split(in, strlen(in), &u), CE_EINVAL, "%s should be invalid", in);
  cr_expect(u.is_url, "%s", in);
  cr_expect_eq(u.host_len, 0, "%s", in);
}

Test(url, bare_hosts_pass_through) {
  expect_host("api.github.com", "api.github.com", false);
  expect_host("api.github.com:443", "api.github.com:443", false);
  expect_host("[::1]:80", "[::1]:80", false);
  expect_host("a/b", "a/b", false);
  expect_host("", "", false);
  expect_host("http:/x", "http:/x", false);
}

Test(url, schemes) {
  expect_host("http://a", "a", true);
  expect_host("https://a", "a", true);
  expect_host("ws://a", "a", true);
  expect_host("wss://a", "a", true);
  expect_host("HTTPS://a", "a", true);
  expect_host("WsS://a", "a", true);
  expect_invalid("ftp://a");
  expect_invalid("httpx://a");
  expect_invalid("http+unix://a");
  expect_invalid("://a");
  expect_invalid(" https://a");
  expect_invalid("file:///etc/passwd");
  expect_invalid("a.com/x://y");
}

/* plain: the schemes without TLS, in any case; a bare host is not plain. */
Test(url, plain_schemes) {
  static const struct {
    const char *in;
    bool plain;
  } cases[] = {{"http://a", true},   {"HTTP://a", true},   {"ws://a", true},    {"Ws://a", true},
               {"https://a", false}, {"HTTPS://a", false}, {"wss://a", false},  {"wSS://a", false},
               {"a:80", false},      {"a", false}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ce_url_t u;
    cr_assert_eq(ce_url_split(cases[i].in, strlen(cases[i].in), &u), 0, "%s", cases[i].in);
    cr_expect_eq(u.plain, cases[i].plain, "%s", cases[i].in);
  }
}

Test(url, authority_ends_at_path_query_or_fragment) {
  expect_host("https://api.github.com/repos", "api.github.com", true);
  expect_host("https://api.github.com:8443/repos", "api.github.com:8443", true);
  expect_host("https://a?b/c", "a", true);
  expect_host("https://a#b?c", "a", true);
  expect_host("https://[::1]:443/x", "[::1]:443", true);
  expect_host("https:///x", "", true);
  expect_host("https://", "", true);
}

Test(url, userinfo_ends_at_the_last_at) {
  expect_host("https://user@a.com/", "a.com", true);
  expect_host("https://user:pw@a.com:1/", "a.com:1", true);
  expect_host("https://a@b@c.com/x@y", "c.com", true);
  expect_host("https://evil.net@api.github.com", "api.github.com", true);
  expect_host("https://a.com/@evil.net", "a.com", true);
  expect_host("https://@a.com", "a.com", true);
  expect_host("https://a.com@", "", true);
}

Test(url, backslash_in_authority_is_invalid) {
  expect_invalid("https://evil.net\\@api.github.com");
  expect_invalid("https://a\\b");
  expect_invalid("https://\\");
  /* After the authority a backslash is just path text. */
  expect_host("https://a.com/\\x", "a.com", true);
}
