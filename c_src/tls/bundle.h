/*
 * The workspace's trust files for a session: the session CA certificate
 * and the bundle of public roots + that certificate, written into a
 * directory the workspace mounts (docs/kubernetes.md, "Objects"). The
 * `condukt-trust` init container runs it (`condukt-egress ca bundle`), so
 * the roots come from the sidecar image instead of being stored with
 * every session.
 */
#ifndef CE_TLS_BUNDLE_H
#define CE_TLS_BUNDLE_H

#include <stddef.h>

/* The names written into the directory. */
#define CE_BUNDLE_CA_NAME "ca.pem"
#define CE_BUNDLE_NAME "ca-certificates.crt"

/* Writes dir/ca.pem (a copy of the file ca_cert) and
 * dir/ca-certificates.crt (the file roots, a newline when it does not end
 * in one, then ca_cert), each through a temporary file in dir renamed into
 * place, mode 0644. ca_cert must hold a PEM certificate; both are read
 * with the limits of tls/files.h.
 *
 * Returns CE_OK; CE_ENOENT, CE_EPERM, CE_EINVAL, CE_ETOOBIG or CE_EIO for
 * a file that cannot be read or written; CE_EPARSE when ca_cert holds no
 * PEM certificate or roots no PEM at all; CE_ENOMEM. err (errlen bytes)
 * then holds one sentence naming the file at fault. On failure no
 * temporary file is left; a file renamed into place before the failure
 * stays (ca.pem is written first, the bundle last, so a bundle present
 * means both are complete). */
/* The Mozilla snapshot that ships next to the binary's real path
 * (priv/condukt-egress and priv/ca-certificates/mozilla.pem; in the image
 * /usr/local/lib/condukt/...), written into buf (cap bytes). Returns buf,
 * or NULL when /proc/self/exe cannot be read or the path does not fit. */
const char *ce_trust_default_roots(char *buf, size_t cap);

int ce_trust_bundle_write(const char *ca_cert, const char *roots, const char *dir, char *err,
                          size_t errlen);

#endif
