/* Tests for c_src/tls/ca_cmd.c through the built binary
 * ($CONDUKT_EGRESS_BIN, set by `make c-test`): `ca new` writes a CA that
 * ce_ca_load accepts, never overwrites, and names the offending word on
 * every usage error. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/fixtures.h"

TestSuite(ca_cmd, .init = fx_setup, .fini = fx_teardown);

static char cert[FX_PATH_MAX], key[FX_PATH_MAX];

static void paths(void) {
  fx_path(cert, "ca.pem");
  fx_path(key, "ca.key");
}

static void expect_usage_error(const char *const *args, const char *line) {
  fx_result_t r;
  fx_run(&r, args);
  cr_assert_eq(r.status, 2, "status %d, stderr: %s", r.status, r.err);
  cr_assert_str_empty(r.out);
  /* The first line names the problem; the usage follows. */
  size_t n = strlen(line);
  cr_assert(strncmp(r.err, line, n) == 0 && r.err[n] == '\n',
            "expected first line \"%s\", got: %s", line, r.err);
  cr_assert_not_null(strstr(r.err, "usage: condukt-egress ca new"), "%s", r.err);
  cr_assert_neq(access(cert, F_OK), 0, "a certificate was written");
  cr_assert_neq(access(key, F_OK), 0, "a key was written");
}

static ce_ca_t *load(void) {
  char err[512];
  ce_ca_t *ca = NULL;
  cr_assert_eq(ce_ca_load(cert, key, &ca, err, sizeof(err)), CE_OK, "%s", err);
  return ca;
}

static void common_name(ce_ca_t *ca, char *out, size_t cap) {
  cr_assert_gt(X509_NAME_get_text_by_NID(X509_get_subject_name(ce_ca_cert(ca)),
                                         NID_commonName, out, (int)cap),
               0);
}

Test(ca_cmd, new_with_defaults) {
  paths();
  fx_result_t r;
  time_t now = time(NULL);
  fx_run(&r, (const char *[]){"ca", "new", "--cert", cert, "--key", key, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_empty(r.out);
  cr_assert_str_empty(r.err);
  struct stat st;
  cr_assert_eq(stat(key, &st), 0);
  cr_assert_eq(st.st_mode & 0077, 0, "the key is readable by others: %o",
               st.st_mode & 0777);
  ce_ca_t *ca = load();
  char cn[128];
  common_name(ca, cn, sizeof(cn));
  cr_assert_str_eq(cn, "Condukt session CA");
  long na = fx_time_diff(X509_get0_notAfter(ce_ca_cert(ca)), now);
  cr_assert(na >= 7 * 86400 - 5 && na <= 7 * 86400 + 5, "notAfter offset %ld", na);
  ce_ca_free(ca);
}

Test(ca_cmd, new_with_options) {
  paths();
  fx_result_t r;
  time_t now = time(NULL);
  char cert_opt[FX_PATH_MAX + 8];
  snprintf(cert_opt, sizeof(cert_opt), "--cert=%s", cert);
  fx_run(&r, (const char *[]){"ca", "new", "--days", "3650", cert_opt,
                              "--common-name=Sandbox 42 CA", "--key", key, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  ce_ca_t *ca = load();
  char cn[128];
  common_name(ca, cn, sizeof(cn));
  cr_assert_str_eq(cn, "Sandbox 42 CA");
  long na = fx_time_diff(X509_get0_notAfter(ce_ca_cert(ca)), now);
  cr_assert(na >= 3650L * 86400 - 5 && na <= 3650L * 86400 + 5, "%ld", na);
  ce_ca_free(ca);
}

Test(ca_cmd, new_refuses_to_overwrite) {
  paths();
  fx_write_text(cert, "precious\n");
  fx_result_t r;
  fx_run(&r, (const char *[]){"ca", "new", "--cert", cert, "--key", key, NULL});
  cr_assert_eq(r.status, 1);
  char expected[FX_PATH_MAX * 2];
  snprintf(expected, sizeof(expected),
           "condukt-egress: ca new: %s: already exists; refusing to overwrite it\n",
           cert);
  cr_assert_str_eq(r.err, expected);
  char *text = fx_read_text(cert);
  cr_assert_str_eq(text, "precious\n");
  free(text);
  cr_assert_neq(access(key, F_OK), 0);
}

Test(ca_cmd, new_reports_an_unwritable_directory) {
  fx_path(cert, "no/such/dir/ca.pem");
  fx_path(key, "ca.key");
  fx_result_t r;
  fx_run(&r, (const char *[]){"ca", "new", "--cert", cert, "--key", key, NULL});
  cr_assert_eq(r.status, 1);
  char expected[FX_PATH_MAX * 2];
  snprintf(expected, sizeof(expected),
           "condukt-egress: ca new: %s: cannot create: No such file or directory\n",
           cert);
  cr_assert_str_eq(r.err, expected);
  cr_assert_neq(access(key, F_OK), 0, "the key was left behind");
}

Test(ca_cmd, usage_errors_name_the_word) {
  paths();
  char cert_opt[FX_PATH_MAX + 8];
  snprintf(cert_opt, sizeof(cert_opt), "--cert=%s", cert);
  expect_usage_error((const char *[]){"ca", NULL},
                     "condukt-egress: ca: missing subcommand (new, bundle or help)");
  expect_usage_error((const char *[]){"ca", "old", NULL},
                     "condukt-egress: ca: unknown subcommand 'old'");
  expect_usage_error((const char *[]){"ca", "--force", NULL},
                     "condukt-egress: ca: unknown option '--force'");
  expect_usage_error((const char *[]){"ca", "new", "--key", key, NULL},
                     "condukt-egress: ca new: missing --cert PATH");
  expect_usage_error((const char *[]){"ca", "new", "--cert", cert, NULL},
                     "condukt-egress: ca new: missing --key PATH");
  expect_usage_error((const char *[]){"ca", "new", cert_opt, "--key", key, "--force", NULL},
                     "condukt-egress: ca new: unknown option '--force'");
  expect_usage_error((const char *[]){"ca", "new", cert_opt, "--key", key, "-f", NULL},
                     "condukt-egress: ca new: unknown option '-f'");
  expect_usage_error((const char *[]){"ca", "new", cert_opt, "--key", key, "extra", NULL},
                     "condukt-egress: ca new: unexpected argument 'extra'");
  expect_usage_error((const char *[]){"ca", "new", cert_opt, "--key", NULL},
                     "condukt-egress: ca new: missing value after '--key' "
                     "(use --NAME=VALUE for a value starting with '-')");
  expect_usage_error((const char *[]){"ca", "new", "--cert", "--key", key, NULL},
                     "condukt-egress: ca new: missing value after '--cert' "
                     "(use --NAME=VALUE for a value starting with '-')");
  expect_usage_error((const char *[]){"ca", "new", cert_opt, "--key=", NULL},
                     "condukt-egress: ca new: empty value for option '--key='");
  char line[FX_PATH_MAX * 2];
  snprintf(line, sizeof(line), "condukt-egress: ca new: option given twice '%s'", cert_opt);
  expect_usage_error((const char *[]){"ca", "new", cert_opt, cert_opt, "--key", key, NULL},
                     line);
  snprintf(line, sizeof(line),
           "condukt-egress: ca new: --cert and --key name the same file '%s'", cert);
  expect_usage_error((const char *[]){"ca", "new", "--cert", cert, "--key", cert, NULL},
                     line);
}

Test(ca_cmd, bad_days_and_common_names) {
  paths();
  static const char *days[] = {"0", "3651", "-1", "7d", "", "99999999999999999999", " 7"};
  for (size_t i = 0; i < sizeof(days) / sizeof(days[0]); i++) {
    char opt[64], line[128];
    snprintf(opt, sizeof(opt), "--days=%s", days[i]);
    snprintf(line, sizeof(line),
             days[i][0] == '\0'
                 ? "condukt-egress: ca new: empty value for option '--days='"
                 : "condukt-egress: ca new: bad --days '%s' (a whole number from 1 to 3650)",
             days[i]);
    expect_usage_error((const char *[]){"ca", "new", "--cert", cert, "--key", key, opt, NULL},
                       line);
  }
  char long_cn[70];
  memset(long_cn, 'x', 65);
  long_cn[65] = '\0';
  char line[256];
  snprintf(line, sizeof(line),
           "condukt-egress: ca new: bad --common-name '%s' (1 to 64 printable UTF-8 "
           "characters)",
           long_cn);
  expect_usage_error((const char *[]){"ca", "new", "--cert", cert, "--key", key,
                                      "--common-name", long_cn, NULL},
                     line);
  /* A control character is shown escaped, so the message stays one line. */
  expect_usage_error((const char *[]){"ca", "new", "--cert", cert, "--key", key,
                                      "--common-name=bad\nname", NULL},
                     "condukt-egress: ca new: bad --common-name 'bad\\x0aname' "
                     "(1 to 64 printable UTF-8 characters)");
}

Test(ca_cmd, help) {
  static const char *const forms[][3] = {
      {"ca", "help", NULL}, {"ca", "--help", NULL}, {"ca", "-h", NULL}};
  for (size_t i = 0; i < 3; i++) {
    fx_result_t r;
    fx_run(&r, forms[i]);
    cr_assert_eq(r.status, 0);
    cr_assert_str_empty(r.err);
    cr_assert_not_null(strstr(r.out, "usage: condukt-egress ca new --cert PATH --key PATH"),
                       "%s", r.out);
    cr_assert_not_null(strstr(r.out, "1 to 3650 (default 7)"), "%s", r.out);
  }
  fx_result_t r;
  fx_run(&r, (const char *[]){"ca", "new", "--help", NULL});
  cr_assert_eq(r.status, 0);
  cr_assert_not_null(strstr(r.out, "usage: condukt-egress ca new"), "%s", r.out);
}
