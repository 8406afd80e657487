/*
 * The session CA and the leaf cache (see ca.h, docs/tls.md).
 *
 * Minting: one fresh ECDSA P-256 key per leaf. Measured with OpenSSL
 * 3.0.x (Debian 12), -O2: a miss costs about 0.4 ms, of which key
 * generation is about 25 us and signing about 30 us; the rest is
 * X509_set_pubkey(), which in OpenSSL 3.0 encodes and decodes the public
 * key through the provider machinery on every certificate, whether or not
 * the key is shared. A shared key would therefore save under a tenth of
 * the cost, while tying every host's leaf to one key, so that a key leaked
 * through one connection's memory would serve for every host. Per-leaf
 * keys keep each leaf independent. A hit costs well under a microsecond.
 *
 * Caching: a hash table of singly linked chains for lookup, and a doubly
 * linked list in use order for eviction, both threaded through the same
 * entries. A lookup hashes the host once and walks one chain; the table has
 * at least twice as many buckets as the cache has entries, so chains stay
 * short for ordinary names. The hash is FNV-1a with a random per-cache
 * seed; it is not collision-resistant against a determined attacker, but
 * a chain can never be longer than the cache capacity, and every lookup is
 * followed by a TLS handshake that costs far more than walking it.
 */
#include "tls/ca.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <unistr.h>

#include "common/error.h"
#include "tls/files.h"
#include "tls/names.h"

#define SECONDS_PER_DAY 86400L
/* RFC 5280 §4.1.2.2 allows serials of up to 20 octets; 128 random bits
 * with the top bit set encode in 17 (a leading zero keeps them positive)
 * and can never be zero. */
#define SERIAL_BITS 128
/* A CN is at most 64 characters (ub-common-name); leaf hosts are ASCII, so
 * bytes and characters agree. The SAN carries the full name anyway. */
#define LEAF_CN_MAX 64u

struct ce_ca {
  X509 *cert;
  EVP_PKEY *key;
};

/* ---- certificate building ------------------------------------------------- */

static int set_random_serial(X509 *x) {
  BIGNUM *bn = BN_new();
  if (bn == NULL)
    return CE_ENOMEM;
  int rc = CE_ETLS;
  if (BN_rand(bn, SERIAL_BITS, BN_RAND_TOP_ONE, BN_RAND_BOTTOM_ANY) == 1 &&
      BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL)
    rc = CE_OK;
  BN_free(bn);
  return rc;
}

/* Adds one extension from its OpenSSL configuration text. The values are
 * fixed strings in this file; host names never go through this parser
 * (the SAN is built directly, see add_san). */
static int add_ext(X509 *issuer, X509 *subject, int nid, const char *value) {
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer, subject, NULL, NULL, 0);
  X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
  if (ext == NULL)
    return CE_ETLS;
  int ok = X509_add_ext(subject, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? CE_OK : CE_ETLS;
}

static int add_san(X509 *x, const char *host, const ce__tls_name_t *name) {
  GENERAL_NAMES *gens = sk_GENERAL_NAME_new_null();
  GENERAL_NAME *gn = GENERAL_NAME_new();
  ASN1_STRING *value = name->kind == CE__TLS_NAME_DNS ? ASN1_IA5STRING_new()
                                                       : ASN1_OCTET_STRING_new();
  int rc = CE_ENOMEM;
  if (gens == NULL || gn == NULL || value == NULL)
    goto fail;
  if (name->kind == CE__TLS_NAME_DNS) {
    if (ASN1_STRING_set(value, host, (int)name->len) != 1)
      goto fail;
    GENERAL_NAME_set0_value(gn, GEN_DNS, value);
  } else {
    int alen = name->kind == CE__TLS_NAME_IPV4 ? 4 : 16;
    if (ASN1_OCTET_STRING_set(value, name->addr, alen) != 1)
      goto fail;
    GENERAL_NAME_set0_value(gn, GEN_IPADD, value);
  }
  value = NULL; /* owned by gn */
  if (sk_GENERAL_NAME_push(gens, gn) <= 0)
    goto fail;
  gn = NULL; /* owned by gens */
  /* Not critical: the subject has a CN, so RFC 5280 §4.2.1.6 does not ask
   * for a critical SAN. */
  rc = X509_add1_ext_i2d(x, NID_subject_alt_name, gens, 0, X509V3_ADD_DEFAULT) == 1
           ? CE_OK
           : CE_ETLS;
fail:
  ASN1_STRING_free(value);
  GENERAL_NAME_free(gn);
  GENERAL_NAMES_free(gens);
  return rc;
}

static int set_common_name(X509_NAME *subject, const char *cn, size_t len,
                           int type) {
  return X509_NAME_add_entry_by_NID(subject, NID_commonName, type,
                                    (const unsigned char *)cn, (int)len, -1,
                                    0) == 1
             ? CE_OK
             : CE_ETLS;
}

static int asn1_time_to_time_t(const ASN1_TIME *t, time_t *out) {
  struct tm tm;
  if (ASN1_TIME_to_tm(t, &tm) != 1)
    return CE_ETLS;
  *out = timegm(&tm);
  return CE_OK;
}

/* Formats t as "2030-01-31 12:00:00 UTC" for messages. */
static void format_time(const ASN1_TIME *t, char *buf, size_t cap) {
  struct tm tm;
  if (ASN1_TIME_to_tm(t, &tm) != 1 ||
      strftime(buf, cap, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
    snprintf(buf, cap, "an unreadable date");
}

/* ---- the CA ----------------------------------------------------------------- */

bool ce_ca_common_name_ok(const char *cn) {
  if (cn == NULL)
    return false;
  size_t n = strlen(cn);
  const uint8_t *s = (const uint8_t *)cn;
  if (n == 0 || u8_check(s, n) != NULL || u8_mbsnlen(s, n) > CE_CA_COMMON_NAME_MAX)
    return false;
  for (size_t i = 0; i < n;) {
    ucs4_t uc;
    int len = u8_mbtouc(&uc, s + i, n - i);
    /* C0, DEL and C1 controls would make the name unprintable in every
     * tool that shows it. */
    if (uc < 0x20 || (uc >= 0x7f && uc <= 0x9f))
      return false;
    i += (size_t)len;
  }
  return true;
}

static int no_passphrase(char *buf, int size, int rwflag, void *u) {
  /* An encrypted key would need a passphrase the sidecar cannot be given
   * safely; refusing here also keeps OpenSSL from prompting on a
   * terminal. */
  *(bool *)u = true;
  return -1;
}

static int load_cert(const char *path, X509 **out, char *err, size_t errlen) {
  BIO *bio = NULL;
  int rc = ce__tls_read_file(path, &bio, err, errlen);
  if (rc != CE_OK)
    return rc;
  X509 *cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
  BIO_free(bio);
  if (cert == NULL) {
    if (ce__tls_error_is_no_pem())
      return ce__tls_fail(err, errlen, CE_EPARSE, path,
                          "no PEM certificate (\"BEGIN CERTIFICATE\") in the file");
    return ce__tls_fail(err, errlen, CE_EPARSE, path,
                        "the PEM certificate is malformed (%s)",
                        ce__tls_openssl_reason());
  }
  *out = cert;
  return CE_OK;
}

static int load_key(const char *path, EVP_PKEY **out, char *err,
                    size_t errlen) {
  BIO *bio = NULL;
  int rc = ce__tls_read_file(path, &bio, err, errlen);
  if (rc != CE_OK)
    return rc;
  /* OpenSSL 3's key decoders report "unsupported" both for a file without
   * any key and for a broken one, so the presence of a PEM key block is
   * checked here to tell the two apart ("PRIVATE KEY", "EC PRIVATE KEY",
   * "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY" all end the same way). */
  char *data = NULL;
  long n = BIO_get_mem_data(bio, &data);
  static const char begin[] = "-----BEGIN ";
  static const char tail[] = "PRIVATE KEY-----";
  const char *block = n > 0 ? memmem(data, (size_t)n, begin, sizeof(begin) - 1) : NULL;
  bool has_key_block = false;
  while (block != NULL && !has_key_block) {
    const char *start = block + sizeof(begin) - 1;
    size_t left = (size_t)(data + n - start);
    const char *eol = memchr(start, '\n', left);
    size_t line = eol != NULL ? (size_t)(eol - start) : left;
    has_key_block = memmem(start, line, tail, sizeof(tail) - 1) != NULL;
    block = memmem(start, left, begin, sizeof(begin) - 1);
  }
  if (!has_key_block) {
    BIO_free(bio);
    return ce__tls_fail(err, errlen, CE_EPARSE, path,
                        "no PEM private key (\"BEGIN PRIVATE KEY\") in the file");
  }
  bool asked = false;
  EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, &asked);
  BIO_free(bio);
  if (key == NULL) {
    if (asked)
      return ce__tls_fail(err, errlen, CE_EPARSE, path,
                          "the private key is encrypted; give an unencrypted "
                          "key readable by the sidecar only");
    return ce__tls_fail(err, errlen, CE_EPARSE, path,
                        "the PEM private key is malformed (%s)",
                        ce__tls_openssl_reason());
  }
  *out = key;
  return CE_OK;
}

static int check_ca(const char *cert_path, const char *key_path, X509 *cert,
                    EVP_PKEY *key, char *err, size_t errlen) {
  int type = EVP_PKEY_get_base_id(key);
  if (type != EVP_PKEY_EC && type != EVP_PKEY_RSA)
    return ce__tls_fail(err, errlen, CE_EINVAL, key_path,
                        "unsupported key type %s; the CA key must be ECDSA or RSA",
                        OBJ_nid2sn(type));
  if (X509_check_private_key(cert, key) != 1)
    return ce__tls_fail(err, errlen, CE_EINVAL, key_path,
                        "the private key does not match the certificate");
  /* basicConstraints CA:TRUE is what makes a certificate an issuer (RFC
   * 5280 §4.2.1.9); X509_check_ca() would also accept version 1
   * certificates, and its single answer cannot say which part is missing. */
  uint32_t flags = X509_get_extension_flags(cert);
  if ((flags & EXFLAG_CA) == 0)
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "not a CA certificate (basicConstraints CA:TRUE is missing)");
  if ((flags & EXFLAG_KUSAGE) != 0 &&
      (X509_get_key_usage(cert) & KU_KEY_CERT_SIGN) == 0)
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "the CA certificate's keyUsage does not allow keyCertSign");
  char when[64];
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
    format_time(X509_get0_notBefore(cert), when, sizeof(when));
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "the CA certificate is not valid before %s", when);
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
    format_time(X509_get0_notAfter(cert), when, sizeof(when));
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "the CA certificate expired on %s", when);
  }
  return CE_OK;
}

int ce_ca_load(const char *cert_path, const char *key_path, ce_ca_t **out,
               char *err, size_t errlen) {
  ERR_clear_error();
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  ce_ca_t *ca = NULL;
  int rc = load_cert(cert_path, &cert, err, errlen);
  if (rc != CE_OK)
    goto fail;
  rc = load_key(key_path, &key, err, errlen);
  if (rc != CE_OK)
    goto fail;
  rc = check_ca(cert_path, key_path, cert, key, err, errlen);
  if (rc != CE_OK)
    goto fail;
  ca = calloc(1, sizeof(*ca));
  if (ca == NULL) {
    rc = ce__tls_fail(err, errlen, CE_ENOMEM, NULL, "out of memory");
    goto fail;
  }
  ca->cert = cert;
  ca->key = key;
  *out = ca;
  return CE_OK;
fail:
  EVP_PKEY_free(key);
  X509_free(cert);
  ERR_clear_error();
  return rc;
}

void ce_ca_free(ce_ca_t *ca) {
  if (ca == NULL)
    return;
  X509_free(ca->cert);
  EVP_PKEY_free(ca->key);
  free(ca);
}

X509 *ce_ca_cert(const ce_ca_t *ca) { return ca->cert; }

/* Builds and signs the self-signed CA certificate for key. */
static int build_ca_cert(const char *cn, unsigned days, EVP_PKEY *key,
                         X509 **out) {
  X509 *x = X509_new();
  if (x == NULL)
    return CE_ENOMEM;
  time_t now = time(NULL);
  /* Backdated like the leaves, for the same slow workspace clocks. */
  time_t start = now - CE_LEAF_BACKDATE_SECONDS;
  int rc = set_random_serial(x);
  if (rc != CE_OK)
    goto fail;
  rc = CE_ETLS;
  if (X509_set_version(x, X509_VERSION_3) != 1 ||
      X509_time_adj_ex(X509_getm_notBefore(x), 0, 0, &start) == NULL ||
      X509_time_adj_ex(X509_getm_notAfter(x), (int)days, 0, &now) == NULL ||
      X509_set_pubkey(x, key) != 1)
    goto fail;
  rc = set_common_name(X509_get_subject_name(x), cn, strlen(cn), MBSTRING_UTF8);
  if (rc != CE_OK)
    goto fail;
  rc = CE_ETLS;
  if (X509_set_issuer_name(x, X509_get_subject_name(x)) != 1)
    goto fail;
  /* pathlen 0: this CA signs leaves only, never another CA (RFC 5280
   * §4.2.1.9), so a leaked leaf key cannot be turned into an issuer. */
  rc = add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  if (rc == CE_OK)
    rc = add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign");
  if (rc == CE_OK)
    rc = add_ext(x, x, NID_subject_key_identifier, "hash");
  if (rc != CE_OK)
    goto fail;
  if (X509_sign(x, key, EVP_sha256()) <= 0) {
    rc = CE_ETLS;
    goto fail;
  }
  *out = x;
  return CE_OK;
fail:
  X509_free(x);
  return rc;
}

/* Creates path exclusively. O_EXCL also refuses a symbolic link at path,
 * so nothing is written through a link an attacker planted. */
static int create_file(const char *path, mode_t mode, FILE **out, char *err,
                       size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    int e = errno;
    if (e == EEXIST)
      return ce__tls_fail(err, errlen, CE_EINVAL, path,
                          "already exists; refusing to overwrite it");
    return ce__tls_fail(err, errlen, CE_EIO, path, "cannot create: %s",
                        strerror(e));
  }
  FILE *f = fdopen(fd, "w");
  if (f == NULL) {
    close(fd);
    unlink(path);
    return ce__tls_fail(err, errlen, CE_ENOMEM, path, "out of memory");
  }
  *out = f;
  return CE_OK;
}

static int finish_file(FILE *f, bool wrote, const char *path, char *err,
                       size_t errlen) {
  int e = 0;
  if (fflush(f) != 0)
    e = errno;
  if (fclose(f) != 0 && e == 0)
    e = errno;
  if (!wrote || e != 0)
    return ce__tls_fail(err, errlen, CE_EIO, path, "cannot write: %s",
                        strerror(e != 0 ? e : EIO));
  return CE_OK;
}

/* Checks the common name and the day count, then makes the key and the
 * self-signed certificate: the part of CA creation that both
 * ce_ca_generate() (files) and ce_ca_generate_pem() (memory) share. On
 * failure nothing is allocated and err says why. */
static int make_ca(const char *common_name, unsigned days, EVP_PKEY **key_out,
                   X509 **cert_out, char *err, size_t errlen) {
  if (common_name == NULL || !ce_ca_common_name_ok(common_name))
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "the common name must be 1 to %u printable UTF-8 "
                        "characters", CE_CA_COMMON_NAME_MAX);
  if (days < 1 || days > CE_CA_MAX_DAYS)
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "the validity must be 1 to %u days", CE_CA_MAX_DAYS);
  EVP_PKEY *key = EVP_EC_gen("P-256");
  if (key == NULL)
    return ce__tls_fail(err, errlen, CE_ETLS, NULL,
                        "cannot generate the CA key: %s", ce__tls_openssl_reason());
  X509 *cert = NULL;
  int rc = build_ca_cert(common_name, days, key, &cert);
  if (rc != CE_OK) {
    rc = ce__tls_fail(err, errlen, rc, NULL, "cannot build the CA certificate: %s",
                      ce__tls_openssl_reason());
    EVP_PKEY_free(key);
    return rc;
  }
  *key_out = key;
  *cert_out = cert;
  return CE_OK;
}

/* Copies a memory BIO's contents into a new NUL-terminated string. */
static int bio_to_string(BIO *bio, char **out, size_t *out_len) {
  char *data = NULL;
  long n = BIO_get_mem_data(bio, &data);
  if (n <= 0 || data == NULL)
    return CE_ETLS;
  char *copy = malloc((size_t)n + 1);
  if (copy == NULL)
    return CE_ENOMEM;
  memcpy(copy, data, (size_t)n);
  copy[n] = '\0';
  *out = copy;
  *out_len = (size_t)n;
  return CE_OK;
}

int ce_ca_generate_pem(const char *common_name, unsigned days, char **cert_pem,
                       size_t *cert_len, char **key_pem, size_t *key_len,
                       char *err, size_t errlen) {
  ERR_clear_error();
  EVP_PKEY *key = NULL;
  X509 *cert = NULL;
  BIO *kb = NULL, *cb = NULL;
  char *ktext = NULL, *ctext = NULL;
  size_t klen = 0, clen = 0;
  int rc = make_ca(common_name, days, &key, &cert, err, errlen);
  if (rc != CE_OK)
    goto fail_make;
  rc = CE_ENOMEM;
  kb = BIO_new(BIO_s_mem());
  cb = BIO_new(BIO_s_mem());
  if (kb == NULL || cb == NULL)
    goto fail_bio;
  rc = CE_ETLS;
  if (PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL) != 1 ||
      PEM_write_bio_X509(cb, cert) != 1)
    goto fail_bio;
  rc = bio_to_string(kb, &ktext, &klen);
  if (rc != CE_OK)
    goto fail_bio;
  rc = bio_to_string(cb, &ctext, &clen);
  if (rc != CE_OK)
    goto fail_text;
  *key_pem = ktext;
  *key_len = klen;
  *cert_pem = ctext;
  *cert_len = clen;
  BIO_free(cb);
  BIO_free(kb);
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return CE_OK;

fail_text:
  /* The key's PEM is a secret: wiped before it goes back to the heap. */
  OPENSSL_clear_free(ktext, klen);
fail_bio:
  if (rc == CE_ENOMEM)
    ce__tls_fail(err, errlen, rc, NULL, "out of memory");
  else
    ce__tls_fail(err, errlen, rc, NULL, "cannot encode the CA as PEM: %s",
                 ce__tls_openssl_reason());
  BIO_free(cb);
  BIO_free(kb);
  X509_free(cert);
  EVP_PKEY_free(key);
fail_make:
  ERR_clear_error();
  return rc;
}

int ce_ca_generate(const char *common_name, unsigned days,
                   const char *cert_path, const char *key_path, char *err,
                   size_t errlen) {
  ERR_clear_error();
  if (!ce_ca_common_name_ok(common_name))
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "the common name must be 1 to %u printable UTF-8 "
                        "characters", CE_CA_COMMON_NAME_MAX);
  if (days < 1 || days > CE_CA_MAX_DAYS)
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "the validity must be 1 to %u days", CE_CA_MAX_DAYS);
  if (cert_path == NULL || key_path == NULL || cert_path[0] == '\0' ||
      key_path[0] == '\0')
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "both a certificate path and a key path are needed");
  if (strcmp(cert_path, key_path) == 0)
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "the certificate and the key need two different files");
  /* Checked before any work so that the common mistake (running the
   * command twice) is reported without creating anything; the O_EXCL
   * opens below still catch a file that appears in between. */
  struct stat st;
  if (lstat(cert_path, &st) == 0)
    return ce__tls_fail(err, errlen, CE_EINVAL, cert_path,
                        "already exists; refusing to overwrite it");
  if (lstat(key_path, &st) == 0)
    return ce__tls_fail(err, errlen, CE_EINVAL, key_path,
                        "already exists; refusing to overwrite it");

  X509 *cert = NULL;
  FILE *kf = NULL, *cf = NULL;
  bool key_created = false;
  EVP_PKEY *key = NULL;
  int rc = make_ca(common_name, days, &key, &cert, err, errlen);
  if (rc != CE_OK)
    goto done;
  /* The key first: if the certificate cannot be created, the key is
   * removed again, and a certificate never exists without its key. */
  rc = create_file(key_path, 0600, &kf, err, errlen);
  if (rc != CE_OK)
    goto done;
  key_created = true;
  bool wrote = PEM_write_PrivateKey(kf, key, NULL, NULL, 0, NULL, NULL) == 1;
  rc = finish_file(kf, wrote, key_path, err, errlen);
  if (rc != CE_OK)
    goto done;
  rc = create_file(cert_path, 0644, &cf, err, errlen);
  if (rc != CE_OK)
    goto done;
  wrote = PEM_write_X509(cf, cert) == 1;
  rc = finish_file(cf, wrote, cert_path, err, errlen);
  if (rc != CE_OK)
    unlink(cert_path);
done:
  if (rc != CE_OK && key_created)
    unlink(key_path);
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return rc;
}

/* ---- leaves ------------------------------------------------------------------ */

/* Sets the leaf's validity to [max(now - backdate, CA notBefore),
 * min(now + CE_LEAF_MAX_DAYS, CA notAfter)], and reports its notAfter. */
static int set_leaf_validity(X509 *x, const ce_ca_t *ca, time_t now,
                             time_t *not_after) {
  const ASN1_TIME *ca_nb = X509_get0_notBefore(ca->cert);
  const ASN1_TIME *ca_na = X509_get0_notAfter(ca->cert);
  /* X509_cmp_time returns -1 when the ASN.1 time is earlier than or equal
   * to the time_t, 1 when later, 0 on error. A CA that is not valid right
   * now cannot give a leaf any validity the workspace would accept. */
  if (X509_cmp_time(ca_nb, &now) != -1 || X509_cmp_time(ca_na, &now) != 1)
    return CE_ETLS;
  time_t start = now - CE_LEAF_BACKDATE_SECONDS;
  int later = X509_cmp_time(ca_nb, &start);
  if (later == 0)
    return CE_ETLS;
  if (later == 1 ? X509_set1_notBefore(x, ca_nb) != 1
                 : X509_time_adj_ex(X509_getm_notBefore(x), 0, 0, &start) == NULL)
    return CE_ETLS;
  time_t end = now + (time_t)CE_LEAF_MAX_DAYS * SECONDS_PER_DAY;
  int earlier = X509_cmp_time(ca_na, &end);
  if (earlier == 0)
    return CE_ETLS;
  if (earlier == -1 ? X509_set1_notAfter(x, ca_na) != 1
                    : X509_time_adj_ex(X509_getm_notAfter(x), 0, 0, &end) == NULL)
    return CE_ETLS;
  return asn1_time_to_time_t(X509_get0_notAfter(x), not_after);
}

static int mint_leaf(const ce_ca_t *ca, const char *host,
                     const ce__tls_name_t *name, X509 **cert_out,
                     EVP_PKEY **key_out, time_t *not_after) {
  X509 *x = NULL;
  EVP_PKEY *key = EVP_EC_gen("P-256");
  int rc = CE_ETLS;
  if (key == NULL)
    goto fail;
  x = X509_new();
  if (x == NULL) {
    rc = CE_ENOMEM;
    goto fail;
  }
  rc = set_random_serial(x);
  if (rc != CE_OK)
    goto fail;
  rc = set_leaf_validity(x, ca, time(NULL), not_after);
  if (rc != CE_OK)
    goto fail;
  rc = CE_ETLS;
  if (X509_set_version(x, X509_VERSION_3) != 1 || X509_set_pubkey(x, key) != 1 ||
      X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) != 1)
    goto fail;
  size_t cn_len = name->len < LEAF_CN_MAX ? name->len : LEAF_CN_MAX;
  rc = set_common_name(X509_get_subject_name(x), host, cn_len, MBSTRING_ASC);
  if (rc == CE_OK)
    rc = add_san(x, host, name);
  if (rc == CE_OK)
    rc = add_ext(ca->cert, x, NID_basic_constraints, "critical,CA:FALSE");
  /* ECDSA keys only sign (the key exchange is ECDHE), so digitalSignature
   * is the one usage a TLS server leaf needs (RFC 5480 §3). */
  if (rc == CE_OK)
    rc = add_ext(ca->cert, x, NID_key_usage, "critical,digitalSignature");
  if (rc == CE_OK)
    rc = add_ext(ca->cert, x, NID_ext_key_usage, "serverAuth");
  if (rc == CE_OK)
    rc = add_ext(ca->cert, x, NID_subject_key_identifier, "hash");
  /* "keyid" without "always": a CA without a subject key identifier still
   * works, its leaves then simply have no authority key identifier. */
  if (rc == CE_OK)
    rc = add_ext(ca->cert, x, NID_authority_key_identifier, "keyid");
  if (rc != CE_OK)
    goto fail;
  if (X509_sign(x, ca->key, EVP_sha256()) <= 0) {
    rc = CE_ETLS;
    goto fail;
  }
  *cert_out = x;
  *key_out = key;
  return CE_OK;
fail:
  X509_free(x);
  EVP_PKEY_free(key);
  return rc;
}

/* ---- the cache ------------------------------------------------------------------ */

typedef struct leaf_entry {
  struct leaf_entry *chain;            /* next in the same bucket */
  struct leaf_entry *newer, *older;    /* use order; newest at cache->newest */
  uint64_t hash;
  X509 *cert;
  EVP_PKEY *key;
  time_t renew_at;                     /* mint again from this time on */
  size_t len;
  char host[];                         /* NUL-terminated */
} leaf_entry_t;

struct ce_leaf_cache {
  ce_ca_t *ca;
  size_t capacity, count;
  unsigned long minted;
  uint64_t seed;
  leaf_entry_t **buckets;
  size_t mask;                         /* bucket count - 1 (a power of two) */
  leaf_entry_t *newest, *oldest;
};

#define FNV64_OFFSET 0xcbf29ce484222325ULL
#define FNV64_PRIME 0x100000001b3ULL

static uint64_t hash_host(uint64_t seed, const char *s, size_t n) {
  uint64_t h = FNV64_OFFSET ^ seed;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= FNV64_PRIME;
  }
  /* The low k bits of an FNV hash depend only on the low k bits of each
   * input byte (xor and multiplication only carry upwards), and the bucket
   * index is taken from the low bits, so the high half is folded in. */
  return h ^ (h >> 32);
}

int ce_leaf_cache_new(ce_ca_t *ca, size_t capacity, ce_leaf_cache_t **out) {
  if (ca == NULL || capacity > CE_LEAF_CACHE_MAX)
    return CE_EINVAL;
  if (capacity == 0)
    capacity = CE_LEAF_CACHE_DEFAULT;
  size_t nbuckets = 16;
  while (nbuckets < 2 * capacity)
    nbuckets *= 2;
  ce_leaf_cache_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return CE_ENOMEM;
  c->buckets = calloc(nbuckets, sizeof(*c->buckets));
  if (c->buckets == NULL) {
    free(c);
    return CE_ENOMEM;
  }
  /* A seed that the workspace cannot predict keeps chosen host names from
   * landing in one bucket by construction. */
  if (RAND_bytes((unsigned char *)&c->seed, sizeof(c->seed)) != 1) {
    ERR_clear_error();
    c->seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)c;
  }
  c->ca = ca;
  c->capacity = capacity;
  c->mask = nbuckets - 1;
  *out = c;
  return CE_OK;
}

static void entry_free(leaf_entry_t *e) {
  X509_free(e->cert);
  EVP_PKEY_free(e->key);
  free(e);
}

void ce_leaf_cache_free(ce_leaf_cache_t *cache) {
  if (cache == NULL)
    return;
  leaf_entry_t *e = cache->newest;
  while (e != NULL) {
    leaf_entry_t *next = e->older;
    entry_free(e);
    e = next;
  }
  free(cache->buckets);
  free(cache);
}

static void list_unlink(ce_leaf_cache_t *c, leaf_entry_t *e) {
  if (e->newer != NULL)
    e->newer->older = e->older;
  else
    c->newest = e->older;
  if (e->older != NULL)
    e->older->newer = e->newer;
  else
    c->oldest = e->newer;
  e->newer = e->older = NULL;
}

static void list_push_newest(ce_leaf_cache_t *c, leaf_entry_t *e) {
  e->newer = NULL;
  e->older = c->newest;
  if (c->newest != NULL)
    c->newest->newer = e;
  c->newest = e;
  if (c->oldest == NULL)
    c->oldest = e;
}

/* Removes e from its bucket and the use list and frees it. */
static void entry_remove(ce_leaf_cache_t *c, leaf_entry_t *e) {
  leaf_entry_t **link = &c->buckets[e->hash & c->mask];
  while (*link != e)
    link = &(*link)->chain;
  *link = e->chain;
  list_unlink(c, e);
  c->count--;
  entry_free(e);
}

static leaf_entry_t *lookup(ce_leaf_cache_t *c, uint64_t hash, const char *host,
                            size_t len) {
  for (leaf_entry_t *e = c->buckets[hash & c->mask]; e != NULL; e = e->chain) {
    if (e->hash == hash && e->len == len && memcmp(e->host, host, len) == 0)
      return e;
  }
  return NULL;
}

static void hand_out(const leaf_entry_t *e, X509 **cert, EVP_PKEY **key) {
  X509_up_ref(e->cert);
  EVP_PKEY_up_ref(e->key);
  *cert = e->cert;
  *key = e->key;
}

int ce_leaf_get(ce_leaf_cache_t *cache, const char *host, X509 **cert,
                EVP_PKEY **key) {
  ce__tls_name_t name;
  if (cache == NULL || cert == NULL || key == NULL ||
      ce__tls_name_parse(host, &name) != CE_OK)
    return CE_EINVAL;
  uint64_t hash = hash_host(cache->seed, host, name.len);
  time_t now = time(NULL);
  leaf_entry_t *e = lookup(cache, hash, host, name.len);
  if (e != NULL && now < e->renew_at) {
    list_unlink(cache, e);
    list_push_newest(cache, e);
    hand_out(e, cert, key);
    return CE_OK;
  }
  if (e != NULL)
    entry_remove(cache, e);

  ERR_clear_error();
  leaf_entry_t *fresh = calloc(1, sizeof(*fresh) + name.len + 1);
  if (fresh == NULL)
    return CE_ENOMEM;
  time_t not_after = 0;
  int rc = mint_leaf(cache->ca, host, &name, &fresh->cert, &fresh->key,
                     &not_after);
  ERR_clear_error();
  if (rc != CE_OK) {
    free(fresh);
    return rc;
  }
  cache->minted++;
  fresh->hash = hash;
  fresh->len = name.len;
  memcpy(fresh->host, host, name.len + 1);
  fresh->renew_at = not_after - CE_LEAF_RENEW_SECONDS;
  if (cache->count == cache->capacity)
    entry_remove(cache, cache->oldest);
  leaf_entry_t **bucket = &cache->buckets[hash & cache->mask];
  fresh->chain = *bucket;
  *bucket = fresh;
  list_push_newest(cache, fresh);
  cache->count++;
  hand_out(fresh, cert, key);
  return CE_OK;
}

size_t ce_leaf_cache_size(const ce_leaf_cache_t *cache) { return cache->count; }

unsigned long ce_leaf_cache_minted(const ce_leaf_cache_t *cache) {
  return cache->minted;
}
