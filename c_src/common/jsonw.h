/*
 * A bounded JSON text writer (compact, as jansson's JSON_COMPACT writes).
 *
 * The event path encodes several events per request; jansson's dump walks
 * a value twice to size it exactly and allocates for its loop detection
 * (bench/README.md, "Where the sidecar's time goes"). This writer appends
 * to one buffer in one pass: it starts in a buffer the caller provides
 * (usually on the stack) and moves to the heap only when that is
 * outgrown, never past `max` bytes.
 *
 * Every string goes through ce_jsonw_string(): it refuses text that is not
 * valid UTF-8 (as jansson's json_stringn does) and escapes '"', '\' and
 * every byte below 0x20 (\b \f \n \r \t, otherwise \u00XX), so a raw
 * newline never appears inside a value; everything else is copied as is.
 *
 * Errors are sticky: after the first one (CE_ETOOBIG past max, CE_ENOMEM,
 * CE_EINVAL for a string that is not UTF-8 or a value that cannot be
 * written) every call does nothing, and ce_jsonw_error() reports it.
 * The text written before a failure is not to be used (a string that did
 * not fit may have been written in part).
 */
#ifndef CE_COMMON_JSONW_H
#define CE_COMMON_JSONW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/error.h"

/* Containers nested deeper than this are refused (CE_EINVAL): it bounds
 * the recursion, and therefore also rules out reference cycles. */
#define CE_JSONW_MAX_DEPTH 64

typedef struct {
  char *buf;        /* the caller's inline buffer, or a heap one */
  size_t len;
  size_t cap;
  size_t max;       /* the text never grows past this many bytes */
  char *inline_buf; /* the caller's; never freed */
  size_t inline_cap;
  int err;          /* CE_OK until the first failure */
} ce_jsonw_t;

/* inline_buf (inline_cap bytes) may be NULL with inline_cap 0. */
void ce_jsonw_init(ce_jsonw_t *w, char *inline_buf, size_t inline_cap, size_t max);

/* Frees a heap buffer; the writer is empty afterwards. */
void ce_jsonw_free(ce_jsonw_t *w);

int ce_jsonw_error(const ce_jsonw_t *w);

/* The path of ce_jsonw_raw that grows the buffer (or fails). */
void ce_jsonw_raw_grow(ce_jsonw_t *w, const char *s, size_t n);

/* Appends n bytes as they are (punctuation, pre-encoded JSON). Inline:
 * an event appends some sixty short pieces, most of them literals whose
 * copy the compiler writes out. */
static inline void ce_jsonw_raw(ce_jsonw_t *w, const char *s, size_t n) {
  if (w->err == CE_OK && n <= w->cap - w->len) {
    if (n > 0)
      memcpy(w->buf + w->len, s, n);
    w->len += n;
    return;
  }
  ce_jsonw_raw_grow(w, s, n);
}

/* Appends s[0..n) as a quoted, escaped JSON string; CE_EINVAL unless the
 * bytes are valid UTF-8 (no overlong forms, no surrogates, at most
 * U+10FFFF). NUL bytes are written as \u0000. */
void ce_jsonw_string(ce_jsonw_t *w, const char *s, size_t n);

/* As ce_jsonw_string, but text that is not valid UTF-8 is written with
 * each byte >= 0x80 as U+FFFD (the bytes below 0x80 as they are, escaped)
 * instead of being refused: header values are bytes (obs-text), and the
 * event that carries them must still be valid JSON. */
void ce_jsonw_string_lossy(ce_jsonw_t *w, const char *s, size_t n);

/* Sets the sticky error (err != CE_OK; the first error wins): a caller
 * that writes members through a callback fails the whole text with it. */
void ce_jsonw_fail(ce_jsonw_t *w, int err);

void ce_jsonw_int(ce_jsonw_t *w, int64_t v);
void ce_jsonw_uint(ce_jsonw_t *w, uint64_t v);

/* Appends a jansson value (any type; reals in jansson's own notation). */
void ce_jsonw_value(ce_jsonw_t *w, const json_t *v);

/* Appends ,"name":value for each member of obj except those named skip1
 * or skip2 (either may be NULL); *first says whether no member has been
 * written yet in the enclosing object (no leading comma then) and is
 * updated. CE_EINVAL when obj is not an object. */
void ce_jsonw_members(ce_jsonw_t *w, const json_t *obj, const char *skip1,
                      const char *skip2, bool *first);

/* True when s[0..n) is valid UTF-8 (the check ce_jsonw_string makes). */
bool ce_utf8_valid(const char *s, size_t n);

#endif
