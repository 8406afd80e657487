/*
 * libFuzzer target for the event writer's strings (c_src/common/jsonw.c),
 * differential against jansson. The input's first byte chooses the
 * writer's bound and how much text goes before the string; the rest is the
 * string, written with ce_jsonw_string and with ce_jsonw_string_lossy.
 * Invariants (any failure aborts):
 *   - ce_jsonw_string accepts exactly what jansson's json_stringn accepts
 *     (UTF-8), and then writes jansson's compact text byte for byte;
 *   - ce_jsonw_string_lossy always writes valid JSON: jansson's text of the
 *     string, or of the string with each byte >= 0x80 as U+FFFD when it is
 *     not UTF-8; no raw byte below 0x20 is ever written;
 *   - past the bound the writer fails with CE_ETOOBIG, exactly when the
 *     text would not fit, and never writes past it; after a failure
 *     nothing more is appended;
 *   - ce_utf8_valid agrees with jansson; nothing leaks (LSan).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "support/json_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "fuzz_jsonw: %s (line %d)\n", #cond, __LINE__); \
      abort();                                                        \
    }                                                                 \
  } while (0)

/* The reference text (support/json_text.h), its length in *len. */
static char *reference(const char *s, size_t n, bool lossy, size_t *len) {
  char *text = ce_test_json_text(s, n, lossy);
  CHECK(text != NULL || !lossy);
  if (text != NULL)
    *len = strlen(text);
  return text;
}

static void one(const char *s, size_t n, bool lossy, size_t prefix, size_t max) {
  char inline_buf[64];
  ce_jsonw_t w;
  ce_jsonw_init(&w, inline_buf, sizeof(inline_buf), max);
  for (size_t i = 0; i < prefix; i++)
    ce_jsonw_raw(&w, "[", 1);
  size_t before = w.len;
  int before_err = ce_jsonw_error(&w);
  if (lossy)
    ce_jsonw_string_lossy(&w, s, n);
  else
    ce_jsonw_string(&w, s, n);
  size_t want_len = 0;
  char *want = reference(s, n, lossy, &want_len);
  CHECK(w.len <= max);
  if (before_err != CE_OK) {
    CHECK(ce_jsonw_error(&w) == before_err && w.len == before);
  } else if (want == NULL) {
    CHECK(!lossy && ce_jsonw_error(&w) == CE_EINVAL);
  } else if (before + want_len > max) {
    CHECK(ce_jsonw_error(&w) == CE_ETOOBIG);
  } else {
    CHECK(ce_jsonw_error(&w) == CE_OK);
    CHECK(w.len - before == want_len);
    CHECK(memcmp(w.buf + before, want, want_len) == 0);
    for (size_t i = before; i < w.len; i++)
      CHECK((unsigned char)w.buf[i] >= 0x20);
  }
  /* Sticky: after a failure nothing more is appended. */
  if (ce_jsonw_error(&w) != CE_OK) {
    size_t len = w.len;
    ce_jsonw_raw(&w, "]", 1);
    ce_jsonw_string(&w, "x", 1);
    CHECK(w.len == len);
  }
  free(want);
  ce_jsonw_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  /* The bound: small ones exercise the edge, 0xff none in practice. */
  uint8_t ctl = data[0];
  size_t prefix = ctl & 7u;
  size_t max = (ctl >> 3) == 31 ? 1u << 20 : (size_t)(ctl >> 3) * 3u;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  json_t *js = json_stringn(s, n);
  CHECK(ce_utf8_valid(s, n) == (js != NULL));
  json_decref(js);
  one(s, n, false, prefix, max);
  one(s, n, true, prefix, max);
  return 0;
}
