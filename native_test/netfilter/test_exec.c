/* Tests for c_src/netfilter/exec.c with ordinary programs (/bin/sh, cat):
 * input through the pipe, output captured and bounded, exit status and
 * signals, spawn failure, timeout, and no descriptor or child left behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "netfilter/exec.h"

static ce_nf_exec_result_t res;

static int sh(const char *script, const char *input, size_t n, int timeout_ms) {
  char *argv[] = {"sh", "-c", (char *)script, NULL};
  return ce_nf_exec("/bin/sh", argv, input, n, timeout_ms, &res);
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  while (readdir(d) != NULL)
    n++;
  closedir(d);
  return n;
}

Test(nf_exec, input_goes_in_output_comes_back) {
  cr_assert_eq(sh("cat; echo err >&2", "*nat\nCOMMIT\n", 12, 5000), 0);
  cr_assert_eq(res.exit_code, 0);
  cr_assert_eq(res.signal, 0);
  cr_assert_str_eq(res.output, "*nat\nCOMMIT\nerr\n");
  cr_assert_eq(res.output_len, 16);
  cr_assert_not(res.truncated);
}

Test(nf_exec, exit_status_is_reported_not_judged) {
  cr_assert_eq(sh("echo 'Permission denied (you must be root)'; exit 4", "", 0, 5000), 0);
  cr_assert_eq(res.exit_code, 4);
  cr_assert_str_eq(res.output, "Permission denied (you must be root)\n");
}

Test(nf_exec, a_signal_is_reported) {
  cr_assert_eq(sh("kill -TERM $$", "", 0, 5000), 0);
  cr_assert_eq(res.exit_code, -1);
  cr_assert_eq(res.signal, SIGTERM);
}

Test(nf_exec, large_input_to_a_child_that_does_not_read) {
  /* The child exits without reading: our write meets EPIPE, which must
   * neither kill us (SIGPIPE) nor hang us. 1 MiB is far more than a pipe
   * holds. */
  static char big[1 << 20];
  memset(big, 'x', sizeof(big));
  cr_assert_eq(sh("exit 3", big, sizeof(big), 5000), 0);
  cr_assert_eq(res.exit_code, 3);
  struct sigaction now;
  sigaction(SIGPIPE, NULL, &now);
  cr_assert_eq(now.sa_handler, SIG_DFL, "our SIGPIPE disposition is restored");
}

Test(nf_exec, the_child_gets_default_sigpipe) {
  /* Even when we ignore SIGPIPE, the child must not inherit that: a
   * child writing to a closed pipe should die as usual. */
  signal(SIGPIPE, SIG_IGN);
  cr_assert_eq(sh("grep SigIgn /proc/self/status", "", 0, 5000), 0);
  /* SIGPIPE is signal 13: bit 12 of the mask, 0x1000. */
  unsigned long mask = 0;
  const char *p = strstr(res.output, "SigIgn:");
  cr_assert_not_null(p, "%s", res.output);
  mask = strtoul(p + 7, NULL, 16);
  cr_assert_eq(mask & 0x1000, 0, "%s", res.output);
  signal(SIGPIPE, SIG_DFL);
}

Test(nf_exec, output_is_bounded_and_drained) {
  /* 1 MiB of output: kept up to the limit, the rest read and dropped so
   * the child finishes instead of blocking on a full pipe. */
  cr_assert_eq(sh("head -c 1048576 /dev/zero | tr '\\0' y; exit 0", "", 0, 10000), 0);
  cr_assert_eq(res.exit_code, 0);
  cr_assert_eq(res.output_len, CE_NF_EXEC_OUTPUT_MAX);
  cr_assert(res.truncated);
  cr_assert_eq(strlen(res.output), CE_NF_EXEC_OUTPUT_MAX);
}

Test(nf_exec, spawn_failure_names_errno) {
  char *argv[] = {"nope", NULL};
  int before = open_fds();
  cr_assert_eq(ce_nf_exec("/nonexistent/iptables-restore", argv, "x", 1, 5000, &res), CE_EIO);
  cr_assert_eq(res.spawn_errno, ENOENT);
  cr_assert_eq(open_fds(), before, "no descriptor leaks");
  char path[] = "/tmp/ce_test_exec_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  int rc = ce_nf_exec(path, argv, "", 0, 5000, &res);
  unlink(path);
  cr_assert_eq(rc, CE_EIO);
  cr_assert_eq(res.spawn_errno, EACCES, "a file without x permission");
}

Test(nf_exec, timeout_kills_and_reaps) {
  int before = open_fds();
  cr_assert_eq(sh("echo started; exec sleep 30", "", 0, 300), CE_ETIMEDOUT);
  cr_assert_eq(res.signal, SIGKILL);
  cr_assert_str_eq(res.output, "started\n");
  cr_assert_eq(open_fds(), before, "no descriptor leaks");
  /* The child was reaped: there is nothing left to wait for. */
  cr_assert_eq(waitpid(-1, NULL, WNOHANG), -1);
  cr_assert_eq(errno, ECHILD);
}

Test(nf_exec, no_descriptor_leaks_into_the_child) {
  /* The child sees 0, 1 and 2, whatever the test runner itself left
   * open without close-on-exec, and the one ls opens to read the
   * directory; our pipe ends are close-on-exec and must not appear. */
  int inherited = 0;
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d))
      continue;
    int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0)
      inherited++;
  }
  closedir(d);
  cr_assert_eq(sh("ls /proc/self/fd | wc -l", "", 0, 5000), 0);
  char want[16];
  snprintf(want, sizeof(want), "%d\n", 3 + inherited + 1);
  cr_assert_str_eq(res.output, want);
}
