/*
 * Allocation-failure injection (see failalloc.h).
 *
 * The __wrap_* functions below are what our objects call for malloc & co.
 * when the test binary is linked with --wrap; __real_* is the C library's
 * (or ASan's interceptor, which is what the name resolves to under ASan),
 * so the sanitizers still see every allocation.
 */
#include "support/failalloc.h"

#include <openssl/crypto.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t nmemb, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t nmemb, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);

enum { MODE_OFF, MODE_ONE, MODE_FROM };

static atomic_int mode = MODE_OFF;
static atomic_size_t target;
static atomic_size_t counted;
static atomic_size_t failed;
static atomic_int last_source = CE_FAILALLOC_NONE;
static bool openssl_hooked;

/* Counts one allocation and says whether it must fail. */
static bool should_fail(ce_failalloc_source_t source) {
  size_t i = atomic_fetch_add(&counted, 1);
  int m = atomic_load(&mode);
  bool fail = (m == MODE_ONE && i == atomic_load(&target)) ||
              (m == MODE_FROM && i >= atomic_load(&target));
  if (fail) {
    atomic_fetch_add(&failed, 1);
    atomic_store(&last_source, (int)source);
  }
  return fail;
}

static void reset(int m, size_t n) {
  atomic_store(&mode, MODE_OFF);
  atomic_store(&counted, 0);
  atomic_store(&failed, 0);
  atomic_store(&last_source, CE_FAILALLOC_NONE);
  atomic_store(&target, n);
  atomic_store(&mode, m);
}

void ce_failalloc_arm(size_t n) { reset(MODE_ONE, n); }
void ce_failalloc_arm_from(size_t n) { reset(MODE_FROM, n); }
void ce_failalloc_disarm(void) { atomic_store(&mode, MODE_OFF); }
size_t ce_failalloc_count(void) { return atomic_load(&counted); }
size_t ce_failalloc_failures(void) { return atomic_load(&failed); }
ce_failalloc_source_t ce_failalloc_last_source(void) {
  return (ce_failalloc_source_t)atomic_load(&last_source);
}
bool ce_failalloc_openssl_hooked(void) { return openssl_hooked; }

/* ---- our objects (--wrap) ------------------------------------------------ */

void *__wrap_malloc(size_t n) {
  return should_fail(CE_FAILALLOC_LIBC) ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t nmemb, size_t n) {
  return should_fail(CE_FAILALLOC_LIBC) ? NULL : __real_calloc(nmemb, n);
}

/* realloc(p, 0) frees in glibc; it is not an allocation to fail. */
void *__wrap_realloc(void *p, size_t n) {
  if (n != 0 && should_fail(CE_FAILALLOC_LIBC))
    return NULL;
  return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s) {
  return should_fail(CE_FAILALLOC_LIBC) ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n) {
  return should_fail(CE_FAILALLOC_LIBC) ? NULL : __real_strndup(s, n);
}

/* ---- OpenSSL ------------------------------------------------------------- */

static void *ssl_malloc(size_t n, const char *file, int line) {
  return should_fail(CE_FAILALLOC_OPENSSL) ? NULL : __real_malloc(n);
}

static void *ssl_realloc(void *p, size_t n, const char *file, int line) {
  if (n != 0 && should_fail(CE_FAILALLOC_OPENSSL))
    return NULL;
  return __real_realloc(p, n);
}

static void ssl_free(void *p, const char *file, int line) { free(p); }

/* Runs before main() and before any test code: OpenSSL accepts new
 * functions only before its first allocation. */
__attribute__((constructor)) static void failalloc_install(void) {
  openssl_hooked = CRYPTO_set_mem_functions(ssl_malloc, ssl_realloc, ssl_free) == 1;
}
