/*
 * TLS over memory BIOs: the transport-independent TLS engine of one side
 * of a proxied connection (docs/tls.md).
 *
 * The proxy owns the sockets (libuv); this object only turns ciphertext
 * into plaintext and back. Feed bytes read from the socket with
 * ce_tlsconn_feed(), drive the handshake, read and write plaintext, and
 * send whatever ce_tlsconn_take_out() hands back. Nothing here blocks or
 * touches a file descriptor.
 */
#ifndef CE_TLS_TLSCONN_H
#define CE_TLS_TLSCONN_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ce_tlsconn ce_tlsconn_t;

/* Takes ownership of ssl (freed by ce_tlsconn_free). server selects the
 * accept or connect role. Returns CE_OK or CE_ENOMEM (ssl freed). */
int ce_tlsconn_new(SSL *ssl, bool server, ce_tlsconn_t **out);
void ce_tlsconn_free(ce_tlsconn_t *t);
SSL *ce_tlsconn_ssl(ce_tlsconn_t *t);

/* Ciphertext read from the peer. Returns CE_OK or CE_ENOMEM. */
int ce_tlsconn_feed(ce_tlsconn_t *t, const uint8_t *in, size_t len);

/* Drives the handshake. CE_OK = complete, CE_EAGAIN = feed more input (and
 * send pending output first), CE_ETLS = failed (see ce_tlsconn_error). */
int ce_tlsconn_handshake(ce_tlsconn_t *t);

/* Plaintext from the peer: CE_OK with *n > 0, CE_EAGAIN (need input),
 * CE_ECLOSED (close_notify received), CE_ETLS. */
int ce_tlsconn_read(ce_tlsconn_t *t, uint8_t *buf, size_t cap, size_t *n);

/* Encrypts all of buf (the output grows; the caller bounds what it writes
 * by watching ce_tlsconn_pending_out). Returns CE_OK or CE_ETLS. */
int ce_tlsconn_write(ce_tlsconn_t *t, const uint8_t *buf, size_t len);

/* Queues a close_notify. */
void ce_tlsconn_shutdown(ce_tlsconn_t *t);

/* Ciphertext waiting to be sent, and a way to take it (up to cap bytes;
 * returns the count, 0 when nothing is pending). */
size_t ce_tlsconn_pending_out(ce_tlsconn_t *t);
size_t ce_tlsconn_take_out(ce_tlsconn_t *t, uint8_t *buf, size_t cap);

/* After CE_ETLS: a short static-lifetime description ("alert unknown_ca
 * received", "certificate verify failed: ...", ...) copied into a buffer
 * owned by t, and whether the failure was the peer refusing our
 * certificate (alerts unknown_ca, bad_certificate, certificate_unknown,
 * unsupported_certificate, access_denied... during the handshake): the
 * proxy reports that as tls_client_rejected_ca. */
const char *ce_tlsconn_error(const ce_tlsconn_t *t);
bool ce_tlsconn_peer_rejected_cert(const ce_tlsconn_t *t);

/* After the handshake: the negotiated ALPN protocol (NULL when none). */
const char *ce_tlsconn_alpn(ce_tlsconn_t *t, size_t *len);

#endif
