/* A stream's bounded byte buffer (h2/streambuf.h). */
#include "h2/streambuf.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* What a chunk of `size` costs: its record and its bytes. */
static size_t chunk_cost(size_t size) { return sizeof(ce_h2buf_chunk_t) + size; }

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* A lone first chunk smaller than CE_H2BUF_CHUNK makes room for n more
 * bytes by moving its bytes to its front, then by growing (at least
 * doubling, a multiple of CE_H2BUF_STEP, at most CE_H2BUF_CHUNK): the size
 * it is to grow to, or its size. */
static size_t lone_room(ce_h2buf_t *b, size_t n) {
  ce_h2buf_chunk_t *t = b->head;
  if (b->off > CE_H2BUF_HEADROOM) {
    memmove(t->data + CE_H2BUF_HEADROOM, t->data + b->off, b->len);
    b->off = CE_H2BUF_HEADROOM;
    t->end = CE_H2BUF_HEADROOM + b->len;
  }
  size_t need = CE_H2BUF_HEADROOM + b->len + n;
  if (need <= t->size)
    return t->size;
  size_t size = t->size * 2 > need ? t->size * 2 : need;
  return min_size((size + CE_H2BUF_STEP - 1) / CE_H2BUF_STEP * CE_H2BUF_STEP, CE_H2BUF_CHUNK);
}

static void free_chain(ce_h2buf_chunk_t *c) {
  while (c != NULL) {
    ce_h2buf_chunk_t *next = c->next;
    free(c);
    c = next;
  }
}

int ce_h2buf_put(ce_h2buf_t *b, const uint8_t *p, size_t n, size_t max) {
  if (n == 0)
    return CE_OK;
  if (b->len > max || n > max - b->len)
    return CE_ETOOBIG;
  ce_h2buf_chunk_t *t = b->tail;
  size_t grow_to = t != NULL ? t->size : 0;
  if (t != NULL && t == b->head && t->size - t->end < n && t->size < CE_H2BUF_CHUNK)
    grow_to = lone_room(b, n);
  size_t room = t != NULL ? grow_to - t->end : 0;
  /* The chunks for what does not fit behind the last one, all allocated
   * before anything changes: the first of an empty buffer fits the bytes,
   * later ones are whole. */
  ce_h2buf_chunk_t *first = NULL, *last = NULL;
  size_t added = 0;
  for (size_t more = n > room ? n - room : 0; more > 0;) {
    size_t size = CE_H2BUF_CHUNK;
    if (t == NULL && first == NULL)
      size = min_size((CE_H2BUF_HEADROOM + more + CE_H2BUF_STEP - 1) / CE_H2BUF_STEP * CE_H2BUF_STEP,
                      CE_H2BUF_CHUNK);
    ce_h2buf_chunk_t *c = malloc(chunk_cost(size));
    if (c == NULL) {
      free_chain(first);
      return CE_ENOMEM;
    }
    c->next = NULL;
    c->size = size;
    c->end = CE_H2BUF_HEADROOM;
    if (last != NULL)
      last->next = c;
    else
      first = c;
    last = c;
    added += chunk_cost(size);
    more -= min_size(size - CE_H2BUF_HEADROOM, more);
  }
  if (t != NULL && grow_to > t->size) {
    ce_h2buf_chunk_t *nt = realloc(t, chunk_cost(grow_to));
    if (nt == NULL) {
      free_chain(first);
      return CE_ENOMEM;
    }
    added += grow_to - nt->size;
    nt->size = grow_to;
    b->head = b->tail = t = nt;
  }
  size_t left = n;
  size_t k = min_size(room, left);
  if (k > 0) {
    memcpy(t->data + t->end, p, k);
    t->end += k;
    p += k;
    left -= k;
  }
  for (ce_h2buf_chunk_t *c = first; c != NULL; c = c->next) {
    k = min_size(c->size - CE_H2BUF_HEADROOM, left);
    memcpy(c->data + CE_H2BUF_HEADROOM, p, k);
    c->end = CE_H2BUF_HEADROOM + k;
    p += k;
    left -= k;
  }
  if (first != NULL) {
    if (t != NULL) {
      t->next = first;
    } else {
      b->head = first;
      b->off = CE_H2BUF_HEADROOM;
    }
    b->tail = last;
  }
  b->cap += added;
  b->len += n;
  return CE_OK;
}

void ce_h2buf_drop(ce_h2buf_t *b, size_t n) {
  if (n >= b->len) {
    ce_h2buf_clear(b);
    return;
  }
  b->len -= n;
  while (n > 0) {
    ce_h2buf_chunk_t *h = b->head;
    size_t k = h->end - b->off;
    if (n < k) {
      b->off += n;
      return;
    }
    /* Taken whole (bytes remain, so a next chunk holds them). */
    n -= k;
    b->head = h->next;
    b->off = CE_H2BUF_HEADROOM;
    b->cap -= chunk_cost(h->size);
    free(h);
  }
}

size_t ce_h2buf_piece(const ce_h2buf_t *b, size_t k, const uint8_t **p) {
  size_t off = b->off;
  for (const ce_h2buf_chunk_t *c = b->head; c != NULL; c = c->next, off = CE_H2BUF_HEADROOM) {
    if (k-- == 0) {
      *p = c->data + off;
      return c->end - off;
    }
  }
  *p = NULL;
  return 0;
}

size_t ce_h2buf_take(ce_h2buf_t *b, uint8_t *out, size_t cap) {
  size_t n = b->len < cap ? b->len : cap;
  size_t done = 0;
  const uint8_t *p;
  for (size_t k = 0; done < n; k++) {
    size_t m = min_size(ce_h2buf_piece(b, k, &p), n - done);
    memcpy(out + done, p, m);
    done += m;
  }
  ce_h2buf_drop(b, n);
  return n;
}

uint8_t *ce_h2buf_frame(ce_h2buf_t *b, const uint8_t hd[CE_H2BUF_HEADROOM]) {
  uint8_t *at = b->head->data + b->off - CE_H2BUF_HEADROOM;
  memcpy(at, hd, CE_H2BUF_HEADROOM);
  return at;
}

void ce_h2buf_trim(ce_h2buf_t *b) {
  if (b->len == 0)
    ce_h2buf_clear(b);
}

void ce_h2buf_clear(ce_h2buf_t *b) {
  while (b->head != NULL) {
    ce_h2buf_chunk_t *next = b->head->next;
    free(b->head);
    b->head = next;
  }
  b->tail = NULL;
  b->off = 0;
  b->len = 0;
  b->cap = 0;
}
