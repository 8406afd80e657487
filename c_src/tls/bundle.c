/* The workspace's trust files (see bundle.h). */
#include "tls/bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/files.h"

/* Writes a new file "<dir>/.<name>.tmp" of mode mode and renames it to
 * "<dir>/<name>". parts/lens: up to three pieces written in order. */
static int write_file(const char *dir, const char *name, const char *const *parts, const size_t *lens,
                      size_t count, mode_t mode, char *err, size_t errlen) {
  char final[PATH_MAX], tmp[PATH_MAX];
  int n1 = snprintf(final, sizeof(final), "%s/%s", dir, name);
  int n2 = snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
  if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof(final) || (size_t)n2 >= sizeof(tmp))
    return ce__tls_fail(err, errlen, CE_ETOOBIG, dir, "directory name too long");

  /* A temporary left by a run that was killed may be read-only (0444);
   * when it cannot be removed, open says why. */
  (void)unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    int e = errno;
    int code = e == ENOENT || e == ENOTDIR ? CE_ENOENT : e == EACCES || e == EPERM || e == EROFS ? CE_EPERM : CE_EIO;
    return ce__tls_fail(err, errlen, code, tmp, "cannot create: %s", strerror(e));
  }
  for (size_t i = 0; i < count; i++) {
    size_t off = 0;
    while (off < lens[i]) {
      ssize_t w = write(fd, parts[i] + off, lens[i] - off);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        int e = w < 0 ? errno : EIO;
        close(fd);
        unlink(tmp);
        return ce__tls_fail(err, errlen, CE_EIO, tmp, "cannot write: %s", strerror(e));
      }
      off += (size_t)w;
    }
  }
  /* umask may have narrowed the mode: the workspace, any uid, reads it. */
  if (fchmod(fd, mode) != 0 || close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    return ce__tls_fail(err, errlen, CE_EIO, tmp, "cannot write: %s", strerror(e));
  }
  if (rename(tmp, final) != 0) {
    int e = errno;
    unlink(tmp);
    return ce__tls_fail(err, errlen, CE_EIO, final, "cannot rename into place: %s", strerror(e));
  }
  return CE_OK;
}

const char *ce_trust_default_roots(char *buf, size_t cap) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0)
    return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash == NULL)
    return NULL;
  *slash = '\0';
  int n2 = snprintf(buf, cap, "%s/ca-certificates/mozilla.pem", exe);
  return n2 > 0 && (size_t)n2 < cap ? buf : NULL;
}

static bool contains(const char *data, size_t len, const char *text) {
  return memmem(data, len, text, strlen(text)) != NULL;
}

/* --- The PKCS#12 trust store (bundle.h) ------------------------------- */

/* Complete DER encodings (tag, length, value) of the object identifiers. */
/* 1.2.840.113549.1.7.1, PKCS#7 data (RFC 2315 §14). */
static const unsigned char OID_DATA[] = {0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01};
/* 1.2.840.113549.1.12.10.1.3, certBag (RFC 7292 §4.2.3). */
static const unsigned char OID_CERT_BAG[] = {0x06, 0x0b, 0x2a, 0x86, 0x48, 0x86, 0xf7,
                                             0x0d, 0x01, 0x0c, 0x0a, 0x01, 0x03};
/* 1.2.840.113549.1.9.22.1, x509Certificate (RFC 7292 §4.2.3). */
static const unsigned char OID_X509[] = {0x06, 0x0a, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x16, 0x01};
/* 1.2.840.113549.1.9.20, friendlyName (RFC 2985 §5.5.1). */
static const unsigned char OID_FRIENDLY_NAME[] = {0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x14};
/* The whole trusted-key-usage attribute: SEQUENCE { the JDK's OID
 * 2.16.840.1.113894.746875.1.1, SET { anyExtendedKeyUsage 2.5.29.37.0 } }. */
static const unsigned char ATTR_TRUSTED_USAGE[] = {0x30, 0x16, 0x06, 0x0c, 0x60, 0x86, 0x48, 0x01,
                                                   0x86, 0xf9, 0x66, 0xad, 0xca, 0x7b, 0x01, 0x01,
                                                   0x31, 0x06, 0x06, 0x04, 0x55, 0x1d, 0x25, 0x00};

#define TAG_INTEGER 0x02
#define TAG_OCTETS 0x04
#define TAG_BMP 0x1e
#define TAG_SEQ 0x30
#define TAG_SET 0x31
#define TAG_EXPLICIT0 0xa0

/* An alias: "condukt-session-ca-" and a number fit with room to spare. */
#define ALIAS_MAX 48

/* The bags written so far (the SafeContents' content). */
typedef struct {
  unsigned char *p;
  size_t len, cap;
  size_t max; /* the most bytes the bags may take */
} store_buf_t;

/* The size of a DER header for n content bytes (n < 2^32). */
static size_t der_header_len(size_t n) {
  return n < 0x80 ? 2 : n <= 0xff ? 3 : n <= 0xffff ? 4 : n <= 0xffffff ? 5 : 6;
}

static size_t der_tlv_len(size_t n) { return der_header_len(n) + n; }

static unsigned char *der_header(unsigned char *p, unsigned char tag, size_t n) {
  *p++ = tag;
  if (n < 0x80) {
    *p++ = (unsigned char)n;
    return p;
  }
  size_t k = der_header_len(n) - 2;
  *p++ = (unsigned char)(0x80 | k);
  for (size_t i = k; i > 0; i--)
    *p++ = (unsigned char)(n >> (8 * (i - 1)));
  return p;
}

static unsigned char *der_put(unsigned char *p, const void *src, size_t n) {
  memcpy(p, src, n);
  return p + n;
}

/* Room for n more bytes, within b->max. */
static int store_reserve(store_buf_t *b, size_t n) {
  if (n > b->max || b->len > b->max - n)
    return CE_ETOOBIG;
  if (b->len + n <= b->cap)
    return CE_OK;
  size_t cap = b->cap != 0 ? b->cap : 64 * 1024;
  while (cap < b->len + n)
    cap = cap > b->max / 2 ? b->max : cap * 2;
  unsigned char *p = realloc(b->p, cap);
  if (p == NULL)
    return CE_ENOMEM;
  b->p = p;
  b->cap = cap;
  return CE_OK;
}

/* DER orders a SET OF by the members' encodings; the BEAM writer sorts
 * them as binaries (bytewise, a prefix first), and so does this. */
static bool der_before(const unsigned char *a, size_t alen, const unsigned char *b, size_t blen) {
  int c = memcmp(a, b, alen < blen ? alen : blen);
  return c < 0 || (c == 0 && alen < blen);
}

/* Appends the certBag SafeBag of der (der_len bytes) named alias (ASCII):
 * SEQUENCE { certBag, [0] SEQUENCE { x509Certificate, [0] OCTET STRING der },
 *            SET { friendlyName, trusted key usage } }. */
static int store_add_bag(store_buf_t *b, const char *alias, const unsigned char *der, size_t der_len) {
  if (der_len > b->max)
    return CE_ETOOBIG;
  size_t alias_len = strlen(alias);
  /* friendlyName: SEQUENCE { OID, SET { BMPString alias } }. */
  unsigned char fname[2 * ALIAS_MAX + 32];
  size_t bmp = 2 * alias_len;
  size_t fname_body = sizeof(OID_FRIENDLY_NAME) + der_tlv_len(der_tlv_len(bmp));
  size_t fname_len = der_tlv_len(fname_body);
  unsigned char *q = der_header(fname, TAG_SEQ, fname_body);
  q = der_put(q, OID_FRIENDLY_NAME, sizeof(OID_FRIENDLY_NAME));
  q = der_header(q, TAG_SET, der_tlv_len(bmp));
  q = der_header(q, TAG_BMP, bmp);
  for (size_t i = 0; i < alias_len; i++) {
    *q++ = 0;
    *q++ = (unsigned char)alias[i];
  }

  size_t value_body = sizeof(OID_X509) + der_tlv_len(der_tlv_len(der_len));
  size_t attrs_body = fname_len + sizeof(ATTR_TRUSTED_USAGE);
  size_t bag_body = sizeof(OID_CERT_BAG) + der_tlv_len(der_tlv_len(value_body)) + der_tlv_len(attrs_body);
  size_t bag_len = der_tlv_len(bag_body);
  int rc = store_reserve(b, bag_len);
  if (rc != CE_OK)
    return rc;
  unsigned char *p = b->p + b->len;
  p = der_header(p, TAG_SEQ, bag_body);
  p = der_put(p, OID_CERT_BAG, sizeof(OID_CERT_BAG));
  p = der_header(p, TAG_EXPLICIT0, der_tlv_len(value_body));
  p = der_header(p, TAG_SEQ, value_body);
  p = der_put(p, OID_X509, sizeof(OID_X509));
  p = der_header(p, TAG_EXPLICIT0, der_tlv_len(der_len));
  p = der_header(p, TAG_OCTETS, der_len);
  p = der_put(p, der, der_len);
  p = der_header(p, TAG_SET, attrs_body);
  if (der_before(fname, fname_len, ATTR_TRUSTED_USAGE, sizeof(ATTR_TRUSTED_USAGE))) {
    p = der_put(p, fname, fname_len);
    p = der_put(p, ATTR_TRUSTED_USAGE, sizeof(ATTR_TRUSTED_USAGE));
  } else {
    p = der_put(p, ATTR_TRUSTED_USAGE, sizeof(ATTR_TRUSTED_USAGE));
    p = der_put(p, fname, fname_len);
  }
  b->len = (size_t)(p - b->p);
  return CE_OK;
}

/* How many lines of text start a PEM certificate block. */
static size_t count_cert_blocks(const char *text, size_t len) {
  static const char begin[] = "-----BEGIN CERTIFICATE-----";
  size_t n = 0;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *hit = memmem(p, (size_t)(end - p), begin, sizeof(begin) - 1);
    if (hit == NULL)
      break;
    if (hit == text || hit[-1] == '\n')
      n++;
    p = hit + sizeof(begin) - 1;
  }
  return n;
}

/* Appends a bag for every PEM certificate in text, aliased
 * "<prefix><number>" (the number zero-padded to pad digits), counting
 * them in *count. */
static int store_add_pem(store_buf_t *b, const char *text, size_t len, const char *name, const char *prefix,
                         int pad, size_t *count, char *err, size_t errlen) {
  if (len > b->max)
    return ce__tls_fail(err, errlen, CE_ETOOBIG, name, "too large for a trust store");
  size_t blocks = count_cert_blocks(text, len);
  BIO *bio = BIO_new_mem_buf(text, (int)len);
  if (bio == NULL) {
    ERR_clear_error();
    return ce__tls_fail(err, errlen, CE_ENOMEM, name, "out of memory");
  }
  int rc = CE_OK;
  *count = 0;
  for (;;) {
    char *type = NULL, *header = NULL;
    unsigned char *der = NULL;
    long der_len = 0;
    if (!PEM_read_bio(bio, &type, &header, &der, &der_len)) {
      /* The end of the input reads as "no start line"; whether it was
       * the end is checked against the number of blocks below. */
      if (!ce__tls_error_is_no_pem())
        rc = ce__tls_fail(err, errlen, CE_EPARSE, name, "holds a PEM block that cannot be read: %s",
                          ce__tls_openssl_reason());
      break;
    }
    /* Certificates only, and not encrypted ones (a header says so), as
     * the BEAM's :public_key.pem_decode/1 sees them. */
    if (strcmp(type, "CERTIFICATE") == 0 && header[0] == '\0') {
      const unsigned char *in = der;
      X509 *cert = d2i_X509(NULL, &in, der_len);
      bool whole = cert != NULL && in == der + der_len;
      X509_free(cert);
      if (!whole) {
        rc = ce__tls_fail(err, errlen, CE_EPARSE, name, "certificate %zu cannot be decoded: %s", *count + 1,
                          cert == NULL ? ce__tls_openssl_reason() : "trailing data");
      } else {
        char alias[ALIAS_MAX];
        snprintf(alias, sizeof(alias), "%s%0*zu", prefix, pad, *count + 1);
        rc = store_add_bag(b, alias, der, (size_t)der_len);
        if (rc != CE_OK)
          rc = ce__tls_fail(err, errlen, rc, name, "%s",
                          rc == CE_ETOOBIG ? "too many certificates for a trust store" : "out of memory");
        else
          (*count)++;
      }
    }
    OPENSSL_free(type);
    OPENSSL_free(header);
    OPENSSL_free(der);
    if (rc != CE_OK)
      break;
  }
  ERR_clear_error();
  BIO_free(bio);
  if (rc == CE_OK && *count == 0)
    rc = ce__tls_fail(err, errlen, CE_EPARSE, name, "holds no PEM certificate");
  else if (rc == CE_OK && *count != blocks)
    rc = ce__tls_fail(err, errlen, CE_EPARSE, name, "holds %zu certificate blocks, of which %zu could be read",
                      blocks, *count);
  return rc;
}

int ce_trust_store_build(const char *roots, size_t roots_len, const char *roots_name, const char *session,
                         size_t session_len, const char *session_name, size_t max, unsigned char **out,
                         size_t *out_len, char *err, size_t errlen) {
  /* max <= INT_MAX: the BIOs take an int length. */
  store_buf_t bags = {.max = max < CE_TRUST_STORE_MAX ? max : CE_TRUST_STORE_MAX};
  size_t n_roots, n_session;
  int rc = store_add_pem(&bags, roots, roots_len, roots_name, "mozilla-", 3, &n_roots, err, errlen);
  if (rc == CE_OK)
    rc = store_add_pem(&bags, session, session_len, session_name, "condukt-session-ca-", 0, &n_session, err,
                       errlen);
  if (rc != CE_OK) {
    free(bags.p);
    return rc;
  }
  /* PFX { version 3, authSafe ContentInfo { data, [0] OCTET STRING
   * AuthenticatedSafe { ContentInfo { data, [0] OCTET STRING
   * SafeContents { bags } } } } } (RFC 7292 §4, §4.1). */
  size_t contents = der_tlv_len(bags.len);
  size_t inner_ci = sizeof(OID_DATA) + der_tlv_len(der_tlv_len(contents));
  size_t auth = der_tlv_len(der_tlv_len(inner_ci));
  size_t outer_ci = sizeof(OID_DATA) + der_tlv_len(der_tlv_len(auth));
  size_t pfx = 3 + der_tlv_len(outer_ci);
  size_t total = der_tlv_len(pfx);
  unsigned char *der = malloc(total);
  if (der == NULL) {
    free(bags.p);
    return ce__tls_fail(err, errlen, CE_ENOMEM, NULL, "out of memory building the trust store");
  }
  unsigned char *p = der_header(der, TAG_SEQ, pfx);
  p = der_put(p, (const unsigned char[]){TAG_INTEGER, 1, 3}, 3);
  p = der_header(p, TAG_SEQ, outer_ci);
  p = der_put(p, OID_DATA, sizeof(OID_DATA));
  p = der_header(p, TAG_EXPLICIT0, der_tlv_len(auth));
  p = der_header(p, TAG_OCTETS, auth);
  p = der_header(p, TAG_SEQ, der_tlv_len(inner_ci));
  p = der_header(p, TAG_SEQ, inner_ci);
  p = der_put(p, OID_DATA, sizeof(OID_DATA));
  p = der_header(p, TAG_EXPLICIT0, der_tlv_len(contents));
  p = der_header(p, TAG_OCTETS, contents);
  p = der_header(p, TAG_SEQ, bags.len);
  if (bags.len > 0)
    der_put(p, bags.p, bags.len);
  free(bags.p);
  *out = der;
  *out_len = total;
  return CE_OK;
}

int ce_trust_bundle_write(const char *ca_cert, const char *roots, const char *dir, char *err,
                          size_t errlen) {
  if (dir == NULL || dir[0] == '\0')
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL, "no directory given");
  BIO *ca_bio = NULL, *roots_bio = NULL;
  char *ca = NULL, *rt = NULL;
  long ca_len = 0, rt_len = 0;
  unsigned char *store = NULL;
  size_t store_len = 0;
  int rc = ce__tls_read_file(ca_cert, &ca_bio, err, errlen);
  if (rc == CE_OK)
    rc = ce__tls_read_file(roots, &roots_bio, err, errlen);
  if (rc == CE_OK) {
    ca_len = BIO_get_mem_data(ca_bio, &ca);
    rt_len = BIO_get_mem_data(roots_bio, &rt);
    if (ca_len <= 0 || !contains(ca, (size_t)ca_len, "-----BEGIN CERTIFICATE-----"))
      rc = ce__tls_fail(err, errlen, CE_EPARSE, ca_cert, "holds no PEM certificate");
    else if (rt_len <= 0 || !contains(rt, (size_t)rt_len, "-----BEGIN "))
      rc = ce__tls_fail(err, errlen, CE_EPARSE, roots, "holds no PEM certificate");
    else
      rc = ce_trust_store_build(rt, (size_t)rt_len, roots, ca, (size_t)ca_len, ca_cert, CE_TRUST_STORE_MAX, &store,
                                &store_len, err, errlen);
  }
  if (rc == CE_OK) {
    const char *ca_parts[] = {ca};
    size_t ca_lens[] = {(size_t)ca_len};
    rc = write_file(dir, CE_BUNDLE_CA_NAME, ca_parts, ca_lens, 1, 0644, err, errlen);
  }
  if (rc == CE_OK) {
    /* Read-only: nothing in the pod has a reason to change it. */
    const char *store_parts[] = {(const char *)store};
    size_t store_lens[] = {store_len};
    rc = write_file(dir, CE_BUNDLE_STORE_NAME, store_parts, store_lens, 1, 0444, err, errlen);
  }
  if (rc == CE_OK) {
    bool newline = rt[rt_len - 1] != '\n';
    const char *parts[] = {rt, "\n", ca};
    size_t lens[] = {(size_t)rt_len, newline ? 1u : 0u, (size_t)ca_len};
    rc = write_file(dir, CE_BUNDLE_NAME, parts, lens, 3, 0644, err, errlen);
  }
  free(store);
  BIO_free(ca_bio);
  BIO_free(roots_bio);
  /* err holds the sentence; what OpenSSL queued while failing (reading a
   * file runs out of memory, say) is not left for the next caller. */
  if (rc != CE_OK)
    ERR_clear_error();
  return rc;
}
