/* Tests for c_src/cli/ready_cmd.c (`condukt-egress ready`), called in
 * process so the sanitizers see it, with stdout and stderr captured in
 * files: success against listening sockets (IPv4, IPv6, a unix control
 * socket), failure against a port where nothing listens and against one
 * that does not answer in time (each with its message), and the usage
 * errors. Every port is the kernel's pick, never 15001. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli.h"

#define OUT_MAX 4096

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/ce_test_ready_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  unsetenv("CONDUKT_EGRESS_LISTEN");
}

static void in_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", dir, name); }

static void teardown(void) {
  static const char *const names[] = {"stdout", "stderr", "control.sock"};
  char path[128];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    in_dir(path, sizeof(path), names[i]);
    unlink(path);
  }
  rmdir(dir);
}

TestSuite(ready, .init = setup, .fini = teardown);

typedef struct {
  int status;
  char out[OUT_MAX];
  char err[OUT_MAX];
} result_t;

static void slurp(const char *name, char *out) {
  char path[128];
  in_dir(path, sizeof(path), name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t n = fread(out, 1, OUT_MAX - 1, f);
  out[n] = '\0';
  fclose(f);
}

/* Redirects fd to the file `name` in the test's directory; returns a
 * duplicate of the old fd for restore(). */
static int redirect(int fd, const char *name) {
  char path[128];
  in_dir(path, sizeof(path), name);
  int saved = dup(fd);
  cr_assert_geq(saved, 0);
  int f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(f, 0);
  cr_assert_geq(dup2(f, fd), 0);
  close(f);
  return saved;
}

static void restore(int fd, int saved) {
  cr_assert_geq(dup2(saved, fd), 0);
  close(saved);
}

/* Runs `ready` with args (NULL-terminated, without the command name). */
static void run(result_t *r, const char *const *args) {
  char *argv[24];
  int argc = 0;
  argv[argc++] = "ready";
  for (size_t i = 0; args[i] != NULL; i++) {
    cr_assert_lt(argc, 23);
    argv[argc++] = (char *)args[i];
  }
  argv[argc] = NULL;
  fflush(stdout);
  fflush(stderr);
  int so = redirect(STDOUT_FILENO, "stdout");
  int se = redirect(STDERR_FILENO, "stderr");
  r->status = ce_cmd_ready(argc, argv);
  fflush(stdout);
  fflush(stderr);
  restore(STDOUT_FILENO, so);
  restore(STDERR_FILENO, se);
  slurp("stdout", r->out);
  slurp("stderr", r->err);
}

/* A TCP socket bound to the loopback address of `family` on a port the
 * kernel picks; listening when `do_listen` (backlog `backlog`). The port
 * goes to *port; the caller closes the fd. A bound socket that does not
 * listen keeps its port taken and refuses connections. */
static int bound(int family, int do_listen, int backlog, unsigned *port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  socklen_t len;
  if (family == AF_INET) {
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*s4);
  } else {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_addr = in6addr_loopback;
    len = sizeof(*s6);
  }
  cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0, "bind: %s", strerror(errno));
  if (do_listen)
    cr_assert_eq(listen(fd, backlog), 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
  *port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                  : ((struct sockaddr_in6 *)&ss)->sin6_port);
  return fd;
}

Test(ready, every_listener_accepts) {
  unsigned p4, p6;
  int l4 = bound(AF_INET, 1, 8, &p4);
  int l6 = bound(AF_INET6, 1, 8, &p6);
  char a4[32], a6[32];
  snprintf(a4, sizeof(a4), "127.0.0.1:%u", p4);
  snprintf(a6, sizeof(a6), "[::1]:%u", p6);
  result_t r;
  run(&r, (const char *[]){"--listen", a4, "--listen", a6, NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);
  cr_assert_str_eq(r.out, "condukt-egress: ready (2 listener(s))\n");
  cr_assert_str_empty(r.err);
  /* --NAME=VALUE and --timeout-ms */
  char eq[48];
  snprintf(eq, sizeof(eq), "--listen=%s", a4);
  run(&r, (const char *[]){eq, "--timeout-ms=500", NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);
  close(l4);
  close(l6);
}

Test(ready, refused_port_fails_with_its_address) {
  unsigned up, down;
  int l = bound(AF_INET, 1, 8, &up);
  int d = bound(AF_INET, 0, 0, &down); /* bound, not listening: refuses */
  char a_up[32], a_down[32];
  snprintf(a_up, sizeof(a_up), "127.0.0.1:%u", up);
  snprintf(a_down, sizeof(a_down), "127.0.0.1:%u", down);
  result_t r;
  run(&r, (const char *[]){"--listen", a_up, "--listen", a_down, NULL});
  cr_assert_eq(r.status, CE_EXIT_FAIL);
  cr_assert_str_empty(r.out);
  char want[160];
  snprintf(want, sizeof(want),
           "condukt-egress ready: listen %s: not ready: Connection refused (nothing listens there)\n", a_down);
  cr_assert_str_eq(r.err, want);
  close(l);
  close(d);
}

Test(ready, the_listen_environment_variable_as_the_proxy_reads_it) {
  unsigned p, down;
  int l = bound(AF_INET, 1, 8, &p);
  int d = bound(AF_INET6, 0, 0, &down);
  char list[96];
  snprintf(list, sizeof(list), "127.0.0.1:%u,,", p);
  setenv("CONDUKT_EGRESS_LISTEN", list, 1);
  result_t r;
  run(&r, (const char *[]){NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);
  cr_assert_str_eq(r.out, "condukt-egress: ready (1 listener(s))\n");

  snprintf(list, sizeof(list), "127.0.0.1:%u,[::1]:%u", p, down);
  setenv("CONDUKT_EGRESS_LISTEN", list, 1);
  run(&r, (const char *[]){NULL});
  cr_assert_eq(r.status, CE_EXIT_FAIL);
  cr_assert(strstr(r.err, "not ready: Connection refused") != NULL, "%s", r.err);

  /* A flag wins over the variable. */
  char a[32];
  snprintf(a, sizeof(a), "127.0.0.1:%u", p);
  run(&r, (const char *[]){"--listen", a, NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);

  char big[1100];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  setenv("CONDUKT_EGRESS_LISTEN", big, 1);
  run(&r, (const char *[]){NULL});
  cr_assert_eq(r.status, CE_EXIT_USAGE);
  cr_assert_str_eq(r.err, "condukt-egress ready: CONDUKT_EGRESS_LISTEN is longer than 1023 bytes\n");

  setenv("CONDUKT_EGRESS_LISTEN", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,"
                                  "127.0.0.1:6,127.0.0.1:7,127.0.0.1:8,127.0.0.1:9", 1);
  run(&r, (const char *[]){NULL});
  cr_assert_eq(r.status, CE_EXIT_USAGE);
  cr_assert(strstr(r.err, "too many listen addresses in CONDUKT_EGRESS_LISTEN at '127.0.0.1:9'") != NULL, "%s",
            r.err);
  unsetenv("CONDUKT_EGRESS_LISTEN");
  close(l);
  close(d);
}

/* A listener whose accept queue is full drops the SYN: the connection
 * neither succeeds nor fails before the deadline. */
Test(ready, no_answer_within_the_timeout) {
  unsigned p;
  int l = bound(AF_INET, 1, 0, &p);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  /* Backlog 0 queues one connection; two make sure the queue is full. */
  int fill[2];
  for (int i = 0; i < 2; i++) {
    fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    cr_assert_geq(fill[i], 0);
    int rc = connect(fill[i], (struct sockaddr *)&sa, sizeof(sa));
    cr_assert(rc == 0 || errno == EINPROGRESS, "%s", strerror(errno));
  }
  usleep(50 * 1000);
  char a[32];
  snprintf(a, sizeof(a), "127.0.0.1:%u", p);
  result_t r;
  run(&r, (const char *[]){"--listen", a, "--timeout-ms", "300", NULL});
  cr_assert_eq(r.status, CE_EXIT_FAIL, "out: %s err: %s", r.out, r.err);
  char want[160];
  snprintf(want, sizeof(want), "condukt-egress ready: listen %s: not ready: no connection within 300 ms\n", a);
  cr_assert_str_eq(r.err, want);
  for (int i = 0; i < 2; i++)
    close(fill[i]);
  close(l);
}

Test(ready, control_channel_tcp_and_unix) {
  unsigned p, c;
  int l = bound(AF_INET, 1, 8, &p);
  int ctl = bound(AF_INET, 1, 8, &c);
  char a[32], ca[32];
  snprintf(a, sizeof(a), "127.0.0.1:%u", p);
  snprintf(ca, sizeof(ca), "127.0.0.1:%u", c);
  result_t r;
  run(&r, (const char *[]){"--listen", a, "--control", ca, NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);
  cr_assert_str_eq(r.out, "condukt-egress: ready (1 listener(s) and the control channel)\n");

  int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(u, 0);
  struct sockaddr_un sun = {.sun_family = AF_UNIX};
  in_dir(sun.sun_path, sizeof(sun.sun_path), "control.sock");
  cr_assert_eq(bind(u, (struct sockaddr *)&sun, sizeof(sun)), 0, "%s", strerror(errno));
  cr_assert_eq(listen(u, 4), 0);
  char ep[160];
  snprintf(ep, sizeof(ep), "unix:%s", sun.sun_path);
  run(&r, (const char *[]){"--listen", a, "--control", ep, NULL});
  cr_assert_eq(r.status, CE_EXIT_OK, "%s", r.err);

  char missing[160];
  snprintf(missing, sizeof(missing), "unix:%s/nothing.sock", dir);
  run(&r, (const char *[]){"--listen", a, "--control", missing, NULL});
  cr_assert_eq(r.status, CE_EXIT_FAIL);
  char want[256];
  snprintf(want, sizeof(want),
           "condukt-egress ready: control %s: not ready: No such file or directory (nothing listens there)\n",
           missing);
  cr_assert_str_eq(r.err, want);
  close(u);
  close(ctl);
  close(l);
}

/* A Unix listener whose queue is full answers connect() with EAGAIN: not
 * ready (polling would report the unconnected socket writable). */
Test(ready, a_full_unix_control_queue_is_not_ready) {
  unsigned p;
  int l = bound(AF_INET, 1, 8, &p);
  char a[32];
  snprintf(a, sizeof(a), "127.0.0.1:%u", p);
  int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(u, 0);
  struct sockaddr_un sun = {.sun_family = AF_UNIX};
  in_dir(sun.sun_path, sizeof(sun.sun_path), "full.sock");
  cr_assert_eq(bind(u, (struct sockaddr *)&sun, sizeof(sun)), 0, "%s", strerror(errno));
  cr_assert_eq(listen(u, 0), 0);
  /* Fill the queue until a non-blocking connect says EAGAIN (bounded). */
  int fill[8];
  int nfill = 0;
  for (; nfill < 8; nfill++) {
    fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    cr_assert_geq(fill[nfill], 0);
    if (connect(fill[nfill], (struct sockaddr *)&sun, sizeof(sun)) != 0) {
      cr_assert_eq(errno, EAGAIN, "%s", strerror(errno));
      close(fill[nfill]);
      break;
    }
  }
  cr_assert_lt(nfill, 8, "the queue never filled");
  char ep[160];
  snprintf(ep, sizeof(ep), "unix:%s", sun.sun_path);
  result_t r;
  run(&r, (const char *[]){"--listen", a, "--control", ep, "--timeout-ms", "300", NULL});
  cr_assert_eq(r.status, CE_EXIT_FAIL, "out: %s err: %s", r.out, r.err);
  cr_assert_not_null(strstr(r.err, "not ready"), "%s", r.err);
  for (int i = 0; i < nfill; i++)
    close(fill[i]);
  close(u);
  close(l);
}

Test(ready, usage_errors_name_the_word) {
  static const struct {
    const char *args[6];
    const char *err;
  } cases[] = {
      {{"--port", "15001"}, "condukt-egress ready: unknown option '--port'\n"},
      {{"15001"}, "condukt-egress ready: unexpected argument '15001'\n"},
      {{"--listen"}, "condukt-egress ready: missing value for option '--listen'\n"},
      {{"--listen="}, "condukt-egress ready: empty value for option '--listen'\n"},
      {{"--listen", "127.0.0.1"},
       "condukt-egress ready: --listen expects ADDRESS:PORT (IPv6 in brackets), got '127.0.0.1'\n"},
      {{"--listen", "::1:15001"},
       "condukt-egress ready: --listen expects ADDRESS:PORT (IPv6 in brackets), got '::1:15001'\n"},
      {{"--listen", "unix:/x"},
       "condukt-egress ready: --listen expects ADDRESS:PORT (IPv6 in brackets), got 'unix:/x'\n"},
      {{"--control", "localhost:1"},
       "condukt-egress ready: --control expects HOST:PORT or unix:/path, got 'localhost:1'\n"},
      {{"--control", "unix:"},
       "condukt-egress ready: --control expects unix:/path (at most 107 bytes), got 'unix:'\n"},
      {{"--timeout-ms", "0"}, "condukt-egress ready: --timeout-ms expects an integer in 1..60000, got '0'\n"},
      {{"--timeout-ms", "60001"},
       "condukt-egress ready: --timeout-ms expects an integer in 1..60000, got '60001'\n"},
      {{"--timeout-ms", "-5"}, "condukt-egress ready: --timeout-ms expects an integer in 1..60000, got '-5'\n"},
      {{"--timeout-ms", "10x"}, "condukt-egress ready: --timeout-ms expects an integer in 1..60000, got '10x'\n"},
      {{"--listenx", "1"}, "condukt-egress ready: unknown option '--listenx'\n"},
      {{"--listen", "bad\x1b[0m:1"},
       "condukt-egress ready: --listen expects ADDRESS:PORT (IPv6 in brackets), got 'bad\\x1b[0m:1'\n"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    result_t r;
    run(&r, cases[i].args);
    cr_expect_eq(r.status, CE_EXIT_USAGE, "case %zu", i);
    char want[256];
    snprintf(want, sizeof(want), "%srun 'condukt-egress ready --help' for the options\n", cases[i].err);
    cr_expect_str_eq(r.err, want, "case %zu", i);
    cr_expect_str_empty(r.out, "case %zu", i);
  }

  /* A bad address is reported before any connection is tried. */
  result_t r;
  run(&r, (const char *[]){"--listen", "127.0.0.1:1", "--listen", "nope", NULL});
  cr_assert_eq(r.status, CE_EXIT_USAGE);
  cr_assert(strstr(r.err, "got 'nope'") != NULL && strstr(r.err, "not ready") == NULL, "%s", r.err);

  const char *nine[20] = {NULL};
  for (int i = 0; i < 18; i += 2) {
    nine[i] = "--listen";
    nine[i + 1] = "127.0.0.1:1";
  }
  run(&r, nine);
  cr_assert_eq(r.status, CE_EXIT_USAGE);
  cr_assert(strstr(r.err, "too many listen addresses at '127.0.0.1:1'") != NULL, "%s", r.err);
}

Test(ready, help) {
  result_t r;
  run(&r, (const char *[]){"--help", NULL});
  cr_assert_eq(r.status, CE_EXIT_OK);
  cr_assert(strncmp(r.out, "usage: condukt-egress ready ", 28) == 0, "%s", r.out);
  cr_assert_str_empty(r.err);
}
