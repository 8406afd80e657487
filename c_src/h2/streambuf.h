/*
 * A stream's bounded byte buffer (docs/http2.md §4): what one direction of
 * an HTTP/2 stream holds between the two sessions, at most one window.
 *
 * The bytes are data[off, off + len). Taking from the front only moves
 * `off` (no memmove per DATA frame); the bytes are moved back to the
 * front only when an append finds no room behind them. The first
 * CE_H2BUF_HEADROOM bytes of the allocation are never data, so there is
 * always room for a DATA frame's 9-byte header just before the bytes:
 * ce_h2buf_frame() writes it there and the frame goes out from the
 * buffer as one piece, without being copied into a frame buffer.
 *
 * Memory is allocated as bytes come (a multiple of CE_H2BUF_STEP, at
 * least doubling, never more than headroom + max) and freed as soon as
 * the buffer is empty, so an idle stream holds none.
 */
#ifndef CE_H2_STREAMBUF_H
#define CE_H2_STREAMBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An HTTP/2 frame header (RFC 9113 §4.1). */
#define CE_H2BUF_HEADROOM 9u
/* Allocations are multiples of this. */
#define CE_H2BUF_STEP 4096u

typedef struct {
  uint8_t *data; /* cap bytes, NULL while empty */
  size_t off;    /* where the bytes start (≥ CE_H2BUF_HEADROOM once allocated) */
  size_t len;    /* how many */
  size_t cap;    /* allocated, headroom included (what a budget counts) */
  bool eof;      /* no more bytes will be put (the stream's side ended) */
} ce_h2buf_t;

/* The first byte held (meaningful while len > 0). */
static inline const uint8_t *ce_h2buf_bytes(const ce_h2buf_t *b) { return b->data + b->off; }

/* Appends n bytes, keeping len ≤ max. Returns CE_OK; CE_ETOOBIG when they
 * do not fit under max; CE_ENOMEM when the room cannot be allocated. On
 * failure it holds the same bytes, which CE_ENOMEM may have moved to the
 * front (ce_h2buf_bytes finds them). */
int ce_h2buf_put(ce_h2buf_t *b, const uint8_t *p, size_t n, size_t max);

/* Copies up to cap bytes from the front into out and drops them; returns
 * how many. */
size_t ce_h2buf_take(ce_h2buf_t *b, uint8_t *out, size_t cap);

/* Drops the first n bytes (n ≤ len); an emptied buffer is freed. */
void ce_h2buf_drop(ce_h2buf_t *b, size_t n);

/* Writes the 9-byte frame header hd just before the bytes and returns its
 * first byte: the frame (header + the first bytes held) is then
 * contiguous. Only while len > 0; the header overwrites nothing held. */
uint8_t *ce_h2buf_frame(ce_h2buf_t *b, const uint8_t hd[CE_H2BUF_HEADROOM]);

/* Frees the memory of an empty buffer. */
void ce_h2buf_trim(ce_h2buf_t *b);

/* Drops everything and frees the memory (eof is kept). */
void ce_h2buf_clear(ce_h2buf_t *b);

#endif
