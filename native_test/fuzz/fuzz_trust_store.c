/*
 * libFuzzer target for ce_trust_store_build (c_src/tls/bundle.c): the
 * PEM reading of the roots and the session certificates, and the DER
 * the trust store is written in.
 *
 * The input is the roots file, a NUL byte, then the session CA file (no
 * NUL: all roots, no session certificate). Beyond "no crash, no leak, no
 * sanitizer report" the target checks:
 *
 * - the result is CE_OK, CE_EPARSE, CE_ETOOBIG or CE_ENOMEM, and
 *   OpenSSL's error queue is empty after it;
 * - on an error the message is non-empty and the outputs are untouched;
 * - on CE_OK OpenSSL reads the whole store back as a PKCS#12 without a
 *   MAC, one unencrypted SafeContents of at least two certBags, each with
 *   a certificate and a friendlyName.
 */
#include <openssl/err.h>
#include <openssl/pkcs12.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tls/bundle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_store(const unsigned char *der, size_t len) {
  const unsigned char *p = der;
  PKCS12 *p12 = d2i_PKCS12(NULL, &p, (long)len);
  if (p12 == NULL || p != der + len || PKCS12_mac_present(p12))
    abort();
  STACK_OF(PKCS7) *safes = PKCS12_unpack_authsafes(p12);
  if (safes == NULL || sk_PKCS7_num(safes) != 1)
    abort();
  PKCS7 *p7 = sk_PKCS7_value(safes, 0);
  if (OBJ_obj2nid(p7->type) != NID_pkcs7_data)
    abort();
  STACK_OF(PKCS12_SAFEBAG) *bags = PKCS12_unpack_p7data(p7);
  if (bags == NULL || sk_PKCS12_SAFEBAG_num(bags) < 2)
    abort();
  for (int i = 0; i < sk_PKCS12_SAFEBAG_num(bags); i++) {
    PKCS12_SAFEBAG *bag = sk_PKCS12_SAFEBAG_value(bags, i);
    X509 *x = PKCS12_SAFEBAG_get1_cert(bag);
    char *name = PKCS12_get_friendlyname(bag);
    if (x == NULL || name == NULL)
      abort();
    X509_free(x);
    OPENSSL_free(name);
  }
  sk_PKCS12_SAFEBAG_pop_free(bags, PKCS12_SAFEBAG_free);
  sk_PKCS7_pop_free(safes, PKCS7_free);
  PKCS12_free(p12);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  const char *nul = memchr(text, '\0', size);
  size_t roots_len = nul != NULL ? (size_t)(nul - text) : size;
  const char *session = nul != NULL ? nul + 1 : text + size;
  size_t session_len = size - roots_len - (nul != NULL ? 1 : 0);
  unsigned char *der = (unsigned char *)0x1;
  size_t len = 7;
  char err[256] = "";
  int rc = ce_trust_store_build(text, roots_len, "roots", session, session_len, "ca", CE_TRUST_STORE_MAX, &der,
                                &len, err, sizeof(err));
  if (ERR_peek_error() != 0)
    abort();
  if (rc == CE_OK) {
    check_store(der, len);
    free(der);
    ERR_clear_error();
    return 0;
  }
  if (rc != CE_EPARSE && rc != CE_ETOOBIG && rc != CE_ENOMEM)
    abort();
  if (err[0] == '\0' || der != (unsigned char *)0x1 || len != 7)
    abort();
  return 0;
}
