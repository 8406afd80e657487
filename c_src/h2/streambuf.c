/* A stream's bounded byte buffer (h2/streambuf.h). */
#include "h2/streambuf.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* Moves the bytes back to just after the headroom. */
static void compact(ce_h2buf_t *b) {
  if (b->off == CE_H2BUF_HEADROOM)
    return;
  memmove(b->data + CE_H2BUF_HEADROOM, b->data + b->off, b->len);
  b->off = CE_H2BUF_HEADROOM;
}

int ce_h2buf_put(ce_h2buf_t *b, const uint8_t *p, size_t n, size_t max) {
  if (n == 0)
    return CE_OK;
  if (b->len > max || n > max - b->len)
    return CE_ETOOBIG;
  size_t need = CE_H2BUF_HEADROOM + b->len + n;
  if (b->data != NULL && b->off + b->len + n > b->cap && need <= b->cap)
    compact(b);
  if (need > b->cap) {
    size_t limit = CE_H2BUF_HEADROOM + max;
    size_t cap = b->cap * 2 > need ? b->cap * 2 : need;
    cap = (cap + CE_H2BUF_STEP - 1) / CE_H2BUF_STEP * CE_H2BUF_STEP;
    if (cap > limit)
      cap = limit;
    if (b->data != NULL)
      compact(b);
    uint8_t *nb = realloc(b->data, cap);
    if (nb == NULL)
      return CE_ENOMEM;
    if (b->data == NULL)
      b->off = CE_H2BUF_HEADROOM;
    b->data = nb;
    b->cap = cap;
  }
  memcpy(b->data + b->off + b->len, p, n);
  b->len += n;
  return CE_OK;
}

void ce_h2buf_drop(ce_h2buf_t *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    ce_h2buf_trim(b);
    return;
  }
  b->off += n;
  b->len -= n;
}

size_t ce_h2buf_take(ce_h2buf_t *b, uint8_t *out, size_t cap) {
  size_t n = b->len < cap ? b->len : cap;
  if (n == 0)
    return 0;
  memcpy(out, b->data + b->off, n);
  ce_h2buf_drop(b, n);
  return n;
}

uint8_t *ce_h2buf_frame(ce_h2buf_t *b, const uint8_t hd[CE_H2BUF_HEADROOM]) {
  uint8_t *at = b->data + b->off - CE_H2BUF_HEADROOM;
  memcpy(at, hd, CE_H2BUF_HEADROOM);
  return at;
}

void ce_h2buf_trim(ce_h2buf_t *b) {
  if (b->len == 0 && b->data != NULL) {
    free(b->data);
    b->data = NULL;
    b->cap = 0;
    b->off = 0;
  }
}

void ce_h2buf_clear(ce_h2buf_t *b) {
  b->len = 0;
  ce_h2buf_trim(b);
}
