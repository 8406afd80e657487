/* Reaching an upstream: resolve, filter, mark, connect, TLS (proxy/connector.h). */
#include "proxy/connector.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "proxy/conn_internal.h"
#include "proxy/netaddr.h"
#include "tls/context.h"
#include "tls/tlsconn.h"

static const char *const state_names[] = {"idle", "resolving", "connecting", "handshaking", "ready", "failed"};

#define trace(k, fmt, ...) \
  CE_TRACE_D("proxy", 'c', (k)->conn_id, "[upstream %s] " fmt, state_names[(k)->state], ##__VA_ARGS__)

static void set_state(ce_connector_t *k, ce_connector_state_t s) {
  if (k->state != s)
    trace(k, "-> %s", state_names[s]);
  k->state = s;
}

void ce_connector_init(ce_connector_t *k, const ce_connector_ops_t *ops, void *owner, ce_proxy_t *proxy,
                       uint64_t conn_id, struct side *s) {
  memset(k, 0, sizeof(*k));
  k->ops = ops;
  k->owner = owner;
  k->proxy = proxy;
  k->conn_id = conn_id;
  k->s = s;
}

void ce_connector_reset(ce_connector_t *k) {
  k->gen++;
  free(k->addrs);
  k->addrs = NULL;
  k->next_addr = 0;
  k->last_err = 0;
  k->wait_close = false;
  set_state(k, CE_CONNECTOR_IDLE);
}

void ce_connector_fail(ce_connector_t *k, int status, const char *reason) {
  if (!ce_connector_busy(k))
    return;
  trace(k, "failed: %s", reason);
  set_state(k, CE_CONNECTOR_FAILED);
  k->ops->done(k, status, reason);
}

static void ready(ce_connector_t *k) {
  set_state(k, CE_CONNECTOR_READY);
  trace(k, "%s:%u ready", k->host, (unsigned)k->port);
  k->ops->done(k, 0, NULL);
}

/* ---- the address filter ------------------------------------------------- */

bool ce_connector_addr_ok(const ce_proxy_t *p, const struct sockaddr *sa, char *why, size_t cap) {
  if (!ce_addr_is_private(sa))
    return true;
  const ce_proxy_options_t *o = p->opts;
  const uint8_t *bytes;
  int family;
  if (sa->sa_family == AF_INET) {
    bytes = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
    family = 4;
  } else {
    bytes = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    family = 6;
  }
  for (size_t i = 0; i < o->allow_private_count; i++)
    if (ce_cidr_contains(&o->allow_private[i], family, bytes))
      return true;
  char text[CE_ADDR_TEXT_MAX];
  size_t n = ce_addr_text(sa, text);
  ce_verdict_t v;
  if (ce_policy_eval_host(p->policy, text, n, &v) == 0 && v.decision == CE_DECISION_ALLOW && v.rule_index >= 0 &&
      v.rule_kind == CE_RULE_ALLOW)
    return true;
  snprintf(why, cap, "upstream_private_address: %s", text);
  return false;
}

/* ---- TLS ------------------------------------------------------------------ */

void ce_connector_handshake(ce_connector_t *k) {
  if (k->state != CE_CONNECTOR_HANDSHAKING)
    return;
  int rc = ce_tlsconn_handshake(k->s->tls);
  k->ops->flush(k);
  /* Writing may have failed the whole connection. */
  if (!k->ops->alive(k) || k->state != CE_CONNECTOR_HANDSHAKING || rc == CE_EAGAIN)
    return;
  if (rc != CE_OK) {
    char reason[400];
    snprintf(reason, sizeof(reason), "upstream_tls: %s", ce_tlsconn_error(k->s->tls));
    ce_connector_fail(k, 502, reason);
    return;
  }
  k->s->handshaken = true;
  ready(k);
}

static void start_tls(ce_connector_t *k) {
  static const unsigned char alpn_h1[] = "\x08http/1.1";
  static const unsigned char alpn_both[] = "\x02h2\x08http/1.1";
  bool both = k->alpn == CE_ALPN_H2_HTTP11;
  const unsigned char *alpn = both ? alpn_both : alpn_h1;
  size_t alpn_len = both ? sizeof(alpn_both) - 1 : sizeof(alpn_h1) - 1;
  SSL *ssl;
  if (ce_tls_client_ssl_new_at(k->proxy->client_ctx, k->host, k->port, alpn, alpn_len, &ssl) != CE_OK ||
      ce_tlsconn_new(ssl, false, &k->s->tls) != CE_OK) {
    ce_connector_fail(k, 502, "upstream_tls: cannot create a TLS session");
    return;
  }
  set_state(k, CE_CONNECTOR_HANDSHAKING);
  ce_connector_handshake(k);
}

/* ---- connecting ------------------------------------------------------------ */

static void connect_next(ce_connector_t *k);

static void on_connect(uv_connect_t *req, int status) {
  ce_connector_t *k = req->data;
  /* A connect whose handle was closed (a reset, a failure elsewhere) ends
   * cancelled: none of this attempt's business. */
  if (status == UV_ECANCELED || k->state != CE_CONNECTOR_CONNECTING || !k->ops->alive(k))
    return;
  if (status < 0) {
    trace(k, "connect failed: %s", uv_strerror(status));
    k->last_err = status;
    k->ops->close(k);
    connect_next(k);
    return;
  }
  k->s->connected = true;
  uv_tcp_nodelay(&k->s->tcp, 1);
  k->ops->reading(k);
  if (!k->ops->alive(k) || k->state != CE_CONNECTOR_CONNECTING)
    return;
  if (k->tls)
    start_tls(k);
  else
    ready(k);
}

/* The next address, else the attempt failed. A uv_tcp_t may be
 * initialised again only after its close callback: until then the loop
 * still holds it (after a failed connect, or an upstream dropped for
 * another host); ce_connector_closed resumes here. */
static void connect_next(ce_connector_t *k) {
  side_t *s = k->s;
  if (s->closing) {
    k->wait_close = true;
    return;
  }
  if (k->addrs == NULL || k->next_addr >= k->addrs->count) {
    char reason[200];
    snprintf(reason, sizeof(reason), "upstream_unreachable: %s",
             k->last_err != 0 ? uv_strerror(k->last_err) : "no address");
    ce_connector_fail(k, 502, reason);
    return;
  }
  const struct sockaddr *sa = (const struct sockaddr *)&k->addrs->addrs[k->next_addr++];
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    k->last_err = uv_translate_sys_error(errno);
    connect_next(k);
    return;
  }
  /* The mark exempts this socket from the REDIRECT (docs/netfilter.md). A
   * sidecar that cannot set it would loop into itself: fail closed. */
  if (ce_set_mark(fd, k->proxy->opts->mark) != CE_OK) {
    close(fd);
    ce_connector_fail(k, 502, "upstream_unreachable: cannot set SO_MARK (the sidecar needs CAP_NET_ADMIN)");
    return;
  }
  uv_tcp_init(k->proxy->loop, &s->tcp);
  s->tcp.data = s->conn;
  k->ops->hold(k);
  s->open = true;
  int rc = uv_tcp_open(&s->tcp, fd);
  if (rc == 0) {
    char text[CE_ADDR_TEXT_MAX];
    ce_addr_text(sa, text);
    trace(k, "connecting to %s port %u", text, (unsigned)k->port);
    k->req.data = k;
    /* An error at once (ENETUNREACH for a route-less or broadcast
     * address) is handled as a refused connect: the next address. */
    rc = uv_tcp_connect(&k->req, &s->tcp, sa, on_connect);
  } else {
    close(fd);
  }
  if (rc < 0) {
    k->last_err = rc;
    k->ops->close(k);
    connect_next(k);
  }
}

void ce_connector_closed(ce_connector_t *k) {
  if (!k->wait_close || k->state != CE_CONNECTOR_CONNECTING || !k->ops->alive(k))
    return;
  k->wait_close = false;
  connect_next(k);
}

/* ---- resolving (docs/dns.md) ------------------------------------------------ */

typedef struct {
  ce_connector_t *k;
  uint32_t gen;
} lookup_t;

/* The words after "cannot resolve HOST: " for a lookup's status. */
static const char *lookup_error(int status) {
  switch (status) {
  case CE_ENOENT:
    return "no such host";
  case CE_ETIMEDOUT:
    return "the resolvers did not answer in time";
  case CE_EPROTO:
    return "a CNAME chain too long";
  case CE_ECLOSED:
    return "the proxy is shutting down";
  case CE_EUNAVAIL:
    return "no resolver answered";
  default:
    return ce_strerror(status);
  }
}

/* Keeps only the addresses the proxy may use, in resolver order; then
 * connects. */
static void resolved(ce_connector_t *k, int status, const ce_dns_addrs_t *addrs) {
  char reason[400];
  if (status != CE_OK) {
    snprintf(reason, sizeof(reason), "upstream_unreachable: cannot resolve %s: %s", k->host, lookup_error(status));
    ce_connector_fail(k, 502, reason);
    return;
  }
  ce_dns_addrs_t *keep = malloc(sizeof(*keep));
  if (keep == NULL) {
    snprintf(reason, sizeof(reason), "upstream_unreachable: cannot resolve %s: out of memory", k->host);
    ce_connector_fail(k, 502, reason);
    return;
  }
  char why[200] = "";
  keep->count = 0;
  for (size_t i = 0; i < addrs->count; i++)
    if (ce_connector_addr_ok(k->proxy, (const struct sockaddr *)&addrs->addrs[i], why, sizeof(why)))
      keep->addrs[keep->count++] = addrs->addrs[i];
  if (keep->count == 0) {
    free(keep);
    ce_connector_fail(k, 403, why[0] != '\0' ? why : "upstream_unreachable: no address");
    return;
  }
  k->addrs = keep;
  k->next_addr = 0;
  set_state(k, CE_CONNECTOR_CONNECTING);
  if (k->ops->resolved != NULL) {
    k->ops->resolved(k);
    if (!k->ops->alive(k) || k->state != CE_CONNECTOR_CONNECTING)
      return;
  }
  connect_next(k);
}

static void on_lookup(void *data, int status, const ce_dns_addrs_t *addrs) {
  lookup_t *l = data;
  ce_connector_t *k = l->k;
  bool current = l->gen == k->gen;
  free(l);
  if (current && k->state == CE_CONNECTOR_RESOLVING && k->ops->alive(k))
    resolved(k, status, addrs);
  k->ops->release(k); /* last: it may free the owner */
}

int ce_connector_start(ce_connector_t *k, const char *host, uint16_t port, bool tls, ce_connector_alpn_t alpn) {
  ce_connector_reset(k);
  k->host = host;
  k->port = port;
  k->tls = tls;
  k->alpn = alpn;
  lookup_t *l = malloc(sizeof(*l));
  if (l == NULL)
    return CE_ENOMEM;
  l->k = k;
  l->gen = k->gen;
  int rc = ce_dns_stub_lookup(k->proxy->dns, host, port, on_lookup, l);
  if (rc != CE_OK) {
    free(l);
    return rc;
  }
  k->ops->hold(k);
  set_state(k, CE_CONNECTOR_RESOLVING);
  trace(k, "resolving %s", host);
  return CE_OK;
}
