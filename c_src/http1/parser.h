/*
 * A strict HTTP/1.1 parser for both directions of the proxy (RFC 9112).
 *
 * Strict means every framing ambiguity a request-smuggling attack relies on
 * is refused rather than resolved: the proxy and the upstream must never
 * disagree on where a message ends. The parser does not allocate and does
 * not copy: a parsed head points into the caller's buffer, which must stay
 * unchanged while the head is used.
 *
 * Heads are parsed in one call on the buffered bytes (call again after each
 * read while it returns CE_EAGAIN; the head is bounded, see
 * CE_H1_MAX_HEAD_BYTES). Bodies are decoded incrementally by ce_h1_body_t.
 */
#ifndef CE_HTTP1_PARSER_H
#define CE_HTTP1_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of a request or response head (start line + fields + CRLF). Larger
 * request heads get 431, larger response heads end the exchange with 502. */
#define CE_H1_MAX_HEAD_BYTES (64u * 1024u)

/* Header fields kept per message; more is refused like an oversized head. */
#define CE_H1_MAX_FIELDS 128u

typedef struct {
  const char *name;   /* as sent (case preserved), not NUL-terminated */
  size_t name_len;
  const char *value;  /* leading and trailing OWS removed */
  size_t value_len;
} ce_h1_field_t;

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

  /* requests */
  const char *method;         /* token, not NUL-terminated */
  size_t method_len;
  const char *target;         /* request-target as sent */
  size_t target_len;
  const char *host;           /* the single Host field value, or NULL */
  size_t host_len;

  /* responses */
  int status;                 /* 100..999 */
  const char *reason;
  size_t reason_len;

  ce_h1_field_t fields[CE_H1_MAX_FIELDS];
  size_t field_count;

  ce_h1_framing_t framing;
  uint64_t content_length;    /* when framing == CE_H1_BODY_LENGTH */
  bool keep_alive;            /* per version and Connection (RFC 9112 §9.3) */
  bool expect_continue;       /* requests: Expect: 100-continue */
  bool upgrade;               /* Connection: upgrade with an Upgrade field */
  bool upgrade_websocket;     /* ... and Upgrade names websocket */
  size_t head_len;            /* bytes of the buffer the head took */
} ce_h1_head_t;

/*
 * Parses a request head at the start of buf[0..len).
 *
 * Returns CE_OK (head complete, *out filled, out->head_len set), CE_EAGAIN
 * (a valid prefix; read more), CE_ETOOBIG (the head exceeds
 * CE_H1_MAX_HEAD_BYTES or CE_H1_MAX_FIELDS: answer 431), or CE_EPARSE
 * (answer 400). On CE_EPARSE and CE_ETOOBIG *why, when why is not NULL,
 * is set to a static phrase naming the violation ("content-length with
 * transfer-encoding", "obs-fold", "bare CR", ...), used in the 400 body and
 * the event. Refused: Content-Length together with Transfer-Encoding; two
 * Content-Length fields (even equal); a Transfer-Encoding whose final coding
 * is not chunked, or any coding but chunked; obs-fold; a bare CR or a bare
 * LF; whitespace before a field's colon; bytes that are not tchar in a name;
 * control bytes in a value; a missing or duplicated Host on HTTP/1.1; a
 * version other than HTTP/1.0 or HTTP/1.1.
 */
int ce_h1_parse_request(const char *buf, size_t len, ce_h1_head_t *out,
                        const char **why);

/*
 * Parses a response head. request_method/len is the method of the request it
 * answers: a HEAD request's response has no body, and so have 1xx, 204 and
 * 304 (RFC 9112 §6.3). Same returns as ce_h1_parse_request (a too-large or
 * malformed response ends the exchange with 502). A response with neither
 * Content-Length nor chunked is CE_H1_BODY_CLOSE.
 */
int ce_h1_parse_response(const char *buf, size_t len,
                         const char *request_method, size_t request_method_len,
                         ce_h1_head_t *out, const char **why);

/* Finds a field by case-insensitive name; returns its index or -1. */
int ce_h1_find(const ce_h1_head_t *head, const char *name, int start);

/* An incremental body decoder (Content-Length, chunked, until close). */
typedef struct {
  ce_h1_framing_t framing;
  uint64_t remaining;  /* in the current chunk or the whole length body */
  int state;           /* private */
  size_t line_len;     /* private: bytes of the current chunk-size/trailer line */
  size_t trailer_bytes;/* private */
} ce_h1_body_t;

void ce_h1_body_init(ce_h1_body_t *body, ce_h1_framing_t framing,
                     uint64_t content_length);

/*
 * Consumes body bytes from in[0..len). Sets *consumed to the bytes used and
 * *data / *data_len to the payload bytes found (a span inside in, possibly
 * empty; chunk framing and trailers are never payload). Call again with the
 * rest of the input.
 *
 * Returns 1 when the message is complete (bytes after it belong to the next
 * message), 0 when more input is needed, CE_EPARSE (*why set) on a bad chunk
 * size, a missing CRLF after chunk data, a chunk size over 2^63 or longer
 * than 16 hex digits, or a malformed trailer field, CE_ETOOBIG when a
 * chunk-size line or the trailers exceed their bounds. For
 * CE_H1_BODY_CLOSE it never completes: the caller ends it at EOF.
 */
int ce_h1_body_next(ce_h1_body_t *body, const char *in, size_t len,
                    size_t *consumed, const char **data, size_t *data_len,
                    const char **why);

#endif
