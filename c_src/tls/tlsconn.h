/*
 * TLS over memory BIOs: the transport-independent TLS engine of one side
 * of a proxied connection (docs/tls.md).
 *
 * The proxy owns the sockets (libuv); this object only turns ciphertext
 * into plaintext and back. Feed bytes read from the socket with
 * ce_tlsconn_feed(), drive the handshake, read and write plaintext, and
 * send whatever ce_tlsconn_take_out() hands back. Nothing here blocks or
 * touches a file descriptor.
 *
 * Output can appear after any call, not only after writes: the handshake
 * produces flights, a read can answer a TLS 1.3 KeyUpdate, and a failure
 * queues the alert for the peer. After every call, send what
 * ce_tlsconn_pending_out() reports.
 *
 * A failure (CE_ETLS) is final: every later handshake, read or write
 * returns CE_ETLS again and ce_tlsconn_error() keeps the first reason.
 * Every call starts and ends with OpenSSL's per-thread error queue empty,
 * so one connection's errors never show up as another's.
 *
 * The object installs an info callback on its SSL (SSL_set_info_callback)
 * to see the alerts the peer sends; replacing it loses the alert details
 * (the error queue still gives the reason). Not thread-safe: one
 * connection belongs to one event loop.
 */
#ifndef CE_TLS_TLSCONN_H
#define CE_TLS_TLSCONN_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ce_tlsconn_error() texts are cut to this many bytes (NUL included). */
#define CE_TLSCONN_ERROR_MAX 256u

typedef struct ce_tlsconn ce_tlsconn_t;

/* Takes ownership of ssl (freed by ce_tlsconn_free), made by
 * ce_tls_server_ssl_new or ce_tls_client_ssl_new; server selects the
 * accept or connect role. Any BIOs already set on ssl are replaced.
 * Returns CE_OK, CE_EINVAL (ssl or out NULL) or CE_ENOMEM; on failure ssl
 * is freed and *out is untouched. */
int ce_tlsconn_new(SSL *ssl, bool server, ce_tlsconn_t **out);

/* Frees the connection and its SSL; NULL is fine. Pending output is
 * dropped (call ce_tlsconn_shutdown and send first for a clean close). */
void ce_tlsconn_free(ce_tlsconn_t *t);

/* The SSL, borrowed, for queries (version, cipher, peer certificate). */
SSL *ce_tlsconn_ssl(ce_tlsconn_t *t);

/* Ciphertext read from the peer; it is buffered until consumed by the
 * handshake or a read. The caller bounds how much it feeds (it reads from
 * the socket only when it can process). Returns CE_OK, CE_EINVAL (in NULL
 * with len > 0) or CE_ENOMEM. */
int ce_tlsconn_feed(ce_tlsconn_t *t, const uint8_t *in, size_t len);

/* Drives the handshake. CE_OK = complete (also on later calls), CE_EAGAIN
 * = feed more input (and send pending output first), CE_ETLS = failed (see
 * ce_tlsconn_error and ce_tlsconn_peer_rejected_cert). */
int ce_tlsconn_handshake(ce_tlsconn_t *t);

/* Plaintext from the peer, up to cap bytes: CE_OK with *n > 0, CE_EAGAIN
 * (need input), CE_ECLOSED (close_notify received; later reads say so
 * again), CE_EINVAL (buf or n NULL, cap 0), CE_ETLS. A read before the
 * handshake completed drives the handshake. *n is set only with CE_OK. */
int ce_tlsconn_read(ce_tlsconn_t *t, uint8_t *buf, size_t cap, size_t *n);

/* Encrypts all of buf (the output grows; the caller bounds what it writes
 * by watching ce_tlsconn_pending_out). len 0 is a no-op. Returns CE_OK,
 * CE_EINVAL (the handshake is not complete, or buf NULL with len > 0),
 * CE_ECLOSED (after ce_tlsconn_shutdown) or CE_ETLS. */
int ce_tlsconn_write(ce_tlsconn_t *t, const uint8_t *buf, size_t len);

/* Queues a close_notify (once). Does nothing before the handshake
 * completed or after a failure: there is no session to close, and the
 * proxy just closes the socket. */
void ce_tlsconn_shutdown(ce_tlsconn_t *t);

/* Ciphertext waiting to be sent, and a way to take it (up to cap bytes;
 * returns the count, 0 when nothing is pending). */
size_t ce_tlsconn_pending_out(ce_tlsconn_t *t);
size_t ce_tlsconn_take_out(ce_tlsconn_t *t, uint8_t *buf, size_t cap);

/* A memory BIO keeps the largest buffer it ever held (OpenSSL grows it
 * and never shrinks it, zero-filled): after one large read or write a
 * connection would keep that much ciphertext room for its whole life.
 * This swaps each empty BIO holding more than CE_TLSCONN_BIO_KEEP bytes of
 * room for a fresh one (the SSL and its state are untouched; bytes still
 * queued keep their BIO). For the proxy's rest points (the end of an
 * exchange), not the data path: a fresh BIO grows again. A failed
 * allocation keeps the old BIO. */
#define CE_TLSCONN_BIO_KEEP (32u * 1024u)
void ce_tlsconn_trim(ce_tlsconn_t *t);

/* The same for a connection at rest for a while (idle keep-alive): every
 * empty BIO that holds any room is swapped for a fresh one, so an idle
 * connection keeps no ciphertext buffer at all (a few KiB each after a
 * small exchange). Not for every exchange end: the BIOs grow again, in
 * several steps, on the next one. NULL is fine. */
void ce_tlsconn_release(ce_tlsconn_t *t);

/* The bytes of room the connection's two memory BIOs hold now, whether
 * filled or not (what OpenSSL allocated for them and keeps until they
 * are trimmed or freed): the accounting of buffer statistics. NULL: 0. */
size_t ce_tlsconn_held(const ce_tlsconn_t *t);

/* The part of it that ce_tlsconn_release would give back now: the room of
 * the BIOs that are empty (one holding bytes, a partial record, keeps
 * its room). NULL: 0. */
size_t ce_tlsconn_releasable(const ce_tlsconn_t *t);

/* After CE_ETLS: a one-line description, owned by t and valid until it is
 * freed, such as "certificate verify failed: hostname mismatch",
 * "the peer sent fatal alert unknown_ca (48)" or "TLS failure: wrong
 * version number";
 * "" before any failure. */
const char *ce_tlsconn_error(const ce_tlsconn_t *t);

/* True when the failure was the peer refusing our certificate during the
 * handshake: a fatal alert bad_certificate, unsupported_certificate,
 * certificate_revoked, certificate_expired, certificate_unknown,
 * unknown_ca or access_denied, or (towards an upstream that wants a client
 * certificate) certificate_required. For the client role "during the
 * handshake" lasts until the first application data is read, because a
 * TLS 1.3 server judges the client's certificate only after the client's
 * side of the handshake is complete. On the workspace side the proxy
 * reports this as tls_client_rejected_ca: the workspace does not trust the
 * session CA. A peer that closes the connection without an alert cannot be
 * told apart from any other abort (docs/tls.md). */
bool ce_tlsconn_peer_rejected_cert(const ce_tlsconn_t *t);

/* After the handshake: the negotiated ALPN protocol, *len bytes, not
 * NUL-terminated, owned by the SSL (NULL and *len 0 when none). len may be
 * NULL. */
const char *ce_tlsconn_alpn(ce_tlsconn_t *t, size_t *len);

#endif
