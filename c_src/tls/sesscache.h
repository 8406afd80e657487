/*
 * Upstream TLS session resumption: a bounded, per-process store of TLS 1.3
 * session tickets (docs/proxy.md, "Upstream TLS session resumption").
 *
 * The store hangs off the upstream (client) SSL_CTX and dies with it, so
 * it never outlives or crosses the sidecar process. An entry is keyed by
 * the exact upstream name (the SNI sent and the name verified), the port
 * and the ALPN list offered; a session is offered again only for the same
 * key. Only TLS 1.3 sessions are kept, only from a connection whose chain
 * verified for that name (SSL_VERIFY_PEER with the name set on the SSL, and
 * a verify result of X509_V_OK), and each ticket is offered once (RFC 8446
 * appendix C.4): a connection takes the newest ticket of its key out, and
 * the tickets it receives are stored beside the others. A key keeps up to
 * CE_TLS_SESSCACHE_PER_KEY tickets (its oldest goes first), so connections
 * opened together each find one; the least recently stored ticket of the
 * whole store goes first when the store is full. PSK-only key exchange is never offered (the client keeps
 * OpenSSL's default of psk_dhe_ke), and no early data is sent.
 *
 * Not thread-safe: the context belongs to one event loop.
 */
#ifndef CE_TLS_SESSCACHE_H
#define CE_TLS_SESSCACHE_H

#include <openssl/ssl.h>
#include <stddef.h>
#include <stdint.h>

/* How many tickets the store holds at most, all keys together. */
#define CE_TLS_SESSCACHE_MAX 256u
/* How many tickets one key (name, port, ALPN offer) holds at most. */
#define CE_TLS_SESSCACHE_PER_KEY 16u
/* Tickets longer than this are not kept (origins send a few hundred
 * bytes): the store's memory stays bounded by what honest origins use. */
#define CE_TLS_SESSCACHE_TICKET_MAX 4096u
/* ALPN lists longer than this (wire bytes) are not cached. */
#define CE_TLS_SESSCACHE_ALPN_MAX 32u

/* Turns resumption on for ctx (a context of ce_tls_client_ctx_new) with a
 * store of at most `max` entries (1..CE_TLS_SESSCACHE_MAX). Returns CE_OK,
 * CE_EINVAL, CE_ENOMEM or CE_ETLS. A second call replaces the store (and
 * drops its sessions). */
int ce__tls_sesscache_attach(SSL_CTX *ctx, size_t max);

/* Marks ssl (a client SSL of ctx, before the handshake) with its key and
 * sets the newest stored session for that key, if any (taking it out of
 * the store). Hosts are already normalised; port 0 turns resumption off for
 * this SSL. Returns CE_OK (also when nothing is cached or the key is not
 * cacheable) or CE_ENOMEM. */
int ce__tls_sesscache_prepare(SSL *ssl, const char *host, uint16_t port,
                              const unsigned char *alpn, size_t alpn_len);

/* The number of tickets held now (tests, statistics). */
size_t ce_tls_sesscache_count(SSL_CTX *ctx);

#endif
