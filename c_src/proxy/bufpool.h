/*
 * Spare buffers of one size, kept for reuse (docs/proxy.md "Memory").
 *
 * A connection's input buffers are taken when bytes arrive and given back
 * as soon as they are empty, so an idle keep-alive connection holds none;
 * the pool keeps up to `keep` given-back buffers so that a busy connection
 * does not malloc and free 128 KiB per request (freeing a chunk that large
 * makes glibc consolidate its fast bins). A spare buffer holds its free-list
 * link in its first bytes; nothing else is allocated. One loop, no locks.
 */
#ifndef CE_PROXY_BUFPOOL_H
#define CE_PROXY_BUFPOOL_H

#include <stddef.h>

typedef struct ce_bufpool {
  size_t size;     /* bytes of each buffer (at least sizeof(void *)) */
  size_t keep;     /* spare buffers kept at most */
  size_t spare;    /* spare buffers held now */
  size_t out;      /* buffers handed out and not given back */
  void *free_list; /* the spares, linked through their first bytes */
} ce_bufpool_t;

/* An empty pool of `size`-byte buffers keeping at most `keep` spares. */
void ce_bufpool_init(ce_bufpool_t *p, size_t size, size_t keep);

/* A buffer of p->size bytes (its contents undefined): a spare, else a new
 * one. NULL when the allocation fails. */
void *ce_bufpool_get(ce_bufpool_t *p);

/* Gives a buffer of this pool back (NULL: nothing): kept as a spare, or
 * freed when `keep` spares are held already. */
void ce_bufpool_put(ce_bufpool_t *p, void *buf);

/* Frees the spares (the handed-out buffers are their holders'). */
void ce_bufpool_clear(ce_bufpool_t *p);

#endif
