/*
 * A strict HTTP/1.1 parser for both directions of the proxy (RFC 9112).
 *
 * Strict means every framing ambiguity a request-smuggling attack relies on
 * is refused rather than resolved: the proxy and the upstream must never
 * disagree on where a message ends. The parser does not allocate and does
 * not copy: a parsed head points into the caller's buffer, which must stay
 * unchanged while the head is used. docs/http1.md lists every refusal with
 * the RFC section behind it.
 *
 * Heads are parsed in one call on the buffered bytes (call again after each
 * read while it returns CE_EAGAIN; the head is bounded, see
 * CE_H1_MAX_HEAD_BYTES). Bodies are decoded incrementally by ce_h1_body_t.
 *
 * Cost of re-parsing: while a head is incomplete a call only looks for its
 * end with memchr(3) over the first min(len, CE_H1_MAX_HEAD_BYTES) bytes
 * (checking that every CR is followed by LF and every LF preceded by CR,
 * and refusing more lines than a head may hold) and checks the first few
 * bytes of the start line. The full validation runs once, when the empty
 * line that ends the head has arrived. A peer sending a maximal head of
 * 129 lines one byte per read, the worst case, costs about 0.2 s of CPU
 * over the 65536 calls (measured on an x86-64 server core).
 */
#ifndef CE_HTTP1_PARSER_H
#define CE_HTTP1_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of a request or response head (start line + fields + CRLF, and
 * any empty lines skipped before a request line). Larger
 * request heads get 431, larger response heads end the exchange with 502. */
#define CE_H1_MAX_HEAD_BYTES (64u * 1024u)

/* Bytes of a request method. Registered methods are at most 17 bytes
 * (VERSION-CONTROL); the bound lets every record keep the method whole,
 * so an event never shows a cut one. */
#define CE_H1_MAX_METHOD_BYTES 31u

/* Header fields kept per message; more is refused like an oversized head. */
#define CE_H1_MAX_FIELDS 128u

/* A chunk-size line, extensions included, CRLF excluded (RFC 9112 §7.1.1).
 * Real extensions are rare and short; the bound stops a peer from making
 * the decoder walk an endless extension. */
#define CE_H1_MAX_CHUNK_LINE_BYTES (4u * 1024u)

/* The trailer section after the last chunk, its final CRLF included
 * (RFC 9112 §7.1.2). Trailers are validated, then dropped unless the
 * caller keeps them (ce_h1_body_keep_trailers) to forward them. */
#define CE_H1_MAX_TRAILER_BYTES (16u * 1024u)

typedef struct {
  const char *name;   /* as sent (case preserved), not NUL-terminated */
  size_t name_len;
  const char *value;  /* leading and trailing OWS removed */
  size_t value_len;
} ce_h1_field_t;

/* The four forms of request-target (RFC 9112 §3.2). */
typedef enum {
  CE_H1_TARGET_ORIGIN = 0, /* "/path?query" */
  CE_H1_TARGET_ABSOLUTE,   /* "http://host/path": to a forward proxy */
  CE_H1_TARGET_AUTHORITY,  /* "host:port": CONNECT only */
  CE_H1_TARGET_ASTERISK    /* "*": OPTIONS only */
} ce_h1_target_form_t;

/* How the message body is delimited (RFC 9112 §6.3). */
typedef enum {
  CE_H1_BODY_NONE = 0,  /* no body (GET without framing, HEAD/204/304/1xx replies) */
  CE_H1_BODY_LENGTH,    /* Content-Length bytes */
  CE_H1_BODY_CHUNKED,   /* Transfer-Encoding: chunked */
  CE_H1_BODY_CLOSE      /* responses only: until the connection closes */
} ce_h1_framing_t;

typedef struct {
  bool is_response;
  int version_minor;          /* 0 or 1 (HTTP/1.0, HTTP/1.1) */

  /* requests (NULL and 0 in a response) */
  const char *method;         /* token, not NUL-terminated */
  size_t method_len;
  const char *target;         /* request-target as sent */
  size_t target_len;
  const char *host;           /* the single Host field value, or NULL */
  size_t host_len;
  ce_h1_target_form_t target_form;
  const char *authority;      /* absolute- and authority-form: the target's
                                 host[:port], else NULL */
  size_t authority_len;
  const char *path;           /* origin-form: the whole target; absolute-form:
                                 what follows the authority (may be empty or
                                 start with '?': write "/" before it, RFC 9112
                                 §3.2.1); asterisk-form: "*"; authority-form:
                                 NULL */
  size_t path_len;

  /* responses (NULL and 0 in a request) */
  int status;                 /* 100..999 */
  const char *reason;
  size_t reason_len;

  ce_h1_field_t fields[CE_H1_MAX_FIELDS];
  size_t field_count;

  ce_h1_framing_t framing;
  uint64_t content_length;    /* the Content-Length value, 0 when absent; the
                                 body length when framing == LENGTH (a HEAD
                                 or 304 reply may carry one for framing NONE) */
  bool keep_alive;            /* per version and Connection (RFC 9112 §9.3);
                                 false for a response framed by CLOSE */
  bool expect_continue;       /* HTTP/1.1 requests: Expect: 100-continue */
  bool upgrade;               /* Connection: upgrade with an Upgrade field
                                 (never on HTTP/1.0 requests, RFC 9110 §7.8) */
  bool upgrade_websocket;     /* ... and Upgrade names websocket */
  size_t head_len;            /* bytes of the buffer the head took, empty
                                 lines skipped before a request included */
} ce_h1_head_t;

/*
 * Parses a request head at the start of buf[0..len). out must not be NULL.
 *
 * Returns:
 *   CE_OK       the head is complete: *out is filled, out->head_len says
 *               where the body (or the next request) starts.
 *   CE_EAGAIN   the bytes are a valid prefix so far; read more, call again.
 *   CE_ETOOBIG  no end of head within CE_H1_MAX_HEAD_BYTES, or more than
 *               CE_H1_MAX_FIELDS fields: answer 431.
 *   CE_EPARSE   malformed or ambiguous: answer 400.
 *   CE_EINVAL   buf is NULL with len > 0.
 * On every failure *out is untouched, and *why (when why is not NULL) is
 * set to a static phrase naming the violation ("content-length with
 * transfer-encoding", "obs-fold", "bare CR", ...), used in the error body
 * and the event. Refused (docs/http1.md has the RFC section for each): a
 * bare CR or bare LF; obs-fold or whitespace before the first field;
 * whitespace before a field's colon; a name byte that is not tchar; a
 * control byte in a value; a version other than HTTP/1.0 or HTTP/1.1 (the
 * HTTP/2 preface has its own phrase); a target with whitespace, controls,
 * non-ASCII bytes or a fragment, or of a form its method may not use;
 * Content-Length together with Transfer-Encoding; a Transfer-Encoding other
 * than exactly "chunked", or any on HTTP/1.0; two Content-Length fields
 * (even equal) or a malformed one; a missing Host on HTTP/1.1, two Host
 * fields, or an invalid one; a Host that differs from an absolute-form
 * target's authority; an Expect other than 100-continue; a body on
 * CONNECT; a Connection option naming Content-Length; "Content_Length" and
 * "Transfer_Encoding" lookalike names; more than 8 empty lines before the
 * request line.
 * Empty lines before the request line are skipped (RFC 9112 §2.2) and
 * counted in head_len.
 */
int ce_h1_parse_request(const char *buf, size_t len, ce_h1_head_t *out,
                        const char **why);

/*
 * Parses a response head. request_method/len is the method of the request it
 * answers (NULL for none): a HEAD request's response has no body, and so
 * have 1xx, 204 and 304, and a 2xx to CONNECT starts a tunnel (RFC 9112
 * §6.3). Same returns as ce_h1_parse_request (a too-large or malformed
 * response ends the exchange with 502). A response with neither
 * Content-Length nor Transfer-Encoding, or whose Transfer-Encoding does not
 * end in chunked, is CE_H1_BODY_CLOSE. Refused beyond the request rules
 * that apply: Content-Length with Transfer-Encoding in any response,
 * chunked applied twice, a 101 without Upgrade, a missing SP after the
 * status code, a status below 100. Codings before chunked ("gzip, chunked")
 * are accepted: the decoder then yields gzip bytes, and the writer keeps
 * saying so to the client.
 */
int ce_h1_parse_response(const char *buf, size_t len,
                         const char *request_method, size_t request_method_len,
                         ce_h1_head_t *out, const char **why);

/* Finds the first field at index start or later (a negative start counts
 * as 0) whose name equals name (NUL-terminated) case-insensitively; returns
 * its index or -1. Cannot fail. */
int ce_h1_find(const ce_h1_head_t *head, const char *name, int start);

/* An incremental body decoder (Content-Length, chunked, until close). It
 * keeps no pointer into the input, so each read buffer may be handed over
 * and released separately. */
typedef struct {
  ce_h1_framing_t framing;
  uint64_t remaining;  /* in the current chunk or the whole length body */
  int state;           /* private */
  size_t line_len;     /* private: bytes of the current chunk-size line */
  size_t trailer_bytes;/* private */
  char *keep;          /* private: see ce_h1_body_keep_trailers */
  size_t kept;         /* trailer bytes kept in keep */
} ce_h1_body_t;

/* Starts decoding a body framed as the parsed head says (content_length is
 * only read for CE_H1_BODY_LENGTH). Cannot fail. */
void ce_h1_body_init(ce_h1_body_t *body, ce_h1_framing_t framing,
                     uint64_t content_length);

/*
 * Keeps the trailer section instead of dropping it: buf (at least
 * CE_H1_MAX_TRAILER_BYTES bytes, owned by the caller) receives the trailer
 * field lines as validated, each with its CRLF, without the final empty
 * line; body->kept says how many bytes. Call after ce_h1_body_init.
 * Cannot fail.
 */
void ce_h1_body_keep_trailers(ce_h1_body_t *body, char *buf);

/*
 * Walks a trailer section as ce_h1_body_keep_trailers keeps it (field
 * lines, each ending in CRLF): from buf[*pos], fills *f with the next
 * field (name as sent, value without surrounding OWS, both pointing into
 * buf) and moves *pos past its line. Returns false at the end of
 * buf[0..len). A line without a colon, or with an empty name, which the
 * decoder never keeps, is skipped. Cannot fail.
 */
bool ce_h1_trailer_next(const char *buf, size_t len, size_t *pos, ce_h1_field_t *f);

/*
 * Consumes body bytes from in[0..len). Sets *consumed to the bytes used and
 * *data / *data_len to the payload bytes found (a span inside in, possibly
 * empty; chunk framing and trailers are never payload). One call yields at
 * most one span: call again with in + *consumed until the input is used up
 * or 1 comes back. With len > 0, a 0 return always consumed something.
 *
 * Returns:
 *   1           the message is complete; in[*consumed..len) belongs to the
 *               next message. Further calls return 1 and consume nothing.
 *               CE_H1_BODY_NONE and a zero length complete at once.
 *   0           more input is needed.
 *   CE_EPARSE   (*why set) a malformed chunk size ("0x5", "-5", "+5", an
 *               empty line), one over 2^63-1 or longer than 16 hex digits, a
 *               malformed chunk extension, a bare CR or LF in chunk framing,
 *               a missing CRLF after chunk data, or a trailer field that a
 *               head would refuse.
 *   CE_ETOOBIG  (*why set) a chunk-size line over CE_H1_MAX_CHUNK_LINE_BYTES
 *               or trailers over CE_H1_MAX_TRAILER_BYTES.
 *   CE_EINVAL   the decoder already failed, or an unknown framing.
 * After a failure *data_len is 0 and *consumed is the number of bytes
 * before the offending one. Trailer fields are validated and dropped
 * (RFC 9110 §6.5.1 lets a recipient discard them) unless kept
 * (ce_h1_body_keep_trailers). For CE_H1_BODY_CLOSE it
 * never completes: the caller ends the body at EOF.
 */
int ce_h1_body_next(ce_h1_body_t *body, const char *in, size_t len,
                    size_t *consumed, const char **data, size_t *data_len,
                    const char **why);

#endif
