/*
 * `condukt-egress proxy` options: flags, environment variables, defaults.
 * The table below is the single list; docs/proxy.md renders the same list.
 */
#include "proxy/options.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "dns/stub.h"
#include "policy/ip.h"

#define PROG "condukt-egress proxy"

typedef enum { OPT_STR, OPT_LIST, OPT_U32, OPT_MARK, OPT_CIDR, OPT_BOOL, OPT_DNS } opt_kind_t;

typedef struct {
  const char *flag;   /* without "--" */
  const char *env;    /* CONDUKT_EGRESS_... */
  opt_kind_t kind;
  uint32_t min, max;  /* OPT_U32 */
  const char *help;
} opt_spec_t;

static const opt_spec_t specs[] = {
    {"listen", "CONDUKT_EGRESS_LISTEN", OPT_LIST, 0, 0,
     "address the iptables REDIRECT reaches (repeatable; default 127.0.0.1:15001 and [::1]:15001)"},
    {"control", "CONDUKT_EGRESS_CONTROL", OPT_STR, 0, 0,
     "control channel: unix:/path or a loopback HOST:PORT (default " CE_PROXY_DEFAULT_CONTROL ")"},
    {"policy", "CONDUKT_EGRESS_POLICY", OPT_STR, 0, 0, "policy document (docs/policy-json.md), required"},
    {"ca-cert", "CONDUKT_EGRESS_CA_CERT", OPT_STR, 0, 0, "session CA certificate (PEM), required"},
    {"ca-key", "CONDUKT_EGRESS_CA_KEY", OPT_STR, 0, 0, "session CA private key (PEM), required"},
    {"session-id", "CONDUKT_EGRESS_SESSION_ID", OPT_STR, 0, 0, "session id echoed to the control peer, required"},
    {"credentials", "CONDUKT_EGRESS_CREDENTIALS", OPT_STR, 0, 0,
     "secrets file the policy's credentials take their values from (docs/credentials.md)"},
    {"token-file", "CONDUKT_EGRESS_TOKEN_FILE", OPT_STR, 0, 0,
     "file holding the control token as hex (at least 32 digits), required"},
    {"trust-bundle", "CONDUKT_EGRESS_TRUST_BUNDLE", OPT_STR, 0, 0,
     "roots for upstream verification (default: ca-certificates/mozilla.pem next to the binary)"},
    {"upstream-extra-ca", "CONDUKT_EGRESS_UPSTREAM_EXTRA_CA", OPT_STR, 0, 0,
     "one more PEM file of upstream roots (tests, private registries)"},
    {"mark", "CONDUKT_EGRESS_MARK", OPT_MARK, 0, 0, "SO_MARK of upstream sockets (default 0x539)"},
    {"user", "CONDUKT_EGRESS_USER", OPT_U32, 1, 4294967294u,
     "uid (and gid) to become, keeping only CAP_NET_ADMIN, before any socket is opened (docs/netfilter.md)"},
    {"allow-private", "CONDUKT_EGRESS_ALLOW_PRIVATE", OPT_CIDR, 0, 0,
     "private/loopback/link-local range upstreams may use without the policy naming the IP (repeatable)"},
    {"redact-header", "CONDUKT_EGRESS_REDACT_HEADER", OPT_LIST, 0, 0,
     "header whose value events replace by \"[redacted]\" (repeatable; Authorization, "
     "Proxy-Authorization, Cookie and Set-Cookie always are)"},
    {"body-preview", "CONDUKT_EGRESS_BODY_PREVIEW", OPT_U32, 0, CE_PROXY_MAX_BODY_PREVIEW,
     "bytes of each request body copied into events (default 0)"},
    {"max-connections", "CONDUKT_EGRESS_MAX_CONNECTIONS", OPT_U32, 1, 1000000,
     "workspace connections at once; more are reset (default 1024)"},
    {"clienthello-timeout-ms", "CONDUKT_EGRESS_CLIENTHELLO_TIMEOUT_MS", OPT_U32, 1, 3600000,
     "to receive the first bytes/ClientHello (default 10000)"},
    {"handshake-timeout-ms", "CONDUKT_EGRESS_HANDSHAKE_TIMEOUT_MS", OPT_U32, 1, 3600000,
     "for each TLS handshake (default 10000)"},
    {"connect-timeout-ms", "CONDUKT_EGRESS_CONNECT_TIMEOUT_MS", OPT_U32, 1, 3600000,
     "to resolve and connect upstream (default 10000)"},
    {"header-timeout-ms", "CONDUKT_EGRESS_HEADER_TIMEOUT_MS", OPT_U32, 1, 3600000,
     "to receive a request or response head once it started (default 30000)"},
    {"idle-timeout-ms", "CONDUKT_EGRESS_IDLE_TIMEOUT_MS", OPT_U32, 1, 86400000,
     "without any byte either way (default 300000)"},
    {"idle-release-ms", "CONDUKT_EGRESS_IDLE_RELEASE_MS", OPT_U32, 0, 86400000,
     "between requests, after this long a keep-alive connection closes its upstream connection and "
     "gives back its TLS buffers; the next request connects again (default 500; 0: never)"},
    {"hosts", "CONDUKT_EGRESS_HOSTS", OPT_STR, 0, 0,
     "static names in hosts(5) syntax, from a file the workspace cannot write (default: none; "
     "/etc/hosts is never read)"},
    {"dns-upstream", "CONDUKT_EGRESS_DNS_UPSTREAM", OPT_DNS, 0, 0,
     "resolver the proxy asks, ADDR or ADDR:PORT (repeatable or comma-separated, at most 4; "
     "default: the nameservers of --resolv-conf, read once at start)"},
    {"resolv-conf", "CONDUKT_EGRESS_RESOLV_CONF", OPT_STR, 0, 0,
     "where the default resolvers come from when --dns-upstream is not given "
     "(default " CE_PROXY_DEFAULT_RESOLV_CONF ")"},
    {"dns-state", "CONDUKT_EGRESS_DNS_STATE", OPT_STR, 0, 0,
     "file that keeps the resolvers read from --resolv-conf at the first start; later starts use it "
     "(a place only the sidecar can write that outlives its restarts; default: none)"},
    {"dns-listen", "CONDUKT_EGRESS_DNS_LISTEN", OPT_LIST, 0, 0,
     "where the workspace's DNS resolver listens, UDP and TCP (repeatable; default 127.0.0.1:15053 and "
     "[::1]:15053; none: no resolver)"},
    {"verbose", "CONDUKT_EGRESS_VERBOSE", OPT_BOOL, 0, 0, "trace connection state changes on stderr"},
};
#define NSPECS (sizeof(specs) / sizeof(specs[0]))

static void usage(FILE *out) {
  fprintf(out, "usage: " PROG " [options]\n\noptions (each also from its environment variable):\n");
  for (size_t i = 0; i < NSPECS; i++)
    fprintf(out, "  --%-24s %s\n  %-26s   [%s]\n", specs[i].flag, specs[i].help, "", specs[i].env);
}

static int usage_error(const char *what, const char *word) {
  ce_text_usage_error(PROG, what, word);
  return CE_EXIT_USAGE;
}

int ce_cidr_parse(const char *text, ce_cidr_t *out) {
  char buf[64];
  size_t n = strlen(text);
  if (n == 0 || n >= sizeof(buf))
    return CE_EINVAL;
  memcpy(buf, text, n + 1);
  char *slash = strchr(buf, '/');
  long prefix = -1;
  if (slash != NULL) {
    *slash = '\0';
    char *end;
    errno = 0;
    if (slash[1] < '0' || slash[1] > '9')
      return CE_EINVAL;
    prefix = strtol(slash + 1, &end, 10);
    if (errno != 0 || *end != '\0')
      return CE_EINVAL;
  }
  ce_cidr_t c;
  memset(&c, 0, sizeof(c));
  if (ce_ipv4_parse(buf, strlen(buf), c.addr) == 0) {
    c.family = 4;
    if (prefix < 0)
      prefix = 32;
    if (prefix > 32)
      return CE_EINVAL;
  } else if (ce_ipv6_parse(buf, strlen(buf), c.addr) == 0) {
    c.family = 6;
    if (prefix < 0)
      prefix = 128;
    if (prefix > 128)
      return CE_EINVAL;
  } else {
    return CE_EINVAL;
  }
  c.prefix = (uint8_t)prefix;
  *out = c;
  return CE_OK;
}

bool ce_cidr_contains(const ce_cidr_t *cidr, int family, const uint8_t *addr) {
  if (cidr->family != family)
    return false;
  unsigned bits = cidr->prefix;
  for (unsigned i = 0; bits > 0; i++) {
    unsigned take = bits >= 8 ? 8 : bits;
    uint8_t mask = (uint8_t)(0xffu << (8 - take));
    if ((addr[i] & mask) != (cidr->addr[i] & mask))
      return false;
    bits -= take;
  }
  return true;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, int allow_hex, uint32_t *out) {
  if (s[0] < '0' || s[0] > '9')
    return CE_EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, allow_hex ? 0 : 10);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return CE_EINVAL;
  *out = (uint32_t)v;
  return CE_OK;
}

/* Applies one value to the option it belongs to. */
static int apply(const opt_spec_t *spec, const char *value, ce_proxy_options_t *o) {
  const char *f = spec->flag;
  uint32_t v;
  switch (spec->kind) {
  case OPT_BOOL:
    if (strcmp(value, "1") == 0 || strcmp(value, "true") == 0)
      o->verbose = true;
    else if (strcmp(value, "0") == 0 || strcmp(value, "false") == 0)
      o->verbose = false;
    else
      return usage_error("expected true or false for --verbose, got", value);
    return CE_EXIT_OK;
  case OPT_STR:
    if (value[0] == '\0')
      return usage_error("empty value for option", f);
    if (strcmp(f, "control") == 0) o->control = value;
    else if (strcmp(f, "policy") == 0) o->policy_path = value;
    else if (strcmp(f, "ca-cert") == 0) o->ca_cert_path = value;
    else if (strcmp(f, "ca-key") == 0) o->ca_key_path = value;
    else if (strcmp(f, "session-id") == 0) o->session_id = value;
    else if (strcmp(f, "token-file") == 0) o->token_path = value;
    else if (strcmp(f, "credentials") == 0) o->credentials_path = value;
    else if (strcmp(f, "trust-bundle") == 0) o->trust_bundle_path = value;
    else if (strcmp(f, "upstream-extra-ca") == 0) o->upstream_extra_ca_path = value;
    else if (strcmp(f, "hosts") == 0) o->hosts_path = value;
    else if (strcmp(f, "resolv-conf") == 0) o->resolv_conf_path = value;
    else if (strcmp(f, "dns-state") == 0) o->dns_state_path = value;
    return CE_EXIT_OK;
  case OPT_DNS: {
    /* A comma-separated list on the command line too. */
    const char *item = value;
    for (;;) {
      const char *comma = strchr(item, ',');
      size_t n = comma != NULL ? (size_t)(comma - item) : strlen(item);
      char one[80];
      if (n == 0 || n >= sizeof(one))
        return usage_error("--dns-upstream expects ADDR or ADDR:PORT, got", value);
      memcpy(one, item, n);
      one[n] = '\0';
      if (o->dns_upstream_count == CE_PROXY_MAX_DNS_UPSTREAMS)
        return usage_error("too many --dns-upstream resolvers (at most 4) at", one);
      if (ce_dns_upstream_parse(one, &o->dns_upstreams[o->dns_upstream_count]) != CE_OK)
        return usage_error("--dns-upstream expects ADDR or ADDR:PORT, got", one);
      o->dns_upstream_count++;
      if (comma == NULL)
        break;
      item = comma + 1;
    }
    return CE_EXIT_OK;
  }
  case OPT_LIST:
    if (value[0] == '\0')
      return usage_error("empty value for option", f);
    if (strcmp(f, "listen") == 0) {
      if (o->listen_count == CE_PROXY_MAX_LISTEN)
        return usage_error("too many listen addresses at", value);
      o->listen[o->listen_count++] = value;
    } else if (strcmp(f, "dns-listen") == 0) {
      if (strcmp(value, "none") == 0) {
        o->dns_listen_off = true;
        return CE_EXIT_OK;
      }
      if (o->dns_listen_count == CE_PROXY_MAX_DNS_LISTEN)
        return usage_error("too many --dns-listen addresses at", value);
      o->dns_listen[o->dns_listen_count++] = value;
    } else {
      if (o->redact_count == CE_PROXY_MAX_REDACT)
        return usage_error("too many redacted headers at", value);
      o->redact[o->redact_count++] = value;
    }
    return CE_EXIT_OK;
  case OPT_CIDR:
    if (o->allow_private_count == CE_PROXY_MAX_CIDRS)
      return usage_error("too many --allow-private ranges at", value);
    if (ce_cidr_parse(value, &o->allow_private[o->allow_private_count]) != CE_OK)
      return usage_error("--allow-private expects an address or CIDR, got", value);
    o->allow_private_count++;
    return CE_EXIT_OK;
  case OPT_MARK:
    if (parse_u32(value, 1, UINT32_MAX, 1, &v) != CE_OK)
      return usage_error("--mark expects a non-zero 32-bit number, got", value);
    o->mark = v;
    return CE_EXIT_OK;
  case OPT_U32:
    if (parse_u32(value, spec->min, spec->max, 0, &v) != CE_OK) {
      char what[96];
      snprintf(what, sizeof(what), "--%s expects an integer in %u..%u, got", f, spec->min, spec->max);
      return usage_error(what, value);
    }
    if (strcmp(f, "body-preview") == 0) o->body_preview = v;
    else if (strcmp(f, "max-connections") == 0) o->max_connections = v;
    else if (strcmp(f, "clienthello-timeout-ms") == 0) o->clienthello_ms = v;
    else if (strcmp(f, "handshake-timeout-ms") == 0) o->handshake_ms = v;
    else if (strcmp(f, "connect-timeout-ms") == 0) o->connect_ms = v;
    else if (strcmp(f, "header-timeout-ms") == 0) o->header_ms = v;
    else if (strcmp(f, "idle-timeout-ms") == 0) o->idle_ms = v;
    else if (strcmp(f, "idle-release-ms") == 0) o->release_ms = v;
    else if (strcmp(f, "user") == 0) o->user = v;
    return CE_EXIT_OK;
  }
  return CE_EXIT_OK;
}

static void defaults(ce_proxy_options_t *o) {
  memset(o, 0, sizeof(*o));
  o->control = CE_PROXY_DEFAULT_CONTROL;
  o->mark = CE_PROXY_DEFAULT_MARK;
  o->max_connections = CE_PROXY_DEFAULT_MAX_CONNECTIONS;
  o->clienthello_ms = CE_PROXY_DEFAULT_CLIENTHELLO_MS;
  o->handshake_ms = CE_PROXY_DEFAULT_HANDSHAKE_MS;
  o->connect_ms = CE_PROXY_DEFAULT_CONNECT_MS;
  o->header_ms = CE_PROXY_DEFAULT_HEADER_MS;
  o->idle_ms = CE_PROXY_DEFAULT_IDLE_MS;
  o->release_ms = CE_PROXY_DEFAULT_RELEASE_MS;
}

int ce_proxy_options_parse(int argc, char **argv, ce_proxy_options_t *o) {
  defaults(o);
  bool seen[NSPECS] = {false};

  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0 || strcmp(arg, "help") == 0) {
      usage(stdout);
      return -1;
    }
    if (strncmp(arg, "--", 2) != 0)
      return usage_error("unexpected argument", arg);
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    const opt_spec_t *spec = NULL;
    size_t si = 0;
    for (si = 0; si < NSPECS; si++) {
      if (strlen(specs[si].flag) == name_len && strncmp(specs[si].flag, name, name_len) == 0) {
        spec = &specs[si];
        break;
      }
    }
    if (spec == NULL)
      return usage_error("unknown option", arg);
    const char *value;
    if (eq != NULL) {
      value = eq + 1;
    } else if (spec->kind == OPT_BOOL) {
      value = "true";
    } else {
      if (i + 1 >= argc)
        return usage_error("missing value for option", arg);
      value = argv[++i];
    }
    seen[si] = true;
    int rc = apply(spec, value, o);
    if (rc != CE_EXIT_OK)
      return rc;
  }

  /* Environment variables fill what the command line left unset. Lists are
   * comma-separated and copied once into o->owned. */
  size_t need = 0;
  for (size_t si = 0; si < NSPECS; si++) {
    const char *ev = seen[si] ? NULL : getenv(specs[si].env);
    if (ev != NULL)
      need += strlen(ev) + 1;
  }
  if (need > 0) {
    o->owned = malloc(need);
    if (o->owned == NULL) {
      fprintf(stderr, PROG ": out of memory\n");
      return CE_EXIT_FAIL;
    }
    char *w = o->owned;
    for (size_t si = 0; si < NSPECS; si++) {
      const char *ev = seen[si] ? NULL : getenv(specs[si].env);
      if (ev == NULL)
        continue;
      size_t n = strlen(ev);
      memcpy(w, ev, n + 1);
      bool list = specs[si].kind == OPT_LIST || specs[si].kind == OPT_CIDR || specs[si].kind == OPT_DNS;
      char *item = w;
      w += n + 1;
      for (;;) {
        char *comma = list ? strchr(item, ',') : NULL;
        if (comma != NULL)
          *comma = '\0';
        if (!(list && item[0] == '\0')) {
          int rc = apply(&specs[si], item, o);
          if (rc != CE_EXIT_OK) {
            fprintf(stderr, PROG ": (from the environment variable %s)\n", specs[si].env);
            return rc;
          }
        }
        if (comma == NULL)
          break;
        item = comma + 1;
      }
    }
  }

  if (o->listen_count == 0) {
    o->listen[o->listen_count++] = "127.0.0.1:15001";
    o->listen[o->listen_count++] = "[::1]:15001";
  }
  if (o->dns_listen_off && o->dns_listen_count > 0)
    return usage_error("--dns-listen none cannot be combined with an address, got", o->dns_listen[0]);
  if (!o->dns_listen_off && o->dns_listen_count == 0) {
    o->dns_listen[o->dns_listen_count++] = "127.0.0.1:15053";
    o->dns_listen[o->dns_listen_count++] = "[::1]:15053";
  }
  if (o->resolv_conf_path == NULL)
    o->resolv_conf_path = CE_PROXY_DEFAULT_RESOLV_CONF;
  static const struct {
    const char *flag;
    size_t off;
  } required[] = {
      {"--policy", offsetof(ce_proxy_options_t, policy_path)},
      {"--ca-cert", offsetof(ce_proxy_options_t, ca_cert_path)},
      {"--ca-key", offsetof(ce_proxy_options_t, ca_key_path)},
      {"--session-id", offsetof(ce_proxy_options_t, session_id)},
      {"--token-file", offsetof(ce_proxy_options_t, token_path)},
  };
  for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
    const char *const *field = (const char *const *)((const char *)o + required[i].off);
    if (*field == NULL)
      return usage_error("missing required option", required[i].flag);
  }
  return CE_EXIT_OK;
}

void ce_proxy_options_free(ce_proxy_options_t *opts) {
  free(opts->owned);
  opts->owned = NULL;
}
