/*
 * A resolver the tests control. The test binary (and only it) is linked
 * with -Wl,--wrap=uv_getaddrinfo (Makefile, TEST_WRAP): our objects'
 * calls come here. A name set with ce_test_resolver_set() resolves to the
 * given IP literals, in that order (the order is the point: the Kubernetes
 * client must try each); any other name goes to libuv.
 */
#ifndef CE_TEST_SUPPORT_RESOLVER_H
#define CE_TEST_SUPPORT_RESOLVER_H

#include <stddef.h>

/* name resolves to addrs[0..n) (IPv4 or IPv6 literals); n == 0 makes it
 * fail with UV_EAI_NONAME. name NULL clears the override. */
void ce_test_resolver_set(const char *name, const char *const *addrs, size_t n);
/* How many times the overridden name was resolved. */
unsigned ce_test_resolver_calls(void);

#endif
