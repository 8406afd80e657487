#include <criterion/criterion.h>
#include <string.h>

#include "common/text.h"

Test(text, control_bytes_and_quotes_are_escaped) {
  char out[64];
  ce_text_sanitize(out, sizeof(out), "a\x1b[31m\"b\\", 9, 1);
  cr_assert_str_eq(out, "a\\x1b[31m\\\"b\\\\");
  ce_text_sanitize(out, sizeof(out), "a\"b", 3, 0);
  cr_assert_str_eq(out, "a\"b");
}

Test(text, invalid_utf8_becomes_hex_valid_utf8_stays) {
  char out[64];
  ce_text_sanitize(out, sizeof(out), "\xff\xfe", 2, 0);
  cr_assert_str_eq(out, "\\xff\\xfe");
  ce_text_sanitize(out, sizeof(out), "b\xc3\xbc", 3, 0);
  cr_assert_str_eq(out, "b\xc3\xbc");
}

Test(text, long_input_is_cut_with_an_ellipsis_and_never_overflows) {
  char in[300];
  memset(in, 'x', sizeof(in));
  char out[4 * CE_TEXT_QUOTE_MAX + 8];
  ce_text_sanitize(out, sizeof(out), in, sizeof(in), 0);
  cr_assert_eq(strlen(out), CE_TEXT_QUOTE_MAX + 3);
  cr_assert_str_eq(out + CE_TEXT_QUOTE_MAX, "...");

  char tiny[4];
  ce_text_sanitize(tiny, sizeof(tiny), in, sizeof(in), 0);
  cr_assert_lt(strlen(tiny), sizeof(tiny));
  ce_text_sanitize(tiny, 0, in, sizeof(in), 0); /* must not write */
}

Test(text, copy_is_bounded_and_terminated_like_snprintf) {
  char buf[6];
  memset(buf, 'x', sizeof(buf));
  cr_expect_eq(ce_text_copy(buf, sizeof(buf), "abc"), 3);
  cr_expect_str_eq(buf, "abc");
  cr_expect_eq(ce_text_copy(buf, sizeof(buf), "abcdefgh"), 5); /* cut to cap - 1 */
  cr_expect_str_eq(buf, "abcde");
  cr_expect_eq(ce_text_copy(buf, sizeof(buf), ""), 0);
  cr_expect_str_eq(buf, "");
  cr_expect_eq(ce_text_copy(buf, 1, "abc"), 0); /* room for the NUL only */
  cr_expect_str_eq(buf, "");
  buf[0] = 'q';
  cr_expect_eq(ce_text_copy(buf, 0, "abc"), 0); /* no room: nothing written */
  cr_expect_eq(buf[0], 'q');
}
