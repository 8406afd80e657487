/*
 * IP literals for the policy engine: the strict IPv4 dotted quad, the
 * RFC 4291 §2.2 IPv6 text forms, and the RFC 5952 canonical IPv6 text.
 *
 * docs/host-matching.md §1 steps 2, 3 and 6 say which spellings are
 * accepted; everything here is allocation-free and works on (pointer,
 * length) spans that need not be NUL-terminated.
 */
#ifndef CE_POLICY_IP_H
#define CE_POLICY_IP_H

#include <stddef.h>
#include <stdint.h>

/* "255.255.255.255" is the longest dotted quad. */
#define CE_IPV4_TEXT_MAX 15
/* "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" is the longest RFC 5952 text,
 * because the formatter never writes a dotted IPv4 tail. */
#define CE_IPV6_TEXT_MAX 39

/* Parses a strict dotted quad: four parts of 1-3 ASCII digits, each at most
 * 255 and without a leading zero ("0" alone is fine).
 * Returns 0 and fills out[4], or CE_EINVAL; on failure out is untouched. */
int ce_ipv4_parse(const char *s, size_t n, uint8_t out[4]);

/* Parses an IPv6 address in one of the text forms of RFC 4291 §2.2: eight
 * groups of 1-4 hex digits, at most one "::" standing for one or more zero
 * groups, and optionally a trailing dotted quad (parsed as ce_ipv4_parse
 * does) in place of the last two groups. Zone ids ("%eth0") are not part
 * of the grammar and fail.
 * Returns 0 and fills out[16], or CE_EINVAL; on failure out is untouched. */
int ce_ipv6_parse(const char *s, size_t n, uint8_t out[16]);

/* Returns 1 when addr is an IPv4-mapped IPv6 address (::ffff:0:0/96,
 * RFC 4291 §2.5.5.2), else 0. */
int ce_ipv6_is_v4_mapped(const uint8_t addr[16]);

/* Writes the dotted quad of addr and a NUL into out.
 * Returns the text length (7 to CE_IPV4_TEXT_MAX); cannot fail. */
size_t ce_ipv4_format(const uint8_t addr[4], char out[CE_IPV4_TEXT_MAX + 1]);

/* Writes the RFC 5952 §4 text of addr and a NUL into out: lower-case hex
 * without leading zeros, the longest run of two or more zero groups
 * replaced by "::" (the first one on a tie), and never a dotted tail.
 * Returns the text length (2 to CE_IPV6_TEXT_MAX); cannot fail. */
size_t ce_ipv6_format(const uint8_t addr[16], char out[CE_IPV6_TEXT_MAX + 1]);

#endif
