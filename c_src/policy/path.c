/*
 * Request path normalisation and the path glob (see path.h and
 * docs/path-matching.md).
 *
 * Normalising is two passes over bounded buffers: the first decodes the
 * %-escapes of unreserved characters (and refuses the spellings that
 * servers read differently), the second walks the segments, removing dot
 * segments per RFC 3986 §5.2.4 and refusing a climb above the root.
 */
#include "policy/path.h"

#include <stdint.h>
#include <string.h>

#include "common/error.h"
#include "common/text.h"


/* RFC 3986 §2.3. */
static bool unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

/* Pass 1: in[0..len) (no query) into out, which has room for len bytes.
 * Returns the error class, CE_PATH_PATTERN_OK on success. */
static ce_path_pattern_err_t decode(const char *in, size_t len, char *out, size_t *out_len) {
  static const char HEX[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char b = (unsigned char)in[i];
    if (b == '#' || b == '?')
      return CE_PATH_PATTERN_QUERY;
    if (b <= 0x20 || b >= 0x7f || b == '\\')
      return CE_PATH_PATTERN_BYTE;
    if (b != '%') {
      out[o++] = (char)b;
      continue;
    }
    int hi = i + 2 < len ? ce_hex_value(in[i + 1]) : -1;
    int lo = i + 2 < len ? ce_hex_value(in[i + 2]) : -1;
    if (hi < 0 || lo < 0)
      return CE_PATH_PATTERN_BYTE;
    unsigned char v = (unsigned char)(hi * 16 + lo);
    i += 2;
    if (v == '/' || v == '\\' || v == 0)
      return CE_PATH_PATTERN_SEPARATOR;
    if (unreserved(v)) {
      out[o++] = (char)v;
    } else {
      out[o++] = '%';
      out[o++] = HEX[v >> 4];
      out[o++] = HEX[v & 15];
    }
  }
  *out_len = o;
  return CE_PATH_PATTERN_OK;
}

static bool seg_is(const char *s, size_t n, const char *lit) {
  return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* "." or ".." followed by ';' parameters: some servers drop the parameters
 * and then read a dot segment ("/a/..;/b"). */
static bool dot_with_params(const char *s, size_t n) {
  return (n >= 2 && s[0] == '.' && s[1] == ';') || (n >= 3 && s[0] == '.' && s[1] == '.' && s[2] == ';');
}

/* Pass 2 in place on buf[0..len) (which starts with '/'): dot segments
 * removed. Pattern mode refuses dot segments outright. */
static ce_path_pattern_err_t segments(char *buf, size_t len, bool pattern, size_t *out_len) {
  size_t o = 0; /* output length; the output never overtakes the input */
  bool trailing = false;
  size_t i = 1;
  for (;;) {
    size_t start = i;
    while (i < len && buf[i] != '/')
      i++;
    const char *s = buf + start;
    size_t n = i - start;
    bool last = i >= len;
    if (n == 0) {
      if (!last)
        return CE_PATH_PATTERN_EMPTY_SEGMENT;
      trailing = true;
    } else if (seg_is(s, n, ".") || seg_is(s, n, "..")) {
      if (pattern)
        return CE_PATH_PATTERN_DOT_SEGMENT;
      if (n == 2) {
        if (o == 0)
          return CE_PATH_PATTERN_DOT_SEGMENT; /* above the root */
        while (buf[o - 1] != '/')
          o--;
        o--; /* and the '/' before the segment */
      }
      trailing = true;
    } else if (dot_with_params(s, n)) {
      return CE_PATH_PATTERN_DOT_SEGMENT;
    } else {
      buf[o++] = '/';
      memmove(buf + o, s, n);
      o += n;
      trailing = false;
    }
    if (last)
      break;
    i++; /* past the '/' */
  }
  if (o == 0 || trailing)
    buf[o++] = '/';
  *out_len = o;
  return CE_PATH_PATTERN_OK;
}

int ce_path_normalize(const char *in, size_t len, char *out, size_t cap, size_t *out_len) {
  const char *q = memchr(in, '?', len);
  if (q != NULL)
    len = (size_t)(q - in);
  if (len == 0 || in[0] != '/' || len > CE_PATH_MAX || cap < len + 1)
    return CE_EINVAL;
  size_t n;
  if (decode(in, len, out, &n) != CE_PATH_PATTERN_OK)
    return CE_EINVAL;
  if (segments(out, n, false, &n) != CE_PATH_PATTERN_OK)
    return CE_EINVAL;
  out[n] = '\0';
  *out_len = n;
  return 0;
}

int ce_path_pattern_normalize(const char *in, size_t len, char *out, size_t cap, size_t *out_len,
                              ce_path_pattern_err_t *err) {
  ce_path_pattern_err_t e = CE_PATH_PATTERN_OK;
  size_t n = 0;
  if (len == 0)
    e = CE_PATH_PATTERN_EMPTY;
  else if (len > CE_PATH_PATTERN_MAX || cap < len + 1)
    e = CE_PATH_PATTERN_TOO_LONG;
  else if (in[0] != '/')
    e = CE_PATH_PATTERN_NOT_ABSOLUTE;
  if (e == CE_PATH_PATTERN_OK)
    e = decode(in, len, out, &n);
  if (e == CE_PATH_PATTERN_OK)
    e = segments(out, n, true, &n);
  /* '**' is a whole segment; "***" has no meaning. */
  for (size_t i = 0; e == CE_PATH_PATTERN_OK && i + 1 < n; i++) {
    if (out[i] != '*' || out[i + 1] != '*')
      continue;
    bool whole = out[i - 1] == '/' && (i + 2 == n || out[i + 2] == '/');
    if (!whole)
      e = CE_PATH_PATTERN_STARS;
    i++;
  }
  *err = e;
  if (e != CE_PATH_PATTERN_OK)
    return CE_EINVAL;
  out[n] = '\0';
  *out_len = n;
  return 0;
}

const char *ce_path_pattern_err_code(ce_path_pattern_err_t err) {
  switch (err) {
  case CE_PATH_PATTERN_OK:
    return "ok";
  case CE_PATH_PATTERN_EMPTY:
    return "empty";
  case CE_PATH_PATTERN_TOO_LONG:
    return "too_long";
  case CE_PATH_PATTERN_NOT_ABSOLUTE:
    return "not_absolute";
  case CE_PATH_PATTERN_QUERY:
    return "query";
  case CE_PATH_PATTERN_BYTE:
    return "invalid_byte";
  case CE_PATH_PATTERN_SEPARATOR:
    return "encoded_separator";
  case CE_PATH_PATTERN_EMPTY_SEGMENT:
    return "empty_segment";
  case CE_PATH_PATTERN_DOT_SEGMENT:
    return "dot_segment";
  case CE_PATH_PATTERN_STARS:
    return "stars";
  default:
    return "unknown";
  }
}

const char *ce_path_pattern_err_hint(ce_path_pattern_err_t err) {
  switch (err) {
  case CE_PATH_PATTERN_OK:
    return "valid";
  case CE_PATH_PATTERN_EMPTY:
    return "a path pattern cannot be empty; \"/**\" matches every path";
  case CE_PATH_PATTERN_TOO_LONG:
    return "a path pattern is at most 1024 bytes";
  case CE_PATH_PATTERN_NOT_ABSOLUTE:
    return "a path pattern starts with '/'";
  case CE_PATH_PATTERN_QUERY:
    return "a path pattern has no query or fragment: the query is never matched";
  case CE_PATH_PATTERN_BYTE:
    return "write visible ASCII only, no '\\', and %-escapes as '%' and two hex digits";
  case CE_PATH_PATTERN_SEPARATOR:
    return "%2F, %5C and %00 are refused in request paths, so a pattern cannot name them";
  case CE_PATH_PATTERN_EMPTY_SEGMENT:
    return "\"//\" is refused in request paths, so a pattern cannot name it";
  case CE_PATH_PATTERN_DOT_SEGMENT:
    return "request paths are matched with \".\" and \"..\" removed; write the path they lead to";
  case CE_PATH_PATTERN_STARS:
    return "\"**\" must be a whole segment (\"/a/**\"); use '*' inside a segment";
  default:
    return "unknown error";
  }
}

/* '*' matches any run of bytes (the caller hands one segment, which has no
 * '/'). The greedy walk with one backtrack point is exact for a single kind
 * of star. */
static bool seg_match(const char *p, size_t pn, const char *s, size_t sn) {
  size_t pi = 0, si = 0, star = SIZE_MAX, mark = 0;
  while (si < sn) {
    if (pi < pn && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < pn && p[pi] == s[si]) {
      pi++;
      si++;
    } else if (star != SIZE_MAX) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < pn && p[pi] == '*')
    pi++;
  return pi == pn;
}

/* The end of the segment starting at i. */
static size_t seg_end(const char *s, size_t n, size_t i) {
  while (i < n && s[i] != '/')
    i++;
  return i;
}

/* Segments are the spans after each '/'; a position past the last one is
 * n + 1. The same walk as seg_match, one level up, with '**' as the star. */
bool ce_path_match(const char *pat, size_t pn, const char *path, size_t sn) {
  if (pn == 0 || sn == 0 || pat[0] != '/' || path[0] != '/')
    return false;
  size_t pi = 1, si = 1, star = SIZE_MAX, mark = 0;
  while (si <= sn) {
    size_t se = seg_end(path, sn, si);
    size_t pe = pi <= pn ? seg_end(pat, pn, pi) : pi;
    if (pi <= pn && pe - pi == 2 && pat[pi] == '*' && pat[pi + 1] == '*') {
      star = pi;
      mark = si;
      pi = pe + 1;
    } else if (pi <= pn && seg_match(pat + pi, pe - pi, path + si, se - si)) {
      pi = pe + 1;
      si = se + 1;
    } else if (star != SIZE_MAX) {
      pi = star + 3; /* past "**" and its '/' (or the end) */
      mark = seg_end(path, sn, mark) + 1;
      si = mark;
    } else {
      return false;
    }
  }
  while (pi <= pn && seg_end(pat, pn, pi) - pi == 2 && pat[pi] == '*' && pat[pi + 1] == '*')
    pi += 3;
  return pi > pn;
}
