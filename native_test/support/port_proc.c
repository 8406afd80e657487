#include "support/port_proc.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/term.h"

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ce_test_port_start(ce_test_port_t *pp) {
  memset(pp, 0, sizeof(*pp));
  const char *bin = getenv("CONDUKT_EGRESS_BIN");
  static char fallback[512];
  if (bin == NULL || bin[0] == '\0') {
    snprintf(fallback, sizeof(fallback), "%s/priv/condukt-egress", CE_SOURCE_ROOT);
    bin = fallback;
  }
  strcpy(pp->err_path, "/tmp/ce_test_port_err_XXXXXX");
  int efd = mkstemp(pp->err_path);
  cr_assert(efd >= 0);
  int to_port[2], from_port[2];
  cr_assert_eq(pipe2(to_port, O_CLOEXEC), 0);
  cr_assert_eq(pipe2(from_port, O_CLOEXEC), 0);
  /* A port that exits must not kill the test with SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    if (dup2(to_port[0], 0) < 0 || dup2(from_port[1], 1) < 0 || dup2(efd, 2) < 0)
      _exit(127);
    execl(bin, bin, "port", (char *)NULL);
    _exit(127);
  }
  close(efd);
  close(to_port[0]);
  close(from_port[1]);
  pp->pid = pid;
  pp->in = to_port[1];
  pp->out = from_port[0];
}

void ce_test_port_write(ce_test_port_t *pp, const void *data, size_t n) {
  const char *p = data;
  long long end = now_ms() + 10000;
  while (n > 0) {
    struct pollfd pfd = {pp->in, POLLOUT, 0};
    if (pp->idle != NULL)
      pp->idle(pp->idle_arg);
    if (poll(&pfd, 1, 5) <= 0) {
      cr_assert(now_ms() < end, "the port does not read its stdin");
      continue;
    }
    ssize_t w = write(pp->in, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    cr_assert(w > 0, "write to the port: %s", strerror(errno));
    p += w;
    n -= (size_t)w;
  }
}

void ce_test_port_send(ce_test_port_t *pp, const char *term_text) {
  ei_x_buff x;
  ce_test_term(&x, term_text);
  unsigned char h[4] = {(unsigned char)(x.index >> 24), (unsigned char)(x.index >> 16),
                        (unsigned char)(x.index >> 8), (unsigned char)x.index};
  ce_test_port_write(pp, h, 4);
  ce_test_port_write(pp, x.buff, (size_t)x.index);
  ei_x_free(&x);
}

/* Reads exactly n bytes before the deadline; false on timeout or EOF. */
static bool read_full(ce_test_port_t *pp, char *buf, size_t n, long long end) {
  size_t have = 0;
  while (have < n) {
    if (pp->idle != NULL)
      pp->idle(pp->idle_arg);
    struct pollfd pfd = {pp->out, POLLIN, 0};
    int rc = poll(&pfd, 1, pp->idle != NULL ? 2 : 20);
    if (rc <= 0) {
      if (now_ms() >= end)
        return false;
      continue;
    }
    ssize_t r = read(pp->out, buf + have, n - have);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    have += (size_t)r;
  }
  return true;
}

char *ce_test_port_recv_raw(ce_test_port_t *pp, int ms, size_t *len) {
  long long end = now_ms() + ms;
  unsigned char h[4];
  if (!read_full(pp, (char *)h, 4, end))
    return NULL;
  size_t n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
  char *buf = malloc(n + 1);
  /* A packet is written at once: its body follows its header. */
  cr_assert(read_full(pp, buf, n, end + 5000), "a packet's body did not follow its header");
  *len = n;
  return buf;
}

char *ce_test_port_recv(ce_test_port_t *pp, int ms) {
  size_t n = 0;
  char *buf = ce_test_port_recv_raw(pp, ms, &n);
  if (buf == NULL)
    return NULL;
  char *s = ce_test_term_str(buf, n);
  free(buf);
  return s;
}

void ce_test_port_expect(ce_test_port_t *pp, const char *request, const char *expected) {
  ce_test_port_send(pp, request);
  char *got = ce_test_port_recv(pp, 10000);
  cr_assert_not_null(got, "no answer to %s", request);
  /* Copied and freed before asserting: a failed assertion leaves the
   * function, and LeakSanitizer would report the string. */
  char shown[2048];
  snprintf(shown, sizeof(shown), "%s", got);
  bool same = strcmp(got, expected) == 0;
  free(got);
  cr_assert(same, "for %s\n     got: %s\nexpected: %s", request, shown, expected);
}

char *ce_test_port_stderr(ce_test_port_t *pp) {
  FILE *f = fopen(pp->err_path, "r");
  char *s = calloc(1, 65536);
  if (f != NULL) {
    size_t n = fread(s, 1, 65535, f);
    s[n] = '\0';
    fclose(f);
  }
  return s;
}

int ce_test_port_finish(ce_test_port_t *pp, int ms) {
  if (pp->in >= 0)
    close(pp->in);
  pp->in = -1;
  long long end = now_ms() + ms;
  int status = 0, code = -1;
  for (;;) {
    pid_t r = waitpid(pp->pid, &status, WNOHANG);
    if (r == pp->pid) {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (pp->idle != NULL)
      pp->idle(pp->idle_arg);
    if (now_ms() >= end) {
      kill(pp->pid, SIGKILL);
      waitpid(pp->pid, &status, 0);
      break;
    }
    poll(NULL, 0, 5);
  }
  close(pp->out);
  pp->out = -1;
  unlink(pp->err_path);
  return code;
}
