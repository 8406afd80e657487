/*
 * IP literal parsing and formatting (see ip.h). Both parsers reject
 * anything a resolver might read differently from us: no octal or hex
 * IPv4 parts, no short forms like "127.1", no zone ids.
 */
#include "policy/ip.h"

#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "common/text.h"

/* An IPv6 address has eight 16-bit groups (RFC 4291 §2.2). */
#define IPV6_GROUPS 8
/* A group is written with one to four hex digits (RFC 4291 §2.2 item 1). */
#define IPV6_GROUP_DIGITS_MAX 4
/* A dotted-quad part has at most three digits ("255"). */
#define IPV4_PART_DIGITS_MAX 3

static int is_digit(char c) { return c >= '0' && c <= '9'; }


int ce_ipv4_parse(const char *s, size_t n, uint8_t out[4]) {
  uint8_t parts[4];
  size_t i = 0;

  for (int part = 0; part < 4; part++) {
    if (part > 0) {
      if (i >= n || s[i] != '.')
        return CE_EINVAL;
      i++;
    }
    size_t start = i;
    unsigned value = 0;
    while (i < n && is_digit(s[i]) && i - start < IPV4_PART_DIGITS_MAX + 1) {
      value = value * 10 + (unsigned)(s[i] - '0');
      i++;
    }
    size_t digits = i - start;
    if (digits == 0 || digits > IPV4_PART_DIGITS_MAX || value > 255)
      return CE_EINVAL;
    /* A leading zero means octal to inet_aton(3); refuse it rather than
     * guess which reading the upstream resolver will pick. */
    if (digits > 1 && s[start] == '0')
      return CE_EINVAL;
    parts[part] = (uint8_t)value;
  }
  if (i != n)
    return CE_EINVAL;
  memcpy(out, parts, sizeof(parts));
  return 0;
}

int ce_ipv6_parse(const char *s, size_t n, uint8_t out[16]) {
  uint16_t groups[IPV6_GROUPS];
  size_t ngroups = 0;
  int gap = -1; /* index in groups[] where "::" stands, or -1 */
  size_t i = 0;

  if (n == 0)
    return CE_EINVAL;
  if (s[0] == ':') {
    /* A leading colon is only valid as the start of "::". */
    if (n < 2 || s[1] != ':')
      return CE_EINVAL;
    gap = 0;
    i = 2;
  }

  while (i < n) {
    size_t start = i;
    unsigned value = 0;
    while (i < n && ce_hex_value(s[i]) >= 0 && i - start <= IPV6_GROUP_DIGITS_MAX) {
      value = value * 16 + (unsigned)ce_hex_value(s[i]);
      i++;
    }
    if (i < n && s[i] == '.') {
      /* RFC 4291 §2.2 item 3: a dotted quad may replace the last two
       * groups, so it must run to the end of the text. */
      uint8_t v4[4];
      if (ngroups > IPV6_GROUPS - 2 || ce_ipv4_parse(s + start, n - start, v4) != 0)
        return CE_EINVAL;
      groups[ngroups++] = (uint16_t)(v4[0] << 8 | v4[1]);
      groups[ngroups++] = (uint16_t)(v4[2] << 8 | v4[3]);
      i = n;
      break;
    }
    size_t digits = i - start;
    if (digits == 0 || digits > IPV6_GROUP_DIGITS_MAX || ngroups >= IPV6_GROUPS)
      return CE_EINVAL;
    groups[ngroups++] = (uint16_t)value;
    if (i == n)
      break;
    if (s[i] != ':')
      return CE_EINVAL;
    i++;
    if (i < n && s[i] == ':') {
      if (gap >= 0)
        return CE_EINVAL; /* "::" may appear only once */
      gap = (int)ngroups;
      i++;
    } else if (i == n) {
      return CE_EINVAL; /* a single trailing colon */
    }
  }

  if (gap < 0 && ngroups != IPV6_GROUPS)
    return CE_EINVAL;
  /* "::" stands for one or more zero groups, so at most seven are written. */
  if (gap >= 0 && ngroups >= IPV6_GROUPS)
    return CE_EINVAL;

  uint16_t full[IPV6_GROUPS] = {0};
  if (gap < 0) {
    memcpy(full, groups, sizeof(full));
  } else {
    size_t head = (size_t)gap;
    size_t tail = ngroups - head;
    memcpy(full, groups, head * sizeof(uint16_t));
    memcpy(full + IPV6_GROUPS - tail, groups + head, tail * sizeof(uint16_t));
  }
  for (size_t g = 0; g < IPV6_GROUPS; g++) {
    out[2 * g] = (uint8_t)(full[g] >> 8);
    out[2 * g + 1] = (uint8_t)(full[g] & 0xff);
  }
  return 0;
}

int ce_ipv6_is_v4_mapped(const uint8_t addr[16]) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(addr, prefix, sizeof(prefix)) == 0;
}

size_t ce_ipv4_format(const uint8_t addr[4], char out[CE_IPV4_TEXT_MAX + 1]) {
  int len = snprintf(out, CE_IPV4_TEXT_MAX + 1, "%u.%u.%u.%u", addr[0], addr[1],
                     addr[2], addr[3]);
  return (size_t)len;
}

size_t ce_ipv6_format(const uint8_t addr[16], char out[CE_IPV6_TEXT_MAX + 1]) {
  static const char hex[] = "0123456789abcdef";
  uint16_t g[IPV6_GROUPS];
  for (size_t k = 0; k < IPV6_GROUPS; k++)
    g[k] = (uint16_t)(addr[2 * k] << 8 | addr[2 * k + 1]);

  /* RFC 5952 §4.2.1-4.2.3: compress the longest run of at least two zero
   * groups, the first one when two runs tie. */
  int best = -1, best_len = 0;
  for (int k = 0; k < IPV6_GROUPS;) {
    if (g[k] != 0) {
      k++;
      continue;
    }
    int run = k;
    while (k < IPV6_GROUPS && g[k] == 0)
      k++;
    if (k - run > best_len) {
      best = run;
      best_len = k - run;
    }
  }
  if (best_len < 2)
    best = -1;

  size_t o = 0;
  for (int k = 0; k < IPV6_GROUPS; k++) {
    if (k == best) {
      out[o++] = ':';
      out[o++] = ':';
      k += best_len - 1;
      continue;
    }
    if (k > 0 && k != best + best_len)
      out[o++] = ':';
    /* RFC 5952 §4.1: no leading zeros; §4.3: lower case. */
    int started = 0;
    for (int shift = 12; shift >= 0; shift -= 4) {
      unsigned nib = (g[k] >> shift) & 0xf;
      if (nib != 0 || started || shift == 0) {
        out[o++] = hex[nib];
        started = 1;
      }
    }
  }
  out[o] = '\0';
  return o;
}
