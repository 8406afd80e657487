/*
 * OpenSSL contexts for the workspace and upstream sides (see context.h,
 * docs/tls.md).
 *
 * The workspace side never resumes a session: a full
 * handshake costs the proxy one P-256 signature and one ECDHE (well under a
 * millisecond over loopback), and without tickets every handshake takes
 * the same path: the leaf is presented, ALPN is chosen afresh from what the
 * upstream negotiated for this connection, and a workspace that does not
 * trust the session CA is detected (a resumed handshake sends no
 * certificate, so it could neither fail nor prove anything). There is also
 * no ticket key to keep secret and rotate. On the upstream side the
 * client resumes TLS 1.3 sessions from a bounded per-process store
 * (sesscache.h): a new connection to an origin it just verified skips
 * parsing and verifying the same chain again. The upstream name, port and
 * ALPN offer must match, so a resumed session never stands in for a name
 * that was not verified.
 *
 * Renegotiation is refused on both sides (SSL_OP_NO_RENEGOTIATION): it
 * could change the peer's identity in the middle of a connection whose
 * host the proxy has already checked, and RFC 7540 §9.2.1 forbids it under
 * HTTP/2 anyway. TLS 1.3 has no renegotiation at all.
 */
#include "tls/context.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tls/files.h"
#include "tls/names.h"
#include "tls/sesscache.h"

/* RFC 7301 §3.1: the protocol name list is a vector of at most 2^16 - 1
 * bytes. */
#define ALPN_WIRE_MAX 65535u

/* The server's ALPN list of one SSL, stored in the SSL's ex_data so that
 * it is freed with the SSL whoever frees it. */
typedef struct {
  size_t len;
  unsigned char wire[];
} alpn_list_t;

static CRYPTO_ONCE alpn_once = CRYPTO_ONCE_STATIC_INIT;
static int alpn_index = -1;

static void alpn_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx,
                      long argl, void *argp) {
  free(ptr);
}

/* SSL_dup copies ex_data pointers; give the copy its own list so that the
 * two SSLs never free the same one. */
static int alpn_dup(CRYPTO_EX_DATA *to, const CRYPTO_EX_DATA *from,
                    void **from_d, int idx, long argl, void *argp) {
  const alpn_list_t *src = *from_d;
  if (src == NULL)
    return 1;
  alpn_list_t *copy = malloc(sizeof(*copy) + src->len);
  if (copy == NULL)
    return 0;
  copy->len = src->len;
  memcpy(copy->wire, src->wire, src->len);
  *from_d = copy;
  return 1;
}

static void alpn_index_init(void) {
  alpn_index = SSL_get_ex_new_index(0, NULL, NULL, alpn_dup, alpn_free);
}

static int alpn_index_get(void) {
  if (!CRYPTO_THREAD_run_once(&alpn_once, alpn_index_init))
    return -1;
  return alpn_index;
}

/* True when p[0..len) is a well-formed ALPN protocol list: length-prefixed
 * names of 1 to 255 bytes that exactly fill it (RFC 7301 §3.1). */
static bool alpn_wire_ok(const unsigned char *p, size_t len) {
  if (len > ALPN_WIRE_MAX)
    return false;
  size_t i = 0;
  while (i < len) {
    size_t n = p[i];
    if (n == 0 || n > len - i - 1)
      return false;
    i += 1 + n;
  }
  return true;
}

/*
 * RFC 7301 §3.2 lets the server choose; it chooses the first protocol of
 * its own list (the upstream's answer, so usually one name) that the client
 * offers. When nothing matches, RFC 7301 §3.2 says the server SHALL send a
 * fatal no_application_protocol alert; the proxy deliberately answers
 * without ALPN instead, as a server that does not implement ALPN would. The
 * client then speaks HTTP/1.1 or gives up, and the proxy's HTTP layer
 * either serves it or refuses it with an HTTP answer the agent can read,
 * which a TLS alert never is (DESIGN §4, "Deny answers the agent in
 * words").
 */
static int select_alpn(SSL *ssl, const unsigned char **out,
                       unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg) {
  int idx = alpn_index_get();
  const alpn_list_t *ours = idx >= 0 ? SSL_get_ex_data(ssl, idx) : NULL;
  if (ours == NULL)
    return SSL_TLSEXT_ERR_NOACK;
  for (size_t i = 0; i < ours->len; i += 1u + ours->wire[i]) {
    unsigned char n = ours->wire[i];
    const unsigned char *name = ours->wire + i + 1;
    /* OpenSSL has already checked that the client's list is well-formed;
     * the bound is kept anyway, since a read past `in` would be silent. */
    for (unsigned int j = 0; j < inlen && in[j] <= inlen - j - 1;
         j += 1u + in[j]) {
      if (in[j] == n && memcmp(in + j + 1, name, n) == 0) {
        *out = name;
        *outlen = n;
        return SSL_TLSEXT_ERR_OK;
      }
    }
  }
  return SSL_TLSEXT_ERR_NOACK;
}

/* Options common to both sides; see the comment at the top. */
static int configure_common(SSL_CTX *ctx) {
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1)
    return CE_ETLS;
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  /* The proxy keeps many idle keep-alive connections; releasing the
   * record buffers of an idle connection saves about 34 KiB each. */
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  return CE_OK;
}

int ce_tls_server_ctx_new(SSL_CTX **out, char *err, size_t errlen) {
  ERR_clear_error();
  if (alpn_index_get() < 0)
    return ce__tls_fail(err, errlen, CE_ETLS, NULL,
                        "cannot allocate an SSL ex_data index");
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == NULL) {
    int rc = ce__tls_fail(err, errlen, CE_ETLS, NULL,
                          "cannot create the server TLS context: %s",
                          ce__tls_openssl_reason());
    ERR_clear_error();
    return rc;
  }
  if (configure_common(ctx) != CE_OK ||
      SSL_CTX_set_num_tickets(ctx, 0) != 1) {
    int rc = ce__tls_fail(err, errlen, CE_ETLS, NULL,
                          "cannot configure the server TLS context: %s",
                          ce__tls_openssl_reason());
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return rc;
  }
  /* The leaf is the whole chain: the session CA is a trust anchor in the
   * workspace, and sending it again would only add bytes (RFC 8446 §4.4.2
   * lets the anchor be omitted). */
  SSL_CTX_set_mode(ctx, SSL_MODE_NO_AUTO_CHAIN);
  SSL_CTX_set_alpn_select_cb(ctx, select_alpn, NULL);
  *out = ctx;
  return CE_OK;
}

int ce_tls_server_ssl_new(SSL_CTX *ctx, X509 *cert, EVP_PKEY *key,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out) {
  if (ctx == NULL || cert == NULL || key == NULL)
    return CE_EINVAL;
  if (alpn == NULL)
    alpn_len = 0;
  if (!alpn_wire_ok(alpn, alpn_len))
    return CE_EINVAL;
  int idx = alpn_index_get();
  if (idx < 0)
    return CE_ETLS;
  ERR_clear_error();
  alpn_list_t *list = NULL;
  SSL *ssl = SSL_new(ctx);
  int rc = CE_ENOMEM;
  if (ssl == NULL)
    goto fail;
  rc = CE_ETLS;
  /* SSL_use_PrivateKey checks the key against the certificate set first,
   * so a mismatched pair fails here rather than in the handshake. */
  if (SSL_use_certificate(ssl, cert) != 1 || SSL_use_PrivateKey(ssl, key) != 1)
    goto fail;
  if (alpn_len > 0) {
    rc = CE_ENOMEM;
    list = malloc(sizeof(*list) + alpn_len);
    if (list == NULL)
      goto fail;
    list->len = alpn_len;
    memcpy(list->wire, alpn, alpn_len);
    if (SSL_set_ex_data(ssl, idx, list) != 1)
      goto fail;
    list = NULL; /* freed with the SSL (alpn_free) */
  }
  ERR_clear_error();
  *out = ssl;
  return CE_OK;
fail:
  free(list);
  SSL_free(ssl);
  ERR_clear_error();
  return rc;
}

/* Adds every PEM certificate of path to store and counts them. */
static int load_anchors(X509_STORE *store, const char *path, char *err,
                        size_t errlen) {
  BIO *bio = NULL;
  int rc = ce__tls_read_file(path, &bio, err, errlen);
  if (rc != CE_OK)
    return rc;
  size_t count = 0;
  for (;;) {
    ERR_clear_error();
    X509 *x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    if (x == NULL) {
      if (ce__tls_error_is_no_pem())
        break; /* past the last certificate */
      rc = ce__tls_fail(err, errlen, CE_EPARSE, path,
                        "certificate %zu of the file is malformed (%s)",
                        count + 1, ce__tls_openssl_reason());
      goto done;
    }
    /* A certificate already in the store (the same root in both files)
     * is accepted and counted once by the store. */
    int ok = X509_STORE_add_cert(store, x);
    X509_free(x);
    if (ok != 1) {
      rc = ce__tls_fail(err, errlen, CE_ETLS, path,
                        "cannot add certificate %zu to the trust store (%s)",
                        count + 1, ce__tls_openssl_reason());
      goto done;
    }
    count++;
  }
  if (count == 0)
    rc = ce__tls_fail(err, errlen, CE_EPARSE, path,
                      "no PEM certificate (\"BEGIN CERTIFICATE\") in the file");
done:
  BIO_free(bio);
  ERR_clear_error();
  return rc;
}

int ce_tls_client_ctx_new(const char *bundle_path, const char *extra_ca_path,
                          SSL_CTX **out, char *err, size_t errlen) {
  if (bundle_path == NULL)
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL,
                        "a CA bundle is required to verify upstream servers");
  ERR_clear_error();
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == NULL) {
    int rc = ce__tls_fail(err, errlen, CE_ETLS, NULL,
                          "cannot create the client TLS context: %s",
                          ce__tls_openssl_reason());
    ERR_clear_error();
    return rc;
  }
  int rc = configure_common(ctx);
  if (rc != CE_OK) {
    rc = ce__tls_fail(err, errlen, rc, NULL,
                      "cannot configure the client TLS context: %s",
                      ce__tls_openssl_reason());
    goto fail;
  }
  /* Only the given files are trusted: no default paths, so what the proxy
   * accepts does not depend on the image it runs in. */
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  /* Resumption with (EC)DHE only: a PSK-only resumption would give up
   * forward secrecy. OpenSSL offers psk_dhe_ke alone unless this is set. */
  SSL_CTX_clear_options(ctx, SSL_OP_ALLOW_NO_DHE_KEX);
  rc = ce__tls_sesscache_attach(ctx, CE_TLS_SESSCACHE_MAX);
  if (rc != CE_OK) {
    rc = ce__tls_fail(err, errlen, rc, NULL, "cannot create the upstream session store");
    goto fail;
  }
  X509_STORE *store = SSL_CTX_get_cert_store(ctx);
  rc = load_anchors(store, bundle_path, err, errlen);
  if (rc == CE_OK && extra_ca_path != NULL)
    rc = load_anchors(store, extra_ca_path, err, errlen);
  if (rc != CE_OK)
    goto fail;
  *out = ctx;
  return CE_OK;
fail:
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return rc;
}

size_t ce_tls_client_ctx_trust_count(SSL_CTX *ctx) {
  if (ctx == NULL)
    return 0;
  STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
  size_t count = 0;
  for (int i = 0; i < sk_X509_OBJECT_num(objs); i++) {
    if (X509_OBJECT_get_type(sk_X509_OBJECT_value(objs, i)) == X509_LU_X509)
      count++;
  }
  return count;
}

int ce_tls_client_ssl_new(SSL_CTX *ctx, const char *host,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out) {
  return ce_tls_client_ssl_new_at(ctx, host, 0, alpn, alpn_len, out);
}

int ce_tls_client_ssl_new_at(SSL_CTX *ctx, const char *host, uint16_t port,
                             const unsigned char *alpn, size_t alpn_len,
                             SSL **out) {
  ce__tls_name_t name;
  if (ctx == NULL || ce__tls_name_parse(host, &name) != CE_OK)
    return CE_EINVAL;
  if (alpn == NULL)
    alpn_len = 0;
  if (!alpn_wire_ok(alpn, alpn_len))
    return CE_EINVAL;
  ERR_clear_error();
  SSL *ssl = SSL_new(ctx);
  if (ssl == NULL) {
    ERR_clear_error();
    return CE_ENOMEM;
  }
  int rc = CE_ETLS;
  X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
  /* The subjectAltName alone names the server: the subject CN fallback is
   * what RFC 6125 §6.4.4 tolerates and what browsers dropped, and a CN
   * would let a certificate name a host its SAN does not list. Partial
   * wildcards ("f*.example.com") are refused as RFC 6125 §7.2 advises. */
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS |
                                             X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
  if (name.kind == CE__TLS_NAME_DNS) {
    /* RFC 6066 §3: "Literal IPv4 and IPv6 addresses are not permitted in
     * HostName", so only names are sent as SNI. */
    if (SSL_set_tlsext_host_name(ssl, host) != 1 ||
        X509_VERIFY_PARAM_set1_host(param, host, name.len) != 1)
      goto fail;
  } else {
    size_t alen = name.kind == CE__TLS_NAME_IPV4 ? 4 : 16;
    if (X509_VERIFY_PARAM_set1_ip(param, name.addr, alen) != 1)
      goto fail;
  }
  /* SSL_set_alpn_protos returns 0 on success, unlike most of OpenSSL. */
  if (alpn_len > 0 && SSL_set_alpn_protos(ssl, alpn, (unsigned int)alpn_len) != 0) {
    rc = CE_ENOMEM;
    goto fail;
  }
  /* Last, once the name to verify is set: the stored session of exactly
   * this name, port and ALPN offer, if any. */
  rc = ce__tls_sesscache_prepare(ssl, host, port, alpn, alpn_len);
  if (rc != CE_OK)
    goto fail;
  ERR_clear_error();
  *out = ssl;
  return CE_OK;
fail:
  SSL_free(ssl);
  ERR_clear_error();
  return rc;
}
