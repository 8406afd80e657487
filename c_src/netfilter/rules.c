#include "netfilter/rules.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "policy/ip.h"

const ce_nf_hook_t ce_nf_hooks[CE_NF_HOOK_COUNT] = {
    {"nat", CE_NF_NAT_CHAIN},
    {"filter", CE_NF_FILTER_CHAIN},
};

/* The longest resolver word we look at: an IPv6 text with a dotted tail
 * (45 bytes), '%' and an interface name. Anything longer is refused before
 * it is copied. */
#define NF__ADDR_WORD_MAX 64

void ce_nf_config_init(ce_nf_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->proxy_port = CE_NF_DEFAULT_PROXY_PORT;
  cfg->mark = CE_NF_DEFAULT_MARK;
  cfg->sidecar_uid = CE_NF_DEFAULT_SIDECAR_UID;
  cfg->dns_port = CE_NF_DEFAULT_DNS_PORT;
  cfg->ports[0] = 80;
  cfg->ports[1] = 443;
  cfg->nports = 2;
}

static int fail(ce_nf_error_t *err, const char *what, const char *word,
                size_t n, const char *why) {
  err->what = what;
  err->why = why;
  ce_text_sanitize(err->word, sizeof(err->word), word, n, 0);
  return CE_EINVAL;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Port parsing on a span, shared by --proxy-port and the --ports list. */
static int parse_port_span(const char *s, size_t n, uint16_t *out,
                           ce_nf_error_t *err) {
  static const char why[] = "not a port number from 1 to 65535";
  uint32_t v = 0;
  if (n == 0 || n > 5)
    return fail(err, "port", s, n, why);
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(s[i]))
      return fail(err, "port", s, n, why);
    v = v * 10 + (uint32_t)(s[i] - '0');
  }
  if (v == 0 || v > 65535)
    return fail(err, "port", s, n, why);
  *out = (uint16_t)v;
  return 0;
}

int ce_nf_parse_port(const char *s, uint16_t *out, ce_nf_error_t *err) {
  return parse_port_span(s, strlen(s), out, err);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int ce_nf_parse_mark(const char *s, uint32_t *out, ce_nf_error_t *err) {
  static const char why[] =
      "not a mark (decimal without leading zeros, or 0x hex, up to 0xffffffff)";
  size_t n = strlen(s);
  uint64_t v = 0;
  if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    if (n - 2 > 8)
      return fail(err, "mark", s, n, why);
    for (size_t i = 2; i < n; i++) {
      int d = hex_value(s[i]);
      if (d < 0)
        return fail(err, "mark", s, n, why);
      v = v * 16 + (uint64_t)d;
    }
  } else {
    if (n == 0 || n > 10 || (s[0] == '0' && n > 1))
      return fail(err, "mark", s, n, why);
    for (size_t i = 0; i < n; i++) {
      if (!is_digit(s[i]))
        return fail(err, "mark", s, n, why);
      v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
      return fail(err, "mark", s, n, why);
  }
  if (v == 0)
    return fail(err, "mark", s, n,
                "0 is the mark of every unmarked packet, so it would exempt "
                "all traffic");
  *out = (uint32_t)v;
  return 0;
}

int ce_nf_parse_uid(const char *s, uint32_t *out, ce_nf_error_t *err) {
  static const char why[] =
      "not a uid (decimal without leading zeros, 1 to 4294967294)";
  size_t n = strlen(s);
  uint64_t v = 0;
  if (n == 0 || n > 10 || s[0] == '0')
    return fail(err, "uid", s, n,
                n == 1 && s[0] == '0'
                    ? "0 is root, and the workspace may be root: the "
                      "sidecar needs a uid of its own"
                    : why);
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(s[i]))
      return fail(err, "uid", s, n, why);
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v >= UINT32_MAX)
    return fail(err, "uid", s, n, why);
  *out = (uint32_t)v;
  return 0;
}

int ce_nf_parse_ports(const char *s, ce_nf_config_t *cfg, ce_nf_error_t *err) {
  uint16_t ports[CE_NF_PORTS_MAX];
  size_t count = 0;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
    if (count == CE_NF_PORTS_MAX)
      return fail(err, "port list", s, strlen(s),
                  "more than 15 ports (the multiport match's limit)");
    uint16_t port;
    int rc = parse_port_span(p, n, &port, err);
    if (rc != 0)
      return rc;
    for (size_t i = 0; i < count; i++) {
      if (ports[i] == port)
        return fail(err, "port", p, n, "listed twice");
    }
    ports[count++] = port;
    if (comma == NULL)
      break;
    p = comma + 1;
  }
  memcpy(cfg->ports, ports, count * sizeof(ports[0]));
  cfg->nports = count;
  return 0;
}

/* A zone must name an interface, and must be safe to pass to `-o`: '+'
 * would make iptables read it as a wildcard, and blanks or quotes would
 * split the restore line. All-digit zones are interface indexes to the C
 * library, which a pure parser cannot map to a name. */
static int zone_valid(const char *z, size_t n) {
  if (n == 0 || n > CE_NF_IFNAME_MAX)
    return 0;
  if ((n == 1 && z[0] == '.') || (n == 2 && z[0] == '.' && z[1] == '.'))
    return 0;
  int digits = 1;
  for (size_t i = 0; i < n; i++) {
    char c = z[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             is_digit(c) || c == '_' || c == '.' || c == '-';
    if (!ok)
      return 0;
    if (!is_digit(c))
      digits = 0;
  }
  return !digits;
}

enum { V4_STRICT, V4_INET_ATON };

/* Parses one resolver word into *out. On failure returns CE_EINVAL and
 * sets *why; *out is then unspecified. */
static int parse_addr(const char *s, size_t n, int v4_syntax, ce_nf_addr_t *out,
                      const char **why) {
  char word[NF__ADDR_WORD_MAX + 1];
  if (n == 0) {
    *why = "empty address";
    return CE_EINVAL;
  }
  if (n > NF__ADDR_WORD_MAX) {
    *why = "not an IPv4 or IPv6 address";
    return CE_EINVAL;
  }
  memcpy(word, s, n);
  word[n] = '\0';
  memset(out, 0, sizeof(*out));

  char *pct = strchr(word, '%');
  size_t alen = pct != NULL ? (size_t)(pct - word) : n;
  if (pct == NULL) {
    if (v4_syntax == V4_STRICT) {
      if (ce_ipv4_parse(word, n, out->addr) == 0) {
        out->family = CE_NF_IPV4;
        return 0;
      }
    } else {
      struct in_addr a;
      /* inet_aton is what glibc's res_init uses (its exact variant, which
       * also wants the whole word, as here: the word has no blanks). */
      if (inet_aton(word, &a) != 0) {
        memcpy(out->addr, &a.s_addr, 4);
        out->family = CE_NF_IPV4;
        return 0;
      }
    }
  }
  if (ce_ipv6_parse(word, alen, out->addr) != 0) {
    *why = pct != NULL ? "not an IPv6 address before the '%' zone"
                       : "not an IPv4 or IPv6 address";
    return CE_EINVAL;
  }
  out->family = CE_NF_IPV6;
  if (ce_ipv6_is_v4_mapped(out->addr)) {
    if (pct != NULL) {
      *why = "a zone on an IPv4-mapped address";
      return CE_EINVAL;
    }
    /* A socket that sends to ::ffff:a.b.c.d sends IPv4 packets, so the
     * address belongs in the IPv4 rules. */
    memmove(out->addr, out->addr + 12, 4);
    memset(out->addr + 4, 0, 12);
    out->family = CE_NF_IPV4;
    return 0;
  }
  if (pct != NULL) {
    const char *zone = pct + 1;
    size_t zlen = n - alen - 1;
    if (!zone_valid(zone, zlen)) {
      *why = "the zone after '%' is not an interface name (1 to 15 of "
             "A-Z a-z 0-9 _ . -, not all digits)";
      return CE_EINVAL;
    }
    memcpy(out->zone, zone, zlen);
    out->zone[zlen] = '\0';
  }
  return 0;
}

static int addr_equal(const ce_nf_addr_t *a, const ce_nf_addr_t *b) {
  return a->family == b->family && memcmp(a->addr, b->addr, 16) == 0 &&
         strcmp(a->zone, b->zone) == 0;
}

/* Appends a unless an equal address is already there. Returns 1 when
 * added, 0 when a duplicate, -1 when full. */
static int add_unique(ce_nf_addr_t *list, size_t *count, size_t max,
                      const ce_nf_addr_t *a) {
  for (size_t i = 0; i < *count; i++) {
    if (addr_equal(&list[i], a))
      return 0;
  }
  if (*count == max)
    return -1;
  list[(*count)++] = *a;
  return 1;
}

int ce_nf_parse_dns(const char *s, ce_nf_config_t *cfg, ce_nf_error_t *err) {
  if (strcmp(s, "any") == 0) {
    cfg->dns_any = true;
    cfg->ndns = 0;
    return 0;
  }
  if (strcmp(s, "none") == 0) {
    cfg->dns_any = false;
    cfg->ndns = 0;
    return 0;
  }
  ce_nf_addr_t list[CE_NF_DNS_MAX];
  size_t count = 0;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
    ce_nf_addr_t a;
    const char *why = NULL;
    if ((n == 3 && memcmp(p, "any", 3) == 0) ||
        (n == 4 && memcmp(p, "none", 4) == 0))
      return fail(err, "resolver address", p, n,
                  "\"any\" and \"none\" stand alone, not in a list");
    if (parse_addr(p, n, V4_STRICT, &a, &why) != 0)
      return fail(err, "resolver address", p, n, why);
    if (add_unique(list, &count, CE_NF_DNS_MAX, &a) < 0)
      return fail(err, "resolver list", s, strlen(s),
                  "more than 8 resolver addresses");
    if (comma == NULL)
      break;
    p = comma + 1;
  }
  memcpy(cfg->dns, list, count * sizeof(list[0]));
  cfg->ndns = count;
  cfg->dns_any = false;
  return 0;
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

int ce_nf_parse_resolv_conf(const char *text, size_t n, ce_nf_config_t *cfg,
                            ce_nf_skip_cb skip, void *ctx) {
  static const char kw[] = "nameserver";
  const size_t kwlen = sizeof(kw) - 1;
  size_t count = 0, line = 0, i = 0;
  cfg->dns_any = false;
  while (i < n) {
    const char *l = text + i;
    const char *nl = memchr(l, '\n', n - i);
    size_t len = nl != NULL ? (size_t)(nl - l) : n - i;
    i += len + (nl != NULL);
    line++;
    /* Like res_init: the keyword at the very start of the line, then a
     * blank. Leading blanks, comments and other keywords do not match. */
    if (len <= kwlen || memcmp(l, kw, kwlen) != 0 || !is_blank(l[kwlen]))
      continue;
    size_t a = kwlen;
    while (a < len && is_blank(l[a]))
      a++;
    size_t e = a;
    while (e < len && !is_blank(l[e]) && l[e] != '#' && l[e] != ';' &&
           l[e] != '\r')
      e++;
    char shown[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown, sizeof(shown), l + a, e - a, 0);
    ce_nf_addr_t addr;
    const char *why = NULL;
    if (parse_addr(l + a, e - a, V4_INET_ATON, &addr, &why) != 0) {
      if (skip != NULL)
        skip(ctx, line, shown, why);
      continue;
    }
    if (count == CE_NF_RESOLV_MAXNS) {
      if (skip != NULL)
        skip(ctx, line, shown,
             "the C library only queries the first 3 nameservers");
      continue;
    }
    /* A repeated address still counts toward the three, as it does in
     * res_init, but needs no second rule. */
    count++;
    (void)add_unique(cfg->dns, &cfg->ndns, CE_NF_DNS_MAX, &addr);
  }
  return 0;
}

size_t ce_nf_addr_format(const ce_nf_addr_t *a,
                         char out[CE_NF_ADDR_TEXT_MAX + 1]) {
  size_t n = a->family == CE_NF_IPV4 ? ce_ipv4_format(a->addr, out)
                                     : ce_ipv6_format(a->addr, out);
  if (a->zone[0] != '\0') {
    size_t z = strlen(a->zone);
    out[n++] = '%';
    memcpy(out + n, a->zone, z + 1);
    n += z;
  }
  return n;
}

int ce_nf_parse_ipv6_mode(const char *s, ce_nf_ipv6_mode_t *out,
                          ce_nf_error_t *err) {
  if (strcmp(s, "auto") == 0)
    *out = CE_NF_IPV6_AUTO;
  else if (strcmp(s, "on") == 0)
    *out = CE_NF_IPV6_ON;
  else if (strcmp(s, "off") == 0)
    *out = CE_NF_IPV6_OFF;
  else
    return fail(err, "IPv6 mode", s, strlen(s), "not auto, on or off");
  return 0;
}

int ce_nf_ipv6_wanted(ce_nf_ipv6_mode_t mode, bool kernel_has_ipv6,
                      bool *out) {
  switch (mode) {
  case CE_NF_IPV6_ON:
    if (!kernel_has_ipv6)
      return CE_EUNAVAIL;
    *out = true;
    return 0;
  case CE_NF_IPV6_OFF:
    *out = false;
    return 0;
  case CE_NF_IPV6_AUTO:
  default:
    *out = kernel_has_ipv6;
    return 0;
  }
}

/* A bounded text buffer: appends stop at the first overflow, which is
 * reported once at the end. */
typedef struct {
  char *buf;
  size_t cap, len;
  int overflow;
} nf__text_t;

__attribute__((format(printf, 2, 3))) static void put(nf__text_t *t,
                                                      const char *fmt, ...) {
  if (t->overflow)
    return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (w < 0 || (size_t)w >= t->cap - t->len) {
    t->overflow = 1;
    return;
  }
  t->len += (size_t)w;
}

static int begin(nf__text_t *t, char *buf, size_t cap) {
  if (cap == 0)
    return CE_ETOOBIG;
  t->buf = buf;
  t->cap = cap;
  t->len = 0;
  t->overflow = 0;
  buf[0] = '\0';
  return 0;
}

static int finish(const nf__text_t *t, size_t *len) {
  if (t->overflow)
    return CE_ETOOBIG;
  *len = t->len;
  return 0;
}

static void put_addr(nf__text_t *t, const ce_nf_addr_t *a) {
  if (a->family == CE_NF_IPV4) {
    char s[CE_IPV4_TEXT_MAX + 1];
    ce_ipv4_format(a->addr, s);
    put(t, "-d %s/32", s);
  } else {
    char s[CE_IPV6_TEXT_MAX + 1];
    ce_ipv6_format(a->addr, s);
    put(t, "-d %s/128", s);
  }
  if (a->zone[0] != '\0')
    put(t, " -o %s", a->zone);
}

/* Port 53 in the filter table. With --dns any, open to everyone (the
 * escape hatch). Otherwise only the sidecar's uid reaches the upstream
 * resolvers, without the mark: the C library's queries cannot carry one,
 * and the workspace cannot take that uid (docs/netfilter.md). The
 * workspace's own port 53 was redirected to the sidecar's resolver in nat
 * and is accepted by the DNAT rule. */
static void put_dns(nf__text_t *t, const ce_nf_config_t *cfg,
                    ce_nf_family_t family) {
  static const char *const protos[] = {"udp", "tcp"};
  for (size_t p = 0; p < 2; p++) {
    if (cfg->dns_any) {
      put(t, "-A " CE_NF_FILTER_CHAIN " -p %s --dport 53 -j ACCEPT\n",
          protos[p]);
      continue;
    }
    for (size_t i = 0; i < cfg->ndns; i++) {
      if (cfg->dns[i].family != family)
        continue;
      put(t, "-A " CE_NF_FILTER_CHAIN " ");
      put_addr(t, &cfg->dns[i]);
      put(t, " -p %s --dport 53 -m owner --uid-owner %" PRIu32 " -j ACCEPT\n",
          protos[p], cfg->sidecar_uid);
    }
  }
}

/* The packets the kernel must send for IPv6 to work at all. Neighbour
 * discovery (RFC 4861) replaces ARP, which iptables never sees, but NDP is
 * ICMPv6 and passes OUTPUT; conntrack leaves it untracked, so the
 * ESTABLISHED rule does not cover it. Without these the proxy's own
 * upstream connections cannot resolve the gateway. Hop limit 255 is what
 * RFC 4861 §7.1 requires of every ND message. Router solicitations only go
 * to link-scope multicast, ff02::/16. Solicitations and advertisements may
 * be unicast to an on-link neighbour's global address, so they are not
 * limited by destination. MLD reports (130-132, 143) are not here: the
 * kernel sends one for every group a process joins, and any process may
 * join a group whose address it chooses, which makes them a channel out of
 * the pod (docs/netfilter.md). */
static void put_ndp(nf__text_t *t) {
  static const char head[] = "-A " CE_NF_FILTER_CHAIN " ";
  put(t, "%s-p ipv6-icmp -m icmp6 --icmpv6-type neighbour-solicitation "
         "-m hl --hl-eq 255 -j ACCEPT\n", head);
  put(t, "%s-p ipv6-icmp -m icmp6 --icmpv6-type neighbour-advertisement "
         "-m hl --hl-eq 255 -j ACCEPT\n", head);
  put(t, "%s-d ff02::/16 -p ipv6-icmp -m icmp6 --icmpv6-type "
         "router-solicitation -m hl --hl-eq 255 -j ACCEPT\n", head);
}

int ce_nf_rules_text(const ce_nf_config_t *cfg, ce_nf_family_t family,
                     char *buf, size_t cap, size_t *len) {
  nf__text_t t;
  if (begin(&t, buf, cap) != 0)
    return CE_ETOOBIG;
  const int v6 = family == CE_NF_IPV6;
  const char *loopback = v6 ? "::1/128" : "127.0.0.1/32";
  const char *nat = "-A " CE_NF_NAT_CHAIN " ";
  const char *flt = "-A " CE_NF_FILTER_CHAIN " ";
  static const char *const protos[] = {"udp", "tcp"};
  /* The exemption: the proxy's mark on a socket its uid owns. Either half
   * alone is not enough (docs/netfilter.md, "The exemption"): the mark
   * can be set with CAP_NET_RAW, a root workspace with CAP_SETUID could
   * take the uid. */
  char exempt[96];
  snprintf(exempt, sizeof(exempt),
           "-m mark --mark 0x%" PRIx32 "/0xffffffff -m owner --uid-owner %" PRIu32,
           cfg->mark, cfg->sidecar_uid);

  /* nat: the first packet of each new connection goes through this chain
   * once; conntrack applies the verdict to the rest of the connection. */
  put(&t, "*nat\n:" CE_NF_NAT_CHAIN " - [0:0]\n");
  /* The proxy's upstream sockets leave as they are. Their connection mark
   * gets the mark first: the proxy deletes the conntrack entries of its
   * own connections, and only those, by it when it starts again
   * (netfilter/ctflush.h), and the filter table below recognises the
   * last packets of a connection whose socket the proxy already closed
   * by it. nat sees only the first packet of a connection, so this runs
   * once per connection, and only for a socket of the sidecar's uid. */
  put(&t, "%s%s -j CONNMARK --set-xmark 0x%" PRIx32 "/0xffffffff\n", nat,
      exempt, cfg->mark);
  put(&t, "%s%s -j RETURN\n", nat, exempt);
  /* Traffic to the pod itself (a dev server on localhost:80, the pod IP)
   * is not egress; redirecting it would break it. */
  put(&t, "%s-o lo -j RETURN\n", nat);
  put(&t, "%s-p tcp -m multiport --dports ", nat);
  for (size_t i = 0; i < cfg->nports; i++)
    put(&t, "%s%u", i > 0 ? "," : "", (unsigned)cfg->ports[i]);
  put(&t, " -j REDIRECT --to-ports %u\n", (unsigned)cfg->proxy_port);
  if (!cfg->dns_any) {
    /* The sidecar's own queries (the C library's, unmarked) go to the
     * real resolvers; the filter table limits them to dns[]. Everyone
     * else's port 53, whatever the destination, goes to the sidecar's
     * resolver. */
    for (size_t p = 0; p < 2; p++)
      put(&t, "%s-p %s --dport 53 -m owner --uid-owner %" PRIu32
              " -j RETURN\n", nat, protos[p], cfg->sidecar_uid);
    for (size_t p = 0; p < 2; p++)
      put(&t, "%s-p %s --dport 53 -j REDIRECT --to-ports %u\n", nat,
          protos[p], (unsigned)cfg->dns_port);
  }
  put(&t, "COMMIT\n");

  put(&t, "*filter\n:" CE_NF_FILTER_CHAIN " - [0:0]\n");
  put(&t, "%s-o lo -j ACCEPT\n", flt);
  /* The redirected connections. The filter table sees the output
   * interface chosen before nat rewrote the destination, so a redirected
   * packet still shows the pod's outward interface, not lo, and the rule
   * above misses it (the netns test proves this). Its destination is the
   * loopback address and conntrack knows it was rewritten (DNAT). */
  put(&t, "%s-d %s -p tcp --dport %u -m conntrack --ctstate DNAT -j ACCEPT\n",
      flt, loopback, (unsigned)cfg->proxy_port);
  if (!cfg->dns_any) {
    for (size_t p = 0; p < 2; p++)
      put(&t, "%s-d %s -p %s --dport %u -m conntrack --ctstate DNAT "
              "-j ACCEPT\n", flt, loopback, protos[p],
          (unsigned)cfg->dns_port);
  }
  put(&t, "%s%s -j ACCEPT\n", flt, exempt);
  /* A socket the proxy closed is orphaned: the kernel still sends its
   * last packets (the FIN's retransmissions, the final ACK, unsent data)
   * with the socket's mark, but the owner match no longer sees a uid.
   * They are let through when the packet carries the mark, has no live
   * socket, and belongs to a connection whose first packet passed the
   * exemption (its connection mark, set in nat above). */
  put(&t, "%s-m mark --mark 0x%" PRIx32 "/0xffffffff -m connmark --mark 0x%"
          PRIx32 "/0xffffffff -m owner ! --socket-exists -j ACCEPT\n",
      flt, cfg->mark, cfg->mark);
  /* Replies to connections opened from outside (kubelet probes to the pod
   * IP, a Service): the pod's packets are in conntrack's reply direction.
   * Only that direction: an outbound connection opened before these rules
   * existed must not keep flowing, and every allowed outbound flow is
   * matched again, packet by packet, by its own rule (lo, DNAT, the
   * exemption, DNS). An outbound first packet that is rejected never
   * creates a confirmed conntrack entry, so it can never become
   * ESTABLISHED. */
  put(&t, "%s-m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY "
          "-j ACCEPT\n", flt);
  if (v6)
    put_ndp(&t);
  put_dns(&t, cfg, family);
  /* Reject rather than drop so clients fail at once instead of after
   * their connect timeout. */
  put(&t, "%s-p tcp -j REJECT --reject-with tcp-reset\n", flt);
  put(&t, "%s-j REJECT --reject-with %s\n", flt,
      v6 ? "icmp6-adm-prohibited" : "icmp-admin-prohibited");
  put(&t, "COMMIT\n");
  return finish(&t, len);
}

int ce_nf_jumps_text(unsigned missing, char *buf, size_t cap, size_t *len) {
  nf__text_t t;
  if (begin(&t, buf, cap) != 0)
    return CE_ETOOBIG;
  for (size_t i = 0; i < CE_NF_HOOK_COUNT; i++) {
    if ((missing & (1u << i)) == 0)
      continue;
    put(&t, "*%s\n-I OUTPUT 1 -j %s\nCOMMIT\n", ce_nf_hooks[i].table,
        ce_nf_hooks[i].chain);
  }
  return finish(&t, len);
}

int ce_nf_flush_text(char *buf, size_t cap, size_t *len) {
  nf__text_t t;
  if (begin(&t, buf, cap) != 0)
    return CE_ETOOBIG;
  for (size_t i = 0; i < CE_NF_HOOK_COUNT; i++)
    put(&t, "*%s\n:%s - [0:0]\nCOMMIT\n", ce_nf_hooks[i].table,
        ce_nf_hooks[i].chain);
  return finish(&t, len);
}

int ce_nf_delete_text(char *buf, size_t cap, size_t *len) {
  nf__text_t t;
  if (begin(&t, buf, cap) != 0)
    return CE_ETOOBIG;
  /* Declaring first makes -X succeed when the chain is already gone, so
   * a second --remove is a no-op rather than an error. */
  for (size_t i = 0; i < CE_NF_HOOK_COUNT; i++)
    put(&t, "*%s\n:%s - [0:0]\n-X %s\nCOMMIT\n", ce_nf_hooks[i].table,
        ce_nf_hooks[i].chain, ce_nf_hooks[i].chain);
  return finish(&t, len);
}
