/*
 * Options of `condukt-egress proxy` (docs/proxy.md). Every flag can also be
 * given as an environment variable CONDUKT_EGRESS_<NAME> (upper case, '-'
 * as '_'); a flag on the command line wins. Repeatable flags take a
 * comma-separated list in their environment variable.
 */
#ifndef CE_PROXY_OPTIONS_H
#define CE_PROXY_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define CE_PROXY_MAX_LISTEN 8
#define CE_PROXY_MAX_CIDRS 64
#define CE_PROXY_MAX_REDACT 64
/* The proxy's own DNS (docs/dns.md). */
#define CE_PROXY_MAX_DNS_UPSTREAMS 4
#define CE_PROXY_MAX_DNS_LISTEN 4
#define CE_PROXY_DEFAULT_DNS_PORT 15053
#define CE_PROXY_DEFAULT_RESOLV_CONF "/etc/resolv.conf"

/* Defaults (docs/proxy.md, "Limits and timeouts"). */
#define CE_PROXY_DEFAULT_PORT 15001
#define CE_PROXY_DEFAULT_CONTROL "127.0.0.1:15002"
#define CE_PROXY_DEFAULT_MARK 0x539u
#define CE_PROXY_DEFAULT_MAX_CONNECTIONS 1024u
#define CE_PROXY_DEFAULT_CLIENTHELLO_MS 10000u
#define CE_PROXY_DEFAULT_HANDSHAKE_MS 10000u
#define CE_PROXY_DEFAULT_CONNECT_MS 10000u
#define CE_PROXY_DEFAULT_HEADER_MS 30000u
#define CE_PROXY_DEFAULT_IDLE_MS 300000u
/* An idle keep-alive connection gives back its upstream connection and its
 * TLS buffers after this long (docs/proxy.md, "Idle connections"). */
#define CE_PROXY_DEFAULT_RELEASE_MS 500u
#define CE_PROXY_MAX_BODY_PREVIEW (64u * 1024u)

typedef struct {
  uint8_t family;     /* 4 or 6 */
  uint8_t addr[16];   /* network byte order, v4 in the first 4 bytes */
  uint8_t prefix;     /* bits */
} ce_cidr_t;

typedef struct {
  const char *listen[CE_PROXY_MAX_LISTEN];
  size_t listen_count;
  const char *control;
  const char *policy_path;
  const char *ca_cert_path;
  const char *ca_key_path;
  const char *session_id;
  const char *token_path;
  const char *credentials_path; /* the secrets of the policy's credentials, or NULL */
  const char *trust_bundle_path;
  const char *upstream_extra_ca_path;
  uint32_t mark;
  uint32_t user; /* --user: the uid to become when started as root; 0 = stay */
  ce_cidr_t allow_private[CE_PROXY_MAX_CIDRS];
  size_t allow_private_count;
  const char *redact[CE_PROXY_MAX_REDACT];
  size_t redact_count;
  uint32_t body_preview;
  uint32_t max_connections;
  uint32_t clienthello_ms;
  uint32_t handshake_ms;
  uint32_t connect_ms;
  uint32_t header_ms;
  uint32_t idle_ms;
  uint32_t release_ms; /* --idle-release-ms; 0 = keep the upstream until the connection ends */
  /* DNS (docs/dns.md): the static names, the upstream resolvers (else
   * the nameservers of resolv_conf_path, read once at start), and where
   * the workspace's resolver listens (none when dns_listen_off). */
  const char *hosts_path;
  struct sockaddr_storage dns_upstreams[CE_PROXY_MAX_DNS_UPSTREAMS];
  size_t dns_upstream_count;
  const char *resolv_conf_path;
  const char *dns_state_path; /* where the resolvers of the first start are kept */
  const char *dns_listen[CE_PROXY_MAX_DNS_LISTEN];
  size_t dns_listen_count;
  bool dns_listen_off;
  bool verbose;
  char *owned;        /* private: copies of environment lists */
} ce_proxy_options_t;

/*
 * Parses argv (argv[0] is "proxy") and the environment into *opts.
 * Returns CE_EXIT_OK, CE_EXIT_USAGE (message on stderr naming the word),
 * or -1 when help was printed (exit 0).
 */
int ce_proxy_options_parse(int argc, char **argv, ce_proxy_options_t *opts);
void ce_proxy_options_free(ce_proxy_options_t *opts);

/* Parses "10.0.0.0/8", "fd00::/8" or a bare address (full prefix).
 * Returns CE_OK or CE_EINVAL. */
int ce_cidr_parse(const char *text, ce_cidr_t *out);
bool ce_cidr_contains(const ce_cidr_t *cidr, int family, const uint8_t *addr);

#endif
