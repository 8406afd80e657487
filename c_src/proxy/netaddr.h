/*
 * Socket-address helpers of the proxy: the original destination of a
 * REDIRECTed connection, the upstream socket mark, and the address classes
 * the proxy refuses to connect to unless told otherwise (DESIGN §4).
 */
#ifndef CE_PROXY_NETADDR_H
#define CE_PROXY_NETADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* "a.b.c.d" or "x:y::z" (no brackets, no port) is at most this long. */
#define CE_ADDR_TEXT_MAX 64

/* The destination the workspace dialled before iptables REDIRECT rewrote
 * it (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST). Returns CE_OK, or CE_ENOENT
 * when the connection was not redirected (no conntrack NAT entry), CE_EIO. */
int ce_original_dst(int fd, struct sockaddr_storage *out);

/* Sets SO_MARK on fd (needs CAP_NET_ADMIN or CAP_NET_RAW). Returns CE_OK
 * or CE_EPERM / CE_EIO. */
int ce_set_mark(int fd, uint32_t mark);

/* Loopback, RFC 1918, CGNAT (100.64/10), link-local (169.254/16, cloud
 * metadata), "this network" (0/8), benchmarking (198.18/15), multicast,
 * broadcast, and their IPv6 counterparts (::/96 including :: and ::1,
 * fe80::/10, fc00::/7, ff00::/8, local-use NAT64 64:ff9b:1::/48;
 * v4-mapped, NAT64 64:ff9b::/96 and 6to4 2002::/16 addresses are judged
 * by their IPv4 part). */
bool ce_addr_is_private(const struct sockaddr *sa);

/* 127.0.0.0/8, ::1, and ::ffff:127.0.0.0/104 (an IPv4 loopback client of
 * a dual-stack socket). */
bool ce_addr_is_loopback(const struct sockaddr *sa);

/* Text of the address only (no port). Returns the length. */
size_t ce_addr_text(const struct sockaddr *sa, char out[CE_ADDR_TEXT_MAX]);
uint16_t ce_addr_port(const struct sockaddr *sa);

/* Same address and port. */
bool ce_addr_equal(const struct sockaddr *a, const struct sockaddr *b);

/* Parses "1.2.3.4:80", "[::1]:80". Returns CE_OK or CE_EINVAL. */
int ce_addr_parse(const char *text, struct sockaddr_storage *out);

#endif
