/*
 * Policy loading and evaluation (see policy.h).
 *
 * Loading parses the document with jansson, walks it once in a fixed order
 * (version first, so a newer document says "unsupported version" rather
 * than tripping over a member this build does not know; then unknown
 * members, so a misspelt member is named as such rather than reported as a
 * missing one), and compiles every pattern into a flat array. The first
 * problem found ends the load with a message naming its JSON path.
 *
 * A compiled policy is three arrays: rules, each pointing at a slice of
 * the pattern array, and one text arena holding every normalised name.
 * Evaluation walks the rules in order; nothing in it allocates.
 */
#include "policy/policy.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <unistr.h>

#include "common/error.h"
#include "common/json.h"
#include "common/text.h"
#include "policy/credential.h"
#include "policy/glob.h"
#include "policy/path.h"
#include "policy/url.h"

/* A JSON path in a message: "$.rules[4095].hosts[4095]" (26 bytes) plus a
 * member name as ce_text_sanitize() writes it (at most 4 bytes per input
 * byte for CE_TEXT_QUOTE_MAX input bytes, then "...") inside [""] always
 * fits. */
#define PATH_MAX_LEN (32 + 4 * CE_TEXT_QUOTE_MAX + 8)
/* The first read buffer for a policy file; it doubles up to the limit. */
#define READ_CHUNK (64u * 1024u)

typedef struct {
  uint8_t kind;      /* ce_host_kind_t */
  uint8_t wildcard;  /* a name containing '*' */
  uint16_t len;      /* text length, at most CE_HOST_NAME_MAX */
  size_t text_off;   /* offset of the text in policy->arena (names only) */
  uint8_t addr[16];  /* IP literals only */
  /* version 2 entries: methods and path patterns, slices of
   * policy->texts; a count of 0 places no condition */
  uint16_t method_count, path_count;
  size_t method_first, path_first;
} policy_pattern_t;

/* A method or a normalised path pattern in policy->arena. */
typedef struct {
  size_t off;
  uint16_t len;
} policy_text_t;

typedef struct {
  ce_rule_kind_t kind;
  uint32_t timeout_ms;
  bool cache;
  size_t first; /* index of the first pattern in policy->patterns */
  size_t count;
} policy_rule_t;

/* A credential entry (version 3): its host and conditions are a pattern
 * of policy->patterns that belongs to no rule. */
typedef struct {
  size_t pattern;
  char header[CE_CRED_HEADER_MAX + 1];
  char secret[CE_CRED_NAME_MAX + 1];
} policy_cred_t;

struct ce_policy {
  ce_decision_t default_decision;
  policy_cred_t *creds;
  size_t cred_count;
  policy_rule_t *rules;
  size_t rule_count;
  policy_pattern_t *patterns;
  size_t pattern_count, pattern_cap;
  policy_text_t *texts;
  size_t text_count, text_cap;
  char *arena;
  size_t arena_len, arena_cap;
};

/* ---- error messages ---------------------------------------------------- */

/* snprintf that may cut: every buffer is sized for the texts we expect,
 * and a shortened message is still better than none. */
static void format_into(char *dst, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void format_into(char *dst, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, cap, fmt, ap);
  va_end(ap);
}

static int fail(ce_policy_error_t *err, int code, const char *path,
                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(ce_policy_error_t *err, int code, const char *path,
                const char *fmt, ...) {
  char what[CE_POLICY_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  err->code = code;
  if (path != NULL)
    format_into(err->message, sizeof(err->message), "%s: %s", path, what);
  else
    format_into(err->message, sizeof(err->message), "%s", what);
  return code;
}

static void quote(char *dst, size_t cap, const char *s, size_t n) {
  ce_text_sanitize(dst, cap, s, n, 1);
}

/* path + ".name", or path + "[\"name\"]" when the name is not a plain
 * identifier, so every message names the member unambiguously. */
static void member_path(char *dst, size_t cap, const char *base,
                        const char *key) {
  size_t n = strlen(key);
  int plain = n > 0 && n <= CE_TEXT_QUOTE_MAX;
  for (size_t i = 0; i < n && plain; i++) {
    char c = key[i];
    plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
            (i > 0 && c >= '0' && c <= '9');
  }
  if (plain) {
    format_into(dst, cap, "%s.%s", base, key);
  } else {
    char q[CE_TEXT_QUOTE_MAX * 4 + 8];
    quote(q, sizeof(q), key, n);
    format_into(dst, cap, "%s[\"%s\"]", base, q);
  }
}

/* ---- building ------------------------------------------------------------ */

static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t ncap = *cap > 0 ? *cap : 16;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2 / elem)
      return CE_ENOMEM;
    ncap *= 2;
  }
  void *nbuf = realloc(*buf, ncap * elem);
  if (nbuf == NULL)
    return CE_ENOMEM;
  *buf = nbuf;
  *cap = ncap;
  return 0;
}

static int add_pattern(ce_policy_t *p, const ce_host_t *h) {
  int rc = grow((void **)&p->patterns, &p->pattern_cap, p->pattern_count + 1,
                sizeof(policy_pattern_t));
  if (rc != 0)
    return rc;
  policy_pattern_t *pat = &p->patterns[p->pattern_count];
  memset(pat, 0, sizeof(*pat));
  pat->kind = (uint8_t)h->kind;
  pat->len = (uint16_t)h->len;
  if (h->kind == CE_HOST_NAME) {
    rc = grow((void **)&p->arena, &p->arena_cap, p->arena_len + h->len, 1);
    if (rc != 0)
      return rc;
    memcpy(p->arena + p->arena_len, h->text, h->len);
    pat->text_off = p->arena_len;
    pat->wildcard = memchr(h->text, '*', h->len) != NULL;
    p->arena_len += h->len;
  } else {
    memcpy(pat->addr, h->addr, sizeof(pat->addr));
  }
  p->pattern_count++;
  return 0;
}

static int add_text(ce_policy_t *p, const char *text, size_t len) {
  int rc = grow((void **)&p->texts, &p->text_cap, p->text_count + 1, sizeof(policy_text_t));
  if (rc == 0)
    rc = grow((void **)&p->arena, &p->arena_cap, p->arena_len + len, 1);
  if (rc != 0)
    return rc;
  memcpy(p->arena + p->arena_len, text, len);
  p->texts[p->text_count].off = p->arena_len;
  p->texts[p->text_count].len = (uint16_t)len;
  p->text_count++;
  p->arena_len += len;
  return 0;
}

/* ---- validation ---------------------------------------------------------- */

static int check_members(const json_t *obj, const char *path,
                         const char *const *allowed, size_t nallowed,
                         ce_policy_error_t *err) {
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)obj, key, val) {
    int known = 0;
    for (size_t k = 0; k < nallowed && !known; k++)
      known = strcmp(key, allowed[k]) == 0;
    if (!known) {
      char mpath[PATH_MAX_LEN];
      member_path(mpath, sizeof(mpath), path, key);
      return fail(err, CE_EINVAL, mpath, "unknown member");
    }
  }
  return 0;
}

static int missing(ce_policy_error_t *err, const char *path, const char *name) {
  return fail(err, CE_EINVAL, path, "missing member \"%s\"", name);
}

/* RFC 9110 §9: a method is a token; methods are matched case-sensitively
 * and this policy format takes the upper-case spelling every registered
 * method has: A-Z, 0-9, '-' and '_'. */
static bool method_ok(const char *m, size_t n) {
  if (n == 0 || n > CE_POLICY_METHOD_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = m[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return false;
  }
  return true;
}

/* One "methods" or "paths" array of an entry object. */
static int load_conditions(ce_policy_t *p, const json_t *list, const char *epath, const char *name,
                           size_t max, uint16_t *count, size_t *first, ce_policy_error_t *err) {
  char lpath[PATH_MAX_LEN];
  format_into(lpath, sizeof(lpath), "%s.%s", epath, name);
  if (!json_is_array(list) || json_array_size(list) == 0)
    return fail(err, CE_EINVAL, lpath, "expected a non-empty array of strings");
  if (json_array_size(list) > max)
    return fail(err, CE_EINVAL, lpath, "more than %zu entries", max);
  *first = p->text_count;
  for (size_t j = 0; j < json_array_size(list); j++) {
    const json_t *v = json_array_get(list, j);
    char vpath[PATH_MAX_LEN];
    format_into(vpath, sizeof(vpath), "%s[%zu]", lpath, j);
    if (!json_is_string(v))
      return fail(err, CE_EINVAL, vpath, "expected a string");
    const char *text = json_string_value(v);
    size_t len = json_string_length(v);
    char q[CE_TEXT_QUOTE_MAX * 4 + 8];
    int rc;
    if (name[0] == 'm') {
      if (!method_ok(text, len)) {
        quote(q, sizeof(q), text, len);
        return fail(err, CE_EINVAL, vpath,
                    "bad method \"%s\": an upper-case token of A-Z, 0-9, '-' and '_', at most %d bytes", q,
                    CE_POLICY_METHOD_MAX);
      }
      rc = add_text(p, text, len);
    } else {
      char norm[CE_PATH_PATTERN_MAX + 1];
      size_t nlen;
      ce_path_pattern_err_t perr;
      if (ce_path_pattern_normalize(text, len, norm, sizeof(norm), &nlen, &perr) != 0) {
        quote(q, sizeof(q), text, len);
        return fail(err, CE_EINVAL, vpath, "bad path pattern \"%s\" (%s): %s", q, ce_path_pattern_err_code(perr),
                    ce_path_pattern_err_hint(perr));
      }
      rc = add_text(p, norm, nlen);
    }
    if (rc != 0)
      return fail(err, rc, vpath, "%s", ce_strerror(rc));
  }
  *count = (uint16_t)(p->text_count - *first);
  return 0;
}

/* A version 2 entry object: {"host": ..., "methods": [...], "paths": [...]}
 * with at least one of methods and paths. Its members and host first, as
 * the Elixir side checks them. */
static int entry_host(const json_t *obj, const char *epath, const json_t **host, ce_policy_error_t *err) {
  static const char *const members[] = {"host", "methods", "paths"};
  int rc = check_members(obj, epath, members, sizeof(members) / sizeof(members[0]), err);
  if (rc != 0)
    return rc;
  *host = json_object_get(obj, "host");
  if (*host == NULL)
    return missing(err, epath, "host");
  if (json_object_get(obj, "methods") == NULL && json_object_get(obj, "paths") == NULL)
    return fail(err, CE_EINVAL, epath,
                "an entry object names \"methods\" or \"paths\"; write a plain host string otherwise");
  return 0;
}

/* Then its conditions, into the pattern just added. */
static int entry_conditions(ce_policy_t *p, const json_t *obj, const char *epath, policy_pattern_t *cond,
                            ce_policy_error_t *err) {
  const json_t *methods = json_object_get(obj, "methods");
  const json_t *paths = json_object_get(obj, "paths");
  int rc = 0;
  if (methods != NULL) {
    rc = load_conditions(p, methods, epath, "methods", CE_POLICY_MAX_METHODS, &cond->method_count,
                         &cond->method_first, err);
    if (rc != 0)
      return rc;
  }
  if (paths != NULL)
    rc = load_conditions(p, paths, epath, "paths", CE_POLICY_MAX_PATHS, &cond->path_count, &cond->path_first, err);
  return rc;
}

static int load_hosts(ce_policy_t *p, const json_t *hosts, const char *path, int version,
                      policy_rule_t *rule, ce_policy_error_t *err) {
  char hpath[PATH_MAX_LEN];
  format_into(hpath, sizeof(hpath), "%s.hosts", path);
  if (!json_is_array(hosts) || json_array_size(hosts) == 0)
    return fail(err, CE_EINVAL, hpath, "expected a non-empty array of strings");
  if (json_array_size(hosts) > CE_POLICY_MAX_HOSTS)
    return fail(err, CE_EINVAL, hpath, "more than %d patterns",
                CE_POLICY_MAX_HOSTS);

  rule->first = p->pattern_count;
  for (size_t j = 0; j < json_array_size(hosts); j++) {
    const json_t *h = json_array_get(hosts, j);
    char epath[PATH_MAX_LEN], hostpath[PATH_MAX_LEN];
    format_into(epath, sizeof(epath), "%s[%zu]", hpath, j);
    const json_t *entry = NULL;
    if (json_is_object(h) && version >= 2) {
      entry = h;
      int rc = entry_host(entry, epath, &h, err);
      if (rc != 0)
        return rc;
      format_into(hostpath, sizeof(hostpath), "%s.host", epath);
      if (!json_is_string(h))
        return fail(err, CE_EINVAL, hostpath, "expected a string");
    } else if (json_is_object(h)) {
      return fail(err, CE_EINVAL, epath, "an entry object (methods, paths) needs a version 2 document");
    } else if (!json_is_string(h)) {
      return fail(err, CE_EINVAL, epath, version >= 2 ? "expected a string or an entry object" : "expected a string");
    }

    const char *text = json_string_value(h);
    size_t len = json_string_length(h);
    ce_host_t norm;
    ce_pattern_err_t perr = CE_PATTERN_OK;
    const char *ppath = entry != NULL ? hostpath : epath;
    int rc = ce_pattern_normalize(text, len, &norm, &perr);
    if (rc == CE_ENOMEM)
      return fail(err, CE_ENOMEM, ppath, "%s", ce_strerror(CE_ENOMEM));
    if (rc != 0) {
      char q[CE_TEXT_QUOTE_MAX * 4 + 8];
      quote(q, sizeof(q), text, len);
      err->pattern_err = perr;
      return fail(err, CE_EINVAL, ppath, "bad pattern \"%s\" (%s): %s", q,
                  ce_pattern_err_code(perr), ce_pattern_err_hint(perr));
    }
    rc = add_pattern(p, &norm);
    if (rc != 0)
      return fail(err, rc, ppath, "%s", ce_strerror(rc));
    if (entry != NULL) {
      rc = entry_conditions(p, entry, epath, &p->patterns[p->pattern_count - 1], err);
      if (rc != 0)
        return rc;
    }
  }
  rule->count = p->pattern_count - rule->first;
  return 0;
}

static int load_rule(ce_policy_t *p, const json_t *obj, size_t i, int version,
                     ce_policy_error_t *err) {
  static const char *const members[] = {"index", "kind", "hosts",
                                        "timeout_ms", "cache"};
  char path[PATH_MAX_LEN], mpath[PATH_MAX_LEN];
  policy_rule_t *rule = &p->rules[i];
  int rc;

  format_into(path, sizeof(path), "$.rules[%zu]", i);
  if (!json_is_object(obj))
    return fail(err, CE_EINVAL, path, "expected an object");
  rc = check_members(obj, path, members, sizeof(members) / sizeof(members[0]), err);
  if (rc != 0)
    return rc;

  const json_t *index = json_object_get(obj, "index");
  format_into(mpath, sizeof(mpath), "%s.index", path);
  if (index == NULL)
    return missing(err, path, "index");
  if (!json_is_integer(index))
    return fail(err, CE_EINVAL, mpath, "expected an integer");
  if (json_integer_value(index) != (json_int_t)i)
    return fail(err, CE_EINVAL, mpath,
                "must equal the rule's position %zu, not %" JSON_INTEGER_FORMAT,
                i, json_integer_value(index));

  const json_t *kind = json_object_get(obj, "kind");
  const char *k = json_string_value(kind);
  format_into(mpath, sizeof(mpath), "%s.kind", path);
  if (kind == NULL)
    return missing(err, path, "kind");
  if (k != NULL && strcmp(k, "allow") == 0 && json_string_length(kind) == 5)
    rule->kind = CE_RULE_ALLOW;
  else if (k != NULL && strcmp(k, "deny") == 0 && json_string_length(kind) == 4)
    rule->kind = CE_RULE_DENY;
  else if (k != NULL && strcmp(k, "decide") == 0 && json_string_length(kind) == 6)
    rule->kind = CE_RULE_DECIDE;
  else
    return fail(err, CE_EINVAL, mpath, "expected \"allow\", \"deny\" or \"decide\"");

  const json_t *hosts = json_object_get(obj, "hosts");
  const json_t *timeout = json_object_get(obj, "timeout_ms");
  const json_t *cache = json_object_get(obj, "cache");

  if (rule->kind != CE_RULE_DECIDE) {
    if (timeout != NULL) {
      format_into(mpath, sizeof(mpath), "%s.timeout_ms", path);
      return fail(err, CE_EINVAL, mpath, "only a decide rule has this member");
    }
    if (cache != NULL) {
      format_into(mpath, sizeof(mpath), "%s.cache", path);
      return fail(err, CE_EINVAL, mpath, "only a decide rule has this member");
    }
    if (hosts == NULL)
      return missing(err, path, "hosts");
    return load_hosts(p, hosts, path, version, rule, err);
  }

  if (hosts != NULL) {
    format_into(mpath, sizeof(mpath), "%s.hosts", path);
    return fail(err, CE_EINVAL, mpath,
                "a decide rule matches every request and has no hosts");
  }
  if (timeout == NULL)
    return missing(err, path, "timeout_ms");
  format_into(mpath, sizeof(mpath), "%s.timeout_ms", path);
  if (!json_is_integer(timeout))
    return fail(err, CE_EINVAL, mpath, "expected an integer");
  json_int_t ms = json_integer_value(timeout);
  if (ms < CE_POLICY_TIMEOUT_MIN_MS || ms > CE_POLICY_TIMEOUT_MAX_MS)
    return fail(err, CE_EINVAL, mpath,
                "must be between %d and %d, not %" JSON_INTEGER_FORMAT,
                CE_POLICY_TIMEOUT_MIN_MS, CE_POLICY_TIMEOUT_MAX_MS, ms);
  rule->timeout_ms = (uint32_t)ms;
  if (cache == NULL)
    return missing(err, path, "cache");
  if (!json_is_boolean(cache)) {
    format_into(mpath, sizeof(mpath), "%s.cache", path);
    return fail(err, CE_EINVAL, mpath, "expected true or false");
  }
  rule->cache = json_is_true(cache);
  rule->first = p->pattern_count;
  rule->count = 0;
  return 0;
}

static int load_credentials(ce_policy_t *p, const json_t *list, ce_policy_error_t *err);

static int load_document(ce_policy_t *p, const json_t *root,
                         ce_policy_error_t *err) {
  static const char *const members[] = {"version", "default", "rules", "credentials"};
  int rc;

  if (!json_is_object(root))
    return fail(err, CE_EINVAL, "$", "expected an object");

  const json_t *version = json_object_get(root, "version");
  if (version == NULL)
    return missing(err, "$", "version");
  if (!json_is_integer(version))
    return fail(err, CE_EINVAL, "$.version", "expected an integer");
  json_int_t vnum = json_integer_value(version);
  if (vnum < CE_POLICY_VERSION_MIN || vnum > CE_POLICY_VERSION)
    return fail(err, CE_EVERSION, "$.version",
                "unsupported version %" JSON_INTEGER_FORMAT
                " (this build reads versions %d to %d)",
                vnum, CE_POLICY_VERSION_MIN, CE_POLICY_VERSION);

  rc = check_members(root, "$", members, sizeof(members) / sizeof(members[0]), err);
  if (rc != 0)
    return rc;

  const json_t *def = json_object_get(root, "default");
  const char *d = json_string_value(def);
  if (def == NULL)
    return missing(err, "$", "default");
  if (d != NULL && strcmp(d, "allow") == 0 && json_string_length(def) == 5)
    p->default_decision = CE_DECISION_ALLOW;
  else if (d != NULL && strcmp(d, "deny") == 0 && json_string_length(def) == 4)
    p->default_decision = CE_DECISION_DENY;
  else
    return fail(err, CE_EINVAL, "$.default", "expected \"allow\" or \"deny\"");

  const json_t *rules = json_object_get(root, "rules");
  if (rules == NULL)
    return missing(err, "$", "rules");
  if (!json_is_array(rules))
    return fail(err, CE_EINVAL, "$.rules", "expected an array");
  size_t n = json_array_size(rules);
  if (n > CE_POLICY_MAX_RULES)
    return fail(err, CE_EINVAL, "$.rules", "more than %d rules",
                CE_POLICY_MAX_RULES);
  if (n > 0) {
    p->rules = calloc(n, sizeof(policy_rule_t));
    if (p->rules == NULL)
      return fail(err, CE_ENOMEM, "$.rules", "%s", ce_strerror(CE_ENOMEM));
  }
  /* The first decide rule answers every request that reaches it: a rule
   * after it could never match, which is a mistake, not a policy. */
  size_t terminal = n;
  for (size_t i = 0; i < n; i++) {
    rc = load_rule(p, json_array_get(rules, i), i, (int)vnum, err);
    if (rc != 0)
      return rc;
    p->rule_count = i + 1;
    if (i > terminal) {
      char path[PATH_MAX_LEN];
      format_into(path, sizeof(path), "$.rules[%zu]", i);
      return fail(err, CE_EINVAL, path,
                  "unreachable: rule %zu (decide) before it answers every request "
                  "that reaches it, so this rule is never consulted; move it before "
                  "rule %zu, or remove it",
                  terminal, terminal);
    }
    if (terminal == n && p->rules[i].kind == CE_RULE_DECIDE)
      terminal = i;
  }
  const json_t *creds = json_object_get(root, "credentials");
  if (creds == NULL)
    return 0;
  if (vnum < 3)
    return fail(err, CE_EINVAL, "$.credentials", "credentials need a version 3 document");
  return load_credentials(p, creds, err);
}

/* One credential entry: {"host", "methods"?, "paths"?, "header", "secret"}
 * (docs/policy-json.md). Its host and conditions are loaded as an entry
 * object's are, into a pattern of no rule. */
static int load_credential(ce_policy_t *p, const json_t *obj, size_t i, ce_policy_error_t *err) {
  static const char *const members[] = {"host", "methods", "paths", "header", "secret"};
  char epath[PATH_MAX_LEN], mpath[PATH_MAX_LEN], q[CE_TEXT_QUOTE_MAX * 4 + 8];
  format_into(epath, sizeof(epath), "$.credentials[%zu]", i);
  if (!json_is_object(obj))
    return fail(err, CE_EINVAL, epath, "expected an object");
  int rc = check_members(obj, epath, members, sizeof(members) / sizeof(members[0]), err);
  if (rc != 0)
    return rc;
  const json_t *host = json_object_get(obj, "host");
  const json_t *header = json_object_get(obj, "header");
  const json_t *secret = json_object_get(obj, "secret");
  if (host == NULL)
    return missing(err, epath, "host");
  if (header == NULL)
    return missing(err, epath, "header");
  if (secret == NULL)
    return missing(err, epath, "secret");

  policy_cred_t *c = &p->creds[i];
  format_into(mpath, sizeof(mpath), "%s.header", epath);
  if (!json_is_string(header))
    return fail(err, CE_EINVAL, mpath, "expected a string");
  const char *why = ce_credential_header_check(json_string_value(header), json_string_length(header), c->header);
  if (why != NULL) {
    quote(q, sizeof(q), json_string_value(header), json_string_length(header));
    return fail(err, CE_EINVAL, mpath, "bad header \"%s\": %s", q, why);
  }
  format_into(mpath, sizeof(mpath), "%s.secret", epath);
  if (!json_is_string(secret))
    return fail(err, CE_EINVAL, mpath, "expected a string");
  if (!ce_credential_name_ok(json_string_value(secret), json_string_length(secret))) {
    quote(q, sizeof(q), json_string_value(secret), json_string_length(secret));
    return fail(err, CE_EINVAL, mpath, "bad secret name \"%s\": 1 to %d bytes of A-Z, a-z, 0-9, '.', '_' and '-'",
                q, CE_CRED_NAME_MAX);
  }
  memcpy(c->secret, json_string_value(secret), json_string_length(secret) + 1);

  format_into(mpath, sizeof(mpath), "%s.host", epath);
  if (!json_is_string(host))
    return fail(err, CE_EINVAL, mpath, "expected a string");
  ce_host_t norm;
  ce_pattern_err_t perr = CE_PATTERN_OK;
  rc = ce_pattern_normalize(json_string_value(host), json_string_length(host), &norm, &perr);
  if (rc == CE_ENOMEM)
    return fail(err, CE_ENOMEM, mpath, "%s", ce_strerror(CE_ENOMEM));
  if (rc != 0) {
    quote(q, sizeof(q), json_string_value(host), json_string_length(host));
    err->pattern_err = perr;
    return fail(err, CE_EINVAL, mpath, "bad pattern \"%s\" (%s): %s", q, ce_pattern_err_code(perr),
                ce_pattern_err_hint(perr));
  }
  rc = add_pattern(p, &norm);
  if (rc != 0)
    return fail(err, rc, mpath, "%s", ce_strerror(rc));
  c->pattern = p->pattern_count - 1;
  return entry_conditions(p, obj, epath, &p->patterns[c->pattern], err);
}

static int load_credentials(ce_policy_t *p, const json_t *list, ce_policy_error_t *err) {
  if (!json_is_array(list))
    return fail(err, CE_EINVAL, "$.credentials", "expected an array");
  size_t n = json_array_size(list);
  if (n > CE_POLICY_MAX_CREDENTIALS)
    return fail(err, CE_EINVAL, "$.credentials", "more than %d entries", CE_POLICY_MAX_CREDENTIALS);
  if (n == 0)
    return 0;
  p->creds = calloc(n, sizeof(policy_cred_t));
  if (p->creds == NULL)
    return fail(err, CE_ENOMEM, "$.credentials", "%s", ce_strerror(CE_ENOMEM));
  for (size_t i = 0; i < n; i++) {
    int rc = load_credential(p, json_array_get(list, i), i, err);
    if (rc != 0)
      return rc;
    p->cred_count = i + 1;
  }
  return 0;
}

/* ---- public: loading ------------------------------------------------------ */

int ce_policy_load_buffer(const char *buf, size_t len, ce_policy_t **out,
                          ce_policy_error_t *err) {
  ce_policy_error_t local;
  ce_policy_error_t *e = err != NULL ? err : &local;
  json_error_t jerr;
  int rc;

  memset(e, 0, sizeof(*e));
  if (len > CE_POLICY_MAX_BYTES)
    return fail(e, CE_ETOOBIG, NULL,
                "the document is larger than 4 MiB (%u bytes)",
                CE_POLICY_MAX_BYTES);

  /* RFC 8259 §4 leaves duplicate names to the implementation; two readers
   * could pick different values, so a duplicate is an error. */
  /* jansson may hide a failed allocation, even behind a successful parse
   * with a byte missing from a string (common/json.h). */
  ce_json_oom_reset();
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (ce_json_oom()) {
    json_decref(root);
    return fail(e, CE_ENOMEM, NULL, "%s", ce_strerror(CE_ENOMEM));
  }
  if (root == NULL) {
    /* jansson quotes the offending token raw, which may hold control
     * bytes or broken UTF-8; the message must stay one clean line. */
    char text[CE_TEXT_QUOTE_MAX * 4 + 8];
    ce_text_sanitize(text, sizeof(text), jerr.text, strlen(jerr.text), 0);
    return fail(e, CE_EPARSE, NULL, "invalid JSON at line %d, column %d: %s",
                jerr.line, jerr.column, text);
  }

  ce_policy_t *p = calloc(1, sizeof(*p));
  if (p == NULL) {
    rc = fail(e, CE_ENOMEM, NULL, "%s", ce_strerror(CE_ENOMEM));
    goto fail_policy;
  }
  rc = load_document(p, root, e);
  if (rc != 0)
    goto fail_load;

  json_decref(root);
  *out = p;
  return 0;

fail_load:
  ce_policy_free(p);
fail_policy:
  json_decref(root);
  return rc;
}

/* Reads at most CE_POLICY_MAX_BYTES + 1 bytes so an over-size file is
 * noticed without reading all of it. */
static int read_file(const char *path, char **out, size_t *out_len,
                     ce_policy_error_t *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int saved = errno;
    return fail(err, saved == ENOENT ? CE_ENOENT : CE_EIO, NULL,
                "cannot open: %s", strerror(saved));
  }

  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len == cap) {
      size_t ncap = cap == 0 ? READ_CHUNK : cap * 2;
      if (ncap > CE_POLICY_MAX_BYTES + 1)
        ncap = CE_POLICY_MAX_BYTES + 1;
      if (ncap == cap) {
        rc = fail(err, CE_ETOOBIG, NULL,
                  "the document is larger than 4 MiB (%u bytes)",
                  CE_POLICY_MAX_BYTES);
        goto fail_read;
      }
      char *nbuf = realloc(buf, ncap);
      if (nbuf == NULL) {
        rc = fail(err, CE_ENOMEM, NULL, "%s", ce_strerror(CE_ENOMEM));
        goto fail_read;
      }
      buf = nbuf;
      cap = ncap;
    }
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      rc = fail(err, CE_EIO, NULL, "cannot read: %s", strerror(errno));
      goto fail_read;
    }
    if (got == 0)
      break;
    len += (size_t)got;
  }
  close(fd);
  *out = buf;
  *out_len = len;
  return 0;

fail_read:
  free(buf);
  close(fd);
  return rc;
}

int ce_policy_load_file(const char *path, ce_policy_t **out,
                        ce_policy_error_t *err) {
  ce_policy_error_t local;
  ce_policy_error_t *e = err != NULL ? err : &local;
  char *buf = NULL;
  size_t len = 0;

  memset(e, 0, sizeof(*e));
  int rc = read_file(path, &buf, &len, e);
  if (rc != 0)
    return rc;
  rc = ce_policy_load_buffer(buf, len, out, e);
  free(buf);
  return rc;
}

void ce_policy_free(ce_policy_t *policy) {
  if (policy == NULL)
    return;
  free(policy->arena);
  free(policy->texts);
  free(policy->patterns);
  free(policy->rules);
  free(policy->creds);
  free(policy);
}

/* ---- public: evaluation --------------------------------------------------- */

static bool pattern_matches(const ce_policy_t *p, const policy_pattern_t *pat,
                            const ce_host_t *h) {
  if (pat->kind != (uint8_t)h->kind)
    return false; /* IP literals match IP patterns of their family only */
  switch (h->kind) {
  case CE_HOST_IPV4:
    return memcmp(pat->addr, h->addr, 4) == 0;
  case CE_HOST_IPV6:
    return memcmp(pat->addr, h->addr, 16) == 0;
  case CE_HOST_NAME:
  default: {
    const char *text = p->arena + pat->text_off;
    if (pat->wildcard)
      return ce_glob_match(text, pat->len, h->text, h->len);
    return pat->len == h->len && memcmp(text, h->text, h->len) == 0;
  }
  }
}

static void set_invalid(ce_verdict_t *out, ce_reason_t reason) {
  out->decision = CE_DECISION_DENY;
  out->reason = reason;
  out->rule_index = -1;
  out->rule_kind = CE_RULE_DENY;
  out->host_valid = false;
  out->host.kind = CE_HOST_NAME;
  out->host.len = 0;
  out->host.text[0] = '\0';
}

/* What a request brings besides its host (docs/path-matching.md). */
typedef struct {
  bool host_only;     /* ce_policy_eval_host(): the most any request could get */
  const char *method; /* NULL: not known */
  size_t method_len;
  const char *target; /* NULL: not known */
  size_t target_len;
  int path_state; /* 0 not normalised yet, 1 done, -1 refused */
  size_t path_len;
  char path[CE_PATH_MAX + 1];
} request_t;

typedef enum { ENTRY_NO, ENTRY_YES, ENTRY_HOST_ONLY, ENTRY_INVALID_PATH } entry_match_t;

static bool text_in(const ce_policy_t *p, size_t first, size_t count, const char *s, size_t n) {
  for (size_t k = 0; k < count; k++) {
    const policy_text_t *t = &p->texts[first + k];
    if (t->len == n && memcmp(p->arena + t->off, s, n) == 0)
      return true;
  }
  return false;
}

static bool path_in(const ce_policy_t *p, const policy_pattern_t *pat, const request_t *rq) {
  for (size_t k = 0; k < pat->path_count; k++) {
    const policy_text_t *t = &p->texts[pat->path_first + k];
    if (ce_path_match(p->arena + t->off, t->len, rq->path, rq->path_len))
      return true;
  }
  return false;
}

/* A method condition is checked before the path: an entry for other
 * methods does not apply, whatever the path. A path that cannot be
 * normalised never matches a path condition and never slips past one: the
 * caller denies it. */
static entry_match_t entry_matches(const ce_policy_t *p, const policy_pattern_t *pat, const ce_host_t *h,
                                   request_t *rq) {
  if (!pattern_matches(p, pat, h))
    return ENTRY_NO;
  if (pat->method_count == 0 && pat->path_count == 0)
    return ENTRY_YES;
  if (rq->host_only)
    return ENTRY_HOST_ONLY;
  if (pat->method_count > 0 &&
      (rq->method == NULL || !text_in(p, pat->method_first, pat->method_count, rq->method, rq->method_len)))
    return ENTRY_NO;
  if (pat->path_count == 0)
    return ENTRY_YES;
  if (rq->target == NULL)
    return ENTRY_NO;
  if (rq->path_state == 0)
    rq->path_state =
        ce_path_normalize(rq->target, rq->target_len, rq->path, sizeof(rq->path), &rq->path_len) == 0 ? 1 : -1;
  if (rq->path_state < 0)
    return ENTRY_INVALID_PATH;
  return path_in(p, pat, rq) ? ENTRY_YES : ENTRY_NO;
}

static void set_rule(ce_verdict_t *out, size_t i, ce_rule_kind_t kind, ce_decision_t d, ce_reason_t reason) {
  out->rule_index = (int32_t)i;
  out->rule_kind = kind;
  out->decision = d;
  out->reason = reason;
}

/* docs/host-matching.md §5 steps 2 and 3 on an already valid host, with
 * the conditions of docs/path-matching.md §4: an entry whose host matches
 * but whose methods or paths do not lets the request fall through. */
static void decide(const ce_policy_t *p, request_t *rq, ce_verdict_t *out) {
  for (size_t i = 0; i < p->rule_count; i++) {
    const policy_rule_t *r = &p->rules[i];
    bool hit = r->kind == CE_RULE_DECIDE, bad_path = false;
    for (size_t j = 0; j < r->count && !hit; j++) {
      entry_match_t m = entry_matches(p, &p->patterns[r->first + j], &out->host, rq);
      /* Host only: a conditional allow may allow some request; a
       * conditional deny refuses only some, so the walk goes on. */
      hit = m == ENTRY_YES || (m == ENTRY_HOST_ONLY && r->kind == CE_RULE_ALLOW);
      bad_path = bad_path || m == ENTRY_INVALID_PATH;
    }
    if (!hit && bad_path) {
      set_rule(out, i, r->kind, CE_DECISION_DENY, CE_REASON_INVALID_PATH);
      return;
    }
    if (!hit)
      continue;
    switch (r->kind) {
    case CE_RULE_ALLOW:
      set_rule(out, i, r->kind, CE_DECISION_ALLOW, CE_REASON_NONE);
      break;
    case CE_RULE_DENY:
      set_rule(out, i, r->kind, CE_DECISION_DENY, CE_REASON_DENIED_BY_RULE);
      break;
    case CE_RULE_DECIDE:
    default:
      set_rule(out, i, r->kind, CE_DECISION_DECIDE, CE_REASON_NONE);
      break;
    }
    return;
  }
  out->rule_index = -1;
  out->rule_kind = CE_RULE_DENY;
  out->decision = p->default_decision;
  out->reason = p->default_decision == CE_DECISION_ALLOW ? CE_REASON_NONE
                                                         : CE_REASON_DEFAULT_DENY;
}

static int eval(const ce_policy_t *policy, const char *host, size_t len, request_t *rq, ce_verdict_t *out) {
  int rc = ce_host_normalize(host, len, &out->host);
  if (rc != 0) {
    set_invalid(out, CE_REASON_INVALID_HOST);
    return rc == CE_ENOMEM ? CE_ENOMEM : 0;
  }
  out->host_valid = true;
  decide(policy, rq, out);
  return 0;
}

int ce_policy_eval_host(const ce_policy_t *policy, const char *host,
                        size_t len, ce_verdict_t *out) {
  request_t rq = {.host_only = true};
  return eval(policy, host, len, &rq, out);
}

int ce_policy_eval_request(const ce_policy_t *policy, const char *host, size_t len, const char *method,
                           size_t method_len, const char *target, size_t target_len, ce_verdict_t *out) {
  request_t rq = {.method = method, .method_len = method_len, .target = target, .target_len = target_len};
  return eval(policy, host, len, &rq, out);
}

int ce_policy_eval_input(const ce_policy_t *policy, const char *input, size_t len, const char *method,
                         size_t method_len, ce_verdict_t *out) {
  ce_url_t url;
  if (ce_url_split(input, len, &url) != 0) {
    set_invalid(out, CE_REASON_INVALID_URL);
    return 0;
  }
  /* A URL whose scheme and authority are acceptable but whose host is not
   * reports invalid_host: the host, not the URL syntax, is at fault. A
   * bare host has no path: path conditions do not match it. */
  return ce_policy_eval_request(policy, url.host, url.host_len, method, method_len, url.path, url.path_len, out);
}

int ce_policy_eval_input_credentials(const ce_policy_t *policy, const char *input, size_t len, const char *method,
                                     size_t method_len, ce_decision_t decision, size_t *idx, size_t cap) {
  ce_url_t url;
  if (decision == CE_DECISION_DENY || ce_url_split(input, len, &url) != 0 || url.plain)
    return 0;
  return ce_policy_credentials_match(policy, url.host, url.host_len, method, method_len, url.path, url.path_len, idx,
                                     cap);
}

ce_decision_t ce_policy_could_allow(const ce_policy_t *policy, const char *name, size_t len, ce_verdict_t *out) {
  /* A DNS name never carries a port: "host:53" is not a name. */
  if (memchr(name, ':', len) != NULL || memchr(name, '[', len) != NULL) {
    set_invalid(out, CE_REASON_INVALID_HOST);
    return CE_DECISION_DENY;
  }
  if (ce_policy_eval_host(policy, name, len, out) != 0)
    return CE_DECISION_DENY;
  if (out->host_valid && out->host.kind != CE_HOST_NAME) {
    set_invalid(out, CE_REASON_INVALID_HOST);
    return CE_DECISION_DENY;
  }
  return out->decision;
}

size_t ce_policy_credential_count(const ce_policy_t *policy) {
  return policy->cred_count;
}

int ce_policy_credential(const ce_policy_t *policy, size_t index, ce_credential_info_t *out) {
  if (index >= policy->cred_count)
    return CE_EINVAL;
  out->header = policy->creds[index].header;
  out->secret = policy->creds[index].secret;
  return 0;
}

int ce_policy_credentials_match(const ce_policy_t *policy, const char *host, size_t len, const char *method,
                                size_t method_len, const char *target, size_t target_len, size_t *idx, size_t cap) {
  if (policy->cred_count == 0)
    return 0;
  ce_host_t h;
  int rc = ce_host_normalize(host, len, &h);
  if (rc != 0)
    return rc == CE_ENOMEM ? CE_ENOMEM : 0;
  request_t rq = {.method = method, .method_len = method_len, .target = target, .target_len = target_len};
  size_t k = 0;
  for (size_t i = 0; i < policy->cred_count && k < cap; i++) {
    const policy_cred_t *c = &policy->creds[i];
    if (entry_matches(policy, &policy->patterns[c->pattern], &h, &rq) != ENTRY_YES)
      continue;
    bool taken = false;
    for (size_t j = 0; j < k && !taken; j++)
      taken = strcmp(policy->creds[idx[j]].header, c->header) == 0;
    if (!taken)
      idx[k++] = i;
  }
  return (int)k;
}

ce_decision_t ce_policy_default(const ce_policy_t *policy) {
  return policy->default_decision;
}

size_t ce_policy_rule_count(const ce_policy_t *policy) {
  return policy->rule_count;
}

int ce_policy_rule(const ce_policy_t *policy, size_t index,
                   ce_rule_info_t *out) {
  if (index >= policy->rule_count)
    return CE_EINVAL;
  const policy_rule_t *r = &policy->rules[index];
  out->kind = r->kind;
  out->host_count = r->count;
  out->timeout_ms = r->timeout_ms;
  out->cache = r->cache;
  return 0;
}

const char *ce_decision_name(ce_decision_t decision) {
  switch (decision) {
  case CE_DECISION_ALLOW:
    return "allow";
  case CE_DECISION_DENY:
    return "deny";
  case CE_DECISION_DECIDE:
    return "decide";
  default:
    return "unknown";
  }
}

const char *ce_rule_kind_name(ce_rule_kind_t kind) {
  switch (kind) {
  case CE_RULE_ALLOW:
    return "allow";
  case CE_RULE_DENY:
    return "deny";
  case CE_RULE_DECIDE:
    return "decide";
  default:
    return "unknown";
  }
}

const char *ce_reason_name(ce_reason_t reason) {
  switch (reason) {
  case CE_REASON_NONE:
    return NULL;
  case CE_REASON_DENIED_BY_RULE:
    return "denied_by_rule";
  case CE_REASON_DEFAULT_DENY:
    return "default_deny";
  case CE_REASON_INVALID_HOST:
    return "invalid_host";
  case CE_REASON_INVALID_URL:
    return "invalid_url";
  case CE_REASON_INVALID_PATH:
    return "invalid_path";
  default:
    return "unknown";
  }
}
