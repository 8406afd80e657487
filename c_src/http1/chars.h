/*
 * Byte classes of the HTTP grammar (RFC 9110 §5.6, RFC 9112 §5), shared by
 * the parser and the writer so that what one refuses the other never
 * produces. Internal to http1/ (hence the ce__ prefix).
 */
#ifndef CE_HTTP1_CHARS_H
#define CE_HTTP1_CHARS_H

#include <stdbool.h>
#include <stddef.h>

/* tchar (RFC 9110 §5.6.2): the bytes of a token, such as a method or a
 * field name. */
static inline bool ce__h1_is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
    return true;
  switch (c) {
  case '!': case '#': case '$': case '%': case '&': case '\'': case '*':
  case '+': case '-': case '.': case '^': case '_': case '`': case '|':
  case '~':
    return true;
  default:
    return false;
  }
}

/* field-vchar (RFC 9110 §5.5): VCHAR or obs-text, that is every byte but
 * the controls, SP and DEL. */
static inline bool ce__h1_is_field_vchar(unsigned char c) {
  return c > 0x20 && c != 0x7f;
}

/* OWS and BWS are made of SP and HTAB (RFC 9110 §5.6.3). */
static inline bool ce__h1_is_ows(unsigned char c) { return c == ' ' || c == '\t'; }

static inline bool ce__h1_is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline unsigned char ce__h1_lower(unsigned char c) {
  return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* Case-insensitive comparison of s[0..n) with the NUL-terminated lower-case
 * literal lit (field names and most protocol tokens are case-insensitive,
 * RFC 9110 §5.1). */
static inline bool ce__h1_ieq(const char *s, size_t n, const char *lit) {
  size_t i = 0;
  for (; i < n; i++) {
    if (lit[i] == '\0' || ce__h1_lower((unsigned char)s[i]) != (unsigned char)lit[i])
      return false;
  }
  return lit[i] == '\0';
}

/* True when s[0..n) is a non-empty token. */
static inline bool ce__h1_is_token(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++) {
    if (!ce__h1_is_tchar((unsigned char)s[i]))
      return false;
  }
  return true;
}

/*
 * Steps through the elements of a comma-separated list (the #rule of
 * RFC 9110 §5.6.1) in v[0..n), starting at *pos. Empty elements are skipped,
 * as that section requires recipients to do; each element comes back with
 * its surrounding OWS removed. Returns false when no element is left.
 * Quoted strings are not understood: callers only use it on lists whose
 * elements cannot contain a comma (tokens, "token/token", "100-continue")
 * and refuse any element that is not of that form.
 */
static inline bool ce__h1_list_next(const char *v, size_t n, size_t *pos,
                                    const char **el, size_t *el_len) {
  while (*pos < n) {
    size_t start = *pos;
    size_t end = start;
    while (end < n && v[end] != ',')
      end++;
    *pos = end < n ? end + 1 : n;
    while (start < end && ce__h1_is_ows((unsigned char)v[start]))
      start++;
    while (end > start && ce__h1_is_ows((unsigned char)v[end - 1]))
      end--;
    if (end > start) {
      *el = v + start;
      *el_len = end - start;
      return true;
    }
  }
  return false;
}

#endif
