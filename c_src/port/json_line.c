/*
 * A JSON line to a term in one pass (json_line.h).
 *
 * A recursive descent over the text, bounded by CE_JSON_TERM_MAX_DEPTH,
 * writing into the caller's ei_x_buff as it goes. Counts that the
 * external format puts before the elements (a map's arity, a list's
 * length) are written as placeholders and filled in when the container
 * closes. Strings without escapes go from the text into the term with one
 * copy; those with escapes are decoded into a scratch buffer first.
 * Member names are remembered as offsets of their bytes in the term, so
 * that an object's names can be compared when it closes.
 */
#include "port/json_line.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "common/text.h"
#include "control/control.h"
#include "port/json_term.h"

/* Names of one object compared pairwise up to this many, sorted beyond. */
#define PAIRWISE_MAX 8
/* Room for the names of typical frames without an allocation. */
#define KEYS_INLINE 32
/* A real's text is copied NUL-terminated for strtod; longer ones (JSON
 * puts no bound on digits) go to the heap. */
#define NUMBER_INLINE 64

typedef struct {
  size_t off; /* of the name's bytes in x->buff */
  size_t len;
} key_ref_t;

typedef struct {
  const char *s;
  size_t n;
  size_t i;
  ei_x_buff *x;
  char *err;
  size_t errlen;
  key_ref_t *keys; /* the names of the objects open now, outermost first */
  size_t nkeys;
  size_t keys_cap;
  key_ref_t keys_inline[KEYS_INLINE];
  char *tmp;       /* decoded strings with escapes */
  size_t tmp_cap;
} lp_t;

static int refuse_at(lp_t *p, int code, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int refuse_at(lp_t *p, int code, size_t at, const char *fmt, ...) {
  if (p->err != NULL && p->errlen > 0) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "byte %zu: %s", at, what);
  }
  return code;
}

#define REFUSE(...) refuse_at(p, CE_EPARSE, p->i, __VA_ARGS__)

static int nomem(lp_t *p) {
  if (p->err != NULL && p->errlen > 0)
    snprintf(p->err, p->errlen, "out of memory");
  return CE_ENOMEM;
}

/* RFC 8259 §2: space, tab, line feed, carriage return. */
static void skip_ws(lp_t *p) {
  size_t i = p->i;
  while (i < p->n) {
    char c = p->s[i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    i++;
  }
  p->i = i;
}

/* The byte at the cursor, or -1 at the end. */
static int peek(const lp_t *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

/* Makes room in the term for n more bytes. erl_interface grows its
 * buffers itself, but a failed realloc there loses the buffer (it is
 * overwritten with NULL, so it leaks and the caller cannot free it);
 * growing here first, keeping the buffer on failure, leaves ei nothing to
 * grow: its encoders reallocate only when fewer than 100 bytes past what
 * they write would remain (x_fix_buff), hence the margin. */
#define EI_MARGIN 128u

static int reserve(lp_t *p, size_t n) {
  ei_x_buff *x = p->x;
  size_t need = (size_t)x->index + n + EI_MARGIN;
  if (need <= (size_t)x->buffsz)
    return CE_OK;
  size_t cap = (size_t)x->buffsz < 1024 ? 1024 : (size_t)x->buffsz;
  while (cap < need)
    cap *= 2;
  if (cap > INT_MAX)
    return nomem(p);
  char *b = realloc(x->buff, cap);
  if (b == NULL)
    return nomem(p);
  x->buff = b;
  x->buffsz = (int)cap;
  return CE_OK;
}

/* The largest encodings of the scalars written below: an integer as
 * SMALL_BIG_EXT (tag, length, sign, 8 bytes), a float as NEW_FLOAT_EXT,
 * an atom of up to 5 characters, a header of a map or list. */
#define EI_SCALAR_MAX 16u

static int put(lp_t *p, int ei_rc) { return ei_rc == 0 ? CE_OK : nomem(p); }

static void put32be(char *b, uint32_t v) {
  b[0] = (char)(v >> 24);
  b[1] = (char)(v >> 16);
  b[2] = (char)(v >> 8);
  b[3] = (char)v;
}

/* ---- strings (RFC 8259 §7) ----------------------------------------------- */

static bool tmp_reserve(lp_t *p, size_t n) {
  if (n <= p->tmp_cap)
    return true;
  size_t cap = p->tmp_cap < 256 ? 256 : p->tmp_cap;
  while (cap < n)
    cap *= 2;
  char *t = realloc(p->tmp, cap);
  if (t == NULL)
    return false;
  p->tmp = t;
  p->tmp_cap = cap;
  return true;
}

static int hex4(lp_t *p, size_t at, uint32_t *out) {
  if (p->n - at < 4)
    return refuse_at(p, CE_EPARSE, at, "a \\u escape needs four hex digits");
  uint32_t v = 0;
  for (size_t k = 0; k < 4; k++) {
    char c = p->s[at + k];
    uint32_t d;
    if (c >= '0' && c <= '9')
      d = (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = (uint32_t)(c - 'A' + 10);
    else
      return refuse_at(p, CE_EPARSE, at, "a \\u escape needs four hex digits");
    v = v << 4 | d;
  }
  *out = v;
  return CE_OK;
}

static size_t utf8_put(char *b, uint32_t cp) {
  if (cp < 0x80) {
    b[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    b[0] = (char)(0xc0 | cp >> 6);
    b[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    b[0] = (char)(0xe0 | cp >> 12);
    b[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    b[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  b[0] = (char)(0xf0 | cp >> 18);
  b[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  b[2] = (char)(0x80 | (cp >> 6 & 0x3f));
  b[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* One escape at p->i (the backslash), decoded into tmp at *len (room for
 * four bytes is there); the cursor moves past it. */
static int unescape(lp_t *p, size_t *len) {
  size_t at = p->i;
  if (p->n - at < 2)
    return refuse_at(p, CE_EPARSE, at, "the text ends inside a string");
  char c = p->s[at + 1], out;
  switch (c) {
  case '"': out = '"'; break;
  case '\\': out = '\\'; break;
  case '/': out = '/'; break;
  case 'b': out = '\b'; break;
  case 'f': out = '\f'; break;
  case 'n': out = '\n'; break;
  case 'r': out = '\r'; break;
  case 't': out = '\t'; break;
  case 'u': {
    uint32_t cp = 0, lo = 0;
    int rc = hex4(p, at + 2, &cp);
    if (rc != CE_OK)
      return rc;
    size_t used = 6;
    if (cp == 0)
      return refuse_at(p, CE_EPARSE, at, "\\u0000 in a string (NUL bytes are refused)");
    if (cp >= 0xdc00 && cp <= 0xdfff)
      return refuse_at(p, CE_EPARSE, at, "a low surrogate escape without a high one before it");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (p->n - at < 12 || p->s[at + 6] != '\\' || p->s[at + 7] != 'u' ||
          hex4(p, at + 8, &lo) != CE_OK || lo < 0xdc00 || lo > 0xdfff)
        return refuse_at(p, CE_EPARSE, at,
                         "a high surrogate escape not followed by a low one");
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      used = 12;
    }
    *len += utf8_put(p->tmp + *len, cp);
    p->i = at + used;
    return CE_OK;
  }
  default:
    return refuse_at(p, CE_EPARSE, at, "an unknown escape in a string");
  }
  p->tmp[(*len)++] = out;
  p->i = at + 2;
  return CE_OK;
}

/* The string at p->i (its opening quote) as a binary. *off receives the
 * offset of its bytes in the term, *len their count. */
static int parse_string(lp_t *p, size_t *off, size_t *len) {
  size_t open = p->i++;
  size_t start = p->i;
  /* The plain run: most strings have no escape and are copied once; most
   * are ASCII too, which needs no UTF-8 check. */
  const unsigned char *u = (const unsigned char *)p->s;
  size_t i = start, end = p->n;
  unsigned char high = 0;
  while (i < end) {
    unsigned char b = u[i];
    if (b == '"' || b == '\\' || b < 0x20)
      break;
    high |= b;
    i++;
  }
  p->i = i;
  const char *bytes = p->s + start;
  size_t n = i - start;
  int c = peek(p);
  if (c == '\\') {
    high = 0x80; /* decoded escapes may be anything */
    /* Escapes only shrink the text: the rest of the line bounds it. */
    if (!tmp_reserve(p, p->n - start))
      return nomem(p);
    memcpy(p->tmp, bytes, n);
    while ((c = peek(p)) != '"') {
      if (c < 0)
        break;
      if (c < 0x20)
        return REFUSE("a control character in a string (escape it)");
      if (c == '\\') {
        int rc = unescape(p, &n);
        if (rc != CE_OK)
          return rc;
      } else {
        p->tmp[n++] = (char)c;
        p->i++;
      }
    }
    bytes = p->tmp;
  }
  if (c < 0)
    return refuse_at(p, CE_EPARSE, open, "a string without its closing quote");
  if (c != '"')
    return REFUSE("a control character in a string (escape it)");
  if ((high & 0x80) != 0 && !ce_utf8_valid(bytes, n))
    return refuse_at(p, CE_EPARSE, open, "a string that is not valid UTF-8");
  p->i++;
  int rc = reserve(p, 5 + n);
  if (rc == CE_OK)
    rc = put(p, ei_x_encode_binary(p->x, bytes, (int)n));
  if (rc != CE_OK)
    return rc;
  *off = (size_t)p->x->index - n;
  *len = n;
  return CE_OK;
}

/* ---- numbers (RFC 8259 §6) ----------------------------------------------- */

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

static int parse_number(lp_t *p) {
  size_t start = p->i;
  bool neg = peek(p) == '-';
  if (neg)
    p->i++;
  int c = peek(p);
  if (!is_digit(c))
    return REFUSE("a number needs a digit here");
  /* A leading zero stands alone (no "01"). */
  if (c == '0')
    p->i++;
  else
    while (is_digit(peek(p)))
      p->i++;
  size_t int_end = p->i;
  bool real = false;
  if (peek(p) == '.') {
    real = true;
    p->i++;
    if (!is_digit(peek(p)))
      return REFUSE("a number needs a digit after its '.'");
    while (is_digit(peek(p)))
      p->i++;
  }
  c = peek(p);
  if (c == 'e' || c == 'E') {
    real = true;
    p->i++;
    c = peek(p);
    if (c == '+' || c == '-')
      p->i++;
    if (!is_digit(peek(p)))
      return REFUSE("a number needs a digit in its exponent");
    while (is_digit(peek(p)))
      p->i++;
  }
  if (!real) {
    /* An integer: 64 bits, as jansson's json_int_t and the term mapping. */
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    for (size_t k = start + (neg ? 1 : 0); k < int_end; k++) {
      uint64_t d = (uint64_t)(p->s[k] - '0');
      if (v > (limit - d) / 10)
        return refuse_at(p, CE_EPARSE, start, "an integer outside -2^63..2^63-1");
      v = v * 10 + d;
    }
    EI_LONGLONG ll = neg ? (EI_LONGLONG)(0 - v) : (EI_LONGLONG)v;
    int rc = reserve(p, EI_SCALAR_MAX);
    return rc == CE_OK ? put(p, ei_x_encode_longlong(p->x, ll)) : rc;
  }
  size_t len = p->i - start;
  char inline_buf[NUMBER_INLINE];
  char *text = len < sizeof(inline_buf) ? inline_buf : malloc(len + 1);
  if (text == NULL)
    return nomem(p);
  memcpy(text, p->s + start, len);
  text[len] = '\0';
  errno = 0;
  double d = strtod(text, NULL);
  bool overflow = errno == ERANGE && isinf(d);
  if (text != inline_buf)
    free(text);
  /* Too small a number becomes 0 or a subnormal, as strtod gives it; too
   * large a one has no double (RFC 8259 §6 lets a parser limit range). */
  if (overflow)
    return refuse_at(p, CE_EPARSE, start, "a number outside the range of a double");
  int rc = reserve(p, EI_SCALAR_MAX);
  return rc == CE_OK ? put(p, ei_x_encode_double(p->x, d)) : rc;
}

/* ---- objects and arrays (RFC 8259 §4, §5) -------------------------------- */

static int key_push(lp_t *p, size_t off, size_t len) {
  if (p->nkeys == p->keys_cap) {
    size_t cap = p->keys_cap * 2;
    key_ref_t *k = p->keys == p->keys_inline ? malloc(cap * sizeof(*k))
                                             : realloc(p->keys, cap * sizeof(*k));
    if (k == NULL)
      return nomem(p);
    if (p->keys == p->keys_inline)
      memcpy(k, p->keys_inline, sizeof(p->keys_inline));
    p->keys = k;
    p->keys_cap = cap;
  }
  p->keys[p->nkeys].off = off;
  p->keys[p->nkeys].len = len;
  p->nkeys++;
  return CE_OK;
}

static int key_cmp(const void *a, const void *b, void *arg) {
  const key_ref_t *ka = a, *kb = b;
  const char *buf = arg;
  if (ka->len != kb->len)
    return ka->len < kb->len ? -1 : 1;
  return memcmp(buf + ka->off, buf + kb->off, ka->len);
}

/* The names keys[from..nkeys), one object's, are all different. The
 * refusal names one that is not (shown sanitized). */
static int keys_unique(lp_t *p, size_t from, size_t at) {
  key_ref_t *k = p->keys + from;
  size_t n = p->nkeys - from;
  const key_ref_t *dup = NULL;
  if (n <= PAIRWISE_MAX) {
    for (size_t a = 0; a < n && dup == NULL; a++)
      for (size_t b = a + 1; b < n && dup == NULL; b++)
        if (key_cmp(&k[a], &k[b], p->x->buff) == 0)
          dup = &k[a];
  } else {
    qsort_r(k, n, sizeof(*k), key_cmp, p->x->buff);
    for (size_t a = 1; a < n && dup == NULL; a++)
      if (key_cmp(&k[a - 1], &k[a], p->x->buff) == 0)
        dup = &k[a];
  }
  if (dup == NULL)
    return CE_OK;
  char shown[4 * CE_TEXT_QUOTE_MAX + 8];
  ce_text_sanitize(shown, sizeof(shown), p->x->buff + dup->off, dup->len, 1);
  return refuse_at(p, CE_EPARSE, at, "the member \"%s\" appears twice in an object", shown);
}

static int parse_value(lp_t *p, int depth);

/* After a member or an element: the container's closing byte (left for
 * the caller, *closed set) or a comma (skipped). */
static int after_element(lp_t *p, int close, const char *expected, bool *closed) {
  skip_ws(p);
  int c = peek(p);
  if (c == close) {
    *closed = true;
    return CE_OK;
  }
  if (c != ',')
    return REFUSE("%s", expected);
  p->i++;
  return CE_OK;
}

static int parse_object(lp_t *p, int depth) {
  size_t open = p->i++;
  int rc = reserve(p, EI_SCALAR_MAX);
  if (rc != CE_OK)
    return rc;
  int header = p->x->index;
  rc = put(p, ei_x_encode_map_header(p->x, 0));
  if (rc != CE_OK)
    return rc;
  size_t from = p->nkeys;
  uint32_t count = 0;
  skip_ws(p);
  if (peek(p) != '}') {
    for (;;) {
      skip_ws(p);
      if (peek(p) != '"')
        return REFUSE("a member name (a string) expected");
      size_t off = 0, len = 0;
      rc = parse_string(p, &off, &len);
      if (rc == CE_OK)
        rc = key_push(p, off, len);
      if (rc != CE_OK)
        return rc;
      skip_ws(p);
      if (peek(p) != ':')
        return REFUSE("':' expected after a member name");
      p->i++;
      rc = parse_value(p, depth + 1);
      count++;
      bool closed = false;
      if (rc == CE_OK)
        rc = after_element(p, '}', "',' or '}' expected in an object", &closed);
      if (rc != CE_OK)
        return rc;
      if (closed)
        break;
    }
  }
  p->i++;
  rc = keys_unique(p, from, open);
  p->nkeys = from;
  if (rc != CE_OK)
    return rc;
  put32be(p->x->buff + header + 1, count);
  return CE_OK;
}

static int parse_array(lp_t *p, int depth) {
  p->i++;
  int rc = reserve(p, EI_SCALAR_MAX);
  if (rc != CE_OK)
    return rc;
  int header = p->x->index;
  /* A non-empty list's header (LIST_EXT and a length), filled in below;
   * an empty array is NIL_EXT alone. */
  rc = put(p, ei_x_encode_list_header(p->x, 1));
  if (rc != CE_OK)
    return rc;
  uint32_t count = 0;
  skip_ws(p);
  if (peek(p) != ']') {
    for (;;) {
      rc = parse_value(p, depth + 1);
      count++;
      bool closed = false;
      if (rc == CE_OK)
        rc = after_element(p, ']', "',' or ']' expected in an array", &closed);
      if (rc != CE_OK)
        return rc;
      if (closed)
        break;
    }
  }
  p->i++;
  if (count == 0)
    p->x->index = header;
  else
    put32be(p->x->buff + header + 1, count);
  rc = reserve(p, EI_SCALAR_MAX);
  return rc == CE_OK ? put(p, ei_x_encode_empty_list(p->x)) : rc;
}

static int literal(lp_t *p, const char *word, const char *atom) {
  size_t n = strlen(word);
  if (p->n - p->i < n || memcmp(p->s + p->i, word, n) != 0)
    return REFUSE("not a JSON value");
  p->i += n;
  int rc = reserve(p, EI_SCALAR_MAX);
  return rc == CE_OK ? put(p, ei_x_encode_atom(p->x, atom)) : rc;
}

static int parse_value(lp_t *p, int depth) {
  skip_ws(p);
  if (depth > CE_JSON_TERM_MAX_DEPTH)
    return refuse_at(p, CE_EINVAL, p->i, "nested deeper than %d", CE_JSON_TERM_MAX_DEPTH);
  int c = peek(p);
  switch (c) {
  case '{':
    return parse_object(p, depth);
  case '[':
    return parse_array(p, depth);
  case '"': {
    size_t off, len;
    return parse_string(p, &off, &len);
  }
  case 't':
    return literal(p, "true", "true");
  case 'f':
    return literal(p, "false", "false");
  case 'n':
    return literal(p, "null", "nil");
  case -1:
    return REFUSE("the text ends where a value was expected");
  default:
    if (c == '-' || is_digit(c))
      return parse_number(p);
    return REFUSE("not a JSON value");
  }
}

int ce_json_line_to_term(const char *s, size_t n, ei_x_buff *x, char *err, size_t errlen) {
  lp_t p;
  p.s = s;
  p.n = n;
  p.i = 0;
  p.x = x;
  p.err = err;
  p.errlen = errlen;
  p.keys = p.keys_inline;
  p.nkeys = 0;
  p.keys_cap = KEYS_INLINE;
  p.tmp = NULL;
  p.tmp_cap = 0;
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (n > CE_CONTROL_MAX_FRAME)
    return refuse_at(&p, CE_ETOOBIG, 0, "a line longer than %u bytes", CE_CONTROL_MAX_FRAME);
  int rc;
  skip_ws(&p);
  if (peek(&p) != '{') {
    rc = refuse_at(&p, CE_EPARSE, p.i, "not a JSON object");
  } else {
    rc = parse_value(&p, 0);
    skip_ws(&p);
    if (rc == CE_OK && p.i != n)
      rc = refuse_at(&p, CE_EPARSE, p.i, "text after the object");
  }
  if (p.keys != p.keys_inline)
    free(p.keys);
  free(p.tmp);
  return rc;
}
