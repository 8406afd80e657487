/*
 * User-supplied text in messages (a pattern, a JSON member name, a command
 * line word) is written through ce_text_sanitize() so that one error stays
 * one readable line and cannot carry terminal control sequences.
 */
#ifndef CE_COMMON_TEXT_H
#define CE_COMMON_TEXT_H

#include <stddef.h>

/* Input bytes kept before the rest is replaced by "...". */
#define CE_TEXT_QUOTE_MAX 96

/* Writes s[0..n) into dst (cap bytes, always NUL-terminated when cap > 0):
 * control bytes, and non-ASCII bytes when s is not valid UTF-8, become \xNN;
 * '"' and '\' are escaped when in_quotes is set; past CE_TEXT_QUOTE_MAX
 * input bytes the text ends in "...". Output never exceeds cap - 1 bytes.
 * Cannot fail. */
void ce_text_sanitize(char *dst, size_t cap, const char *s, size_t n,
                      int in_quotes);

/* A subcommand's usage error on stderr, in two lines:
 *   PROG: WHAT 'WORD'            (the word sanitized)
 *   run 'PROG --help' for the options */
void ce_text_usage_error(const char *prog, const char *what, const char *word);

/* Copies the NUL-terminated src into dst (cap bytes): at most cap - 1
 * bytes, always NUL-terminated when cap > 0, as snprintf(dst, cap, "%s",
 * src) does, without the format machinery. Returns the bytes copied. */
size_t ce_text_copy(char *dst, size_t cap, const char *src);

/* The value of one hex digit (either case), or -1. */
int ce_hex_value(char c);

#endif
