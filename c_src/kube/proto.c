/* The pure protocol helpers (proto.h). */
#include "kube/proto.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kube/config.h"

bool ce_kube_frame_split(const uint8_t *msg, size_t len, unsigned *chan,
                         const uint8_t **data, size_t *dlen) {
  if (len == 0)
    return false;
  *chan = msg[0];
  *data = msg + 1;
  *dlen = len - 1;
  return true;
}

int ce_kube_prefix_feed(ce_kube_prefix_t *p, uint16_t port, const uint8_t *data, size_t len,
                        size_t *skip) {
  *skip = 0;
  while (p->have < 2 && *skip < len)
    p->bytes[p->have++] = data[(*skip)++];
  if (p->have == 2 && (uint16_t)(p->bytes[0] | p->bytes[1] << 8) != port)
    return -1;
  return 0;
}

/* A decimal integer that ends s after "exit status ". */
static bool trailing_exit_status(const char *msg, int *code) {
  static const char key[] = "exit status ";
  const char *hit = NULL;
  for (const char *q = strstr(msg, key); q != NULL; q = strstr(q + 1, key))
    hit = q;
  if (hit == NULL)
    return false;
  const char *d = hit + sizeof(key) - 1;
  bool neg = *d == '-';
  if (neg)
    d++;
  if (!isdigit((unsigned char)*d))
    return false;
  long v = 0;
  for (; isdigit((unsigned char)*d); d++) {
    v = v * 10 + (*d - '0');
    if (v > 1000000)
      return false;
  }
  if (*d != '\0')
    return false;
  *code = (int)(neg ? -v : v);
  return true;
}

bool ce_kube_exit_code(const json_t *status, int *code) {
  if (!json_is_object(status))
    return false;
  const char *st = json_string_value(json_object_get(status, "status"));
  if (st != NULL && strcmp(st, "Success") == 0) {
    *code = 0;
    return true;
  }
  const char *reason = json_string_value(json_object_get(status, "reason"));
  if (reason != NULL && strcmp(reason, "NonZeroExitCode") == 0) {
    json_t *causes = json_object_get(json_object_get(status, "details"), "causes");
    size_t k;
    json_t *c;
    json_array_foreach(causes, k, c) {
      const char *r = json_string_value(json_object_get(c, "reason"));
      const char *m = json_string_value(json_object_get(c, "message"));
      if (r == NULL || m == NULL || strcmp(r, "ExitCode") != 0)
        continue;
      char *end = NULL;
      long v = strtol(m, &end, 10);
      if (end != m && *end == '\0' && v >= -1000000 && v <= 1000000) {
        *code = (int)v;
        return true;
      }
    }
  }
  const char *msg = json_string_value(json_object_get(status, "message"));
  return msg != NULL && trailing_exit_status(msg, code);
}

void ce_kube_cred_free(ce_kube_cred_t *c) {
  if (c->token != NULL)
    OPENSSL_clear_free(c->token, strlen(c->token));
  free(c->cert_pem);
  if (c->key_pem != NULL)
    OPENSSL_clear_free(c->key_pem, c->key_len);
  memset(c, 0, sizeof(*c));
}

static int two(const char *s) {
  if (!isdigit((unsigned char)s[0]) || !isdigit((unsigned char)s[1]))
    return -1;
  return (s[0] - '0') * 10 + (s[1] - '0');
}

bool ce_kube_rfc3339(const char *s, time_t *out) {
  /* YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM) */
  if (strlen(s) < 20)
    return false;
  for (int k = 0; k < 4; k++)
    if (!isdigit((unsigned char)s[k]))
      return false;
  int year = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
  int mon = two(s + 5), day = two(s + 8), hh = two(s + 11), mm = two(s + 14),
      ss = two(s + 17);
  if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' ||
      s[16] != ':' || mon < 1 || mon > 12 || day < 1 || day > 31 || hh < 0 || hh > 23 ||
      mm < 0 || mm > 59 || ss < 0 || ss > 60)
    return false;
  const char *q = s + 19;
  if (*q == '.') {
    q++;
    if (!isdigit((unsigned char)*q))
      return false;
    while (isdigit((unsigned char)*q))
      q++;
  }
  long off = 0;
  if (*q == 'Z' || *q == 'z') {
    q++;
  } else if (*q == '+' || *q == '-') {
    if (strlen(q) != 6 || q[3] != ':')
      return false;
    int oh = two(q + 1), om = two(q + 4);
    if (oh < 0 || oh > 23 || om < 0 || om > 59)
      return false;
    off = (oh * 3600L + om * 60L) * (*q == '+' ? 1 : -1);
    q += 6;
  } else {
    return false;
  }
  if (*q != '\0')
    return false;
  struct tm tm = {.tm_year = year - 1900, .tm_mon = mon - 1, .tm_mday = day,
                  .tm_hour = hh, .tm_min = mm, .tm_sec = ss};
  time_t t = timegm(&tm);
  if (t == (time_t)-1)
    return false;
  *out = t - off;
  return true;
}

static int cfail(char *err, size_t errlen, const char *msg) {
  snprintf(err, errlen, "exec plugin: %s", msg);
  return CE_EINVAL;
}

int ce_kube_cred_parse(const char *json, size_t len, const char *api_version,
                       ce_kube_cred_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  json_error_t je;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL) {
    snprintf(err, errlen, "exec plugin: the output is not JSON (%s)", je.text);
    return CE_EINVAL;
  }
  int rc = CE_OK;
  const char *kind = json_string_value(json_object_get(root, "kind"));
  const char *av = json_string_value(json_object_get(root, "apiVersion"));
  json_t *status = json_object_get(root, "status");
  if (!json_is_object(root) || kind == NULL || strcmp(kind, "ExecCredential") != 0) {
    rc = cfail(err, errlen, "the output is not an ExecCredential");
    goto done;
  }
  if (av == NULL || strcmp(av, api_version) != 0) {
    snprintf(err, errlen, "exec plugin: apiVersion is not %s", api_version);
    rc = CE_EINVAL;
    goto done;
  }
  if (!json_is_object(status)) {
    rc = cfail(err, errlen, "the ExecCredential has no status");
    goto done;
  }
  json_t *tok = json_object_get(status, "token");
  json_t *cert = json_object_get(status, "clientCertificateData");
  json_t *key = json_object_get(status, "clientKeyData");
  json_t *exp = json_object_get(status, "expirationTimestamp");
  if ((tok != NULL && !json_is_string(tok)) || (cert != NULL && !json_is_string(cert)) ||
      (key != NULL && !json_is_string(key)) ||
      (exp != NULL && !json_is_null(exp) && !json_is_string(exp))) {
    rc = cfail(err, errlen, "status fields must be strings");
    goto done;
  }
  if ((cert == NULL) != (key == NULL)) {
    rc = cfail(err, errlen, "clientCertificateData and clientKeyData go together");
    goto done;
  }
  if (tok == NULL && cert == NULL) {
    rc = cfail(err, errlen, "status has neither token nor clientCertificateData");
    goto done;
  }
  if (tok != NULL) {
    const char *t = json_string_value(tok);
    size_t tl = json_string_length(tok);
    if (tl > 65536 || !ce_kube_token_ok(t, tl)) {
      rc = cfail(err, errlen,
                 "status.token must be 1 to 65536 bytes of printable ASCII without spaces");
      goto done;
    }
    out->token = strdup(t);
  }
  if (cert != NULL) {
    out->cert_len = json_string_length(cert);
    out->key_len = json_string_length(key);
    if (out->cert_len == 0 || out->key_len == 0) {
      rc = cfail(err, errlen, "clientCertificateData and clientKeyData must not be empty");
      goto done;
    }
    out->cert_pem = strndup(json_string_value(cert), out->cert_len);
    out->key_pem = strndup(json_string_value(key), out->key_len);
  }
  if ((tok != NULL && out->token == NULL) ||
      (cert != NULL && (out->cert_pem == NULL || out->key_pem == NULL))) {
    snprintf(err, errlen, "exec plugin: out of memory");
    rc = CE_ENOMEM;
    goto done;
  }
  if (json_is_string(exp)) {
    if (!ce_kube_rfc3339(json_string_value(exp), &out->expiry)) {
      rc = cfail(err, errlen, "status.expirationTimestamp is not an RFC 3339 time");
      goto done;
    }
    out->expires = true;
  }
done:
  json_decref(root);
  if (rc != CE_OK)
    ce_kube_cred_free(out);
  return rc;
}

bool ce_kube_query_escape(char *dst, size_t cap, size_t *used, const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t u = *used;
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    bool plain = isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
    size_t need = plain ? 1 : 3;
    if (u + need >= cap)
      return false;
    if (plain) {
      dst[u++] = (char)c;
    } else {
      dst[u++] = '%';
      dst[u++] = hex[c >> 4];
      dst[u++] = hex[c & 15];
    }
  }
  dst[u] = '\0';
  *used = u;
  return true;
}
