/*
 * Allocation-failure injection for the Criterion tests (STYLE.md:
 * "Allocation failures are tested, not assumed away", after nghttp2's
 * failmalloc_test.c).
 *
 * Every allocation the code under test makes goes through one counter:
 *   - malloc, calloc, realloc, strdup and strndup called from our own
 *     objects, because the test binary (and only it) is linked with
 *     -Wl,--wrap=... for each (Makefile, TEST_WRAP);
 *   - jansson's allocations, because c_src/common/json.c gives jansson an
 *     allocator that calls malloc from our objects;
 *   - OpenSSL's allocations, through CRYPTO_set_mem_functions(), installed
 *     by a constructor before OpenSSL allocates anything (it refuses once it
 *     has). ce_failalloc_openssl_hooked() says whether that worked.
 * Allocations made inside other shared libraries (libunistring, libuv,
 * glibc's own) are not seen: --wrap only rewrites references in the objects
 * being linked.
 *
 * While disarmed nothing fails. Criterion runs each test in its own
 * process, so the state is per test; it is atomic because a few units
 * under test start threads.
 *
 * The usual loop: for n = 0, 1, 2, ... arm(n), run the operation, and
 * check that it either hit the injected failure and reported CE_ENOMEM
 * (leaving no state behind: LSan checks at exit), or hit none and
 * succeeded, which ends the loop.
 */
#ifndef CE_TEST_SUPPORT_FAILALLOC_H
#define CE_TEST_SUPPORT_FAILALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* Where the failed allocation came from (ce_failalloc_last_source). */
typedef enum {
  CE_FAILALLOC_NONE = 0,
  CE_FAILALLOC_LIBC,   /* our objects (jansson included): malloc & co. */
  CE_FAILALLOC_OPENSSL /* OpenSSL, through CRYPTO_set_mem_functions */
} ce_failalloc_source_t;

/* Fails the n-th allocation from now (counting from 0) and only that one. */
void ce_failalloc_arm(size_t n);

/* Fails the n-th allocation from now and every one after it. */
void ce_failalloc_arm_from(size_t n);

/* Stops failing; the counters keep their values until the next arm. */
void ce_failalloc_disarm(void);

/* Allocations counted since the last arm (whether or not armed now). */
size_t ce_failalloc_count(void);

/* How many allocations were made to fail since the last arm. */
size_t ce_failalloc_failures(void);

/* The source of the last injected failure since the last arm. */
ce_failalloc_source_t ce_failalloc_last_source(void);

/* True when OpenSSL's allocator is routed through the counter. */
bool ce_failalloc_openssl_hooked(void);

#endif
