/*
 * The per-session certificate authority and the leaf certificates the proxy
 * presents to the workspace (docs/tls.md).
 *
 * Leaves are ECDSA P-256, one per host, with the host as the only SAN (a
 * DNS name, or an IP address for IP literals), validity inside the CA's own
 * window, a random 128-bit serial, and the usual server extensions
 * (basicConstraints CA:FALSE, keyUsage digitalSignature, extendedKeyUsage
 * serverAuth, subject and authority key identifiers). They are cached in a
 * bounded LRU keyed by host. The CA key is any key type OpenSSL can sign
 * with (ECDSA P-256 from `condukt-egress ca new`).
 */
#ifndef CE_TLS_CA_H
#define CE_TLS_CA_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stddef.h>

#define CE_LEAF_CACHE_DEFAULT 1024u  /* leaves kept (LRU) */
#define CE_LEAF_MAX_DAYS 30u          /* leaf lifetime cap, also bounded by the CA */

typedef struct ce_ca ce_ca_t;

/* Loads a PEM certificate and its PEM private key; checks that the key
 * matches, that the certificate is a CA (basicConstraints CA:TRUE) and is
 * currently valid. Returns CE_OK, CE_ENOENT, CE_EPARSE or CE_EINVAL with a
 * sentence in err naming the file and the problem. *out untouched on failure. */
int ce_ca_load(const char *cert_path, const char *key_path, ce_ca_t **out,
               char *err, size_t errlen);

/* Creates a new self-signed CA (ECDSA P-256, CA:TRUE pathlen 0, keyCertSign
 * and cRLSign) valid from one hour ago for `days`, written as PEM to the two
 * paths (the key file created 0600, never overwriting an existing file).
 * Returns CE_OK, CE_EINVAL, CE_EIO with err set. */
int ce_ca_generate(const char *common_name, unsigned days,
                   const char *cert_path, const char *key_path,
                   char *err, size_t errlen);

void ce_ca_free(ce_ca_t *ca);

/* The CA certificate (borrowed, lives as long as ca). */
X509 *ce_ca_cert(const ce_ca_t *ca);

typedef struct ce_leaf_cache ce_leaf_cache_t;

/* capacity 0 = CE_LEAF_CACHE_DEFAULT. The cache borrows ca, which must
 * outlive it. Returns CE_OK or CE_ENOMEM. */
int ce_leaf_cache_new(ce_ca_t *ca, size_t capacity, ce_leaf_cache_t **out);
void ce_leaf_cache_free(ce_leaf_cache_t *cache);

/*
 * Returns the leaf for `host`: a normalised ASCII DNS name (lower case,
 * A-labels) or an IP literal in text form (IPv6 without brackets), minting
 * and caching it on a miss. *cert and *key are new references the caller
 * frees (X509_free, EVP_PKEY_free). Returns CE_OK, CE_EINVAL (empty or
 * over-long host), CE_ENOMEM, CE_ETLS (OpenSSL failed). Outputs untouched on
 * failure.
 */
int ce_leaf_get(ce_leaf_cache_t *cache, const char *host, X509 **cert,
                EVP_PKEY **key);

/* Entries currently cached, and leaves minted since creation (tests). */
size_t ce_leaf_cache_size(const ce_leaf_cache_t *cache);
unsigned long ce_leaf_cache_minted(const ce_leaf_cache_t *cache);

#endif
