/* Spare buffers of one size (bufpool.h). */
#include "proxy/bufpool.h"

#include <stdlib.h>
#include <string.h>

void ce_bufpool_init(ce_bufpool_t *p, size_t size, size_t keep) {
  memset(p, 0, sizeof(*p));
  p->size = size < sizeof(void *) ? sizeof(void *) : size;
  p->keep = keep;
}

void *ce_bufpool_get(ce_bufpool_t *p) {
  void *b = p->free_list;
  if (b != NULL) {
    memcpy(&p->free_list, b, sizeof(void *));
    p->spare--;
  } else {
    b = malloc(p->size);
    if (b == NULL)
      return NULL;
  }
  p->out++;
  return b;
}

void ce_bufpool_put(ce_bufpool_t *p, void *buf) {
  if (buf == NULL)
    return;
  if (p->out > 0)
    p->out--;
  if (p->spare >= p->keep) {
    free(buf);
    return;
  }
  memcpy(buf, &p->free_list, sizeof(void *));
  p->free_list = buf;
  p->spare++;
}

void ce_bufpool_clear(ce_bufpool_t *p) {
  while (p->free_list != NULL) {
    void *b = p->free_list;
    memcpy(&p->free_list, b, sizeof(void *));
    free(b);
  }
  p->spare = 0;
}
