/* Tests for c_src/tls/bundle.c: the workspace's trust files, their
 * content and mode, the PKCS#12 trust store's layout (read back with
 * OpenSSL, the JDK's keytool and the openssl command), every failure
 * naming its file and leaving no temporary, and `ca bundle` through the
 * built binary. */
#include <criterion/criterion.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/pkcs12.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/bundle.h"
#include "tls/fixtures.h"

static char ca[FX_PATH_MAX], roots[FX_PATH_MAX], out[FX_PATH_MAX];
static char crt[FX_PATH_MAX + 32], copy[FX_PATH_MAX + 32], store[FX_PATH_MAX + 32];
/* The certificates the files hold: roots 0 and 1, then the session's. */
static X509 *certs[3];
static char *cert_pem, *roots_pem;

static void cleanup(void) {
  for (size_t i = 0; i < 3; i++)
    X509_free(certs[i]);
  free(cert_pem);
  free(roots_pem);
  fx_teardown();
}

TestSuite(bundle, .init = fx_setup, .fini = cleanup);

/* Makes the certificates; the session's in session.pem, the roots (a
 * comment, then two certificates without the last newline) in roots.pem
 * when write_roots. */
static void files(bool write_ca, bool write_roots) {
  fx_path(ca, "session.pem");
  fx_path(roots, "roots.pem");
  fx_path(out, "out");
  cr_assert_eq(mkdir(out, 0755), 0);
  snprintf(crt, sizeof(crt), "%s/" CE_BUNDLE_NAME, out);
  snprintf(copy, sizeof(copy), "%s/" CE_BUNDLE_CA_NAME, out);
  snprintf(store, sizeof(store), "%s/" CE_BUNDLE_STORE_NAME, out);
  certs[0] = fx_self_signed("Root A");
  certs[1] = fx_self_signed("Root B");
  certs[2] = fx_self_signed("Session CA");
  char *a = fx_cert_pem(certs[0]), *b = fx_cert_pem(certs[1]);
  cert_pem = fx_cert_pem(certs[2]);
  size_t n = strlen(a) + strlen(b) + 32;
  roots_pem = malloc(n);
  cr_assert_not_null(roots_pem);
  snprintf(roots_pem, n, "# Root A\n%s%s", a, b);
  roots_pem[strlen(roots_pem) - 1] = '\0';
  free(a);
  free(b);
  if (write_ca)
    fx_write_text(ca, cert_pem);
  if (write_roots)
    fx_write_text(roots, roots_pem);
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

static char *expected_bundle(void) {
  size_t n = strlen(roots_pem) + strlen(cert_pem) + 2;
  char *s = malloc(n);
  cr_assert_not_null(s);
  snprintf(s, n, "%s\n%s", roots_pem, cert_pem);
  return s;
}

static mode_t mode_of(const char *path) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  return st.st_mode & 0777;
}

Test(bundle, writes_the_copy_the_store_and_the_bundle_world_readable) {
  files(true, true);
  umask(077);
  char err[256];
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  umask(022);
  char *want = expected_bundle();
  size_t len;
  char *b = read_all(crt, &len);
  /* The roots do not end in a newline: one is added. */
  cr_assert_str_eq(b, want);
  free(b);
  char *c = fx_read_text(copy);
  cr_assert_str_eq(c, cert_pem);
  free(c);
  cr_assert_eq(mode_of(crt), 0644, "%o", mode_of(crt));
  cr_assert_eq(mode_of(copy), 0644, "%o", mode_of(copy));
  cr_assert_eq(mode_of(store), 0444, "%o", mode_of(store));
  cr_assert_eq(entries(), 3);

  /* Again (a restarted init container), over the read-only store and a
   * read-only temporary a killed run left: replaced, not appended. */
  char tmp[FX_PATH_MAX + 32];
  snprintf(tmp, sizeof(tmp), "%s/." CE_BUNDLE_STORE_NAME ".tmp", out);
  fx_write_text(tmp, "stale");
  cr_assert_eq(chmod(tmp, 0444), 0);
  size_t store_len;
  char *first = read_all(store, &store_len);
  fx_write_text(roots, roots_pem);
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  b = read_all(crt, &len);
  cr_assert_str_eq(b, want);
  free(b);
  size_t again_len;
  char *again = read_all(store, &again_len);
  cr_assert_eq(again_len, store_len);
  cr_assert_eq(memcmp(first, again, store_len), 0, "the store is not the same");
  free(first);
  free(again);
  free(want);
  cr_assert_eq(entries(), 3);
}

/* The value of bag's attribute `oid` (exactly one value), or NULL. */
static const ASN1_TYPE *attribute(const PKCS12_SAFEBAG *bag, const char *oid) {
  ASN1_OBJECT *obj = OBJ_txt2obj(oid, 1);
  cr_assert_not_null(obj);
  const STACK_OF(X509_ATTRIBUTE) *attrs = PKCS12_SAFEBAG_get0_attrs(bag);
  const ASN1_TYPE *found = NULL;
  for (int i = 0; i < sk_X509_ATTRIBUTE_num(attrs); i++) {
    X509_ATTRIBUTE *a = sk_X509_ATTRIBUTE_value(attrs, i);
    if (OBJ_cmp(X509_ATTRIBUTE_get0_object(a), obj) == 0) {
      cr_assert_eq(X509_ATTRIBUTE_count(a), 1);
      found = X509_ATTRIBUTE_get0_type(a, 0);
    }
  }
  ASN1_OBJECT_free(obj);
  return found;
}

/* Reads the store at path and checks it holds exactly `want` (count
 * certificates) aliased `aliases`, as trusted certificate bags. */
static void check_store(const char *path, X509 **want, const char *const *aliases, size_t count) {
  size_t len;
  char *der = read_all(path, &len);
  const unsigned char *p = (const unsigned char *)der;
  PKCS12 *p12 = d2i_PKCS12(NULL, &p, (long)len);
  cr_assert_not_null(p12);
  cr_assert_eq((size_t)(p - (const unsigned char *)der), len, "trailing bytes");
  /* No MAC, so no password. */
  cr_assert_not(PKCS12_mac_present(p12));
  STACK_OF(PKCS7) *safes = PKCS12_unpack_authsafes(p12);
  cr_assert_not_null(safes);
  cr_assert_eq(sk_PKCS7_num(safes), 1);
  PKCS7 *p7 = sk_PKCS7_value(safes, 0);
  /* Unencrypted: plain data, not encryptedData. */
  cr_assert_eq(OBJ_obj2nid(p7->type), NID_pkcs7_data);
  STACK_OF(PKCS12_SAFEBAG) *bags = PKCS12_unpack_p7data(p7);
  cr_assert_not_null(bags);
  cr_assert_eq((size_t)sk_PKCS12_SAFEBAG_num(bags), count);
  for (size_t i = 0; i < count; i++) {
    PKCS12_SAFEBAG *bag = sk_PKCS12_SAFEBAG_value(bags, (int)i);
    cr_assert_eq(PKCS12_SAFEBAG_get_nid(bag), NID_certBag);
    X509 *x = PKCS12_SAFEBAG_get1_cert(bag);
    cr_assert_not_null(x);
    cr_assert_eq(X509_cmp(x, want[i]), 0, "bag %zu holds another certificate", i);
    X509_free(x);
    char *name = PKCS12_get_friendlyname(bag);
    cr_assert_not_null(name);
    cr_assert_str_eq(name, aliases[i]);
    OPENSSL_free(name);
    cr_assert_eq(sk_X509_ATTRIBUTE_num(PKCS12_SAFEBAG_get0_attrs(bag)), 2);
    const ASN1_TYPE *usage = attribute(bag, "2.16.840.1.113894.746875.1.1");
    cr_assert_not_null(usage, "bag %zu has no trusted key usage", i);
    cr_assert_eq(usage->type, V_ASN1_OBJECT);
    cr_assert_eq(OBJ_obj2nid(usage->value.object), NID_anyExtendedKeyUsage);
  }
  sk_PKCS12_SAFEBAG_pop_free(bags, PKCS12_SAFEBAG_free);
  sk_PKCS7_pop_free(safes, PKCS7_free);
  PKCS12_free(p12);
  free(der);
}

Test(bundle, holds_the_roots_then_the_session_certificates_as_trusted_entries) {
  files(true, true);
  char err[256];
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  check_store(store, certs, (const char *const[]){"mozilla-001", "mozilla-002", "condukt-session-ca-1"}, 3);

  /* Every certificate of the session file, numbered. */
  size_t n = 2 * strlen(cert_pem) + 1;
  char *two = malloc(n);
  cr_assert_not_null(two);
  snprintf(two, n, "%s%s", cert_pem, cert_pem);
  fx_write_text(ca, two);
  free(two);
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK, "%s", err);
  X509 *want[] = {certs[0], certs[1], certs[2], certs[2]};
  check_store(store, want,
              (const char *const[]){"mozilla-001", "mozilla-002", "condukt-session-ca-1", "condukt-session-ca-2"},
              4);
}

static void expect_failure(int want, const char *needle) {
  char err[256] = "";
  cr_assert_eq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), want, "%s", err);
  cr_assert_not_null(strstr(err, needle), "%s", err);
  cr_assert_neq(access(crt, F_OK), 0, "a bundle was written");
  cr_assert_eq(ERR_peek_error(), 0ul, "the error queue is not empty");
}

Test(bundle, a_missing_or_wrong_certificate_names_the_file) {
  files(false, true);
  expect_failure(CE_ENOENT, "session.pem: cannot open");
  fx_write_text(ca, "not a certificate\n");
  expect_failure(CE_EPARSE, "session.pem: holds no PEM certificate");
  fx_write_text(ca, "-----BEGIN CERTIFICATE-----\nSESSION\n-----END CERTIFICATE-----\n");
  expect_failure(CE_EPARSE, "session.pem: holds a PEM block that cannot be read");
  cr_assert_eq(entries(), 0);
}

Test(bundle, missing_or_empty_roots_name_the_file) {
  files(true, false);
  expect_failure(CE_ENOENT, "roots.pem: cannot open");
  fx_write_text(roots, "");
  expect_failure(CE_EPARSE, "roots.pem: holds no PEM certificate");
  cr_assert_eq(entries(), 0);
}

/* Writes roots.pem: text then the first root's PEM. */
static void roots_with(const char *text) {
  char *good = fx_cert_pem(certs[0]);
  size_t n = strlen(text) + strlen(good) + 1;
  char *s = malloc(n);
  cr_assert_not_null(s);
  snprintf(s, n, "%s%s", text, good);
  fx_write_text(roots, s);
  free(s);
  free(good);
}

Test(bundle, a_root_that_is_not_a_certificate_is_refused_and_nothing_is_written) {
  files(true, false);
  /* Base64 that is not base64. */
  roots_with("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
  expect_failure(CE_EPARSE, "roots.pem: holds a PEM block that cannot be read");

  /* Base64 of something that is not a certificate. */
  char *junk = fx_pem_block("CERTIFICATE", "", (const unsigned char *)"\x30\x03\x02\x01\x05", 5);
  roots_with(junk);
  free(junk);
  expect_failure(CE_EPARSE, "roots.pem: certificate 1 cannot be decoded");

  /* A certificate followed by bytes of something else. */
  unsigned char *der = NULL;
  int len = i2d_X509(certs[1], &der);
  cr_assert_gt(len, 0);
  unsigned char *longer = malloc((size_t)len + 1);
  cr_assert_not_null(longer);
  memcpy(longer, der, (size_t)len);
  longer[len] = 0;
  junk = fx_pem_block("CERTIFICATE", "", longer, len + 1);
  roots_with(junk);
  free(junk);
  expect_failure(CE_EPARSE, "roots.pem: certificate 1 cannot be decoded: trailing data");

  /* An encrypted certificate block is not read, and so refused. */
  junk = fx_pem_block("CERTIFICATE", "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n",
                   der, len);
  roots_with(junk);
  free(junk);
  expect_failure(CE_EPARSE, "roots.pem: holds 2 certificate blocks, of which 1 could be read");
  free(longer);
  OPENSSL_free(der);

  /* PEM, but no certificate. */
  junk = fx_pem_block("PUBLIC KEY", "", (const unsigned char *)"\x30\x00", 2);
  fx_write_text(roots, junk);
  free(junk);
  expect_failure(CE_EPARSE, "roots.pem: holds no PEM certificate");
  cr_assert_eq(entries(), 0);
}

Test(bundle, the_limit_bounds_the_inputs_and_the_store) {
  files(false, false);
  char err[256] = "";
  unsigned char *der = (unsigned char *)0x1;
  size_t len = 7;
  size_t roots_len = strlen(roots_pem), cert_len = strlen(cert_pem);
  /* An input larger than the limit is not read. */
  cr_assert_eq(ce_trust_store_build(roots_pem, roots_len, "roots", cert_pem, cert_len, "ca", roots_len - 1, &der,
                                    &len, err, sizeof(err)),
               CE_ETOOBIG);
  cr_assert_str_eq(err, "roots: too large for a trust store");
  /* The bags together: the session's no longer fits after the roots. */
  cr_assert_eq(ce_trust_store_build(roots_pem, roots_len, "roots", cert_pem, cert_len, "ca", roots_len, &der, &len,
                                    err, sizeof(err)),
               CE_ETOOBIG);
  cr_assert_str_eq(err, "ca: too many certificates for a trust store");
  cr_assert_eq(der, (unsigned char *)0x1);
  cr_assert_eq(len, 7u);
  cr_assert_eq(ERR_peek_error(), 0ul);
  /* A limit above CE_TRUST_STORE_MAX is CE_TRUST_STORE_MAX. */
  cr_assert_eq(ce_trust_store_build(roots_pem, roots_len, "roots", cert_pem, cert_len, "ca", (size_t)-1, &der, &len,
                                    err, sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_gt(len, roots_len / 2);
  free(der);
}

Test(bundle, roots_that_are_not_a_regular_file_are_refused) {
  fx_path(ca, "session.pem");
  fx_write_text(ca, "x");
  fx_path(out, "out");
  char err[256];
  cr_assert_eq(ce_trust_bundle_write(ca, "/dev/zero", out, err, sizeof(err)), CE_EINVAL);
  cr_assert_not_null(strstr(err, "/dev/zero: not a regular file"), "%s", err);
}

Test(bundle, an_unwritable_or_missing_directory_names_it_and_leaves_nothing) {
  files(true, true);
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

  /* A directory in the way of a temporary's name (the store's, then the
   * bundle's): what is renamed into place before stays, nothing after. */
  char blocker[FX_PATH_MAX + 32];
  snprintf(blocker, sizeof(blocker), "%s/." CE_BUNDLE_STORE_NAME ".tmp", out);
  cr_assert_eq(mkdir(blocker, 0755), 0);
  cr_assert_neq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK);
  cr_assert_not_null(strstr(err, ".trust-store.p12.tmp: cannot create"), "%s", err);
  cr_assert_eq(access(copy, F_OK), 0);
  cr_assert_neq(access(store, F_OK), 0);
  cr_assert_neq(access(crt, F_OK), 0);
  cr_assert_eq(rmdir(blocker), 0);

  snprintf(blocker, sizeof(blocker), "%s/." CE_BUNDLE_NAME ".tmp", out);
  cr_assert_eq(mkdir(blocker, 0755), 0);
  cr_assert_neq(ce_trust_bundle_write(ca, roots, out, err, sizeof(err)), CE_OK);
  cr_assert_not_null(strstr(err, ".ca-certificates.crt.tmp: cannot create"), "%s", err);
  cr_assert_eq(access(store, F_OK), 0);
  cr_assert_neq(access(crt, F_OK), 0);
  cr_assert_eq(rmdir(blocker), 0);
}

/* Runs cmd (a shell command line) and returns its exit status and up
 * to cap bytes of its output in buf. */
static int shell(const char *cmd, char *buf, size_t cap) {
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(buf, 1, cap - 1, p);
  buf[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static size_t count(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(text, needle); p != NULL; p = strstr(p + 1, needle))
    n++;
  return n;
}

Test(bundle, the_command_writes_the_files_and_the_jdk_and_openssl_read_the_store, .timeout = 120) {
  files(true, true);
  fx_result_t r;
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, "--roots", roots, "--out-dir", out, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_empty(r.out);
  cr_assert_str_empty(r.err);
  size_t len;
  char *b = read_all(crt, &len);
  char *want = expected_bundle();
  cr_assert_str_eq(b, want);
  free(want);
  free(b);
  check_store(store, certs, (const char *const[]){"mozilla-001", "mozilla-002", "condukt-session-ca-1"}, 3);

  /* The default roots: the snapshot next to the binary. */
  fx_run(&r, (const char *[]){"ca", "bundle", "--ca-cert", ca, "--out-dir", out, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  b = read_all(crt, &len);
  cr_assert_gt(len, 100000u);
  cr_assert_eq(strcmp(b + len - strlen(cert_pem), cert_pem), 0);
  size_t n = count(b, "-----BEGIN CERTIFICATE-----");
  cr_assert_gt(n, 100u);
  free(b);

  static char listing[1024 * 1024];
  char cmd[2 * FX_PATH_MAX + 128];
  snprintf(cmd, sizeof(cmd), "keytool -list -storetype PKCS12 -storepass '' -keystore %s 2>&1", store);
  cr_assert_eq(shell(cmd, listing, sizeof(listing)), 0, "%s", listing);
  char line[64];
  snprintf(line, sizeof(line), "Your keystore contains %zu entries", n);
  cr_assert_not_null(strstr(listing, line), "%s", listing);
  cr_assert_eq(count(listing, "trustedCertEntry"), n, "%s", listing);
  cr_assert_not_null(strstr(listing, "condukt-session-ca-1,"));
  cr_assert_not_null(strstr(listing, "mozilla-001,"));

  snprintf(cmd, sizeof(cmd), "openssl pkcs12 -in %s -nokeys -passin pass: 2>&1", store);
  cr_assert_eq(shell(cmd, listing, sizeof(listing)), 0, "%s", listing);
  cr_assert_eq(count(listing, "-----BEGIN CERTIFICATE-----"), n);

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
