#include "netfilter/ctflush.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"

/* Attribute header plus a 32-bit value: already 4-byte aligned. */
#define CTF__ATTR_U32_LEN 8u

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

int ce_ctflush_request(uint32_t mark, uint32_t seq, uint8_t *buf, size_t cap,
                       size_t *len) {
  /* Mark 0 is every connection nobody marked: a flush filtered by it
   * would take the workspace's own entries. Never. */
  if (mark == 0)
    return CE_EINVAL;
  if (cap < CE_CTFLUSH_REQUEST_LEN)
    return CE_ETOOBIG;
  uint8_t *p = buf;
  /* struct nlmsghdr, host byte order. No tuple: a flush, filtered below. */
  put_u32(p, CE_CTFLUSH_REQUEST_LEN);
  put_u16(p + 4, (uint16_t)((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE));
  put_u16(p + 6, (uint16_t)(NLM_F_REQUEST | NLM_F_ACK));
  put_u32(p + 8, seq);
  put_u32(p + 12, 0); /* the kernel fills in our port id */
  p += NLMSG_HDRLEN;
  /* struct nfgenmsg: AF_UNSPEC with version 0 is every family. */
  p[0] = AF_UNSPEC;
  p[1] = NFNETLINK_V0;
  put_u16(p + 2, 0);
  p += 4;
  /* The attributes' values are in network byte order (ctnetlink's
   * NLA_U32 marks are big-endian). */
  const uint16_t types[2] = {CTA_MARK, CTA_MARK_MASK};
  const uint32_t values[2] = {mark, 0xffffffffu};
  for (size_t i = 0; i < 2; i++) {
    put_u16(p, (uint16_t)CTF__ATTR_U32_LEN);
    put_u16(p + 2, types[i]);
    put_u32(p + 4, htonl(values[i]));
    p += CTF__ATTR_U32_LEN;
  }
  *len = CE_CTFLUSH_REQUEST_LEN;
  return 0;
}

int ce_ctflush_parse_answer(const uint8_t *buf, size_t n, uint32_t seq,
                            int *kernel_errno) {
  size_t off = 0;
  while (off < n) {
    struct nlmsghdr h;
    if (n - off < sizeof(h))
      return CE_EPARSE;
    memcpy(&h, buf + off, sizeof(h));
    if (h.nlmsg_len < sizeof(h) || h.nlmsg_len > n - off)
      return CE_EPARSE;
    if (h.nlmsg_type == NLMSG_ERROR && h.nlmsg_seq == seq) {
      /* struct nlmsgerr: the error, then (at least) our header back. */
      int32_t e;
      if (h.nlmsg_len < NLMSG_HDRLEN + sizeof(struct nlmsgerr))
        return CE_EPARSE;
      memcpy(&e, buf + off + NLMSG_HDRLEN, sizeof(e));
      if (e > 0 || e < -4095)
        return CE_EPARSE;
      *kernel_errno = -e;
      return 0;
    }
    /* Messages are padded to 4 bytes; the last one need not be. */
    size_t step = NLMSG_ALIGN(h.nlmsg_len);
    if (step >= n - off)
      break;
    off += step;
  }
  return CE_EAGAIN;
}

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t cap, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (cap > 0)
    vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return code;
}

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int kernel_refused(int e, char *err, size_t cap) {
  if (e == EPERM || e == EACCES)
    return fail(err, cap, CE_EPERM,
                "the kernel refused (%s): the proxy needs CAP_NET_ADMIN in "
                "this network namespace", strerror(e));
  if (e == EOPNOTSUPP || e == ENOENT || e == EPROTONOSUPPORT)
    return fail(err, cap, CE_ENOTSUP,
                "the kernel cannot flush conntrack entries by mark (%s): "
                "no ctnetlink (nf_conntrack_netlink) or too old", strerror(e));
  return fail(err, cap, CE_EIO, "the kernel answered the conntrack flush with %s",
              strerror(e));
}

int ce_ctflush_mark(uint32_t mark, char *err, size_t cap) {
  if (mark == 0)
    return fail(err, cap, CE_EINVAL, "refusing to delete the conntrack entries of connection mark 0 "
                                     "(every unmarked connection)");
  if (cap > 0)
    err[0] = '\0';
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (fd < 0) {
    int e = errno;
    if (e == EAFNOSUPPORT || e == EPROTONOSUPPORT)
      return fail(err, cap, CE_ENOTSUP, "no netfilter netlink socket (%s)", strerror(e));
    return fail(err, cap, CE_EIO, "cannot open a netfilter netlink socket: %s", strerror(e));
  }
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  if (bind(fd, (struct sockaddr *)&local, sizeof(local)) != 0) {
    int e = errno;
    close(fd);
    return fail(err, cap, CE_EIO, "cannot bind the netlink socket: %s", strerror(e));
  }
  /* Any value will do; the time keeps two runs from sharing one. */
  uint32_t seq = (uint32_t)time(NULL);
  uint8_t req[CE_CTFLUSH_REQUEST_LEN];
  size_t len = 0;
  ce_ctflush_request(mark, seq, req, sizeof(req), &len);
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  ssize_t sent;
  do {
    sent = sendto(fd, req, len, 0, (struct sockaddr *)&kernel, sizeof(kernel));
  } while (sent < 0 && errno == EINTR);
  if (sent < 0 || (size_t)sent != len) {
    int e = sent < 0 ? errno : EIO;
    close(fd);
    return fail(err, cap, CE_EIO, "cannot send the conntrack flush: %s", strerror(e));
  }

  uint8_t answer[CE_CTFLUSH_ANSWER_MAX];
  long deadline = now_ms() + CE_CTFLUSH_TIMEOUT_MS;
  for (;;) {
    long left = deadline - now_ms();
    if (left <= 0) {
      close(fd);
      return fail(err, cap, CE_ETIMEDOUT, "no answer from the kernel within %u ms",
                  CE_CTFLUSH_TIMEOUT_MS);
    }
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)left);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr < 0) {
      int e = errno;
      close(fd);
      return fail(err, cap, CE_EIO, "poll on the netlink socket: %s", strerror(e));
    }
    if (pr == 0)
      continue;
    struct sockaddr_nl from;
    socklen_t fromlen = sizeof(from);
    ssize_t got = recvfrom(fd, answer, sizeof(answer), MSG_TRUNC | MSG_DONTWAIT,
                           (struct sockaddr *)&from, &fromlen);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (got < 0) {
      int e = errno;
      close(fd);
      /* ENOBUFS: the socket overflowed; nothing we asked for is lost
       * for good, but the answer may be. */
      return fail(err, cap, CE_EIO, "reading the kernel's answer: %s", strerror(e));
    }
    /* Only the kernel (port 0) answers; a datagram from another process
     * is ignored rather than believed. */
    if (fromlen < sizeof(from) || from.nl_pid != 0)
      continue;
    if ((size_t)got > sizeof(answer)) {
      close(fd);
      return fail(err, cap, CE_EPARSE, "the kernel's answer is larger than %u bytes",
                  CE_CTFLUSH_ANSWER_MAX);
    }
    int kernel_errno = 0;
    int rc = ce_ctflush_parse_answer(answer, (size_t)got, seq, &kernel_errno);
    if (rc == CE_EAGAIN)
      continue;
    close(fd);
    if (rc != 0)
      return fail(err, cap, CE_EPARSE, "malformed answer from the kernel");
    if (kernel_errno != 0)
      return kernel_refused(kernel_errno, err, cap);
    return 0;
  }
}
