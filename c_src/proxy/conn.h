/*
 * One intercepted workspace connection and its upstream (docs/proxy.md).
 *
 * Life of a connection:
 *   HELLO      the first bytes: a TLS ClientHello (SNI, ALPN) or plain HTTP
 *   HANDSHAKE  TLS with the workspace, a leaf minted for the SNI
 *   HEAD       waiting for a request head (keep-alive loops back here)
 *   DECIDING   a decide rule asked the control channel; reading continues
 *              into the bounded buffer, nothing is forwarded
 *   CONNECTING resolving, connecting (marked socket) and TLS to upstream
 *   EXCHANGE   request body up, response down, both re-framed
 *   TUNNEL     after a 101 to a WebSocket upgrade: bytes both ways
 *   CLOSING    flushing what was queued, then closing both sockets
 *
 * Every request is evaluated on its own. A connection owns both sockets,
 * their TLS engines, its buffers and its current request record; it is
 * freed in the close callback of the last of its handles, once no resolver
 * request is in flight.
 */
#ifndef CE_PROXY_CONN_H
#define CE_PROXY_CONN_H

#include "http1/parser.h"
#include "proxy/proxy.h"

/* Plaintext input buffered per side: a whole request or response head
 * (CE_H1_MAX_HEAD_BYTES) plus room for the start of a body. */
#define CE_CONN_INPUT_MAX (128u * 1024u)

/* Bytes queued towards one socket before the proxy stops reading from the
 * other: memory per connection stays bounded whatever the peers' speeds. */
#define CE_CONN_HIGH_WATER (256u * 1024u)

/* Bytes of one socket read. */
#define CE_CONN_READ_CHUNK (64u * 1024u)

/* Output is gathered per side and per turn of the loop, and written once
 * at the turn's end (docs/proxy.md, "Writes"); plaintext is gathered into
 * records of this many bytes, the most one TLS record carries (RFC 8446
 * §5.1: 2^14), and sealed as soon as one is full. */
#define CE_CONN_RECORD (16u * 1024u)

/* Empty record buffers the proxy keeps for reuse (ce_proxy_t.recbufs). */
#define CE_CONN_SPARE_RECORDS 16u

/* A head the proxy writes: the largest head it accepts plus what it adds. */
#define CE_CONN_HEAD_OUT_MAX (CE_H1_MAX_HEAD_BYTES + 256u)

/* Empty input buffers the proxy keeps for reuse (ce_proxy_t.inbufs): a
 * busy connection does not allocate one per request, and at most this many
 * × CE_CONN_INPUT_MAX bytes are held by no connection. */
#define CE_CONN_SPARE_INPUTS 8u

/* A denied request with a body up to this size is read and discarded so
 * that the connection can be kept alive; a larger one closes it. */
#define CE_CONN_DISCARD_MAX (64u * 1024u)

/* Lingering close: when the proxy closes a connection whose client may
 * still be sending (an upload answered early, a refused body), it shuts
 * its write side and reads and drops what comes for at most this long
 * before closing. Closing with unread input makes the kernel send a reset,
 * which can destroy the response still in flight to the client (the
 * reason nginx has lingering_close). */
#define CE_CONN_LINGER_MS 5000u

#endif
