/*
 * Host names as the TLS code accepts them (internal to c_src/tls).
 *
 * Both the leaf cache and the upstream client take a host that the proxy
 * has already normalised with ce_host_normalize() (docs/host-matching.md
 * §1). Rather than keep a second, slightly different idea of what a host
 * is, the TLS code runs the same normaliser and accepts the host only when
 * it comes back unchanged: one spelling per host means one cache entry per
 * host, and a name that the policy engine would call invalid never ends up
 * in a certificate or an SNI.
 */
#ifndef CE_TLS_NAMES_H
#define CE_TLS_NAMES_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  CE__TLS_NAME_DNS = 1,  /* a DNS name in ASCII (A-label) form */
  CE__TLS_NAME_IPV4 = 2, /* addr[0..4) */
  CE__TLS_NAME_IPV6 = 3, /* addr[0..16) */
} ce__tls_name_kind_t;

typedef struct {
  ce__tls_name_kind_t kind;
  uint8_t addr[16]; /* zero for names */
  size_t len;       /* strlen of the host */
} ce__tls_name_t;

/* Classifies host, which must already be in normalised form: lower-case
 * ASCII name, strict dotted quad, or RFC 5952 IPv6 text without brackets.
 * Returns CE_OK, or CE_EINVAL for NULL, empty, over-long (more than 253
 * bytes), or any host that normalisation would change (upper case, a port,
 * a trailing dot, brackets, "::ffff:a.b.c.d", a '*', ...). *out is untouched
 * on failure. */
int ce__tls_name_parse(const char *host, ce__tls_name_t *out);

#endif
