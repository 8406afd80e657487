/* Tests for c_src/kube/proto.c: channel framing of v4/v5.channel.k8s.io,
 * the port-forward port prefix (split over messages, a wrong port), an
 * exec Status as an exit code (Success, NonZeroExitCode, a runtime's "exit
 * status N" text, nothing), ExecCredential parsing and RFC 3339 times,
 * and query escaping. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kube/proto.h"
#include "support/failalloc.h"

TestSuite(kube_proto);

Test(kube_proto, frame_split) {
  const uint8_t msg[] = {2, 'o', 'o', 'p', 's'};
  unsigned chan;
  const uint8_t *d;
  size_t n;
  cr_assert(ce_kube_frame_split(msg, sizeof(msg), &chan, &d, &n));
  cr_assert_eq(chan, CE_KUBE_CH_STDERR);
  cr_assert_eq(n, 4);
  cr_assert_eq(memcmp(d, "oops", 4), 0);
  cr_assert(ce_kube_frame_split(msg, 1, &chan, &d, &n));
  cr_assert_eq(n, 0);
  cr_assert_not(ce_kube_frame_split(msg, 0, &chan, &d, &n));
}

Test(kube_proto, port_prefix_whole_split_and_wrong) {
  /* 8080 = 0x1f90, little endian 90 1f. */
  ce_kube_prefix_t p = {0};
  const uint8_t all[] = {0x90, 0x1f, 'h', 'i'};
  size_t skip;
  cr_assert_eq(ce_kube_prefix_feed(&p, 8080, all, sizeof(all), &skip), 0);
  cr_assert_eq(skip, 2);
  cr_assert(ce_kube_prefix_done(&p));
  /* Done: nothing more is taken. */
  cr_assert_eq(ce_kube_prefix_feed(&p, 8080, all + 2, 2, &skip), 0);
  cr_assert_eq(skip, 0);

  ce_kube_prefix_t q = {0};
  cr_assert_eq(ce_kube_prefix_feed(&q, 8080, all, 1, &skip), 0);
  cr_assert_eq(skip, 1);
  cr_assert_not(ce_kube_prefix_done(&q));
  cr_assert_eq(ce_kube_prefix_feed(&q, 8080, NULL, 0, &skip), 0);
  cr_assert_eq(ce_kube_prefix_feed(&q, 8080, all + 1, 3, &skip), 0);
  cr_assert_eq(skip, 1);
  cr_assert(ce_kube_prefix_done(&q));

  ce_kube_prefix_t r = {0};
  cr_assert_eq(ce_kube_prefix_feed(&r, 8081, all, sizeof(all), &skip), -1);
}

static bool code_of(const char *json, int *code) {
  json_t *j = json_loads(json, 0, NULL);
  cr_assert_not_null(j, "%s", json);
  bool ok = ce_kube_exit_code(j, code);
  json_decref(j);
  return ok;
}

Test(kube_proto, exit_codes) {
  int code = -99;
  cr_assert(code_of("{\"metadata\":{},\"status\":\"Success\"}", &code));
  cr_assert_eq(code, 0);
  cr_assert(code_of("{\"status\":\"Failure\",\"reason\":\"NonZeroExitCode\",\"message\":"
                    "\"command terminated with non-zero exit code\",\"details\":{\"causes\":"
                    "[{\"reason\":\"Other\",\"message\":\"x\"},{\"reason\":\"ExitCode\","
                    "\"message\":\"42\"}]}}",
                    &code));
  cr_assert_eq(code, 42);
  /* A runtime that puts the code only in the text. */
  cr_assert(code_of("{\"status\":\"Failure\",\"message\":\"error executing command "
                    "[/bin/sh -c exit 3], exit status 3\"}",
                    &code));
  cr_assert_eq(code, 3);
  /* A bad ExitCode cause falls back to the text. */
  cr_assert(code_of("{\"status\":\"Failure\",\"reason\":\"NonZeroExitCode\",\"message\":"
                    "\"exit status 7\",\"details\":{\"causes\":[{\"reason\":\"ExitCode\","
                    "\"message\":\"seven\"}]}}",
                    &code));
  cr_assert_eq(code, 7);
  /* Nothing to go by. */
  cr_assert_not(code_of("{\"status\":\"Failure\",\"message\":\"container not found\"}", &code));
  cr_assert_not(code_of("{\"status\":\"Failure\",\"message\":\"exit status 3 later\"}", &code));
  cr_assert_not(code_of("{\"status\":\"Failure\",\"message\":\"exit status \"}", &code));
  cr_assert_not(code_of("{\"status\":\"Failure\",\"message\":\"exit status 99999999\"}", &code));
  cr_assert_not(code_of("[1]", &code));
  cr_assert_not(code_of("{}", &code));
}

#define V1 "client.authentication.k8s.io/v1"

static int cred(const char *json, ce_kube_cred_t *c, char *err) {
  return ce_kube_cred_parse(json, strlen(json), V1, c, err, 256);
}

Test(kube_proto, exec_credentials) {
  ce_kube_cred_t c;
  char err[256];
  cr_assert_eq(cred("{\"apiVersion\":\"" V1 "\",\"kind\":\"ExecCredential\",\"status\":"
                    "{\"token\":\"abc\",\"expirationTimestamp\":\"2030-01-02T03:04:05Z\"}}",
                    &c, err),
               CE_OK, "%s", err);
  cr_assert_str_eq(c.token, "abc");
  cr_assert(c.expires);
  cr_assert_eq(c.expiry, (time_t)1893553445);
  ce_kube_cred_free(&c);
  cr_assert_eq(cred("{\"apiVersion\":\"" V1 "\",\"kind\":\"ExecCredential\",\"status\":"
                    "{\"clientCertificateData\":\"CERT\",\"clientKeyData\":\"KEY\"}}",
                    &c, err),
               CE_OK, "%s", err);
  cr_assert_str_eq(c.cert_pem, "CERT");
  cr_assert_str_eq(c.key_pem, "KEY");
  cr_assert_not(c.expires);
  cr_assert_null(c.token);
  ce_kube_cred_free(&c);

  static const struct {
    const char *json, *says;
  } BAD[] = {
      {"not json", "not JSON"},
      {"[]", "not an ExecCredential"},
      {"{\"kind\":\"Other\"}", "not an ExecCredential"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/v1beta1\"}",
       "apiVersion is not " V1},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1 "\"}", "has no status"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1 "\",\"status\":{}}",
       "neither token nor"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1 "\",\"status\":{\"token\":1}}",
       "must be strings"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1 "\",\"status\":{\"token\":\"\"}}",
       "printable ASCII"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"token\":\"a\\nb\"}}",
       "printable ASCII"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"token\":\"a\\r\\nImpersonate-User: system:admin\"}}",
       "printable ASCII"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"token\":\"a b\"}}",
       "printable ASCII"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"token\":\"caf\u00e9\"}}",
       "printable ASCII"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"clientCertificateData\":\"C\"}}",
       "go together"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"clientCertificateData\":\"\",\"clientKeyData\":\"\"}}",
       "must not be empty"},
      {"{\"kind\":\"ExecCredential\",\"apiVersion\":\"" V1
       "\",\"status\":{\"token\":\"t\",\"expirationTimestamp\":\"tomorrow\"}}",
       "RFC 3339"},
      {"{\"kind\":\"ExecCredential\",\"kind\":\"ExecCredential\"}", "not JSON"},
  };
  for (size_t k = 0; k < sizeof(BAD) / sizeof(BAD[0]); k++) {
    int rc = cred(BAD[k].json, &c, err);
    cr_assert_eq(rc, CE_EINVAL, "case %zu", k);
    cr_assert(strstr(err, BAD[k].says) != NULL, "case %zu: %s", k, err);
    cr_assert_null(c.token);
  }
}

Test(kube_proto, exec_credentials_allocation_failures) {
  const char *j = "{\"apiVersion\":\"" V1 "\",\"kind\":\"ExecCredential\",\"status\":"
                  "{\"token\":\"abc\",\"clientCertificateData\":\"C\",\"clientKeyData\":\"K\"}}";
  for (size_t k = 0;; k++) {
    ce_kube_cred_t c;
    char err[256];
    ce_failalloc_arm(k);
    int rc = cred(j, &c, err);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK, "%s", err);
      ce_kube_cred_free(&c);
      break;
    }
    /* jansson's own failures read as "not JSON". */
    cr_assert(rc == CE_ENOMEM || rc == CE_EINVAL, "allocation %zu: %d", k, rc);
  }
}

Test(kube_proto, rfc3339) {
  time_t t;
  cr_assert(ce_kube_rfc3339("1970-01-01T00:00:00Z", &t));
  cr_assert_eq(t, 0);
  cr_assert(ce_kube_rfc3339("1970-01-01T01:00:00.123+01:00", &t));
  cr_assert_eq(t, 0);
  cr_assert(ce_kube_rfc3339("1970-01-01T00:00:00-00:30", &t));
  cr_assert_eq(t, 1800);
  const char *bad[] = {"", "1970-01-01", "1970-01-01T00:00:00", "1970-13-01T00:00:00Z",
                       "1970-01-01T24:00:00Z", "1970-01-01T00:00:00+01", "1970-01-01T00:00:00.Z",
                       "1970-01-01T00:00:00Zx", "197x-01-01T00:00:00Z", "1970-01-01T00:00:00+1:00"};
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
    cr_assert_not(ce_kube_rfc3339(bad[k], &t), "%s", bad[k]);
}

Test(kube_proto, query_escape) {
  char b[32];
  size_t used = 0;
  b[0] = '\0';
  cr_assert(ce_kube_query_escape(b, sizeof(b), &used, "a b&c=/~", 8));
  cr_assert_str_eq(b, "a%20b%26c%3D%2F~");
  used = 0;
  cr_assert_not(ce_kube_query_escape(b, 4, &used, "&&", 2));
}
