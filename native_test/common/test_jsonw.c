/* c_src/common/jsonw.c: the bounded JSON writer of the event path. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "support/failalloc.h"
#include "support/json_text.h"

/* Writes s as a JSON string and checks the text (and that jansson reads
 * it back as the same bytes). */
static void expect_string(const char *s, size_t n, const char *want) {
  char buf[256];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), 4096);
  ce_jsonw_string(&w, s, n);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, strlen(want), "%.*s", (int)w.len, w.buf);
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s, want %s", (int)w.len, w.buf, want);
  json_t *back = json_loadb(w.buf, w.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  cr_assert_not_null(back);
  cr_assert_eq(json_string_length(back), n);
  cr_assert_eq(memcmp(json_string_value(back), s, n), 0);
  json_decref(back);
  ce_jsonw_free(&w);
}

Test(jsonw, escapes_quotes_backslash_and_control_bytes) {
  expect_string("", 0, "\"\"");
  expect_string("plain / text", 12, "\"plain / text\"");
  expect_string("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
  expect_string("\b\f\n\r\t", 5, "\"\\b\\f\\n\\r\\t\"");
  expect_string("\x01\x1f\x1b[0m", 6, "\"\\u0001\\u001F\\u001B[0m\"");
  expect_string("a\0b", 3, "\"a\\u0000b\"");
  expect_string("\x7f", 1, "\"\x7f\""); /* DEL is not a JSON control character */
}

Test(jsonw, every_byte_below_0x20_is_escaped) {
  char in[32];
  for (int i = 0; i < 32; i++)
    in[i] = (char)i;
  char buf[512];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  ce_jsonw_string(&w, in, sizeof(in));
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  for (size_t i = 0; i < w.len; i++)
    cr_assert_geq((unsigned char)w.buf[i], 0x20, "raw control byte at %zu", i);
  /* The same text jansson writes. */
  json_t *s = json_stringn(in, sizeof(in));
  char *want = json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT);
  cr_assert_eq(w.len, strlen(want));
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s\n%s", (int)w.len, w.buf, want);
  free(want);
  json_decref(s);
}

Test(jsonw, non_ascii_is_copied) {
  expect_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14,
                "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  expect_string("\xef\xbf\xbd", 3, "\"\xef\xbf\xbd\""); /* U+FFFD, the replacement */
  expect_string("\xf4\x8f\xbf\xbf", 4, "\"\xf4\x8f\xbf\xbf\""); /* U+10FFFF */
}

Test(jsonw, invalid_utf8_is_refused) {
  static const char *const bad[] = {
      "\xe9",             /* Latin-1 */
      "\x80",             /* a lone continuation byte */
      "\xc0\xaf",         /* overlong '/' */
      "\xe0\x80\xaf",     /* overlong, 3 bytes */
      "\xf0\x80\x80\xaf", /* overlong, 4 bytes */
      "\xed\xa0\x80",     /* a surrogate */
      "\xf4\x90\x80\x80", /* past U+10FFFF */
      "\xf8\x88\x80\x80\x80",
      "\xc3",             /* cut short */
      "\xe2\x82",
      "\xc3\x28",         /* not a continuation */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    cr_assert_not(ce_utf8_valid(bad[i], strlen(bad[i])), "case %zu", i);
    /* The same verdict as jansson's. */
    cr_assert_null(json_stringn(bad[i], strlen(bad[i])), "case %zu", i);
    char buf[64];
    ce_jsonw_t w;
    ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
    ce_jsonw_raw(&w, "[", 1);
    ce_jsonw_string(&w, bad[i], strlen(bad[i]));
    cr_assert_eq(ce_jsonw_error(&w), CE_EINVAL, "case %zu", i);
    size_t len = w.len;
    ce_jsonw_raw(&w, "]", 1); /* sticky: nothing more is written */
    cr_assert_eq(w.len, len);
  }
}

Test(jsonw, bounded_by_max) {
  char buf[8];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), 10);
  ce_jsonw_raw(&w, "0123456789", 10);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, 10);
  cr_assert_neq(w.buf, buf, "moved to the heap");
  ce_jsonw_raw(&w, "x", 1);
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  cr_assert_eq(w.len, 10);
  cr_assert_leq(w.cap, 10);
  ce_jsonw_free(&w);
  cr_assert_eq(w.buf, buf);

  /* An inline buffer larger than max does not lift the bound. */
  char big[64];
  ce_jsonw_init(&w, big, sizeof(big), 4);
  ce_jsonw_string(&w, "abc", 3);
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  ce_jsonw_free(&w);

  /* No inline buffer; SIZE_MAX-sized requests do not wrap. */
  ce_jsonw_init(&w, NULL, 0, 1u << 20);
  ce_jsonw_raw(&w, "ab", 2);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  volatile size_t huge = SIZE_MAX; /* not a constant the compiler checks */
  ce_jsonw_raw(&w, "x", huge);
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  ce_jsonw_free(&w);
}

Test(jsonw, numbers) {
  char buf[128];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  ce_jsonw_uint(&w, 0);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_uint(&w, UINT64_MAX);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_int(&w, INT64_MIN);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_int(&w, 42);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_int(&w, -1);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_int(&w, INT64_MAX);
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_int(&w, 0);
  const char *want = "0,18446744073709551615,-9223372036854775808,42,-1,9223372036854775807,0";
  cr_assert_eq(w.len, strlen(want));
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s", (int)w.len, w.buf);
}

Test(jsonw, values_match_jansson_and_members_skip) {
  json_t *obj = json_pack("{s:s s:[i f n b] s:{s:{}} s:[] s:s}", "type", "x", "list", 7, 0.25, 0,
                          "nested", "in", "empty", "seq", "y");
  cr_assert_not_null(obj);
  char buf[256];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  ce_jsonw_value(&w, obj);
  char *want = json_dumps(obj, JSON_COMPACT);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, strlen(want));
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s\n%s", (int)w.len, w.buf, want);
  free(want);

  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  bool first = true;
  ce_jsonw_members(&w, obj, "type", "seq", &first);
  cr_assert_not(first);
  want = "\"list\":[7,0.25,null,false],\"nested\":{\"in\":{}},\"empty\":[]";
  cr_assert_eq(w.len, strlen(want));
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s", (int)w.len, w.buf);

  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  first = true;
  json_t *arr = json_array();
  ce_jsonw_members(&w, arr, NULL, NULL, &first);
  cr_assert_eq(ce_jsonw_error(&w), CE_EINVAL);
  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  ce_jsonw_value(&w, NULL);
  cr_assert_eq(ce_jsonw_error(&w), CE_EINVAL);
  json_decref(arr);
  json_decref(obj);
}

Test(jsonw, allocation_failures) {
  /* Every growth step fails in turn; the error is CE_ENOMEM and nothing
   * leaks (LSan). */
  char pad[1000];
  memset(pad, 'x', sizeof(pad));
  for (size_t n = 0;; n++) {
    char buf[16];
    ce_jsonw_t w;
    ce_jsonw_init(&w, buf, sizeof(buf), 1u << 20);
    ce_failalloc_arm(n);
    for (int i = 0; i < 20; i++)
      ce_jsonw_string(&w, pad, sizeof(pad));
    ce_failalloc_disarm();
    int rc = ce_jsonw_error(&w);
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      cr_assert_eq(w.len, 20 * (sizeof(pad) + 2));
      ce_jsonw_free(&w);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    ce_jsonw_free(&w);
  }
}

/* Writes s with ce_jsonw_string_lossy and checks the exact text. */
static void expect_lossy(const char *s, size_t n, const char *want) {
  char buf[256];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), 4096);
  ce_jsonw_string_lossy(&w, s, n);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, strlen(want), "%.*s, want %s", (int)w.len, w.buf, want);
  cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s, want %s", (int)w.len, w.buf, want);
  json_t *back = json_loadb(w.buf, w.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  cr_assert_not_null(back, "not valid JSON: %.*s", (int)w.len, w.buf);
  json_decref(back);
  ce_jsonw_free(&w);
}

Test(jsonw, lossy_strings_replace_bytes_that_are_not_utf8) {
  /* Valid UTF-8 is written as ce_jsonw_string writes it. */
  expect_lossy("caf\xc3\xa9 \xe2\x82\xac", 9, "\"caf\xc3\xa9 \xe2\x82\xac\"");
  expect_lossy("a\"b\\\n\x01", 6, "\"a\\\"b\\\\\\n\\u0001\"");
  expect_lossy("", 0, "\"\"");
  /* Otherwise every byte >= 0x80 is U+FFFD, valid sequences included (as
   * the jansson-built events had it); the rest is escaped as usual. */
  expect_lossy("caf\xe9", 4, "\"caf\xef\xbf\xbd\"");
  expect_lossy("\xc3\xa9\xff", 3, "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
  expect_lossy("\"\xe9\x01\\", 4, "\"\\\"\xef\xbf\xbd\\u0001\\\\\"");
  expect_lossy("a\0\xc3", 3, "\"a\\u0000\xef\xbf\xbd\"");
  expect_lossy("\xed\xa0\x80", 3, "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\""); /* a surrogate */
}

Test(jsonw, lossy_strings_are_bounded) {
  /* 3 bytes out per byte in: 100 bytes of Latin-1 need 302. */
  char in[100];
  memset(in, '\xe9', sizeof(in));
  char buf[64];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), 301);
  ce_jsonw_string_lossy(&w, in, sizeof(in));
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  ce_jsonw_free(&w);
  ce_jsonw_init(&w, buf, sizeof(buf), 302);
  ce_jsonw_string_lossy(&w, in, sizeof(in));
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, 302);
  ce_jsonw_free(&w);
}

Test(jsonw, fail_is_sticky_and_first_wins) {
  char buf[64];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
  ce_jsonw_raw(&w, "{", 1);
  ce_jsonw_fail(&w, CE_OK); /* not an error: nothing changes */
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  ce_jsonw_fail(&w, CE_ETOOBIG);
  ce_jsonw_fail(&w, CE_EINVAL);
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  ce_jsonw_string_lossy(&w, "x", 1);
  ce_jsonw_raw(&w, "}", 1);
  cr_assert_eq(w.len, 1);
}

/* The validator skips 8 ASCII bytes at a time and a string with nothing to
 * escape is copied whole: a byte that matters at any position of a long
 * string (before, inside and after the 8-byte steps) still decides. */
Test(jsonw, long_strings_every_position_against_jansson) {
  static const char *const pieces[] = {
      "\xe9",         /* not UTF-8: refused (lossy: U+FFFD) */
      "\xc3\xa9",     /* valid: copied */
      "\xf0\x9f\x98", /* cut short */
      "\"",           /* escaped */
      "\\",
      "\x1f",
      "\x7f",         /* copied */
  };
  for (size_t k = 0; k < sizeof(pieces) / sizeof(pieces[0]); k++) {
    size_t plen = strlen(pieces[k]);
    for (size_t at = 0; at <= 40; at++) {
      char in[64];
      memset(in, 'a', sizeof(in));
      memcpy(in + at, pieces[k], plen);
      size_t n = at + plen + (at % 3) * 5; /* the piece at, near or at the end */
      char buf[512];
      ce_jsonw_t w;
      ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
      ce_jsonw_string(&w, in, n);
      json_t *s = json_stringn(in, n);
      cr_assert_eq(ce_utf8_valid(in, n), s != NULL, "piece %zu at %zu", k, at);
      if (s == NULL) {
        cr_assert_eq(ce_jsonw_error(&w), CE_EINVAL, "piece %zu at %zu", k, at);
      } else {
        char *want = json_dumps(s, JSON_ENCODE_ANY | JSON_COMPACT);
        cr_assert_eq(ce_jsonw_error(&w), CE_OK);
        cr_assert_eq(w.len, strlen(want), "piece %zu at %zu", k, at);
        cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%.*s\n%s", (int)w.len, w.buf, want);
        free(want);
        json_decref(s);
      }
      ce_jsonw_free(&w);
      /* Lossy: always written, always valid JSON, the ASCII kept. */
      ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
      ce_jsonw_string_lossy(&w, in, n);
      cr_assert_eq(ce_jsonw_error(&w), CE_OK);
      json_t *back = json_loadb(w.buf, w.len, JSON_DECODE_ANY, NULL);
      cr_assert_not_null(back, "piece %zu at %zu: %.*s", k, at, (int)w.len, w.buf);
      cr_assert_eq(memcmp(json_string_value(back), in, at), 0);
      json_decref(back);
      ce_jsonw_free(&w);
    }
  }
}

/* Writes s[0..n) both ways and compares with jansson's text and verdict. */
static void expect_as_jansson(const char *s, size_t n, const char *what, unsigned b, size_t at) {
  for (int lossy = 0; lossy < 2; lossy++) {
    char buf[256];
    ce_jsonw_t w;
    ce_jsonw_init(&w, buf, sizeof(buf), sizeof(buf));
    if (lossy)
      ce_jsonw_string_lossy(&w, s, n);
    else
      ce_jsonw_string(&w, s, n);
    char *want = ce_test_json_text(s, n, lossy);
    if (want == NULL) {
      cr_assert_eq(ce_jsonw_error(&w), CE_EINVAL, "%s: byte %u at %zu of %zu", what, b, at, n);
    } else {
      cr_assert_eq(ce_jsonw_error(&w), CE_OK, "%s%s: byte %u at %zu of %zu", what, lossy ? " lossy" : "", b, at, n);
      cr_assert_eq(w.len, strlen(want), "%s%s: byte %u at %zu of %zu", what, lossy ? " lossy" : "", b, at, n);
      cr_assert_eq(memcmp(w.buf, want, w.len), 0, "%s%s: byte %u at %zu of %zu", what, lossy ? " lossy" : "", b,
                   at, n);
      free(want);
    }
    ce_jsonw_free(&w);
  }
}

/* Every byte value at every position of a 16-byte string (two 8-byte
 * steps of the scan, the tail after them), after ASCII and after a valid
 * two-byte character (the scan's slower path): the same text as
 * jansson's, refused where jansson refuses; lossy, the same as jansson's
 * text of the string with U+FFFD for each byte when it is not UTF-8. */
Test(jsonw, every_byte_at_every_position_against_jansson) {
  for (unsigned b = 0; b < 256; b++) {
    for (size_t at = 0; at < 16; at++) {
      for (size_t n = at + 1; n <= 17; n += 16 - at) {
        char in[17];
        memset(in, 'x', sizeof(in));
        in[at] = (char)b;
        expect_as_jansson(in, n, "after ASCII", b, at);
        if (at >= 2) {
          memcpy(in, "\xc3\xa9", 2); /* U+00E9 first */
          expect_as_jansson(in, n, "after U+00E9", b, at);
        }
      }
    }
  }
  /* Something to escape after valid non-ASCII text. */
  expect_string("\xc3\xa9\"\n", 4, "\"\xc3\xa9\\\"\\n\"");
}

/* A plain string is written in one piece: it fits exactly when its quoted
 * form does, and a refused one leaves nothing behind (a string with
 * escapes may leave a part: the text is not used after an error). */
Test(jsonw, plain_strings_fit_exactly_or_not_at_all) {
  char buf[8];
  ce_jsonw_t w;
  ce_jsonw_init(&w, buf, sizeof(buf), 12);
  ce_jsonw_raw(&w, "[", 1);
  ce_jsonw_string(&w, "012345678", 9); /* 1 + 11 = 12 */
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.len, 12);
  cr_assert_eq(memcmp(w.buf, "[\"012345678\"", 12), 0);
  ce_jsonw_free(&w);

  ce_jsonw_init(&w, buf, sizeof(buf), 11);
  ce_jsonw_raw(&w, "[", 1);
  ce_jsonw_string_lossy(&w, "012345678", 9);
  cr_assert_eq(ce_jsonw_error(&w), CE_ETOOBIG);
  cr_assert_eq(w.len, 1);
  ce_jsonw_free(&w);

  /* Within the inline buffer: no allocation. */
  ce_jsonw_init(&w, buf, sizeof(buf), 64);
  ce_jsonw_string(&w, "abcdef", 6);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK);
  cr_assert_eq(w.buf, buf);
  ce_jsonw_free(&w);
}
