/* A TCP handle bound to 127.0.0.1 on a port the kernel picks, for tests
 * that run a small server on their own loop. */
#ifndef CE_TEST_SUPPORT_LOOPBACK_H
#define CE_TEST_SUPPORT_LOOPBACK_H

#include <stdint.h>
#include <uv.h>

/* Initialises t on loop, binds it to 127.0.0.1:0 (asserting each step)
 * and returns the port it got. The caller listens (or not). */
uint16_t ce_test_bind_loopback(uv_loop_t *loop, uv_tcp_t *t);

#endif
