/* HTTP/2 ↔ HTTP/1.1 header translation (headers.h, docs/http2.md §6). */
#include "h2/headers.h"

#include <string.h>
#include <strings.h>

#include "common/error.h"

static bool name_is(const char *name, size_t len, const char *lit) {
  size_t n = strlen(lit);
  return len == n && strncasecmp(name, lit, n) == 0;
}

bool ce_h2h_hop_by_hop(const char *name, size_t name_len) {
  static const char *const drop[] = {"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                                     "upgrade",    "te",         "trailer",          "proxy-authorization"};
  for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
    if (name_is(name, name_len, drop[i]))
      return true;
  return false;
}

static const ce_h2h_field_t *find(const ce_h2h_field_t *f, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (name_is(f[i].name, f[i].name_len, name))
      return &f[i];
  return NULL;
}

static void append(ce_h1_writer_t *w, const char *s, size_t n) {
  if (w->err != 0)
    return;
  if (n > w->cap - w->len) {
    w->err = CE_ETOOBIG;
    return;
  }
  memcpy(w->buf + w->len, s, n);
  w->len += n;
}

/* A value byte the writer would accept (VCHAR, obs-text, SP, HTAB). */
static bool value_ok(const char *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)v[i];
    if (ch < 0x20 && ch != '\t')
      return false;
    if (ch == 0x7f)
      return false;
  }
  return true;
}

int ce_h2h_write_request(ce_h1_writer_t *w, const ce_h2h_field_t *f, size_t n, bool chunked) {
  const ce_h2h_field_t *method = find(f, n, ":method");
  const ce_h2h_field_t *path = find(f, n, ":path");
  const ce_h2h_field_t *auth = find(f, n, ":authority");
  if (auth == NULL || auth->value_len == 0)
    auth = find(f, n, "host");
  if (method == NULL || path == NULL || auth == NULL || auth->value_len == 0 || path->value_len == 0)
    return CE_EINVAL;
  if (name_is(method->value, method->value_len, "CONNECT"))
    return CE_EINVAL;
  /* Origin-form only (or "*" for OPTIONS): an absolute-form or authority
   * target would let the upstream route by another name than Host. */
  bool star = path->value_len == 1 && path->value[0] == '*' && method->value_len == 7 &&
              memcmp(method->value, "OPTIONS", 7) == 0;
  if (path->value[0] != '/' && !star)
    return CE_EINVAL;
  int rc = ce_h1_write_request_line(w, method->value, method->value_len, path->value, path->value_len);
  if (rc == CE_OK)
    rc = ce_h1_write_field(w, "Host", 4, auth->value, auth->value_len);
  bool cookie_done = false;
  for (size_t i = 0; i < n && rc == CE_OK; i++) {
    const ce_h2h_field_t *x = &f[i];
    if (x->name_len == 0 || x->name[0] == ':')
      continue;
    if (name_is(x->name, x->name_len, "host") || ce_h2h_hop_by_hop(x->name, x->name_len))
      continue;
    if (chunked && name_is(x->name, x->name_len, "content-length"))
      continue;
    if (name_is(x->name, x->name_len, "cookie")) {
      /* RFC 9113 §8.2.3: one field, the crumbs joined by "; ". */
      if (cookie_done)
        continue;
      cookie_done = true;
      append(w, "cookie: ", 8);
      bool first = true;
      for (size_t j = i; j < n; j++) {
        if (!name_is(f[j].name, f[j].name_len, "cookie"))
          continue;
        if (!value_ok(f[j].value, f[j].value_len)) {
          w->err = CE_EINVAL;
          break;
        }
        if (!first)
          append(w, "; ", 2);
        append(w, f[j].value, f[j].value_len);
        first = false;
      }
      append(w, "\r\n", 2);
      rc = w->err;
      continue;
    }
    rc = ce_h1_write_field(w, x->name, x->name_len, x->value, x->value_len);
  }
  if (rc == CE_OK && chunked)
    rc = ce_h1_write_field(w, "transfer-encoding", 17, "chunked", 7);
  if (rc == CE_OK)
    rc = ce_h1_write_head_end(w);
  return rc;
}

long ce_h2h_response_fields(const ce_h1_head_t *resp, ce_h2h_field_t *out, size_t cap, char *names,
                            size_t names_cap) {
  size_t k = 0, used = 0;
  bool named[CE_H1_MAX_FIELDS];
  ce_h1_connection_named(resp, named);
  for (size_t i = 0; i < resp->field_count && i < CE_H1_MAX_FIELDS; i++) {
    const ce_h1_field_t *x = &resp->fields[i];
    if (ce_h2h_hop_by_hop(x->name, x->name_len) || named[i])
      continue;
    if (k == cap || x->name_len > names_cap - used)
      return -1;
    char *nm = names + used;
    for (size_t j = 0; j < x->name_len; j++) {
      char ch = x->name[j];
      nm[j] = (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
    }
    used += x->name_len;
    out[k].name = nm;
    out[k].name_len = x->name_len;
    out[k].value = x->value;
    out[k].value_len = x->value_len;
    k++;
  }
  return (long)k;
}

/* Copies name lower-cased into names[*used..); NULL when it does not fit. */
static const char *lower_name(const char *name, size_t len, char *names, size_t names_cap, size_t *used) {
  if (len > names_cap - *used)
    return NULL;
  char *nm = names + *used;
  for (size_t j = 0; j < len; j++) {
    char ch = name[j];
    nm[j] = (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
  }
  *used += len;
  return nm;
}

long ce_h2h_request_fields(const ce_h1_head_t *req, bool te_trailers, ce_h2h_field_t *out, size_t cap, char *names,
                           size_t names_cap) {
  if (req->host == NULL || req->host_len == 0 || req->path == NULL || req->path_len == 0 || cap < 4)
    return -1;
  if (name_is(req->method, req->method_len, "CONNECT"))
    return -1;
  out[0] = (ce_h2h_field_t){":method", 7, req->method, req->method_len};
  out[1] = (ce_h2h_field_t){":scheme", 7, "https", 5};
  out[2] = (ce_h2h_field_t){":authority", 10, req->host, req->host_len};
  out[3] = (ce_h2h_field_t){":path", 5, req->path, req->path_len};
  size_t k = 4, used = 0;
  bool named[CE_H1_MAX_FIELDS];
  ce_h1_connection_named(req, named);
  for (size_t i = 0; i < req->field_count && i < CE_H1_MAX_FIELDS; i++) {
    const ce_h1_field_t *x = &req->fields[i];
    if (name_is(x->name, x->name_len, "host") || ce_h2h_hop_by_hop(x->name, x->name_len) || named[i])
      continue;
    const char *nm = lower_name(x->name, x->name_len, names, names_cap, &used);
    if (k == cap || nm == NULL)
      return -1;
    out[k++] = (ce_h2h_field_t){nm, x->name_len, x->value, x->value_len};
  }
  if (te_trailers) {
    if (k == cap)
      return -1;
    out[k++] = (ce_h2h_field_t){"te", 2, "trailers", 8};
  }
  return (long)k;
}

static const char *reason_phrase(int status) {
  switch (status) {
  case 100: return "Continue";
  case 103: return "Early Hints";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 409: return "Conflict";
  case 412: return "Precondition Failed";
  case 413: return "Content Too Large";
  case 415: return "Unsupported Media Type";
  case 421: return "Misdirected Request";
  case 429: return "Too Many Requests";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  default: return "";
  }
}

int ce_h2h_write_response(ce_h1_writer_t *w, int status, const ce_h2h_field_t *f, size_t n, unsigned flags) {
  const char *reason = reason_phrase(status);
  int rc = ce_h1_write_status_line(w, status, reason, strlen(reason));
  for (size_t i = 0; i < n && rc == CE_OK; i++) {
    const ce_h2h_field_t *x = &f[i];
    if (x->name_len == 0 || x->name[0] == ':' || ce_h2h_hop_by_hop(x->name, x->name_len))
      continue;
    if ((flags & CE_H2H_CHUNKED) != 0 && name_is(x->name, x->name_len, "content-length"))
      continue;
    rc = ce_h1_write_field(w, x->name, x->name_len, x->value, x->value_len);
  }
  if (rc == CE_OK && (flags & CE_H2H_CHUNKED) != 0)
    rc = ce_h1_write_field(w, "transfer-encoding", 17, "chunked", 7);
  if (rc == CE_OK && (flags & CE_H2H_CLOSE) != 0)
    rc = ce_h1_write_field(w, "connection", 10, "close", 5);
  if (rc == CE_OK)
    rc = ce_h1_write_head_end(w);
  return rc;
}

int ce_h2h_write_trailers(ce_h1_writer_t *w, const ce_h2h_field_t *f, size_t n) {
  if (w->err != 0)
    return w->err;
  size_t start = w->len;
  append(w, "0\r\n", 3);
  for (size_t i = 0; i < n && w->err == 0; i++) {
    const ce_h2h_field_t *x = &f[i];
    if (x->name_len == 0 || x->name[0] == ':' || !ce_h1_trailer_allowed(x->name, x->name_len))
      continue;
    size_t before = w->len;
    if (ce_h1_write_field(w, x->name, x->name_len, x->value, x->value_len) == CE_EINVAL) {
      w->err = 0;
      w->len = before;
    }
  }
  append(w, "\r\n", 2);
  if (w->err != 0) {
    w->len = start;
    return w->err;
  }
  return CE_OK;
}

long ce_h2h_trailer_fields(const char *buf, size_t len, ce_h2h_field_t *out, size_t cap, char *names,
                           size_t names_cap) {
  size_t k = 0, used = 0, pos = 0;
  ce_h1_field_t x;
  while (ce_h1_trailer_next(buf, len, &pos, &x)) {
    if (!ce_h1_trailer_allowed(x.name, x.name_len))
      continue;
    const char *nm = lower_name(x.name, x.name_len, names, names_cap, &used);
    if (k == cap || nm == NULL)
      return -1;
    out[k++] = (ce_h2h_field_t){nm, x.name_len, x.value, x.value_len};
  }
  return (long)k;
}
