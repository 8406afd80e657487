/*
 * A side's transport (docs/proxy.md, "Inside"): plain TCP or TLS, towards
 * the workspace or an upstream, behind the few questions the HTTP code
 * asks of it, so that the HTTP/1.1 exchange (h1exchange.c) and the HTTP/2
 * path (http2/) never ask "is this TLS?". The bytes themselves go through
 * conn.c's side_write and pump (ce_conn_side_write, ce_conn_pump_tls_input),
 * which are the only places that look inside.
 */
#ifndef CE_PROXY_TRANSPORT_H
#define CE_PROXY_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

struct side;

/* The transport is up for application bytes: connected, and for TLS the
 * handshake done. */
bool ce_transport_ready(const struct side *s);

/* The peer's end of stream is authenticated: TLS saw its close_notify
 * (RFC 8446 §6.1; a bare TCP close may be an attacker's cutting a body
 * short); plain TCP has nothing more to say than the FIN. */
bool ce_transport_clean_end(const struct side *s);

/* The peer picked h2 in its ALPN (TLS only). */
bool ce_transport_speaks_h2(const struct side *s);

/* Nothing more goes to the peer: TLS queues its close_notify (the caller
 * flushes it with the side's write); plain TCP has nothing to add. True
 * when there is output to flush. */
bool ce_transport_close_notify(struct side *s);

/* Bytes read from the socket of a TLS side go to its engine (a plain side
 * is read straight into its input by conn.c). Returns CE_OK or CE_ENOMEM. */
int ce_transport_received(struct side *s, const char *data, size_t len);

/* A rest point between exchanges: the engine gives back the room of its
 * largest read and write (docs/proxy.md, "Memory"). */
void ce_transport_rest(struct side *s);

/* Forgets the transport of a side whose handle is closing: the TLS engine
 * is freed, the flags and the input cleared, so that the side can be
 * connected again. */
void ce_transport_reset(struct side *s);

#endif
