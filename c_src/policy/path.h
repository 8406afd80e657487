/*
 * The request paths of docs/path-matching.md: normalising a request target
 * before a rule's path patterns are matched against it, validating those
 * patterns, and the path glob ('*' within one segment, '**' any number of
 * whole segments).
 *
 * Nothing here allocates: every function writes into the caller's buffer
 * or only reads.
 */
#ifndef CE_POLICY_PATH_H
#define CE_POLICY_PATH_H

#include <stdbool.h>
#include <stddef.h>

/* The longest request path (before its query) that is normalised; a longer
 * one is invalid. Normalising never lengthens a path, so a buffer of this
 * size always holds the result. */
#define CE_PATH_MAX 8192
/* The longest path pattern. */
#define CE_PATH_PATTERN_MAX 1024

/* Why a path pattern was refused (docs/path-matching.md §2). */
typedef enum {
  CE_PATH_PATTERN_OK = 0,
  CE_PATH_PATTERN_EMPTY,        /* "" */
  CE_PATH_PATTERN_TOO_LONG,     /* over CE_PATH_PATTERN_MAX bytes */
  CE_PATH_PATTERN_NOT_ABSOLUTE, /* does not start with '/' */
  CE_PATH_PATTERN_QUERY,        /* contains '?' or '#' */
  CE_PATH_PATTERN_BYTE,         /* a control, space, '\', non-ASCII byte or bad %-escape */
  CE_PATH_PATTERN_SEPARATOR,    /* an encoded '/', '\' or NUL (%2F, %5C, %00) */
  CE_PATH_PATTERN_EMPTY_SEGMENT,/* "//" */
  CE_PATH_PATTERN_DOT_SEGMENT,  /* a "." or ".." segment (also "..;x") */
  CE_PATH_PATTERN_STARS,        /* "**" inside a segment, or "***" */
} ce_path_pattern_err_t;

/* Normalises the request target in[0..len) (origin-form: it starts with
 * '/'; a query from the first '?' on is dropped) per docs/path-matching.md
 * §1 into out[0..cap), NUL-terminated, and sets *out_len.
 * Returns 0, or CE_EINVAL when the path is refused: not starting with '/',
 * a '#', a byte outside visible ASCII, a '\', a malformed %-escape, an
 * encoded '/', '\' or NUL, an empty segment ("//") before the last, a
 * "."/".." segment followed by ';' parameters, a ".." that climbs above the
 * root, or more than CE_PATH_MAX bytes before the query. cap must be at
 * least min(len, CE_PATH_MAX) + 1; a smaller cap gives CE_EINVAL. */
int ce_path_normalize(const char *in, size_t len, char *out, size_t cap, size_t *out_len);

/* Validates and normalises a path pattern in[0..len) into out[0..cap)
 * (cap >= CE_PATH_PATTERN_MAX + 1): %-escapes of unreserved characters are
 * decoded and the hex of the others upper-cased, as for a request path.
 * Returns 0, or CE_EINVAL with *err set. */
int ce_path_pattern_normalize(const char *in, size_t len, char *out, size_t cap, size_t *out_len,
                              ce_path_pattern_err_t *err);

/* The snake_case code of a pattern error ("dot_segment"), and a one-line
 * hint. Never NULL. */
const char *ce_path_pattern_err_code(ce_path_pattern_err_t err);
const char *ce_path_pattern_err_hint(ce_path_pattern_err_t err);

/* Matches the whole normalised path against a normalised pattern. '*'
 * matches any run of bytes other than '/', '**' (a whole segment) any
 * number of whole segments, including none. O(pat_len * path_len), no
 * recursion, no allocation. */
bool ce_path_match(const char *pat, size_t pat_len, const char *path, size_t path_len);

#endif
