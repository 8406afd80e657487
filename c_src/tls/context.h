/*
 * OpenSSL contexts for both sides of the proxy (docs/tls.md).
 *
 * Workspace side: TLS 1.2 and 1.3, the leaf chosen per connection before
 * the handshake (the proxy already read the SNI), ALPN answered from a list
 * the proxy sets per connection (what the upstream negotiated). No
 * compression, no renegotiation, no session resumption.
 *
 * Upstream side: TLS 1.2 and 1.3, peer verification against a PEM bundle
 * (the Mozilla snapshot) plus an optional extra CA file (tests), hostname
 * or IP checking (subjectAltName only, no partial wildcards), SNI sent for
 * DNS names only, no renegotiation, TLS 1.3 session resumption per
 * upstream name, port and ALPN offer (sesscache.h).
 *
 * A context is shared by every connection of its side and is not changed
 * after creation; free it with SSL_CTX_free once its SSLs are gone (an SSL
 * holds a reference, so freeing it earlier is also safe). Every function
 * here leaves OpenSSL's error queue empty.
 */
#ifndef CE_TLS_CONTEXT_H
#define CE_TLS_CONTEXT_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The workspace-side context. Returns CE_OK or CE_ETLS (err set). *out is
 * untouched on failure. */
int ce_tls_server_ctx_new(SSL_CTX **out, char *err, size_t errlen);

/* A server SSL for one workspace connection: uses cert/key (references are
 * taken, the caller keeps its own) and answers ALPN from exactly the
 * protocols in `alpn` (wire format: length-prefixed names, e.g.
 * "\x08http/1.1"; NULL or alpn_len 0 = no ALPN answer). The list is
 * copied. The server picks the first name of this list that the client
 * offers; when none is offered, or the client sent no ALPN, the handshake
 * goes on without ALPN (docs/tls.md, "ALPN").
 * Returns CE_OK, CE_EINVAL (ctx, cert or key NULL, or a malformed ALPN
 * list: an empty name, or a length running past alpn_len), CE_ENOMEM or
 * CE_ETLS (the key does not match the certificate). *out is untouched on
 * failure. */
int ce_tls_server_ssl_new(SSL_CTX *ctx, X509 *cert, EVP_PKEY *key,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out);

/* The upstream-side context. bundle_path is required (the Mozilla snapshot
 * or a system bundle); extra_ca_path may be NULL. Every PEM certificate in
 * the files becomes a trust anchor; other PEM blocks are skipped. Returns
 * CE_OK, CE_EINVAL (bundle_path NULL), CE_ENOENT, CE_EPERM, CE_EPARSE (a
 * file without any certificate, or a malformed one), CE_ETOOBIG, CE_EIO,
 * CE_ENOMEM, CE_ETLS, with err naming the file. *out is untouched on
 * failure. */
int ce_tls_client_ctx_new(const char *bundle_path, const char *extra_ca_path,
                          SSL_CTX **out, char *err, size_t errlen);

/* The number of distinct trust anchors in a context made by
 * ce_tls_client_ctx_new (a certificate present in both files counts once).
 * For tests and the proxy's start-up log line. */
size_t ce_tls_client_ctx_trust_count(SSL_CTX *ctx);

/* A client SSL towards `host`, a normalised host as ce_leaf_get() takes it
 * (a DNS name, or an IP literal without brackets): SNI for names only
 * (RFC 6066 §3 forbids IP literals in SNI), verification of the name or
 * IP, and the ALPN offer in wire format (NULL or alpn_len 0 = none).
 * Returns CE_OK, CE_EINVAL (ctx NULL, a host that is not normalised, a
 * malformed ALPN list), CE_ENOMEM, CE_ETLS. *out is untouched on failure. */
int ce_tls_client_ssl_new(SSL_CTX *ctx, const char *host,
                          const unsigned char *alpn, size_t alpn_len,
                          SSL **out);

/* The same towards host:port, resuming a TLS 1.3 session stored for
 * exactly this host, port and ALPN offer (when there is one) and storing
 * the tickets this connection receives once its chain verified for host.
 * port 0: no resumption (as ce_tls_client_ssl_new). */
int ce_tls_client_ssl_new_at(SSL_CTX *ctx, const char *host, uint16_t port,
                             const unsigned char *alpn, size_t alpn_len,
                             SSL **out);

#endif
