/*
 * Credential injection (see credential.h): the validators shared by the
 * policy loader and the secrets file, the secrets store, and the one call
 * the request pipeline makes.
 */
#include "policy/credential.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/error.h"
#include "common/json.h"
#include "common/text.h"
#include "http1/writer.h"

typedef struct {
  char name[CE_CRED_NAME_MAX + 1];
  char *value; /* owned; wiped before it is freed */
  size_t len;
} secret_t;

struct ce_secrets {
  secret_t items[CE_CRED_MAX_ENTRIES];
  size_t count;
};

/* ---- validators ------------------------------------------------------------ */

bool ce_credential_name_ok(const char *name, size_t n) {
  if (n == 0 || n > CE_CRED_NAME_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  }
  return true;
}

/* RFC 9110 §5.6.2 tchar. */
static bool tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Fields the proxy writes or removes itself: routing (Host), framing
 * (RFC 9112 §6), the connection-specific ones (RFC 9110 §7.6.1, RFC 9113
 * §8.2.2) and Proxy-Authorization, which never reaches an origin. A
 * credential in one of them would be dropped or would change how the
 * message is read. */
static const char *const owned_fields[] = {
    "host",       "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te",       "trailer",           "upgrade",    "proxy-authorization",
};

const char *ce_credential_header_check(const char *name, size_t n, char *out) {
  if (n == 0 || n > CE_CRED_HEADER_MAX)
    return "a header name is 1 to 64 bytes";
  for (size_t i = 0; i < n; i++) {
    if (!tchar((unsigned char)name[i]))
      return "a header name is a token (RFC 9110 5.6.2): letters, digits and !#$%&'*+-.^_`|~";
    char c = name[i];
    out[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
  }
  out[n] = '\0';
  for (size_t i = 0; i < sizeof(owned_fields) / sizeof(owned_fields[0]); i++)
    if (strcmp(out, owned_fields[i]) == 0)
      return "the proxy owns this field (routing, framing or connection): a credential cannot be sent in it";
  return NULL;
}

const char *ce_credential_value_check(const char *value, size_t n) {
  if (n == 0)
    return "empty";
  if (n > CE_CRED_VALUE_MAX)
    return "longer than 8192 bytes";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)value[i];
    if (!(c == ' ' || c == '\t' || (c >= 0x21 && c <= 0x7e) || c >= 0x80))
      return "a control character (CR, LF, NUL, ...) cannot be part of a header value";
  }
  if (value[0] == ' ' || value[0] == '\t' || value[n - 1] == ' ' || value[n - 1] == '\t')
    return "a header value does not start or end with a space or a tab";
  return NULL;
}

/* ---- the store ------------------------------------------------------------- */

static void wipe_free(char *p, size_t n) {
  if (p == NULL)
    return;
  explicit_bzero(p, n);
  free(p);
}

void ce_secrets_free(ce_secrets_t *secrets) {
  if (secrets == NULL)
    return;
  for (size_t i = 0; i < secrets->count; i++)
    wipe_free(secrets->items[i].value, secrets->items[i].len);
  explicit_bzero(secrets, sizeof(*secrets));
  free(secrets);
}

static secret_t *find(const ce_secrets_t *s, const char *name, size_t n) {
  for (size_t i = 0; i < s->count; i++)
    if (strlen(s->items[i].name) == n && memcmp(s->items[i].name, name, n) == 0)
      return (secret_t *)&s->items[i];
  return NULL;
}

int ce_secrets_set(ce_secrets_t *secrets, const char *name, size_t name_len, const char *value,
                   size_t value_len) {
  if (!ce_credential_name_ok(name, name_len) || ce_credential_value_check(value, value_len) != NULL)
    return CE_EINVAL;
  secret_t *s = find(secrets, name, name_len);
  if (s == NULL && secrets->count == CE_CRED_MAX_ENTRIES)
    return CE_ETOOBIG;
  char *copy = malloc(value_len);
  if (copy == NULL)
    return CE_ENOMEM;
  memcpy(copy, value, value_len);
  if (s == NULL) {
    s = &secrets->items[secrets->count++];
    memcpy(s->name, name, name_len);
    s->name[name_len] = '\0';
  } else {
    wipe_free(s->value, s->len);
  }
  s->value = copy;
  s->len = value_len;
  return 0;
}

const char *ce_secrets_get(const ce_secrets_t *secrets, const char *name, size_t name_len, size_t *len) {
  const secret_t *s = secrets != NULL ? find(secrets, name, name_len) : NULL;
  if (s == NULL)
    return NULL;
  *len = s->len;
  return s->value;
}

static int fail(char *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, int code, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, CE_SECRETS_ERROR_MAX, fmt, ap);
    va_end(ap);
  }
  return code;
}

static int load_members(ce_secrets_t *s, const json_t *root, char *err) {
  if (!json_is_object(root))
    return fail(err, CE_EINVAL, "$: expected an object");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)root, key, val) {
    if (strcmp(key, "version") != 0 && strcmp(key, "secrets") != 0) {
      char q[CE_TEXT_QUOTE_MAX * 4 + 8];
      ce_text_sanitize(q, sizeof(q), key, strlen(key), 1);
      return fail(err, CE_EINVAL, "$[\"%s\"]: unknown member", q);
    }
  }
  const json_t *version = json_object_get(root, "version");
  if (version == NULL)
    return fail(err, CE_EINVAL, "$: missing member \"version\"");
  if (!json_is_integer(version))
    return fail(err, CE_EINVAL, "$.version: expected an integer");
  if (json_integer_value(version) != 1)
    return fail(err, CE_EVERSION, "$.version: unsupported version %" JSON_INTEGER_FORMAT " (this build reads 1)",
                json_integer_value(version));
  const json_t *secrets = json_object_get(root, "secrets");
  if (secrets == NULL)
    return fail(err, CE_EINVAL, "$: missing member \"secrets\"");
  if (!json_is_object(secrets))
    return fail(err, CE_EINVAL, "$.secrets: expected an object");
  if (json_object_size(secrets) > CE_CRED_MAX_ENTRIES)
    return fail(err, CE_EINVAL, "$.secrets: more than %d secrets", CE_CRED_MAX_ENTRIES);
  json_object_foreach((json_t *)secrets, key, val) {
    char q[CE_TEXT_QUOTE_MAX * 4 + 8];
    size_t kl = strlen(key);
    ce_text_sanitize(q, sizeof(q), key, kl, 1);
    if (!ce_credential_name_ok(key, kl))
      return fail(err, CE_EINVAL, "$.secrets[\"%s\"]: bad secret name: 1 to %d bytes of A-Z, a-z, 0-9, '.', '_' and '-'",
                  q, CE_CRED_NAME_MAX);
    if (!json_is_string(val))
      return fail(err, CE_EINVAL, "$.secrets.%s: expected a string", q);
    const char *why = ce_credential_value_check(json_string_value(val), json_string_length(val));
    if (why != NULL)
      return fail(err, CE_EINVAL, "$.secrets.%s: bad value (not shown): %s", q, why);
    int rc = ce_secrets_set(s, key, kl, json_string_value(val), json_string_length(val));
    if (rc != 0)
      return fail(err, rc, "$.secrets.%s: %s", q, ce_strerror(rc));
  }
  return 0;
}

/* jansson keeps the decoded strings in memory it frees without wiping;
 * the text is the caller's. A JSON document of secrets is small, and the
 * sidecar reads it once at start, so this is the one copy left behind. */
int ce_secrets_load_buffer(const char *buf, size_t len, ce_secrets_t **out, char *err) {
  if (err != NULL)
    err[0] = '\0';
  if (len > CE_SECRETS_MAX_BYTES)
    return fail(err, CE_ETOOBIG, "the secrets file is larger than 1 MiB");
  json_error_t jerr;
  ce_json_oom_reset();
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (ce_json_oom()) {
    json_decref(root);
    return fail(err, CE_ENOMEM, "%s", ce_strerror(CE_ENOMEM));
  }
  /* jansson's message may quote the text, which holds secrets: only the
   * position is reported. */
  if (root == NULL)
    return fail(err, CE_EPARSE, "invalid JSON at line %d, column %d", jerr.line, jerr.column);
  ce_secrets_t *s = calloc(1, sizeof(*s));
  int rc = s == NULL ? fail(err, CE_ENOMEM, "%s", ce_strerror(CE_ENOMEM)) : load_members(s, root, err);
  json_decref(root);
  if (rc != 0) {
    ce_secrets_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

int ce_secrets_load_file(const char *path, ce_secrets_t **out, char *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int saved = errno;
    return fail(err, saved == ENOENT ? CE_ENOENT : CE_EIO, "cannot open: %s", strerror(saved));
  }
  char *buf = malloc(CE_SECRETS_MAX_BYTES + 1);
  if (buf == NULL) {
    close(fd);
    return fail(err, CE_ENOMEM, "%s", ce_strerror(CE_ENOMEM));
  }
  size_t len = 0;
  int rc = 0;
  while (len < CE_SECRETS_MAX_BYTES + 1) {
    ssize_t got = read(fd, buf + len, CE_SECRETS_MAX_BYTES + 1 - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      rc = fail(err, CE_EIO, "cannot read: %s", strerror(errno));
      break;
    }
    if (got == 0)
      break;
    len += (size_t)got;
  }
  close(fd);
  if (rc == 0)
    rc = ce_secrets_load_buffer(buf, len, out, err);
  wipe_free(buf, CE_SECRETS_MAX_BYTES + 1);
  return rc;
}

int ce_secrets_check(const ce_secrets_t *secrets, const ce_policy_t *policy, char *err) {
  for (size_t i = 0; i < ce_policy_credential_count(policy); i++) {
    ce_credential_info_t info;
    size_t len;
    ce_policy_credential(policy, i, &info);
    if (ce_secrets_get(secrets, info.secret, strlen(info.secret), &len) == NULL)
      return fail(err, CE_EINVAL, "credential %zu (header %s) names the secret \"%s\", which has no value", i,
                  info.header, info.secret);
  }
  return 0;
}

int ce_credential_redact_names(const ce_policy_t *policy, const char **names, size_t *count, size_t cap,
                               bool (*is_known)(const char *name, size_t len, const void *arg), const void *arg) {
  for (size_t i = 0; i < ce_policy_credential_count(policy); i++) {
    ce_credential_info_t info;
    ce_policy_credential(policy, i, &info);
    size_t len = strlen(info.header);
    bool known = is_known != NULL && is_known(info.header, len, arg);
    for (size_t j = 0; j < *count && !known; j++)
      known = strcasecmp(names[j], info.header) == 0;
    if (known)
      continue;
    if (*count == cap)
      return CE_ETOOBIG;
    names[(*count)++] = info.header;
  }
  return 0;
}

/* ---- the pipeline ------------------------------------------------------------ */

/* Removes every field named name (any case) from f[0..*n), keeping the
 * order of the others. */
static void remove_named(ce_h1_field_t *f, size_t *n, const char *name, size_t len) {
  size_t k = 0;
  for (size_t i = 0; i < *n; i++) {
    if (f[i].name_len == len && strncasecmp(f[i].name, name, len) == 0)
      continue;
    f[k++] = f[i];
  }
  *n = k;
}

/*
 * A Connection field names the fields of the hop it came on (RFC 9110
 * §7.6.1): the workspace's, never one the proxy adds. The writers drop
 * every field a Connection option names, so "Connection: authorization"
 * would take the credential away with the workspace's own copy. When a
 * Connection field of the block names one of the k credentials at its
 * end, the workspace's hop-by-hop fields are dropped here, as the writers
 * would drop them (Upgrade and Host aside, which the writers handle
 * themselves), and so are the Connection fields themselves, which never go
 * upstream: the origin gets the same fields, with the credential. A block
 * longer than the writers' bound of fields is refused.
 */
static int keep_from_connection(ce_h1_field_t *f, size_t *n, size_t k) {
  bool any = false;
  for (size_t i = 0; i < *n && !any; i++)
    any = f[i].name_len == 10 && strncasecmp(f[i].name, "connection", 10) == 0;
  if (!any)
    return (int)k;
  if (*n > CE_H1_MAX_FIELDS)
    return CE_ETOOBIG;
  bool named[CE_H1_MAX_FIELDS];
  ce_h1_fields_connection_named(f, *n, named);
  bool hit = false;
  for (size_t i = *n - k; i < *n; i++)
    hit = hit || named[i];
  if (!hit)
    return (int)k;
  size_t out = 0;
  for (size_t i = 0; i < *n; i++) {
    bool credential = i >= *n - k;
    bool connection = f[i].name_len == 10 && strncasecmp(f[i].name, "connection", 10) == 0;
    bool own = (f[i].name_len == 7 && strncasecmp(f[i].name, "upgrade", 7) == 0) ||
               (f[i].name_len == 4 && strncasecmp(f[i].name, "host", 4) == 0);
    if (credential || (!connection && (!named[i] || own)))
      f[out++] = f[i];
  }
  *n = out;
  return (int)k;
}

int ce_credential_apply(const ce_policy_t *policy, const ce_secrets_t *secrets, const ce_credential_request_t *rq,
                        ce_h1_field_t *f, size_t *n, size_t cap) {
  if (!rq->tls || ce_policy_credential_count(policy) == 0)
    return 0;
  size_t idx[CE_POLICY_MAX_CREDENTIALS];
  int k = ce_policy_credentials_match(policy, rq->host, rq->host_len, rq->method, rq->method_len, rq->target,
                                      rq->target_len, idx, CE_POLICY_MAX_CREDENTIALS);
  if (k < 0)
    return k;
  for (int i = 0; i < k; i++) {
    ce_credential_info_t info;
    ce_policy_credential(policy, idx[i], &info);
    size_t vlen = 0;
    const char *value = ce_secrets_get(secrets, info.secret, strlen(info.secret), &vlen);
    size_t hlen = strlen(info.header);
    remove_named(f, n, info.header, hlen);
    /* The proxy checked at start that every secret has a value, and
     * rotation never removes one; a missing one is still never a request
     * sent as if it had no credential. */
    if (value == NULL)
      return CE_EINVAL;
    if (*n >= cap)
      return CE_ETOOBIG;
    f[*n] = (ce_h1_field_t){.name = info.header, .name_len = hlen, .value = value, .value_len = vlen};
    (*n)++;
  }
  return k > 0 ? keep_from_connection(f, n, (size_t)k) : 0;
}
