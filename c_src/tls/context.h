/*
 * OpenSSL contexts for both sides of the proxy (docs/tls.md).
 *
 * Workspace side: TLS 1.2 and 1.3, the leaf chosen per connection before
 * the handshake (the proxy already read the SNI), ALPN answered from a list
 * the proxy sets per connection (what the upstream negotiated).
 *
 * Upstream side: TLS 1.2 and 1.3, peer verification against a PEM bundle
 * (the Mozilla snapshot) plus an optional extra CA file (tests), hostname
 * or IP checking, SNI sent for DNS names only.
 */
#ifndef CE_TLS_CONTEXT_H
#define CE_TLS_CONTEXT_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>

/* Returns CE_OK or CE_ETLS (err set). */
int ce_tls_server_ctx_new(SSL_CTX **out, char *err, size_t errlen);

/* A server SSL for one workspace connection: uses cert/key (references are
 * taken, the caller keeps its own) and offers exactly the ALPN protocols in
 * `alpn` (wire format: length-prefixed names, e.g. "\x08http/1.1"; NULL or
 * empty = no ALPN answer). Returns CE_OK, CE_ENOMEM or CE_ETLS. */
int ce_tls_server_ssl_new(SSL_CTX *ctx, X509 *cert, EVP_PKEY *key,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out);

/* bundle_path is required (the Mozilla snapshot or a system bundle);
 * extra_ca_path may be NULL. Returns CE_OK, CE_ENOENT, CE_EPARSE (a file
 * without any certificate), CE_ETLS, with err naming the file. */
int ce_tls_client_ctx_new(const char *bundle_path, const char *extra_ca_path,
                          SSL_CTX **out, char *err, size_t errlen);

/* A client SSL towards `host` (a DNS name, or an IP literal without
 * brackets): SNI for names, verification of the name or IP, and the ALPN
 * offer in wire format (NULL = none). Returns CE_OK, CE_ENOMEM, CE_ETLS. */
int ce_tls_client_ssl_new(SSL_CTX *ctx, const char *host,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out);

#endif
