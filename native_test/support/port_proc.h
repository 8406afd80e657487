/*
 * Test support: `condukt-egress port` as a subprocess speaking {packet, 4}
 * on pipes, as the BEAM runs it. The binary is $CONDUKT_EGRESS_BIN (the
 * test runner sets it), else priv/condukt-egress under the source root.
 *
 * Every wait has a deadline, so a test that fails cannot hang; while it
 * waits, an optional idle hook runs (a test that hosts a libuv loop, such
 * as an in-process sidecar control channel, pumps it there).
 */
#ifndef CE_TEST_SUPPORT_PORT_PROC_H
#define CE_TEST_SUPPORT_PORT_PROC_H

#include <ei.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
  pid_t pid;
  int in;   /* the port's stdin (we write) */
  int out;  /* the port's stdout (we read) */
  char err_path[64];
  void (*idle)(void *arg);
  void *idle_arg;
} ce_test_port_t;

/* Starts the port; fails the test if it cannot. */
void ce_test_port_start(ce_test_port_t *pp);

/* Writes raw bytes to the port's stdin. */
void ce_test_port_write(ce_test_port_t *pp, const void *data, size_t n);

/* Sends the term written as text (support/term.h) as one packet. */
void ce_test_port_send(ce_test_port_t *pp, const char *term_text);

/* Waits up to ms for one packet; returns the term printed as text (a new
 * string), or NULL on timeout or EOF. */
char *ce_test_port_recv(ce_test_port_t *pp, int ms);

/* Like ce_test_port_recv, but the raw packet bytes (*len set). */
char *ce_test_port_recv_raw(ce_test_port_t *pp, int ms, size_t *len);

/* Sends the request and asserts the next packet prints as `expected`. */
void ce_test_port_expect(ce_test_port_t *pp, const char *request, const char *expected);

/* Closes stdin and waits (at most ms) for the exit; returns the exit
 * status, or -1 if the port had to be killed. Frees everything. */
int ce_test_port_finish(ce_test_port_t *pp, int ms);

/* The port's stderr so far (a new string). */
char *ce_test_port_stderr(ce_test_port_t *pp);

#endif
