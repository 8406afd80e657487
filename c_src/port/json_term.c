/*
 * JSON <-> term conversion (json_term.h).
 *
 * Both directions recurse, bounded by CE_JSON_TERM_MAX_DEPTH. The path of
 * the value being converted is kept in one buffer that grows and shrinks
 * with the recursion, so a refusal can say where it happened without any
 * allocation.
 */
#include "port/json_term.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "common/error.h"
#include "common/text.h"
#include "port/etf.h"

/* FLOAT_EXT holds a float as 31 bytes of text (the old encoding). */
#define FLOAT_EXT_LEN 31

typedef struct {
  const char *buf;
  char path[CE_JSON_TERM_PATH_MAX + 4];
  size_t path_len;
  char *err;
  size_t errlen;
} conv_t;

static int refuse(conv_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int refuse(conv_t *c, const char *fmt, ...) {
  if (c->err != NULL && c->errlen > 0) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "%s: %s", c->path, what);
  }
  return CE_EINVAL;
}

/* Appends a segment to the path; returns the previous length, to restore
 * with path_pop(). A path that would overflow ends in "..." instead. */
static size_t path_push(conv_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static size_t path_push(conv_t *c, const char *fmt, ...) {
  size_t old = c->path_len;
  if (old >= CE_JSON_TERM_PATH_MAX)
    return old;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(c->path + old, CE_JSON_TERM_PATH_MAX - old, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= CE_JSON_TERM_PATH_MAX - old) {
    strcpy(c->path + CE_JSON_TERM_PATH_MAX - 1, "...");
    c->path_len = CE_JSON_TERM_PATH_MAX;
  } else {
    c->path_len = old + (size_t)n;
  }
  return old;
}

static void path_pop(conv_t *c, size_t old) {
  c->path_len = old;
  c->path[old] = '\0';
}

/* Text that becomes a JSON string: UTF-8 (JSON text is Unicode, RFC 8259
 * §8.1) and without NUL, which the control channel's parser refuses
 * (docs/control-channel.md) and which jansson's C-string keys cannot hold. */
static int check_text(conv_t *c, const char *s, size_t n, const char *what) {
  if (u8_check((const uint8_t *)s, n) != NULL)
    return refuse(c, "%s is not valid UTF-8", what);
  if (memchr(s, '\0', n) != NULL)
    return refuse(c, "%s contains a NUL byte", what);
  return CE_OK;
}

/* A name for a term that has no JSON form, for the refusal message. */
static const char *kind_name(unsigned char tag) {
  switch (tag) {
  case 'h':
  case 'i':
    return "a tuple";
  case 'g':
  case 'X':
    return "a pid";
  case 'f':
  case 'Y':
  case 'x':
    return "a port";
  case 'e':
  case 'r':
  case 'Z':
    return "a reference";
  case 'p':
  case 'q':
    return "a fun";
  case 'M':
    return "a bitstring";
  default:
    return "this term";
  }
}

static int to_json(conv_t *c, int *index, int depth, json_t **out);

static int list_to_json(conv_t *c, int *index, int depth, json_t **out) {
  unsigned char tag = (unsigned char)c->buf[*index];
  json_t *arr = json_array();
  if (arr == NULL)
    return CE_ENOMEM;
  int i = *index;
  int rc = CE_OK;
  if (tag == 'k') {
    /* STRING_EXT: the BEAM's compact form of a list of small integers. */
    size_t n = (size_t)((unsigned char)c->buf[i + 1] << 8 | (unsigned char)c->buf[i + 2]);
    const unsigned char *bytes = (const unsigned char *)c->buf + i + 3;
    for (size_t k = 0; k < n && rc == CE_OK; k++)
      if (json_array_append_new(arr, json_integer(bytes[k])) != 0)
        rc = CE_ENOMEM;
    i += 3 + (int)n;
  } else if (tag == 'l') {
    int n = 0;
    ei_decode_list_header(c->buf, &i, &n);
    for (int k = 0; k < n && rc == CE_OK; k++) {
      size_t old = path_push(c, "[%d]", k);
      json_t *v = NULL;
      rc = to_json(c, &i, depth + 1, &v);
      path_pop(c, old);
      if (rc == CE_OK && json_array_append_new(arr, v) != 0)
        rc = CE_ENOMEM;
    }
    if (rc == CE_OK && (unsigned char)c->buf[i] != ERL_NIL_EXT)
      rc = refuse(c, "an improper list is not JSON");
    i++;
  } else {
    i++; /* NIL_EXT: the empty list */
  }
  if (rc != CE_OK) {
    json_decref(arr);
    return rc;
  }
  *index = i;
  *out = arr;
  return CE_OK;
}

static int map_to_json(conv_t *c, int *index, int depth, json_t **out) {
  int i = *index, n = 0;
  ei_decode_map_header(c->buf, &i, &n);
  json_t *obj = json_object();
  if (obj == NULL)
    return CE_ENOMEM;
  int rc = CE_OK;
  for (int k = 0; k < n && rc == CE_OK; k++) {
    char atom[CE_ETF_ATOM_MAX];
    const char *key = NULL;
    size_t key_len = 0;
    int at = i;
    if (ce_etf_binary(c->buf, &i, &key, &key_len)) {
      rc = check_text(c, key, key_len, "a map key");
    } else if (ce_etf_atom(c->buf, &i, atom)) {
      key = atom;
      key_len = strlen(atom);
      rc = check_text(c, key, key_len, "a map key (an atom)");
    } else {
      rc = refuse(c, "a map key must be a binary or an atom, not %s",
                  kind_name((unsigned char)c->buf[at]));
    }
    if (rc != CE_OK)
      break;
    char shown[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown, sizeof(shown), key, key_len, 0);
    size_t old = path_push(c, ".%s", shown);
    if (json_object_getn(obj, key, key_len) != NULL) {
      /* %{"a" => 1, a: 2} is one JSON member written twice; the control
       * channel refuses duplicate members, so it is refused here. */
      rc = refuse(c, "the key appears twice (as a binary and as an atom)");
    } else {
      json_t *v = NULL;
      rc = to_json(c, &i, depth + 1, &v);
      if (rc == CE_OK && json_object_setn_new_nocheck(obj, key, key_len, v) != 0)
        rc = CE_ENOMEM;
    }
    path_pop(c, old);
  }
  if (rc != CE_OK) {
    json_decref(obj);
    return rc;
  }
  *index = i;
  *out = obj;
  return CE_OK;
}

static int atom_to_json(conv_t *c, int *index, json_t **out) {
  char atom[CE_ETF_ATOM_MAX];
  int i = *index;
  if (!ce_etf_atom(c->buf, &i, atom))
    return refuse(c, "an atom longer than 255 characters");
  json_t *v;
  if (strcmp(atom, "true") == 0) {
    v = json_true();
  } else if (strcmp(atom, "false") == 0) {
    v = json_false();
  } else if (strcmp(atom, "nil") == 0 || strcmp(atom, "null") == 0) {
    v = json_null();
  } else {
    int rc = check_text(c, atom, strlen(atom), "an atom");
    if (rc != CE_OK)
      return rc;
    v = json_string_nocheck(atom);
    if (v == NULL)
      return CE_ENOMEM;
  }
  *index = i;
  *out = v;
  return CE_OK;
}

static int to_json(conv_t *c, int *index, int depth, json_t **out) {
  if (depth > CE_JSON_TERM_MAX_DEPTH)
    return refuse(c, "nested deeper than %d", CE_JSON_TERM_MAX_DEPTH);
  const char *buf = c->buf;
  unsigned char tag = (unsigned char)buf[*index];
  int i = *index;
  json_t *v = NULL;
  switch (tag) {
  case 'a':
  case 'b':
  case 'n':
  case 'o': {
    EI_LONGLONG n = 0;
    if (ei_decode_longlong(buf, &i, &n) != 0)
      return refuse(c, "an integer outside -2^63..2^63-1 (JSON integers here are 64-bit)");
    v = json_integer((json_int_t)n);
    break;
  }
  case 'c':
  case 'F': {
    double d = 0;
    if (tag == 'c') {
      /* Parsed from a NUL-terminated copy: the text fills all 31 bytes
       * when it has no NUL padding, and must not be read past. */
      char text[FLOAT_EXT_LEN + 1];
      memcpy(text, buf + i + 1, FLOAT_EXT_LEN);
      text[FLOAT_EXT_LEN] = '\0';
      char *end = NULL;
      d = strtod(text, &end);
      if (end == text)
        return refuse(c, "a malformed float");
      i += 1 + FLOAT_EXT_LEN;
    } else {
      ei_decode_double(buf, &i, &d);
    }
    if (!isfinite(d))
      return refuse(c, "a float that is not finite");
    v = json_real(d);
    break;
  }
  case 'd':
  case 's':
  case 'v':
  case 'w':
    return atom_to_json(c, index, out);
  case 'm': {
    const char *s = NULL;
    size_t n = 0;
    ce_etf_binary(buf, &i, &s, &n);
    int rc = check_text(c, s, n, "a binary");
    if (rc != CE_OK)
      return rc;
    v = json_stringn_nocheck(s, n);
    break;
  }
  case 'j':
  case 'k':
  case 'l':
    return list_to_json(c, index, depth, out);
  case 't':
    return map_to_json(c, index, depth, out);
  default:
    return refuse(c, "%s is not JSON", kind_name(tag));
  }
  if (v == NULL)
    return CE_ENOMEM;
  *index = i;
  *out = v;
  return CE_OK;
}

int ce_term_to_json(const char *buf, int *index, const char *root, json_t **out,
                    char *err, size_t errlen) {
  conv_t c;
  c.buf = buf;
  c.err = err;
  c.errlen = errlen;
  c.path_len = 0;
  c.path[0] = '\0';
  path_push(&c, "%s", root);
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  int i = *index;
  json_t *v = NULL;
  int rc = to_json(&c, &i, 0, &v);
  if (rc != CE_OK) {
    if (rc == CE_ENOMEM && err != NULL && errlen > 0)
      snprintf(err, errlen, "%s: out of memory", c.path);
    return rc;
  }
  *index = i;
  *out = v;
  return CE_OK;
}

/* ---- JSON -> term ---------------------------------------------------------- */

static int from_json(const json_t *v, ei_x_buff *x, int depth, char *err, size_t errlen) {
  if (depth > CE_JSON_TERM_MAX_DEPTH) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "a JSON value nested deeper than %d", CE_JSON_TERM_MAX_DEPTH);
    return CE_EINVAL;
  }
  int rc = 0;
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    const char *key;
    size_t key_len;
    json_t *member;
    if (ei_x_encode_map_header(x, (long)json_object_size(v)) != 0)
      return CE_ENOMEM;
    json_object_keylen_foreach((json_t *)v, key, key_len, member) {
      if (ei_x_encode_binary(x, key, (int)key_len) != 0)
        return CE_ENOMEM;
      rc = from_json(member, x, depth + 1, err, errlen);
      if (rc != CE_OK)
        return rc;
    }
    return CE_OK;
  }
  case JSON_ARRAY: {
    size_t n = json_array_size(v);
    if (n > 0 && ei_x_encode_list_header(x, (long)n) != 0)
      return CE_ENOMEM;
    for (size_t k = 0; k < n; k++) {
      rc = from_json(json_array_get(v, k), x, depth + 1, err, errlen);
      if (rc != CE_OK)
        return rc;
    }
    return ei_x_encode_empty_list(x) == 0 ? CE_OK : CE_ENOMEM;
  }
  case JSON_STRING:
    rc = ei_x_encode_binary(x, json_string_value(v), (int)json_string_length(v));
    break;
  case JSON_INTEGER:
    rc = ei_x_encode_longlong(x, (EI_LONGLONG)json_integer_value(v));
    break;
  case JSON_REAL:
    rc = ei_x_encode_double(x, json_real_value(v));
    break;
  case JSON_TRUE:
    rc = ei_x_encode_atom(x, "true");
    break;
  case JSON_FALSE:
    rc = ei_x_encode_atom(x, "false");
    break;
  case JSON_NULL:
  default:
    rc = ei_x_encode_atom(x, "nil");
    break;
  }
  return rc == 0 ? CE_OK : CE_ENOMEM;
}

int ce_json_to_term(const json_t *v, ei_x_buff *x, char *err, size_t errlen) {
  if (v == NULL) {
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "no JSON value");
    return CE_EINVAL;
  }
  return from_json(v, x, 0, err, errlen);
}
