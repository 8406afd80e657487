/* Tests for c_src/tls/ca.c: CA generation and loading, leaf properties
 * checked with OpenSSL's own APIs, and the LRU cache. */
#include <criterion/criterion.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/fixtures.h"

TestSuite(ca, .init = fx_setup, .fini = fx_teardown);

static char cert_path[FX_PATH_MAX], key_path[FX_PATH_MAX];

static void paths(void) {
  fx_path(cert_path, "ca.pem");
  fx_path(key_path, "ca.key");
}

static ce_ca_t *load_ok(void) {
  char err[512] = "";
  ce_ca_t *ca = NULL;
  int rc = ce_ca_load(cert_path, key_path, &ca, err, sizeof(err));
  cr_assert_eq(rc, CE_OK, "ce_ca_load: %s", err);
  cr_assert_eq(ERR_peek_error(), 0ul);
  return ca;
}

/* Expects ce_ca_load to fail with code, a message containing `file` and
 * `what`, *out untouched and an empty error queue. */
static void load_fails(int code, const char *file, const char *what) {
  char err[512] = "";
  ce_ca_t *sentinel = (ce_ca_t *)&err;
  ce_ca_t *ca = sentinel;
  int rc = ce_ca_load(cert_path, key_path, &ca, err, sizeof(err));
  cr_assert_eq(rc, code, "expected %s, got %s (%s)", ce_err_name(code),
               ce_err_name(rc), err);
  cr_assert_eq(ca, sentinel, "*out changed on failure");
  cr_assert_not_null(strstr(err, file), "message does not name %s: %s", file, err);
  cr_assert_not_null(strstr(err, what), "expected \"%s\" in: %s", what, err);
  cr_assert_eq(ERR_peek_error(), 0ul, "the error queue is not empty");
}

static EVP_PKEY *ec_key(void) {
  EVP_PKEY *k = EVP_EC_gen("P-256");
  cr_assert_not_null(k);
  return k;
}

/* Writes a hand-built CA (self-signed, `key`) to the two paths. */
static void write_ca(EVP_PKEY *key, const fx_cert_spec_t *spec) {
  X509 *x = fx_make_cert(key, spec);
  fx_write_cert(cert_path, x);
  fx_write_key(key_path, key);
  X509_free(x);
}

/* ---- ce_ca_generate_pem ---------------------------------------------------- */

Test(ca, generate_pem_makes_a_matching_ca_in_memory) {
  char *cert = NULL, *key = NULL, err[512];
  size_t cert_len = 0, key_len = 0;
  cr_assert_eq(ce_ca_generate_pem("Memory CA", 2, &cert, &cert_len, &key, &key_len, err,
                                  sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_eq(strlen(cert), cert_len);
  cr_assert_eq(strlen(key), key_len);
  BIO *cb = BIO_new_mem_buf(cert, (int)cert_len);
  BIO *kb = BIO_new_mem_buf(key, (int)key_len);
  X509 *x = PEM_read_bio_X509(cb, NULL, NULL, NULL);
  EVP_PKEY *pk = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL);
  cr_assert_not_null(x);
  cr_assert_not_null(pk);
  cr_assert_eq(X509_check_private_key(x, pk), 1);
  cr_assert_eq(X509_check_ca(x), 1);
  EVP_PKEY_free(pk);
  X509_free(x);
  BIO_free(cb);
  BIO_free(kb);
  OPENSSL_clear_free(key, key_len);
  free(cert);

  /* Refusals leave the outputs untouched. */
  cert = key = (char *)"untouched";
  cr_assert_eq(ce_ca_generate_pem("", 2, &cert, &cert_len, &key, &key_len, err, sizeof(err)),
               CE_EINVAL);
  cr_assert(strstr(err, "common name") != NULL, "%s", err);
  cr_assert_eq(ce_ca_generate_pem("x", 0, &cert, &cert_len, &key, &key_len, err, sizeof(err)),
               CE_EINVAL);
  cr_assert(strstr(err, "1 to 3650 days") != NULL, "%s", err);
  cr_assert_str_eq(cert, "untouched");
  cr_assert_str_eq(key, "untouched");
}

/* ---- ce_ca_generate ------------------------------------------------------- */

Test(ca, generate_writes_a_ca_that_loads) {
  paths();
  umask(022);
  time_t before = time(NULL);
  char err[512];
  cr_assert_eq(ce_ca_generate(CE_CA_DEFAULT_COMMON_NAME, 7, cert_path, key_path,
                              err, sizeof(err)),
               CE_OK, "%s", err);
  struct stat st;
  cr_assert_eq(stat(key_path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "key mode %o", st.st_mode & 0777);
  cr_assert_eq(stat(cert_path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0644, "cert mode %o", st.st_mode & 0777);

  ce_ca_t *ca = load_ok();
  X509 *x = ce_ca_cert(ca);
  char cn[128];
  cr_assert_gt(X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName,
                                         cn, sizeof(cn)),
               0);
  cr_assert_str_eq(cn, "Condukt session CA");
  cr_assert_eq(X509_NAME_cmp(X509_get_subject_name(x), X509_get_issuer_name(x)), 0);
  cr_assert_eq(X509_get_version(x), X509_VERSION_3);
  cr_assert_eq(X509_check_ca(x), 1);
  cr_assert_eq(X509_get_pathlen(x), 0);
  cr_assert_eq(X509_get_key_usage(x), (uint32_t)(KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  cr_assert_not_null(X509_get0_subject_key_id(x));
  cr_assert_eq(X509_get_signature_nid(x), NID_ecdsa_with_SHA256);
  EVP_PKEY *pub = X509_get0_pubkey(x);
  cr_assert_eq(EVP_PKEY_get_base_id(pub), EVP_PKEY_EC);
  char group[64];
  cr_assert_eq(EVP_PKEY_get_group_name(pub, group, sizeof(group), NULL), 1);
  cr_assert_str_eq(group, "prime256v1");
  BIGNUM *serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  cr_assert_eq(BN_num_bits(serial), 128);
  cr_assert_eq(BN_is_negative(serial), 0);
  BN_free(serial);
  /* Self-signature verifies. */
  cr_assert_eq(X509_verify(x, pub), 1);
  long nb = fx_time_diff(X509_get0_notBefore(x), before);
  long na = fx_time_diff(X509_get0_notAfter(x), before);
  cr_assert(nb >= -3600 - 5 && nb <= -3600 + 5, "notBefore offset %ld", nb);
  cr_assert(na >= 7 * 86400 - 5 && na <= 7 * 86400 + 5, "notAfter offset %ld", na);
  ce_ca_free(ca);
}

Test(ca, generate_accepts_the_limits) {
  paths();
  char err[512];
  /* 64 characters of two bytes each: the limit counts characters. */
  char cn[64 * 2 + 1] = "";
  for (int i = 0; i < 64; i++)
    strcat(cn, "\xc3\xa9");
  cr_assert_eq(ce_ca_generate(cn, CE_CA_MAX_DAYS, cert_path, key_path, err,
                              sizeof(err)),
               CE_OK, "%s", err);
  ce_ca_t *ca = load_ok();
  long na = fx_time_diff(X509_get0_notAfter(ce_ca_cert(ca)), time(NULL));
  cr_assert(na > 3649L * 86400 && na <= 3650L * 86400 + 5, "%ld", na);
  ce_ca_free(ca);
}

Test(ca, generate_refuses_bad_arguments) {
  paths();
  char err[512];
  char long_cn[66];
  memset(long_cn, 'a', 65);
  long_cn[65] = '\0';
  static const char *bad_cns[] = {"", "tab\there", "bad \xff utf8", "del\x7f",
                                  "c1 \xc2\x85 control"};
  for (size_t i = 0; i < sizeof(bad_cns) / sizeof(bad_cns[0]); i++) {
    cr_assert_eq(ce_ca_generate(bad_cns[i], 7, cert_path, key_path, err,
                                sizeof(err)),
                 CE_EINVAL, "cn %zu", i);
    cr_assert_not_null(strstr(err, "common name"), "%s", err);
  }
  cr_assert_eq(ce_ca_generate(long_cn, 7, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_eq(ce_ca_generate(NULL, 7, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_eq(ce_ca_generate("x", 0, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_not_null(strstr(err, "1 to 3650 days"), "%s", err);
  cr_assert_eq(ce_ca_generate("x", CE_CA_MAX_DAYS + 1, cert_path, key_path, err,
                              sizeof(err)),
               CE_EINVAL);
  cr_assert_eq(ce_ca_generate("x", 7, "", key_path, err, sizeof(err)), CE_EINVAL);
  cr_assert_eq(ce_ca_generate("x", 7, cert_path, NULL, err, sizeof(err)), CE_EINVAL);
  cr_assert_eq(ce_ca_generate("x", 7, cert_path, cert_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_not_null(strstr(err, "two different files"), "%s", err);
  /* Nothing was created by any of these. */
  cr_assert_neq(access(cert_path, F_OK), 0);
  cr_assert_neq(access(key_path, F_OK), 0);
  /* err may be NULL. */
  cr_assert_eq(ce_ca_generate("", 7, cert_path, key_path, NULL, 0), CE_EINVAL);
}

Test(ca, generate_never_overwrites) {
  paths();
  char err[512];
  fx_write_text(cert_path, "keep me\n");
  cr_assert_eq(ce_ca_generate("x", 7, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_not_null(strstr(err, cert_path), "%s", err);
  cr_assert_not_null(strstr(err, "already exists; refusing to overwrite it"), "%s", err);
  cr_assert_neq(access(key_path, F_OK), 0, "the key was created");
  char *text = fx_read_text(cert_path);
  cr_assert_str_eq(text, "keep me\n");
  free(text);

  unlink(cert_path);
  fx_write_text(key_path, "old key\n");
  cr_assert_eq(ce_ca_generate("x", 7, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_not_null(strstr(err, key_path), "%s", err);
  cr_assert_neq(access(cert_path, F_OK), 0, "the certificate was created");
  text = fx_read_text(key_path);
  cr_assert_str_eq(text, "old key\n");
  free(text);

  /* A dangling symbolic link counts as existing: nothing is written
   * through it. */
  unlink(key_path);
  char target[FX_PATH_MAX];
  fx_path(target, "elsewhere");
  cr_assert_eq(symlink(target, key_path), 0);
  cr_assert_eq(ce_ca_generate("x", 7, cert_path, key_path, err, sizeof(err)),
               CE_EINVAL);
  cr_assert_neq(access(target, F_OK), 0);
}

Test(ca, generate_reports_unwritable_paths) {
  char err[512], cert[FX_PATH_MAX], key[FX_PATH_MAX];
  fx_path(cert, "missing-dir/ca.pem");
  fx_path(key, "ca.key");
  cr_assert_eq(ce_ca_generate("x", 7, cert, key, err, sizeof(err)), CE_EIO);
  cr_assert_not_null(strstr(err, cert), "%s", err);
  cr_assert_not_null(strstr(err, "cannot create: No such file or directory"), "%s", err);
  /* The key was written first and removed again. */
  cr_assert_neq(access(key, F_OK), 0, "the key file was left behind");

  fx_path(cert, "ca.pem");
  fx_path(key, "missing-dir/ca.key");
  cr_assert_eq(ce_ca_generate("x", 7, cert, key, err, sizeof(err)), CE_EIO);
  cr_assert_not_null(strstr(err, key), "%s", err);
  cr_assert_neq(access(cert, F_OK), 0);
}

/* ---- ce_ca_load refusals ----------------------------------------------------- */

Test(ca, load_missing_files) {
  paths();
  load_fails(CE_ENOENT, cert_path, "cannot open: No such file or directory");
  fx_generate_ca(7);
  unlink(key_path);
  load_fails(CE_ENOENT, key_path, "cannot open: No such file or directory");
}

Test(ca, load_refuses_garbage) {
  paths();
  fx_generate_ca(7);
  char *key_text = fx_read_text(key_path);
  char *cert_text = fx_read_text(cert_path);

  fx_write_text(cert_path, "this is not PEM\n");
  load_fails(CE_EPARSE, cert_path, "no PEM certificate");
  fx_write_text(cert_path, "");
  load_fails(CE_EPARSE, cert_path, "no PEM certificate");
  fx_write_text(cert_path, "-----BEGIN CERTIFICATE-----\nAAAA!!!!\n"
                           "-----END CERTIFICATE-----\n");
  load_fails(CE_EPARSE, cert_path, "malformed");
  /* A key where the certificate should be. */
  fx_write_text(cert_path, key_text);
  load_fails(CE_EPARSE, cert_path, "no PEM certificate");

  fx_write_text(cert_path, cert_text);
  fx_write_text(key_path, "garbage\n");
  load_fails(CE_EPARSE, key_path, "no PEM private key");
  fx_write_text(key_path, "");
  load_fails(CE_EPARSE, key_path, "no PEM private key");
  fx_write_text(key_path, "-----BEGIN PRIVATE KEY-----\nAAAA\n"
                          "-----END PRIVATE KEY-----\n");
  load_fails(CE_EPARSE, key_path, "the PEM private key is malformed");
  fx_write_text(key_path, "-----BEGIN EC PRIVATE KEY-----\n!!!!\n"
                          "-----END EC PRIVATE KEY-----\n");
  load_fails(CE_EPARSE, key_path, "the PEM private key is malformed");
  /* A certificate where the key should be. */
  fx_write_text(key_path, cert_text);
  load_fails(CE_EPARSE, key_path, "no PEM private key");
  /* A key after a certificate in the same file is found. */
  char both[8192];
  snprintf(both, sizeof(both), "%s%s", cert_text, key_text);
  fx_write_text(key_path, both);
  ce_ca_t *ca = load_ok();
  ce_ca_free(ca);
  free(key_text);
  free(cert_text);
}

Test(ca, load_refuses_an_encrypted_key) {
  paths();
  fx_generate_ca(7);
  char err[512];
  ce_ca_t *ca = NULL;
  cr_assert_eq(ce_ca_load(cert_path, key_path, &ca, err, sizeof(err)), CE_OK);
  BIO *in = BIO_new_file(key_path, "r");
  EVP_PKEY *key = PEM_read_bio_PrivateKey(in, NULL, NULL, NULL);
  BIO_free(in);
  cr_assert_not_null(key);
  unlink(key_path);
  FILE *f = fopen(key_path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(PEM_write_PrivateKey(f, key, EVP_aes_256_cbc(),
                                    (unsigned char *)"secret", 6, NULL, NULL),
               1);
  fclose(f);
  EVP_PKEY_free(key);
  ce_ca_free(ca);
  load_fails(CE_EPARSE, key_path, "encrypted");
}

Test(ca, load_refuses_a_mismatched_key) {
  paths();
  fx_generate_ca(7);
  EVP_PKEY *other = ec_key();
  unlink(key_path);
  fx_write_key(key_path, other);
  EVP_PKEY_free(other);
  load_fails(CE_EINVAL, key_path, "does not match the certificate");
}

Test(ca, load_refuses_a_non_ca_certificate) {
  paths();
  EVP_PKEY *key = ec_key();
  write_ca(key, &(fx_cert_spec_t){.cn = "leaf", .ca = false,
                                  .not_before_offset = -60,
                                  .not_after_offset = 86400});
  load_fails(CE_EINVAL, cert_path, "not a CA certificate");
  write_ca(key, &(fx_cert_spec_t){.cn = "ca", .ca = true,
                                  .key_usage = "critical,digitalSignature",
                                  .not_before_offset = -60,
                                  .not_after_offset = 86400});
  load_fails(CE_EINVAL, cert_path, "keyCertSign");
  EVP_PKEY_free(key);
}

Test(ca, load_refuses_a_ca_outside_its_validity) {
  paths();
  EVP_PKEY *key = ec_key();
  write_ca(key, &(fx_cert_spec_t){.cn = "old", .ca = true,
                                  .not_before_offset = -86400 * 10,
                                  .not_after_offset = -86400});
  load_fails(CE_EINVAL, cert_path, "the CA certificate expired on ");
  write_ca(key, &(fx_cert_spec_t){.cn = "future", .ca = true,
                                  .not_before_offset = 86400,
                                  .not_after_offset = 86400 * 10});
  load_fails(CE_EINVAL, cert_path, "is not valid before ");
  EVP_PKEY_free(key);
}

Test(ca, load_refuses_other_key_types) {
  paths();
  EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  cr_assert_not_null(key);
  write_ca(key, &(fx_cert_spec_t){.cn = "ed", .ca = true,
                                  .not_before_offset = -60,
                                  .not_after_offset = 86400});
  load_fails(CE_EINVAL, key_path, "unsupported key type ED25519");
  EVP_PKEY_free(key);
}

Test(ca, load_refuses_odd_files) {
  paths();
  fx_generate_ca(7);
  char dir[FX_PATH_MAX];
  fx_path(dir, "adir");
  cr_assert_eq(mkdir(dir, 0700), 0);
  strcpy(cert_path, dir);
  load_fails(CE_EINVAL, dir, "not a regular file");

  /* A sparse file over the limit is refused from its size alone. */
  paths();
  unlink(cert_path);
  FILE *f = fopen(cert_path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(ftruncate(fileno(f), 9 * 1024 * 1024), 0);
  fclose(f);
  load_fails(CE_ETOOBIG, cert_path, "larger than");
}

Test(ca, load_refuses_unreadable_files) {
  if (geteuid() == 0) {
    fx_teardown(); /* .fini does not run after a skip */
    cr_skip_test("root reads any file; permission errors cannot be provoked");
  }
  paths();
  fx_generate_ca(7);
  cr_assert_eq(chmod(key_path, 0), 0);
  load_fails(CE_EPERM, key_path, "Permission denied");
}

/* ---- leaves ------------------------------------------------------------------ */

typedef struct {
  ce_ca_t *ca;
  ce_leaf_cache_t *cache;
} env_t;

static env_t env_with_generated_ca(unsigned days, size_t capacity) {
  paths();
  fx_generate_ca(days);
  env_t e = {load_ok(), NULL};
  cr_assert_eq(ce_leaf_cache_new(e.ca, capacity, &e.cache), CE_OK);
  return e;
}

static void env_free(env_t *e) {
  ce_leaf_cache_free(e->cache);
  ce_ca_free(e->ca);
}

static void get_ok(env_t *e, const char *host, X509 **cert, EVP_PKEY **key) {
  int rc = ce_leaf_get(e->cache, host, cert, key);
  cr_assert_eq(rc, CE_OK, "ce_leaf_get(%s): %s", host, ce_err_name(rc));
  cr_assert_eq(ERR_peek_error(), 0ul);
}

/* Verifies leaf against the CA alone, for purpose sslserver, and checks
 * the host with X509_check_host / X509_check_ip_asc. */
static void verify_leaf(X509 *ca, X509 *leaf, const char *host, bool ip) {
  X509_STORE *store = X509_STORE_new();
  X509_STORE_CTX *ctx = X509_STORE_CTX_new();
  cr_assert_eq(X509_STORE_add_cert(store, ca), 1);
  cr_assert_eq(X509_STORE_CTX_init(ctx, store, leaf, NULL), 1);
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
  int ok = X509_verify_cert(ctx);
  cr_assert_eq(ok, 1, "verify: %s",
               X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  if (ip)
    cr_assert_eq(X509_check_ip_asc(leaf, host, 0), 1);
  else
    cr_assert_eq(X509_check_host(leaf, host, 0,
                                 X509_CHECK_FLAG_NEVER_CHECK_SUBJECT, NULL),
                 1);
}

/* The leaf's only SAN entry, which must be of type `type`. */
static const GENERAL_NAME *only_san(X509 *leaf, GENERAL_NAMES **keep) {
  GENERAL_NAMES *gens = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
  cr_assert_not_null(gens);
  cr_assert_eq(sk_GENERAL_NAME_num(gens), 1);
  *keep = gens;
  return sk_GENERAL_NAME_value(gens, 0);
}

Test(ca, leaf_for_a_name) {
  env_t e = env_with_generated_ca(7, 0);
  X509 *ca = ce_ca_cert(e.ca);
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  time_t now = time(NULL);
  get_ok(&e, "api.example.com", &leaf, &key);

  cr_assert_eq(X509_get_version(leaf), X509_VERSION_3);
  GENERAL_NAMES *gens;
  const GENERAL_NAME *gn = only_san(leaf, &gens);
  cr_assert_eq(gn->type, GEN_DNS);
  cr_assert_eq(ASN1_STRING_length(gn->d.dNSName), 15);
  cr_assert_eq(memcmp(ASN1_STRING_get0_data(gn->d.dNSName), "api.example.com", 15), 0);
  GENERAL_NAMES_free(gens);
  char cn[128];
  cr_assert_gt(X509_NAME_get_text_by_NID(X509_get_subject_name(leaf),
                                         NID_commonName, cn, sizeof(cn)),
               0);
  cr_assert_str_eq(cn, "api.example.com");
  cr_assert_eq(X509_NAME_cmp(X509_get_issuer_name(leaf), X509_get_subject_name(ca)), 0);

  /* Extensions. */
  cr_assert_eq(X509_check_ca(leaf), 0);
  cr_assert_eq(X509_get_key_usage(leaf), (uint32_t)KU_DIGITAL_SIGNATURE);
  cr_assert_eq(X509_get_extended_key_usage(leaf), (uint32_t)XKU_SSL_SERVER);
  cr_assert_not_null(X509_get0_subject_key_id(leaf));
  cr_assert_eq(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(leaf),
                                     X509_get0_subject_key_id(ca)),
               0);
  cr_assert_eq(X509_get_signature_nid(leaf), NID_ecdsa_with_SHA256);

  /* Serial: 128 random bits, positive. */
  BIGNUM *serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
  cr_assert_eq(BN_num_bits(serial), 128);
  cr_assert_eq(BN_is_negative(serial), 0);
  BN_free(serial);

  /* Key: P-256, matching the certificate. */
  cr_assert_eq(EVP_PKEY_get_base_id(key), EVP_PKEY_EC);
  char group[64];
  cr_assert_eq(EVP_PKEY_get_group_name(key, group, sizeof(group), NULL), 1);
  cr_assert_str_eq(group, "prime256v1");
  cr_assert_eq(X509_check_private_key(leaf, key), 1);

  /* Validity: from an hour ago (the CA started earlier still) to the CA's
   * end, since this CA lives 7 days, less than CE_LEAF_MAX_DAYS. */
  long nb = fx_time_diff(X509_get0_notBefore(leaf), now);
  cr_assert(nb >= -3600 - 5 && nb <= -3600 + 5, "notBefore offset %ld", nb);
  cr_assert_neq(ASN1_TIME_compare(X509_get0_notBefore(leaf), X509_get0_notBefore(ca)), -1);
  cr_assert_eq(ASN1_TIME_compare(X509_get0_notAfter(leaf), X509_get0_notAfter(ca)), 0);

  verify_leaf(ca, leaf, "api.example.com", false);
  cr_assert_neq(X509_check_host(leaf, "other.example.com", 0, 0, NULL), 1);
  cr_assert_neq(X509_check_host(leaf, "example.com", 0, 0, NULL), 1);
  X509_free(leaf);
  EVP_PKEY_free(key);
  env_free(&e);
}

Test(ca, leaf_lifetime_is_capped) {
  env_t e = env_with_generated_ca(365, 0);
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  time_t now = time(NULL);
  get_ok(&e, "example.org", &leaf, &key);
  long na = fx_time_diff(X509_get0_notAfter(leaf), now);
  cr_assert(na >= 30L * 86400 - 5 && na <= 30L * 86400 + 5, "notAfter offset %ld", na);
  X509_free(leaf);
  EVP_PKEY_free(key);
  env_free(&e);
}

Test(ca, leaf_starts_no_earlier_than_the_ca) {
  paths();
  EVP_PKEY *cakey = ec_key();
  write_ca(cakey, &(fx_cert_spec_t){.cn = "young CA", .ca = true,
                                    .key_usage = "critical,keyCertSign",
                                    .not_before_offset = -60,
                                    .not_after_offset = 86400 * 100});
  EVP_PKEY_free(cakey);
  env_t e = {load_ok(), NULL};
  cr_assert_eq(ce_leaf_cache_new(e.ca, 0, &e.cache), CE_OK);
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  get_ok(&e, "example.org", &leaf, &key);
  X509 *ca = ce_ca_cert(e.ca);
  cr_assert_eq(ASN1_TIME_compare(X509_get0_notBefore(leaf), X509_get0_notBefore(ca)), 0);
  verify_leaf(ca, leaf, "example.org", false);
  X509_free(leaf);
  EVP_PKEY_free(key);
  env_free(&e);
}

Test(ca, leaf_for_ip_literals) {
  env_t e = env_with_generated_ca(7, 0);
  static const struct {
    const char *host;
    int len;
    unsigned char addr[16];
  } cases[] = {
      {"10.0.0.1", 4, {10, 0, 0, 1}},
      {"2001:db8::1", 16, {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    X509 *leaf = NULL;
    EVP_PKEY *key = NULL;
    get_ok(&e, cases[i].host, &leaf, &key);
    GENERAL_NAMES *gens;
    const GENERAL_NAME *gn = only_san(leaf, &gens);
    cr_assert_eq(gn->type, GEN_IPADD, "%s", cases[i].host);
    cr_assert_eq(ASN1_STRING_length(gn->d.iPAddress), cases[i].len);
    cr_assert_eq(memcmp(ASN1_STRING_get0_data(gn->d.iPAddress), cases[i].addr,
                        (size_t)cases[i].len),
                 0);
    GENERAL_NAMES_free(gens);
    verify_leaf(ce_ca_cert(e.ca), leaf, cases[i].host, true);
    /* No DNS SAN: only the subject CN (ignored by the proxy's clients and
     * by browsers) carries the text. */
    cr_assert_neq(X509_check_host(leaf, cases[i].host, 0,
                                  X509_CHECK_FLAG_NEVER_CHECK_SUBJECT, NULL),
                  1);
    X509_free(leaf);
    EVP_PKEY_free(key);
  }
  env_free(&e);
}

Test(ca, leaf_cn_is_cut_but_san_is_whole) {
  env_t e = env_with_generated_ca(7, 0);
  char host[64 * 3 + 16];
  snprintf(host, sizeof(host), "%.63s.%.63s.example.com",
           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
           "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  get_ok(&e, host, &leaf, &key);
  char cn[256];
  cr_assert_eq(X509_NAME_get_text_by_NID(X509_get_subject_name(leaf),
                                         NID_commonName, cn, sizeof(cn)),
               64);
  cr_assert_eq(strncmp(cn, host, 64), 0);
  verify_leaf(ce_ca_cert(e.ca), leaf, host, false);
  X509_free(leaf);
  EVP_PKEY_free(key);
  env_free(&e);
}

Test(ca, leaf_refuses_hosts_that_are_not_normalised) {
  env_t e = env_with_generated_ca(7, 0);
  char too_long[300];
  memset(too_long, 'a', sizeof(too_long) - 1);
  too_long[sizeof(too_long) - 1] = '\0';
  for (int i = 60; i < 290; i += 61)
    too_long[i] = '.';
  const char *bad[] = {"",           "Example.com",     "example.com.",
                       "example.com:443", "[::1]",      "*.example.com",
                       "a..b",       ".a",              "::ffff:10.0.0.1",
                       "2001:DB8::1", "1.2.3",          "010.0.0.1",
                       "a b",        "caf\xc3\xa9.fr",  too_long,
                       NULL};
  X509 *sentinel_cert = (X509 *)&e;
  EVP_PKEY *sentinel_key = (EVP_PKEY *)&e;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    X509 *cert = sentinel_cert;
    EVP_PKEY *key = sentinel_key;
    cr_assert_eq(ce_leaf_get(e.cache, bad[i], &cert, &key), CE_EINVAL,
                 "host %zu accepted", i);
    cr_assert_eq(cert, sentinel_cert);
    cr_assert_eq(key, sentinel_key);
  }
  X509 *cert = NULL;
  cr_assert_eq(ce_leaf_get(e.cache, "example.com", &cert, NULL), CE_EINVAL);
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 0ul);
  env_free(&e);
}

Test(ca, rsa_ca_signs_leaves) {
  paths();
  EVP_PKEY *cakey = EVP_RSA_gen(2048);
  cr_assert_not_null(cakey);
  write_ca(cakey, &(fx_cert_spec_t){.cn = "RSA CA", .ca = true,
                                    .not_before_offset = -3600 * 2,
                                    .not_after_offset = 86400 * 100});
  EVP_PKEY_free(cakey);
  env_t e = {load_ok(), NULL};
  cr_assert_eq(ce_leaf_cache_new(e.ca, 0, &e.cache), CE_OK);
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  get_ok(&e, "example.net", &leaf, &key);
  cr_assert_eq(X509_get_signature_nid(leaf), NID_sha256WithRSAEncryption);
  cr_assert_eq(EVP_PKEY_get_base_id(key), EVP_PKEY_EC);
  verify_leaf(ce_ca_cert(e.ca), leaf, "example.net", false);
  X509_free(leaf);
  EVP_PKEY_free(key);
  env_free(&e);
}

Test(ca, leaf_fails_once_the_ca_expired) {
  paths();
  EVP_PKEY *cakey = ec_key();
  write_ca(cakey, &(fx_cert_spec_t){.cn = "short CA", .ca = true,
                                    .not_before_offset = -60,
                                    .not_after_offset = 2});
  EVP_PKEY_free(cakey);
  env_t e = {load_ok(), NULL};
  cr_assert_eq(ce_leaf_cache_new(e.ca, 0, &e.cache), CE_OK);
  X509 *leaf = NULL;
  EVP_PKEY *key = NULL;
  /* While the CA is valid: the leaf ends with it, which is inside the
   * renewal margin, so every request mints again. */
  get_ok(&e, "example.org", &leaf, &key);
  cr_assert_eq(ASN1_TIME_compare(X509_get0_notAfter(leaf),
                                 X509_get0_notAfter(ce_ca_cert(e.ca))),
               0);
  X509_free(leaf);
  EVP_PKEY_free(key);
  get_ok(&e, "example.org", &leaf, &key);
  X509_free(leaf);
  EVP_PKEY_free(key);
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 2ul);

  sleep(3);
  X509 *cert = NULL;
  key = NULL;
  cr_assert_eq(ce_leaf_get(e.cache, "example.org", &cert, &key), CE_ETLS);
  cr_assert_eq(ce_leaf_get(e.cache, "fresh.example.org", &cert, &key), CE_ETLS);
  cr_assert_null(cert);
  cr_assert_null(key);
  cr_assert_eq(ERR_peek_error(), 0ul);
  env_free(&e);
}

/* ---- the cache ----------------------------------------------------------------- */

static X509 *get_cert(env_t *e, const char *host) {
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  get_ok(e, host, &cert, &key);
  EVP_PKEY_free(key);
  X509_free(cert); /* the cache still holds it; only identity is compared */
  return cert;
}

Test(ca, cache_hits_and_evicts_the_least_recently_used) {
  env_t e = env_with_generated_ca(365, 2);
  X509 *a = get_cert(&e, "a.example");
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 1ul);
  cr_assert_eq(get_cert(&e, "a.example"), a, "a hit returns the cached leaf");
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 1ul);
  get_cert(&e, "b.example");
  cr_assert_eq(ce_leaf_cache_size(e.cache), 2u);
  get_cert(&e, "a.example"); /* a is now the most recent; b the oldest */
  get_cert(&e, "c.example"); /* evicts b */
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 3ul);
  cr_assert_eq(ce_leaf_cache_size(e.cache), 2u);
  cr_assert_eq(get_cert(&e, "a.example"), a);
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 3ul);
  get_cert(&e, "b.example"); /* a miss again; evicts c */
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 4ul);
  get_cert(&e, "a.example");
  get_cert(&e, "b.example");
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 4ul);
  get_cert(&e, "c.example");
  cr_assert_eq(ce_leaf_cache_minted(e.cache), 5ul);
  env_free(&e);
}

Test(ca, cache_holds_its_capacity) {
  env_t e = env_with_generated_ca(365, 0);
  char host[64];
  const int total = (int)CE_LEAF_CACHE_DEFAULT + 100;
  for (int i = 0; i < total; i++) {
    snprintf(host, sizeof(host), "h%d.example", i);
    get_cert(&e, host);
  }
  cr_assert_eq(ce_leaf_cache_size(e.cache), CE_LEAF_CACHE_DEFAULT);
  cr_assert_eq(ce_leaf_cache_minted(e.cache), (unsigned long)total);
  /* The newest CE_LEAF_CACHE_DEFAULT are all still there. */
  for (int i = total - 1; i >= 100; i--) {
    snprintf(host, sizeof(host), "h%d.example", i);
    get_cert(&e, host);
  }
  cr_assert_eq(ce_leaf_cache_minted(e.cache), (unsigned long)total);
  /* The first 100 were evicted. */
  get_cert(&e, "h0.example");
  cr_assert_eq(ce_leaf_cache_minted(e.cache), (unsigned long)total + 1);
  env_free(&e);
}

Test(ca, handed_out_leaves_outlive_the_cache) {
  env_t e = env_with_generated_ca(7, 1);
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  get_ok(&e, "a.example", &cert, &key);
  get_cert(&e, "b.example"); /* evicts a while we hold it */
  env_free(&e);
  cr_assert_eq(X509_check_private_key(cert, key), 1);
  X509_free(cert);
  EVP_PKEY_free(key);
}

Test(ca, cache_new_refusals) {
  env_t e = env_with_generated_ca(7, 0);
  ce_leaf_cache_t *sentinel = (ce_leaf_cache_t *)&e;
  ce_leaf_cache_t *c = sentinel;
  cr_assert_eq(ce_leaf_cache_new(NULL, 0, &c), CE_EINVAL);
  cr_assert_eq(ce_leaf_cache_new(e.ca, CE_LEAF_CACHE_MAX + 1, &c), CE_EINVAL);
  cr_assert_eq(c, sentinel);
  cr_assert_eq(ce_leaf_cache_new(e.ca, CE_LEAF_CACHE_MAX, &c), CE_OK);
  ce_leaf_cache_free(c);
  ce_leaf_cache_free(NULL);
  ce_ca_free(NULL);
  env_free(&e);
}
