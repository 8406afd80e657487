/*
 * Serialising HTTP/1.1 heads and chunk framing for the proxy (RFC 9112).
 *
 * The proxy never forwards a head byte for byte: it writes a fresh one from
 * the parsed ce_h1_head_t, in its own HTTP version (RFC 9110 §6.2 requires
 * an intermediary to send its own version), with the hop-by-hop fields of
 * RFC 9110 §7.6.1 removed and its own framing and connection fields added.
 * That way the upstream only ever sees a head whose framing the proxy
 * chose, whatever spelling the client used.
 *
 * Everything is written into a caller-supplied buffer through a
 * ce_h1_writer_t; nothing is allocated. Each call either writes all it was
 * asked to or nothing: on failure w->len is what it was before the call
 * and w->err keeps the code, so later calls fail at once without writing
 * and a caller may check only the last return (or w->err). Every function
 * below returns 0 or:
 *   CE_ETOOBIG  the bytes do not fit in the buffer's remaining space;
 *   CE_EINVAL   an argument would make an invalid message (a method or a
 *               field name that is not a token, a CR, LF or other control
 *               byte in a value, a target with whitespace, ...), so a caller
 *               can never inject a line; or w->err was already set (the
 *               earlier code is returned then, not CE_EINVAL).
 */
#ifndef CE_HTTP1_WRITER_H
#define CE_HTTP1_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "http1/parser.h"

typedef struct {
  char *buf;    /* owned by the caller; not NUL-terminated */
  size_t cap;
  size_t len;   /* bytes written so far */
  int err;      /* 0, or the first failure (sticky) */
} ce_h1_writer_t;

/* Flags for the fields the proxy adds itself; Connection and Upgrade from
 * the parsed head are never copied, and Transfer-Encoding is rewritten
 * (see ce_h1_write_forwarded_fields). */
#define CE_H1_W_CHUNKED (1u << 0) /* the proxy sends the body chunked: add
                                     "Transfer-Encoding: chunked" and drop
                                     Content-Length (RFC 9112 §6.2); implied
                                     when head->framing is CHUNKED */
#define CE_H1_W_CLOSE   (1u << 1) /* add "Connection: close" */
#define CE_H1_W_UPGRADE (1u << 2) /* keep the Upgrade field(s) and add
                                     "Connection: upgrade" (RFC 9110 §7.8) */
#define CE_H1_W_DECHUNK (1u << 3) /* a response with framing CHUNKED whose
                                     body the proxy sends decoded, until the
                                     close (an HTTP/1.0 client, RFC 9112
                                     §6.1): chunked is not implied, the other
                                     codings stay; with CE_H1_W_CHUNKED it is
                                     CE_EINVAL */

/* Starts writing into buf[0..cap). Cannot fail. */
void ce_h1_writer_init(ce_h1_writer_t *w, char *buf, size_t cap);

/* method SP target SP "HTTP/1.1" CRLF. method must be a token and target
 * 1 or more bytes of visible ASCII (0x21-0x7e). */
int ce_h1_write_request_line(ce_h1_writer_t *w, const char *method, size_t method_len,
                             const char *target, size_t target_len);

/* "HTTP/1.1" SP 3DIGIT SP reason CRLF. status must be 100..999; reason
 * (may be empty, reason may then be NULL) holds VCHAR, obs-text, SP and
 * HTAB only. */
int ce_h1_write_status_line(ce_h1_writer_t *w, int status, const char *reason,
                            size_t reason_len);

/* name ": " value CRLF. name must be a token; value may be empty and holds
 * VCHAR, obs-text, SP and HTAB only, with no leading or trailing SP/HTAB
 * (RFC 9110 §5.5: they are not part of a field value). */
int ce_h1_write_field(ce_h1_writer_t *w, const char *name, size_t name_len,
                      const char *value, size_t value_len);

/*
 * Writes the end-to-end fields of head, in their order and spelling, then
 * Transfer-Encoding and Connection as the proxy needs them. Left out
 * (RFC 9110 §7.6.1): Connection and every field it names (but never
 * Content-Length, whose removal would desynchronise the next hop),
 * Keep-Alive, Proxy-Connection, TE, Upgrade (unless CE_H1_W_UPGRADE), and
 * Trailer (the proxy filters the trailers it forwards, and drops them all
 * for an HTTP/1.0 client, so the announcement could be false; RFC 9110
 * §6.6.2 makes it optional). For a request also Host (the request writer puts its own first)
 * and Proxy-Authorization (the client's credentials for this proxy must not
 * reach the origin, RFC 9110 §11.7.2); with CE_H1_W_CHUNKED also
 * Content-Length.
 *
 * Transfer-Encoding is written afresh: "chunked" when the body goes out
 * chunked (CE_H1_W_CHUNKED, implied by framing CHUNKED, so that a caller
 * cannot forget it), preceded for a response by the codings other than
 * chunked the upstream applied ("gzip, chunked" stays so, since the
 * decoded payload is still gzip); a response read until close keeps all
 * its codings, and CE_H1_W_CHUNKED on one that already lists chunked is
 * CE_EINVAL. Nothing else is ever announced: a request's body is chunked
 * exactly when the flag says so.
 */
int ce_h1_write_forwarded_fields(ce_h1_writer_t *w, const ce_h1_head_t *head,
                                 unsigned flags);

/* The empty line that ends a head. */
int ce_h1_write_head_end(ce_h1_writer_t *w);

/*
 * A whole request head for the upstream: the request line with req's method
 * and its target in origin-form (RFC 9112 §3.2.1: an absolute-form target
 * loses scheme and authority, and an empty path becomes "/"; asterisk-form
 * stays "*"), "Host: host" first (RFC 9110 §7.2; when host is NULL,
 * req->host, or else the target's authority: RFC 9112 §3.2.2 has a proxy
 * build Host from an absolute-form target), the forwarded fields and flag
 * fields as ce_h1_write_forwarded_fields(), and the empty line. Also
 * CE_EINVAL for an authority-form (CONNECT) request, which is answered by
 * the proxy and never forwarded as such, or when there is no host at all.
 */
int ce_h1_write_request_head(ce_h1_writer_t *w, const ce_h1_head_t *req,
                             const char *host, size_t host_len, unsigned flags);

/* A whole response head for the client: resp's status and reason, the
 * forwarded fields and flag fields, and the empty line. */
int ce_h1_write_response_head(ce_h1_writer_t *w, const ce_h1_head_t *resp,
                              unsigned flags);

/*
 * Chunked framing (RFC 9112 §7.1). A chunk is
 *   ce_h1_write_chunk_header(w, n), then n bytes of data (written by the
 *   caller wherever it likes, e.g. as a second uv_buf_t), then
 *   ce_h1_write_chunk_end(w);
 * and the body ends with ce_h1_write_last_chunk(w). The header is the size
 * in lower-case hex without leading zeros and without extensions, then CRLF.
 * size must be 1..2^63-1 (CE_EINVAL otherwise: a zero size would end the
 * body, RFC 9112 §7.1; larger sizes are refused by strict readers).
 */
int ce_h1_write_chunk_header(ce_h1_writer_t *w, uint64_t size);

/* The CRLF after a chunk's data. */
int ce_h1_write_chunk_end(ce_h1_writer_t *w);

/* "0" CRLF CRLF: the last chunk and an empty trailer section. */
int ce_h1_write_last_chunk(ce_h1_writer_t *w);

/*
 * May a trailer field named name (any case) be forwarded? Not the
 * connection-specific ones (Connection, Keep-Alive, Proxy-Connection, TE,
 * Transfer-Encoding, Trailer, Upgrade), nor Proxy-Authorization (this
 * proxy's credentials), nor those RFC 9110 §6.5.1 keeps out of a trailer
 * section because a recipient may act on them as if they came in the
 * head: framing (Content-Length), routing (Host), how the content is read
 * (Content-Type, Content-Encoding, Content-Range) and authentication
 * (Authorization, Cookie, Set-Cookie). Every path that forwards trailers
 * (HTTP/1.1 and h2, both directions) filters with this one list. Cannot
 * fail.
 */
bool ce_h1_trailer_allowed(const char *name, size_t name_len);

/* Room ce_h1_write_last_chunk_trailers may need for a kept section of at
 * most CE_H1_MAX_TRAILER_BYTES: a line can grow by one byte (": " after
 * the colon), and a line is at least 4 bytes. */
#define CE_H1_TRAILER_OUT_MAX (5u + 2u * CE_H1_MAX_TRAILER_BYTES)

/*
 * The end of a chunked body with the trailers of another one: "0" CRLF,
 * the fields of kept[0..kept_len) (a trailer section as
 * ce_h1_body_keep_trailers keeps it) that ce_h1_trailer_allowed lets
 * through, in their order and spelling, each written afresh as
 * name ": " value CRLF, then the final CRLF. A field the writer refuses is
 * left out. With kept_len 0 it is ce_h1_write_last_chunk. Returns CE_OK or
 * CE_ETOOBIG (nothing written then), or w->err when already set.
 */
int ce_h1_write_last_chunk_trailers(ce_h1_writer_t *w, const char *kept, size_t kept_len);

/*
 * named[0..field_count) := does a Connection field of h name field i
 * (case-insensitive, RFC 9110 §7.6.1)? The Connection values are parsed once
 * per head, tokens found by binary search among the sorted field names:
 * O((fields + Connection bytes) × log fields), never fields × Connection
 * bytes. named has room for CE_H1_MAX_FIELDS.
 */
void ce_h1_connection_named(const ce_h1_head_t *h, bool *named);

/* The same over a bare field array fields[0..count) (an h2 stream's or a
 * head's fields being rewritten): named[i] for i < min(count,
 * CE_H1_MAX_FIELDS); fields past that bound are never marked. */
void ce_h1_fields_connection_named(const ce_h1_field_t *fields, size_t count, bool *named);

#endif
