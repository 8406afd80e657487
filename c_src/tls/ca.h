/*
 * The per-session certificate authority and the leaf certificates the proxy
 * presents to the workspace (docs/tls.md).
 *
 * Leaves are ECDSA P-256, one key per leaf, one leaf per host, with the
 * host as the only SAN (a DNS name, or an IP address for IP literals),
 * validity inside the CA's own window, a random 128-bit serial, and the
 * usual server extensions (basicConstraints CA:FALSE, keyUsage
 * digitalSignature, extendedKeyUsage serverAuth, subject and authority key
 * identifiers), signed with SHA-256. They are cached in a bounded LRU keyed
 * by host. The CA key may be ECDSA or RSA (ECDSA P-256 from
 * `condukt-egress ca new`).
 *
 * Nothing here is thread-safe: the proxy runs one event loop and owns one
 * CA and one cache. Every function leaves OpenSSL's error queue empty.
 */
#ifndef CE_TLS_CA_H
#define CE_TLS_CA_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stddef.h>

/* Leaves kept (LRU). A cached leaf with its key and entry takes about
 * 4.7 KiB of heap (measured with OpenSSL 3.0), so the default is about
 * 5 MiB. */
#define CE_LEAF_CACHE_DEFAULT 1024u
/* The largest cache accepted, about 75 MiB: far beyond the hosts one
 * sandbox session talks to. */
#define CE_LEAF_CACHE_MAX (16u * 1024u)
#define CE_LEAF_MAX_DAYS 30u          /* leaf lifetime cap, also bounded by the CA */
/* Leaves start this long before they are minted, so a workspace clock
 * slightly behind the sidecar's still accepts them. */
#define CE_LEAF_BACKDATE_SECONDS 3600
/* A cached leaf closer than this to its notAfter is minted again, so a
 * leaf is never presented just before it expires. */
#define CE_LEAF_RENEW_SECONDS 3600

/* `ca new` defaults and limits. 64 is ub-common-name (RFC 5280 appendix
 * A.1), counted in characters. */
#define CE_CA_DEFAULT_COMMON_NAME "Condukt session CA"
#define CE_CA_DEFAULT_DAYS 7u
#define CE_CA_MAX_DAYS 3650u
#define CE_CA_COMMON_NAME_MAX 64u

typedef struct ce_ca ce_ca_t;

/* Loads a PEM certificate (the first one in the file) and its PEM private
 * key (unencrypted); checks that the key is ECDSA or RSA and matches, that
 * the certificate is a CA (basicConstraints CA:TRUE, and keyCertSign when
 * it has a keyUsage) and is currently valid. Returns:
 *   CE_ENOENT   a file does not exist;
 *   CE_EPERM    a file is not readable;
 *   CE_EPARSE   no PEM certificate or key in the file, a malformed one, or
 *               an encrypted key;
 *   CE_EINVAL   key mismatch, not a CA, not valid now, unsupported key type,
 *               a path that is not a regular file;
 *   CE_ETOOBIG, CE_EIO, CE_ENOMEM.
 * err receives a sentence naming the file and the problem. *out is
 * untouched on failure. */
int ce_ca_load(const char *cert_path, const char *key_path, ce_ca_t **out,
               char *err, size_t errlen);

/* True when cn can be a CA's common name: valid UTF-8, 1 to
 * CE_CA_COMMON_NAME_MAX characters, no control characters. */
bool ce_ca_common_name_ok(const char *cn);

/* Creates a new self-signed CA (ECDSA P-256, version 3, 128-bit random
 * serial, CA:TRUE pathlen 0, keyCertSign and cRLSign, subject key
 * identifier, SHA-256) valid from one hour ago until `days` days from now,
 * written as PEM to the two paths: the key (PKCS#8) created 0600, the
 * certificate 0644 (both minus the umask). Neither file may exist already;
 * nothing is overwritten, and on failure neither file is left behind.
 * Returns:
 *   CE_EINVAL   a bad common name or day count (1 to CE_CA_MAX_DAYS), equal
 *               or empty paths, or a path that already exists;
 *   CE_EIO      a file could not be created or written;
 *   CE_ETLS     OpenSSL failed; CE_ENOMEM.
 * err receives a sentence (naming the file when one is at fault). */
int ce_ca_generate(const char *common_name, unsigned days,
                   const char *cert_path, const char *key_path,
                   char *err, size_t errlen);

/* Creates a CA like ce_ca_generate() (the same key type, extensions and
 * validity) but writes nothing: the PEM texts come back in new
 * NUL-terminated strings the caller frees (the key with
 * OPENSSL_clear_free(*key_pem, *key_len), since it is a secret; the
 * certificate with free()). The port program uses it for ca_new, which
 * hands both texts to the BEAM. Returns CE_OK, CE_EINVAL (a bad common
 * name or day count), CE_ETLS, CE_ENOMEM; err receives a sentence. On
 * failure the outputs are untouched. */
int ce_ca_generate_pem(const char *common_name, unsigned days, char **cert_pem,
                       size_t *cert_len, char **key_pem, size_t *key_len,
                       char *err, size_t errlen);

/* Frees the CA; NULL is fine. */
void ce_ca_free(ce_ca_t *ca);

/* The CA certificate (borrowed, lives as long as ca). */
X509 *ce_ca_cert(const ce_ca_t *ca);

typedef struct ce_leaf_cache ce_leaf_cache_t;

/* capacity 0 = CE_LEAF_CACHE_DEFAULT. The cache borrows ca, which must
 * outlive it. Returns CE_OK, CE_EINVAL (ca NULL, or capacity above
 * CE_LEAF_CACHE_MAX) or CE_ENOMEM. *out is untouched on failure. */
int ce_leaf_cache_new(ce_ca_t *ca, size_t capacity, ce_leaf_cache_t **out);

/* Frees the cache and its leaves; NULL is fine. Leaves handed out by
 * ce_leaf_get() stay valid (they are reference counted). */
void ce_leaf_cache_free(ce_leaf_cache_t *cache);

/*
 * Returns the leaf for `host`: a normalised ASCII DNS name (lower case,
 * A-labels, no trailing dot) or an IP literal in the canonical text of
 * docs/host-matching.md §1 (IPv6 without brackets), that is a host that
 * ce_host_normalize() leaves unchanged. On a miss, or when the cached leaf
 * is within CE_LEAF_RENEW_SECONDS of its end, a new leaf is minted and
 * cached, evicting the least recently used one when the cache is full.
 * *cert and *key are new references the caller frees (X509_free,
 * EVP_PKEY_free). Returns:
 *   CE_EINVAL   host is not a normalised host (empty, over-long, upper case,
 *               a port or brackets, a wildcard, ...);
 *   CE_ETLS     the CA is expired or not yet valid, or OpenSSL failed;
 *   CE_ENOMEM.
 * Outputs are untouched on failure.
 */
int ce_leaf_get(ce_leaf_cache_t *cache, const char *host, X509 **cert,
                EVP_PKEY **key);

/* Entries currently cached, and leaves minted since creation (tests). */
size_t ce_leaf_cache_size(const ce_leaf_cache_t *cache);
unsigned long ce_leaf_cache_minted(const ce_leaf_cache_t *cache);

#endif
