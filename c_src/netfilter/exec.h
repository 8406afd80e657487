/*
 * Running the iptables programs: no shell, the input through a pipe, the
 * output captured through another, the child always reaped.
 */
#ifndef CE_NETFILTER_EXEC_H
#define CE_NETFILTER_EXEC_H

#include <stdbool.h>
#include <stddef.h>

/* Output kept from one child (stdout and stderr together). iptables says
 * what went wrong in a line or two; the rest is dropped and flagged. */
#define CE_NF_EXEC_OUTPUT_MAX 4096
/* How long one iptables program may run. They finish in milliseconds; the
 * bound is for a legacy backend waiting on the xtables lock (we pass -w 5)
 * or a program that hangs, so an init container fails instead of hanging. */
#define CE_NF_EXEC_TIMEOUT_MS 30000

typedef struct {
  /* The child's exit status, or -1 when a signal ended it. */
  int exit_code;
  /* The signal that ended it, or 0. */
  int signal;
  /* When the child could not be started: the errno of posix_spawn. */
  int spawn_errno;
  /* stdout and stderr as written, NUL-terminated; truncated when the
   * child wrote more than CE_NF_EXEC_OUTPUT_MAX bytes. */
  char output[CE_NF_EXEC_OUTPUT_MAX + 1];
  size_t output_len;
  bool truncated;
} ce_nf_exec_result_t;

/* Runs the program at path (an absolute path; PATH is not searched) with
 * argv (NULL-terminated, argv[0] included) and the current environment.
 * input[0..n) is written to its stdin, which is then closed; its stdout
 * and stderr go to res->output. The child gets the default SIGPIPE
 * disposition and an empty signal mask whatever ours are.
 *
 * Returns 0 when the child ran to its end and was reaped, whatever its
 * exit status (look at res->exit_code and res->signal);
 * CE_EIO when it could not be started (res->spawn_errno says why, e.g.
 * ENOENT or EACCES) or a pipe could not be made;
 * CE_ETIMEDOUT when it was still running after timeout_ms: it has then
 * been killed with SIGKILL and reaped.
 * In every case no child is left behind and no descriptor leaks; res is
 * always fully written. */
int ce_nf_exec(const char *path, char *const argv[], const char *input,
               size_t n, int timeout_ms, ce_nf_exec_result_t *res);

#endif
