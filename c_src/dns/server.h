/*
 * The workspace's DNS resolver (docs/dns.md): the sidecar answers the
 * workspace's queries itself, on loopback (127.0.0.1:15053 and
 * [::1]:15053 by default, UDP and TCP), where the pod's rules redirect
 * its port 53. It resolves only names the policy could allow, so DNS is
 * no channel out of the pod:
 *
 *   - a name no request could be allowed to (a deny rule, the default
 *     deny, not a name): NXDOMAIN, and a request_denied event with
 *     scheme "dns" and a reason "dns: <why>";
 *   - a name an allow rule (or the default) allows: asked upstream with
 *     the proxy's own stub (stub.h) and answered from what came back
 *     (A, AAAA and the CNAME chain, rebuilt, never relayed);
 *   - a name only a decide rule could allow: answered at once with a
 *     synthetic address (CE_DNS_DEFERRED_V4, no AAAA), nothing asked
 *     upstream; the HTTP request that follows reaches the proxy, which
 *     asks the decider and, if allowed, resolves the name itself. One
 *     request_allowed event with reason "dns: deferred to the decider"
 *     records it.
 *
 * Query types: A, AAAA and CNAME are resolved; HTTPS and SVCB get an
 * empty answer (clients then use A and AAAA); ANY gets NOTIMP (RFC 8482
 * lets a resolver decline it); every other type of an allowed name gets
 * REFUSED with a request_denied event (TXT, MX, SRV... carry data the
 * policy cannot judge). Other classes and opcodes: REFUSED / NOTIMP.
 *
 * Bounds: a query is at most CE_DNS_SERVER_MAX_QUERY bytes; the rate is
 * capped per source address and overall (token buckets: past them UDP
 * queries are dropped and TCP ones refused, counted and traced); at most
 * CE_DNS_SERVER_MAX_PENDING queries wait for an upstream (past it,
 * SERVFAIL); at most CE_DNS_SERVER_MAX_TCP TCP connections, one query at
 * a time each, closed after CE_DNS_SERVER_TCP_IDLE_MS without a query.
 * UDP answers fit 512 bytes (RFC 1035 §4.2.1) else carry TC.
 *
 * Ownership: the server borrows the policy, the stub and the control
 * channel, which must outlive it; ce_dns_server_close() closes it (the
 * loop must run for its handles to close) and the stub must be closed
 * after it.
 */
#ifndef CE_DNS_SERVER_H
#define CE_DNS_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "control/control.h"
#include "dns/stub.h"
#include "policy/policy.h"

#define CE_DNS_SERVER_MAX_LISTEN 4u
#define CE_DNS_SERVER_MAX_QUERY 1024u
#define CE_DNS_SERVER_MAX_PENDING 128u
#define CE_DNS_SERVER_MAX_TCP 64u
#define CE_DNS_SERVER_TCP_IDLE_MS 10000u
#define CE_DNS_SERVER_UDP_ANSWER 512u
/* Queries per second (and burst) for one source address and overall. */
#define CE_DNS_SERVER_SOURCE_RATE 50u
#define CE_DNS_SERVER_SOURCE_BURST 100u
#define CE_DNS_SERVER_RATE 200u
#define CE_DNS_SERVER_BURST 400u
/* Source addresses tracked for their rate (the least recent is reused). */
#define CE_DNS_SERVER_SOURCES 64u
/* The synthetic answer for names only a decider may allow (RFC 2544's
 * benchmarking range: never a real host; routed out of the pod like any
 * address, so a connection to it on 80/443 reaches the proxy), and its
 * TTL. */
#define CE_DNS_DEFERRED_V4 "198.18.0.1"
#define CE_DNS_DEFERRED_TTL 30u

typedef struct ce_dns_server ce_dns_server_t;

typedef struct {
  const char *const *listen; /* "ADDR:PORT" each, UDP and TCP */
  size_t listen_count;
  const ce_policy_t *policy;
  ce_dns_stub_t *stub;
  ce_control_t *control;     /* events; NULL: none (tests) */
  uint64_t *next_id;         /* the proxy's request id counter, shared */
  uint32_t rate, burst, source_rate, source_burst; /* 0: the defaults above */
} ce_dns_server_opts_t;

/* Binds every address. Returns CE_OK, CE_EINVAL (an address that does
 * not parse), CE_EIO (cannot bind: err says which and why), CE_ENOMEM.
 * On failure nothing stays open (the loop must still run to close what
 * was opened) and *out is untouched. */
int ce_dns_server_start(uv_loop_t *loop, const ce_dns_server_opts_t *opts, ce_dns_server_t **out, char *err,
                        size_t err_cap);

/* Stops listening, drops every connection and frees the server once its
 * handles closed and its queries came back (close the stub after this).
 * NULL is fine. */
void ce_dns_server_close(ce_dns_server_t *srv);

/* The address listener i is bound to, with the port the kernel chose
 * when the option said port 0 (UDP and TCP then share it). Returns CE_OK
 * or CE_EINVAL (no such listener). */
int ce_dns_server_address(const ce_dns_server_t *srv, size_t i, struct sockaddr_storage *out);

/* Counters (tests, traces). */
typedef struct {
  uint64_t queries;     /* parsed queries */
  uint64_t denied;      /* answered NXDOMAIN/REFUSED by the policy */
  uint64_t deferred;    /* synthetic answers for decide-only names */
  uint64_t resolved;    /* answered from upstream */
  uint64_t rate_limited;
  uint64_t malformed;
} ce_dns_server_stats_t;

void ce_dns_server_stats(const ce_dns_server_t *srv, ce_dns_server_stats_t *out);

#endif
