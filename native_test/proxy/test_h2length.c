/* Tests for h2__length (c_src/proxy/http2/server.c): a content-length
 * value of a request or an h2 upstream's response, as its digits or -1. */
#include <criterion/criterion.h>

#include "proxy/http2/h2_internal.h"

Test(h2length, digits_are_the_length) {
  cr_assert_eq(h2__length("0", 1), 0);
  cr_assert_eq(h2__length("440", 3), 440);
  cr_assert_eq(h2__length("4401", 3), 440, "only the value's own bytes count");
  cr_assert_eq(h2__length("999999999999999999", 18), 999999999999999999LL);
}

Test(h2length, anything_else_is_none) {
  cr_assert_eq(h2__length("", 0), -1);
  cr_assert_eq(h2__length("1000000000000000000", 19), -1, "more than 18 digits");
  cr_assert_eq(h2__length("12a", 3), -1);
  cr_assert_eq(h2__length("-1", 2), -1);
  cr_assert_eq(h2__length(" 1", 2), -1);
  cr_assert_eq(h2__length("1,1", 3), -1);
}
