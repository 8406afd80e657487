#include "common/text.h"

#include <stdio.h>
#include <string.h>

#include <unistr.h>

void ce_text_sanitize(char *dst, size_t cap, const char *s, size_t n,
                      int in_quotes) {
  static const char hex[] = "0123456789abcdef";
  if (cap == 0)
    return;
  int utf8 = u8_check((const uint8_t *)s, n) == NULL;
  size_t o = 0, i = 0;
  size_t limit = n > CE_TEXT_QUOTE_MAX ? CE_TEXT_QUOTE_MAX : n;

  /* Never cut a UTF-8 sequence in half. */
  if (utf8 && limit < n) {
    while (limit > 0 && ((unsigned char)s[limit] & 0xC0) == 0x80)
      limit--;
  }
  for (i = 0; i < limit && o + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (in_quotes && (c == '"' || c == '\\')) {
      dst[o++] = '\\';
      dst[o++] = (char)c;
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8)) {
      dst[o++] = '\\';
      dst[o++] = 'x';
      dst[o++] = hex[c >> 4];
      dst[o++] = hex[c & 0xf];
    } else {
      dst[o++] = (char)c;
    }
  }
  if (i < n && o + 4 < cap) {
    memcpy(dst + o, "...", 3);
    o += 3;
  }
  dst[o] = '\0';
}


void ce_text_usage_error(const char *prog, const char *what, const char *word) {
  char shown[4 * CE_TEXT_QUOTE_MAX + 8];
  ce_text_sanitize(shown, sizeof(shown), word, strlen(word), 0);
  fprintf(stderr, "%s: %s '%s'\n", prog, what, shown);
  fprintf(stderr, "run '%s --help' for the options\n", prog);
}

size_t ce_text_copy(char *dst, size_t cap, const char *src) {
  if (cap == 0)
    return 0;
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
  return n;
}

int ce_hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}
