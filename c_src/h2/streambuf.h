/*
 * A stream's bounded byte buffer (docs/http2.md §4): what one direction of
 * an HTTP/2 stream holds between the two sessions, at most one window.
 *
 * The bytes live in a chain of chunks. Taking from the front only moves an
 * offset and frees each chunk as soon as it is taken whole, so what is
 * allocated follows what is held (at most two chunks more than the bytes
 * fill: the partly taken first one and the partly filled last one) however the
 * buffer is drained, and bytes are never moved to make room. A chunk is
 * CE_H2BUF_CHUNK bytes, the first CE_H2BUF_HEADROOM of which are never
 * data: there is always room for a DATA frame's 9-byte header just before
 * the first bytes of a chunk, and ce_h2buf_frame() writes it there, so a
 * frame of a chunk's bytes goes out from the buffer as one piece, without
 * being copied into a frame buffer. A whole chunk's frame is one 16 KiB
 * TLS record.
 *
 * The first chunk of an empty buffer is allocated to fit (a multiple of
 * CE_H2BUF_STEP) and grows up to CE_H2BUF_CHUNK while it is the only one,
 * so a small body holds little; everything is freed as soon as the buffer
 * is empty, so an idle stream holds none.
 */
#ifndef CE_H2_STREAMBUF_H
#define CE_H2_STREAMBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An HTTP/2 frame header (RFC 9113 §4.1). */
#define CE_H2BUF_HEADROOM 9u
/* The first chunk of an empty buffer is a multiple of this. */
#define CE_H2BUF_STEP 4096u
/* A chunk's size, headroom included: a frame header and a chunk's bytes
 * make one 16 KiB TLS record. */
#define CE_H2BUF_CHUNK 16384u

typedef struct ce_h2buf_chunk {
  struct ce_h2buf_chunk *next;
  size_t size;     /* of data[], headroom included */
  size_t end;      /* bytes written end here (≥ CE_H2BUF_HEADROOM) */
  uint8_t data[];
} ce_h2buf_chunk_t;

typedef struct {
  ce_h2buf_chunk_t *head, *tail; /* NULL while empty */
  size_t off;    /* where the bytes start in head->data (≥ CE_H2BUF_HEADROOM) */
  size_t len;    /* how many, over all the chunks */
  size_t cap;    /* allocated: the chunks with their records (what a budget counts) */
  bool eof;      /* no more bytes will be put (the stream's side ended) */
} ce_h2buf_t;

/* The first byte held (meaningful while len > 0). */
static inline const uint8_t *ce_h2buf_bytes(const ce_h2buf_t *b) { return b->head->data + b->off; }

/* How many bytes from the first are contiguous (those of the first chunk). */
static inline size_t ce_h2buf_front(const ce_h2buf_t *b) { return b->head != NULL ? b->head->end - b->off : 0; }

/* Appends n bytes, keeping len ≤ max. Returns CE_OK; CE_ETOOBIG when they
 * do not fit under max; CE_ENOMEM when the room cannot be allocated. On
 * failure it holds the same bytes, in order (a failed growth of a lone
 * first chunk may have moved them to its front: ce_h2buf_bytes finds
 * them), and nothing more is allocated. */
int ce_h2buf_put(ce_h2buf_t *b, const uint8_t *p, size_t n, size_t max);

/* Copies up to cap bytes from the front into out and drops them; returns
 * how many. */
size_t ce_h2buf_take(ce_h2buf_t *b, uint8_t *out, size_t cap);

/* Drops the first n bytes (n ≤ len); each chunk taken whole is freed, an
 * emptied buffer holds no memory. */
void ce_h2buf_drop(ce_h2buf_t *b, size_t n);

/* The k-th contiguous piece of the bytes, in order: its length (0 past
 * the last piece), its first byte in *p. */
size_t ce_h2buf_piece(const ce_h2buf_t *b, size_t k, const uint8_t **p);

/* Writes the 9-byte frame header hd just before the first byte and
 * returns its first byte: the frame (header + up to ce_h2buf_front()
 * bytes) is then contiguous. Only while len > 0; the header overwrites
 * nothing held. */
uint8_t *ce_h2buf_frame(ce_h2buf_t *b, const uint8_t hd[CE_H2BUF_HEADROOM]);

/* Frees the memory of an empty buffer. */
void ce_h2buf_trim(ce_h2buf_t *b);

/* Drops everything and frees the memory (eof is kept). */
void ce_h2buf_clear(ce_h2buf_t *b);

#endif
