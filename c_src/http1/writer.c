/*
 * HTTP/1.1 head and chunk serialisation (see writer.h).
 *
 * Every public function validates its input with the byte classes the
 * parser uses (http1/chars.h), so that whatever the proxy writes, its own
 * parser would accept: a value from an untrusted place (an SNI name, a
 * policy message) cannot end a line early and add fields.
 */
#include "http1/writer.h"

#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "http1/chars.h"

/* The largest chunk size strict readers accept (RFC 9112 §7.1 sets no
 * bound; our own parser stops at 2^63-1 so that sizes fit an int64). */
#define MAX_CHUNK_SIZE UINT64_C(0x7fffffffffffffff)

void ce_h1_writer_init(ce_h1_writer_t *w, char *buf, size_t cap) {
  w->buf = buf;
  w->cap = cap;
  w->len = 0;
  w->err = 0;
}

/* Appends n bytes or records CE_ETOOBIG. Callers that write several pieces
 * for one public call remember w->len and undo through fail_at(). */
static void put(ce_h1_writer_t *w, const void *s, size_t n) {
  if (w->err != 0)
    return;
  if (n > w->cap - w->len) {
    w->err = CE_ETOOBIG;
    return;
  }
  if (n > 0)
    memcpy(w->buf + w->len, s, n);
  w->len += n;
}

static void put_str(ce_h1_writer_t *w, const char *s) { put(w, s, strlen(s)); }

/* Ends a public call: on failure, takes back what the call wrote so that a
 * failed call leaves no partial line behind. */
static int finish(ce_h1_writer_t *w, size_t start) {
  if (w->err != 0)
    w->len = start;
  return w->err;
}

static int invalid(ce_h1_writer_t *w) {
  if (w->err == 0)
    w->err = CE_EINVAL;
  return w->err;
}

static bool value_ok(const char *v, size_t n) {
  if (n > 0 && (ce__h1_is_ows((unsigned char)v[0]) || ce__h1_is_ows((unsigned char)v[n - 1])))
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)v[i];
    if (!ce__h1_is_field_vchar(c) && !ce__h1_is_ows(c))
      return false;
  }
  return true;
}

/* Callers pass n > 0. */
static bool target_ok(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)t[i];
    if (c <= 0x20 || c >= 0x7f)
      return false;
  }
  return true;
}

/* The request line with the target in up to two pieces (a "/" the
 * absolute-form lacked, then the path), checked as a whole. */
static int request_line2(ce_h1_writer_t *w, const char *method, size_t method_len,
                         const char *t1, size_t n1, const char *t2, size_t n2) {
  if (w->err != 0)
    return w->err;
  if (!ce__h1_is_token(method, method_len) || n1 + n2 == 0 ||
      (n1 > 0 && !target_ok(t1, n1)) || (n2 > 0 && !target_ok(t2, n2)))
    return invalid(w);
  size_t start = w->len;
  put(w, method, method_len);
  put(w, " ", 1);
  put(w, t1, n1);
  put(w, t2, n2);
  put_str(w, " HTTP/1.1\r\n");
  return finish(w, start);
}

int ce_h1_write_request_line(ce_h1_writer_t *w, const char *method, size_t method_len,
                             const char *target, size_t target_len) {
  return request_line2(w, method, method_len, target, target_len, NULL, 0);
}

int ce_h1_write_status_line(ce_h1_writer_t *w, int status, const char *reason,
                            size_t reason_len) {
  if (w->err != 0)
    return w->err;
  if (status < 100 || status > 999 || (reason == NULL && reason_len > 0))
    return invalid(w);
  /* reason-phrase may hold inner and outer whitespace (RFC 9112 §4). */
  for (size_t i = 0; i < reason_len; i++) {
    unsigned char c = (unsigned char)reason[i];
    if (!ce__h1_is_field_vchar(c) && !ce__h1_is_ows(c))
      return invalid(w);
  }
  char code[4] = {(char)('0' + status / 100), (char)('0' + status / 10 % 10),
                  (char)('0' + status % 10), ' '};
  size_t start = w->len;
  put_str(w, "HTTP/1.1 ");
  put(w, code, sizeof(code)); /* the SP is sent even with no reason, §4 */
  put(w, reason, reason_len);
  put_str(w, "\r\n");
  return finish(w, start);
}

int ce_h1_write_field(ce_h1_writer_t *w, const char *name, size_t name_len,
                      const char *value, size_t value_len) {
  if (w->err != 0)
    return w->err;
  if (!ce__h1_is_token(name, name_len) || (value == NULL && value_len > 0) ||
      !value_ok(value, value_len))
    return invalid(w);
  size_t start = w->len;
  put(w, name, name_len);
  put_str(w, ": ");
  put(w, value, value_len);
  put_str(w, "\r\n");
  return finish(w, start);
}

/* Case-insensitive order of field names (shorter first on a tie). */
static int name_cmp(const char *a, size_t al, const char *b, size_t bl) {
  int c = strncasecmp(a, b, al < bl ? al : bl);
  if (c != 0)
    return c;
  return al < bl ? -1 : al > bl ? 1 : 0;
}

/* Sorts idx[0..n) by field name: a merge sort, O(n log n) comparisons. */
static void sort_fields(const ce_h1_field_t *fields, size_t *idx, size_t *tmp, size_t n) {
  for (size_t width = 1; width < n; width *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * width) {
      size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      size_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi) {
        const ce_h1_field_t *fa = &fields[idx[a]], *fb = &fields[idx[b]];
        tmp[k++] = name_cmp(fa->name, fa->name_len, fb->name, fb->name_len) <= 0 ? idx[a++] : idx[b++];
      }
      while (a < mid)
        tmp[k++] = idx[a++];
      while (b < hi)
        tmp[k++] = idx[b++];
    }
    memcpy(idx, tmp, n * sizeof(*idx));
  }
}

/*
 * named[i] = does a Connection field of h name field i? The Connection
 * values are parsed once per head: each token is looked up by binary search
 * among the sorted field names, and the fields of one name are marked
 * together once, so the work is O(fields log fields + Connection bytes ×
 * log fields), not fields × Connection bytes (the h2 review, #11).
 */
void ce_h1_connection_named(const ce_h1_head_t *h, bool *named) {
  ce_h1_fields_connection_named(h->fields, h->field_count, named);
}

static bool is_connection(const ce_h1_field_t *f) {
  return ce__h1_ieq(f->name, f->name_len, "connection");
}

void ce_h1_fields_connection_named(const ce_h1_field_t *fields, size_t count, bool *named) {
  size_t n = count < CE_H1_MAX_FIELDS ? count : CE_H1_MAX_FIELDS;
  size_t idx[CE_H1_MAX_FIELDS], tmp[CE_H1_MAX_FIELDS];
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    named[i] = false;
    idx[i] = i;
    any = any || is_connection(&fields[i]);
  }
  if (!any)
    return;
  sort_fields(fields, idx, tmp, n);
  for (size_t i = 0; i < n; i++) {
    if (!is_connection(&fields[i]))
      continue;
    const char *v = fields[i].value;
    size_t vl = fields[i].value_len, p = 0;
    while (p < vl) {
      while (p < vl && (v[p] == ' ' || v[p] == '\t' || v[p] == ','))
        p++;
      size_t start = p;
      while (p < vl && v[p] != ',' && v[p] != ' ' && v[p] != '\t')
        p++;
      if (p == start)
        continue;
      const char *tok = v + start;
      size_t tl = p - start, lo = 0, hi = n;
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ce_h1_field_t *f = &fields[idx[mid]];
        int c = name_cmp(tok, tl, f->name, f->name_len);
        if (c == 0) {
          if (!named[idx[mid]]) {
            for (size_t j = mid + 1; j-- > 0 && name_cmp(tok, tl, fields[idx[j]].name, fields[idx[j]].name_len) == 0;)
              named[idx[j]] = true;
            for (size_t j = mid + 1; j < n && name_cmp(tok, tl, fields[idx[j]].name, fields[idx[j]].name_len) == 0; j++)
              named[idx[j]] = true;
          }
          break;
        }
        if (c < 0)
          hi = mid;
        else
          lo = mid + 1;
      }
    }
  }
}

static bool is_hop_by_hop(const ce_h1_head_t *head, const ce_h1_field_t *f, bool named, unsigned flags) {
  static const char *const always[] = {"connection", "keep-alive", "proxy-connection",
                                       "te", "transfer-encoding", "trailer"};
  const char *n = f->name;
  size_t nl = f->name_len;
  for (size_t i = 0; i < sizeof(always) / sizeof(always[0]); i++) {
    if (ce__h1_ieq(n, nl, always[i]))
      return true;
  }
  if (ce__h1_ieq(n, nl, "upgrade"))
    return (flags & CE_H1_W_UPGRADE) == 0;
  if (!head->is_response &&
      (ce__h1_ieq(n, nl, "host") || ce__h1_ieq(n, nl, "proxy-authorization")))
    return true;
  /* Content-Length goes only when the proxy frames the body itself; a
   * Connection option naming it is not obeyed (the parser refuses one),
   * since the next hop would then take the body for the next message. */
  if (ce__h1_ieq(n, nl, "content-length"))
    return (flags & CE_H1_W_CHUNKED) != 0;
  return named;
}

/*
 * The Transfer-Encoding of the forwarded message. The parsed one is never
 * copied as a field: the proxy decides the framing of what it sends. When
 * the body is chunked it says so. A response's other codings (a
 * non-compliant server's "gzip, chunked", or "gzip" read until close)
 * describe bytes the proxy passes on unchanged, so they are kept, in
 * order, before the chunked the proxy applies; for a body read until close
 * every coding is kept, and chunking on top of one that already holds
 * chunked would apply it twice (RFC 9112 §6.1), which is CE_EINVAL.
 */
static void put_transfer_encoding(ce_h1_writer_t *w, const ce_h1_head_t *head,
                                  bool chunked) {
  bool keep = head->is_response &&
              (head->framing == CE_H1_BODY_CHUNKED || head->framing == CE_H1_BODY_CLOSE);
  size_t codings = 0;
  for (int i = keep ? ce_h1_find(head, "transfer-encoding", 0) : -1; i >= 0 && w->err == 0;
       i = ce_h1_find(head, "transfer-encoding", i + 1)) {
    const ce_h1_field_t *f = &head->fields[i];
    size_t pos = 0;
    const char *el;
    size_t el_len;
    while (ce__h1_list_next(f->value, f->value_len, &pos, &el, &el_len)) {
      bool is_chunked = ce__h1_ieq(el, el_len, "chunked");
      /* With framing CHUNKED the parser saw chunked once, last: the
       * decoder removed it and the proxy applies its own. */
      if (is_chunked && head->framing == CE_H1_BODY_CHUNKED)
        continue;
      if ((is_chunked && chunked) || !value_ok(el, el_len)) {
        invalid(w);
        return;
      }
      put_str(w, codings++ == 0 ? "Transfer-Encoding: " : ", ");
      put(w, el, el_len);
    }
  }
  if (chunked)
    put_str(w, codings++ == 0 ? "Transfer-Encoding: chunked" : ", chunked");
  if (codings > 0)
    put_str(w, "\r\n");
}

int ce_h1_write_forwarded_fields(ce_h1_writer_t *w, const ce_h1_head_t *head,
                                 unsigned flags) {
  if (w->err != 0)
    return w->err;
  if (head->field_count > CE_H1_MAX_FIELDS)
    return invalid(w);
  /* The parsed Transfer-Encoding is not copied, so a chunked body must be
   * announced again, or the next hop would read it as the next message. */
  if ((flags & CE_H1_W_DECHUNK) != 0 &&
      ((flags & CE_H1_W_CHUNKED) != 0 || !head->is_response || head->framing != CE_H1_BODY_CHUNKED))
    return invalid(w);
  if (head->framing == CE_H1_BODY_CHUNKED && (flags & CE_H1_W_DECHUNK) == 0)
    flags |= CE_H1_W_CHUNKED;
  /* RFC 9110 §7.6.1: the fields a Connection option names are for this
   * hop only; the Connection values are parsed once for the whole head. */
  bool named[CE_H1_MAX_FIELDS];
  ce_h1_connection_named(head, named);
  size_t start = w->len;
  for (size_t i = 0; i < head->field_count && w->err == 0; i++) {
    const ce_h1_field_t *f = &head->fields[i];
    if (!is_hop_by_hop(head, f, named[i], flags))
      ce_h1_write_field(w, f->name, f->name_len, f->value, f->value_len);
  }
  put_transfer_encoding(w, head, (flags & CE_H1_W_CHUNKED) != 0);
  if ((flags & (CE_H1_W_UPGRADE | CE_H1_W_CLOSE)) == (CE_H1_W_UPGRADE | CE_H1_W_CLOSE))
    put_str(w, "Connection: upgrade, close\r\n");
  else if ((flags & CE_H1_W_UPGRADE) != 0)
    put_str(w, "Connection: upgrade\r\n");
  else if ((flags & CE_H1_W_CLOSE) != 0)
    put_str(w, "Connection: close\r\n");
  return finish(w, start);
}

int ce_h1_write_head_end(ce_h1_writer_t *w) {
  size_t start = w->len;
  put_str(w, "\r\n");
  return finish(w, start);
}

int ce_h1_write_request_head(ce_h1_writer_t *w, const ce_h1_head_t *req,
                             const char *host, size_t host_len, unsigned flags) {
  if (w->err != 0)
    return w->err;
  if (req->is_response)
    return invalid(w);
  if (host == NULL) {
    host = req->host != NULL ? req->host : req->authority;
    host_len = req->host != NULL ? req->host_len : req->authority_len;
  }
  if (host == NULL || host_len == 0)
    return invalid(w);

  size_t start = w->len;
  switch (req->target_form) {
  case CE_H1_TARGET_ORIGIN:
  case CE_H1_TARGET_ASTERISK:
    request_line2(w, req->method, req->method_len, req->path, req->path_len, NULL, 0);
    break;
  case CE_H1_TARGET_ABSOLUTE: {
    /* RFC 9112 §3.2.1: an empty path is sent as "/", also before a query. */
    bool slash = req->path_len == 0 || req->path[0] != '/';
    request_line2(w, req->method, req->method_len, slash ? "/" : NULL, slash ? 1 : 0,
                  req->path, req->path_len);
    break;
  }
  default:
    return invalid(w);
  }
  ce_h1_write_field(w, "Host", 4, host, host_len);
  ce_h1_write_forwarded_fields(w, req, flags);
  ce_h1_write_head_end(w);
  return finish(w, start);
}

int ce_h1_write_response_head(ce_h1_writer_t *w, const ce_h1_head_t *resp,
                              unsigned flags) {
  if (w->err != 0)
    return w->err;
  if (!resp->is_response)
    return invalid(w);
  size_t start = w->len;
  ce_h1_write_status_line(w, resp->status, resp->reason, resp->reason_len);
  ce_h1_write_forwarded_fields(w, resp, flags);
  ce_h1_write_head_end(w);
  return finish(w, start);
}

int ce_h1_write_chunk_header(ce_h1_writer_t *w, uint64_t size) {
  if (w->err != 0)
    return w->err;
  if (size == 0 || size > MAX_CHUNK_SIZE)
    return invalid(w);
  static const char hex[] = "0123456789abcdef";
  char tmp[16 + 2];
  size_t i = sizeof(tmp);
  tmp[--i] = '\n';
  tmp[--i] = '\r';
  while (size > 0) {
    tmp[--i] = hex[size & 0xf];
    size >>= 4;
  }
  size_t start = w->len;
  put(w, tmp + i, sizeof(tmp) - i);
  return finish(w, start);
}

int ce_h1_write_chunk_end(ce_h1_writer_t *w) {
  size_t start = w->len;
  put_str(w, "\r\n");
  return finish(w, start);
}

int ce_h1_write_last_chunk(ce_h1_writer_t *w) {
  size_t start = w->len;
  put_str(w, "0\r\n\r\n");
  return finish(w, start);
}

bool ce_h1_trailer_allowed(const char *name, size_t name_len) {
  static const char *const no[] = {
      /* connection-specific (RFC 9110 §7.6.1), and this proxy's credentials */
      "connection", "keep-alive", "proxy-connection", "te", "transfer-encoding", "trailer", "upgrade",
      "proxy-authorization",
      /* RFC 9110 §6.5.1: framing, routing, content handling, authentication */
      "content-length", "host", "content-type", "content-encoding", "content-range", "authorization", "cookie",
      "set-cookie",
      /* the rest of §6.5.1's kinds: authentication challenges and results,
       * request modifiers, response controls, content metadata */
      "www-authenticate", "proxy-authenticate", "authentication-info", "proxy-authentication-info", "expect",
      "max-forwards", "range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range",
      "cache-control", "pragma", "age", "expires", "date", "location", "retry-after", "vary", "warning",
      "content-language", "content-location", "last-modified", "etag"};
  for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
    if (ce__h1_ieq(name, name_len, no[i]))
      return false;
  return true;
}

int ce_h1_write_last_chunk_trailers(ce_h1_writer_t *w, const char *kept, size_t kept_len) {
  if (w->err != 0)
    return w->err;
  size_t start = w->len;
  put_str(w, "0\r\n");
  size_t pos = 0;
  ce_h1_field_t f;
  while (w->err == 0 && kept != NULL && ce_h1_trailer_next(kept, kept_len, &pos, &f)) {
    if (!ce_h1_trailer_allowed(f.name, f.name_len))
      continue;
    if (ce_h1_write_field(w, f.name, f.name_len, f.value, f.value_len) == CE_EINVAL)
      w->err = 0; /* nothing of it was written: left out */
  }
  put_str(w, "\r\n");
  return finish(w, start);
}
