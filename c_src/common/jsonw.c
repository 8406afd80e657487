/* A bounded JSON text writer (see jsonw.h). */
#include "common/jsonw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

void ce_jsonw_init(ce_jsonw_t *w, char *inline_buf, size_t inline_cap, size_t max) {
  w->buf = inline_buf;
  w->inline_buf = inline_buf;
  /* Never more room than max, so the fast path need not check it. */
  w->inline_cap = inline_buf == NULL ? 0 : inline_cap < max ? inline_cap : max;
  w->len = 0;
  w->cap = w->inline_cap;
  w->max = max;
  w->err = CE_OK;
}

void ce_jsonw_free(ce_jsonw_t *w) {
  if (w->buf != w->inline_buf)
    free(w->buf);
  w->buf = w->inline_buf;
  w->cap = w->inline_cap;
  w->len = 0;
}

int ce_jsonw_error(const ce_jsonw_t *w) { return w->err; }

static void fail(ce_jsonw_t *w, int err) {
  if (w->err == CE_OK)
    w->err = err;
}

/* Makes room for n more bytes; false (with the error set) when it cannot. */
static bool reserve(ce_jsonw_t *w, size_t n) {
  if (w->err != CE_OK)
    return false;
  if (n <= w->cap - w->len)
    return true;
  if (n > w->max || w->len > w->max - n) {
    fail(w, CE_ETOOBIG);
    return false;
  }
  size_t need = w->len + n;
  size_t cap = w->cap < 256 ? 256 : w->cap;
  while (cap < need)
    cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  if (cap > w->max)
    cap = w->max;
  char *nb;
  if (w->buf == w->inline_buf) {
    nb = malloc(cap);
    if (nb != NULL && w->len > 0)
      memcpy(nb, w->buf, w->len);
  } else {
    nb = realloc(w->buf, cap);
  }
  if (nb == NULL) {
    fail(w, CE_ENOMEM);
    return false;
  }
  w->buf = nb;
  w->cap = cap;
  return true;
}

void ce_jsonw_raw_grow(ce_jsonw_t *w, const char *s, size_t n) {
  if (n == 0 || !reserve(w, n))
    return;
  memcpy(w->buf + w->len, s, n);
  w->len += n;
}

/* True when none of the 8 bytes at p has its high bit set. */
static inline bool ascii8(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return (v & UINT64_C(0x8080808080808080)) == 0;
}

/* RFC 3629: the well-formed sequences. */
bool ce_utf8_valid(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (n - i >= 8 && ascii8(p + i)) {
      i += 8;
      continue;
    }
    unsigned char c = p[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false; /* a continuation byte, 0xc0/0xc1 or 0xf5.. */
    }
    if (n - i < len)
      return false;
    for (size_t k = 1; k < len; k++) {
      if ((p[i + k] & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

/* A byte a JSON string carries as it is: not a control, '"' or '\\'. */
static inline bool plain(unsigned char c) { return c >= 0x20 && c != '"' && c != '\\'; }

/* Writes s[0..n) escaped, without quotes; with lossy, every byte >= 0x80
 * as U+FFFD. */
static void escaped(ce_jsonw_t *w, const char *s, size_t n, bool lossy) {
  static const char hex[] = "0123456789ABCDEF"; /* jansson writes \u001F */
  /* The worst case is 6 bytes per input byte (\u00XX); reserve per run
   * rather than for the worst case, so a long plain string near max is
   * not refused for escapes it does not have. */
  size_t start = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (plain(c) && (c < 0x80 || !lossy))
      continue;
    if (c >= 0x80) {
      ce_jsonw_raw(w, s + start, i - start);
      start = i + 1;
      ce_jsonw_raw(w, "\xef\xbf\xbd", 3);
      continue;
    }
    ce_jsonw_raw(w, s + start, i - start);
    start = i + 1;
    char esc[6] = {'\\', 0, 0, 0, 0, 0};
    size_t elen = 2;
    switch (c) {
    case '"': esc[1] = '"'; break;
    case '\\': esc[1] = '\\'; break;
    case '\b': esc[1] = 'b'; break;
    case '\f': esc[1] = 'f'; break;
    case '\n': esc[1] = 'n'; break;
    case '\r': esc[1] = 'r'; break;
    case '\t': esc[1] = 't'; break;
    default:
      esc[1] = 'u';
      esc[2] = '0';
      esc[3] = '0';
      esc[4] = hex[c >> 4];
      esc[5] = hex[c & 15];
      elen = 6;
    }
    ce_jsonw_raw(w, esc, elen);
  }
  ce_jsonw_raw(w, s + start, n - start);
}

#define ONES UINT64_C(0x0101010101010101)
#define HIGH UINT64_C(0x8080808080808080)

/* True when none of the 8 bytes at p is >= 0x80, below 0x20, '"' or '\\'.
 * A byte b of v is below n (n <= 0x80) exactly when (b - n) borrows into
 * its high bit while b's own is clear; a borrow only ever starts at such a
 * byte, so the word has one exactly when the test is non-zero. */
static inline bool plain_ascii8(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  uint64_t q = v ^ (ONES * '"'), b = v ^ (ONES * '\\');
  uint64_t hit = v | ((v - ONES * 0x20) & ~v) | ((q - ONES) & ~q) | ((b - ONES) & ~b);
  return (hit & HIGH) == 0;
}

/* The length of the leading run of s[0..n) that is ASCII and needs no
 * escape. */
static size_t plain_ascii_run(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (n - i >= 8 && plain_ascii8(p + i))
    i += 8;
  while (i < n && p[i] < 0x80 && plain(p[i]))
    i++;
  return i;
}

/* Appends s[0..n) quoted as it is: the text has nothing to escape. The
 * quoted text is at least n + 2 bytes whatever the escaping, so when that
 * does not fit, neither would any other form. */
static void quoted_copy(ce_jsonw_t *w, const char *s, size_t n) {
  if (n > SIZE_MAX - 2) {
    fail(w, CE_ETOOBIG);
    return;
  }
  if (!reserve(w, n + 2))
    return;
  char *d = w->buf + w->len;
  d[0] = '"';
  if (n > 0)
    memcpy(d + 1, s, n);
  d[n + 1] = '"';
  w->len += n + 2;
}

/* s[0..n) has nothing to escape (valid UTF-8 is copied as it is). */
static bool nothing_to_escape(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = plain_ascii_run(s, n); i < n; i++)
    if (!plain(p[i]))
      return false;
  return true;
}

void ce_jsonw_string(ce_jsonw_t *w, const char *s, size_t n) {
  if (w->err != CE_OK)
    return;
  /* Plain ASCII, the common case: valid, and nothing to escape. */
  if (plain_ascii_run(s, n) == n) {
    quoted_copy(w, s, n);
    return;
  }
  if (!ce_utf8_valid(s, n)) {
    fail(w, CE_EINVAL);
    return;
  }
  if (nothing_to_escape(s, n)) {
    quoted_copy(w, s, n);
    return;
  }
  ce_jsonw_raw(w, "\"", 1);
  escaped(w, s, n, false);
  ce_jsonw_raw(w, "\"", 1);
}

void ce_jsonw_string_lossy(ce_jsonw_t *w, const char *s, size_t n) {
  if (w->err != CE_OK)
    return;
  if (plain_ascii_run(s, n) == n) {
    quoted_copy(w, s, n);
    return;
  }
  bool valid = ce_utf8_valid(s, n);
  if (valid && nothing_to_escape(s, n)) {
    quoted_copy(w, s, n);
    return;
  }
  ce_jsonw_raw(w, "\"", 1);
  escaped(w, s, n, !valid);
  ce_jsonw_raw(w, "\"", 1);
}

void ce_jsonw_fail(ce_jsonw_t *w, int err) {
  if (err != CE_OK)
    fail(w, err);
}

void ce_jsonw_int(ce_jsonw_t *w, int64_t v) {
  if (v >= 0) {
    ce_jsonw_uint(w, (uint64_t)v);
    return;
  }
  ce_jsonw_raw(w, "-", 1);
  ce_jsonw_uint(w, (uint64_t)0 - (uint64_t)v); /* INT64_MIN included */
}

void ce_jsonw_uint(ce_jsonw_t *w, uint64_t v) {
  char b[24];
  size_t k = sizeof(b);
  do {
    b[--k] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  ce_jsonw_raw(w, b + k, sizeof(b) - k);
}

static void value(ce_jsonw_t *w, const json_t *v, int depth);

static void members(ce_jsonw_t *w, const json_t *obj, const char *skip1, const char *skip2,
                    bool *first, int depth) {
  if (!json_is_object(obj)) {
    fail(w, CE_EINVAL);
    return;
  }
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)obj, key, val) {
    if (w->err != CE_OK)
      return;
    if ((skip1 != NULL && strcmp(key, skip1) == 0) || (skip2 != NULL && strcmp(key, skip2) == 0))
      continue;
    if (!*first)
      ce_jsonw_raw(w, ",", 1);
    *first = false;
    ce_jsonw_string(w, key, strlen(key));
    ce_jsonw_raw(w, ":", 1);
    value(w, val, depth);
  }
}

static void value(ce_jsonw_t *w, const json_t *v, int depth) {
  if (w->err != CE_OK)
    return;
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    if (depth >= CE_JSONW_MAX_DEPTH) {
      fail(w, CE_EINVAL);
      return;
    }
    bool first = true;
    ce_jsonw_raw(w, "{", 1);
    members(w, v, NULL, NULL, &first, depth + 1);
    ce_jsonw_raw(w, "}", 1);
    return;
  }
  case JSON_ARRAY: {
    if (depth >= CE_JSONW_MAX_DEPTH) {
      fail(w, CE_EINVAL);
      return;
    }
    ce_jsonw_raw(w, "[", 1);
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n && w->err == CE_OK; i++) {
      if (i > 0)
        ce_jsonw_raw(w, ",", 1);
      value(w, json_array_get(v, i), depth + 1);
    }
    ce_jsonw_raw(w, "]", 1);
    return;
  }
  case JSON_STRING:
    ce_jsonw_string(w, json_string_value(v), json_string_length(v));
    return;
  case JSON_INTEGER:
    ce_jsonw_int(w, (int64_t)json_integer_value(v));
    return;
  case JSON_REAL: {
    /* jansson's own notation (a scalar dump allocates nothing). */
    char b[64];
    size_t k = json_dumpb(v, b, sizeof(b), JSON_ENCODE_ANY | JSON_COMPACT);
    if (k == 0 || k > sizeof(b)) {
      fail(w, CE_EINVAL);
      return;
    }
    ce_jsonw_raw(w, b, k);
    return;
  }
  case JSON_TRUE:
    ce_jsonw_raw(w, "true", 4);
    return;
  case JSON_FALSE:
    ce_jsonw_raw(w, "false", 5);
    return;
  case JSON_NULL:
    ce_jsonw_raw(w, "null", 4);
    return;
  }
  fail(w, CE_EINVAL); /* NULL or an unknown type */
}

void ce_jsonw_value(ce_jsonw_t *w, const json_t *v) {
  if (v == NULL) {
    fail(w, CE_EINVAL);
    return;
  }
  value(w, v, 0);
}

void ce_jsonw_members(ce_jsonw_t *w, const json_t *obj, const char *skip1, const char *skip2,
                      bool *first) {
  if (w->err != CE_OK)
    return;
  members(w, obj, skip1, skip2, first, 1);
}
