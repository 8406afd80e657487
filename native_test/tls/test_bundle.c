/* Tests for c_src/tls/bundle.c: the workspace's trust files, their
 * content and mode, every failure naming its file and leaving no
 * temporary, and `ca bundle` through the built binary. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/bundle.h"
#include "tls/fixtures.h"

TestSuite(bundle, .init = fx_setup, .fini = fx_teardown);

#define CERT "-----BEGIN CERTIFICATE-----\nSESSION\n-----END CERTIFICATE-----\n"
#define ROOTS "# Root A\n-----BEGIN CERTIFICATE-----\nROOTA\n-----END CERTIFICATE-----"

static char ca[FX_PATH_MAX], roots[FX_PATH_MAX], out[FX_PATH_MAX];
static char crt[FX_PATH_MAX + 32], copy[FX_PATH_MAX + 32];

static void files(const char *ca_text, const char *roots_text) {
  fx_path(ca, "session.pem");
  fx_path(roots, "roots.pem");
  fx_path(out, "out");
  cr_assert_eq(mkdir(out, 0755), 0);
  snprintf(crt, sizeof(crt), "%s/" CE_BUNDLE_NAME, out);
  snprintf(copy, sizeof(copy), "%s/" CE_BUNDLE_CA_NAME, out);
  if (ca_text != NULL)
    fx_write_text(ca, ca_text);
  if (roots_text != NULL)
    fx_write_text(roots, roots_text);
}

/* The whole file (fx_read_text stops at FX_OUT_MAX bytes). */
static char *read_all(const char *path, size_t *len) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char *buf = malloc((size_t)st.st_size + 1);
  cr_assert_not_null(buf);
  *len = fread(buf, 1, (size_t)st.st_size, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

/* How many entries out holds (no temporary left). */
static int entries(void) {
  char cmd[FX_PATH_MAX + 32];
  snprintf(cmd, sizeof(cmd), "ls -A %s | wc -l", out);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  int n = -1;
  cr_assert_eq(fscanf(p, "%d", &n), 1);
  pclose(p);
  return n;
}

Test(bundle, writes_the_copy_and_roots_then_the_certificate_world_readable) {
  files(CERT, ROOTS);
  umask(077);
  char err[256];
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  umask(022);
  char *b = fx_read_text(crt);
  /* The roots do not end in a newline: one is added. */
  cr_assert_str_eq(b, ROOTS "\n" CERT);
  free(b);
  char *c = fx_read_text(copy);
  cr_assert_str_eq(c, CERT);
  free(c);
  struct stat st;
  cr_assert_eq(stat(crt, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0644, "%o", st.st_mode & 0777);
  cr_assert_eq(stat(copy, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0644, "%o", st.st_mode & 0777);
  cr_assert_eq(entries(), 2);

  /* Again (a restarted init container): replaced, not appended. */
  fx_write_text(roots, ROOTS "\n");
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  b = fx_read_text(crt);
  cr_assert_str_eq(b, ROOTS "\n" CERT);
  free(b);
  cr_assert_eq(entries(), 2);
}

static void expect_failure(int want, const char *needle) {
  char err[256] = "";
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), want, "%s", err);
  cr_assert_not_null(strstr(err, needle), "%s", err);
  cr_assert_neq(access(crt, F_OK), 0, "a bundle was written");
}

Test(bundle, a_missing_or_wrong_certificate_names_the_file) {
  files(NULL, ROOTS);
  expect_failure(CE_ENOENT, "session.pem: cannot open");
  fx_write_text(ca, "not a certificate\n");
  expect_failure(CE_EPARSE, "session.pem: holds no PEM certificate");
  cr_assert_eq(entries(), 0);
}

Test(bundle, missing_or_empty_roots_name_the_file) {
  files(CERT, NULL);
  expect_failure(CE_ENOENT, "roots.pem: cannot open");
  fx_write_text(roots, "");
  expect_failure(CE_EPARSE, "roots.pem: holds no PEM certificate");
  cr_assert_eq(entries(), 0);
}

Test(bundle, roots_that_are_not_a_regular_file_are_refused) {
  files(CERT, NULL);
  strcpy(roots, "/dev/zero");
  expect_failure(CE_EINVAL, "/dev/zero: not a regular file");
}

Test(bundle, an_unwritable_or_missing_directory_names_it_and_leaves_nothing) {
  files(CERT, ROOTS);
  char missing[FX_PATH_MAX];
  fx_path(missing, "nope");
  char err[256];
  cr_assert_eq(ce_trust_bundle_write(ca, roots, missing, err, sizeof(err)), CE_ENOENT);
  cr_assert_not_null(strstr(err, "nope/.ca.pem.tmp: cannot create"), "%s", err);
  cr_assert_eq(ce_trust_bundle_write(ca, roots, "", err, sizeof(err)), CE_EINVAL);
  cr_assert_str_eq(err, "no directory given");

  char longdir[PATH_MAX + 16];
  memset(longdir, 'a', sizeof(longdir) - 1);
  longdir[sizeof(longdir) - 1] = '\0';
  cr_assert_eq(ce_trust_bundle_write(ca, roots, longdir, err, sizeof(err)), CE_ETOOBIG);
  cr_assert_not_null(strstr(err, "directory name too long"), "%s", err);

  /* A directory the bundle cannot be created in (as root, a file in the
   * way of the temporary's name does it). */
  char blocker[FX_PATH_MAX + 32];
  snprintf(blocker, sizeof(blocker), "%s/." CE_BUNDLE_NAME ".tmp", out);
  cr_assert_eq(mkdir(blocker, 0755), 0);
  cr_assert_neq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK);
  cr_assert_not_null(strstr(err, ".ca-certificates.crt.tmp: cannot create"), "%s", err);
  cr_assert_neq(access(crt, F_OK), 0);
  cr_assert_eq(rmdir(blocker), 0);
}

Test(bundle, the_command_writes_both_files_and_names_its_errors) {
  files(CERT, ROOTS);
  fx_result_t r;
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, "--roots", roots, "--out-dir", out, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_empty(r.out);
  cr_assert_str_empty(r.err);
  char *b = fx_read_text(crt);
  cr_assert_str_eq(b, ROOTS "\n" CERT);
  free(b);

  /* The default roots: the snapshot next to the binary. */
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, "--out-dir", out, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  size_t len;
  b = read_all(crt, &len);
  cr_assert_gt(len, 100000u);
  cr_assert_not_null(strstr(b, "-----BEGIN CERTIFICATE-----"));
  cr_assert_eq(strcmp(b + len - strlen(CERT), CERT), 0);
  free(b);

  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", "/nonexistent.pem", "--out-dir", out, NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_str_eq(r.err, "condukt-egress: ca bundle: /nonexistent.pem: cannot open: No such file or directory\n");

  fx_run(&r, (const char *[]){"ca", "bundle", "--out-dir", out, NULL});
  cr_assert_eq(r.status, 2);
  cr_assert(strncmp(r.err, "condukt-egress: ca bundle: missing --ca-cert PATH\n", 50) == 0, "%s", r.err);
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, NULL});
  cr_assert_eq(r.status, 2);
  cr_assert(strncmp(r.err, "condukt-egress: ca bundle: missing --out-dir DIR\n", 49) == 0, "%s", r.err);
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, "--out-dir", out, "--force", NULL});
  cr_assert_eq(r.status, 2);
  cr_assert(strncmp(r.err, "condukt-egress: ca bundle: unknown option '--force'\n", 51) == 0, "%s", r.err);
}
