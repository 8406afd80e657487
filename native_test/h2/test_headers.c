/* HTTP/2 ↔ HTTP/1.1 header translation (c_src/h2/headers.c,
 * docs/http2.md §6). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "h2/headers.h"

#define F(n, v) {n, sizeof(n) - 1, v, sizeof(v) - 1}

static int write_req(const ce_h2h_field_t *f, size_t n, bool chunked, char *out, size_t cap) {
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, cap - 1);
  int rc = ce_h2h_write_request(&w, f, n, chunked);
  out[rc == CE_OK ? w.len : 0] = '\0';
  return rc;
}

Test(h2_headers, request_line_host_first_and_fields_in_order) {
  ce_h2h_field_t f[] = {F(":method", "GET"), F(":scheme", "https"), F(":authority", "example.com"),
                        F(":path", "/a?b=c"), F("accept", "*/*"), F("user-agent", "t/1")};
  char out[512];
  cr_assert_eq(write_req(f, 6, false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "GET /a?b=c HTTP/1.1\r\nHost: example.com\r\naccept: */*\r\nuser-agent: t/1\r\n\r\n");
}

Test(h2_headers, connection_specific_te_and_proxy_credentials_never_cross) {
  ce_h2h_field_t f[] = {F(":method", "GET"),         F(":path", "/"),           F(":authority", "h"),
                        F("connection", "close"),    F("keep-alive", "5"),      F("proxy-connection", "x"),
                        F("transfer-encoding", "x"), F("upgrade", "websocket"), F("te", "trailers"),
                        F("proxy-authorization", "Basic x"), F("host", "h"),   F("x-ok", "1")};
  char out[512];
  cr_assert_eq(write_req(f, sizeof(f) / sizeof(f[0]), false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "GET / HTTP/1.1\r\nHost: h\r\nx-ok: 1\r\n\r\n");
}

Test(h2_headers, cookies_are_joined_into_one_field) {
  ce_h2h_field_t f[] = {F(":method", "GET"), F(":path", "/"), F(":authority", "h"), F("cookie", "a=1"),
                        F("x", "y"),         F("cookie", "b=2"), F("cookie", "c=3")};
  char out[512];
  cr_assert_eq(write_req(f, 7, false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "GET / HTTP/1.1\r\nHost: h\r\ncookie: a=1; b=2; c=3\r\nx: y\r\n\r\n");
}

Test(h2_headers, a_body_without_length_goes_chunked_and_a_length_stays) {
  ce_h2h_field_t f[] = {F(":method", "POST"), F(":path", "/u"), F(":authority", "h"), F("content-length", "5")};
  char out[512];
  cr_assert_eq(write_req(f, 4, false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "POST /u HTTP/1.1\r\nHost: h\r\ncontent-length: 5\r\n\r\n");
  cr_assert_eq(write_req(f, 4, true, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "POST /u HTTP/1.1\r\nHost: h\r\ntransfer-encoding: chunked\r\n\r\n");
}

Test(h2_headers, host_stands_in_for_a_missing_authority) {
  ce_h2h_field_t f[] = {F(":method", "GET"), F(":path", "/"), F("host", "h.example:8443")};
  char out[256];
  cr_assert_eq(write_req(f, 3, false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "GET / HTTP/1.1\r\nHost: h.example:8443\r\n\r\n");
}

Test(h2_headers, incomplete_or_unforwardable_requests_are_refused) {
  char out[256];
  ce_h2h_field_t no_method[] = {F(":path", "/"), F(":authority", "h")};
  cr_assert_eq(write_req(no_method, 2, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t no_path[] = {F(":method", "GET"), F(":authority", "h")};
  cr_assert_eq(write_req(no_path, 2, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t no_host[] = {F(":method", "GET"), F(":path", "/")};
  cr_assert_eq(write_req(no_host, 2, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t connect[] = {F(":method", "CONNECT"), F(":path", "/"), F(":authority", "h:443")};
  cr_assert_eq(write_req(connect, 3, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t bad_value[] = {F(":method", "GET"), F(":path", "/"), F(":authority", "h"), F("x", "a\r\nb: c")};
  cr_assert_eq(write_req(bad_value, 4, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t bad_cookie[] = {F(":method", "GET"), F(":path", "/"), F(":authority", "h"), F("cookie", "a\nb")};
  cr_assert_neq(write_req(bad_cookie, 4, false, out, sizeof(out)), CE_OK);
  ce_h2h_field_t bad_path[] = {F(":method", "GET"), F(":path", "/a b"), F(":authority", "h")};
  cr_assert_eq(write_req(bad_path, 3, false, out, sizeof(out)), CE_EINVAL);
}

Test(h2_headers, only_origin_form_targets_or_options_star_are_written) {
  char out[256];
  ce_h2h_field_t absolute[] = {F(":method", "GET"), F(":path", "http://evil.example/x"), F(":authority", "h")};
  cr_assert_eq(write_req(absolute, 3, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t authority[] = {F(":method", "GET"), F(":path", "evil.example:443"), F(":authority", "h")};
  cr_assert_eq(write_req(authority, 3, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t star_get[] = {F(":method", "GET"), F(":path", "*"), F(":authority", "h")};
  cr_assert_eq(write_req(star_get, 3, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t star_lower[] = {F(":method", "options"), F(":path", "*"), F(":authority", "h")};
  cr_assert_eq(write_req(star_lower, 3, false, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t star[] = {F(":method", "OPTIONS"), F(":path", "*"), F(":authority", "h")};
  cr_assert_eq(write_req(star, 3, false, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
}

Test(h2_headers, a_full_buffer_is_too_big_at_every_size) {
  ce_h2h_field_t f[] = {F(":method", "GET"), F(":path", "/"), F(":authority", "h"), F("cookie", "a=1"),
                        F("cookie", "b=2"), F("x", "y")};
  char full[512];
  cr_assert_eq(write_req(f, 6, true, full, sizeof(full)), CE_OK);
  size_t need = strlen(full);
  for (size_t cap = 0; cap < need; cap++) {
    char buf[512];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, buf, cap);
    cr_assert_neq(ce_h2h_write_request(&w, f, 6, true), CE_OK, "cap %zu", cap);
    cr_assert_leq(w.len, cap);
  }
}

static ce_h1_head_t parse_resp(const char *text) {
  ce_h1_head_t h;
  const char *why = NULL;
  cr_assert_eq(ce_h1_parse_response(text, strlen(text), "GET", 3, &h, &why), CE_OK, "%s", why ? why : "");
  return h;
}

Test(h2_headers, response_fields_lose_hop_by_hop_and_connection_named_ones) {
  const char *text = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, X-Hop\r\n"
                     "Keep-Alive: timeout=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nTrailer: grpc-status\r\n"
                     "Upgrade: h2c\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n";
  ce_h1_head_t h = parse_resp(text);
  ce_h2h_field_t out[16];
  char names[256];
  long n = ce_h2h_response_fields(&h, out, 16, names, sizeof(names));
  cr_assert_eq(n, 3);
  cr_assert_eq(out[0].name_len, 12);
  cr_assert(memcmp(out[0].name, "content-type", 12) == 0);
  cr_assert(memcmp(out[0].value, "text/plain", 10) == 0);
  cr_assert(memcmp(out[1].name, "set-cookie", 10) == 0);
  cr_assert(memcmp(out[2].value, "b=2", 3) == 0);
}

Test(h2_headers, response_fields_that_do_not_fit_are_refused) {
  ce_h1_head_t h = parse_resp("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n");
  ce_h2h_field_t out[4];
  char names[64];
  cr_assert_eq(ce_h2h_response_fields(&h, out, 1, names, sizeof(names)), -1);
  cr_assert_eq(ce_h2h_response_fields(&h, out, 4, names, 16), -1);
  cr_assert_eq(ce_h2h_response_fields(&h, out, 4, names, 17), 2);
}

Test(h2_headers, hop_by_hop_names_in_any_case) {
  cr_assert(ce_h2h_hop_by_hop("Connection", 10));
  cr_assert(ce_h2h_hop_by_hop("TE", 2));
  cr_assert(ce_h2h_hop_by_hop("Proxy-Authorization", 19));
  cr_assert_not(ce_h2h_hop_by_hop("content-length", 14));
  cr_assert_not(ce_h2h_hop_by_hop("tex", 3));
}

/* ---- HTTP/1.1 request -> h2 fields, h2 response -> HTTP/1.1 head ---- */

static long req_fields(const char *raw, bool te, ce_h2h_field_t *f, size_t cap, char *names, size_t ncap,
                       ce_h1_head_t *hd) {
  const char *why = NULL;
  cr_assert_eq(ce_h1_parse_request(raw, strlen(raw), hd, &why), CE_OK, "%s", why ? why : "");
  return ce_h2h_request_fields(hd, te, f, cap, names, ncap);
}

static bool field_is(const ce_h2h_field_t *f, const char *name, const char *value) {
  return f->name_len == strlen(name) && memcmp(f->name, name, f->name_len) == 0 && f->value_len == strlen(value) &&
         memcmp(f->value, value, f->value_len) == 0;
}

Test(h2_headers, an_http1_request_becomes_pseudo_headers_and_lower_case_fields) {
  static ce_h1_head_t hd;
  ce_h2h_field_t f[16];
  char names[256];
  long n = req_fields("POST /u?x=1 HTTP/1.1\r\nHost: h.example:8443\r\nContent-Length: 3\r\nX-Mixed: A\r\n"
                      "Cookie: a=1\r\n\r\n",
                      false, f, 16, names, sizeof(names), &hd);
  cr_assert_eq(n, 7);
  cr_assert(field_is(&f[0], ":method", "POST"));
  cr_assert(field_is(&f[1], ":scheme", "https"));
  cr_assert(field_is(&f[2], ":authority", "h.example:8443"));
  cr_assert(field_is(&f[3], ":path", "/u?x=1"));
  cr_assert(field_is(&f[4], "content-length", "3"));
  cr_assert(field_is(&f[5], "x-mixed", "A"));
  cr_assert(field_is(&f[6], "cookie", "a=1"));
}

Test(h2_headers, connection_specific_fields_stay_on_the_http1_side_and_te_trailers_is_added) {
  static ce_h1_head_t hd;
  ce_h2h_field_t f[16];
  char names[256];
  long n = req_fields("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, x-hop\r\nKeep-Alive: 5\r\n"
                      "X-Hop: 1\r\nTE: trailers\r\nProxy-Authorization: Basic x\r\nUpgrade: foo\r\nX-Ok: 2\r\n\r\n",
                      true, f, 16, names, sizeof(names), &hd);
  cr_assert_eq(n, 6);
  cr_assert(field_is(&f[4], "x-ok", "2"));
  cr_assert(field_is(&f[5], "te", "trailers"));
}

Test(h2_headers, request_fields_refuse_small_buffers_and_connect) {
  static ce_h1_head_t hd;
  ce_h2h_field_t f[16];
  char names[8];
  cr_assert_eq(req_fields("GET / HTTP/1.1\r\nHost: h\r\nX-Long-Name: 1\r\n\r\n", false, f, 16, names, sizeof(names),
                          &hd),
               -1);
  char big[256];
  cr_assert_eq(req_fields("GET / HTTP/1.1\r\nHost: h\r\nX: 1\r\n\r\n", false, f, 4, big, sizeof(big), &hd), -1);
  cr_assert_eq(req_fields("GET / HTTP/1.1\r\nHost: h\r\n\r\n", true, f, 4, big, sizeof(big), &hd), -1);
  cr_assert_eq(req_fields("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n", false, f, 16, big, sizeof(big), &hd), -1);
}

static int write_resp(int status, const ce_h2h_field_t *f, size_t n, unsigned flags, char *out, size_t cap) {
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, cap - 1);
  int rc = ce_h2h_write_response(&w, status, f, n, flags);
  out[rc == CE_OK ? w.len : 0] = '\0';
  return rc;
}

Test(h2_headers, an_h2_response_becomes_an_http1_head) {
  ce_h2h_field_t f[] = {F(":status", "200"), F("content-type", "text/plain"), F("content-length", "5"),
                        F("connection", "x"), F("x-a", "b")};
  char out[512];
  cr_assert_eq(write_resp(200, f, 5, 0, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nx-a: b\r\n\r\n");
  cr_assert_eq(write_resp(200, f, 5, CE_H2H_CHUNKED | CE_H2H_CLOSE, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-a: b\r\ntransfer-encoding: chunked\r\n"
                        "connection: close\r\n\r\n");
  cr_assert_eq(write_resp(299, f, 1, 0, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "HTTP/1.1 299 \r\n\r\n");
  cr_assert_eq(write_resp(103, (ce_h2h_field_t[]){F("link", "</a>; rel=preload")}, 1, 0, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n");
}

Test(h2_headers, a_response_that_cannot_be_written_is_refused) {
  char out[64];
  ce_h2h_field_t bad[] = {F("x", "a\rb")};
  cr_assert_eq(write_resp(200, bad, 1, 0, out, sizeof(out)), CE_EINVAL);
  cr_assert_eq(write_resp(1000, bad, 0, 0, out, sizeof(out)), CE_EINVAL);
  ce_h2h_field_t big[] = {F("x", "0123456789012345678901234567890123456789012345678901234567890123456789")};
  cr_assert_eq(write_resp(200, big, 1, 0, out, sizeof(out)), CE_ETOOBIG);
}

static int write_tr(const ce_h2h_field_t *f, size_t n, char *out, size_t cap) {
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, cap - 1);
  int rc = ce_h2h_write_trailers(&w, f, n);
  out[w.len] = '\0';
  return rc;
}

Test(h2_headers, trailers_end_a_chunked_body_without_forbidden_fields) {
  ce_h2h_field_t f[] = {F("grpc-status", "0"), F("content-length", "9"), F(":status", "200"),
                        F("x-bad", "a\nb"),     F("grpc-message", "ok"), F("connection", "close")};
  char out[256];
  cr_assert_eq(write_tr(f, 6, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\ngrpc-status: 0\r\ngrpc-message: ok\r\n\r\n");
  cr_assert_eq(write_tr(f, 0, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\n\r\n");
  cr_assert_eq(write_tr(f, 6, out, 12), CE_ETOOBIG);
  cr_assert_str_eq(out, "");
}

Test(h2_headers, kept_http1_trailers_become_h2_trailer_fields) {
  const char *tr = "Grpc-Status: 0\r\nX-B:  two words \t\r\nContent-Length: 5\r\nTrailer: x\r\nE:\r\n";
  ce_h2h_field_t f[8];
  char names[64];
  long n = ce_h2h_trailer_fields(tr, strlen(tr), f, 8, names, sizeof(names));
  cr_assert_eq(n, 3);
  cr_assert(field_is(&f[0], "grpc-status", "0"));
  cr_assert(field_is(&f[1], "x-b", "two words"));
  cr_assert(field_is(&f[2], "e", ""));
  cr_assert_eq(ce_h2h_trailer_fields(tr, strlen(tr), f, 2, names, sizeof(names)), -1);
  cr_assert_eq(ce_h2h_trailer_fields(tr, strlen(tr), f, 8, names, 4), -1);
  cr_assert_eq(ce_h2h_trailer_fields("", 0, f, 8, names, sizeof(names)), 0);
}

/* Review #11: a 128-field head with a long Connection value. The names the
 * Connection field lists (in any case, repeated, among tokens that name no
 * field, split over two Connection fields) are dropped, the rest kept in
 * order; the reference below is the plain per-field scan. */
static bool listed(const char *conn, const char *name) {
  size_t n = strlen(name);
  for (const char *p = conn; *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',')
      p++;
    const char *s = p;
    while (*p && *p != ' ' && *p != '\t' && *p != ',')
      p++;
    if ((size_t)(p - s) == n && strncasecmp(s, name, n) == 0)
      return true;
  }
  return false;
}

Test(h2_headers, a_long_connection_field_over_128_fields) {
  static char text[64 * 1024], conn1[40 * 1024], conn2[8 * 1024];
  size_t c1 = 0, c2 = 0;
  /* Tokens that name nothing, of every length, then every third field's
   * name in upper case, twice, and names that differ by one letter. */
  for (int i = 0; c1 < 30 * 1024; i++)
    c1 += (size_t)snprintf(conn1 + c1, sizeof(conn1) - c1, "%sx-none-%d", i ? ", " : "", i);
  for (int i = 0; i < 126; i += 3)
    c1 += (size_t)snprintf(conn1 + c1, sizeof(conn1) - c1, ",X-F%03d,x-f%03d", i, i);
  for (int i = 1; i < 126; i += 3)
    c2 += (size_t)snprintf(conn2 + c2, sizeof(conn2) - c2, "x-f%03dz ,\tx-f%02d , X-Dup, ", i, i % 100);
  size_t t = (size_t)snprintf(text, sizeof(text), "HTTP/1.1 200 OK\r\nConnection: %s\r\nConnection: %s\r\n", conn1,
                              conn2);
  /* 126 more fields: X-F000..X-F124 with X-Dup three times among them. */
  char names[126][16];
  for (int i = 0; i < 126; i++) {
    if (i == 10 || i == 60 || i == 125)
      snprintf(names[i], sizeof(names[i]), "x-dup");
    else
      snprintf(names[i], sizeof(names[i]), "X-F%03d", i);
    t += (size_t)snprintf(text + t, sizeof(text) - t, "%s: v%d\r\n", names[i], i);
  }
  t += (size_t)snprintf(text + t, sizeof(text) - t, "\r\n");
  cr_assert_lt(t, sizeof(text) - 1);
  ce_h1_head_t h;
  const char *why = NULL;
  cr_assert_eq(ce_h1_parse_response(text, t, "GET", 3, &h, &why), CE_OK, "%s", why ? why : "");
  cr_assert_eq(h.field_count, 128);

  static ce_h2h_field_t out[128];
  static char nm[4096];
  long n = ce_h2h_response_fields(&h, out, 128, nm, sizeof(nm));
  cr_assert_geq(n, 0);
  long k = 0;
  for (int i = 0; i < 126; i++) {
    if (listed(conn1, names[i]) || listed(conn2, names[i]))
      continue;
    char v[16];
    snprintf(v, sizeof(v), "v%d", i);
    cr_assert_lt(k, n, "field %d", i);
    cr_assert_eq(out[k].name_len, strlen(names[i]));
    cr_assert(strncasecmp(out[k].name, names[i], out[k].name_len) == 0, "field %d", i);
    cr_assert(out[k].value_len == strlen(v) && memcmp(out[k].value, v, out[k].value_len) == 0, "field %d", i);
    k++;
  }
  cr_assert_eq(k, n);
  /* Every third field and the three X-Dup are gone; X-F001 etc. are not. */
  cr_assert_eq(n, 126 - 41 - 3);

  bool named[CE_H1_MAX_FIELDS];
  ce_h1_connection_named(&h, named);
  cr_assert_not(named[0]);
  cr_assert_not(named[1]);
  cr_assert(named[2 + 0]);
  cr_assert(named[2 + 10] && named[2 + 60] && named[2 + 125]);
  cr_assert_not(named[2 + 1]);
}
