/* The proxy's pool of input buffers (proxy/bufpool.h): buffers are handed
 * out, kept as spares up to the bound, reused without allocating, and a
 * failed allocation is reported as NULL with nothing held. */
#include <criterion/criterion.h>
#include <string.h>

#include "proxy/bufpool.h"
#include "support/failalloc.h"

Test(bufpool, reuses_spares_without_allocating) {
  ce_bufpool_t p;
  ce_bufpool_init(&p, 128u * 1024u, 2);
  char *a = ce_bufpool_get(&p);
  cr_assert_not_null(a);
  memset(a, 'x', 128u * 1024u); /* the whole size is usable */
  cr_expect_eq(p.out, 1);
  ce_bufpool_put(&p, a);
  cr_expect_eq(p.out, 0);
  cr_expect_eq(p.spare, 1);

  /* A spare comes back without an allocation, even when every one fails. */
  ce_failalloc_arm_from(0);
  char *b = ce_bufpool_get(&p);
  ce_failalloc_disarm();
  cr_expect_eq(b, a);
  cr_expect_eq(ce_failalloc_count(), 0);
  cr_expect_eq(p.spare, 0);
  ce_bufpool_put(&p, b);
  ce_bufpool_clear(&p);
  cr_expect_eq(p.spare, 0);
}

Test(bufpool, keeps_at_most_keep_spares) {
  ce_bufpool_t p;
  ce_bufpool_init(&p, 4096, 2);
  void *b[5];
  for (size_t i = 0; i < 5; i++) {
    b[i] = ce_bufpool_get(&p);
    cr_assert_not_null(b[i]);
  }
  cr_expect_eq(p.out, 5);
  for (size_t i = 0; i < 5; i++)
    ce_bufpool_put(&p, b[i]);
  cr_expect_eq(p.out, 0);
  cr_expect_eq(p.spare, 2, "%zu spares", p.spare); /* the other three were freed (LSan) */
  /* LIFO: the last buffer kept (the second given back) comes out first. */
  void *x = ce_bufpool_get(&p);
  cr_expect_eq(x, b[1]);
  ce_bufpool_put(&p, x);
  ce_bufpool_put(&p, NULL); /* nothing */
  cr_expect_eq(p.spare, 2);
  ce_bufpool_clear(&p);
}

Test(bufpool, a_failed_allocation_is_null_and_holds_nothing) {
  ce_bufpool_t p;
  ce_bufpool_init(&p, 64u * 1024u, 4);
  ce_failalloc_arm(0);
  void *b = ce_bufpool_get(&p);
  ce_failalloc_disarm();
  cr_expect_null(b);
  cr_expect_eq(ce_failalloc_failures(), 1);
  cr_expect_eq(p.out, 0);
  cr_expect_eq(p.spare, 0);
  /* The pool works again once memory does. */
  b = ce_bufpool_get(&p);
  cr_assert_not_null(b);
  ce_bufpool_put(&p, b);
  ce_bufpool_clear(&p);
}

Test(bufpool, a_size_below_a_pointer_still_holds_the_link) {
  ce_bufpool_t p;
  ce_bufpool_init(&p, 1, 1);
  cr_expect_geq(p.size, sizeof(void *));
  void *b = ce_bufpool_get(&p);
  cr_assert_not_null(b);
  ce_bufpool_put(&p, b);
  cr_expect_eq(ce_bufpool_get(&p), b);
  ce_bufpool_put(&p, b);
  ce_bufpool_clear(&p);
}
