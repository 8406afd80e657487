/*
 * The workspace's trust files for a session: the session CA certificate,
 * the bundle of public roots + that certificate, and the same
 * certificates as a PKCS#12 trust store for the JVM, written into a
 * directory the workspace mounts (docs/kubernetes.md, "Objects"). The
 * `condukt-trust` init container runs it (`condukt-egress ca bundle`), so
 * the roots come from the sidecar image instead of being stored with
 * every session.
 *
 * The store has the form Condukt.Sandbox.NetworkPolicy.TrustStore writes
 * on the BEAM, byte for byte: PFX version 3 whose authSafe holds one
 * unencrypted SafeContents of certBags (RFC 7292 §4, §4.2.3), no MacData
 * and so no password; each bag carries a friendlyName (alias
 * "mozilla-NNN" for the roots, "condukt-session-ca-N" for the session's
 * certificates) and the JDK's trusted-key-usage attribute
 * (2.16.840.1.113894.746875.1.1 = anyExtendedKeyUsage), which makes the
 * JDK read the bag as a trusted certificate entry.
 */
#ifndef CE_TLS_BUNDLE_H
#define CE_TLS_BUNDLE_H

#include <stddef.h>

/* The names written into the directory. */
#define CE_BUNDLE_CA_NAME "ca.pem"
#define CE_BUNDLE_NAME "ca-certificates.crt"
#define CE_BUNDLE_STORE_NAME "trust-store.p12"

/* The largest trust store built (the DER is smaller than the PEM it comes
 * from, which tls/files.h bounds at 8 MiB; each bag adds ~90 bytes). */
#define CE_TRUST_STORE_MAX (16u * 1024u * 1024u)

/* Writes dir/ca.pem (a copy of the file ca_cert), dir/trust-store.p12
 * (see above: every certificate of roots, then every one of ca_cert) and
 * dir/ca-certificates.crt (the file roots, a newline when it does not end
 * in one, then ca_cert), each through a temporary file in dir renamed into
 * place: the two PEM files mode 0644, the store 0444. Both inputs are read
 * with the limits of tls/files.h and must each hold at least one PEM
 * certificate, every "-----BEGIN CERTIFICATE-----" block of them a valid
 * certificate; nothing is written before both are read.
 *
 * Returns CE_OK; CE_ENOENT, CE_EPERM, CE_EINVAL, CE_ETOOBIG or CE_EIO for
 * a file that cannot be read or written; CE_EPARSE when ca_cert or roots
 * holds no PEM certificate or one that cannot be decoded; CE_ETOOBIG when
 * the store would pass CE_TRUST_STORE_MAX; CE_ENOMEM (or CE_EPARSE
 * when OpenSSL runs out of memory while decoding). err (errlen
 * bytes) then holds one sentence naming the file at fault. On failure no
 * temporary file is left and OpenSSL's error queue is empty; a file
 * renamed into place before the failure stays (ca.pem is written first,
 * the bundle last, so a bundle present means all three are complete). */
/* The Mozilla snapshot that ships next to the binary's real path
 * (priv/condukt-egress and priv/ca-certificates/mozilla.pem; in the image
 * /usr/local/lib/condukt/...), written into buf (cap bytes). Returns buf,
 * or NULL when /proc/self/exe cannot be read or the path does not fit. */
const char *ce_trust_default_roots(char *buf, size_t cap);

/* The trust store (see above) of the PEM certificates in roots
 * (roots_len bytes), then those in session (session_len bytes), into
 * *out (malloc'd, the caller frees it) and *out_len. roots_name and
 * session_name name the inputs in err. Each input, and the certificate
 * bags together, may take at most max bytes (CE_TRUST_STORE_MAX, which
 * is also the most max can be). Returns CE_OK or, like
 * ce_trust_bundle_write, CE_EPARSE, CE_ETOOBIG or CE_ENOMEM, err set;
 * *out and *out_len are untouched on failure, OpenSSL's error queue is
 * left empty. */
int ce_trust_store_build(const char *roots, size_t roots_len, const char *roots_name,
                         const char *session, size_t session_len, const char *session_name,
                         size_t max, unsigned char **out, size_t *out_len, char *err,
                         size_t errlen);

int ce_trust_bundle_write(const char *ca_cert, const char *roots, const char *dir, char *err,
                          size_t errlen);

#endif
