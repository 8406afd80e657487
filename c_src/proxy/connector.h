/*
 * The one way the sidecar reaches an upstream (docs/proxy.md, "The
 * upstream connector"), for every path: the HTTP/1.1 connection's own
 * upstream, its pre-connect for the ALPN, and every connection of an h2
 * workspace's pool.
 *
 *   resolve     the proxy's own resolver (docs/dns.md: the hosts table of
 *               --hosts, else the --dns-upstream resolvers; never
 *               getaddrinfo, so nothing the workspace can write decides
 *               where an allowed name connects)
 *   filter      loopback, private and link-local addresses only when the
 *               policy names them (DESIGN §4), in resolver order
 *   mark        SO_MARK on every socket, so the REDIRECT lets it out; a
 *               sidecar that cannot set it fails closed
 *   connect     each address in turn until one answers
 *   TLS         verified against the trust bundle for the host, offering
 *               the ALPN list the caller chose
 *
 * States: IDLE → RESOLVING → CONNECTING → (HANDSHAKING) → READY, or
 * FAILED; ce_connector_reset returns to IDLE from any of them.
 *
 * The connector works on a side_t the owner holds (its TCP handle and TLS
 * engine). The owner reads the socket with its own callbacks and tells
 * the connector when TLS bytes arrived (ce_connector_handshake) or the
 * server closed (ce_connector_fail); its timer bounds the whole attempt.
 * Handles and lookups the connector starts are counted by the owner
 * (ops->hold / ops->release) so that it is freed only after they end.
 */
#ifndef CE_PROXY_CONNECTOR_H
#define CE_PROXY_CONNECTOR_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "dns/stub.h"
#include "proxy/proxy.h"

struct side;
typedef struct ce_connector ce_connector_t;

typedef enum {
  CE_CONNECTOR_IDLE = 0,
  CE_CONNECTOR_RESOLVING,
  CE_CONNECTOR_CONNECTING,  /* a TCP connect is in flight, or waits for the last handle's close */
  CE_CONNECTOR_HANDSHAKING, /* TLS with the upstream */
  CE_CONNECTOR_READY,
  CE_CONNECTOR_FAILED,
} ce_connector_state_t;

/* What the connector offers in the upstream's ALPN. */
typedef enum {
  CE_ALPN_HTTP11 = 0, /* http/1.1 only */
  CE_ALPN_H2_HTTP11,  /* h2, then http/1.1 */
} ce_connector_alpn_t;

typedef struct {
  /* A handle or a lookup started: the owner counts it. */
  void (*hold)(ce_connector_t *k);
  /* ... ended: the owner's count goes down; this may free the owner, so
   * the connector touches nothing after it. */
  void (*release)(ce_connector_t *k);
  /* The owner is being torn down: a lookup that returns is dropped. */
  bool (*alive)(ce_connector_t *k);
  /* Close the side's handle; the owner's close callback calls
   * ce_connector_closed, then releases. */
  void (*close)(ce_connector_t *k);
  /* The side's TLS engine has bytes to send (the handshake's): write
   * them. */
  void (*flush)(ce_connector_t *k);
  /* TCP is up: read the socket with the owner's callbacks. */
  void (*reading)(ce_connector_t *k);
  /* The host resolved and some of its addresses passed the filter (NULL:
   * nothing to do). */
  void (*resolved)(ce_connector_t *k);
  /* The attempt ended: status 0 (READY), or 502 (unreachable, TLS), 403
   * (every address is private and the policy names none) with the reason
   * of the event ("upstream_unreachable: ...", "upstream_tls: ...",
   * "upstream_private_address: ADDR"). Called once per start, never from
   * within ce_connector_start. */
  void (*done)(ce_connector_t *k, int status, const char *reason);
} ce_connector_ops_t;

struct ce_connector {
  const ce_connector_ops_t *ops;
  void *owner;
  ce_proxy_t *proxy;
  uint64_t conn_id;         /* for traces */
  struct side *s;           /* the side it connects */
  ce_connector_state_t state;
  const char *host;         /* the caller's; unchanged until the attempt ends or is reset */
  uint16_t port;
  bool tls;
  ce_connector_alpn_t alpn;
  uint32_t gen;             /* bumped by reset: a lookup of an older attempt is dropped */
  ce_dns_addrs_t *addrs;    /* the addresses left after the filter, owned */
  size_t next_addr;
  int last_err;             /* the last connect error (uv), 0 none */
  bool wait_close;          /* the next address waits for the last handle's close */
  uv_connect_t req;
};

void ce_connector_init(ce_connector_t *k, const ce_connector_ops_t *ops, void *owner, ce_proxy_t *proxy,
                       uint64_t conn_id, struct side *s);

/* Connects s to host:port (TLS with alpn when tls; host is kept by
 * pointer, see the field). Returns CE_OK (done
 * follows, later), or CE_EAGAIN (the resolver is busy), CE_ENOMEM with
 * nothing started. An attempt running is reset first. */
int ce_connector_start(ce_connector_t *k, const char *host, uint16_t port, bool tls, ce_connector_alpn_t alpn);

/* Bytes from the upstream reached the side's TLS engine while
 * HANDSHAKING: the handshake goes on, and may end (done). */
void ce_connector_handshake(ce_connector_t *k);

/* The attempt failed for a reason the owner saw (the server closed, the
 * owner's timer): done(status, reason) unless it ended already. */
void ce_connector_fail(ce_connector_t *k, int status, const char *reason);

/* The side's handle closed (from the owner's close callback): a next
 * address waiting for it is tried now. */
void ce_connector_closed(ce_connector_t *k);

/* Forgets the attempt (its lookup, if one is in flight, is dropped when it
 * returns; its addresses are freed); IDLE. Does not close the handle. */
void ce_connector_reset(ce_connector_t *k);

static inline bool ce_connector_busy(const ce_connector_t *k) {
  return k->state == CE_CONNECTOR_RESOLVING || k->state == CE_CONNECTOR_CONNECTING ||
         k->state == CE_CONNECTOR_HANDSHAKING;
}

/* Is addr usable as an upstream? Public addresses are; private, loopback
 * and link-local ones only when the policy allows their IP literal by an
 * allow rule or an --allow-private range covers them (DESIGN §4). On
 * false, why receives "upstream_private_address: ADDR". */
bool ce_connector_addr_ok(const ce_proxy_t *p, const struct sockaddr *sa, char *why, size_t cap);

#endif
