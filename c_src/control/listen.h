/*
 * The control channel's listening socket, inside the control subsystem.
 *
 * Only loopback addresses and Unix sockets are accepted (DESIGN §5: the
 * channel must never be reachable from outside the pod), and names are
 * never resolved. Nothing here touches a libuv loop: control.c hands the
 * finished descriptor to a handle.
 */
#ifndef CE_CONTROL_LISTEN_H
#define CE_CONTROL_LISTEN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* sizeof(sockaddr_un.sun_path) on Linux: a path is at most 107 bytes. */
#define CE__LISTEN_PATH_MAX 108

typedef struct {
  bool is_unix;
  char path[CE__LISTEN_PATH_MAX]; /* unix: an absolute path */
  struct sockaddr_storage ss;     /* TCP: 127.0.0.0/8 or ::1, with the port */
  socklen_t sslen;
} ce__listen_addr_t;

/*
 * Parses "unix:/abs/path", "127.x.y.z:PORT" or "[::1]:PORT" (PORT 0 to
 * 65535, 0 = chosen by the kernel). Returns CE_OK or CE_EINVAL (malformed,
 * not loopback, a name, a relative or too long path; *err explains, always
 * starting with "listen:"). On failure *a is zeroed.
 */
int ce__listen_parse(const char *s, ce__listen_addr_t *a, char *err, size_t errlen);

/*
 * Opens a non-blocking, close-on-exec listening socket for a. A Unix socket
 * is created with mode 0600; a stale socket file (no listener behind it)
 * is removed first, while a live socket or any other file at the path is
 * refused. *port receives the bound TCP port (0 for Unix). Returns CE_OK,
 * CE_EINVAL (the path holds something that is not a socket), CE_EIO (the
 * socket is in use, or a system call failed; *err explains). On failure
 * nothing is left open or created.
 */
int ce__listen_open(const ce__listen_addr_t *a, int backlog, int *fd, int *port,
                    char *err, size_t errlen);

/*
 * The control channel's listeners: as ce__listen_open (one descriptor for
 * a Unix socket), but a TCP address gets two: the address itself and the
 * other loopback family on the same port ([::1] for 127.x.y.z, 127.0.0.1
 * for [::1]), so that no other process can take the port in the family
 * the given address leaves free (a peer, or a Kubernetes port-forward,
 * may fall back to it). Only a family that does not exist at all (IPv6
 * disabled) is left out (*nfds is then 1); with PORT 0 the port is one
 * free in both. Returns as ce__listen_open; CE_EIO also when the port is
 * taken in the other family. On failure nothing is left open.
 */
int ce__listen_open_both(const ce__listen_addr_t *a, int backlog, int fds[2], int *nfds,
                         int *port, char *err, size_t errlen);

/* Removes the socket file at path if it still is a socket. */
void ce__listen_remove(const char *path);

#endif
