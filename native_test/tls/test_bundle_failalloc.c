/* Allocation-failure tests for c_src/tls/bundle.c: building the trust
 * store and writing the three files with each allocation failing in
 * turn, OpenSSL's included (native_test/support/failalloc.h).
 *
 * A failure inside OpenSSL's PEM or DER decoding reads as input it could
 * not decode (CE_EPARSE): OpenSSL does not say it was for lack of
 * memory. What must hold for every n: no crash, no leak (LSan at exit),
 * outputs untouched, no file written (all allocations come before the
 * first), and an empty OpenSSL error queue. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "support/failalloc.h"
#include "tls/bundle.h"
#include "tls/fixtures.h"

TestSuite(bundle_failalloc, .init = fx_setup, .fini = fx_teardown);

static char *cert_pem(const char *cn) {
  X509 *x = fx_self_signed(cn);
  char *s = fx_cert_pem(x);
  X509_free(x);
  return s;
}

static void expect_failure_code(int rc, size_t n) {
  if (ce_failalloc_last_source() == CE_FAILALLOC_OPENSSL)
    cr_assert(rc == CE_ENOMEM || rc == CE_EPARSE, "allocation %zu (OpenSSL): %s", n, ce_err_name(rc));
  else
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
}

Test(bundle_failalloc, build) {
  char *a = cert_pem("Root A"), *b = cert_pem("Root B"), *s = cert_pem("Session CA");
  size_t n_roots = strlen(a) + strlen(b) + 1;
  char *roots = malloc(n_roots);
  cr_assert_not_null(roots);
  snprintf(roots, n_roots, "%s%s", a, b);
  size_t n;
  for (n = 0;; n++) {
    char err[256] = "";
    unsigned char *der = (unsigned char *)0x1;
    size_t len = 7;
    ce_failalloc_arm(n);
    int rc = ce_trust_store_build(roots, strlen(roots), "roots", s, strlen(s), "ca", CE_TRUST_STORE_MAX, &der, &len,
                                  err, sizeof(err));
    ce_failalloc_disarm();
    cr_assert_eq(ERR_peek_error(), 0ul, "allocation %zu: error queue not empty", n);
    if (rc == CE_OK) {
      cr_assert_gt(len, 3 * 300u);
      free(der);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_gt(ce_failalloc_failures(), 0, "%s", err);
    expect_failure_code(rc, n);
    cr_assert_eq(der, (unsigned char *)0x1);
    cr_assert_eq(len, 7u);
  }
  cr_assert_gt(n, 10);
  free(roots);
  free(a);
  free(b);
  free(s);
}

/* How many entries dir holds; with empty, removes them. */
static int entries(const char *dir, bool empty) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int k = 0;
  for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    k++;
    if (empty)
      cr_assert_eq(unlinkat(dirfd(d), e->d_name, 0), 0);
  }
  closedir(d);
  return k;
}

Test(bundle_failalloc, write) {
  char ca[FX_PATH_MAX], roots[FX_PATH_MAX], out[FX_PATH_MAX];
  fx_path(ca, "session.pem");
  fx_path(roots, "roots.pem");
  fx_path(out, "out");
  cr_assert_eq(mkdir(out, 0755), 0);
  char *r = cert_pem("Root A"), *s = cert_pem("Session CA");
  fx_write_text(roots, r);
  fx_write_text(ca, s);
  free(r);
  free(s);
  size_t n;
  for (n = 0;; n++) {
    char err[256] = "";
    ce_failalloc_arm(n);
    int rc = ce_trust_bundle_write(ca, roots, out, err, sizeof(err));
    ce_failalloc_disarm();
    cr_assert_eq(ERR_peek_error(), 0ul, "allocation %zu: error queue not empty", n);
    if (rc == CE_OK) {
      cr_assert_eq(entries(out, true), 3);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_gt(ce_failalloc_failures(), 0, "%s", err);
    expect_failure_code(rc, n);
    /* Nothing is written before both inputs are read and the store is
     * built: the only allocations are there. */
    cr_assert_eq(entries(out, false), 0, "allocation %zu: %s", n, err);
  }
  cr_assert_gt(n, 10);
}
