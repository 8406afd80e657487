/*
 * The interception rules written by `condukt-egress netfilter-setup`
 * (docs/netfilter.md), as iptables-restore input, and the parsers for the
 * values they are built from.
 *
 * Everything here is pure: no I/O, no allocation, no global state. The
 * command (netfilter_cmd.c) reads files, probes the kernel and runs the
 * iptables programs; this file only turns values into text, so every byte
 * the command feeds to iptables-restore can be unit-tested.
 */
#ifndef CE_NETFILTER_RULES_H
#define CE_NETFILTER_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/text.h"
#include "policy/ip.h"

/* Our own chains. Everything we install lives in them, so a rerun can
 * rebuild them whole and --remove knows exactly what to delete. */
#define CE_NF_NAT_CHAIN "CONDUKT_NAT"
#define CE_NF_FILTER_CHAIN "CONDUKT_FILTER"

#define CE_NF_DEFAULT_PROXY_PORT 15001
/* 0x539 = 1337. Any non-zero value works as long as the proxy sets the
 * same one with SO_MARK on its upstream sockets. */
#define CE_NF_DEFAULT_MARK 0x539u
#define CE_NF_DEFAULT_PORTS "80,443"
/* The proxy's uid: the exemption is the mark AND this socket owner. The
 * proxy drops to it at start (proxy --user), Local and the testbed start
 * it as this uid. */
#define CE_NF_DEFAULT_SIDECAR_UID 1337u
/* Where the workspace's DNS (UDP and TCP 53, any destination) is
 * redirected: the sidecar's resolver on 127.0.0.1 and [::1]. */
#define CE_NF_DEFAULT_DNS_PORT 15053

/* The multiport match takes at most 15 ports, and one REDIRECT rule with
 * one multiport match is what we generate. */
#define CE_NF_PORTS_MAX 15
/* Resolvers in --dns. The C library only uses the first three of
 * resolv.conf (CE_NF_RESOLV_MAXNS); eight leaves room for both families
 * without letting a typo open port 53 to a long list of hosts. */
#define CE_NF_DNS_MAX 8
/* glibc's and musl's MAXNS: later nameserver lines are never queried. */
#define CE_NF_RESOLV_MAXNS 3
/* IFNAMSIZ - 1: the longest Linux interface name, for a scoped address's
 * zone ("fe80::1%eth0"). */
#define CE_NF_IFNAME_MAX 15
/* Room for the longest text any generator below writes; the limits above
 * bound it (the IPv6 rules with 8 scoped resolvers are under 3 KiB). */
#define CE_NF_TEXT_MAX 8192

typedef enum { CE_NF_IPV4 = 4, CE_NF_IPV6 = 6 } ce_nf_family_t;

typedef enum {
  CE_NF_IPV6_AUTO = 0, /* on when the kernel has IPv6 */
  CE_NF_IPV6_ON,       /* required: an error when the kernel has none */
  CE_NF_IPV6_OFF       /* IPv6 egress left unrestricted (warned about) */
} ce_nf_ipv6_mode_t;

/* One resolver address. */
typedef struct {
  ce_nf_family_t family;
  uint8_t addr[16]; /* the first 4 bytes for IPv4 */
  /* The interface of a scoped IPv6 address ("eth0" in "fe80::1%eth0"),
   * or "" when the address has no zone. */
  char zone[CE_NF_IFNAME_MAX + 1];
} ce_nf_addr_t;

/* What the rules are built from. ce_nf_config_init() fills the defaults;
 * the parsers below replace one field each. */
typedef struct {
  uint16_t proxy_port;
  uint32_t mark;
  /* The socket owner that, with the mark, makes traffic exempt. Never 0:
   * the workspace may be root. */
  uint32_t sidecar_uid;
  /* The local port the workspace's DNS is redirected to (unless dns_any). */
  uint16_t dns_port;
  uint16_t ports[CE_NF_PORTS_MAX];
  size_t nports;
  /* When set, TCP and UDP 53 are open to every address from every
   * process, nothing is redirected to dns_port, and dns[] is ignored (the
   * escape hatch of --dns any). When clear, the workspace's port 53 goes
   * to dns_port, and only the sidecar's uid may reach port 53 of the
   * addresses in dns[] (possibly none) without the mark. */
  bool dns_any;
  ce_nf_addr_t dns[CE_NF_DNS_MAX];
  size_t ndns;
} ce_nf_config_t;

/* The longest text of ce_nf_addr_format: an IPv6 address, '%', a zone. */
#define CE_NF_ADDR_TEXT_MAX (CE_IPV6_TEXT_MAX + 1 + CE_NF_IFNAME_MAX)

/* Why a value was refused: what kind of value ("port"), the word itself
 * (sanitised by ce_text_sanitize, so it is safe to print) and the reason.
 * what and why point to static strings. */
typedef struct {
  const char *what;
  const char *why;
  char word[4 * CE_TEXT_QUOTE_MAX + 8];
} ce_nf_error_t;

/* Fills cfg with the defaults: proxy port 15001, mark 0x539, sidecar uid
 * 1337, ports 80 and 443, DNS redirected to port 15053 and no upstream
 * resolver (the command fills them from --dns or resolv.conf).
 * Cannot fail. */
void ce_nf_config_init(ce_nf_config_t *cfg);

/* Parses a TCP port: 1 to 65535 in decimal.
 * Returns 0, or CE_EINVAL with *err filled; on failure *out is untouched. */
int ce_nf_parse_port(const char *s, uint16_t *out, ce_nf_error_t *err);

/* Parses a packet mark: decimal without leading zeros (so "010" is not
 * silently read as octal or as ten) or "0x" hex, from 1 to 0xffffffff.
 * Zero is refused: it is the mark of every unmarked packet, so it would
 * exempt all traffic. The rules match it under the full 32-bit mask.
 * Returns 0, or CE_EINVAL with *err filled; on failure *out is untouched. */
int ce_nf_parse_mark(const char *s, uint32_t *out, ce_nf_error_t *err);

/* Parses the sidecar's uid: decimal without leading zeros, 1 to
 * 4294967294. 0 is refused: the workspace may be root, so root must never
 * be half of the exemption; 4294967295 is (uid_t)-1, "no uid".
 * Returns 0, or CE_EINVAL with *err filled; on failure *out is untouched. */
int ce_nf_parse_uid(const char *s, uint32_t *out, ce_nf_error_t *err);

/* Parses a comma-separated port list ("80,443") into cfg->ports: at least
 * one port, at most CE_NF_PORTS_MAX, each as ce_nf_parse_port, none twice.
 * Returns 0, or CE_EINVAL with *err naming the offending element; on
 * failure cfg is untouched. */
int ce_nf_parse_ports(const char *s, ce_nf_config_t *cfg, ce_nf_error_t *err);

/* Parses --dns: "any", "none", or a comma-separated list of resolver
 * addresses. An address is a strict dotted quad or an RFC 4291 IPv6 text,
 * optionally followed by "%IFNAME" (the zone, an interface name of 1 to 15
 * bytes of [A-Za-z0-9_.-], not all digits; the rule then also matches on
 * that output interface). An IPv4-mapped IPv6 address counts as IPv4.
 * Duplicates are dropped; more than CE_NF_DNS_MAX distinct addresses is an
 * error. Returns 0, or CE_EINVAL with *err naming the offending element;
 * on failure cfg is untouched. */
int ce_nf_parse_dns(const char *s, ce_nf_config_t *cfg, ce_nf_error_t *err);

/* Called for every nameserver line of resolv.conf that the parser below
 * does not turn into a rule: line is 1-based, word is the sanitised
 * address (may be ""), why a static reason. */
typedef void (*ce_nf_skip_cb)(void *ctx, size_t line, const char *word,
                              const char *why);

/* Reads the resolvers from resolv.conf text (text[0..n), need not be
 * NUL-terminated) into cfg->dns, replacing what was there and clearing
 * cfg->dns_any. It reads the file the way glibc's res_init does, so the
 * rules open exactly the resolvers the C library will query:
 *   - only lines that start with "nameserver" followed by a blank count;
 *     comments ('#' or ';' at the start) and other keywords are ignored;
 *   - the address ends at a blank, '#' or ';';
 *   - IPv4 is read as inet_aton reads it ("10.1" is 10.0.0.1), IPv6 as
 *     inet_pton does, with an optional "%zone" as in ce_nf_parse_dns;
 *   - an address that does not parse is skipped (the C library skips it
 *     too), and so is every address after the first CE_NF_RESOLV_MAXNS.
 * Each skipped line is reported through skip (which may be NULL).
 * No nameserver line at all leaves cfg->ndns == 0: the C library then
 * queries the loopback resolver, which the loopback rule already allows.
 * Returns 0; cannot fail. */
int ce_nf_parse_resolv_conf(const char *text, size_t n, ce_nf_config_t *cfg,
                            ce_nf_skip_cb skip, void *ctx);

/* Writes the address as the rules spell it (dotted quad, RFC 5952 IPv6),
 * followed by "%zone" when it has one, and a NUL.
 * Returns the text length; cannot fail. */
size_t ce_nf_addr_format(const ce_nf_addr_t *a,
                         char out[CE_NF_ADDR_TEXT_MAX + 1]);

/* Parses "auto", "on" or "off".
 * Returns 0, or CE_EINVAL with *err filled; on failure *out is untouched. */
int ce_nf_parse_ipv6_mode(const char *s, ce_nf_ipv6_mode_t *out,
                          ce_nf_error_t *err);

/* Decides whether IPv6 rules are written, given whether the kernel has
 * IPv6 (/proc/net/if_inet6 exists). Returns 0 and sets *out, or
 * CE_EUNAVAIL for CE_NF_IPV6_ON on a kernel without IPv6 (*out untouched). */
int ce_nf_ipv6_wanted(ce_nf_ipv6_mode_t mode, bool kernel_has_ipv6,
                      bool *out);

/* The two hooks we own: the jump from OUTPUT in each table to our chain. */
typedef struct {
  const char *table;
  const char *chain;
} ce_nf_hook_t;

#define CE_NF_HOOK_COUNT 2
/* nat first, then filter, the order the kernel runs them in OUTPUT. */
extern const ce_nf_hook_t ce_nf_hooks[CE_NF_HOOK_COUNT];

/* The generators below write iptables-restore input (for
 * `iptables-restore --noflush` or `ip6tables-restore --noflush`) into
 * buf[0..cap), NUL-terminated, and set *len to its length. Each returns 0,
 * or CE_ETOOBIG when cap is too small (cap >= CE_NF_TEXT_MAX always
 * suffices); on failure the content of buf is unspecified. */

/* The rules of one family: declares our two chains (which creates them,
 * or empties them when they exist, in the same transaction) and fills
 * them. It never touches OUTPUT, so a rerun replaces the rules atomically
 * while the existing jumps keep pointing at them. */
int ce_nf_rules_text(const ce_nf_config_t *cfg, ce_nf_family_t family,
                     char *buf, size_t cap, size_t *len);

/* Inserts the jump from OUTPUT for the hooks whose bit (1 << index in
 * ce_nf_hooks) is set in missing, at position 1 so no earlier rule in
 * OUTPUT can accept traffic before ours see it. missing == 0 gives "". */
int ce_nf_jumps_text(unsigned missing, char *buf, size_t cap, size_t *len);

/* Declares (creates or empties) our chains and nothing else: the first
 * step of --remove, so that the jump checks that follow find the chains
 * present and the chains are empty before their jumps go. */
int ce_nf_flush_text(char *buf, size_t cap, size_t *len);

/* Declares and then deletes our chains: the last step of --remove, once
 * no jump points to them any more. Succeeds whether or not they existed. */
int ce_nf_delete_text(char *buf, size_t cap, size_t *len);

#endif
