/* Tests for c_src/tls/context.c: the options of both contexts, trust
 * store loading (the Mozilla snapshot included) and the per-connection
 * SSL constructors. Handshakes are in test_tlsconn.c. */
#include <criterion/criterion.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/context.h"
#include "tls/fixtures.h"

#define MOZILLA_PEM CE_SOURCE_ROOT "/priv/ca-certificates/mozilla.pem"
/* Certificates in the committed snapshot (priv/ca-certificates/SOURCE). */
#define MOZILLA_COUNT 148u

TestSuite(context, .init = fx_setup, .fini = fx_teardown);

static const unsigned char H11[] = "\x08http/1.1";

/* ---- server --------------------------------------------------------------- */

Test(context, server_ctx_options) {
  SSL_CTX *ctx = NULL;
  char err[256];
  cr_assert_eq(ce_tls_server_ctx_new(&ctx, err, sizeof(err)), CE_OK, "%s", err);
  cr_assert_eq(SSL_CTX_get_min_proto_version(ctx), TLS1_2_VERSION);
  uint64_t opts = SSL_CTX_get_options(ctx);
  cr_assert(opts & SSL_OP_NO_RENEGOTIATION);
  cr_assert(opts & SSL_OP_NO_COMPRESSION);
  cr_assert(opts & SSL_OP_NO_TICKET);
  cr_assert_eq(SSL_CTX_get_session_cache_mode(ctx), SSL_SESS_CACHE_OFF);
  cr_assert_eq(SSL_CTX_get_num_tickets(ctx), 0u);
  cr_assert_eq(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_NONE);
  cr_assert_eq(ERR_peek_error(), 0ul);
  SSL_CTX_free(ctx);
}

typedef struct {
  ce_ca_t *ca;
  ce_leaf_cache_t *cache;
  X509 *cert;
  EVP_PKEY *key;
  SSL_CTX *ctx;
} server_env_t;

static server_env_t server_env(void) {
  server_env_t e = {0};
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  fx_generate_ca(7);
  cr_assert_eq(ce_ca_load(fx_path(cert, "ca.pem"), fx_path(key, "ca.key"), &e.ca,
                          err, sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_eq(ce_leaf_cache_new(e.ca, 0, &e.cache), CE_OK);
  cr_assert_eq(ce_leaf_get(e.cache, "example.com", &e.cert, &e.key), CE_OK);
  cr_assert_eq(ce_tls_server_ctx_new(&e.ctx, err, sizeof(err)), CE_OK, "%s", err);
  return e;
}

static void server_env_free(server_env_t *e) {
  SSL_CTX_free(e->ctx);
  X509_free(e->cert);
  EVP_PKEY_free(e->key);
  ce_leaf_cache_free(e->cache);
  ce_ca_free(e->ca);
}

Test(context, server_ssl_uses_the_leaf) {
  server_env_t e = server_env();
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, e.key, H11, sizeof(H11) - 1, &ssl),
               CE_OK);
  cr_assert_eq(X509_cmp(SSL_get_certificate(ssl), e.cert), 0);
  cr_assert_eq(SSL_check_private_key(ssl), 1);
  /* SSL_dup of an SSL before its handshake makes a new SSL and copies the
   * ALPN list rather than sharing it: freeing both is no double free
   * under ASan (test_tlsconn.c checks that the copy answers ALPN). */
  SSL *copy = SSL_dup(ssl);
  cr_assert_not_null(copy);
  cr_assert_neq(copy, ssl);
  SSL_free(copy);
  SSL_free(ssl);
  /* No ALPN at all is fine too. */
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, e.key, NULL, 5, &ssl), CE_OK);
  SSL_free(ssl);
  cr_assert_eq(ERR_peek_error(), 0ul);
  server_env_free(&e);
}

Test(context, server_ssl_refusals) {
  server_env_t e = server_env();
  SSL *sentinel = (SSL *)&e;
  SSL *ssl = sentinel;
  cr_assert_eq(ce_tls_server_ssl_new(NULL, e.cert, e.key, NULL, 0, &ssl), CE_EINVAL);
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, NULL, e.key, NULL, 0, &ssl), CE_EINVAL);
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, NULL, NULL, 0, &ssl), CE_EINVAL);
  static const struct {
    const char *wire;
    size_t len;
  } bad_alpn[] = {
      {"\x00", 1},               /* an empty name */
      {"\x05" "abc", 4},         /* runs past the end */
      {"\x02h2\x00", 4},         /* an empty name after a good one */
      {"\x02h2\x08http/1", 10},  /* the second runs past the end */
  };
  for (size_t i = 0; i < sizeof(bad_alpn) / sizeof(bad_alpn[0]); i++)
    cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, e.key,
                                       (const unsigned char *)bad_alpn[i].wire,
                                       bad_alpn[i].len, &ssl),
                 CE_EINVAL, "alpn %zu", i);
  unsigned char *huge = calloc(1, 70000);
  cr_assert_not_null(huge);
  for (size_t i = 0; i + 4 <= 70000; i += 4)
    memcpy(huge + i, "\x03" "abc", 4);
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, e.key, huge, 70000, &ssl),
               CE_EINVAL);
  free(huge);

  /* A key that is not the leaf's. */
  EVP_PKEY *other = EVP_EC_gen("P-256");
  cr_assert_eq(ce_tls_server_ssl_new(e.ctx, e.cert, other, NULL, 0, &ssl), CE_ETLS);
  EVP_PKEY_free(other);
  cr_assert_eq(ssl, sentinel);
  cr_assert_eq(ERR_peek_error(), 0ul);
  server_env_free(&e);
}

/* ---- client --------------------------------------------------------------- */

static void client_fails(const char *bundle, const char *extra, int code,
                         const char *file, const char *what) {
  SSL_CTX *sentinel = (SSL_CTX *)&code;
  SSL_CTX *ctx = sentinel;
  char err[512] = "";
  int rc = ce_tls_client_ctx_new(bundle, extra, &ctx, err, sizeof(err));
  cr_assert_eq(rc, code, "expected %s, got %s (%s)", ce_err_name(code),
               ce_err_name(rc), err);
  cr_assert_eq(ctx, sentinel);
  if (file != NULL)
    cr_assert_not_null(strstr(err, file), "message does not name %s: %s", file, err);
  cr_assert_not_null(strstr(err, what), "expected \"%s\" in: %s", what, err);
  cr_assert_eq(ERR_peek_error(), 0ul);
}

static SSL_CTX *client_ok(const char *bundle, const char *extra) {
  SSL_CTX *ctx = NULL;
  char err[512] = "";
  cr_assert_eq(ce_tls_client_ctx_new(bundle, extra, &ctx, err, sizeof(err)), CE_OK,
               "%s", err);
  cr_assert_eq(ERR_peek_error(), 0ul);
  return ctx;
}

Test(context, client_ctx_loads_the_mozilla_snapshot) {
  SSL_CTX *ctx = client_ok(MOZILLA_PEM, NULL);
  cr_assert_eq(ce_tls_client_ctx_trust_count(ctx), MOZILLA_COUNT);
  cr_assert_eq(SSL_CTX_get_min_proto_version(ctx), TLS1_2_VERSION);
  cr_assert_eq(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER);
  cr_assert(SSL_CTX_get_options(ctx) & SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_free(ctx);
  /* The same roots twice count once. */
  ctx = client_ok(MOZILLA_PEM, MOZILLA_PEM);
  cr_assert_eq(ce_tls_client_ctx_trust_count(ctx), MOZILLA_COUNT);
  SSL_CTX_free(ctx);
  cr_assert_eq(ce_tls_client_ctx_trust_count(NULL), 0u);
}

Test(context, client_ctx_adds_the_extra_ca) {
  char ca[FX_PATH_MAX];
  fx_generate_ca(7);
  SSL_CTX *ctx = client_ok(MOZILLA_PEM, fx_path(ca, "ca.pem"));
  cr_assert_eq(ce_tls_client_ctx_trust_count(ctx), MOZILLA_COUNT + 1);
  SSL_CTX_free(ctx);
  /* The session CA alone can be the bundle, and non-certificate PEM
   * blocks (the key) are skipped. */
  char both[FX_PATH_MAX];
  char *cert_text = fx_read_text(ca);
  char *key_text = fx_read_text(fx_path(both, "ca.key"));
  char joined[8192];
  snprintf(joined, sizeof(joined), "%s%s", key_text, cert_text);
  fx_write_text(fx_path(both, "both.pem"), joined);
  free(cert_text);
  free(key_text);
  ctx = client_ok(both, NULL);
  cr_assert_eq(ce_tls_client_ctx_trust_count(ctx), 1u);
  SSL_CTX_free(ctx);
}

Test(context, client_ctx_refusals) {
  char p[FX_PATH_MAX], good[FX_PATH_MAX];
  client_fails(NULL, NULL, CE_EINVAL, NULL, "bundle is required");
  client_fails(fx_path(p, "missing.pem"), NULL, CE_ENOENT, p,
               "cannot open: No such file or directory");
  client_fails(MOZILLA_PEM, fx_path(p, "missing.pem"), CE_ENOENT, p,
               "cannot open: No such file or directory");

  fx_write_text(fx_path(p, "empty.pem"), "");
  client_fails(p, NULL, CE_EPARSE, p, "no PEM certificate");
  fx_write_text(p, "just some words\n");
  client_fails(p, NULL, CE_EPARSE, p, "no PEM certificate");
  client_fails(MOZILLA_PEM, p, CE_EPARSE, p, "no PEM certificate");

  /* A good certificate followed by a broken one: named by position. */
  fx_generate_ca(7);
  char *cert_text = fx_read_text(fx_path(good, "ca.pem"));
  char joined[8192];
  snprintf(joined, sizeof(joined),
           "%s-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n",
           cert_text);
  free(cert_text);
  fx_write_text(fx_path(p, "broken.pem"), joined);
  client_fails(p, NULL, CE_EPARSE, p, "certificate 2 of the file is malformed");

  client_fails(fx_dir, NULL, CE_EINVAL, fx_dir, "not a regular file");
  FILE *f = fopen(fx_path(p, "big.pem"), "w");
  cr_assert_not_null(f);
  cr_assert_eq(ftruncate(fileno(f), 9 * 1024 * 1024), 0);
  fclose(f);
  client_fails(p, NULL, CE_ETOOBIG, p, "larger than");
  /* err may be NULL. */
  SSL_CTX *ctx = NULL;
  cr_assert_eq(ce_tls_client_ctx_new(p, NULL, &ctx, NULL, 0), CE_ETOOBIG);
}

Test(context, client_ssl_sends_sni_for_names_only) {
  SSL_CTX *ctx = client_ok(MOZILLA_PEM, NULL);
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_client_ssl_new(ctx, "api.example.com", H11, sizeof(H11) - 1, &ssl),
               CE_OK);
  cr_assert_str_eq(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name), "api.example.com");
  X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
  cr_assert_eq(X509_VERIFY_PARAM_get_hostflags(param),
               X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
  cr_assert_str_eq(X509_VERIFY_PARAM_get0_host(param, 0), "api.example.com");
  SSL_free(ssl);

  static const char *ips[] = {"10.0.0.1", "2001:db8::1"};
  for (size_t i = 0; i < 2; i++) {
    cr_assert_eq(ce_tls_client_ssl_new(ctx, ips[i], NULL, 0, &ssl), CE_OK);
    cr_assert_null(SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name));
    char *ip = X509_VERIFY_PARAM_get1_ip_asc(SSL_get0_param(ssl));
    cr_assert_not_null(ip);
    /* OpenSSL prints IPv6 uncompressed and in upper case. */
    cr_assert(strcmp(ip, "10.0.0.1") == 0 || strcmp(ip, "2001:DB8:0:0:0:0:0:1") == 0,
              "%s", ip);
    OPENSSL_free(ip);
    cr_assert_null(X509_VERIFY_PARAM_get0_host(SSL_get0_param(ssl), 0));
    SSL_free(ssl);
  }
  cr_assert_eq(ERR_peek_error(), 0ul);
  SSL_CTX_free(ctx);
}

Test(context, client_ssl_refusals) {
  SSL_CTX *ctx = client_ok(MOZILLA_PEM, NULL);
  SSL *sentinel = (SSL *)ctx;
  SSL *ssl = sentinel;
  static const char *bad[] = {NULL, "", "Example.com", "[::1]", "example.com:443",
                              "*.example.com", "::ffff:1.2.3.4"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    cr_assert_eq(ce_tls_client_ssl_new(ctx, bad[i], NULL, 0, &ssl), CE_EINVAL,
                 "host %zu", i);
  cr_assert_eq(ce_tls_client_ssl_new(NULL, "example.com", NULL, 0, &ssl), CE_EINVAL);
  cr_assert_eq(ce_tls_client_ssl_new(ctx, "example.com",
                                     (const unsigned char *)"\x09http/1.1", 9, &ssl),
               CE_EINVAL);
  cr_assert_eq(ssl, sentinel);
  SSL_CTX_free(ctx);
}
