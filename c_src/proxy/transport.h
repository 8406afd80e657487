/*
 * A side's transport (docs/proxy.md, "Inside"): plain TCP or TLS, towards
 * the workspace or an upstream, behind the few questions the HTTP code
 * asks of it and the bytes it carries, so that the connection (conn.c),
 * the HTTP/1.1 exchange (h1exchange.c) and the HTTP/2 path (http2/) never
 * ask "is this TLS?". Under it is the side's socket, written through
 * conn.c's wire (conn__wire_new, conn__wire_send).
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

/* Nothing more goes to the peer: TLS seals what was gathered, then
 * queues its close_notify (the caller flushes it with the side's write):
 * CE_OK. Plain TCP (or TLS before its handshake) has nothing to add:
 * CE_EAGAIN. CE_ETLS: the gathered bytes could not be sealed, so the
 * peer would get less than it was given (conn__write_failed). */
int ce_transport_close_notify(struct side *s);

/* Bytes read from the side's socket: a plain side copies them into its
 * input (CE_ETOOBIG when they do not fit: ce_transport_read_room bounds a
 * read), a TLS side gives them to its engine. Returns CE_OK, CE_ENOMEM or
 * CE_ETOOBIG. */
int ce_transport_received(struct side *s, const char *data, size_t len);

/* How many bytes a read of the socket may bring now, at most chunk: a
 * plain side no more than its input has room for; TLS a whole chunk (the
 * engine holds what the input cannot take yet). */
size_t ce_transport_read_room(const struct side *s, size_t chunk);

/* The socket is not to be read: a TLS side whose plaintext input is full
 * (more bytes would only wait inside the engine). A plain side's reads are
 * bounded by ce_transport_read_room instead. */
bool ce_transport_input_full(const struct side *s);

/* A TLS side whose handshake is still to finish. */
bool ce_transport_handshaking(const struct side *s);

/* Moves plaintext the engine has decrypted into the side's input while
 * there is room; the peer's close_notify sets eof. CE_OK when the engine
 * was read (its output, such as key updates, is then to be flushed with
 * ce_transport_send(s, NULL, 0)); CE_EAGAIN when there is nothing to pump
 * (a plain side, a handshake not done, eof); CE_ENOMEM without an input
 * buffer; CE_ETLS on a TLS failure (ce_transport_error says which). */
int ce_transport_pump(struct side *s);

/* Gives plaintext to the side (data NULL, len 0: nothing), counted in its
 * queued bytes at once. It is gathered until the turn of the loop ends
 * (ce_transport_flush): a TLS side seals it into records of up to
 * CE_CONN_RECORD bytes, each as soon as it is full; a plain side writes
 * whole records' worth as they come. CE_OK; CE_ETLS when the engine
 * refused it (the caller reports it); CE_ECLOSED when a socket write
 * failed (conn.c's wire reported it and aborted the connection). */
int ce_transport_send(struct side *s, const char *data, size_t len);

/* Seals what the side gathered now, as a record of its own however short
 * (a plain side writes it), so that a whole record given next goes
 * straight from the caller's bytes instead of being copied to fill the
 * gathered one. The same returns as ce_transport_send. */
int ce_transport_seal(struct side *s);

/* The side has output waiting for a flush: gathered plaintext, or what
 * the TLS engine produced (records, a handshake flight, an alert). */
bool ce_transport_has_output(const struct side *s);

/* Writes everything the side gathered (plaintext, and all the TLS engine
 * has to send: records, handshake flights, alerts) in one socket write,
 * and gives its record buffer back. The same returns as
 * ce_transport_send. */
int ce_transport_flush(struct side *s);

/* The TLS engine's first error, or "" for a plain side. */
const char *ce_transport_error(const struct side *s);

/* The peer refused the certificate we showed (TLS, workspace side). */
bool ce_transport_peer_rejected_cert(const struct side *s);

/* A rest point between exchanges: the engine gives back the room of its
 * largest read and write (docs/proxy.md, "Memory"). */
void ce_transport_rest(struct side *s);

/* Forgets the transport of a side whose handle is closing: the TLS engine
 * is freed, the flags, the input and any gathered output cleared, so that
 * the side can be connected again. */
void ce_transport_reset(struct side *s);

#endif
