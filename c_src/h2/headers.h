/*
 * HTTP/2 ↔ HTTP/1.1 header translation (docs/http2.md §6): pure
 * functions, no allocation, every output bounded by the caller's buffer.
 *
 * Requests (a workspace h2 stream to an HTTP/1.1 upstream): the request
 * line from :method and :path, Host from :authority (or host), the other
 * fields in order minus the connection-specific ones (RFC 9113 §8.2.2:
 * connection, keep-alive, proxy-connection, transfer-encoding, upgrade) and
 * te (response trailers from an HTTP/1.1 upstream are not kept, so asking
 * for them would be false), proxy-authorization (never the origin's), and
 * cookie fields joined with "; " (RFC 9113 §8.2.3).
 *
 * Responses (an HTTP/1.1 upstream's head to an h2 stream): the fields
 * with lower-cased names, minus the hop-by-hop ones above, trailer (the
 * body decoder drops trailers), and every field the Connection field names.
 */
#ifndef CE_H2_HEADERS_H
#define CE_H2_HEADERS_H

#include <stdbool.h>
#include <stddef.h>

#include "http1/parser.h"
#include "http1/writer.h"

/* A field as name and value spans: the parser's own type, so that one
 * header block passes between the HTTP/1.1 and h2 code unchanged. */
typedef ce_h1_field_t ce_h2h_field_t;

/* Is name (any case) a field that never crosses between HTTP/2 and
 * HTTP/1.1 (connection-specific, te, trailer, proxy-authorization)? */
bool ce_h2h_hop_by_hop(const char *name, size_t name_len);

/*
 * Writes the HTTP/1.1 request head for an h2 request's fields f[0..n)
 * (pseudo-headers and regular fields, as decoded): request line, Host
 * first, the forwarded fields, "transfer-encoding: chunked" when chunked
 * (and then no content-length), and the empty line.
 * Returns CE_OK, CE_EINVAL (no :method, no :path, no authority or host, a
 * CONNECT, or a name or value the writer refuses), or CE_ETOOBIG (w full).
 */
int ce_h2h_write_request(ce_h1_writer_t *w, const ce_h2h_field_t *f, size_t n, bool chunked);

/*
 * The fields of an HTTP/1.1 response head for an h2 response, after the
 * caller's ":status": out[0..cap) point into resp (values) and into
 * names[0..names_cap) (lower-cased names). Returns the count, or -1 when
 * out or names is too small.
 */
long ce_h2h_response_fields(const ce_h1_head_t *resp, ce_h2h_field_t *out, size_t cap, char *names,
                            size_t names_cap);

/*
 * The other direction (an HTTP/1.1 workspace's request to an h2 upstream,
 * docs/http2.md §6): the h2 fields of a parsed HTTP/1.1 request head in
 * origin- or asterisk-form, as the proxy forwards it (Host present).
 * out[0..4) are :method, :scheme ("https"), :authority (the Host value)
 * and :path; then the fields in order with lower-cased names (in
 * names[0..names_cap)), minus host, the connection-specific ones, te,
 * trailer, proxy-authorization and every field Connection names; then
 * "te: trailers" when te_trailers (the workspace said it accepts
 * trailers; the only te value h2 allows, RFC 9113 §8.2.2).
 * Returns the count, or -1 when out or names is too small, the head has no
 * Host or path, or is a CONNECT.
 */
long ce_h2h_request_fields(const ce_h1_head_t *req, bool te_trailers, ce_h2h_field_t *out, size_t cap, char *names,
                           size_t names_cap);

/* Response heads to an HTTP/1.1 workspace (flags as http1/writer.h). */
#define CE_H2H_CHUNKED (1u << 0) /* the body goes chunked: drop content-length, add
                                    "transfer-encoding: chunked" */
#define CE_H2H_CLOSE (1u << 1)   /* add "connection: close" */

/*
 * Writes the HTTP/1.1 response head for an h2 response with status and
 * fields f[0..n) (pseudo-headers are skipped): the status line (a
 * standard reason phrase, or none), the regular fields in order minus the
 * connection-specific ones, then the flag fields, then the empty line.
 * Returns CE_OK, CE_EINVAL (a status outside 100..999, a name or value the
 * writer refuses) or CE_ETOOBIG.
 */
int ce_h2h_write_response(ce_h1_writer_t *w, int status, const ce_h2h_field_t *f, size_t n, unsigned flags);

/*
 * Writes the end of a chunked body with trailers: "0" CRLF, the trailer
 * fields f[0..n) minus pseudo-headers and those ce_h1_trailer_allowed
 * refuses (connection-specific, and those RFC 9110 §6.5.1 keeps out of
 * trailers: content-length, host, ...), then CRLF. A field the writer refuses is left out. Returns CE_OK or
 * CE_ETOOBIG (nothing written then).
 */
int ce_h2h_write_trailers(ce_h1_writer_t *w, const ce_h2h_field_t *f, size_t n);

/*
 * The h2 trailer fields of an HTTP/1.1 chunked body's trailer section as
 * the body decoder kept it (ce_h1_body_keep_trailers: validated field
 * lines, each ending in CRLF): names lower-cased into names[0..names_cap),
 * values without surrounding whitespace (pointing into buf), minus the
 * fields ce_h1_trailer_allowed refuses (as ce_h2h_write_trailers). Returns the count, or -1 when
 * out or names is too small.
 */
long ce_h2h_trailer_fields(const char *buf, size_t len, ce_h2h_field_t *out, size_t cap, char *names,
                           size_t names_cap);

#endif
