/*
 * The control channel's listening socket (listen.h): the address grammar,
 * the loopback-only rule, and the socket itself, made with plain system
 * calls so that every ordinary failure (a port in use, a path that is
 * not ours) happens before anything is registered on a libuv loop.
 */
#include "control/listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/error.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

_Static_assert(CE__LISTEN_PATH_MAX == sizeof(((struct sockaddr_un *)0)->sun_path),
               "CE__LISTEN_PATH_MAX must match sockaddr_un.sun_path");

static bool parse_port(const char *s, int *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 5)
    return false;
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (s[i] - '0');
  }
  if (v > 65535)
    return false;
  *out = v;
  return true;
}

/* "unix:/path", "127.x.y.z:PORT" or "[::1]:PORT". Names are not resolved
 * and only loopback addresses are accepted: the channel must never be
 * reachable from outside the pod (DESIGN §5). */
int ce__listen_parse(const char *s, ce__listen_addr_t *a, char *err, size_t errlen) {
  memset(a, 0, sizeof(*a));
  if (s == NULL) {
    set_err(err, errlen, "listen: missing address");
    return CE_EINVAL;
  }
  if (strncmp(s, "unix:", 5) == 0) {
    const char *path = s + 5;
    if (path[0] != '/') {
      set_err(err, errlen, "listen: a Unix socket path must be absolute");
      return CE_EINVAL;
    }
    if (strlen(path) >= sizeof(a->path)) {
      set_err(err, errlen, "listen: the Unix socket path is longer than %zu bytes",
              sizeof(a->path) - 1);
      return CE_EINVAL;
    }
    a->is_unix = true;
    strcpy(a->path, path);
    return 0;
  }

  char host[64];
  const char *port_text;
  if (s[0] == '[') {
    const char *end = strstr(s, "]:");
    if (end == NULL || (size_t)(end - s - 1) >= sizeof(host)) {
      set_err(err, errlen, "listen: expected [::1]:PORT");
      return CE_EINVAL;
    }
    memcpy(host, s + 1, (size_t)(end - s - 1));
    host[end - s - 1] = '\0';
    port_text = end + 2;
  } else {
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= sizeof(host)) {
      set_err(err, errlen, "listen: expected unix:/path, 127.0.0.1:PORT or [::1]:PORT");
      return CE_EINVAL;
    }
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    port_text = colon + 1;
  }
  int port;
  if (!parse_port(port_text, &port)) {
    set_err(err, errlen, "listen: bad port");
    return CE_EINVAL;
  }

  struct sockaddr_in *in4 = (struct sockaddr_in *)&a->ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a->ss;
  if (s[0] == '[' && inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    /* Only ::1: a v4-mapped 127.0.0.1 would need a dual-stack socket, and
     * there is no reason to listen on one. */
    if (memcmp(&in6->sin6_addr, &in6addr_loopback, sizeof(in6addr_loopback)) != 0) {
      set_err(err, errlen, "listen: %s is not the loopback address ::1", host);
      return CE_EINVAL;
    }
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    a->sslen = sizeof(*in6);
    return 0;
  }
  if (s[0] != '[' && inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    if ((ntohl(in4->sin_addr.s_addr) >> 24) != 127) {
      set_err(err, errlen, "listen: %s is not a loopback address (127.0.0.0/8)", host);
      return CE_EINVAL;
    }
    in4->sin_family = AF_INET;
    in4->sin_port = htons((uint16_t)port);
    a->sslen = sizeof(*in4);
    return 0;
  }
  set_err(err, errlen, "listen: \"%.40s\" is not an IP address (names are not resolved)",
          host);
  return CE_EINVAL;
}

/* A socket file left by an earlier sidecar is removed; anything else at
 * the path (a file, or a socket somebody is listening on) is refused
 * rather than destroyed. */
static int clear_stale_socket(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT)
      return 0;
    set_err(err, errlen, "listen: cannot stat %s: %s", path, strerror(errno));
    return CE_EIO;
  }
  if (!S_ISSOCK(st.st_mode)) {
    set_err(err, errlen, "listen: %s exists and is not a socket", path);
    return CE_EINVAL;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    set_err(err, errlen, "listen: socket: %s", strerror(errno));
    return CE_EIO;
  }
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof(sun));
  sun.sun_family = AF_UNIX;
  strcpy(sun.sun_path, path);
  int rc = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
  int saved = errno;
  close(fd);
  if (rc == 0 || saved == EAGAIN || saved == EINPROGRESS) {
    set_err(err, errlen, "listen: %s is in use by a live listener", path);
    return CE_EIO;
  }
  if (saved != ECONNREFUSED) {
    set_err(err, errlen, "listen: cannot probe %s: %s", path, strerror(saved));
    return CE_EIO;
  }
  if (unlink(path) != 0 && errno != ENOENT) {
    set_err(err, errlen, "listen: cannot remove the stale socket %s: %s", path,
            strerror(errno));
    return CE_EIO;
  }
  return 0;
}

static int open_unix(const ce__listen_addr_t *a, int backlog, int *out, char *err,
                     size_t errlen) {
  int rc = clear_stale_socket(a->path, err, errlen);
  if (rc != 0)
    return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    set_err(err, errlen, "listen: socket: %s", strerror(errno));
    return CE_EIO;
  }
  /* On Linux the mode of an unbound socket becomes the mode of the file
   * bind() creates, so the socket is never reachable by others, not even
   * for the moment between bind() and chmod(). The chmod() is for systems
   * where that is not so. */
  (void)fchmod(fd, 0600);
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof(sun));
  sun.sun_family = AF_UNIX;
  strcpy(sun.sun_path, a->path);
  if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
    set_err(err, errlen, "listen: bind %s: %s", a->path, strerror(errno));
    close(fd);
    return CE_EIO;
  }
  if (chmod(a->path, 0600) != 0 || listen(fd, backlog) != 0) {
    set_err(err, errlen, "listen: %s: %s", a->path, strerror(errno));
    close(fd);
    unlink(a->path);
    return CE_EIO;
  }
  *out = fd;
  return 0;
}

/* Binds one TCP listener. *errno_out receives errno of a failed bind, so
 * that the caller can tell "in use" from "no such address". */
static int open_tcp(const struct sockaddr_storage *ss, socklen_t sslen, int backlog, int *out,
                    int *port, int *errno_out, char *err, size_t errlen) {
  int family = ss->ss_family;
  *errno_out = 0;
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *errno_out = errno;
    set_err(err, errlen, "listen: socket: %s", strerror(errno));
    return CE_EIO;
  }
  int one = 1;
  /* SO_REUSEADDR lets a restarted sidecar bind while connections of the
   * previous one sit in TIME_WAIT; it never lets two listeners share (and
   * SO_REUSEPORT, which would, is never set). */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  struct sockaddr_storage bound;
  socklen_t blen = sizeof(bound);
  if (bind(fd, (const struct sockaddr *)ss, sslen) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
    *errno_out = errno;
    set_err(err, errlen, "listen: %s port %d: %s", family == AF_INET6 ? "[::1]" : "IPv4",
            ntohs(family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                     : ((const struct sockaddr_in *)ss)->sin_port),
            strerror(errno));
    close(fd);
    return CE_EIO;
  }
  *port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                   : ((struct sockaddr_in *)&bound)->sin_port);
  *out = fd;
  return 0;
}

/* The other loopback family's address with `port`: [::1] for an IPv4
 * address, 127.0.0.1 for [::1]. */
static socklen_t other_family(const ce__listen_addr_t *a, int port, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof(*ss));
  if (a->ss.ss_family == AF_INET) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    in6->sin6_port = htons((uint16_t)port);
    return sizeof(*in6);
  }
  struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
  in4->sin_family = AF_INET;
  in4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in4->sin_port = htons((uint16_t)port);
  return sizeof(*in4);
}

/* A kernel-chosen port (PORT 0) may be taken in the other family; a few
 * tries find one free in both. */
#define PAIR_TRIES 16

static int open_tcp_pair(const ce__listen_addr_t *a, int backlog, int fds[2], int *nfds,
                         int *port, char *err, size_t errlen) {
  int want = ntohs(a->ss.ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)&a->ss)->sin6_port
                                               : ((const struct sockaddr_in *)&a->ss)->sin_port);
  for (int attempt = 0;; attempt++) {
    int e = 0;
    int rc = open_tcp(&a->ss, a->sslen, backlog, &fds[0], port, &e, err, errlen);
    if (rc != 0)
      return rc;
    struct sockaddr_storage ss2;
    socklen_t len2 = other_family(a, *port, &ss2);
    int port2 = 0;
    rc = open_tcp(&ss2, len2, backlog, &fds[1], &port2, &e, err, errlen);
    if (rc == 0) {
      *nfds = 2;
      return 0;
    }
    if (e == EADDRNOTAVAIL || e == EAFNOSUPPORT) {
      /* The family does not exist in this network namespace (IPv6
       * disabled): nobody can listen there, so nobody can pose as us. */
      set_err(err, errlen, "%s", "");
      *nfds = 1;
      return 0;
    }
    close(fds[0]);
    if (e != EADDRINUSE || want != 0 || attempt + 1 >= PAIR_TRIES) {
      /* Somebody holds our port in the other family: refuse to start
       * rather than leave a peer that falls back to it to a stranger. */
      return CE_EIO;
    }
  }
}

int ce__listen_open(const ce__listen_addr_t *a, int backlog, int *fd, int *port,
                    char *err, size_t errlen) {
  if (a->is_unix) {
    *port = 0;
    return open_unix(a, backlog, fd, err, errlen);
  }
  int e = 0;
  return open_tcp(&a->ss, a->sslen, backlog, fd, port, &e, err, errlen);
}

int ce__listen_open_both(const ce__listen_addr_t *a, int backlog, int fds[2], int *nfds,
                         int *port, char *err, size_t errlen) {
  if (a->is_unix) {
    *port = 0;
    *nfds = 1;
    return open_unix(a, backlog, &fds[0], err, errlen);
  }
  return open_tcp_pair(a, backlog, fds, nfds, port, err, errlen);
}

void ce__listen_remove(const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
    unlink(path);
}
