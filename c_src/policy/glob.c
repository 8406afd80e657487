/*
 * Host glob matching (see glob.h).
 *
 * row[j] says whether the pattern prefix consumed so far matches the first
 * j bytes of the name. Each pattern token turns the previous row into the
 * next one in a single left-to-right pass, so a pattern such as
 * "*a*a*a*a*a" against a long name costs |pattern| * |name| steps instead
 * of the exponential backtracking of a naive matcher.
 */
#include "policy/glob.h"

#include <string.h>

#include "policy/host.h"

bool ce_glob_match(const char *pat, size_t pat_len, const char *name,
                   size_t name_len) {
  /* Two rows of name_len + 1 booleans; names are bounded by the engine's
   * normalisation, so fixed arrays replace allocation. */
  unsigned char a[CE_HOST_NAME_MAX + 1];
  unsigned char b[CE_HOST_NAME_MAX + 1];
  unsigned char *prev = a, *cur = b;

  if (pat_len > CE_HOST_NAME_MAX || name_len > CE_HOST_NAME_MAX)
    return false;

  /* Literal bytes match exactly one byte each, so the text before the
   * first '*' must begin the name and the text after the last '*' must
   * end it. Checking both first rejects most names in O(n), and the DP
   * then runs only on what lies between (most policies are "*.suffix"). */
  const char *first = memchr(pat, '*', pat_len);
  if (first == NULL)
    return pat_len == name_len && memcmp(pat, name, name_len) == 0;
  size_t last = pat_len - 1;
  while (pat[last] != '*')
    last--;
  size_t head = (size_t)(first - pat);
  size_t tail = pat_len - last - 1;
  if (head + tail > name_len || memcmp(pat, name, head) != 0 ||
      memcmp(pat + last + 1, name + name_len - tail, tail) != 0)
    return false;
  pat += head;
  pat_len = last + 1 - head;
  name += head;
  name_len -= head + tail;

  memset(prev, 0, name_len + 1);
  prev[0] = 1;

  for (size_t p = 0; p < pat_len;) {
    int any = 0;
    cur[0] = 0;
    if (pat[p] == '*' && p + 1 < pat_len && pat[p + 1] == '*') {
      /* "**": one or more bytes of any kind. */
      for (size_t j = 1; j <= name_len; j++) {
        cur[j] = prev[j - 1] | cur[j - 1];
        any |= cur[j];
      }
      p += 2;
    } else if (pat[p] == '*') {
      /* '*': one or more bytes, none of them a dot. */
      for (size_t j = 1; j <= name_len; j++) {
        cur[j] = name[j - 1] != '.' && (prev[j - 1] | cur[j - 1]);
        any |= cur[j];
      }
      p += 1;
    } else {
      for (size_t j = 1; j <= name_len; j++) {
        cur[j] = prev[j - 1] && name[j - 1] == pat[p];
        any |= cur[j];
      }
      p += 1;
    }
    if (!any)
      return false;
    unsigned char *tmp = prev;
    prev = cur;
    cur = tmp;
  }
  return prev[name_len] != 0;
}
