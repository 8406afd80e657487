/* Tests for c_src/h2/streambuf.c: a stream's bounded buffer keeps its
 * bytes in order across appends and takes, never holds more than its
 * bound, allocates no more than two chunks beyond what it holds however it
 * is drained, leaves room for a frame header before its bytes, frees its
 * memory when empty, and is unchanged when an allocation fails. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "h2/streambuf.h"
#include "support/failalloc.h"

/* What a whole chunk costs (its record and its bytes). */
#define CHUNK_COST (sizeof(ce_h2buf_chunk_t) + CE_H2BUF_CHUNK)
/* At most two chunks more than the bytes fill. */
#define CAP_BOUND(len) (((len) / (CE_H2BUF_CHUNK - CE_H2BUF_HEADROOM) + 2) * CHUNK_COST)

static void pattern(uint8_t *p, size_t n, size_t from) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)((from + i) % 251);
}

/* The bytes held, walked piece by piece, equal the pattern from `from`;
 * the pieces add up to len and cap to what the chunks cost. */
static void check_contents(const ce_h2buf_t *b, size_t from) {
  const uint8_t *p;
  size_t n, total = 0, chunks = 0;
  for (size_t k = 0; (n = ce_h2buf_piece(b, k, &p)) > 0; k++) {
    uint8_t want[CE_H2BUF_CHUNK];
    cr_assert_leq(n, CE_H2BUF_CHUNK - CE_H2BUF_HEADROOM);
    pattern(want, n, from + total);
    cr_assert(memcmp(p, want, n) == 0, "piece %zu out of order", k);
    total += n;
    chunks++;
  }
  cr_assert_eq(total, b->len);
  size_t cost = 0;
  for (const ce_h2buf_chunk_t *c = b->head; c != NULL; c = c->next)
    cost += sizeof(*c) + c->size;
  cr_assert_eq(cost, b->cap, "cap counts every chunk");
}

Test(h2_streambuf, bytes_come_out_in_order_across_appends_and_takes_within_the_bound) {
  enum { MAX = 65536 };
  ce_h2buf_t b = {0};
  uint8_t in[20000], out[20000];
  size_t put = 0, got = 0;
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
    cr_assert_leq(b.cap, CAP_BOUND(b.len), "round %d: at most two chunks beyond the bytes", round);
    check_contents(&b, got);
  }
  cr_assert_eq(put - got, b.len);
  size_t t;
  while ((t = ce_h2buf_take(&b, out, sizeof(out))) > 0)
    got += t;
  cr_assert_eq(got, put);
  cr_assert_null(b.head, "an emptied buffer holds no memory");
  cr_assert_null(b.tail);
  cr_assert_eq(b.cap, 0);
}

Test(h2_streambuf, what_is_allocated_follows_what_is_held_however_the_buffer_is_drained) {
  /* A window of 1 MiB filled, then drained to its last byte, again and
   * again: a buffer whose allocation kept its high-water mark would hold
   * 1 MiB for one byte. */
  enum { MAX = 1 << 20 };
  ce_h2buf_t b = {0};
  static uint8_t in[MAX];
  size_t put = 0, got = 0;
  for (int round = 0; round < 4; round++) {
    size_t n = MAX - b.len;
    pattern(in, n, put);
    cr_assert_eq(ce_h2buf_put(&b, in, n, MAX), CE_OK);
    put += n;
    cr_assert_eq(b.len, (size_t)MAX);
    cr_assert_leq(b.cap, CAP_BOUND(b.len));
    /* The workspace takes all but one byte, a frame's worth at a time. */
    while (b.len > 1) {
      size_t k = ce_h2buf_front(&b);
      if (k >= b.len)
        k = b.len - 1;
      ce_h2buf_drop(&b, k);
      got += k;
      cr_assert_leq(b.cap, CAP_BOUND(b.len));
    }
    cr_assert_leq(b.cap, sizeof(ce_h2buf_chunk_t) + CE_H2BUF_CHUNK, "round %d: one byte holds one chunk", round);
    check_contents(&b, got);
  }
  ce_h2buf_clear(&b);
  cr_assert_eq(b.cap, 0);
}

Test(h2_streambuf, a_whole_chunk_and_its_frame_header_make_one_16k_record) {
  ce_h2buf_t b = {0};
  static uint8_t in[100000];
  pattern(in, sizeof(in), 0);
  cr_assert_eq(ce_h2buf_put(&b, in, sizeof(in), 1 << 20), CE_OK);
  size_t sent = 0;
  while (b.len > 0) {
    size_t n = ce_h2buf_front(&b);
    if (b.len > n)
      cr_assert_eq(CE_H2BUF_HEADROOM + n, 16384u, "every chunk but the last is whole");
    const uint8_t hd[CE_H2BUF_HEADROOM] = {0};
    uint8_t *wire = ce_h2buf_frame(&b, hd);
    cr_assert(memcmp(wire + CE_H2BUF_HEADROOM, in + sent, n) == 0);
    ce_h2buf_drop(&b, n);
    sent += n;
  }
  cr_assert_eq(sent, sizeof(in));
  cr_assert_null(b.head);
}

Test(h2_streambuf, a_small_body_holds_a_small_chunk) {
  ce_h2buf_t b = {0};
  uint8_t in[500];
  pattern(in, sizeof(in), 0);
  cr_assert_eq(ce_h2buf_put(&b, in, sizeof(in), 65535), CE_OK);
  cr_assert_eq(b.cap, sizeof(ce_h2buf_chunk_t) + CE_H2BUF_STEP);
  /* It grows while it is the only chunk (doubling), up to a whole one. */
  uint8_t more[6000];
  pattern(more, sizeof(more), sizeof(in));
  cr_assert_eq(ce_h2buf_put(&b, more, sizeof(more), 65535), CE_OK);
  cr_assert_eq(b.cap, sizeof(ce_h2buf_chunk_t) + 2 * CE_H2BUF_STEP);
  cr_assert_eq(b.head, b.tail);
  check_contents(&b, 0);
  ce_h2buf_clear(&b);
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
  cr_assert_eq(b.cap, sizeof(ce_h2buf_chunk_t) + CE_H2BUF_STEP);
  ce_h2buf_clear(&b);
  cr_assert_null(b.head);
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

Test(h2_streambuf, a_lone_small_chunk_moves_its_bytes_back_instead_of_growing) {
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
  static uint8_t in[60000];
  pattern(in, sizeof(in), 0);
  /* The first allocation fails: still empty, nothing held. */
  ce_failalloc_arm(0);
  int rc = ce_h2buf_put(&b, in, 100, 65536);
  ce_failalloc_disarm();
  cr_assert_eq(rc, CE_ENOMEM);
  cr_assert_null(b.head);
  cr_assert_eq(b.len, 0);
  cr_assert_eq(b.cap, 0);
  /* A growth of the lone chunk fails: the bytes held are still there, in order. */
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
  check_contents(&b, 40);
  /* Several chunks are needed and one of them cannot be had: none is
   * kept, nothing is appended (LSan finds what would leak). */
  for (int n = 0;; n++) {
    size_t len = b.len, cap = b.cap;
    ce_failalloc_arm(n);
    rc = ce_h2buf_put(&b, in + 10000, 50000, 65536);
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      cr_assert_geq(n, 3, "three more chunks were needed");
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM);
    cr_assert_eq(b.len, len);
    cr_assert_eq(b.cap, cap);
    check_contents(&b, 40);
  }
  check_contents(&b, 40);
  ce_h2buf_clear(&b);
}
