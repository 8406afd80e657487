/*
 * libFuzzer target for the request path rules of docs/path-matching.md
 * (c_src/policy/path.c). The input is split at its first NUL: a path
 * pattern, then a request target.
 *
 * Beyond "no crash, no sanitizer report", it checks what the policy
 * relies on:
 *
 * - a normalised path starts with '/', is no longer than its input, holds
 *   no "//", no "." or ".." segment, no '%2F'/'%5C'/'%00' and no
 *   lower-case %-escape, and normalising it again gives it back;
 * - a normalised pattern normalises to itself;
 * - the pattern "/" "**" matches every normalised path, and every one matches
 *   itself as a pattern when it has no '*'.
 *
 * Any violation aborts, which libFuzzer reports as a crash with the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy/path.h"

static void check(int ok) {
  if (!ok)
    abort();
}

static void check_path(const char *p, size_t n) {
  check(n > 0 && p[0] == '/');
  check(memmem(p, n, "//", 2) == NULL);
  check(memmem(p, n, "/./", 3) == NULL && memmem(p, n, "/../", 4) == NULL);
  check(!(n >= 2 && memcmp(p + n - 2, "/.", 2) == 0));
  check(!(n >= 3 && memcmp(p + n - 3, "/..", 3) == 0));
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '%')
      continue;
    check(i + 2 < n);
    check(!(p[i + 1] >= 'a' && p[i + 1] <= 'f') && !(p[i + 2] >= 'a' && p[i + 2] <= 'f'));
    check(!(p[i + 1] == '2' && p[i + 2] == 'F') && !(p[i + 1] == '5' && p[i + 2] == 'C'));
    check(!(p[i + 1] == '0' && p[i + 2] == '0'));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  const char *nul = memchr(in, '\0', size);
  size_t plen = nul != NULL ? (size_t)(nul - in) : size;
  const char *target = nul != NULL ? nul + 1 : in;
  size_t tlen = nul != NULL ? size - plen - 1 : size;

  static char pat[CE_PATH_PATTERN_MAX + 1], pat2[CE_PATH_PATTERN_MAX + 1];
  static char path[CE_PATH_MAX + 1], path2[CE_PATH_MAX + 1];
  size_t pn = 0, pn2 = 0, n = 0, n2 = 0;
  ce_path_pattern_err_t err;
  int pok = ce_path_pattern_normalize(in, plen, pat, sizeof(pat), &pn, &err) == 0;
  if (pok) {
    check(err == CE_PATH_PATTERN_OK && pn <= plen && pat[pn] == '\0');
    check(ce_path_pattern_normalize(pat, pn, pat2, sizeof(pat2), &pn2, &err) == 0);
    check(pn2 == pn && memcmp(pat, pat2, pn) == 0);
  } else {
    check(err != CE_PATH_PATTERN_OK);
  }

  if (ce_path_normalize(target, tlen, path, sizeof(path), &n) != 0)
    return 0;
  check(n <= tlen && path[n] == '\0');
  check_path(path, n);
  check(ce_path_normalize(path, n, path2, sizeof(path2), &n2) == 0);
  check(n2 == n && memcmp(path, path2, n) == 0);
  check(ce_path_match("/**", 3, path, n));
  if (memchr(path, '*', n) == NULL)
    check(ce_path_match(path, n, path, n));
  if (pok)
    (void)ce_path_match(pat, pn, path, n);
  return 0;
}
