#include "netfilter/exec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"

extern char **environ;

/* Interval between checks for the child's exit once its output is closed
 * (a child can close stdout and stderr before it exits). */
#define NF__REAP_POLL_MS 5

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void close_fd(int *fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

static void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0)
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static void record_status(ce_nf_exec_result_t *res, int status) {
  if (WIFEXITED(status)) {
    res->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    res->exit_code = -1;
    res->signal = WTERMSIG(status);
  }
}

/* Keeps what fits in the result, drops the rest but keeps reading, so
 * the child never blocks on a full pipe. Returns 0 at EOF, 1 when more may
 * come. */
static int drain(int fd, ce_nf_exec_result_t *res) {
  char chunk[512];
  for (;;) {
    ssize_t r = read(fd, chunk, sizeof(chunk));
    if (r == 0)
      return 0;
    if (r < 0)
      return errno == EINTR || errno == EAGAIN ? 1 : 0;
    size_t room = CE_NF_EXEC_OUTPUT_MAX - res->output_len;
    size_t keep = (size_t)r < room ? (size_t)r : room;
    memcpy(res->output + res->output_len, chunk, keep);
    res->output_len += keep;
    res->output[res->output_len] = '\0';
    if (keep < (size_t)r)
      res->truncated = true;
  }
}

int ce_nf_exec(const char *path, char *const argv[], const char *input,
               size_t n, int timeout_ms, ce_nf_exec_result_t *res) {
  memset(res, 0, sizeof(*res));
  res->exit_code = -1;

  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0)
    goto fail_pipe;
  if (pipe2(out, O_CLOEXEC) != 0)
    goto fail_pipe;

  /* A child that exits before reading all of its input would make our
   * write raise SIGPIPE and kill the whole command; with SIGPIPE ignored
   * the write fails with EPIPE instead, which we expect. The old
   * disposition is restored before returning. */
  struct sigaction ignore, old_pipe;
  memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &old_pipe);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  /* dup2 onto 0, 1 and 2 clears close-on-exec there; the originals keep
   * it, so the child holds exactly one end of each pipe. */
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDERR_FILENO);
  /* An ignored signal stays ignored across exec, so the child would
   * inherit our SIG_IGN for SIGPIPE without this. */
  sigset_t defaults, empty;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  pid_t pid;
  int rc = posix_spawn(&pid, path, &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close_fd(&in[0]);
  close_fd(&out[1]);
  if (rc != 0) {
    res->spawn_errno = rc;
    close_fd(&in[1]);
    close_fd(&out[0]);
    sigaction(SIGPIPE, &old_pipe, NULL);
    return CE_EIO;
  }

  set_nonblocking(in[1]);
  set_nonblocking(out[0]);
  size_t written = 0;
  if (n == 0)
    close_fd(&in[1]);

  const long long deadline = now_ms() + timeout_ms;
  int result = 0, status = 0, reaped = 0, gone = 0;
  while (out[0] >= 0 || in[1] >= 0) {
    long long left = deadline - now_ms();
    if (left <= 0) {
      result = CE_ETIMEDOUT;
      break;
    }
    struct pollfd pfd[2];
    nfds_t np = 0;
    if (out[0] >= 0)
      pfd[np++] = (struct pollfd){.fd = out[0], .events = POLLIN};
    if (in[1] >= 0)
      pfd[np++] = (struct pollfd){.fd = in[1], .events = POLLOUT};
    int pr = poll(pfd, np, (int)left);
    if (pr < 0 && errno != EINTR) {
      result = CE_EIO;
      break;
    }
    if (pr <= 0)
      continue;
    for (nfds_t i = 0; i < np; i++) {
      if (pfd[i].revents == 0)
        continue;
      if (pfd[i].fd == out[0]) {
        if (drain(out[0], res) == 0)
          close_fd(&out[0]);
      } else {
        ssize_t w = write(in[1], input + written, n - written);
        if (w > 0)
          written += (size_t)w;
        /* EPIPE: the child closed its stdin; whatever it did not read,
         * its exit status will tell. */
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == n)
          close_fd(&in[1]);
      }
    }
  }
  close_fd(&in[1]);
  close_fd(&out[0]);

  while (result == 0 && !reaped) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      reaped = 1;
    } else if (w < 0 && errno != EINTR) {
      /* ECHILD: someone else reaped it (SIGCHLD ignored by our caller).
       * There is no status to report and no pid left to kill. */
      result = CE_EIO;
      gone = 1;
    } else if (now_ms() >= deadline) {
      result = CE_ETIMEDOUT;
    } else {
      poll(NULL, 0, NF__REAP_POLL_MS);
    }
  }
  if (!reaped && !gone) {
    /* Timed out: never leave it running. */
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
      ;
  }
  if (!gone)
    record_status(res, status);
  sigaction(SIGPIPE, &old_pipe, NULL);
  return result;

fail_pipe:
  res->spawn_errno = errno;
  close_fd(&out[0]);
  close_fd(&out[1]);
  close_fd(&in[0]);
  close_fd(&in[1]);
  return CE_EIO;
}
