/* Tests for c_src/policy/credential.c and the credential entries of
 * c_src/policy/policy.c (docs/credentials.md): loading and refusing
 * entries, the secrets file, matching by host, method and path, and the
 * one call of the pipeline: the workspace's fields of the credential's
 * name are replaced, whatever their case, never appended to. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/error.h"
#include "policy/credential.h"
#include "policy/policy.h"

#define DOC(creds)                                                                                      \
  "{\"version\":3,\"default\":\"deny\",\"rules\":[{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"**\"]}]," \
  "\"credentials\":" creds "}"

static const char *CREDS =
    DOC("[{\"host\":\"api.github.com\",\"methods\":[\"GET\"],\"paths\":[\"/repos/myorg/**\"],"
        "\"header\":\"Authorization\",\"secret\":\"gh\"},"
        "{\"host\":\"api.github.com\",\"header\":\"authorization\",\"secret\":\"gh-any\"},"
        "{\"host\":\"*.example.com\",\"header\":\"x-api-key\",\"secret\":\"ex\"}]");

static ce_policy_t *load_ok(const char *doc) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
  cr_assert_eq(rc, 0, "load failed: %s (%s)", err.message, ce_err_name(rc));
  return p;
}

static void load_fails(const char *doc, const char *message) {
  ce_policy_t *p = NULL;
  ce_policy_error_t err;
  int rc = ce_policy_load_buffer(doc, strlen(doc), &p, &err);
  cr_expect_eq(rc, CE_EINVAL, "%s: %s", doc, ce_err_name(rc));
  cr_expect_str_eq(err.message, message, "doc %s", doc);
  cr_expect_null(p);
}

static ce_secrets_t *secrets_ok(const char *text) {
  ce_secrets_t *s = NULL;
  char err[CE_SECRETS_ERROR_MAX];
  int rc = ce_secrets_load_buffer(text, strlen(text), &s, err);
  cr_assert_eq(rc, 0, "%s: %s", text, err);
  return s;
}

static void secrets_fail(const char *text, int code, const char *message) {
  ce_secrets_t *s = NULL;
  char err[CE_SECRETS_ERROR_MAX];
  int rc = ce_secrets_load_buffer(text, strlen(text), &s, err);
  cr_expect_eq(rc, code, "%s: %s (%s)", text, ce_err_name(rc), err);
  cr_expect_str_eq(err, message, "%s", text);
  cr_expect_null(s);
}

Test(credential_load, entries) {
  ce_policy_t *p = load_ok(CREDS);
  cr_assert_eq(ce_policy_credential_count(p), 3);
  ce_credential_info_t info;
  cr_assert_eq(ce_policy_credential(p, 0, &info), 0);
  cr_assert_str_eq(info.header, "authorization"); /* stored in lower case */
  cr_assert_str_eq(info.secret, "gh");
  cr_assert_eq(ce_policy_credential(p, 2, &info), 0);
  cr_assert_str_eq(info.header, "x-api-key");
  cr_assert_eq(ce_policy_credential(p, 3, &info), CE_EINVAL);
  ce_policy_free(p);

  /* Earlier versions have none. */
  p = load_ok("{\"version\":1,\"default\":\"deny\",\"rules\":[]}");
  cr_assert_eq(ce_policy_credential_count(p), 0);
  ce_policy_free(p);
}

Test(credential_load, refusals) {
  load_fails("{\"version\":2,\"default\":\"deny\",\"rules\":[],\"credentials\":[]}",
             "$.credentials: credentials need a version 3 document");
  load_fails(DOC("{}"), "$.credentials: expected an array");
  load_fails(DOC("[1]"), "$.credentials[0]: expected an object");
  load_fails(DOC("[{\"header\":\"a\",\"secret\":\"s\"}]"), "$.credentials[0]: missing member \"host\"");
  load_fails(DOC("[{\"host\":\"a.com\",\"secret\":\"s\"}]"), "$.credentials[0]: missing member \"header\"");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"a\"}]"), "$.credentials[0]: missing member \"secret\"");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"a\",\"secret\":\"s\",\"value\":\"x\"}]"),
             "$.credentials[0].value: unknown member");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"x y\",\"secret\":\"s\"}]"),
             "$.credentials[0].header: bad header \"x y\": a header name is a token (RFC 9110 5.6.2): letters, "
             "digits and !#$%&'*+-.^_`|~");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"Host\",\"secret\":\"s\"}]"),
             "$.credentials[0].header: bad header \"Host\": the proxy owns this field (routing, framing or "
             "connection): a credential cannot be sent in it");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"Proxy-Authorization\",\"secret\":\"s\"}]"),
             "$.credentials[0].header: bad header \"Proxy-Authorization\": the proxy owns this field (routing, "
             "framing or connection): a credential cannot be sent in it");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"\",\"secret\":\"s\"}]"),
             "$.credentials[0].header: bad header \"\": a header name is 1 to 64 bytes");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":1,\"secret\":\"s\"}]"), "$.credentials[0].header: expected a string");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"a\",\"secret\":\"s/t\"}]"),
             "$.credentials[0].secret: bad secret name \"s/t\": 1 to 128 bytes of A-Z, a-z, 0-9, '.', '_' and '-'");
  load_fails(DOC("[{\"host\":\"a.com\",\"header\":\"a\",\"secret\":2}]"), "$.credentials[0].secret: expected a string");
  load_fails(DOC("[{\"host\":\"https://a.com\",\"header\":\"a\",\"secret\":\"s\"}]"),
             "$.credentials[0].host: bad pattern \"https://a.com\" (scheme): write the host only, without \"://\"");
  load_fails(DOC("[{\"host\":3,\"header\":\"a\",\"secret\":\"s\"}]"), "$.credentials[0].host: expected a string");
  load_fails(DOC("[{\"host\":\"a.com\",\"methods\":[\"get\"],\"header\":\"a\",\"secret\":\"s\"}]"),
             "$.credentials[0].methods[0]: bad method \"get\": an upper-case token of A-Z, 0-9, '-' and '_', at "
             "most 32 bytes");
  load_fails(DOC("[{\"host\":\"a.com\",\"paths\":[\"/a/../b\"],\"header\":\"a\",\"secret\":\"s\"}]"),
             "$.credentials[0].paths[0]: bad path pattern \"/a/../b\" (dot_segment): request paths are matched "
             "with \".\" and \"..\" removed; write the path they lead to");

  /* At most 256 entries. */
  size_t cap = 300 * 64 + 256;
  char *doc = malloc(cap), *w = doc;
  w += sprintf(w, "{\"version\":3,\"default\":\"deny\",\"rules\":[],\"credentials\":[");
  for (int i = 0; i < 257; i++)
    w += sprintf(w, "%s{\"host\":\"a.com\",\"header\":\"a\",\"secret\":\"s\"}", i > 0 ? "," : "");
  sprintf(w, "]}");
  load_fails(doc, "$.credentials: more than 256 entries");
  free(doc);
}

Test(credential_check, names_headers_values) {
  char out[CE_CRED_HEADER_MAX + 1];
  cr_assert(ce_credential_name_ok("a.B_c-9", 7));
  cr_assert(!ce_credential_name_ok("", 0));
  cr_assert(!ce_credential_name_ok("a b", 3));
  char big[CE_CRED_VALUE_MAX + 2];
  memset(big, 'x', sizeof(big));
  cr_assert(ce_credential_name_ok(big, CE_CRED_NAME_MAX));
  cr_assert(!ce_credential_name_ok(big, CE_CRED_NAME_MAX + 1));

  cr_assert_null(ce_credential_header_check("X-Api-Key", 9, out));
  cr_assert_str_eq(out, "x-api-key");
  cr_assert_null(ce_credential_header_check(big, CE_CRED_HEADER_MAX, out));
  cr_assert_not_null(ce_credential_header_check(big, CE_CRED_HEADER_MAX + 1, out));
  for (const char *const *h = (const char *const[]){"host", "Content-Length", "transfer-encoding", "connection",
                                                      "keep-alive", "proxy-connection", "TE", "trailer", "upgrade",
                                                      NULL};
       *h != NULL; h++)
    cr_assert_not_null(ce_credential_header_check(*h, strlen(*h), out), "%s", *h);
  cr_assert_not_null(ce_credential_header_check(":path", 5, out));

  cr_assert_null(ce_credential_value_check("Bearer abc", 10));
  cr_assert_null(ce_credential_value_check("a\tb \x80", 5));
  cr_assert_null(ce_credential_value_check(big, CE_CRED_VALUE_MAX));
  cr_assert_str_eq(ce_credential_value_check(big, CE_CRED_VALUE_MAX + 1), "longer than 8192 bytes");
  cr_assert_str_eq(ce_credential_value_check("", 0), "empty");
  cr_assert_not_null(ce_credential_value_check("a\r\nX-Injected: 1", 17));
  cr_assert_not_null(ce_credential_value_check("a\nb", 3));
  cr_assert_not_null(ce_credential_value_check("a\0b", 3));
  cr_assert_not_null(ce_credential_value_check(" a", 2));
  cr_assert_not_null(ce_credential_value_check("a\t", 2));
}

Test(credential_secrets, load_set_get) {
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"gh\":\"Bearer one\",\"ex\":\"k\"}}");
  size_t len = 0;
  const char *v = ce_secrets_get(s, "gh", 2, &len);
  cr_assert_not_null(v);
  cr_assert_eq(len, 10);
  cr_assert(memcmp(v, "Bearer one", 10) == 0);
  cr_assert_null(ce_secrets_get(s, "nope", 4, &len));
  cr_assert_eq(ce_secrets_set(s, "gh", 2, "Bearer two", 10), 0);
  v = ce_secrets_get(s, "gh", 2, &len);
  cr_assert(len == 10 && memcmp(v, "Bearer two", 10) == 0);
  /* A bad value is refused and the old one stays. */
  cr_assert_eq(ce_secrets_set(s, "gh", 2, "x\r\ny", 4), CE_EINVAL);
  cr_assert_eq(ce_secrets_set(s, "g h", 3, "x", 1), CE_EINVAL);
  v = ce_secrets_get(s, "gh", 2, &len);
  cr_assert(len == 10 && memcmp(v, "Bearer two", 10) == 0);
  cr_assert_null(ce_secrets_get(NULL, "gh", 2, &len));
  ce_secrets_free(s);
  ce_secrets_free(NULL);

  /* At most 256. */
  s = secrets_ok("{\"version\":1,\"secrets\":{}}");
  char name[16];
  for (int i = 0; i < CE_CRED_MAX_ENTRIES; i++) {
    int n = snprintf(name, sizeof(name), "s%d", i);
    cr_assert_eq(ce_secrets_set(s, name, (size_t)n, "v", 1), 0);
  }
  cr_assert_eq(ce_secrets_set(s, "one-more", 8, "v", 1), CE_ETOOBIG);
  cr_assert_eq(ce_secrets_set(s, "s7", 2, "w", 1), 0); /* replacing still works */
  ce_secrets_free(s);
}

Test(credential_secrets, refusals_never_show_a_value) {
  secrets_fail("not json \"Bearer sekrit\"", CE_EPARSE, "invalid JSON at line 1, column 3");
  secrets_fail("[]", CE_EINVAL, "$: expected an object");
  secrets_fail("{\"secrets\":{}}", CE_EINVAL, "$: missing member \"version\"");
  secrets_fail("{\"version\":\"1\",\"secrets\":{}}", CE_EINVAL, "$.version: expected an integer");
  secrets_fail("{\"version\":2,\"secrets\":{}}", CE_EVERSION, "$.version: unsupported version 2 (this build reads 1)");
  secrets_fail("{\"version\":1}", CE_EINVAL, "$: missing member \"secrets\"");
  secrets_fail("{\"version\":1,\"secrets\":[]}", CE_EINVAL, "$.secrets: expected an object");
  secrets_fail("{\"version\":1,\"secrets\":{},\"x\":1}", CE_EINVAL, "$[\"x\"]: unknown member");
  secrets_fail("{\"version\":1,\"secrets\":{\"a b\":\"v\"}}", CE_EINVAL,
               "$.secrets[\"a b\"]: bad secret name: 1 to 128 bytes of A-Z, a-z, 0-9, '.', '_' and '-'");
  secrets_fail("{\"version\":1,\"secrets\":{\"a\":1}}", CE_EINVAL, "$.secrets.a: expected a string");
  secrets_fail("{\"version\":1,\"secrets\":{\"a\":\"sekrit\\r\\nX: y\"}}", CE_EINVAL,
               "$.secrets.a: bad value (not shown): a control character (CR, LF, NUL, ...) cannot be part of a "
               "header value");
  secrets_fail("{\"version\":1,\"secrets\":{\"a\":\" sekrit\"}}", CE_EINVAL,
               "$.secrets.a: bad value (not shown): a header value does not start or end with a space or a tab");
  /* A duplicate: jansson names the key in its message; only the position is kept. */
  ce_secrets_t *s = NULL;
  char err[CE_SECRETS_ERROR_MAX];
  const char *dup = "{\"version\":1,\"secrets\":{\"a\":\"x\",\"a\":\"sekrit\"}}";
  cr_expect_eq(ce_secrets_load_buffer(dup, strlen(dup), &s, err), CE_EPARSE);
  cr_expect(strncmp(err, "invalid JSON at line 1, column ", 31) == 0, "%s", err);
  cr_expect_null(strstr(err, "sekrit"));
  char *big = malloc(CE_SECRETS_MAX_BYTES + 2);
  memset(big, ' ', CE_SECRETS_MAX_BYTES + 1);
  big[CE_SECRETS_MAX_BYTES + 1] = '\0';
  secrets_fail(big, CE_ETOOBIG, "the secrets file is larger than 1 MiB");
  free(big);
}

Test(credential_secrets, file_and_check) {
  char dir[] = "/tmp/ce-cred-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof(path), "%s/secrets.json", dir);
  ce_secrets_t *s = NULL;
  char err[CE_SECRETS_ERROR_MAX];
  cr_assert_eq(ce_secrets_load_file(path, &s, err), CE_ENOENT);
  cr_assert_str_eq(err, "cannot open: No such file or directory");
  FILE *f = fopen(path, "w");
  fputs("{\"version\":1,\"secrets\":{\"gh\":\"a\",\"gh-any\":\"b\"}}", f);
  fclose(f);
  cr_assert_eq(ce_secrets_load_file(path, &s, err), 0, "%s", err);

  ce_policy_t *p = load_ok(CREDS);
  cr_assert_eq(ce_secrets_check(s, p, err), CE_EINVAL);
  cr_assert_str_eq(err, "credential 2 (header x-api-key) names the secret \"ex\", which has no value");
  cr_assert_eq(ce_secrets_check(NULL, p, err), CE_EINVAL);
  cr_assert_eq(ce_secrets_set(s, "ex", 2, "c", 1), 0);
  cr_assert_eq(ce_secrets_check(s, p, err), 0);
  ce_policy_free(p);
  p = load_ok("{\"version\":1,\"default\":\"deny\",\"rules\":[]}");
  cr_assert_eq(ce_secrets_check(NULL, p, err), 0);
  ce_policy_free(p);
  ce_secrets_free(s);
  unlink(path);
  cr_assert_eq(rmdir(dir), 0);
}

/* ---- matching and the pipeline call ------------------------------------------ */

static size_t match(const ce_policy_t *p, const char *host, const char *method, const char *target, size_t *idx) {
  int k = ce_policy_credentials_match(p, host, strlen(host), method, method != NULL ? strlen(method) : 0, target,
                                      target != NULL ? strlen(target) : 0, idx, CE_POLICY_MAX_CREDENTIALS);
  cr_assert_geq(k, 0);
  return (size_t)k;
}

Test(credential_match, host_method_path_first_per_header) {
  ce_policy_t *p = load_ok(CREDS);
  size_t idx[CE_POLICY_MAX_CREDENTIALS];
  /* The narrow entry first; the second, for the same header, never joins it. */
  cr_assert_eq(match(p, "api.github.com", "GET", "/repos/myorg/x?y=1", idx), 1);
  cr_assert_eq(idx[0], 0);
  cr_assert_eq(match(p, "API.GitHub.com.:443", "GET", "/repos/myorg/x", idx), 1);
  cr_assert_eq(idx[0], 0);
  /* Another method or path: the broad entry. */
  cr_assert_eq(match(p, "api.github.com", "POST", "/repos/myorg/x", idx), 1);
  cr_assert_eq(idx[0], 1);
  cr_assert_eq(match(p, "api.github.com", "GET", "/repos/myorg/../other", idx), 1);
  cr_assert_eq(idx[0], 1);
  cr_assert_eq(match(p, "api.github.com", "GET", "/repos/myorg%2F..%2Fx", idx), 1);
  cr_assert_eq(idx[0], 1);
  cr_assert_eq(match(p, "api.github.com", NULL, NULL, idx), 1);
  cr_assert_eq(idx[0], 1);
  /* Other hosts: a lookalike gets nothing. */
  cr_assert_eq(match(p, "api.github.com.evil.net", "GET", "/", idx), 0);
  cr_assert_eq(match(p, "github.com", "GET", "/", idx), 0);
  cr_assert_eq(match(p, "a.example.com", "GET", "/", idx), 1);
  cr_assert_eq(idx[0], 2);
  cr_assert_eq(match(p, "example.com", "GET", "/", idx), 0);
  cr_assert_eq(match(p, "bad host", "GET", "/", idx), 0);
  ce_policy_free(p);
}

static size_t fields(ce_h1_field_t *f, const char *const *pairs) {
  size_t n = 0;
  for (; pairs[2 * n] != NULL; n++)
    f[n] = (ce_h1_field_t){pairs[2 * n], strlen(pairs[2 * n]), pairs[2 * n + 1], strlen(pairs[2 * n + 1])};
  return n;
}

static void expect_field(const ce_h1_field_t *f, const char *name, const char *value) {
  cr_expect_eq(f->name_len, strlen(name));
  cr_expect(memcmp(f->name, name, f->name_len) == 0, "name %.*s", (int)f->name_len, f->name);
  cr_expect_eq(f->value_len, strlen(value));
  cr_expect(memcmp(f->value, value, f->value_len) == 0, "value %.*s", (int)f->value_len, f->value);
}

/* f[0..n) is exactly the name/value pairs (NULL-terminated). */
static void expect_fields(const ce_h1_field_t *f, size_t n, const char *const *pairs) {
  size_t want = 0;
  while (pairs[2 * want] != NULL)
    want++;
  cr_assert_eq(n, want, "%zu fields, %zu expected", n, want);
  for (size_t i = 0; i < n; i++)
    expect_field(&f[i], pairs[2 * i], pairs[2 * i + 1]);
}

Test(credential_apply, replaces_every_copy_in_any_case) {
  ce_policy_t *p = load_ok(CREDS);
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"gh\":\"Bearer narrow\",\"gh-any\":\"Bearer broad\","
                               "\"ex\":\"key\"}}");
  ce_h1_field_t f[8];
  size_t n = fields(f, (const char *const[]){":method", "GET", "Accept", "*/*", "authorization", "Bearer fake",
                                             "user-agent", "t", "AUTHORIZATION", "x", "Authorization", "y", NULL});
  ce_credential_request_t rq = {"api.github.com", 14, "GET", 3, "/repos/myorg/a", 14, true};
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 8), 1);
  cr_assert_eq(n, 4);
  expect_field(&f[0], ":method", "GET");
  expect_field(&f[1], "Accept", "*/*");
  expect_field(&f[2], "user-agent", "t");
  expect_field(&f[3], "authorization", "Bearer narrow");

  /* Rotation: the next call has the new value. */
  cr_assert_eq(ce_secrets_set(s, "gh", 2, "Bearer rotated", 14), 0);
  n = fields(f, (const char *const[]){"accept", "*/*", NULL});
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 8), 1);
  cr_assert_eq(n, 2);
  expect_field(&f[1], "authorization", "Bearer rotated");
  ce_secrets_free(s);
  ce_policy_free(p);
}

Test(credential_apply, nothing_for_other_hosts_or_clear_text) {
  ce_policy_t *p = load_ok(CREDS);
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"gh\":\"a\",\"gh-any\":\"b\",\"ex\":\"c\"}}");
  ce_h1_field_t f[4];
  /* Another host keeps the workspace's own field, untouched. */
  size_t n = fields(f, (const char *const[]){"authorization", "mine", NULL});
  ce_credential_request_t rq = {"other.test", 10, "GET", 3, "/", 1, true};
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 4), 0);
  cr_assert_eq(n, 1);
  expect_field(&f[0], "authorization", "mine");
  /* Plain HTTP to the credential's host: no credential. */
  ce_credential_request_t clear = {"api.github.com", 14, "GET", 3, "/", 1, false};
  cr_assert_eq(ce_credential_apply(p, s, &clear, f, &n, 4), 0);
  cr_assert_eq(n, 1);
  expect_field(&f[0], "authorization", "mine");
  ce_secrets_free(s);
  ce_policy_free(p);
}

Test(credential_apply, several_headers_and_a_full_block) {
  ce_policy_t *p = load_ok(DOC("[{\"host\":\"a.example.com\",\"header\":\"authorization\",\"secret\":\"one\"},"
                               "{\"host\":\"*.example.com\",\"header\":\"x-api-key\",\"secret\":\"two\"}]"));
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"one\":\"1\",\"two\":\"2\"}}");
  ce_h1_field_t f[3];
  size_t n = fields(f, (const char *const[]){"X-API-KEY", "mine", NULL});
  ce_credential_request_t rq = {"a.example.com", 13, "PUT", 3, "/", 1, true};
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 3), 2);
  cr_assert_eq(n, 2);
  expect_field(&f[0], "authorization", "1");
  expect_field(&f[1], "x-api-key", "2");

  /* No room left: refused, never sent without it. */
  n = fields(f, (const char *const[]){"a", "1", "b", "2", "c", "3", NULL});
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 3), CE_ETOOBIG);
  /* A secret without a value (never after a start-up check): refused. */
  ce_secrets_t *empty = secrets_ok("{\"version\":1,\"secrets\":{}}");
  n = 0;
  cr_assert_eq(ce_credential_apply(p, empty, &rq, f, &n, 3), CE_EINVAL);
  ce_secrets_free(empty);
  ce_secrets_free(s);
  ce_policy_free(p);
}

/* "Connection: authorization" names the workspace's field for its own
 * hop: it must not take away the credential the proxy adds. The block
 * loses the Connection fields and the fields they name (as the writers
 * would drop them), keeps Host and Upgrade (the writers handle those) and
 * the credential. */
Test(credential_apply, a_connection_option_does_not_remove_the_credential) {
  ce_policy_t *p = load_ok(CREDS);
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"gh\":\"a\",\"gh-any\":\"Bearer broad\",\"ex\":\"c\"}}");
  ce_h1_field_t f[16];
  size_t n = fields(f, (const char *const[]){"Host", "api.github.com", "Connection", "x-hop, Authorization",
                                             "x-hop", "1", "accept", "*/*", "connection", "upgrade , host",
                                             "Upgrade", "websocket", "Authorization", "mine", "X-HOP", "2", NULL});
  ce_credential_request_t rq = {"api.github.com", 14, "POST", 4, "/", 1, true};
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 16), 1);
  expect_fields(f, n,
                (const char *const[]){"Host", "api.github.com", "accept", "*/*", "Upgrade", "websocket",
                                      "authorization", "Bearer broad", NULL});

  /* A Connection field that names no credential changes nothing here
   * (the writers drop what it names). */
  n = fields(f, (const char *const[]){"Connection", "x-hop", "x-hop", "1", NULL});
  cr_assert_eq(ce_credential_apply(p, s, &rq, f, &n, 16), 1);
  expect_fields(f, n, (const char *const[]){"Connection", "x-hop", "x-hop", "1", "authorization", "Bearer broad", NULL});

  /* No credential for the request: the block is left alone. */
  n = fields(f, (const char *const[]){"Connection", "authorization", "authorization", "mine", NULL});
  ce_credential_request_t other = {"other.test", 10, "GET", 3, "/", 1, true};
  cr_assert_eq(ce_credential_apply(p, s, &other, f, &n, 16), 0);
  cr_assert_eq(n, 2);
  ce_secrets_free(s);
  ce_policy_free(p);
}

/* A block with a Connection field and more fields than the writers take
 * is refused rather than judged on part of it. */
Test(credential_apply, a_connection_field_in_an_oversized_block_is_refused) {
  ce_policy_t *p = load_ok(CREDS);
  ce_secrets_t *s = secrets_ok("{\"version\":1,\"secrets\":{\"gh\":\"a\",\"gh-any\":\"b\",\"ex\":\"c\"}}");
  size_t cap = CE_H1_MAX_FIELDS + 2;
  ce_h1_field_t *f = calloc(cap, sizeof(*f));
  cr_assert_not_null(f);
  for (size_t i = 0; i < CE_H1_MAX_FIELDS; i++)
    f[i] = (ce_h1_field_t){.name = "x-filler", .name_len = 8, .value = "1", .value_len = 1};
  f[0] = (ce_h1_field_t){.name = "connection", .name_len = 10, .value = "authorization", .value_len = 13};
  size_t n = CE_H1_MAX_FIELDS;
  ce_credential_request_t rq = {"api.github.com", 14, "POST", 4, "/", 1, true};
  cr_expect_eq(ce_credential_apply(p, s, &rq, f, &n, cap), CE_ETOOBIG);
  /* Without the Connection field the same block takes the credential. */
  f[0] = (ce_h1_field_t){.name = "x-filler", .name_len = 8, .value = "1", .value_len = 1};
  n = CE_H1_MAX_FIELDS;
  cr_expect_eq(ce_credential_apply(p, s, &rq, f, &n, cap), 1);
  cr_expect_eq(n, CE_H1_MAX_FIELDS + 1);
  free(f);
  ce_secrets_free(s);
  ce_policy_free(p);
}

static bool builtin(const char *name, size_t len, const void *arg) {
  (void)arg;
  return len == 13 && strncasecmp(name, "authorization", 13) == 0;
}

Test(credential_redact, names_added_once_unless_known) {
  ce_policy_t *p = load_ok(DOC("[{\"host\":\"a.com\",\"header\":\"Authorization\",\"secret\":\"s\"},"
                               "{\"host\":\"b.com\",\"header\":\"X-Api-Key\",\"secret\":\"s\"},"
                               "{\"host\":\"c.com\",\"header\":\"x-api-key\",\"secret\":\"s\"},"
                               "{\"host\":\"d.com\",\"header\":\"x-token\",\"secret\":\"s\"}]"));
  const char *names[3] = {"X-Token"};
  size_t n = 1;
  /* authorization is redacted anyway; x-token is listed already (any case). */
  cr_assert_eq(ce_credential_redact_names(p, names, &n, 3, builtin, NULL), 0);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(names[1], "x-api-key");
  /* Without the built-in check authorization joins; no room after it. */
  n = 1;
  cr_assert_eq(ce_credential_redact_names(p, names, &n, 2, NULL, NULL), CE_ETOOBIG);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(names[1], "authorization");
  ce_policy_free(p);
}
