/* Allocation-failure tests for c_src/tls/ca.c: generating and loading a
 * CA and minting leaves, with each allocation failing in turn, OpenSSL's
 * included (native_test/support/failalloc.h routes them through the same
 * counter).
 *
 * ca.h documents CE_ETLS for "OpenSSL failed" and CE_ENOMEM for our own
 * allocations: OpenSSL does not say whether a failure was for lack of
 * memory, so an injected failure inside OpenSSL may give either. What
 * must hold for every n: no crash, no leak (LSan at exit), outputs
 * untouched, no file left behind, and an empty OpenSSL error queue. */
#include <criterion/criterion.h>
#include <openssl/err.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "support/failalloc.h"
#include "tls/ca.h"
#include "tls/fixtures.h"

TestSuite(ca_failalloc, .init = fx_setup, .fini = fx_teardown);

static void expect_failure_code(int rc, size_t n) {
  if (ce_failalloc_last_source() == CE_FAILALLOC_OPENSSL)
    cr_assert(rc == CE_ENOMEM || rc == CE_ETLS, "allocation %zu (OpenSSL): %s", n,
              ce_err_name(rc));
  else
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
}

static void generate(const char *cert, const char *key) {
  char err[512];
  cr_assert_eq(ce_ca_generate("failalloc CA", 30, cert, key, err, sizeof(err)), CE_OK, "%s", err);
}

Test(ca_failalloc, generate) {
  char cert[FX_PATH_MAX], key[FX_PATH_MAX];
  fx_path(cert, "ca.pem");
  fx_path(key, "ca.key");
  size_t n;
  for (n = 0;; n++) {
    char err[512] = "";
    ce_failalloc_arm(n);
    int rc = ce_ca_generate("failalloc CA", 30, cert, key, err, sizeof(err));
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      cr_assert_eq(access(cert, F_OK), 0);
      unlink(cert);
      unlink(key);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_gt(ce_failalloc_failures(), 0, "%s", err);
    /* A failure inside PEM writing reads as a file that could not be
     * written (CE_EIO), which is what happened. */
    if (!(rc == CE_EIO && ce_failalloc_last_source() == CE_FAILALLOC_OPENSSL))
      expect_failure_code(rc, n);
    cr_assert_neq(access(cert, F_OK), 0, "allocation %zu: %s left behind", n, cert);
    cr_assert_neq(access(key, F_OK), 0, "allocation %zu: %s left behind", n, key);
    cr_assert_eq(ERR_peek_error(), 0ul, "allocation %zu: error queue not empty", n);
  }
  cr_assert_gt(n, 10);
}

Test(ca_failalloc, load) {
  char cert[FX_PATH_MAX], key[FX_PATH_MAX];
  fx_path(cert, "ca.pem");
  fx_path(key, "ca.key");
  generate(cert, key);
  for (size_t n = 0;; n++) {
    char err[512] = "";
    ce_ca_t *ca = (ce_ca_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce_ca_load(cert, key, &ca, err, sizeof(err));
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      ce_ca_free(ca);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_gt(ce_failalloc_failures(), 0, "%s", err);
    /* ce_ca_load reports OpenSSL's failures as files it cannot read. */
    if (ce_failalloc_last_source() == CE_FAILALLOC_OPENSSL)
      cr_assert(rc == CE_ENOMEM || rc == CE_ETLS || rc == CE_EIO || rc == CE_EINVAL ||
                    rc == CE_EPARSE,
                "allocation %zu: %s", n, ce_err_name(rc));
    else
      cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    cr_assert_eq(ca, (ce_ca_t *)0x1);
    cr_assert_eq(ERR_peek_error(), 0ul, "allocation %zu: error queue not empty", n);
  }
}

Test(ca_failalloc, leaf_cache_and_mint) {
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  fx_path(cert, "ca.pem");
  fx_path(key, "ca.key");
  generate(cert, key);
  ce_ca_t *ca;
  cr_assert_eq(ce_ca_load(cert, key, &ca, err, sizeof(err)), CE_OK, "%s", err);

  /* The cache itself. */
  for (size_t n = 0;; n++) {
    ce_leaf_cache_t *c = (ce_leaf_cache_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce_leaf_cache_new(ca, 4, &c);
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      ce_leaf_cache_free(c);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_eq(rc, CE_ENOMEM);
    cr_assert_eq(c, (ce_leaf_cache_t *)0x1);
  }

  /* A miss mints: a new host every round, on a small cache so that
   * evictions happen too. One leaf first, outside the loop, so that
   * OpenSSL's one-time set-up (providers, method caches) is not what the
   * loop tests. */
  ce_leaf_cache_t *cache;
  cr_assert_eq(ce_leaf_cache_new(ca, 2, &cache), CE_OK);
  X509 *leaf;
  EVP_PKEY *lkey;
  cr_assert_eq(ce_leaf_get(cache, "warm.example", &leaf, &lkey), CE_OK);
  X509_free(leaf);
  EVP_PKEY_free(lkey);
  size_t n;
  for (n = 0;; n++) {
    char host[64];
    snprintf(host, sizeof(host), "h%zu.example", n);
    leaf = (X509 *)0x1;
    lkey = (EVP_PKEY *)0x1;
    size_t before = ce_leaf_cache_size(cache);
    ce_failalloc_arm(n);
    int rc = ce_leaf_get(cache, host, &leaf, &lkey);
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      X509_free(leaf);
      EVP_PKEY_free(lkey);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    cr_assert_gt(ce_failalloc_failures(), 0);
    expect_failure_code(rc, n);
    cr_assert_eq(leaf, (X509 *)0x1);
    cr_assert_eq(lkey, (EVP_PKEY *)0x1);
    cr_assert_eq(ce_leaf_cache_size(cache), before);
    cr_assert_eq(ERR_peek_error(), 0ul, "allocation %zu: error queue not empty", n);
  }
  cr_assert_gt(n, 10);
  ce_leaf_cache_free(cache);
  ce_ca_free(ca);
}
