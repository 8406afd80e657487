/*
 * Credential injection (docs/credentials.md): the sidecar adds a header
 * holding a secret to the requests the policy allowed, for the hosts (and
 * methods, paths) a credential entry names, so that the workspace never
 * holds the secret.
 *
 * Two halves:
 *
 * - The entries ("credentials" in a version 3 policy document,
 *   docs/policy-json.md) are part of the immutable ce_policy_t: a host
 *   pattern with optional methods and paths, the header to set, and the
 *   name of the secret whose value it gets. policy.c loads them with the
 *   validators below and matches them (ce_policy_credentials_match).
 * - The values live in a ce_secrets_t that the proxy owns: loaded from
 *   the sidecar's own secrets file (`proxy --credentials FILE`) and
 *   replaced at run time when the BEAM rotates one over the control
 *   channel. Values are wiped from memory when replaced or freed.
 *
 * ce_credential_apply() is the one call the request pipeline makes, with
 * the header block of a request that is going upstream: it removes every
 * field of the credential's name the workspace sent (any case) and
 * appends the credential. Nothing here allocates on that path.
 *
 * Everything runs on the proxy's loop thread; nothing here is locked.
 */
#ifndef CE_POLICY_CREDENTIAL_H
#define CE_POLICY_CREDENTIAL_H

#include <stdbool.h>
#include <stddef.h>

#include "http1/parser.h"
#include "policy/policy.h"

/* docs/policy-json.md: at most 256 credential entries (and secrets). */
#define CE_CRED_MAX_ENTRIES CE_POLICY_MAX_CREDENTIALS
/* A secret's name: 1 to 128 bytes of A-Z a-z 0-9 '.' '_' '-'. */
#define CE_CRED_NAME_MAX 128
/* A header name: a token of 1 to 64 bytes, stored in lower case. */
#define CE_CRED_HEADER_MAX 64
/* A secret's value, which is the header's value: 1 to 8192 bytes. */
#define CE_CRED_VALUE_MAX 8192
/* The secrets file is at most 1 MiB. */
#define CE_SECRETS_MAX_BYTES (1024u * 1024u)
/* Room for one error line of the secrets loader. */
#define CE_SECRETS_ERROR_MAX 256

/* Is name[0..n) a valid secret name? */
bool ce_credential_name_ok(const char *name, size_t n);

/* Checks a credential header name and writes it in lower case into
 * out[0..CE_CRED_HEADER_MAX] (NUL-terminated). Returns NULL when it is
 * usable, else why not (a static sentence): not a token, too long, or a
 * field the proxy owns (Host, framing and connection fields,
 * Proxy-Authorization). */
const char *ce_credential_header_check(const char *name, size_t n, char *out);

/* Is value[0..n) usable as a header value: 1 to CE_CRED_VALUE_MAX bytes
 * of visible ASCII, obs-text, SP and HTAB, not starting or ending with SP
 * or HTAB (RFC 9110 §5.5)? The reason is a static sentence; NULL when
 * valid. The value itself never appears in it. */
const char *ce_credential_value_check(const char *value, size_t n);

/* ---- the values ----------------------------------------------------------- */

typedef struct ce_secrets ce_secrets_t;

/* Loads the secrets file text buf[0..len):
 *   {"version": 1, "secrets": {"NAME": "VALUE", ...}}
 * Every object is closed; names and values as checked above; at most
 * CE_CRED_MAX_ENTRIES secrets. Returns 0 with *out set, or CE_ETOOBIG,
 * CE_EPARSE (not JSON, a duplicate name), CE_EVERSION, CE_EINVAL (any
 * other problem), CE_ENOMEM; on failure *out is untouched and err (room
 * for CE_SECRETS_ERROR_MAX bytes, may be NULL) names the JSON path, never
 * a value. */
int ce_secrets_load_buffer(const char *buf, size_t len, ce_secrets_t **out, char *err);

/* Reads the file at path and loads it as above; also CE_ENOENT, CE_EIO. */
int ce_secrets_load_file(const char *path, ce_secrets_t **out, char *err);

/* Wipes and frees; NULL is fine. */
void ce_secrets_free(ce_secrets_t *secrets);

/* Sets (or replaces) the value of a secret. Returns 0, CE_EINVAL (a bad
 * name or value), CE_ETOOBIG (CE_CRED_MAX_ENTRIES secrets already) or
 * CE_ENOMEM; on failure the old value stays. The old value is wiped. */
int ce_secrets_set(ce_secrets_t *secrets, const char *name, size_t name_len, const char *value,
                   size_t value_len);

/* The value of a secret, or NULL; *len gets its length. Valid until the
 * next ce_secrets_set or ce_secrets_free. */
const char *ce_secrets_get(const ce_secrets_t *secrets, const char *name, size_t name_len, size_t *len);

/* Does every secret the policy's credentials name have a value? Returns
 * 0, or CE_EINVAL with err (CE_SECRETS_ERROR_MAX bytes) naming the first
 * one missing. secrets may be NULL (then only a policy without
 * credentials passes). */
int ce_secrets_check(const ce_secrets_t *secrets, const ce_policy_t *policy, char *err);

/* Appends the header name of every credential of the policy to
 * names[*count..cap) (NUL-terminated strings owned by the policy), each
 * once, skipping those is_known(name, len, arg) already covers: the
 * proxy's list of headers events redact. Returns 0, or CE_ETOOBIG when
 * cap is reached (the list then holds what fitted). */
int ce_credential_redact_names(const ce_policy_t *policy, const char **names, size_t *count, size_t cap,
                               bool (*is_known)(const char *name, size_t len, const void *arg), const void *arg);

/* ---- the pipeline --------------------------------------------------------- */

/* What the pipeline knows of a request that the policy allowed. */
typedef struct {
  const char *host;   /* the request's host as checked (a ":port" is ignored) */
  size_t host_len;
  const char *method; /* NULL: not known (an entry with methods does not match) */
  size_t method_len;
  const char *target; /* the request target; NULL: not known */
  size_t target_len;
  bool tls;           /* the request goes upstream over verified TLS */
} ce_credential_request_t;

/*
 * The one call of the pipeline, with the header block f[0..*n) (room for
 * cap fields) of an allowed request about to go upstream, HTTP/1.1 or h2
 * (pseudo-header fields are left alone). For each credential that
 * matches the request (host, methods, paths; the first entry for a header
 * wins), every field of that name is removed, whatever its case, and
 * {header, value} appended; the value points into secrets and is valid
 * until the next ce_secrets_set, so the caller copies the block out (it
 * writes or submits it) within the same loop turn.
 *
 * A request that is not TLS gets no credential: a secret never crosses
 * the network in clear (docs/credentials.md).
 *
 * Returns the number of credentials added (0 when none applies), or
 * CE_ETOOBIG when the block has no room left for one (the request must
 * then be refused, not sent without it), CE_EINVAL (the secret has no
 * value: refused likewise), or CE_ENOMEM (a host that is not ASCII and
 * memory ran out). On failure the block may have lost fields;
 * the caller refuses the request.
 */
int ce_credential_apply(const ce_policy_t *policy, const ce_secrets_t *secrets, const ce_credential_request_t *rq,
                        ce_h1_field_t *f, size_t *n, size_t cap);

#endif
