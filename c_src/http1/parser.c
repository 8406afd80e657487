/*
 * The strict HTTP/1.1 parser (see parser.h and docs/http1.md).
 *
 * A head is handled in two passes. scan_head() finds where it ends using
 * memchr(3) only, refusing bare CR and bare LF on the way; while the head
 * is incomplete that is all a call does (plus a look at the first bytes of
 * the start line), so re-parsing a growing buffer stays cheap. Once the
 * empty line has arrived, parse_head() validates every line and works out
 * the framing. Each line is then known to end in CRLF and to contain no
 * other CR or LF.
 */
#include "http1/parser.h"

#include <string.h>

#include "common/error.h"
#include "http1/chars.h"

/* Bytes of a not yet complete start line inspected before the rest of the
 * head arrives. Enough to see that a request does not start with a method
 * (a TLS record on the plain port, binary junk) or a response with
 * "HTTP/1.", while keeping the per-call work constant. */
#define EARLY_CHECK_BYTES 32u

/* Empty lines skipped before a request line (RFC 9112 §2.2 asks for at
 * least one). Clients that send any send one, after a body; the bound keeps
 * a stream of CRLFs from costing a memchr() pair per two bytes on every
 * call. */
#define MAX_LEADING_EMPTY_LINES 8u

/* RFC 9112 §6.3 and §7.1: sizes must fit an int64 so that no peer and no
 * implementation downstream sees them wrap. */
#define MAX_BODY_SIZE UINT64_C(0x7fffffffffffffff)

/* RFC 9112 §7.1 caps nothing, but a chunk-size with more than 16 hex digits
 * either has leading zeros nobody needs or overflows 64 bits. */
#define MAX_CHUNK_SIZE_DIGITS 16u

static int fail(const char **why, const char *phrase, int err) {
  if (why != NULL)
    *why = phrase;
  return err;
}

/* Facts gathered from the fields while they are validated, turned into the
 * framing and connection flags at the end. */
typedef struct {
  bool is_response;
  bool cl_seen;
  uint64_t cl;
  bool te_seen;
  size_t te_codings;        /* non-empty list elements over all TE fields */
  size_t te_chunked;        /* how many of them are "chunked" */
  bool te_last_chunked;     /* the final coding is chunked */
  size_t host_count;
  const char *host;
  size_t host_len;
  bool conn_close;
  bool conn_keep_alive;
  bool conn_upgrade;
  size_t upgrade_protocols; /* elements over all Upgrade fields */
  bool upgrade_websocket;
  bool expect_continue;
} facts_t;

/* ------------------------------------------------------------------------
 * Finding the end of the head
 * ------------------------------------------------------------------------ */

/*
 * Looks for the empty line that ends the head within the first
 * CE_H1_MAX_HEAD_BYTES bytes. Returns CE_OK with *head_len set, CE_EAGAIN
 * when the bytes so far are not yet a head (the caller decides between
 * EAGAIN and ETOOBIG), CE_EPARSE, or CE_ETOOBIG for too many field lines.
 * *line0 is the offset of the start line (past any empty lines a request
 * may start with).
 *
 * Lines are counted as well as bytes, and refused as soon as there are
 * more than a head may hold, so that one call costs at most a few hundred
 * memchr() calls plus one pass over the bytes, however short the lines.
 */
static int scan_head(const char *buf, size_t len, bool is_response,
                     size_t *line0, size_t *head_len, const char **why) {
  size_t limit = len < CE_H1_MAX_HEAD_BYTES ? len : CE_H1_MAX_HEAD_BYTES;
  size_t pos = 0;
  size_t lines = 0;       /* complete non-empty lines, start line included */
  size_t empty_lines = 0; /* skipped before a request line */

  *line0 = 0;
  for (;;) {
    const char *lf = memchr(buf + pos, '\n', limit - pos);
    size_t end = lf != NULL ? (size_t)(lf - buf) : limit;
    const char *cr = memchr(buf + pos, '\r', end - pos);

    /* RFC 9112 §2.2: a bare CR must be refused or replaced by SP; since the
     * upstream might do either, we refuse. A CR as the very last byte read
     * may still be followed by LF. */
    if (cr != NULL && (size_t)(cr - buf) + 1 < end)
      return fail(why, "bare CR", CE_EPARSE);
    if (lf == NULL)
      return CE_EAGAIN;
    /* RFC 9112 §2.2 lets a recipient accept a bare LF as a line end; an
     * upstream that does not would see a different message, so we refuse. */
    if (end == pos || buf[end - 1] != '\r')
      return fail(why, "bare LF", CE_EPARSE);
    if (end - 1 == pos) {
      if (lines > 0) {
        *head_len = end + 1;
        return CE_OK;
      }
      /* RFC 9112 §2.2: a server SHOULD ignore at least one empty line
       * before the request-line (old clients sent CRLF after a POST body).
       * We ignore up to MAX_LEADING_EMPTY_LINES, counted in head_len and
       * against CE_H1_MAX_HEAD_BYTES; they are never forwarded, so no one
       * downstream has to agree. That leniency is granted to servers only,
       * so a response may not start with an empty line. */
      if (is_response)
        return fail(why, "empty line before the status line", CE_EPARSE);
      if (++empty_lines > MAX_LEADING_EMPTY_LINES)
        return fail(why, "too many empty lines before the request line", CE_EPARSE);
      pos = end + 1;
      *line0 = pos;
      continue;
    }
    if (++lines > 1 + CE_H1_MAX_FIELDS)
      return fail(why, "too many fields", CE_ETOOBIG);
    pos = end + 1;
  }
}

/*
 * Checks the first bytes of an incomplete start line so that something that
 * is clearly not HTTP/1 is refused at once instead of after 64 KiB or a
 * timeout. Only refuses what the full parse would refuse as well.
 */
static int early_check(const char *s, size_t n, bool is_response, const char **why) {
  if (n > EARLY_CHECK_BYTES)
    n = EARLY_CHECK_BYTES;
  if (is_response) {
    static const char prefix[] = "HTTP/1.";
    size_t m = n < sizeof(prefix) - 1 ? n : sizeof(prefix) - 1;
    if (memcmp(s, prefix, m) != 0)
      return fail(why, "malformed status line", CE_EPARSE);
    return CE_OK;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' && i > 0)
      return CE_OK;
    if (c == '\r')
      return CE_OK; /* scan_head() judges line ends */
    if (!ce__h1_is_tchar(c))
      return fail(why, "malformed method", CE_EPARSE);
  }
  return CE_OK;
}

/* ------------------------------------------------------------------------
 * Start lines
 * ------------------------------------------------------------------------ */

/* HTTP-version (RFC 9112 §2.3) is case-sensitive; we accept the two minor
 * versions we implement. §2.3 says a recipient SHOULD treat a higher minor
 * version as the highest it supports; we refuse instead, as the brief for
 * this parser is "exactly 1.0 or 1.1" and no client sends HTTP/1.2. */
static int parse_version(const char *s, size_t n, int *minor, const char **why) {
  if (n == 8 && memcmp(s, "HTTP/1.", 7) == 0 && (s[7] == '0' || s[7] == '1')) {
    *minor = s[7] - '0';
    return CE_OK;
  }
  if (n == 8 && memcmp(s, "HTTP/", 5) == 0 && ce__h1_is_digit((unsigned char)s[5]) &&
      s[6] == '.' && ce__h1_is_digit((unsigned char)s[7]))
    return fail(why, "unsupported http version", CE_EPARSE);
  return fail(why, "malformed http version", CE_EPARSE);
}

/* host chars of RFC 3986 §3.2.2 reg-name and IPv4address: unreserved,
 * pct-encoded (checked loosely: just '%') and sub-delims. */
static bool is_reg_name_char(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
    return true;
  switch (c) {
  case '-': case '.': case '_': case '~': case '%': case '!': case '$':
  case '&': case '\'': case '(': case ')': case '*': case '+': case ',':
  case ';': case '=':
    return true;
  default:
    return false;
  }
}

/*
 * A loose check of uri-host [ ":" port ] (RFC 9110 §7.2, RFC 3986 §3.2.2),
 * used for the Host field and the authority of a target. It refuses what
 * could make two readers see different hosts: whitespace, '/', '@' (a
 * userinfo, RFC 9110 §4.2.4), '?', '#', '\', an empty host (RFC 9110 §4.2.1
 * requires recipients to reject an http URI with an empty host) and an
 * empty or non-numeric port. Whether the host is a valid DNS name or IP
 * literal is the policy engine's question (docs/host-matching.md).
 */
static bool host_port_ok(const char *s, size_t n, bool require_port) {
  size_t i = 0;
  if (n == 0)
    return false;
  if (s[0] == '[') {
    /* IP-literal: hex digits, ':' and '.', or an IPvFuture of unreserved,
     * sub-delims and ':' (RFC 3986 §3.2.2). */
    i = 1;
    while (i < n && s[i] != ']') {
      unsigned char c = (unsigned char)s[i];
      if (!is_reg_name_char(c) && c != ':')
        return false;
      i++;
    }
    if (i == n || i == 1)
      return false;
    i++; /* ']' */
  } else {
    while (i < n && s[i] != ':') {
      if (!is_reg_name_char((unsigned char)s[i]))
        return false;
      i++;
    }
    if (i == 0)
      return false;
  }
  if (i == n)
    return !require_port;
  if (s[i] != ':')
    return false;
  i++;
  /* RFC 3986 §3.2.3 allows an empty port, but says producers should omit
   * the ':' then; nobody needs it and it is one more spelling to disagree
   * on, so we require 1 to 5 digits of at most 65535. */
  size_t digits = n - i;
  if (digits == 0 || digits > 5)
    return false;
  unsigned port = 0;
  for (; i < n; i++) {
    if (!ce__h1_is_digit((unsigned char)s[i]))
      return false;
    port = port * 10 + (unsigned)(s[i] - '0');
  }
  return port <= 65535;
}

static bool method_is(const ce_h1_head_t *h, const char *m) {
  size_t n = strlen(m);
  return h->method_len == n && memcmp(h->method, m, n) == 0;
}

/* Sorts the request-target into one of the four forms of RFC 9112 §3.2 and
 * refuses anything else. Methods are case-sensitive (RFC 9110 §9.1). */
static int classify_target(ce_h1_head_t *h, const char **why) {
  const char *t = h->target;
  size_t n = h->target_len;

  /* RFC 9112 §3.2.3: authority-form is only used for CONNECT, and
   * RFC 9110 §9.3.6 says CONNECT's target is only host and port. */
  if (method_is(h, "CONNECT")) {
    if (!host_port_ok(t, n, true))
      return fail(why, "CONNECT needs an authority-form target", CE_EPARSE);
    h->target_form = CE_H1_TARGET_AUTHORITY;
    h->authority = t;
    h->authority_len = n;
    return CE_OK;
  }
  /* RFC 9112 §3.2: no form of request-target has a fragment. */
  if (memchr(t, '#', n) != NULL)
    return fail(why, "fragment in request-target", CE_EPARSE);
  if (n == 1 && t[0] == '*') {
    /* RFC 9112 §3.2.4: asterisk-form is only used for OPTIONS. */
    if (!method_is(h, "OPTIONS"))
      return fail(why, "asterisk-form outside OPTIONS", CE_EPARSE);
    h->target_form = CE_H1_TARGET_ASTERISK;
    h->path = t;
    h->path_len = 1;
    return CE_OK;
  }
  if (t[0] == '/') {
    h->target_form = CE_H1_TARGET_ORIGIN;
    h->path = t;
    h->path_len = n;
    return CE_OK;
  }
  /* RFC 9112 §3.2.2: absolute-form. Only http and https URIs (RFC 9110
   * §4.2) make sense to this proxy; the scheme is case-insensitive
   * (RFC 3986 §3.1). */
  size_t skip = 0;
  if (n > 7 && ce__h1_ieq(t, 7, "http://"))
    skip = 7;
  else if (n > 8 && ce__h1_ieq(t, 8, "https://"))
    skip = 8;
  if (skip == 0)
    return fail(why, "malformed request-target", CE_EPARSE);
  size_t end = skip;
  while (end < n && t[end] != '/' && t[end] != '?')
    end++;
  /* RFC 9110 §4.2.4: a recipient SHOULD treat a userinfo in an http(s)
   * URI as an error; it mostly serves to disguise the real host. */
  if (memchr(t + skip, '@', end - skip) != NULL)
    return fail(why, "userinfo in request-target", CE_EPARSE);
  if (!host_port_ok(t + skip, end - skip, false))
    return fail(why, "malformed authority in request-target", CE_EPARSE);
  h->target_form = CE_H1_TARGET_ABSOLUTE;
  h->authority = t + skip;
  h->authority_len = end - skip;
  h->path = t + end;
  h->path_len = n - end;
  return CE_OK;
}

/* request-line = method SP request-target SP HTTP-version (RFC 9112 §3). */
static int parse_request_line(const char *s, size_t n, ce_h1_head_t *h,
                              const char **why) {
  /* RFC 9113 §3.4: the HTTP/2 connection preface starts with this line; a
   * client that sends it assumed prior knowledge of h2 on a port that
   * speaks HTTP/1.1 here, which deserves a clearer message than
   * "asterisk-form outside OPTIONS". */
  static const char preface[] = "PRI * HTTP/2.0";
  if (n == sizeof(preface) - 1 && memcmp(s, preface, n) == 0)
    return fail(why, "http/2 preface on an http/1.1 connection", CE_EPARSE);

  size_t i = 0;
  while (i < n && ce__h1_is_tchar((unsigned char)s[i]))
    i++;
  if (i == 0 || i == n || s[i] != ' ')
    return fail(why, "malformed method", CE_EPARSE);
  if (i > CE_H1_MAX_METHOD_BYTES)
    return fail(why, "method too long", CE_EPARSE);
  h->method = s;
  h->method_len = i;
  i++;

  /* RFC 9112 §3 asks for exactly one SP between the parts (§3 allows
   * recipients to split on other whitespace, which is how a target ending
   * in "\t" or " " sneaks past one reader and not another; we do not). The
   * target itself is URI text (RFC 3986 §2): visible ASCII only. Raw
   * non-ASCII bytes are refused too, since the policy matcher and the
   * upstream might decode them differently. */
  size_t t0 = i;
  while (i < n && s[i] != ' ') {
    unsigned char c = (unsigned char)s[i];
    if (c <= 0x20 || c >= 0x7f)
      return fail(why, "invalid byte in request-target", CE_EPARSE);
    i++;
  }
  if (i == t0 || i == n)
    return fail(why, "malformed request line", CE_EPARSE);
  h->target = s + t0;
  h->target_len = i - t0;
  i++;
  int rc = parse_version(s + i, n - i, &h->version_minor, why);
  if (rc != CE_OK)
    return rc;
  return classify_target(h, why);
}

/* status-line = HTTP-version SP status-code SP [ reason-phrase ]
 * (RFC 9112 §4). The SP after the code is required even with no reason:
 * §4 says a server MUST send it and grants recipients no leniency. */
static int parse_status_line(const char *s, size_t n, ce_h1_head_t *h,
                             const char **why) {
  if (n < 8 || memcmp(s, "HTTP/", 5) != 0)
    return fail(why, "malformed status line", CE_EPARSE);
  size_t vlen = 0;
  while (vlen < n && s[vlen] != ' ')
    vlen++;
  int rc = parse_version(s, vlen, &h->version_minor, why);
  if (rc != CE_OK)
    return rc;
  if (n < 13 || s[8] != ' ' || s[12] != ' ')
    return fail(why, "malformed status line", CE_EPARSE);
  int status = 0;
  for (size_t i = 9; i < 12; i++) {
    if (!ce__h1_is_digit((unsigned char)s[i]))
      return fail(why, "malformed status code", CE_EPARSE);
    status = status * 10 + (s[i] - '0');
  }
  /* RFC 9110 §15 calls codes outside 100..599 invalid but asks a client to
   * treat them as 5xx rather than fail; we pass 100..999 through and only
   * refuse what cannot be a status code at all. */
  if (status < 100)
    return fail(why, "malformed status code", CE_EPARSE);
  /* reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ) */
  for (size_t i = 13; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!ce__h1_is_field_vchar(c) && !ce__h1_is_ows(c))
      return fail(why, "control byte in reason phrase", CE_EPARSE);
  }
  h->status = status;
  h->reason = s + 13;
  h->reason_len = n - 13;
  return CE_OK;
}

/* ------------------------------------------------------------------------
 * Fields
 * ------------------------------------------------------------------------ */

/* A name that becomes a framing field when '_' is read as '-'. Some
 * servers (CGI gateways among them) map both to the same variable, so
 * "Content_Length: 5", which we would forward as an unknown field, could
 * frame the body upstream. This goes beyond the RFCs, which know nothing
 * of the mapping; nginx drops such names for the same reason. */
static bool framing_lookalike(const char *name, size_t n) {
  static const char *const framing[] = {"content-length", "transfer-encoding"};
  if (memchr(name, '_', n) == NULL)
    return false;
  for (size_t k = 0; k < sizeof(framing) / sizeof(framing[0]); k++) {
    const char *f = framing[k];
    if (strlen(f) != n)
      continue;
    size_t i = 0;
    while (i < n) {
      unsigned char c = ce__h1_lower((unsigned char)name[i]);
      if (c == '_')
        c = '-';
      if (c != (unsigned char)f[i])
        break;
      i++;
    }
    if (i == n)
      return true;
  }
  return false;
}

/* Content-Length = 1*DIGIT (RFC 9110 §8.6). */
static int note_content_length(facts_t *f, const char *v, size_t n, const char **why) {
  /* RFC 9110 §8.6 lets a recipient either reject or merge repeated equal
   * values ("5, 5" or two fields); merging is how two readers come to
   * disagree, so any repetition is refused. */
  if (f->cl_seen)
    return fail(why, "duplicate content-length", CE_EPARSE);
  if (n == 0)
    return fail(why, "invalid content-length", CE_EPARSE);
  uint64_t value = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)v[i];
    if (!ce__h1_is_digit(c))
      return fail(why, "invalid content-length", CE_EPARSE);
    uint64_t d = (uint64_t)(c - '0');
    /* Leading zeros are valid 1*DIGIT and cost nothing here. */
    if (value > (MAX_BODY_SIZE - d) / 10)
      return fail(why, "content-length too large", CE_EPARSE);
    value = value * 10 + d;
  }
  f->cl_seen = true;
  f->cl = value;
  return CE_OK;
}

/* Transfer-Encoding = #transfer-coding (RFC 9112 §6.1). The codings of
 * every TE field line form one list (RFC 9110 §5.3). */
static int note_transfer_encoding(facts_t *f, const char *v, size_t n,
                                  const char **why) {
  size_t pos = 0;
  const char *el;
  size_t el_len;
  f->te_seen = true;
  while (ce__h1_list_next(v, n, &pos, &el, &el_len)) {
    size_t name_len = 0;
    while (name_len < el_len && ce__h1_is_tchar((unsigned char)el[name_len]))
      name_len++;
    if (name_len == 0)
      return fail(why, "malformed transfer-encoding", CE_EPARSE);
    bool chunked = ce__h1_ieq(el, name_len, "chunked");
    /* chunked has no parameters (RFC 9112 §7.1); "chunked;x=1" is one more
     * spelling for a reader to get wrong. */
    if (chunked && name_len != el_len)
      return fail(why, "parameters on chunked", CE_EPARSE);
    f->te_codings++;
    if (chunked)
      f->te_chunked++;
    f->te_last_chunked = chunked;
  }
  return CE_OK;
}

/* Connection = #connection-option, connection-option = token
 * (RFC 9110 §7.6.1). */
static int note_connection(facts_t *f, const char *v, size_t n, const char **why) {
  size_t pos = 0;
  const char *el;
  size_t el_len;
  while (ce__h1_list_next(v, n, &pos, &el, &el_len)) {
    if (!ce__h1_is_token(el, el_len))
      return fail(why, "malformed connection", CE_EPARSE);
    /* RFC 9110 §7.6.1: a connection option names a field meant for this
     * hop only, which an intermediary removes. Content-Length frames the
     * message for every hop; removing it on request would leave the next
     * hop reading the body as the next message. */
    if (ce__h1_ieq(el, el_len, "content-length"))
      return fail(why, "connection names content-length", CE_EPARSE);
    if (ce__h1_ieq(el, el_len, "close"))
      f->conn_close = true;
    else if (ce__h1_ieq(el, el_len, "keep-alive"))
      f->conn_keep_alive = true;
    else if (ce__h1_ieq(el, el_len, "upgrade"))
      f->conn_upgrade = true;
  }
  return CE_OK;
}

/* Upgrade = #protocol, protocol = protocol-name ["/" protocol-version],
 * both tokens (RFC 9110 §7.8). */
static int note_upgrade(facts_t *f, const char *v, size_t n, const char **why) {
  size_t pos = 0;
  const char *el;
  size_t el_len;
  while (ce__h1_list_next(v, n, &pos, &el, &el_len)) {
    const char *slash = memchr(el, '/', el_len);
    size_t name_len = slash != NULL ? (size_t)(slash - el) : el_len;
    if (!ce__h1_is_token(el, name_len) ||
        (slash != NULL && !ce__h1_is_token(slash + 1, el_len - name_len - 1)))
      return fail(why, "malformed upgrade", CE_EPARSE);
    f->upgrade_protocols++;
    if (ce__h1_ieq(el, name_len, "websocket"))
      f->upgrade_websocket = true;
  }
  return CE_OK;
}

/* Expect = #expectation (RFC 9110 §10.1.1). Only 100-continue is defined,
 * without parameters. §10.1.1 says a server MAY answer any other
 * expectation with 417; we refuse the request as malformed instead (400),
 * because the proxy cannot know whether the upstream would honour an
 * expectation it does not understand itself. */
static int note_expect(facts_t *f, const char *v, size_t n, const char **why) {
  size_t pos = 0;
  const char *el;
  size_t el_len;
  while (ce__h1_list_next(v, n, &pos, &el, &el_len)) {
    if (!ce__h1_ieq(el, el_len, "100-continue"))
      return fail(why, "unsupported expectation", CE_EPARSE);
    f->expect_continue = true;
  }
  return CE_OK;
}

static int note_field(facts_t *f, const ce_h1_field_t *fld, const char **why) {
  const char *name = fld->name;
  size_t nl = fld->name_len;
  const char *v = fld->value;
  size_t vl = fld->value_len;

  if (ce__h1_ieq(name, nl, "content-length"))
    return note_content_length(f, v, vl, why);
  if (ce__h1_ieq(name, nl, "transfer-encoding"))
    return note_transfer_encoding(f, v, vl, why);
  if (ce__h1_ieq(name, nl, "connection"))
    return note_connection(f, v, vl, why);
  if (ce__h1_ieq(name, nl, "upgrade"))
    return note_upgrade(f, v, vl, why);
  if (!f->is_response && ce__h1_ieq(name, nl, "expect"))
    return note_expect(f, v, vl, why);
  if (!f->is_response && ce__h1_ieq(name, nl, "host")) {
    /* RFC 9112 §3.2: more than one Host field line is a 400. */
    if (++f->host_count > 1)
      return fail(why, "duplicate host", CE_EPARSE);
    /* RFC 9112 §3.2: so is an invalid Host value. Empty is valid only for
     * URIs without an authority, which http(s) URIs never are
     * (RFC 9110 §4.2.1, §7.2). */
    if (!host_port_ok(v, vl, false))
      return fail(why, "invalid host", CE_EPARSE);
    f->host = v;
    f->host_len = vl;
    return CE_OK;
  }
  if (framing_lookalike(name, nl))
    return fail(why, "underscore in a framing field name", CE_EPARSE);
  return CE_OK;
}

/*
 * field-line = field-name ":" OWS field-value OWS (RFC 9112 §5), on a line
 * s[0..n) without its CRLF. first says whether this is the line right
 * after the start line.
 */
static int parse_field_line(const char *s, size_t n, bool first, ce_h1_field_t *out,
                            const char **why) {
  if (ce__h1_is_ows((unsigned char)s[0])) {
    /* RFC 9112 §2.2: whitespace before the first field line must be
     * refused or the line ignored; §5.2: a server must refuse obs-fold or
     * replace it by SP, and a proxy may do so. Either way two readers can
     * disagree, so both are refused. */
    return fail(why, first ? "whitespace after the start line" : "obs-fold", CE_EPARSE);
  }
  size_t i = 0;
  while (i < n && ce__h1_is_tchar((unsigned char)s[i]))
    i++;
  if (i == n)
    return fail(why, "field without a colon", CE_EPARSE);
  if (s[i] != ':') {
    /* RFC 9112 §5.1: whitespace between name and colon MUST be refused
     * with 400 ("Transfer-Encoding : chunked" is a classic smuggling
     * probe). */
    if (ce__h1_is_ows((unsigned char)s[i]))
      return fail(why, "whitespace before colon", CE_EPARSE);
    return fail(why, "invalid byte in field name", CE_EPARSE);
  }
  if (i == 0)
    return fail(why, "empty field name", CE_EPARSE);
  size_t v = i + 1;
  size_t end = n;
  while (v < end && ce__h1_is_ows((unsigned char)s[v]))
    v++;
  while (end > v && ce__h1_is_ows((unsigned char)s[end - 1]))
    end--;
  /* field-value = *field-content: VCHAR, obs-text, SP and HTAB
   * (RFC 9110 §5.5). §5.5 requires refusing or replacing CR, LF and NUL;
   * we refuse every other control byte as well, since the proxy forwards
   * values and must not pass on what an upstream might split on. */
  for (size_t k = v; k < end; k++) {
    unsigned char c = (unsigned char)s[k];
    if (!ce__h1_is_field_vchar(c) && !ce__h1_is_ows(c))
      return fail(why, c == 0 ? "NUL in field value" : "control byte in field value",
                  CE_EPARSE);
  }
  out->name = s;
  out->name_len = i;
  out->value = s + v;
  out->value_len = end - v;
  return CE_OK;
}

/* ------------------------------------------------------------------------
 * Framing and connection semantics
 * ------------------------------------------------------------------------ */

static void connection_flags(ce_h1_head_t *h, const facts_t *f) {
  /* RFC 9112 §9.3: "close" ends the connection in any version; HTTP/1.1
   * persists by default, HTTP/1.0 only with "keep-alive" (§C.2.2). */
  if (f->conn_close)
    h->keep_alive = false;
  else if (h->version_minor == 1)
    h->keep_alive = true;
  else
    h->keep_alive = f->conn_keep_alive;
  /* RFC 9110 §7.8: Upgrade needs the "upgrade" connection option, and a
   * server MUST ignore Upgrade in an HTTP/1.0 request. */
  h->upgrade = f->conn_upgrade && f->upgrade_protocols > 0 &&
               (h->is_response || h->version_minor == 1);
  h->upgrade_websocket = h->upgrade && f->upgrade_websocket;
}

/* RFC 9112 §6.1 and §6.3 for requests. */
static int request_framing(ce_h1_head_t *h, const facts_t *f, const char **why) {
  if (f->te_seen) {
    /* §6.1: TE in an HTTP/1.0 message means faulty framing. */
    if (h->version_minor == 0)
      return fail(why, "transfer-encoding on http/1.0", CE_EPARSE);
    /* §6.1 lets a server reject CL with TE, §6.3 item 3 calls it a likely
     * smuggling attempt to be handled as an error. */
    if (f->cl_seen)
      return fail(why, "content-length with transfer-encoding", CE_EPARSE);
    /* §6.3 item 4 only requires chunked to be final. We accept exactly one
     * coding, chunked: the proxy never needs "gzip, chunked" in a request,
     * no mainstream client sends it, and every extra coding or repeated
     * chunked is a way for two parsers to disagree (TE.TE smuggling). */
    if (f->te_codings != 1 || f->te_chunked != 1)
      return fail(why, "transfer-encoding other than chunked", CE_EPARSE);
  }
  /* RFC 9110 §9.3.6: a CONNECT request has no content; with a body,
   * tunnel bytes and body bytes could be confused. "Content-Length: 0" is
   * harmless and some clients send it. */
  if (method_is(h, "CONNECT") && (f->te_seen || (f->cl_seen && f->cl != 0)))
    return fail(why, "body on CONNECT", CE_EPARSE);
  h->content_length = f->cl_seen ? f->cl : 0;
  if (method_is(h, "CONNECT"))
    h->framing = CE_H1_BODY_NONE; /* what follows the head is the tunnel */
  else if (f->te_seen)
    h->framing = CE_H1_BODY_CHUNKED;
  else if (f->cl_seen)
    h->framing = CE_H1_BODY_LENGTH;
  else
    h->framing = CE_H1_BODY_NONE; /* §6.3 item 7 */
  return CE_OK;
}

static bool host_equal(const char *a, const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (ce__h1_lower((unsigned char)a[i]) != ce__h1_lower((unsigned char)b[i]))
      return false;
  }
  return true;
}

static int request_semantics(ce_h1_head_t *h, const facts_t *f, const char **why) {
  int rc = request_framing(h, f, why);
  if (rc != CE_OK)
    return rc;
  /* RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400. */
  if (f->host_count == 0 && h->version_minor == 1)
    return fail(why, "missing host", CE_EPARSE);
  /* RFC 9112 §3.2.2 makes the target's authority win over Host. We refuse
   * a disagreement instead of picking one: the policy decision and the
   * upstream must see the same host. */
  if (f->host != NULL && h->target_form == CE_H1_TARGET_ABSOLUTE &&
      (f->host_len != h->authority_len || !host_equal(f->host, h->authority, f->host_len)))
    return fail(why, "host differs from the request-target", CE_EPARSE);
  h->host = f->host;
  h->host_len = f->host_len;
  connection_flags(h, f);
  /* RFC 9110 §10.1.1: a server MUST ignore 100-continue in HTTP/1.0. */
  h->expect_continue = f->expect_continue && h->version_minor == 1;
  return CE_OK;
}

static int response_semantics(ce_h1_head_t *h, const facts_t *f, const char *req_method,
                              size_t req_method_len, const char **why) {
  int status = h->status;
  /* RFC 9112 §6.1, as for requests. */
  if (f->te_seen && h->version_minor == 0)
    return fail(why, "transfer-encoding on http/1.0", CE_EPARSE);
  /* RFC 9112 §6.3 item 3 lets a client go by TE alone; both at once is
   * how response splitting starts, so we refuse it in every response,
   * even those whose framing ignores both. */
  if (f->te_seen && f->cl_seen)
    return fail(why, "content-length with transfer-encoding", CE_EPARSE);
  /* RFC 9112 §6.1: chunked MUST NOT be applied twice. */
  if (f->te_chunked > 1)
    return fail(why, "chunked applied twice", CE_EPARSE);
  connection_flags(h, f);
  /* RFC 9110 §15.2.2: a 101 MUST carry Upgrade (and, by §7.8, the
   * "upgrade" connection option); without them we would not know what
   * the connection switched to. */
  if (status == 101 && !h->upgrade)
    return fail(why, "101 without upgrade", CE_EPARSE);

  bool head_req = req_method != NULL && req_method_len == 4 &&
                  memcmp(req_method, "HEAD", 4) == 0;
  bool connect_req = req_method != NULL && req_method_len == 7 &&
                     memcmp(req_method, "CONNECT", 7) == 0;
  h->content_length = f->cl_seen ? f->cl : 0;
  /* RFC 9112 §6.3 items 1 and 2, in order. A 101 is a 1xx: after its
   * head the connection carries the upgraded protocol. */
  if (head_req || (status >= 100 && status < 200) || status == 204 || status == 304 ||
      (connect_req && status >= 200 && status < 300))
    h->framing = CE_H1_BODY_NONE;
  else if (f->te_seen)
    /* Item 4: chunked last means chunked; any other TE means the body
     * runs until the server closes. */
    h->framing = f->te_last_chunked ? CE_H1_BODY_CHUNKED : CE_H1_BODY_CLOSE;
  else if (f->cl_seen)
    h->framing = CE_H1_BODY_LENGTH; /* item 6 */
  else
    h->framing = CE_H1_BODY_CLOSE; /* item 8 */
  if (h->framing == CE_H1_BODY_CLOSE)
    h->keep_alive = false;
  return CE_OK;
}

/* ------------------------------------------------------------------------
 * Heads
 * ------------------------------------------------------------------------ */

static int parse_head(const char *buf, size_t len, bool is_response,
                      const char *req_method, size_t req_method_len,
                      ce_h1_head_t *out, const char **why) {
  size_t line0 = 0;
  size_t head_len = 0;
  if (len == 0)
    return CE_EAGAIN; /* buf may be NULL then, which memchr() must not see */
  int rc = scan_head(buf, len, is_response, &line0, &head_len, why);
  if (rc == CE_EAGAIN) {
    rc = early_check(buf + line0, len - line0, is_response, why);
    if (rc != CE_OK)
      return rc;
    /* The empty line is not within the first CE_H1_MAX_HEAD_BYTES, so the
     * head is too big, whatever follows. */
    if (len >= CE_H1_MAX_HEAD_BYTES)
      return fail(why, "head too large", CE_ETOOBIG);
    return CE_EAGAIN;
  }
  if (rc != CE_OK)
    return rc;

  /* Filled on the stack and copied out only on success, so that *out is
   * untouched on every failure. */
  ce_h1_head_t h;
  memset(&h, 0, sizeof(h));
  h.is_response = is_response;
  facts_t f;
  memset(&f, 0, sizeof(f));
  f.is_response = is_response;

  /* Every line in [line0, head_len - 2) ends with CRLF and holds no other
   * CR or LF (scan_head checked it), so the next CR ends the line. */
  size_t end = head_len - 2;
  size_t pos = line0;
  const char *cr = memchr(buf + pos, '\r', end - pos);
  size_t n = (size_t)(cr - (buf + pos));
  rc = is_response ? parse_status_line(buf + pos, n, &h, why)
                   : parse_request_line(buf + pos, n, &h, why);
  if (rc != CE_OK)
    return rc;
  pos += n + 2;
  while (pos < end) {
    cr = memchr(buf + pos, '\r', end - pos);
    n = (size_t)(cr - (buf + pos));
    /* scan_head() already refused more lines than this; the check stays
     * because it guards the array. */
    if (h.field_count == CE_H1_MAX_FIELDS)
      return fail(why, "too many fields", CE_ETOOBIG);
    ce_h1_field_t *fld = &h.fields[h.field_count];
    rc = parse_field_line(buf + pos, n, h.field_count == 0, fld, why);
    if (rc != CE_OK)
      return rc;
    rc = note_field(&f, fld, why);
    if (rc != CE_OK)
      return rc;
    h.field_count++;
    pos += n + 2;
  }
  rc = is_response ? response_semantics(&h, &f, req_method, req_method_len, why)
                   : request_semantics(&h, &f, why);
  if (rc != CE_OK)
    return rc;
  h.head_len = head_len;
  *out = h;
  return CE_OK;
}

int ce_h1_parse_request(const char *buf, size_t len, ce_h1_head_t *out,
                        const char **why) {
  if (buf == NULL && len > 0)
    return fail(why, "no buffer", CE_EINVAL);
  return parse_head(buf, len, false, NULL, 0, out, why);
}

int ce_h1_parse_response(const char *buf, size_t len, const char *request_method,
                         size_t request_method_len, ce_h1_head_t *out,
                         const char **why) {
  if (buf == NULL && len > 0)
    return fail(why, "no buffer", CE_EINVAL);
  return parse_head(buf, len, true, request_method, request_method_len, out, why);
}

int ce_h1_find(const ce_h1_head_t *head, const char *name, int start) {
  size_t n = strlen(name);
  size_t i = start > 0 ? (size_t)start : 0;
  for (; i < head->field_count; i++) {
    const ce_h1_field_t *fld = &head->fields[i];
    if (fld->name_len != n)
      continue;
    size_t k = 0;
    while (k < n && ce__h1_lower((unsigned char)fld->name[k]) ==
                        ce__h1_lower((unsigned char)name[k]))
      k++;
    if (k == n)
      return (int)i;
  }
  return -1;
}

/* ------------------------------------------------------------------------
 * Bodies
 * ------------------------------------------------------------------------ */

/* Decoder states. The chunked ones follow RFC 9112 §7.1:
 *   chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
 *   chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )
 *   last-chunk = 1*("0") [ chunk-ext ] CRLF, then trailer-section CRLF */
enum {
  CH_SIZE = 0,         /* hex digits */
  CH_EXT_PRE_SEMI,     /* BWS before ';' */
  CH_EXT_NAME_PRE,     /* BWS after ';' */
  CH_EXT_NAME,         /* token */
  CH_EXT_POST_NAME,    /* BWS before '=' */
  CH_EXT_VAL_PRE,      /* BWS after '=' */
  CH_EXT_VAL_TOKEN,    /* token value */
  CH_EXT_VAL_QUOTED,   /* inside a quoted-string */
  CH_EXT_VAL_ESC,      /* after '\' in a quoted-string */
  CH_EXT_VAL_AFTER_QUOTE,
  CH_SIZE_LF,          /* CR seen at the end of the chunk-size line */
  CH_DATA,             /* remaining bytes of chunk data */
  CH_DATA_CR,          /* the CRLF after the data */
  CH_DATA_LF,
  CH_TRAILER_START,    /* start of a trailer line or of the final CRLF */
  CH_TRAILER_NAME,
  CH_TRAILER_VALUE,
  CH_TRAILER_LF,
  CH_END_LF,           /* CR of the final CRLF seen */
  BODY_DONE,
  BODY_FAILED
};

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* qdtext (RFC 9110 §5.6.4): HTAB, SP, and VCHAR or obs-text but '"' and
 * '\'. */
static bool is_qdtext(unsigned char c) {
  return c == '\t' || c == ' ' || (ce__h1_is_field_vchar(c) && c != '"' && c != '\\');
}

void ce_h1_body_init(ce_h1_body_t *body, ce_h1_framing_t framing,
                     uint64_t content_length) {
  memset(body, 0, sizeof(*body));
  body->framing = framing;
  body->remaining = framing == CE_H1_BODY_LENGTH ? content_length : 0;
  body->state = CH_SIZE;
}

void ce_h1_body_keep_trailers(ce_h1_body_t *body, char *buf) {
  body->keep = buf;
  body->kept = 0;
}

bool ce_h1_trailer_next(const char *buf, size_t len, size_t *pos, ce_h1_field_t *f) {
  while (*pos < len) {
    const char *line = buf + *pos;
    const char *nl = memchr(line, '\n', len - *pos);
    size_t ll = nl != NULL ? (size_t)(nl - line) + 1 : len - *pos;
    *pos += ll;
    size_t body = ll;
    while (body > 0 && (line[body - 1] == '\n' || line[body - 1] == '\r'))
      body--;
    const char *colon = memchr(line, ':', body);
    if (colon == NULL || colon == line)
      continue;
    size_t name_len = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vl = body - name_len - 1;
    while (vl > 0 && ce__h1_is_ows((unsigned char)v[0])) {
      v++;
      vl--;
    }
    while (vl > 0 && ce__h1_is_ows((unsigned char)v[vl - 1]))
      vl--;
    *f = (ce_h1_field_t){line, name_len, v, vl};
    return true;
  }
  return false;
}

/* One byte of a chunk-size line (CH_SIZE .. CH_EXT_VAL_AFTER_QUOTE). */
static int chunk_line_byte(ce_h1_body_t *b, unsigned char c, const char **why) {
  if (c == '\n')
    return fail(why, "bare LF", CE_EPARSE);
  if (b->state == CH_SIZE) {
    int d = hex_value(c);
    if (d >= 0) {
      /* line_len counts the digits while in CH_SIZE. */
      if (b->line_len >= MAX_CHUNK_SIZE_DIGITS)
        return fail(why, "chunk size too long", CE_EPARSE);
      if (b->remaining > (MAX_BODY_SIZE - (uint64_t)d) / 16)
        return fail(why, "chunk size too large", CE_EPARSE);
      b->remaining = b->remaining * 16 + (uint64_t)d;
      b->line_len++;
      return CE_OK;
    }
    /* "-5", "+5", " 5", "0x5" and an empty line all end up here. */
    if (b->line_len == 0)
      return fail(why, "malformed chunk size", CE_EPARSE);
  }
  if (c == '\r') {
    switch (b->state) {
    case CH_SIZE:
    case CH_EXT_NAME:
    case CH_EXT_VAL_TOKEN:
    case CH_EXT_VAL_AFTER_QUOTE:
      b->state = CH_SIZE_LF;
      return CE_OK;
    default:
      return fail(why, b->state == CH_SIZE ? "malformed chunk size"
                                           : "malformed chunk extension", CE_EPARSE);
    }
  }
  if (++b->line_len > CE_H1_MAX_CHUNK_LINE_BYTES)
    return fail(why, "chunk-size line too long", CE_ETOOBIG);

  bool ows = ce__h1_is_ows(c);
  bool tchar = ce__h1_is_tchar(c);
  int next = -1;
  switch (b->state) {
  case CH_SIZE:
    if (c == ';')
      next = CH_EXT_NAME_PRE;
    else if (ows)
      next = CH_EXT_PRE_SEMI;
    else
      return fail(why, "malformed chunk size", CE_EPARSE);
    break;
  case CH_EXT_PRE_SEMI:
    next = ows ? CH_EXT_PRE_SEMI : c == ';' ? CH_EXT_NAME_PRE : -1;
    break;
  case CH_EXT_NAME_PRE:
    next = ows ? CH_EXT_NAME_PRE : tchar ? CH_EXT_NAME : -1;
    break;
  case CH_EXT_NAME:
    next = tchar ? CH_EXT_NAME : ows ? CH_EXT_POST_NAME : c == '=' ? CH_EXT_VAL_PRE
         : c == ';' ? CH_EXT_NAME_PRE : -1;
    break;
  case CH_EXT_POST_NAME:
    next = ows ? CH_EXT_POST_NAME : c == '=' ? CH_EXT_VAL_PRE
         : c == ';' ? CH_EXT_NAME_PRE : -1;
    break;
  case CH_EXT_VAL_PRE:
    next = ows ? CH_EXT_VAL_PRE : c == '"' ? CH_EXT_VAL_QUOTED : tchar ? CH_EXT_VAL_TOKEN : -1;
    break;
  case CH_EXT_VAL_TOKEN:
    next = tchar ? CH_EXT_VAL_TOKEN : ows ? CH_EXT_PRE_SEMI : c == ';' ? CH_EXT_NAME_PRE : -1;
    break;
  case CH_EXT_VAL_QUOTED:
    next = c == '"' ? CH_EXT_VAL_AFTER_QUOTE : c == '\\' ? CH_EXT_VAL_ESC
         : is_qdtext(c) ? CH_EXT_VAL_QUOTED : -1;
    break;
  case CH_EXT_VAL_ESC:
    /* quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) */
    next = (ows || ce__h1_is_field_vchar(c)) ? CH_EXT_VAL_QUOTED : -1;
    break;
  case CH_EXT_VAL_AFTER_QUOTE:
    next = ows ? CH_EXT_PRE_SEMI : c == ';' ? CH_EXT_NAME_PRE : -1;
    break;
  default:
    break;
  }
  if (next < 0)
    return fail(why, "malformed chunk extension", CE_EPARSE);
  b->state = next;
  return CE_OK;
}

/* One byte of the trailer section, checked like a header field line
 * (RFC 9112 §7.1.2 refers to §5 for its fields). Returns 1 when the final
 * CRLF is complete. */
static int trailer_byte(ce_h1_body_t *b, unsigned char c, const char **why) {
  if (++b->trailer_bytes > CE_H1_MAX_TRAILER_BYTES)
    return fail(why, "trailers too large", CE_ETOOBIG);
  /* Every byte but the final CRLF's is a field line's; the count bounds
   * what is kept (a failure later makes it moot). */
  if (b->keep != NULL && b->state != CH_END_LF && !(b->state == CH_TRAILER_START && c == '\r'))
    b->keep[b->kept++] = (char)c;
  switch (b->state) {
  case CH_TRAILER_START:
    if (c == '\r') {
      b->state = CH_END_LF;
    } else if (c == '\n') {
      return fail(why, "bare LF", CE_EPARSE);
    } else if (ce__h1_is_ows(c)) {
      return fail(why, "obs-fold", CE_EPARSE);
    } else if (c == ':') {
      return fail(why, "empty field name", CE_EPARSE);
    } else if (ce__h1_is_tchar(c)) {
      b->state = CH_TRAILER_NAME;
    } else {
      return fail(why, "invalid byte in field name", CE_EPARSE);
    }
    return CE_OK;
  case CH_TRAILER_NAME:
    if (c == ':')
      b->state = CH_TRAILER_VALUE;
    else if (ce__h1_is_ows(c))
      return fail(why, "whitespace before colon", CE_EPARSE);
    else if (c == '\r' || c == '\n')
      return fail(why, "field without a colon", CE_EPARSE);
    else if (!ce__h1_is_tchar(c))
      return fail(why, "invalid byte in field name", CE_EPARSE);
    return CE_OK;
  case CH_TRAILER_VALUE:
    if (c == '\r')
      b->state = CH_TRAILER_LF;
    else if (c == '\n')
      return fail(why, "bare LF", CE_EPARSE);
    else if (c == 0)
      return fail(why, "NUL in field value", CE_EPARSE);
    else if (!ce__h1_is_field_vchar(c) && !ce__h1_is_ows(c))
      return fail(why, "control byte in field value", CE_EPARSE);
    return CE_OK;
  case CH_TRAILER_LF:
    if (c != '\n')
      return fail(why, "bare CR", CE_EPARSE);
    b->state = CH_TRAILER_START;
    return CE_OK;
  default: /* CH_END_LF */
    if (c != '\n')
      return fail(why, "bare CR", CE_EPARSE);
    b->state = BODY_DONE;
    return 1;
  }
}

static int chunked_next(ce_h1_body_t *b, const char *in, size_t len, size_t *consumed,
                        const char **data, size_t *data_len, const char **why) {
  size_t i = 0;
  while (i < len) {
    if (b->state == CH_DATA) {
      size_t n = b->remaining < len - i ? (size_t)b->remaining : len - i;
      *data = in + i;
      *data_len = n;
      b->remaining -= n;
      if (b->remaining == 0)
        b->state = CH_DATA_CR;
      *consumed = i + n;
      return 0;
    }
    unsigned char c = (unsigned char)in[i];
    int rc = CE_OK;
    switch (b->state) {
    case CH_SIZE_LF:
      if (c != '\n') {
        rc = fail(why, "bare CR", CE_EPARSE);
        break;
      }
      b->line_len = 0;
      /* A zero size is the last-chunk; the trailer section follows. */
      b->state = b->remaining == 0 ? CH_TRAILER_START : CH_DATA;
      break;
    case CH_DATA_CR:
      /* RFC 9112 §7.1: chunk-data is followed by CRLF. Reading past a
       * missing one is how a too-short size smuggles a request. */
      if (c == '\r')
        b->state = CH_DATA_LF;
      else
        rc = fail(why, c == '\n' ? "bare LF" : "missing CRLF after chunk data", CE_EPARSE);
      break;
    case CH_DATA_LF:
      if (c != '\n') {
        rc = fail(why, "missing CRLF after chunk data", CE_EPARSE);
        break;
      }
      b->state = CH_SIZE;
      b->remaining = 0;
      b->line_len = 0;
      break;
    case CH_TRAILER_START:
    case CH_TRAILER_NAME:
    case CH_TRAILER_VALUE:
    case CH_TRAILER_LF:
    case CH_END_LF:
      rc = trailer_byte(b, c, why);
      break;
    default:
      rc = chunk_line_byte(b, c, why);
      break;
    }
    i++;
    if (rc < 0) {
      b->state = BODY_FAILED;
      *consumed = i - 1;
      return rc;
    }
    if (rc == 1) {
      *consumed = i;
      return 1;
    }
  }
  *consumed = len;
  return 0;
}

int ce_h1_body_next(ce_h1_body_t *body, const char *in, size_t len,
                    size_t *consumed, const char **data, size_t *data_len,
                    const char **why) {
  *consumed = 0;
  *data = in;
  *data_len = 0;
  if (body->state == BODY_FAILED)
    return fail(why, "body decoder already failed", CE_EINVAL);
  if (body->state == BODY_DONE)
    return 1;
  switch (body->framing) {
  case CE_H1_BODY_NONE:
    body->state = BODY_DONE;
    return 1;
  case CE_H1_BODY_CLOSE:
    *data_len = len;
    *consumed = len;
    return 0;
  case CE_H1_BODY_LENGTH: {
    size_t n = body->remaining < len ? (size_t)body->remaining : len;
    body->remaining -= n;
    *data_len = n;
    *consumed = n;
    if (body->remaining > 0)
      return 0;
    body->state = BODY_DONE;
    return 1;
  }
  case CE_H1_BODY_CHUNKED:
    return chunked_next(body, in, len, consumed, data, data_len, why);
  default:
    body->state = BODY_FAILED;
    return fail(why, "unknown framing", CE_EINVAL);
  }
}
