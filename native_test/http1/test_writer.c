/* Tests for c_src/http1/writer.c: heads for the upstream and the client
 * (RFC 9110 §7.6.1 hop-by-hop removal, RFC 9112 §3.2.1 origin-form),
 * chunk framing, bounded buffers, and refusal of anything that would let
 * a caller inject a line. What the writer produces must parse again. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "http1/parser.h"
#include "http1/writer.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static ce_h1_head_t parse_req(const char *msg) {
  ce_h1_head_t h;
  const char *why = NULL;
  int rc = ce_h1_parse_request(msg, strlen(msg), &h, &why);
  cr_assert_eq(rc, CE_OK, "%s: %s", msg, why ? why : "");
  return h;
}

static ce_h1_head_t parse_resp(const char *msg) {
  ce_h1_head_t h;
  const char *why = NULL;
  int rc = ce_h1_parse_response(msg, strlen(msg), "GET", 3, &h, &why);
  cr_assert_eq(rc, CE_OK, "%s: %s", msg, why ? why : "");
  return h;
}

/* Writes into buf and checks the result against want (NUL-terminated). */
static void expect_written(const ce_h1_writer_t *w, const char *want) {
  cr_expect_eq(w->err, 0);
  cr_expect_eq(w->len, strlen(want), "len %zu, wanted %zu:\n%.*s", w->len, strlen(want),
               (int)w->len, w->buf);
  cr_expect(w->len == strlen(want) && memcmp(w->buf, want, w->len) == 0, "got:\n%.*s\nwanted:\n%s",
            (int)w->len, w->buf, want);
}

Test(http1_writer, request_head_drops_hop_by_hop_fields) {
  const char *in = "POST /api?x=1 HTTP/1.1\r\n"
                   "User-Agent: t\r\n"
                   "Host: a.example\r\n"
                   "Connection: keep-alive, X-Hop, close\r\n"
                   "X-Hop: 1\r\n"
                   "x-hop: 2\r\n"
                   "Keep-Alive: timeout=5\r\n"
                   "Proxy-Connection: keep-alive\r\n"
                   "TE: trailers\r\n"
                   "Trailer: X-Sum\r\n"
                   "Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"
                   "Upgrade: websocket\r\n"
                   "Content-Length: 3\r\n"
                   "X-End: end\r\n"
                   "\r\n";
  ce_h1_head_t h = parse_req(in);
  char buf[1024];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), 0);
  expect_written(&w, "POST /api?x=1 HTTP/1.1\r\n"
                     "Host: a.example\r\n"
                     "User-Agent: t\r\n"
                     "Content-Length: 3\r\n"
                     "X-End: end\r\n"
                     "\r\n");
}

/* A head built by hand (the parser refuses "Connection: content-length")
 * still keeps its Content-Length: dropping it would turn the body into the
 * next request upstream. */
Test(http1_writer, content_length_survives_connection_options) {
  ce_h1_head_t h = parse_req("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                             "Connection: x-a\r\nX-A: 1\r\n\r\n");
  static const char evil[] = "content-length, x-a";
  h.fields[2].value = evil;
  h.fields[2].value_len = sizeof(evil) - 1;
  char buf[256];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), 0);
  expect_written(&w, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n");
}

Test(http1_writer, request_head_flags) {
  const char *in = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                   "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
  ce_h1_head_t h = parse_req(in);
  char buf[1024];
  ce_h1_writer_t w;

  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_CHUNKED | CE_H1_W_CLOSE), 0);
  expect_written(&w, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Connection: close\r\n\r\n");

  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, "b.example:8443", 14, CE_H1_W_UPGRADE), 0);
  expect_written(&w, "POST / HTTP/1.1\r\nHost: b.example:8443\r\nContent-Length: 3\r\n"
                     "Upgrade: websocket\r\nConnection: upgrade\r\n\r\n");

  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_UPGRADE | CE_H1_W_CLOSE), 0);
  expect_written(&w, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                     "Upgrade: websocket\r\nConnection: upgrade, close\r\n\r\n");
}

Test(http1_writer, request_targets_become_origin_form) {
  static const struct {
    const char *in, *line;
  } cases[] = {
      {"GET http://a.example/p?q HTTP/1.1\r\nHost: a.example\r\n\r\n",
       "GET /p?q HTTP/1.1\r\nHost: a.example\r\n\r\n"},
      /* RFC 9112 §3.2.1: an empty path is sent as "/". */
      {"GET http://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n",
       "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"},
      {"GET http://a.example?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n",
       "GET /?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n"},
      /* RFC 9112 §3.2.2: Host from the target when the client sent none,
       * and our own version (RFC 9110 §6.2). */
      {"GET http://b.example:81/x HTTP/1.0\r\n\r\n",
       "GET /x HTTP/1.1\r\nHost: b.example:81\r\n\r\n"},
      {"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"},
      {"GET /x HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
       "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    ce_h1_head_t h = parse_req(cases[i].in);
    char buf[512];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), 0, "%s", cases[i].in);
    expect_written(&w, cases[i].line);
  }
}

Test(http1_writer, request_head_refusals) {
  char buf[512];
  ce_h1_writer_t w;
  /* CONNECT is answered by the proxy, never forwarded as such. */
  ce_h1_head_t h = parse_req("CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), CE_EINVAL);
  cr_expect_eq(w.len, 0);
  /* No host anywhere (HTTP/1.0, origin-form, none given). */
  h = parse_req("GET / HTTP/1.0\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), CE_EINVAL);
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &h, "a", 1, 0), 0);
  expect_written(&w, "GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  /* A host with CRLF cannot add a line. */
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &h, "a\r\nX: y", 7, 0), CE_EINVAL);
  cr_expect_eq(w.len, 0, "nothing written on failure");
  /* A response is not a request, and the other way round. */
  ce_h1_head_t r = parse_resp("HTTP/1.1 200 OK\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &r, "a", 1, 0), CE_EINVAL);
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_response_head(&w, &h, 0), CE_EINVAL);
  /* A corrupt field count. */
  h.field_count = CE_H1_MAX_FIELDS + 1;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, 0), CE_EINVAL);
  /* An unknown target form. */
  h = parse_req("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  h.target_form = (ce_h1_target_form_t)9;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), CE_EINVAL);
}

Test(http1_writer, response_head) {
  const char *in = "HTTP/1.0 200 OK\r\nServer: s\r\nConnection: keep-alive, X-Gone\r\n"
                   "Keep-Alive: max=5\r\nX-Gone: 1\r\nHost: kept-in-responses\r\n"
                   "Proxy-Authorization: kept-in-responses\r\n"
                   "Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n";
  ce_h1_head_t h;
  const char *why = NULL;
  /* HTTP/1.0 with TE is refused by the parser, so fake a 1.1 parse. */
  char copy[512];
  strcpy(copy, in);
  memcpy(copy + 5, "1.1", 3);
  cr_assert_eq(ce_h1_parse_response(copy, strlen(copy), "GET", 3, &h, &why), CE_OK, "%s", why);
  char buf[512];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_response_head(&w, &h, CE_H1_W_CHUNKED), 0);
  expect_written(&w, "HTTP/1.1 200 OK\r\nServer: s\r\nHost: kept-in-responses\r\n"
                     "Proxy-Authorization: kept-in-responses\r\n"
                     "Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n");

  /* RFC 9112 §4: the SP after the code stays with an empty reason. */
  h = parse_resp("HTTP/1.1 204 \r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_response_head(&w, &h, 0), 0);
  expect_written(&w, "HTTP/1.1 204 \r\n\r\n");

  h = parse_resp("HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                 "Upgrade: websocket\r\nSec-WebSocket-Accept: abc\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_response_head(&w, &h, CE_H1_W_UPGRADE), 0);
  expect_written(&w, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     "Sec-WebSocket-Accept: abc\r\nConnection: upgrade\r\n\r\n");
}

/* Transfer-Encoding is rewritten, never copied: chunked is always
 * announced for a chunked body, and a response's other codings survive. */
Test(http1_writer, transfer_encoding_is_rewritten) {
  static const struct {
    const char *in, *method;
    unsigned flags;
    const char *te; /* what is written (Host is left to the head writer) */
  } cases[] = {
      /* A chunked request stays chunked even if the caller forgets. */
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked\r\n\r\n", NULL, 0,
       "Transfer-Encoding: chunked\r\n"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n", NULL, 0,
       "Content-Length: 3\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", 0,
       "Transfer-Encoding: chunked\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "GET", 0,
       "Transfer-Encoding: gzip, chunked\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: br, chunked\r\n\r\n",
       "GET", 0, "Transfer-Encoding: gzip, br, chunked\r\n"},
      /* Read until close: every coding describes the bytes passed on. */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", CE_H1_W_CLOSE,
       "Transfer-Encoding: gzip\r\nConnection: close\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "GET", 0,
       "Transfer-Encoding: chunked, gzip\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", CE_H1_W_CHUNKED,
       "Transfer-Encoding: gzip, chunked\r\n"},
      {"HTTP/1.1 200 OK\r\n\r\n", "GET", CE_H1_W_CHUNKED, "Transfer-Encoding: chunked\r\n"},
      /* Decoded for an HTTP/1.0 client (RFC 9112 §6.1): chunked goes,
       * the content codings stay. */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", CE_H1_W_DECHUNK | CE_H1_W_CLOSE,
       "Connection: close\r\n"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "GET", CE_H1_W_DECHUNK,
       "Transfer-Encoding: gzip\r\n"},
      /* No body goes out: nothing to announce. */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "HEAD", 0, ""},
      {"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", 0, ""},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    ce_h1_head_t h;
    const char *why = NULL;
    const char *in = cases[i].in;
    int rc = cases[i].method == NULL
                 ? ce_h1_parse_request(in, strlen(in), &h, &why)
                 : ce_h1_parse_response(in, strlen(in), cases[i].method,
                                        strlen(cases[i].method), &h, &why);
    cr_assert_eq(rc, CE_OK, "%s: %s", in, why);
    char buf[512];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_assert_eq(ce_h1_write_forwarded_fields(&w, &h, cases[i].flags), 0, "%s", in);
    expect_written(&w, cases[i].te);
  }
  /* Chunking a body that already carries chunked would apply it twice. */
  ce_h1_head_t h = parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
  char buf[256];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, CE_H1_W_CHUNKED), CE_EINVAL);
  cr_expect_eq(w.len, 0);
  /* DECHUNK is for a chunked response only, and never with CHUNKED. */
  h = parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, CE_H1_W_DECHUNK | CE_H1_W_CHUNKED), CE_EINVAL);
  h = parse_resp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, CE_H1_W_DECHUNK), CE_EINVAL);
  /* A hand-made coding with a CR is refused like any value. */
  h = parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
  h.fields[0].value = "gz\rip";
  h.fields[0].value_len = 5;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, 0), CE_EINVAL);
  cr_expect_eq(w.len, 0);
}

Test(http1_writer, proxy_generated_response) {
  char buf[256];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  ce_h1_write_status_line(&w, 403, "Forbidden", 9);
  ce_h1_write_field(&w, "Content-Length", 14, "0", 1);
  ce_h1_write_field(&w, "X-Empty", 7, NULL, 0);
  int rc = ce_h1_write_head_end(&w);
  cr_assert_eq(rc, 0);
  expect_written(&w, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nX-Empty: \r\n\r\n");
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_status_line(&w, 100, NULL, 0), 0);
  cr_assert_eq(ce_h1_write_request_line(&w, "GET", 3, "/", 1), 0);
  expect_written(&w, "HTTP/1.1 100 \r\nGET / HTTP/1.1\r\n");
}

Test(http1_writer, output_parses_again) {
  const char *in = "PUT http://a.example/x HTTP/1.1\r\nHost: a.example\r\n"
                   "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
                   "X-Obs: \x80\xff\r\nConnection: te\r\nTE: trailers\r\n\r\n";
  ce_h1_head_t h = parse_req(in);
  char buf[512];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_CHUNKED), 0);
  ce_h1_head_t again;
  const char *why = NULL;
  cr_assert_eq(ce_h1_parse_request(buf, w.len, &again, &why), CE_OK, "%s", why);
  cr_expect_eq(again.head_len, w.len);
  cr_expect_eq(again.framing, CE_H1_BODY_CHUNKED);
  cr_expect(again.expect_continue);
  cr_expect_eq(again.target_form, CE_H1_TARGET_ORIGIN);
  cr_expect_eq(ce_h1_find(&again, "te", 0), -1);
  cr_expect_eq(ce_h1_find(&again, "connection", 0), -1);
  cr_expect_geq(ce_h1_find(&again, "x-obs", 0), 0);
}

Test(http1_writer, invalid_arguments_are_refused) {
  char buf[256];
  ce_h1_writer_t w;
  static const struct {
    const char *name, *value;
  } fields[] = {
      {"", "v"},        {"A B", "v"},      {"A:", "v"},      {"A\r\nB", "v"},
      {"A", "v\r\nB: c"}, {"A", "v\n"},    {"A", "v\r"},     {"A", " v"},
      {"A", "v\t"},     {"A", "a\x7f"},    {"A", "\x01"},    {"\x80", "v"},
  };
  for (size_t i = 0; i < N_OF(fields); i++) {
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_expect_eq(ce_h1_write_field(&w, fields[i].name, strlen(fields[i].name),
                                   fields[i].value, strlen(fields[i].value)),
                 CE_EINVAL, "%zu", i);
    cr_expect_eq(w.len, 0);
  }
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_field(&w, "A", 1, "a\0b", 3), CE_EINVAL);
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_field(&w, "A", 1, NULL, 3), CE_EINVAL);
  static const struct {
    const char *method, *target;
  } lines[] = {
      {"", "/"}, {"G T", "/"}, {"GET", ""}, {"GET", "/ x"}, {"GET", "/\r\n"},
      {"GET", "/\x7f"}, {"GET", "/\xc3\xa9"}, {"GET\r\n", "/"},
  };
  for (size_t i = 0; i < N_OF(lines); i++) {
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_expect_eq(ce_h1_write_request_line(&w, lines[i].method, strlen(lines[i].method),
                                          lines[i].target, strlen(lines[i].target)),
                 CE_EINVAL, "%zu", i);
  }
  static const int statuses[] = {-1, 0, 99, 1000};
  for (size_t i = 0; i < N_OF(statuses); i++) {
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_expect_eq(ce_h1_write_status_line(&w, statuses[i], "x", 1), CE_EINVAL);
  }
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_status_line(&w, 200, "O\r\nK", 4), CE_EINVAL);
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_status_line(&w, 200, NULL, 2), CE_EINVAL);
  /* Inner and outer whitespace is fine in a reason phrase. */
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_status_line(&w, 200, " O\tK ", 5), 0);
}

/* Every capacity short of the full head fails with CE_ETOOBIG and leaves
 * the buffer length where it was. */
Test(http1_writer, bounded_buffer) {
  ce_h1_head_t h = parse_req("GET /x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nX-B: 2\r\n\r\n");
  char full[512];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, full, sizeof(full));
  cr_assert_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_CLOSE), 0);
  size_t need = w.len;
  for (size_t cap = 0; cap < need; cap++) {
    char *buf = malloc(cap > 0 ? cap : 1);
    cr_assert_not_null(buf);
    ce_h1_writer_init(&w, buf, cap);
    cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_CLOSE), CE_ETOOBIG,
                 "cap %zu", cap);
    cr_expect_eq(w.len, 0, "cap %zu", cap);
    cr_expect_eq(w.err, CE_ETOOBIG);
    free(buf);
  }
  char *buf = malloc(need);
  cr_assert_not_null(buf);
  ce_h1_writer_init(&w, buf, need);
  cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, CE_H1_W_CLOSE), 0);
  cr_expect(memcmp(buf, full, need) == 0);
  free(buf);

  /* A response head and pieces too. */
  ce_h1_head_t r = parse_resp("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  char small[20];
  ce_h1_writer_init(&w, small, sizeof(small));
  cr_expect_eq(ce_h1_write_response_head(&w, &r, 0), CE_ETOOBIG);
  cr_expect_eq(w.len, 0);
  ce_h1_writer_init(&w, small, 3);
  cr_expect_eq(ce_h1_write_chunk_header(&w, 0xabcd), CE_ETOOBIG);
  ce_h1_writer_init(&w, small, 1);
  cr_expect_eq(ce_h1_write_chunk_end(&w), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_head_end(&w), CE_ETOOBIG);
  ce_h1_writer_init(&w, small, 4);
  cr_expect_eq(ce_h1_write_last_chunk(&w), CE_ETOOBIG);
  cr_expect_eq(w.len, 0);
}

Test(http1_writer, errors_are_sticky) {
  char buf[16];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_field(&w, "A", 1, "1", 1), 0);
  size_t len = w.len;
  cr_expect_eq(ce_h1_write_field(&w, "Long-Name", 9, "long value", 10), CE_ETOOBIG);
  cr_expect_eq(w.len, len);
  /* Even a write that would fit now fails, so the caller checks once. */
  cr_expect_eq(ce_h1_write_head_end(&w), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_field(&w, "B", 1, "2", 1), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_status_line(&w, 200, "", 0), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_request_line(&w, "GET", 3, "/", 1), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_chunk_header(&w, 1), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_chunk_end(&w), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_last_chunk(&w), CE_ETOOBIG);
  ce_h1_head_t h = parse_req("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  cr_expect_eq(ce_h1_write_forwarded_fields(&w, &h, 0), CE_ETOOBIG);
  cr_expect_eq(ce_h1_write_request_head(&w, &h, NULL, 0, 0), CE_ETOOBIG);
  ce_h1_head_t r = parse_resp("HTTP/1.1 200 OK\r\n\r\n");
  cr_expect_eq(ce_h1_write_response_head(&w, &r, 0), CE_ETOOBIG);
  cr_expect_eq(w.len, len);

  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_field(&w, "A B", 3, "1", 1), CE_EINVAL);
  cr_expect_eq(ce_h1_write_field(&w, "A", 1, "1", 1), CE_EINVAL);
  cr_expect_eq(w.len, 0);
}

Test(http1_writer, chunk_framing) {
  static const struct {
    uint64_t size;
    const char *text;
  } cases[] = {
      {1, "1\r\n"},
      {15, "f\r\n"},
      {16, "10\r\n"},
      {0xabcdef, "abcdef\r\n"},
      {UINT64_C(0x7fffffffffffffff), "7fffffffffffffff\r\n"},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    char buf[32];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, buf, sizeof(buf));
    cr_assert_eq(ce_h1_write_chunk_header(&w, cases[i].size), 0);
    expect_written(&w, cases[i].text);
  }
  char buf[32];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_chunk_header(&w, 0), CE_EINVAL);
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_expect_eq(ce_h1_write_chunk_header(&w, UINT64_C(0x8000000000000000)), CE_EINVAL);

  /* A body written with these functions decodes to its payload. */
  char body[64];
  ce_h1_writer_init(&w, body, sizeof(body));
  ce_h1_write_chunk_header(&w, 5);
  memcpy(body + w.len, "hello", 5);
  w.len += 5;
  ce_h1_write_chunk_end(&w);
  ce_h1_write_chunk_header(&w, 17);
  memcpy(body + w.len, " world, chunked!!", 17);
  w.len += 17;
  ce_h1_write_chunk_end(&w);
  cr_assert_eq(ce_h1_write_last_chunk(&w), 0);
  ce_h1_body_t b;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  char out[64];
  size_t out_len = 0, pos = 0;
  int rc;
  do {
    size_t consumed, dlen;
    const char *data;
    rc = ce_h1_body_next(&b, body + pos, w.len - pos, &consumed, &data, &dlen, NULL);
    cr_assert_geq(rc, 0);
    memcpy(out + out_len, data, dlen);
    out_len += dlen;
    pos += consumed;
  } while (rc == 0);
  cr_expect_eq(pos, w.len);
  cr_expect(out_len == 22 && memcmp(out, "hello world, chunked!!", 22) == 0);
}

/* Many fields and Connection options spread over two Connection fields, in
 * other cases and with tabs: exactly the fields named go, the others stay
 * in order (the values are parsed once per head, not once per field). */
Test(http1_writer, connection_options_over_many_fields) {
  static char in[16384];
  size_t n = (size_t)snprintf(in, sizeof(in), "GET / HTTP/1.1\r\nHost: a\r\n");
  for (int i = 0; i < 120; i++)
    n += (size_t)snprintf(in + n, sizeof(in) - n, "X-F%03d: v%d\r\n", i, i);
  n += (size_t)snprintf(in + n, sizeof(in) - n, "Connection: ");
  for (int i = 0; i < 60; i += 3)
    n += (size_t)snprintf(in + n, sizeof(in) - n, "%sx-f%03d", i == 0 ? "" : ",\t", i);
  n += (size_t)snprintf(in + n, sizeof(in) - n, "\r\nConnection: keep-alive");
  for (int i = 60; i < 120; i += 3)
    n += (size_t)snprintf(in + n, sizeof(in) - n, ", X-F%03d", i);
  snprintf(in + n, sizeof(in) - n, "\r\n\r\n");
  ce_h1_head_t h = parse_req(in);

  static char want[16384], buf[16384];
  size_t k = 0;
  for (int i = 0; i < 120; i++)
    if (i % 3 != 0)
      k += (size_t)snprintf(want + k, sizeof(want) - k, "X-F%03d: v%d\r\n", i, i);
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, buf, sizeof(buf));
  cr_assert_eq(ce_h1_write_forwarded_fields(&w, &h, 0), 0);
  expect_written(&w, want);
}

Test(http1_writer, trailer_fields_allowed) {
  const char *no[] = {"Connection", "keep-alive", "Proxy-Connection", "TE", "transfer-encoding", "Trailer",
                      "upgrade", "Proxy-Authorization", "Content-Length", "HOST", "content-type",
                      "Content-Encoding", "content-range", "Authorization", "Cookie", "Set-Cookie",
                      "WWW-Authenticate", "Expect", "Max-Forwards", "Range", "If-None-Match", "Cache-Control",
                      "Location", "Retry-After", "Vary", "Date", "ETag"};
  for (size_t i = 0; i < N_OF(no); i++)
    cr_expect_not(ce_h1_trailer_allowed(no[i], strlen(no[i])), "%s", no[i]);
  const char *yes[] = {"grpc-status", "Grpc-Message", "X-Checksum", "Server-Timing", "Digest", "e",
                       "content-lengthx", "hos", "te2"};
  for (size_t i = 0; i < N_OF(yes); i++)
    cr_expect(ce_h1_trailer_allowed(yes[i], strlen(yes[i])), "%s", yes[i]);
}

static int write_kept(const char *kept, char *out, size_t cap) {
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, cap - 1);
  int rc = ce_h1_write_last_chunk_trailers(&w, kept, kept != NULL ? strlen(kept) : 0);
  out[w.len] = '\0';
  return rc;
}

Test(http1_writer, last_chunk_with_kept_trailers) {
  const char *kept = "X-Checksum:abc\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nHost: evil\r\n"
                     "Grpc-Status:  0 \r\nConnection: close\r\nTrailer: X\r\nSet-Cookie: a=b\r\nE:\r\n";
  char out[512];
  cr_assert_eq(write_kept(kept, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\nX-Checksum: abc\r\nGrpc-Status: 0\r\nE: \r\n\r\n");
  /* What comes out parses again as the end of a chunked body, with the
   * same fields kept. */
  static char again[CE_H1_MAX_TRAILER_BYTES];
  ce_h1_body_t b;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  ce_h1_body_keep_trailers(&b, again);
  size_t used = 0, dl = 0;
  const char *data = NULL, *why = NULL;
  cr_assert_eq(ce_h1_body_next(&b, out, strlen(out), &used, &data, &dl, &why), 1);
  cr_assert_eq(used, strlen(out));
  cr_assert_eq(b.kept, strlen("X-Checksum: abc\r\nGrpc-Status: 0\r\nE: \r\n"));
  /* Nothing kept, or nothing allowed: the plain last chunk. */
  cr_assert_eq(write_kept(NULL, out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\n\r\n");
  cr_assert_eq(write_kept("Host: x\r\ncookie: y\r\n", out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\n\r\n");
  /* A field the writer refuses (never kept by the decoder) is left out. */
  cr_assert_eq(write_kept("A: 1\r\nB\x01: 2\r\nC: \x7f\r\nD: 4\r\n", out, sizeof(out)), CE_OK);
  cr_assert_str_eq(out, "0\r\nA: 1\r\nD: 4\r\n\r\n");
}

Test(http1_writer, last_chunk_with_trailers_is_bounded) {
  /* Too small: nothing written, the error sticks. */
  char out[16];
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, sizeof(out));
  cr_assert_eq(ce_h1_write_last_chunk_trailers(&w, "X-Long: 0123456789\r\n", 20), CE_ETOOBIG);
  cr_assert_eq(w.len, 0);
  cr_assert_eq(ce_h1_write_last_chunk_trailers(&w, NULL, 0), CE_ETOOBIG);
  cr_assert_eq(w.len, 0);
  /* The largest growth (shortest lines, each gaining a space) of a
   * maximal section fits CE_H1_TRAILER_OUT_MAX. */
  static char kept[CE_H1_MAX_TRAILER_BYTES];
  size_t k = 0;
  while (k + 4 <= CE_H1_MAX_TRAILER_BYTES - 2) {
    memcpy(kept + k, "a:\r\n", 4);
    k += 4;
  }
  static char big[CE_H1_TRAILER_OUT_MAX];
  ce_h1_writer_init(&w, big, sizeof(big));
  cr_assert_eq(ce_h1_write_last_chunk_trailers(&w, kept, k), CE_OK);
  cr_assert_eq(w.len, 3 + (k / 4) * 5 + 2);
}
