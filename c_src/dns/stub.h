/*
 * The sidecar's own DNS stub resolver on libuv (docs/dns.md): the one way
 * the proxy turns a name into addresses, for every upstream connection,
 * and the upstream half of the resolver it runs for the workspace
 * (server.c). It never calls getaddrinfo and never reads /etc/hosts or
 * /etc/resolv.conf, which the workspace shares and may rewrite: its
 * static names come from a hosts table (hosts.h) and its upstream
 * resolvers from the options, both read from places the workspace cannot
 * write.
 *
 * A query goes over UDP from a fresh socket (so a fresh kernel-chosen
 * source port) connected to the upstream, with a random 16-bit id, an
 * EDNS(0) payload size of CE_DNS_STUB_EDNS_UDP, and the sidecar's socket
 * mark (so the pod's rules let it out and do not send it back to the
 * sidecar's own resolver). An answer counts only when it comes from that
 * upstream, carries the id, is a response to the same question (name,
 * type, class IN) and parses (wire.h); anything else is dropped and the
 * query keeps waiting. A truncated answer (TC) is asked again over TCP
 * (RFC 7766). SERVFAIL, REFUSED and the like move on to the next
 * upstream; each upstream is tried at most twice; the whole query ends
 * by CE_DNS_STUB_DEADLINE_MS. CNAME chains are followed within the answer
 * (at most CE_DNS_MAX_CNAME links); records for names off the chain are
 * ignored.
 *
 * Callbacks run exactly once, never from within the call that started
 * the query; ce_dns_stub_close() calls every pending one with CE_ECLOSED
 * before it returns.
 *
 * Ownership: the stub belongs to its creator; ce_dns_stub_close() ends
 * every query and frees the stub once its handles are closed (the loop
 * must run). The hosts table is borrowed and must
 * outlive the stub.
 */
#ifndef CE_DNS_STUB_H
#define CE_DNS_STUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "dns/hosts.h"
#include "dns/wire.h"

#define CE_DNS_STUB_MAX_UPSTREAMS 4u
/* Queries in flight at once (each holds a socket): past it, CE_EAGAIN. */
#define CE_DNS_STUB_MAX_INFLIGHT 512u
/* How long one attempt waits for its answer, and the whole query. */
#define CE_DNS_STUB_ATTEMPT_MS 2000u
#define CE_DNS_STUB_DEADLINE_MS 6000u
/* The UDP payload size announced (the DNS flag day 2020 value). */
#define CE_DNS_STUB_EDNS_UDP 1232u
/* CNAME links followed from the question's name. */
#define CE_DNS_MAX_CNAME 8u
/* The addresses a lookup returns at most. */
#define CE_DNS_MAX_ADDRS CE_HOSTS_MAX_ADDRS
/* The TTL given to answers from the hosts table. */
#define CE_DNS_HOSTS_TTL 60u

typedef struct ce_dns_stub ce_dns_stub_t;

typedef struct {
  struct sockaddr_storage upstreams[CE_DNS_STUB_MAX_UPSTREAMS]; /* port included (53 as a rule) */
  size_t upstream_count;
  const ce_hosts_t *hosts; /* may be NULL */
  uint32_t mark;           /* SO_MARK of every socket; 0 = none */
  uint32_t attempt_ms;     /* 0 = CE_DNS_STUB_ATTEMPT_MS */
  uint32_t deadline_ms;    /* 0 = CE_DNS_STUB_DEADLINE_MS */
} ce_dns_stub_opts_t;

/* One answer: the CNAME chain from the question's name, in order, then
 * the records of the asked type owned by the chain's last name. */
typedef struct {
  uint8_t rcode;           /* CE_DNS_RCODE_NOERROR or _NXDOMAIN */
  bool from_hosts;         /* answered by the hosts table */
  size_t count;
  ce_dns_rr_t rrs[CE_DNS_MAX_ANSWERS];
} ce_dns_result_t;

/* status: CE_OK (res holds the answer), CE_ETIMEDOUT (no usable answer by
 * the deadline), CE_EUNAVAIL (every upstream failed or refused, or none is
 * configured), CE_EPROTO (a CNAME chain too long or looping), CE_ECLOSED
 * (the stub was closed). res is valid
 * only during the call. */
typedef void (*ce_dns_query_cb)(void *data, int status, const ce_dns_result_t *res);

typedef struct {
  size_t count;
  struct sockaddr_storage addrs[CE_DNS_MAX_ADDRS]; /* port set to the lookup's */
} ce_dns_addrs_t;

/* status: CE_OK (count >= 1), CE_ENOENT (the name does not exist or has
 * no address), or a ce_dns_query_cb status. addrs is valid only during the
 * call. */
typedef void (*ce_dns_addrs_cb)(void *data, int status, const ce_dns_addrs_t *addrs);

/* Returns CE_OK, CE_EINVAL (no upstream and no hosts table is fine; an
 * upstream that is not IPv4 or IPv6 is not), CE_ENOMEM. */
int ce_dns_stub_new(uv_loop_t *loop, const ce_dns_stub_opts_t *opts, ce_dns_stub_t **out);

/* Ends every query (their callbacks get CE_ECLOSED) and frees the stub after its handles
 * closed. NULL is fine. */
void ce_dns_stub_close(ce_dns_stub_t *s);

/* Asks for name[0..len) (text, a final '.' allowed) of type qtype.
 * Returns CE_OK (cb will run), CE_EINVAL (not a name the wire carries),
 * CE_EAGAIN (CE_DNS_STUB_MAX_INFLIGHT reached), CE_ENOMEM. */
int ce_dns_stub_query(ce_dns_stub_t *s, const char *name, size_t len, uint16_t qtype, ce_dns_query_cb cb,
                      void *data);

/* The addresses of host (an IPv4 or IPv6 literal, brackets allowed, is
 * its own answer; a hosts table name its entries; else A then AAAA from
 * the upstreams), with port set. Returns what ce_dns_stub_query returns. */
int ce_dns_stub_lookup(ce_dns_stub_t *s, const char *host, uint16_t port, ce_dns_addrs_cb cb, void *data);

/* Parses "ADDR" or "ADDR:PORT" / "[ADDR]:PORT" (default port 53).
 * Returns CE_OK or CE_EINVAL. */
int ce_dns_upstream_parse(const char *text, struct sockaddr_storage *out);

/* Reads the nameserver lines of a resolv.conf(5) text into opts'
 * upstreams (at most CE_DNS_STUB_MAX_UPSTREAMS, the rest ignored; scoped
 * IPv6 addresses skipped). Returns how many were taken. */
size_t ce_dns_resolv_conf_parse(const char *buf, size_t len, ce_dns_stub_opts_t *opts);

/* Queries in flight (for tests and traces). */
size_t ce_dns_stub_inflight(const ce_dns_stub_t *s);

#endif
