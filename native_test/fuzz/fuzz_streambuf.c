/*
 * libFuzzer target for the HTTP/2 stream buffer (c_src/h2/streambuf.c),
 * against a model: the input is a sequence of operations (append, drop,
 * take, frame, clear) and the bytes that go in are a known pattern, so
 * every byte that comes out can be checked. Invariants (any failure
 * aborts):
 *   - the bytes come out whole and in order, whichever way they are taken
 *     (piece by piece, copied, after a frame header was written before
 *     them);
 *   - the buffer never holds more than its bound, and an append past it is
 *     refused without a change;
 *   - cap is exactly what the chunks cost, and never more than the chunks
 *     the bytes fill plus two (what a drained buffer keeps follows what it
 *     holds);
 *   - a frame's bytes are contiguous and at most one chunk's;
 *   - an empty buffer holds no memory; nothing leaks (LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "h2/streambuf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "fuzz_streambuf: %s (line %d)\n", #cond, __LINE__); \
      abort();                                                       \
    }                                                                \
  } while (0)

#define MAX (1u << 18) /* a quarter of the window: sixteen chunks and more, four times the runs */
#define CHUNK_COST (sizeof(ce_h2buf_chunk_t) + CE_H2BUF_CHUNK)

static uint8_t pat(size_t i) { return (uint8_t)(i % 251u); }

/* Every byte held equals the pattern from `from`; cap is what the chunks cost. */
static void check(const ce_h2buf_t *b, size_t from) {
  const uint8_t *p;
  size_t n, total = 0;
  for (size_t k = 0; (n = ce_h2buf_piece(b, k, &p)) > 0; k++) {
    CHECK(n <= CE_H2BUF_CHUNK - CE_H2BUF_HEADROOM);
    for (size_t i = 0; i < n; i++)
      CHECK(p[i] == pat(from + total + i));
    total += n;
  }
  CHECK(total == b->len);
  CHECK(b->len <= MAX);
  size_t cost = 0;
  for (const ce_h2buf_chunk_t *c = b->head; c != NULL; c = c->next) {
    CHECK(c->size <= CE_H2BUF_CHUNK && c->end <= c->size && c->end >= CE_H2BUF_HEADROOM);
    cost += sizeof(*c) + c->size;
  }
  CHECK(cost == b->cap);
  CHECK(b->cap <= (b->len / (CE_H2BUF_CHUNK - CE_H2BUF_HEADROOM) + 2) * CHUNK_COST);
  if (b->len == 0)
    CHECK(b->head == NULL && b->tail == NULL && b->cap == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t in[MAX + 1], out[MAX];
  ce_h2buf_t b = {0};
  size_t put = 0, got = 0; /* pattern positions of the next byte in and out */
  for (size_t i = 0; i + 3 <= size; i += 3) {
    uint8_t op = data[i] % 5;
    /* 0..65535, or scaled up to the bound for large appends. */
    size_t n = (size_t)data[i + 1] << 8 | data[i + 2];
    if (op == 0 && (data[i] & 0x80))
      n *= 16;
    switch (op) {
    case 0: { /* append */
      if (n > MAX + 1)
        n = MAX + 1;
      for (size_t k = 0; k < n; k++)
        in[k] = pat(put + k);
      size_t len = b.len, cap = b.cap;
      int rc = ce_h2buf_put(&b, in, n, MAX);
      if (len + n > MAX) {
        CHECK(rc == CE_ETOOBIG);
        CHECK(b.len == len && b.cap == cap);
      } else {
        CHECK(rc == CE_OK);
        put += n;
      }
      break;
    }
    case 1: /* drop */
      n = b.len == 0 ? 0 : n % (b.len + 1);
      ce_h2buf_drop(&b, n);
      got += n;
      break;
    case 2: { /* take */
      size_t t = ce_h2buf_take(&b, out, n);
      CHECK(t <= n);
      for (size_t k = 0; k < t; k++)
        CHECK(out[k] == pat(got + k));
      got += t;
      break;
    }
    case 3: /* a frame of the first chunk's bytes, then they are taken */
      if (b.len > 0) {
        const uint8_t hd[CE_H2BUF_HEADROOM] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        size_t front = ce_h2buf_front(&b);
        CHECK(front > 0 && front <= b.len);
        uint8_t *wire = ce_h2buf_frame(&b, hd);
        CHECK(memcmp(wire, hd, sizeof(hd)) == 0);
        CHECK(wire + CE_H2BUF_HEADROOM == ce_h2buf_bytes(&b));
        size_t k = n % (front + 1);
        for (size_t j = 0; j < k; j++)
          CHECK(wire[CE_H2BUF_HEADROOM + j] == pat(got + j));
        ce_h2buf_drop(&b, k);
        got += k;
      }
      break;
    default: /* clear (eof kept) */
      b.eof = true;
      ce_h2buf_clear(&b);
      CHECK(b.eof);
      got = put;
      break;
    }
    CHECK(put - got == b.len);
    check(&b, got);
  }
  ce_h2buf_clear(&b);
  return 0;
}
