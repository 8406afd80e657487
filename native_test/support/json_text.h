/*
 * The reference the JSON writer's tests and fuzz target compare with:
 * jansson's compact text of a string. Header-only, so that the fuzz
 * targets (linked without the test support objects) can use it.
 */
#ifndef CE_TEST_SUPPORT_JSON_TEXT_H
#define CE_TEST_SUPPORT_JSON_TEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* jansson's compact text of s[0..n) as a JSON string (malloc'd). With
 * lossy, a string that is not UTF-8 first has each byte >= 0x80 replaced
 * by U+FFFD (as the events carry such text). NULL when jansson refuses the
 * string (not lossy: not UTF-8) or memory runs out. */
static inline char *ce_test_json_text(const char *s, size_t n, bool lossy) {
  json_t *js = json_stringn(s, n);
  if (js == NULL && lossy) {
    char *fixed = malloc(3 * n + 1);
    if (fixed == NULL)
      return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      if ((unsigned char)s[i] >= 0x80) {
        memcpy(fixed + k, "\xef\xbf\xbd", 3);
        k += 3;
      } else {
        fixed[k++] = s[i];
      }
    }
    js = json_stringn(fixed, k);
    free(fixed);
  }
  if (js == NULL)
    return NULL;
  char *text = json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT);
  json_decref(js);
  return text;
}

#endif
