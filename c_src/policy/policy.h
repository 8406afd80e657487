/*
 * The sidecar policy: loading the JSON document of docs/policy-json.md
 * (versions 1 to 3) with strict validation, and evaluating a request
 * against it per docs/host-matching.md §5 and docs/path-matching.md.
 * Version 3 adds credential entries (policy/credential.h).
 *
 * Ownership: ce_policy_load_*() allocate a ce_policy_t that the caller
 * frees with ce_policy_free(). A loaded policy is immutable, so any number
 * of threads may evaluate against it at once. Evaluation writes only into
 * the caller's ce_verdict_t and never allocates for ASCII hosts.
 */
#ifndef CE_POLICY_POLICY_H
#define CE_POLICY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/host.h"

/* The document versions this build reads (docs/policy-json.md): version 2
 * adds entry objects with methods and paths, version 3 credentials;
 * version 1 is read as before. */
#define CE_POLICY_VERSION_MIN 1
#define CE_POLICY_VERSION 3
/* docs/policy-json.md: a document is at most 4 MiB. */
#define CE_POLICY_MAX_BYTES (4u * 1024u * 1024u)
/* docs/policy-json.md: at most 4096 rules, and 4096 patterns per rule. */
#define CE_POLICY_MAX_RULES 4096
#define CE_POLICY_MAX_HOSTS 4096
/* docs/policy-json.md: an entry object has at most 64 methods of at most
 * 32 bytes, and 256 path patterns. */
#define CE_POLICY_MAX_METHODS 64
#define CE_POLICY_METHOD_MAX 32
#define CE_POLICY_MAX_PATHS 256
/* docs/policy-json.md: a decide rule waits 1 ms to one hour. */
#define CE_POLICY_TIMEOUT_MIN_MS 1
#define CE_POLICY_TIMEOUT_MAX_MS 3600000
/* Room for one error line; quoted user text in it is shortened to fit. */
#define CE_POLICY_ERROR_MAX 512

typedef enum {
  CE_RULE_ALLOW = 0,
  CE_RULE_DENY = 1,
  CE_RULE_DECIDE = 2,
} ce_rule_kind_t;

typedef enum {
  CE_DECISION_ALLOW = 0,
  CE_DECISION_DENY = 1,
  CE_DECISION_DECIDE = 2, /* the caller asks the BEAM's decider */
} ce_decision_t;

typedef enum {
  CE_REASON_NONE = 0, /* allow and decide carry no reason */
  CE_REASON_DENIED_BY_RULE,
  CE_REASON_DEFAULT_DENY,
  CE_REASON_INVALID_HOST,
  CE_REASON_INVALID_URL,
  CE_REASON_INVALID_PATH, /* a path condition met a path that is refused */
} ce_reason_t;

typedef struct ce_policy ce_policy_t;

/* One rule as loaded. */
typedef struct {
  ce_rule_kind_t kind;
  size_t host_count;   /* allow/deny: number of patterns; decide: 0 */
  uint32_t timeout_ms; /* decide only, else 0 */
  bool cache;          /* decide only, else false */
} ce_rule_info_t;

/* The answer for one request. */
typedef struct {
  ce_decision_t decision;
  ce_reason_t reason;
  int32_t rule_index;        /* the matched rule, or -1 for none */
  ce_rule_kind_t rule_kind;  /* meaningful only when rule_index >= 0 */
  bool host_valid;           /* false for invalid_host and invalid_url */
  ce_host_t host;            /* the normalised host when host_valid */
} ce_verdict_t;

/* Why a load failed: code is the returned CE_E* value, message one line
 * "<json path>: <what is wrong>" (or a file or JSON syntax problem), and
 * pattern_err the host-matching.md §2 code when a pattern was refused. */
typedef struct {
  int code;
  ce_pattern_err_t pattern_err;
  char message[CE_POLICY_ERROR_MAX];
} ce_policy_error_t;

/* Loads and validates a document held in buf[0..len) (no NUL needed).
 * Returns 0 and sets *out to a new policy, or:
 *   CE_ETOOBIG   len exceeds CE_POLICY_MAX_BYTES;
 *   CE_EPARSE    not JSON (including a duplicate object key);
 *   CE_EVERSION  $.version is an integer other than CE_POLICY_VERSION;
 *   CE_EINVAL    any other schema violation, including a bad pattern;
 *   CE_ENOMEM    out of memory.
 * err may be NULL; when given it is always filled (code 0 and an empty
 * message on success). On failure *out is untouched. */
int ce_policy_load_buffer(const char *buf, size_t len, ce_policy_t **out,
                          ce_policy_error_t *err);

/* Reads the file at path (at most CE_POLICY_MAX_BYTES) and loads it as
 * ce_policy_load_buffer() does. Returns what that returns, plus:
 *   CE_ENOENT    the file does not exist;
 *   CE_EIO       it cannot be opened or read (the message says why).
 * On failure *out is untouched. */
int ce_policy_load_file(const char *path, ce_policy_t **out,
                        ce_policy_error_t *err);

/* Frees a policy; NULL is fine. */
void ce_policy_free(ce_policy_t *policy);

/* The hot path: evaluates one request: its host (SNI, Host header or
 * :authority; an optional ":port" is dropped) in host[0..len), its method
 * and its request target (origin-form, query included or not), none of
 * them NUL-terminated. method or target NULL means "not known": an entry
 * with that condition does not match (docs/path-matching.md §4). A target
 * that path conditions need but that is refused (docs/path-matching.md §1)
 * denies the request at the first rule with such an entry for the host,
 * with reason CE_REASON_INVALID_PATH. Allocation-free for ASCII hosts.
 * Returns 0 with *out filled, or CE_ENOMEM (only for non-ASCII input); in
 * that case *out is still a deny with reason CE_REASON_INVALID_HOST, so a
 * caller that ignores the code fails closed. */
int ce_policy_eval_request(const ce_policy_t *policy, const char *host, size_t len, const char *method,
                           size_t method_len, const char *target, size_t target_len, ce_verdict_t *out);

/* The host alone, for the checks made before any request is seen (TLS
 * server name, an upstream address, DNS): the most some request to the
 * host could get. An allow entry with methods or paths counts as an allow
 * (out names its rule); a deny entry with them is passed over, since it
 * refuses only some requests. Never the verdict for a request: use
 * ce_policy_eval_request() for that. Returns what that returns. */
int ce_policy_eval_host(const ce_policy_t *policy, const char *host,
                        size_t len, ce_verdict_t *out);

/* The dry-run path: input is a URL when it contains "://" (its host and
 * path are taken per docs/host-matching.md §4; a bad scheme or a '\' in
 * the authority gives reason CE_REASON_INVALID_URL) and a bare host[:port]
 * otherwise, which has no path. method[0..method_len) may be NULL (not
 * known). Returns what ce_policy_eval_request() returns. */
int ce_policy_eval_input(const ce_policy_t *policy, const char *input, size_t len, const char *method,
                         size_t method_len, ce_verdict_t *out);

/* The dry run's credentials (docs/credentials.md): the entries whose
 * header a request for the same input and method would get, given the
 * decision ce_policy_eval_input() returned for it. None when the decision
 * is a deny, when the input is a plain http:// or ws:// URL (a credential
 * never goes out in clear) or not a valid URL; a bare host counts as TLS
 * and has no path. A decide decision lists what the request would get if
 * the decider allowed it. Indices as ce_policy_credentials_match() gives
 * them, into idx[0..cap); returns the count or CE_ENOMEM. */
int ce_policy_eval_input_credentials(const ce_policy_t *policy, const char *input, size_t len, const char *method,
                                     size_t method_len, ce_decision_t decision, size_t *idx, size_t cap);

/* The DNS side (docs/dns.md): could some request to the name
 * name[0..len) be allowed? The sidecar's resolver answers only such
 * names. It answers as ce_policy_eval_host() does, so an allow rule whose
 * entry for the name carries methods or paths counts as an allow:
 *   CE_DECISION_ALLOW   an allow rule, or the default, allows it;
 *   CE_DECISION_DECIDE  only a decider may allow it (out->rule_index is
 *                       the decide rule);
 *   CE_DECISION_DENY    nothing can: a deny rule, the default, or not a
 *                       DNS name (an IP literal is not a name one asks
 *                       DNS for: reason CE_REASON_INVALID_HOST).
 * Returns that decision, *out filled as ce_policy_eval_host() fills it.
 * Allocation-free for ASCII input; on CE_ENOMEM (non-ASCII input) the
 * answer is CE_DECISION_DENY. */
ce_decision_t ce_policy_could_allow(const ce_policy_t *policy, const char *name, size_t len, ce_verdict_t *out);

/* One credential entry as loaded (policy/credential.h): the header it
 * sets (lower case) and the secret it takes the value of, both
 * NUL-terminated and owned by the policy. */
typedef struct {
  const char *header;
  const char *secret;
} ce_credential_info_t;

/* The number of credential entries (0 before version 3). */
size_t ce_policy_credential_count(const ce_policy_t *policy);

/* Fills *out with entry index. Returns 0, or CE_EINVAL when index is out
 * of range (then *out is untouched). */
int ce_policy_credential(const ce_policy_t *policy, size_t index, ce_credential_info_t *out);

/* The credential entries that match a request (host, method, target as
 * ce_policy_eval_request() takes them; an entry's methods and paths
 * match as an allow entry's do, and a target they cannot judge matches
 * none): their indices, in document order, at most one per header (the
 * first entry wins), into idx[0..cap). Returns the count (at most
 * CE_POLICY_MAX_CREDENTIALS), or CE_ENOMEM (non-ASCII host, out of
 * memory). Allocation-free for ASCII hosts. */
#define CE_POLICY_MAX_CREDENTIALS 256
int ce_policy_credentials_match(const ce_policy_t *policy, const char *host, size_t len, const char *method,
                                size_t method_len, const char *target, size_t target_len, size_t *idx, size_t cap);

/* The document's default: CE_DECISION_ALLOW or CE_DECISION_DENY. */
ce_decision_t ce_policy_default(const ce_policy_t *policy);

/* The number of rules. */
size_t ce_policy_rule_count(const ce_policy_t *policy);

/* Fills *out with rule index. Returns 0, or CE_EINVAL when index is out of
 * range (then *out is untouched). */
int ce_policy_rule(const ce_policy_t *policy, size_t index,
                   ce_rule_info_t *out);

/* Wire names: "allow"/"deny"/"decide" for decisions and kinds, and
 * "denied_by_rule", "default_deny", "invalid_host", "invalid_url",
 * "invalid_path" for reasons. ce_reason_name() returns NULL for CE_REASON_NONE; the others
 * never return NULL ("unknown" for values outside the enums). */
const char *ce_decision_name(ce_decision_t decision);
const char *ce_rule_kind_name(ce_rule_kind_t kind);
const char *ce_reason_name(ce_reason_t reason);

#endif
