/*
 * `condukt-egress ready`: is the sidecar accepting connections yet?
 * (docs/cli.md; docs/kubernetes.md, "Pod").
 *
 * The Kubernetes manifest runs it as the native sidecar's startupProbe
 * (exec): the kubelet starts the workspace container only once it exits 0,
 * so the workspace's first connection (REDIRECTed to the proxy's port)
 * never finds nothing listening. A tcpSocket probe cannot do this: the
 * proxy listens on loopback only and the kubelet probes from the node's
 * network namespace; exec runs in the pod's. A "ready file" written by the
 * proxy would need a writable volume on a read-only root and outlives a
 * crashed proxy; a connection is the fact the workspace depends on.
 *
 * It connects to every --listen address (the proxy's defaults when none is
 * given, as the proxy takes them: flags, else CONDUKT_EGRESS_LISTEN), then
 * to --control when that is given, each within what is left of
 * --timeout-ms, and closes each connection without sending a byte. The
 * proxy closes such a connection at accept (not redirected) with only a
 * debug trace when it comes from loopback (c_src/proxy/conn.c); the
 * control channel logs an info line for a peer that leaves before its
 * hello, which is why the manifest checks the listeners only (the proxy
 * starts its control channel before its listeners).
 *
 * Exit 0 with one line on stdout; 1 with the first address that does not
 * accept and why on stderr; 2 for a usage error.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "proxy/netaddr.h"
#include "proxy/options.h"

#define PROG "condukt-egress ready"
#define READY_DEFAULT_TIMEOUT_MS 1000
#define READY_MAX_TIMEOUT_MS 60000
/* The environment list is copied into a buffer of this size. */
#define READY_ENV_MAX 1024

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " [--listen ADDRESS:PORT]... [--control ENDPOINT] [--timeout-ms N]\n\n"
          "Exits 0 when every address accepts a TCP connection, 1 otherwise.\n\n"
          "  --listen ADDRESS:PORT  an address the proxy listens on (repeatable; else\n"
          "                         CONDUKT_EGRESS_LISTEN, else 127.0.0.1:15001 and [::1]:15001)\n"
          "  --control ENDPOINT     also the control channel: a HOST:PORT or unix:/path\n"
          "  --timeout-ms N         for all the connections together, 1..%d (default %d)\n",
          READY_MAX_TIMEOUT_MS, READY_DEFAULT_TIMEOUT_MS);
}

static int usage_error(const char *what, const char *word) {
  ce_text_usage_error(PROG, what, word);
  return CE_EXIT_USAGE;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connects to sa within deadline (CLOCK_MONOTONIC ms). Returns 0, or an
 * errno value (ETIMEDOUT when the deadline passed). */
static int try_connect(const struct sockaddr *sa, socklen_t len, long long deadline) {
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errno;
  int err = 0;
  if (connect(fd, sa, len) != 0) {
    err = errno;
    /* EAGAIN (a Unix socket whose listen queue is full) is "not ready":
     * polling would report the unconnected socket writable. */
    if (err == EINPROGRESS) {
      err = ETIMEDOUT;
      for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0)
          break;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int n = poll(&pfd, 1, (int)left);
        if (n < 0 && errno == EINTR)
          continue;
        if (n < 0) {
          err = errno;
          break;
        }
        if (n == 0)
          continue;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
          soerr = errno;
        err = soerr;
        break;
      }
    }
  }
  close(fd);
  return err;
}

typedef struct {
  const char *flag; /* "--listen" or "--control" */
  const char *text;
  struct sockaddr_storage ss;
  socklen_t len;
} endpoint_t;

/* Parses "ADDRESS:PORT", or "unix:/path" when unix_ok, into *e. Returns
 * CE_EXIT_OK or CE_EXIT_USAGE (message written). */
static int parse_endpoint(const char *flag, const char *text, int unix_ok, endpoint_t *e) {
  memset(e, 0, sizeof(*e));
  e->flag = flag;
  e->text = text;
  if (unix_ok && strncmp(text, "unix:", 5) == 0) {
    struct sockaddr_un *un = (struct sockaddr_un *)&e->ss;
    const char *path = text + 5;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(un->sun_path))
      return usage_error("--control expects unix:/path (at most 107 bytes), got", text);
    un->sun_family = AF_UNIX;
    memcpy(un->sun_path, path, n + 1);
    e->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return CE_EXIT_OK;
  }
  if (ce_addr_parse(text, &e->ss) != CE_OK)
    return usage_error(unix_ok ? "--control expects HOST:PORT or unix:/path, got"
                               : "--listen expects ADDRESS:PORT (IPv6 in brackets), got",
                       text);
  e->len = e->ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  return CE_EXIT_OK;
}

/* Connects to e before deadline. Returns CE_EXIT_OK or CE_EXIT_FAIL
 * (message written). */
static int check(const endpoint_t *e, long long deadline, int timeout_ms) {
  int err = try_connect((const struct sockaddr *)&e->ss, e->len, deadline);
  if (err == 0)
    return CE_EXIT_OK;
  char shown[4 * CE_TEXT_QUOTE_MAX + 8];
  ce_text_sanitize(shown, sizeof(shown), e->text, strlen(e->text), 0);
  if (err == ETIMEDOUT)
    fprintf(stderr, PROG ": %s %s: not ready: no connection within %d ms\n", e->flag + 2, shown, timeout_ms);
  else
    fprintf(stderr, PROG ": %s %s: not ready: %s%s\n", e->flag + 2, shown, strerror(err),
            err == ECONNREFUSED || err == ENOENT ? " (nothing listens there)" : "");
  return CE_EXIT_FAIL;
}

int ce_cmd_ready(int argc, char **argv) {
  const char *listen[CE_PROXY_MAX_LISTEN];
  size_t nlisten = 0;
  const char *control = NULL;
  int timeout_ms = READY_DEFAULT_TIMEOUT_MS;

  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0 || strcmp(arg, "help") == 0) {
      usage(stdout);
      return CE_EXIT_OK;
    }
    const char *value = NULL;
    const char *name = NULL;
    static const char *const flags[] = {"--listen", "--control", "--timeout-ms"};
    for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
      size_t fl = strlen(flags[f]);
      if (strncmp(arg, flags[f], fl) == 0 && (arg[fl] == '\0' || arg[fl] == '=')) {
        name = flags[f];
        if (arg[fl] == '=') {
          value = arg + fl + 1;
        } else {
          if (i + 1 >= argc)
            return usage_error("missing value for option", arg);
          value = argv[++i];
        }
        break;
      }
    }
    if (name == NULL)
      return usage_error(strncmp(arg, "--", 2) == 0 ? "unknown option" : "unexpected argument", arg);
    if (value[0] == '\0')
      return usage_error("empty value for option", name);
    if (strcmp(name, "--listen") == 0) {
      if (nlisten == CE_PROXY_MAX_LISTEN)
        return usage_error("too many listen addresses at", value);
      listen[nlisten++] = value;
    } else if (strcmp(name, "--control") == 0) {
      control = value;
    } else {
      char *end;
      errno = 0;
      long v = value[0] >= '0' && value[0] <= '9' ? strtol(value, &end, 10) : -1;
      if (v < 1 || v > READY_MAX_TIMEOUT_MS || errno != 0 || *end != '\0')
        return usage_error("--timeout-ms expects an integer in 1..60000, got", value);
      timeout_ms = (int)v;
    }
  }

  /* As the proxy: the environment's comma-separated list when no flag. */
  char envbuf[READY_ENV_MAX];
  const char *ev = nlisten == 0 ? getenv("CONDUKT_EGRESS_LISTEN") : NULL;
  if (ev != NULL) {
    size_t n = strlen(ev);
    if (n >= sizeof(envbuf)) {
      fprintf(stderr, PROG ": CONDUKT_EGRESS_LISTEN is longer than %d bytes\n", READY_ENV_MAX - 1);
      return CE_EXIT_USAGE;
    }
    memcpy(envbuf, ev, n + 1);
    for (char *item = envbuf; item != NULL;) {
      char *comma = strchr(item, ',');
      if (comma != NULL)
        *comma = '\0';
      if (item[0] != '\0') {
        if (nlisten == CE_PROXY_MAX_LISTEN)
          return usage_error("too many listen addresses in CONDUKT_EGRESS_LISTEN at", item);
        listen[nlisten++] = item;
      }
      item = comma != NULL ? comma + 1 : NULL;
    }
  }
  if (nlisten == 0) {
    listen[nlisten++] = "127.0.0.1:15001";
    listen[nlisten++] = "[::1]:15001";
  }

  endpoint_t eps[CE_PROXY_MAX_LISTEN + 1];
  size_t neps = 0;
  for (size_t i = 0; i < nlisten; i++) {
    int rc = parse_endpoint("--listen", listen[i], 0, &eps[neps++]);
    if (rc != CE_EXIT_OK)
      return rc;
  }
  if (control != NULL) {
    int rc = parse_endpoint("--control", control, 1, &eps[neps++]);
    if (rc != CE_EXIT_OK)
      return rc;
  }
  long long deadline = now_ms() + timeout_ms;
  for (size_t i = 0; i < neps; i++) {
    int rc = check(&eps[i], deadline, timeout_ms);
    if (rc != CE_EXIT_OK)
      return rc;
  }
  printf("condukt-egress: ready (%zu listener(s)%s)\n", nlisten, control != NULL ? " and the control channel" : "");
  return CE_EXIT_OK;
}
