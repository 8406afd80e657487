#include "proxy/netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "policy/ip.h"

int ce_original_dst(int fd, struct sockaddr_storage *out) {
  struct sockaddr_storage local;
  socklen_t len = sizeof(local);
  if (getsockname(fd, (struct sockaddr *)&local, &len) != 0)
    return CE_EIO;
  struct sockaddr_storage dst;
  memset(&dst, 0, sizeof(dst));
  len = sizeof(dst);
  int rc;
  if (local.ss_family == AF_INET6) {
    /* An IPv4 client on a dual-stack socket has a v4-mapped local address
     * and its NAT entry lives in the IPv4 table. */
    const struct sockaddr_in6 *l6 = (const struct sockaddr_in6 *)&local;
    if (IN6_IS_ADDR_V4MAPPED(&l6->sin6_addr))
      rc = getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &len);
    else
      rc = getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &dst, &len);
  } else {
    rc = getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &len);
  }
  if (rc != 0)
    return errno == ENOENT ? CE_ENOENT : CE_EIO;
  *out = dst;
  return CE_OK;
}

int ce_set_mark(int fd, uint32_t mark) {
  unsigned int m = mark;
  if (setsockopt(fd, SOL_SOCKET, SO_MARK, &m, sizeof(m)) != 0)
    return errno == EPERM ? CE_EPERM : CE_EIO;
  return CE_OK;
}

static bool v4_private(const uint8_t a[4]) {
  if (a[0] == 0 || a[0] == 10 || a[0] == 127)
    return true;                              /* RFC 1122 §3.2.1.3, RFC 1918 */
  if (a[0] == 100 && (a[1] & 0xc0) == 64)
    return true;                              /* RFC 6598 shared space */
  if (a[0] == 169 && a[1] == 254)
    return true;                              /* RFC 3927, cloud metadata */
  if (a[0] == 172 && (a[1] & 0xf0) == 16)
    return true;                              /* RFC 1918 */
  if (a[0] == 192 && a[1] == 168)
    return true;                              /* RFC 1918 */
  if (a[0] == 198 && (a[1] & 0xfe) == 18)
    return true;                              /* RFC 2544 benchmarking, 198.18/15 */
  if (a[0] == 192 && a[1] == 0 && a[2] == 0)
    return true;                              /* RFC 6890 IETF protocol assignments */
  if (a[0] >= 224)
    return true;                              /* multicast, reserved, broadcast */
  return false;
}

bool ce_addr_is_private(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    return v4_private((const uint8_t *)&s4->sin_addr);
  }
  if (sa->sa_family != AF_INET6)
    return true;
  const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
  static const uint8_t zero[16];
  if (memcmp(a, zero, 12) == 0)
    return true;                                  /* ::/96: ::, ::1 and the deprecated
                                                     IPv4-compatible form (RFC 4291
                                                     §2.5.5.1), which nothing routes */
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(a, mapped, 12) == 0)
    return v4_private(a + 12);
  static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (memcmp(a, nat64, 12) == 0)
    return v4_private(a + 12);                    /* RFC 6052 */
  if (memcmp(a, nat64, 4) == 0 && a[4] == 0 && a[5] == 1)
    return true;                                  /* 64:ff9b:1::/48, local-use NAT64 (RFC
                                                     8215): the IPv4 part may sit anywhere
                                                     (RFC 6052 §2.2), so all of it */
  if (a[0] == 0x20 && a[1] == 0x02)
    return v4_private(a + 2);                     /* 2002::/16, 6to4 (RFC 3056 §2) */
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
    return true;                                  /* fe80::/10 link-local */
  if ((a[0] & 0xfe) == 0xfc)
    return true;                                  /* fc00::/7 unique local */
  if (a[0] == 0xff)
    return true;                                  /* multicast */
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0)
    return true;                                  /* deprecated site-local */
  return false;
}

bool ce_addr_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return ((const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr)[0] == 127;
  if (sa->sa_family != AF_INET6)
    return false;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(a))
    return true;
  return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

size_t ce_addr_text(const struct sockaddr *sa, char out[CE_ADDR_TEXT_MAX]) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    return ce_ipv4_format((const uint8_t *)&s4->sin_addr, out);
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
      return ce_ipv4_format(s6->sin6_addr.s6_addr + 12, out);
    return ce_ipv6_format(s6->sin6_addr.s6_addr, out);
  }
  out[0] = '\0';
  return 0;
}

uint16_t ce_addr_port(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return ntohs(((const struct sockaddr_in *)sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
  return 0;
}

bool ce_addr_equal(const struct sockaddr *a, const struct sockaddr *b) {
  if (a->sa_family != b->sa_family)
    return false;
  if (a->sa_family == AF_INET) {
    const struct sockaddr_in *x = (const struct sockaddr_in *)a, *y = (const struct sockaddr_in *)b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)a, *y = (const struct sockaddr_in6 *)b;
    return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0;
  }
  return false;
}

int ce_addr_parse(const char *text, struct sockaddr_storage *out) {
  char host[CE_ADDR_TEXT_MAX];
  const char *port;
  size_t n = strlen(text);
  if (n > 0 && text[0] == '[') {
    const char *close = strchr(text, ']');
    if (close == NULL || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host))
      return CE_EINVAL;
    memcpy(host, text + 1, (size_t)(close - text - 1));
    host[close - text - 1] = '\0';
    port = close + 2;
  } else {
    /* An IPv6 address needs brackets: "::1:80" could be either. */
    const char *colon = strchr(text, ':');
    if (colon == NULL || colon != strrchr(text, ':') || (size_t)(colon - text) >= sizeof(host))
      return CE_EINVAL;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    port = colon + 1;
  }
  if (port[0] < '0' || port[0] > '9' || strlen(port) > 5)
    return CE_EINVAL;
  char *end;
  long p = strtol(port, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535)
    return CE_EINVAL;
  memset(out, 0, sizeof(*out));
  struct sockaddr_in *s4 = (struct sockaddr_in *)out;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)out;
  if (ce_ipv4_parse(host, strlen(host), (uint8_t *)&s4->sin_addr) == 0) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)p);
    return CE_OK;
  }
  memset(out, 0, sizeof(*out));
  if (ce_ipv6_parse(host, strlen(host), s6->sin6_addr.s6_addr) == 0) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)p);
    return CE_OK;
  }
  return CE_EINVAL;
}
