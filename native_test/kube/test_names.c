/* Tests for ce_kube_cert_names() (c_src/kube/client.c): the server
 * certificate's name check follows Go's crypto/tls, as kubectl does:
 * subjectAltName only (a CN-only certificate names nothing), a wildcard
 * only as a whole left-most label, IP literals against IP addresses. */
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/x509v3.h>

#include "kube/client.h"
#include "tls/fixtures.h"

TestSuite(kube_names);

static X509 *cert_with(EVP_PKEY *key, const char *cn, const char *san) {
  fx_cert_spec_t spec = {.cn = cn, .not_after_offset = 3600};
  X509 *x = fx_make_cert(key, &spec);
  if (san != NULL) {
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, NULL, NID_subject_alt_name, (char *)san);
    cr_assert_not_null(e);
    cr_assert_eq(X509_add_ext(x, e, -1), 1);
    X509_EXTENSION_free(e);
  }
  return x;
}

Test(kube_names, san_only_no_partial_wildcards) {
  EVP_PKEY *key = EVP_EC_gen("P-256");
  cr_assert_not_null(key);
  /* A certificate with the name only in its CN names nothing. */
  X509 *cn_only = cert_with(key, "api.example.com", NULL);
  cr_assert_not(ce_kube_cert_names(cn_only, "api.example.com"));
  X509_free(cn_only);

  X509 *x = cert_with(key, "ignored.test",
                      "DNS:*.example.com,DNS:f*.other.com,DNS:kubernetes,IP:10.0.0.1,"
                      "IP:::1");
  cr_assert(ce_kube_cert_names(x, "api.example.com"));
  cr_assert(ce_kube_cert_names(x, "kubernetes"));
  cr_assert(ce_kube_cert_names(x, "10.0.0.1"));
  cr_assert(ce_kube_cert_names(x, "::1"));
  cr_assert_not(ce_kube_cert_names(x, "ignored.test"));
  cr_assert_not(ce_kube_cert_names(x, "a.b.example.com"));
  cr_assert_not(ce_kube_cert_names(x, "example.com"));
  /* A partial wildcard label matches nothing. */
  cr_assert_not(ce_kube_cert_names(x, "foo.other.com"));
  cr_assert_not(ce_kube_cert_names(x, "10.0.0.2"));
  /* An IP literal is not matched against DNS names, nor a DNS name
   * against IP addresses. */
  X509 *dns_ip = cert_with(key, "x", "DNS:10.0.0.9");
  cr_assert_not(ce_kube_cert_names(dns_ip, "10.0.0.9"));
  X509_free(dns_ip);
  X509_free(x);
  EVP_PKEY_free(key);
}
