/* Tests for c_src/h2/streambuf.c: a stream's bounded buffer keeps its
 * bytes in order across appends and takes, never holds more than its
 * bound, leaves room for a frame header before its bytes, frees its
 * memory when empty, and is unchanged when an allocation fails. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "h2/streambuf.h"
#include "support/failalloc.h"

static void pattern(uint8_t *p, size_t n, size_t from) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)((from + i) % 251);
}

Test(h2_streambuf, bytes_come_out_in_order_across_appends_and_takes_within_the_bound) {
  enum { MAX = 65536 };
  ce_h2buf_t b = {0};
  uint8_t in[20000], out[20000];
  size_t put = 0, got = 0;
  /* Appends of 7,000 and takes of 5,000: the front moves, the bytes are
   * moved back only when the tail has no room. */
  for (int round = 0; round < 200; round++) {
    size_t n = 7000;
    if (b.len + n <= MAX) {
      pattern(in, n, put);
      cr_assert_eq(ce_h2buf_put(&b, in, n, MAX), CE_OK);
      put += n;
    }
    size_t t = ce_h2buf_take(&b, out, 5000);
    uint8_t want[5000];
    pattern(want, t, got);
    cr_assert(memcmp(out, want, t) == 0, "round %d: bytes out of order", round);
    got += t;
    cr_assert_leq(b.len, MAX);
    cr_assert_leq(b.cap, MAX + CE_H2BUF_HEADROOM, "the allocation stays within the bound and the headroom");
    cr_assert_eq(b.cap % CE_H2BUF_STEP == 0 || b.cap == MAX + CE_H2BUF_HEADROOM, true);
    cr_assert_geq(b.off, CE_H2BUF_HEADROOM);
  }
  cr_assert_eq(put - got, b.len);
  size_t t;
  while ((t = ce_h2buf_take(&b, out, sizeof(out))) > 0)
    got += t;
  cr_assert_eq(got, put);
  cr_assert_null(b.data, "an emptied buffer holds no memory");
  cr_assert_eq(b.cap, 0);
}

Test(h2_streambuf, more_than_the_bound_is_refused_and_changes_nothing) {
  ce_h2buf_t b = {0};
  uint8_t in[100];
  pattern(in, sizeof(in), 0);
  cr_assert_eq(ce_h2buf_put(&b, in, 60, 100), CE_OK);
  cr_assert_eq(ce_h2buf_put(&b, in, 41, 100), CE_ETOOBIG);
  cr_assert_eq(b.len, 60);
  cr_assert_eq(ce_h2buf_put(&b, in, 40, 100), CE_OK, "exactly the bound fits");
  cr_assert_eq(b.len, 100);
  cr_assert_eq(ce_h2buf_put(&b, in, 1, 100), CE_ETOOBIG);
  cr_assert_eq(ce_h2buf_put(&b, in, 0, 100), CE_OK, "nothing always fits");
  cr_assert_leq(b.cap, 100 + CE_H2BUF_HEADROOM);
  ce_h2buf_clear(&b);
  cr_assert_null(b.data);
  cr_assert_eq(b.len, 0);
}

Test(h2_streambuf, a_frame_header_goes_just_before_the_bytes_without_touching_them) {
  ce_h2buf_t b = {0};
  uint8_t in[300];
  pattern(in, sizeof(in), 0);
  cr_assert_eq(ce_h2buf_put(&b, in, sizeof(in), 1000), CE_OK);
  ce_h2buf_drop(&b, 100); /* the header then overwrites taken bytes */
  for (int k = 0; k < 2; k++) {
    const uint8_t hd[CE_H2BUF_HEADROOM] = {0, 0, 200, 0, 0, 0, 0, 0, (uint8_t)(1 + k)};
    uint8_t *wire = ce_h2buf_frame(&b, hd);
    cr_assert(memcmp(wire, hd, sizeof(hd)) == 0);
    cr_assert_eq(wire + CE_H2BUF_HEADROOM, ce_h2buf_bytes(&b), "the frame is contiguous");
    cr_assert(memcmp(ce_h2buf_bytes(&b), in + 100, 200) == 0, "the bytes are intact");
    /* A buffer whose front was never taken: the header goes in the headroom. */
    ce_h2buf_clear(&b);
    cr_assert_eq(ce_h2buf_put(&b, in + 100, 200, 1000), CE_OK);
  }
  ce_h2buf_clear(&b);
}

Test(h2_streambuf, appending_behind_a_taken_front_moves_the_bytes_back_instead_of_growing) {
  ce_h2buf_t b = {0};
  uint8_t in[4096];
  pattern(in, sizeof(in), 0);
  cr_assert_eq(ce_h2buf_put(&b, in, 4000, 8192), CE_OK);
  size_t cap = b.cap;
  ce_h2buf_drop(&b, 3000);
  cr_assert_eq(b.off, CE_H2BUF_HEADROOM + 3000);
  cr_assert_eq(ce_h2buf_put(&b, in + 4000, 96, 8192), CE_OK);
  cr_assert_eq(b.cap, cap, "room behind the bytes after moving them: no growth");
  cr_assert_eq(b.off, CE_H2BUF_HEADROOM, "moved back to the front");
  cr_assert(memcmp(ce_h2buf_bytes(&b), in + 3000, 1096) == 0);
  ce_h2buf_clear(&b);
}

Test(h2_streambuf, a_failed_allocation_leaves_the_buffer_as_it_was) {
  ce_h2buf_t b = {0};
  uint8_t in[10000];
  pattern(in, sizeof(in), 0);
  /* The first allocation fails: still empty, nothing held. */
  ce_failalloc_arm(0);
  int rc = ce_h2buf_put(&b, in, 100, 65536);
  ce_failalloc_disarm();
  cr_assert_eq(rc, CE_ENOMEM);
  cr_assert_null(b.data);
  cr_assert_eq(b.len, 0);
  cr_assert_eq(b.cap, 0);
  /* A growth fails: the bytes held are still there, in order. */
  cr_assert_eq(ce_h2buf_put(&b, in, 100, 65536), CE_OK);
  ce_h2buf_drop(&b, 40);
  ce_failalloc_arm(0);
  rc = ce_h2buf_put(&b, in + 100, 9900, 65536);
  ce_failalloc_disarm();
  cr_assert_eq(rc, CE_ENOMEM);
  cr_assert_eq(ce_failalloc_failures(), 1);
  cr_assert_eq(b.len, 60);
  cr_assert(memcmp(ce_h2buf_bytes(&b), in + 40, 60) == 0);
  cr_assert_eq(ce_h2buf_put(&b, in + 100, 9900, 65536), CE_OK, "and it grows once memory is there");
  cr_assert(memcmp(ce_h2buf_bytes(&b), in + 40, 9960) == 0);
  ce_h2buf_clear(&b);
}
