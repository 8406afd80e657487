/* Helpers for the TLS tests (see fixtures.h). */
#include "tls/fixtures.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/tlsconn.h"
#include "support/run.h"

char fx_dir[64];

void fx_setup(void) {
  strcpy(fx_dir, "/tmp/ce_test_tls_XXXXXX");
  cr_assert_not_null(mkdtemp(fx_dir));
}

static int remove_entry(const char *path, const struct stat *st, int type,
                        struct FTW *ftw) {
  return remove(path);
}

void fx_teardown(void) {
  nftw(fx_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

char *fx_path(char *buf, const char *name) {
  snprintf(buf, FX_PATH_MAX, "%s/%s", fx_dir, name);
  return buf;
}

void fx_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot create %s", path);
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

void fx_write_cert(const char *path, X509 *cert) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(PEM_write_X509(f, cert), 1);
  cr_assert_eq(fclose(f), 0);
}

void fx_write_key(const char *path, EVP_PKEY *key) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL), 1);
  cr_assert_eq(fclose(f), 0);
}

char *fx_read_text(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s", path);
  char *buf = malloc(FX_OUT_MAX);
  cr_assert_not_null(buf);
  size_t n = fread(buf, 1, FX_OUT_MAX - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void add_ext(X509 *issuer, X509 *x, int nid, const char *value) {
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer, x, NULL, NULL, 0);
  X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
  cr_assert_not_null(ext, "extension %s", value);
  cr_assert_eq(X509_add_ext(x, ext, -1), 1);
  X509_EXTENSION_free(ext);
}

X509 *fx_make_cert(EVP_PKEY *key, const fx_cert_spec_t *spec) {
  X509 *x = X509_new();
  cr_assert_not_null(x);
  X509 *issuer = spec->issuer != NULL ? spec->issuer : x;
  EVP_PKEY *signer = spec->issuer_key != NULL ? spec->issuer_key : key;
  time_t now = time(NULL);
  cr_assert_eq(X509_set_version(x, X509_VERSION_3), 1);
  cr_assert_eq(ASN1_INTEGER_set(X509_get_serialNumber(x), (long)now), 1);
  cr_assert_not_null(X509_time_adj_ex(X509_getm_notBefore(x), 0,
                                      spec->not_before_offset, &now));
  cr_assert_not_null(X509_time_adj_ex(X509_getm_notAfter(x), 0,
                                      spec->not_after_offset, &now));
  cr_assert_eq(X509_set_pubkey(x, key), 1);
  cr_assert_eq(X509_NAME_add_entry_by_NID(X509_get_subject_name(x),
                                          NID_commonName, MBSTRING_ASC,
                                          (const unsigned char *)spec->cn, -1,
                                          -1, 0),
               1);
  cr_assert_eq(X509_set_issuer_name(x, X509_get_subject_name(issuer)), 1);
  add_ext(issuer, x, NID_basic_constraints,
          spec->ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  if (spec->key_usage != NULL)
    add_ext(issuer, x, NID_key_usage, spec->key_usage);
  add_ext(issuer, x, NID_subject_key_identifier, "hash");
  /* Ed25519 signs without a separate digest. */
  const EVP_MD *md = EVP_PKEY_get_base_id(signer) == EVP_PKEY_ED25519
                         ? NULL
                         : EVP_sha256();
  cr_assert_gt(X509_sign(x, signer, md), 0);
  return x;
}

void fx_generate_ca(unsigned days) {
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  int rc = ce_ca_generate("Test CA", days, fx_path(cert, "ca.pem"),
                          fx_path(key, "ca.key"), err, sizeof(err));
  cr_assert_eq(rc, CE_OK, "ce_ca_generate: %s", err);
}

void fx_run(fx_result_t *r, const char *const *args) {
  const char *bin = getenv("CONDUKT_EGRESS_BIN");
  cr_assert_not_null(bin, "CONDUKT_EGRESS_BIN is not set; run the tests with `make c-test`");
  cr_assert_eq(access(bin, X_OK), 0, "%s is not an executable", bin);
  char *argv[24];
  size_t n = 0;
  argv[n++] = (char *)bin;
  for (size_t i = 0; args[i] != NULL; i++) {
    cr_assert_lt(n, sizeof(argv) / sizeof(argv[0]) - 1);
    argv[n++] = (char *)args[i];
  }
  argv[n] = NULL;

  char out_path[FX_PATH_MAX], err_path[FX_PATH_MAX];
  fx_path(out_path, "stdout");
  fx_path(err_path, "stderr");
  r->status = ce_test_run(bin, argv, out_path, err_path, NULL, NULL);
  char *out = fx_read_text(out_path);
  char *err = fx_read_text(err_path);
  snprintf(r->out, sizeof(r->out), "%s", out);
  snprintf(r->err, sizeof(r->err), "%s", err);
  free(out);
  free(err);
  unlink(out_path);
  unlink(err_path);
}

long fx_time_diff(const ASN1_TIME *a, time_t t) {
  struct tm tm;
  cr_assert_eq(ASN1_TIME_to_tm(a, &tm), 1);
  return (long)(timegm(&tm) - t);
}

X509 *fx_self_signed(const char *cn) {
  EVP_PKEY *key = EVP_EC_gen("P-256");
  cr_assert_not_null(key);
  fx_cert_spec_t spec = {.cn = cn, .ca = true, .not_before_offset = -60, .not_after_offset = 86400};
  X509 *x = fx_make_cert(key, &spec);
  EVP_PKEY_free(key);
  return x;
}

char *fx_pem_block(const char *type, const char *header, const unsigned char *data, long len) {
  BIO *b = BIO_new(BIO_s_mem());
  cr_assert_not_null(b);
  cr_assert_gt(PEM_write_bio(b, type, header, data, len), 0);
  char *p;
  long n = BIO_get_mem_data(b, &p);
  /* Not NUL-terminated: no strndup. */
  char *s = malloc((size_t)n + 1);
  cr_assert_not_null(s);
  memcpy(s, p, (size_t)n);
  s[n] = '\0';
  BIO_free(b);
  return s;
}

char *fx_cert_pem(X509 *cert) {
  unsigned char *der = NULL;
  int len = i2d_X509(cert, &der);
  cr_assert_gt(len, 0);
  char *s = fx_pem_block("CERTIFICATE", "", der, len);
  OPENSSL_free(der);
  return s;
}

size_t fx_shuttle(ce_tlsconn_t *from, ce_tlsconn_t *to) {
  uint8_t buf[4096];
  size_t total = 0;
  while (ce_tlsconn_pending_out(from) > 0) {
    size_t n = ce_tlsconn_take_out(from, buf, sizeof(buf));
    cr_assert_gt(n, 0u);
    cr_assert_eq(ce_tlsconn_feed(to, buf, n), CE_OK);
    total += n;
  }
  return total;
}
