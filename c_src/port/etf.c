/*
 * The bounded ETF walker and the small readers of etf.h.
 *
 * The tags and their layouts are those of the Erlang documentation's
 * "External Term Format" chapter (erts/doc, version 131). Every tag the
 * BEAM can put in a term given to a {packet, 4} port is known here, so a
 * request holding a pid or a reference is a well-formed term (answered
 * with a badarg naming where the pid is), not a broken packet.
 */
#include "port/etf.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* ce_etf_skip() walks a term already checked, so it has no length to
 * stop at; this one is far beyond any packet and never reached. */
#define SKIP_SPAN ((size_t)1 << 40)

typedef struct {
  const unsigned char *p;
  size_t len;
  size_t pos;
  char *err;
  size_t errlen;
} walker_t;

static bool walk_fail(walker_t *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static bool walk_fail(walker_t *w, const char *fmt, ...) {
  if (w->err != NULL && w->errlen > 0) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(w->err, w->errlen, "%s at byte %zu of the packet", what, w->pos);
  }
  return false;
}

static bool need(walker_t *w, size_t n) {
  if (w->len - w->pos < n)
    return walk_fail(w, "the term is truncated");
  return true;
}

static bool skip(walker_t *w, size_t n) {
  if (!need(w, n))
    return false;
  w->pos += n;
  return true;
}

static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads a count of `width` bytes (1, 2 or 4). */
static bool count(walker_t *w, int width, uint32_t *out) {
  if (!need(w, (size_t)width))
    return false;
  const unsigned char *q = w->p + w->pos;
  *out = width == 1 ? q[0] : width == 2 ? be16(q) : be32(q);
  w->pos += (size_t)width;
  return true;
}

/* Every element of a tuple, list or map takes at least one byte, so a
 * count larger than what is left is refused before looping: the walk is
 * linear in the packet, whatever the counts claim. */
static bool plausible(walker_t *w, uint64_t elements) {
  if (elements > w->len - w->pos)
    return walk_fail(w, "a count of %llu elements is more than the packet holds",
                     (unsigned long long)elements);
  return true;
}

static bool walk(walker_t *w, int depth);

static bool walk_atom(walker_t *w) {
  if (!need(w, 1))
    return false;
  unsigned char tag = w->p[w->pos];
  if (tag != 'd' && tag != 's' && tag != 'v' && tag != 'w')
    return walk_fail(w, "expected an atom (a node name)");
  return walk(w, 0);
}

static bool walk_elements(walker_t *w, uint64_t n, int depth) {
  if (!plausible(w, n))
    return false;
  for (uint64_t i = 0; i < n; i++)
    if (!walk(w, depth + 1))
      return false;
  return true;
}

static bool walk(walker_t *w, int depth) {
  if (depth > CE_ETF_MAX_DEPTH)
    return walk_fail(w, "the term nests deeper than %d", CE_ETF_MAX_DEPTH);
  if (!need(w, 1))
    return false;
  unsigned char tag = w->p[w->pos++];
  uint32_t n = 0, arity = 0;
  switch (tag) {
  case 'a': /* SMALL_INTEGER_EXT */
    return skip(w, 1);
  case 'b': /* INTEGER_EXT */
    return skip(w, 4);
  case 'c': /* FLOAT_EXT: 31 bytes of printf text */
    return skip(w, 31);
  case 'F': /* NEW_FLOAT_EXT: an IEEE 754 double */
    return skip(w, 8);
  case 'd': /* ATOM_EXT (Latin-1) */
  case 'v': /* ATOM_UTF8_EXT */
    return count(w, 2, &n) && skip(w, n);
  case 's': /* SMALL_ATOM_EXT */
  case 'w': /* SMALL_ATOM_UTF8_EXT */
    return count(w, 1, &n) && skip(w, n);
  case 'h': /* SMALL_TUPLE_EXT */
    return count(w, 1, &arity) && walk_elements(w, arity, depth);
  case 'i': /* LARGE_TUPLE_EXT */
    return count(w, 4, &arity) && walk_elements(w, arity, depth);
  case 'j': /* NIL_EXT */
    return true;
  case 'k': /* STRING_EXT: a list of bytes */
    return count(w, 2, &n) && skip(w, n);
  case 'l': /* LIST_EXT: elements, then the tail */
    return count(w, 4, &n) && walk_elements(w, n, depth) && walk(w, depth + 1);
  case 'm': /* BINARY_EXT */
    return count(w, 4, &n) && skip(w, n);
  case 'M': /* BIT_BINARY_EXT */
    if (!count(w, 4, &n) || !need(w, 1))
      return false;
    if (w->p[w->pos] < 1 || w->p[w->pos] > 8)
      return walk_fail(w, "a bitstring's last byte holds 1 to 8 bits");
    return skip(w, 1 + (size_t)n);
  case 'n': /* SMALL_BIG_EXT */
    return count(w, 1, &n) && skip(w, 1 + (size_t)n);
  case 'o': /* LARGE_BIG_EXT */
    return count(w, 4, &n) && skip(w, 1 + (size_t)n);
  case 't': /* MAP_EXT */
    return count(w, 4, &arity) && walk_elements(w, 2 * (uint64_t)arity, depth);
  case 'g': /* PID_EXT */
    return walk_atom(w) && skip(w, 9);
  case 'X': /* NEW_PID_EXT */
    return walk_atom(w) && skip(w, 12);
  case 'f': /* PORT_EXT */
    return walk_atom(w) && skip(w, 5);
  case 'Y': /* NEW_PORT_EXT */
    return walk_atom(w) && skip(w, 8);
  case 'x': /* V4_PORT_EXT */
    return walk_atom(w) && skip(w, 12);
  case 'e': /* REFERENCE_EXT */
    return walk_atom(w) && skip(w, 5);
  case 'r': /* NEW_REFERENCE_EXT: Len, node, 1-byte creation, Len words */
    return count(w, 2, &n) && walk_atom(w) && skip(w, 1 + 4 * (size_t)n);
  case 'Z': /* NEWER_REFERENCE_EXT: Len, node, 4-byte creation, Len words */
    return count(w, 2, &n) && walk_atom(w) && skip(w, 4 + 4 * (size_t)n);
  case 'q': /* EXPORT_EXT: module, function, arity */
    return walk_elements(w, 3, depth);
  case 'p': /* NEW_FUN_EXT: its Size counts itself, so the rest is Size - 4 */
    if (!count(w, 4, &n))
      return false;
    if (n < 4)
      return walk_fail(w, "a fun with a size below 4");
    return skip(w, n - 4);
  case 'P':
    return walk_fail(w, "compressed terms are not accepted");
  default:
    w->pos--;
    return walk_fail(w, "unknown term tag %u", (unsigned)tag);
  }
}

int ce_etf_check(const char *buf, size_t len, char *err, size_t errlen) {
  walker_t w = {(const unsigned char *)buf, len, 0, err, errlen};
  if (len == 0) {
    walk_fail(&w, "an empty packet");
    return CE_EPARSE;
  }
  if (w.p[0] != 131) { /* VERSION_MAGIC */
    walk_fail(&w, "not an external term (the first byte must be 131, not %u)",
              (unsigned)w.p[0]);
    return CE_EPARSE;
  }
  w.pos = 1;
  if (!walk(&w, 0))
    return CE_EPARSE;
  if (w.pos != len) {
    walk_fail(&w, "%zu bytes after the term", len - w.pos);
    return CE_EPARSE;
  }
  return CE_OK;
}

void ce_etf_skip(const char *buf, int *index) {
  /* The packet was checked, so the walk cannot leave it: the length only
   * has to be large enough not to stop it. */
  walker_t w = {(const unsigned char *)buf, (size_t)*index + SKIP_SPAN, (size_t)*index,
                NULL, 0};
  if (walk(&w, 0))
    *index = (int)w.pos;
}

bool ce_etf_atom(const char *buf, int *index, char *name) {
  int i = *index;
  if (ei_decode_atom_as(buf, &i, name, CE_ETF_ATOM_MAX, ERLANG_UTF8, NULL, NULL) != 0)
    return false;
  *index = i;
  return true;
}

bool ce_etf_is_atom(const char *buf, int index, const char *name) {
  char atom[CE_ETF_ATOM_MAX];
  return ce_etf_atom(buf, &index, atom) && strcmp(atom, name) == 0;
}

bool ce_etf_binary(const char *buf, int *index, const char **data, size_t *len) {
  int i = *index;
  const char *p = NULL;
  unsigned int bitoffs = 0;
  size_t nbits = 0;
  if ((unsigned char)buf[i] != ERL_BINARY_EXT ||
      ei_decode_bitstring(buf, &i, &p, &bitoffs, &nbits) != 0 || bitoffs != 0 ||
      nbits % 8 != 0)
    return false;
  *data = p;
  *len = nbits / 8;
  *index = i;
  return true;
}

bool ce_etf_key(const char *buf, int *index, char *name, size_t cap) {
  char atom[CE_ETF_ATOM_MAX];
  const char *s = NULL;
  size_t n = 0;
  if (ce_etf_atom(buf, index, atom)) {
    n = strlen(atom);
    if (n >= cap)
      return false;
    memcpy(name, atom, n + 1);
    return true;
  }
  if (ce_etf_binary(buf, index, &s, &n) && n < cap && memchr(s, '\0', n) == NULL) {
    memcpy(name, s, n);
    name[n] = '\0';
    return true;
  }
  return false;
}

char *ce_etf_string(const char *buf, int *index, size_t max, const char **why) {
  const char *s = NULL, *dummy = NULL;
  size_t n = 0;
  if (why == NULL)
    why = &dummy;
  int i = *index;
  if (!ce_etf_binary(buf, &i, &s, &n)) {
    *why = "must be a binary";
    return NULL;
  }
  if (n == 0 || n > max) {
    *why = "has the wrong length";
    return NULL;
  }
  if (memchr(s, '\0', n) != NULL) {
    *why = "contains a NUL byte";
    return NULL;
  }
  char *copy = malloc(n + 1);
  if (copy == NULL) {
    *why = "could not be copied (out of memory)";
    return NULL;
  }
  memcpy(copy, s, n);
  copy[n] = '\0';
  *index = i;
  return copy;
}

bool ce_etf_bool(const char *buf, int *index, bool *out) {
  char atom[CE_ETF_ATOM_MAX];
  int i = *index;
  if (!ce_etf_atom(buf, &i, atom) || (strcmp(atom, "true") != 0 && strcmp(atom, "false") != 0))
    return false;
  *out = atom[0] == 't';
  *index = i;
  return true;
}

bool ce_etf_u64(const char *buf, int *index, uint64_t *out) {
  int i = *index;
  EI_ULONGLONG v = 0;
  if (ei_decode_ulonglong(buf, &i, &v) != 0)
    return false;
  *out = (uint64_t)v;
  *index = i;
  return true;
}

bool ce_etf_tuple(const char *buf, int *index, int *arity) {
  int i = *index;
  if (ei_decode_tuple_header(buf, &i, arity) != 0)
    return false;
  *index = i;
  return true;
}

bool ce_etf_map(const char *buf, int *index, int *arity) {
  int i = *index;
  if (ei_decode_map_header(buf, &i, arity) != 0)
    return false;
  *index = i;
  return true;
}

int ce_etf_encode_err_code(ei_x_buff *x, int err) {
  /* "CE_EINVAL" -> "inval": the names come from one table (error.h), so a
   * new code reaches the BEAM without a second list to keep in step. */
  const char *name = ce_err_name(err);
  char atom[32];
  size_t n = 0;
  if (strncmp(name, "CE_E", 4) == 0)
    name += 4;
  for (; name[n] != '\0' && n < sizeof(atom) - 1; n++)
    atom[n] = (char)tolower((unsigned char)name[n]);
  atom[n] = '\0';
  return ei_x_encode_atom(x, atom);
}

int ce_etf_encode_text(ei_x_buff *x, const char *s) {
  return ei_x_encode_binary(x, s, (int)strlen(s));
}
