/* Tests for the fault injector itself (native_test/support/failalloc.c):
 * if it silently stopped failing, every allocation-failure test would pass
 * without testing anything. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "support/failalloc.h"

Test(failalloc, fails_exactly_the_nth_allocation) {
  ce_failalloc_arm(2);
  void *a = malloc(8);
  char *b = strdup("x");
  void *c = calloc(1, 8);
  char *d = strndup("xy", 1);
  ce_failalloc_disarm();
  cr_expect_not_null(a);
  cr_expect_not_null(b);
  cr_expect_null(c);
  cr_expect_not_null(d);
  cr_expect_eq(ce_failalloc_count(), 4);
  cr_expect_eq(ce_failalloc_failures(), 1);
  cr_expect_eq(ce_failalloc_last_source(), CE_FAILALLOC_LIBC);
  free(a);
  free(b);
  free(d);
}

Test(failalloc, arm_from_fails_every_later_allocation) {
  void *p = malloc(4);
  ce_failalloc_arm_from(1);
  void *a = malloc(8);
  void *q = realloc(p, 64);
  void *c = malloc(8);
  ce_failalloc_disarm();
  cr_expect_not_null(a);
  cr_expect_null(c);
  cr_expect_eq(ce_failalloc_failures(), 2);
  void *e = malloc(8);
  cr_expect_not_null(e);
  free(a);
  free(q != NULL ? q : p); /* q is NULL, so p is still ours */
  free(e);
}

/* Through c_src/common/json.c's allocator, which also raises its flag. */
Test(failalloc, jansson_goes_through_the_counter) {
  ce_json_oom_reset();
  ce_failalloc_arm(0);
  json_t *s = json_string("abc");
  ce_failalloc_disarm();
  cr_expect_null(s);
  cr_expect_eq(ce_failalloc_last_source(), CE_FAILALLOC_LIBC);
  cr_expect(ce_json_oom());
}

Test(failalloc, openssl_goes_through_the_counter) {
  cr_assert(ce_failalloc_openssl_hooked(),
            "CRYPTO_set_mem_functions was refused: OpenSSL allocated before the constructor");
  ce_failalloc_arm(0);
  void *p = OPENSSL_malloc(16);
  ce_failalloc_disarm();
  cr_expect_null(p);
  cr_expect_eq(ce_failalloc_last_source(), CE_FAILALLOC_OPENSSL);
}
