/* Tests for c_src/http1/parser.c, written from RFC 9112 and RFC 9110: what
 * a strict proxy must accept, what it must refuse (with the phrase it
 * gives), incremental arrival, and the request-smuggling corpus. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "http1/parser.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* A heap copy of exactly n bytes, so ASan catches any read past the end. */
static char *dup_exact(const char *s, size_t n) {
  char *p = malloc(n > 0 ? n : 1);
  cr_assert_not_null(p);
  memcpy(p, s, n);
  return p;
}

static bool span_is(const char *p, size_t n, const char *lit) {
  return p != NULL && strlen(lit) == n && memcmp(p, lit, n) == 0;
}

/* Moves a pointer into the heap copy p to the same offset in s. */
#define REBASE(ptr)                                                              \
  do {                                                                           \
    if ((ptr) != NULL)                                                           \
      (ptr) = s + ((ptr) - p);                                                   \
  } while (0)

static int parse_req_n(const char *s, size_t n, ce_h1_head_t *h, const char **why) {
  char *p = dup_exact(s, n);
  int rc = ce_h1_parse_request(p, n, h, why);
  /* Rebase the head onto the caller's string so it stays usable. */
  if (rc == CE_OK) {
    REBASE(h->method);
    REBASE(h->target);
    REBASE(h->host);
    REBASE(h->authority);
    REBASE(h->path);
    for (size_t i = 0; i < h->field_count; i++) {
      REBASE(h->fields[i].name);
      REBASE(h->fields[i].value);
    }
  }
  free(p);
  return rc;
}

static int parse_req(const char *s, ce_h1_head_t *h, const char **why) {
  return parse_req_n(s, strlen(s), h, why);
}

static int parse_resp_m(const char *s, const char *method, ce_h1_head_t *h,
                        const char **why) {
  size_t n = strlen(s);
  char *p = dup_exact(s, n);
  int rc = ce_h1_parse_response(p, n, method, method ? strlen(method) : 0, h, why);
  if (rc == CE_OK) {
    REBASE(h->reason);
    for (size_t i = 0; i < h->field_count; i++) {
      REBASE(h->fields[i].name);
      REBASE(h->fields[i].value);
    }
  }
  free(p);
  return rc;
}

static int parse_resp(const char *s, ce_h1_head_t *h, const char **why) {
  return parse_resp_m(s, "GET", h, why);
}

/* Two heads parsed from buffers a and b say the same thing (pointers are
 * compared as offsets into their buffers). */
static void expect_same_head(const ce_h1_head_t *x, const char *a, const ce_h1_head_t *y,
                             const char *b, const char *what) {
#define SAME_PTR(f)                                                              \
  cr_expect((x->f == NULL && y->f == NULL) ||                                    \
                (x->f != NULL && y->f != NULL && x->f - a == y->f - b),          \
            "%s: " #f, what)
  cr_expect_eq(x->is_response, y->is_response, "%s", what);
  cr_expect_eq(x->version_minor, y->version_minor, "%s", what);
  SAME_PTR(method);
  cr_expect_eq(x->method_len, y->method_len, "%s", what);
  SAME_PTR(target);
  cr_expect_eq(x->target_len, y->target_len, "%s", what);
  SAME_PTR(host);
  cr_expect_eq(x->host_len, y->host_len, "%s", what);
  cr_expect_eq(x->target_form, y->target_form, "%s", what);
  SAME_PTR(authority);
  cr_expect_eq(x->authority_len, y->authority_len, "%s", what);
  cr_expect_eq(x->path_len, y->path_len, "%s", what);
  cr_expect_eq(x->status, y->status, "%s", what);
  SAME_PTR(reason);
  cr_expect_eq(x->reason_len, y->reason_len, "%s", what);
  cr_assert_eq(x->field_count, y->field_count, "%s", what);
  for (size_t i = 0; i < x->field_count; i++) {
    SAME_PTR(fields[i].name);
    SAME_PTR(fields[i].value);
    cr_expect_eq(x->fields[i].name_len, y->fields[i].name_len, "%s", what);
    cr_expect_eq(x->fields[i].value_len, y->fields[i].value_len, "%s", what);
  }
  cr_expect_eq(x->framing, y->framing, "%s", what);
  cr_expect_eq(x->content_length, y->content_length, "%s", what);
  cr_expect_eq(x->keep_alive, y->keep_alive, "%s", what);
  cr_expect_eq(x->expect_continue, y->expect_continue, "%s", what);
  cr_expect_eq(x->upgrade, y->upgrade, "%s", what);
  cr_expect_eq(x->upgrade_websocket, y->upgrade_websocket, "%s", what);
  cr_expect_eq(x->head_len, y->head_len, "%s", what);
#undef SAME_PTR
}

/*
 * Feeds every prefix of msg (each in an exact-size heap buffer): the ones
 * shorter than the head must give CE_EAGAIN, every longer one CE_OK with the
 * same head. msg may carry bytes after the head (a body, the next message).
 */
static void check_splits(const char *msg, bool response, const char *method) {
  size_t n = strlen(msg);
  ce_h1_head_t whole, part;
  const char *why = NULL;
  int rc = response ? ce_h1_parse_response(msg, n, method, method ? strlen(method) : 0,
                                           &whole, &why)
                    : ce_h1_parse_request(msg, n, &whole, &why);
  cr_assert_eq(rc, CE_OK, "%s: %s", msg, why ? why : "");
  cr_assert_leq(whole.head_len, n);
  for (size_t k = 0; k <= n; k++) {
    char *p = dup_exact(msg, k);
    rc = response ? ce_h1_parse_response(p, k, method, method ? strlen(method) : 0, &part,
                                         &why)
                  : ce_h1_parse_request(p, k, &part, &why);
    if (k < whole.head_len) {
      cr_expect_eq(rc, CE_EAGAIN, "prefix %zu of %s: %d %s", k, msg, rc,
                   rc == CE_EPARSE ? why : "");
    } else {
      cr_expect_eq(rc, CE_OK, "prefix %zu of %s", k, msg);
      if (rc == CE_OK)
        expect_same_head(&whole, msg, &part, p, msg);
    }
    free(p);
  }
}

static void expect_refused(const char *msg, int code, const char *why_want) {
  ce_h1_head_t h;
  memset(&h, 0xa5, sizeof(h));
  const char *why = NULL;
  int rc = parse_req(msg, &h, &why);
  cr_expect_eq(rc, code, "%s: got %d (%s)", msg, rc, why ? why : "-");
  if (why_want != NULL)
    cr_expect(why != NULL && strcmp(why, why_want) == 0, "%s: why %s, wanted %s", msg,
              why ? why : "(null)", why_want);
  unsigned char *raw = (unsigned char *)&h;
  bool untouched = true;
  for (size_t i = 0; i < sizeof(h); i++)
    untouched = untouched && raw[i] == 0xa5;
  cr_expect(untouched, "%s: *out must be untouched on failure", msg);
}

static void expect_resp_refused(const char *msg, const char *method, const char *why_want) {
  ce_h1_head_t h;
  const char *why = NULL;
  int rc = parse_resp_m(msg, method, &h, &why);
  cr_expect_eq(rc, CE_EPARSE, "%s: got %d (%s)", msg, rc, why ? why : "-");
  if (why_want != NULL)
    cr_expect(why != NULL && strcmp(why, why_want) == 0, "%s: why %s, wanted %s", msg,
              why ? why : "(null)", why_want);
}

/* ------------------------------------------------------------------------
 * Requests that parse
 * ------------------------------------------------------------------------ */

Test(http1_request, simple_get) {
  ce_h1_head_t h;
  const char *msg = "GET /index.html?q=1 HTTP/1.1\r\n"
                    "Host: example.com\r\n"
                    "User-Agent:   curl/8.0 \t \r\n"
                    "Accept:*/*\r\n"
                    "X-Empty:\r\n"
                    "\r\n";
  cr_assert_eq(parse_req(msg, &h, NULL), CE_OK);
  cr_expect(!h.is_response);
  cr_expect_eq(h.version_minor, 1);
  cr_expect(span_is(h.method, h.method_len, "GET"));
  cr_expect(span_is(h.target, h.target_len, "/index.html?q=1"));
  cr_expect_eq(h.target_form, CE_H1_TARGET_ORIGIN);
  cr_expect(span_is(h.path, h.path_len, "/index.html?q=1"));
  cr_expect_null(h.authority);
  cr_expect(span_is(h.host, h.host_len, "example.com"));
  cr_assert_eq(h.field_count, 4);
  cr_expect(span_is(h.fields[1].name, h.fields[1].name_len, "User-Agent"));
  cr_expect(span_is(h.fields[1].value, h.fields[1].value_len, "curl/8.0"), "OWS trimmed");
  cr_expect(span_is(h.fields[2].value, h.fields[2].value_len, "*/*"));
  cr_expect_eq(h.fields[3].value_len, 0);
  cr_expect_eq(h.framing, CE_H1_BODY_NONE);
  cr_expect(h.keep_alive);
  cr_expect(!h.expect_continue);
  cr_expect(!h.upgrade);
  cr_expect_eq(h.head_len, strlen(msg));
}

Test(http1_request, every_split_point_of_valid_requests) {
  static const char *msgs[] = {
      "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
      "POST /upload HTTP/1.1\r\nHost: a.example:8080\r\nContent-Length: 5\r\n\r\nhello",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      "GET http://a.example/x?y HTTP/1.1\r\nHost: a.example\r\n\r\n",
      "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
      "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
      "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
      "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
      "GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
      "PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz",
      "GET / HTTP/1.1\r\nHost: a\r\nX: \x80\xff obs-text\r\n\r\nGET / HTTP/1.1\r\n",
  };
  for (size_t i = 0; i < N_OF(msgs); i++)
    check_splits(msgs[i], false, NULL);
}

Test(http1_request, pipelined_requests_parse_one_after_the_other) {
  const char *msg = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
                    "POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyz"
                    "GET /c HTTP/1.1\r\nHost: a\r\n\r\n";
  size_t n = strlen(msg);
  ce_h1_head_t h;
  cr_assert_eq(ce_h1_parse_request(msg, n, &h, NULL), CE_OK);
  cr_expect(span_is(h.target, h.target_len, "/a"));
  cr_assert_eq(h.head_len, strlen("GET /a HTTP/1.1\r\nHost: a\r\n\r\n"));
  size_t off = h.head_len;
  cr_assert_eq(ce_h1_parse_request(msg + off, n - off, &h, NULL), CE_OK);
  cr_expect(span_is(h.target, h.target_len, "/b"));
  cr_expect_eq(h.framing, CE_H1_BODY_LENGTH);
  cr_expect_eq(h.content_length, 3);
  off += h.head_len + 3;
  cr_assert_eq(ce_h1_parse_request(msg + off, n - off, &h, NULL), CE_OK);
  cr_expect(span_is(h.target, h.target_len, "/c"));
  cr_expect_eq(off + h.head_len, n);
}

Test(http1_request, content_length_and_chunked_framing) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0042\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect_eq(h.framing, CE_H1_BODY_LENGTH);
  cr_expect_eq(h.content_length, 42, "leading zeros are 1*DIGIT");
  cr_assert_eq(parse_req("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", &h, NULL),
               CE_OK);
  cr_expect_eq(h.framing, CE_H1_BODY_LENGTH);
  cr_expect_eq(h.content_length, 0);
  cr_assert_eq(parse_req("POST / HTTP/1.1\r\nHost: a\r\n"
                         "Content-Length: 9223372036854775807\r\n\r\n",
                         &h, NULL),
               CE_OK);
  cr_expect_eq(h.content_length, UINT64_C(9223372036854775807));
  static const char *chunked[] = {
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked \t\r\n\r\n",
      /* RFC 9110 §5.6.1: empty list elements are ignored. */
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked,\r\n\r\n",
  };
  for (size_t i = 0; i < N_OF(chunked); i++) {
    const char *why = NULL;
    cr_assert_eq(parse_req(chunked[i], &h, &why), CE_OK, "%s: %s", chunked[i], why);
    cr_expect_eq(h.framing, CE_H1_BODY_CHUNKED, "%s", chunked[i]);
  }
}

Test(http1_request, connection_and_keep_alive) {
  static const struct {
    const char *msg;
    bool keep_alive;
  } cases[] = {
      {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, CLOSE\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo\r\nConnection: Close\r\n\r\n", false},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n", true},
      {"GET / HTTP/1.0\r\n\r\n", false},
      {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true},
      {"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", false},
      {"GET / HTTP/1.0\r\nHost: a\r\nKeep-Alive: timeout=5\r\n\r\n", false},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    ce_h1_head_t h;
    cr_assert_eq(parse_req(cases[i].msg, &h, NULL), CE_OK, "%s", cases[i].msg);
    cr_expect_eq(h.keep_alive, cases[i].keep_alive, "%s", cases[i].msg);
  }
}

Test(http1_request, http10_without_host) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("GET / HTTP/1.0\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.version_minor, 0);
  cr_expect_null(h.host);
  cr_expect_eq(h.field_count, 0);
}

Test(http1_request, absolute_form) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("GET http://Example.COM:8080/p/q?r=1 HTTP/1.1\r\n"
                         "Host: example.com:8080\r\n\r\n",
                         &h, NULL),
               CE_OK);
  cr_expect_eq(h.target_form, CE_H1_TARGET_ABSOLUTE);
  cr_expect(span_is(h.authority, h.authority_len, "Example.COM:8080"));
  cr_expect(span_is(h.path, h.path_len, "/p/q?r=1"));
  cr_assert_eq(parse_req("GET HTTPS://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect(span_is(h.authority, h.authority_len, "a.example"));
  cr_expect_eq(h.path_len, 0, "empty path, sent upstream as /");
  cr_assert_eq(parse_req("GET http://a.example?x=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect(span_is(h.path, h.path_len, "?x=1"));
  cr_assert_eq(parse_req("GET http://[::1]:80/ HTTP/1.0\r\n\r\n", &h, NULL), CE_OK);
  cr_expect(span_is(h.authority, h.authority_len, "[::1]:80"));
  cr_expect_null(h.host);
}

Test(http1_request, authority_and_asterisk_forms) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect_eq(h.target_form, CE_H1_TARGET_AUTHORITY);
  cr_expect(span_is(h.authority, h.authority_len, "a.example:443"));
  cr_expect_null(h.path);
  cr_expect_eq(h.framing, CE_H1_BODY_NONE);
  cr_assert_eq(parse_req("CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: x\r\n"
                         "Content-Length: 0\r\n\r\n",
                         &h, NULL),
               CE_OK);
  cr_expect_eq(h.framing, CE_H1_BODY_NONE, "the tunnel follows the head");
  cr_assert_eq(parse_req("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.target_form, CE_H1_TARGET_ASTERISK);
  cr_expect(span_is(h.path, h.path_len, "*"));
  cr_assert_eq(parse_req("OPTIONS /x HTTP/1.1\r\nHost: a\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.target_form, CE_H1_TARGET_ORIGIN);
}

Test(http1_request, leading_empty_lines_are_skipped) {
  ce_h1_head_t h;
  const char *msg = "\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
  cr_assert_eq(parse_req(msg, &h, NULL), CE_OK);
  cr_expect_eq(h.head_len, strlen(msg));
  cr_expect(span_is(h.method, h.method_len, "GET"));
  cr_expect_eq(ce_h1_parse_request("\r\n", 2, &h, NULL), CE_EAGAIN);
  cr_expect_eq(ce_h1_parse_request("\r", 1, &h, NULL), CE_EAGAIN);
  cr_expect_eq(ce_h1_parse_request("", 0, &h, NULL), CE_EAGAIN);
  cr_expect_eq(ce_h1_parse_request(NULL, 0, &h, NULL), CE_EAGAIN);
  expect_refused("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", CE_EPARSE, "bare LF");
  expect_refused("\r\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", CE_EPARSE, "bare CR");
}

Test(http1_request, upgrade_and_websocket) {
  static const struct {
    const char *msg;
    bool upgrade, websocket;
  } cases[] = {
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
       true, true},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, upgrade\r\n"
       "Upgrade: h2c, WebSocket/13\r\n\r\n",
       true, true},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n", true,
       false},
      /* RFC 9110 §7.8: Upgrade needs the "upgrade" connection option. */
      {"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", false, false},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n", false, false},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade:\r\n\r\n", false, false},
      /* ... and a server MUST ignore it in an HTTP/1.0 request. */
      {"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n", false, false},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    ce_h1_head_t h;
    cr_assert_eq(parse_req(cases[i].msg, &h, NULL), CE_OK, "%s", cases[i].msg);
    cr_expect_eq(h.upgrade, cases[i].upgrade, "%s", cases[i].msg);
    cr_expect_eq(h.upgrade_websocket, cases[i].websocket, "%s", cases[i].msg);
  }
}

Test(http1_request, expect_continue) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect(h.expect_continue);
  /* RFC 9110 §10.1.1: ignored on HTTP/1.0. */
  cr_assert_eq(parse_req("PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", &h, NULL), CE_OK);
  cr_expect(!h.expect_continue);
  cr_assert_eq(parse_req("PUT / HTTP/1.1\r\nHost: a\r\nExpect:\r\n\r\n", &h, NULL), CE_OK);
  cr_expect(!h.expect_continue);
  expect_refused("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", CE_EPARSE,
                 "unsupported expectation");
  expect_refused("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue;x=1\r\n\r\n", CE_EPARSE,
                 "unsupported expectation");
  expect_refused("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, foo\r\n\r\n", CE_EPARSE,
                 "unsupported expectation");
}

Test(http1_request, underscores_are_fine_outside_framing_names) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("GET / HTTP/1.1\r\nHost: a\r\nX_Custom: 1\r\nContent_Type: x\r\n"
                         "Content_Lengths: 1\r\nTransfer_Encodinf: chunked\r\n\r\n",
                         &h, NULL),
               CE_OK);
  cr_expect_eq(h.framing, CE_H1_BODY_NONE);
  cr_expect_eq(h.field_count, 5);
}

Test(http1_request, find_is_case_insensitive_and_resumable) {
  ce_h1_head_t h;
  cr_assert_eq(parse_req("GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-b: 2\r\nX-a: 3\r\n\r\n", &h,
                         NULL),
               CE_OK);
  cr_expect_eq(ce_h1_find(&h, "x-a", 0), 1);
  cr_expect_eq(ce_h1_find(&h, "X-A", 2), 3);
  cr_expect_eq(ce_h1_find(&h, "x-a", 4), -1);
  cr_expect_eq(ce_h1_find(&h, "X-B", -5), 2);
  cr_expect_eq(ce_h1_find(&h, "x", 0), -1);
  cr_expect_eq(ce_h1_find(&h, "x-a-", 0), -1);
  cr_expect_eq(ce_h1_find(&h, "HOST", 0), 0);
}

Test(http1_request, why_may_be_null) {
  ce_h1_head_t h;
  cr_expect_eq(ce_h1_parse_request("GET\n", 4, &h, NULL), CE_EPARSE);
  cr_expect_eq(ce_h1_parse_request(NULL, 3, &h, NULL), CE_EINVAL);
  const char *why = NULL;
  cr_expect_eq(ce_h1_parse_response(NULL, 3, NULL, 0, &h, &why), CE_EINVAL);
  cr_expect_str_eq(why, "no buffer");
}

/* ------------------------------------------------------------------------
 * Requests that are refused
 * ------------------------------------------------------------------------ */

Test(http1_request, start_line_refusals) {
  static const struct {
    const char *msg, *why;
  } cases[] = {
      /* RFC 9113 §3.4 */
      {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http/2 preface on an http/1.1 connection"},
      /* RFC 9112 §2.3: exactly the versions we implement, case-sensitive. */
      {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", "unsupported http version"},
      {"GET / HTTP/1.2\r\nHost: a\r\n\r\n", "unsupported http version"},
      {"GET / HTTP/0.9\r\nHost: a\r\n\r\n", "unsupported http version"},
      {"GET / http/1.1\r\nHost: a\r\n\r\n", "malformed http version"},
      {"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", "malformed http version"},
      {"GET / HTTP/1.10\r\nHost: a\r\n\r\n", "malformed http version"},
      {"GET / HTTP/1\r\nHost: a\r\n\r\n", "malformed http version"},
      {"GET / extra HTTP/1.1\r\nHost: a\r\n\r\n", "malformed http version"},
      /* RFC 9112 §3: exactly one SP between the three parts. */
      {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request line"},
      {"GET /  HTTP/1.1\r\nHost: a\r\n\r\n", "malformed http version"},
      {"GET /\r\nHost: a\r\n\r\n", "malformed request line"},
      {"GET\r\nHost: a\r\n\r\n", "malformed method"},
      {" GET / HTTP/1.1\r\nHost: a\r\n\r\n", "malformed method"},
      {"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", "malformed method"},
      {"ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF / HTTP/1.1\r\nHost: a\r\n\r\n", "method too long"},
      {"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", "malformed method"},
      {"GET /\t HTTP/1.1\r\nHost: a\r\n\r\n", "invalid byte in request-target"},
      {"GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n", "invalid byte in request-target"},
      {"GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n", "invalid byte in request-target"},
      {"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", "invalid byte in request-target"},
      {"GET /a#frag HTTP/1.1\r\nHost: a\r\n\r\n", "fragment in request-target"},
      /* RFC 9112 §3.2: the four forms, each with its methods. */
      {"GET * HTTP/1.1\r\nHost: a\r\n\r\n", "asterisk-form outside OPTIONS"},
      {"GET a.example:443 HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request-target"},
      {"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request-target"},
      {"GET http:/a HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request-target"},
      {"GET http:// HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request-target"},
      {"GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n", "malformed authority in request-target"},
      {"GET http://a:/x HTTP/1.1\r\nHost: a:\r\n\r\n", "malformed authority in request-target"},
      {"GET http://a:99999/ HTTP/1.1\r\nHost: a\r\n\r\n",
       "malformed authority in request-target"},
      {"GET http://user@a/ HTTP/1.1\r\nHost: a\r\n\r\n", "userinfo in request-target"},
      {"GET http://a/ HTTP/1.1\r\nHost: b\r\n\r\n", "host differs from the request-target"},
      {"GET http://a:80/ HTTP/1.1\r\nHost: a\r\n\r\n", "host differs from the request-target"},
      {"CONNECT /x HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT needs an authority-form target"},
      {"CONNECT a.example HTTP/1.1\r\nHost: a\r\n\r\n",
       "CONNECT needs an authority-form target"},
      {"CONNECT http://a:443/ HTTP/1.1\r\nHost: a\r\n\r\n",
       "CONNECT needs an authority-form target"},
      {"CONNECT user@a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
       "CONNECT needs an authority-form target"},
      {"CONNECT [::1:443 HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT needs an authority-form target"},
      {"CONNECT []:443 HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT needs an authority-form target"},
      {"CONNECT [::1]x HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT needs an authority-form target"},
      {"CONNECT a:44x HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT needs an authority-form target"},
      {"CONNECT a:443 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
       "body on CONNECT"},
      {"CONNECT a:443 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
       "body on CONNECT"},
  };
  for (size_t i = 0; i < N_OF(cases); i++)
    expect_refused(cases[i].msg, CE_EPARSE, cases[i].why);
}

Test(http1_request, field_line_refusals) {
  static const struct {
    const char *msg, *why;
  } cases[] = {
      /* RFC 9112 §2.2: CRLF only. */
      {"GET / HTTP/1.1\nHost: a\r\n\r\n", "bare LF"},
      {"GET / HTTP/1.1\r\nHost: a\n\r\n", "bare LF"},
      {"GET / HTTP/1.1\r\nHost: a\r\n\n", "bare LF"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\nb\r\n\r\n", "bare LF"},
      {"GET / HTTP/1.1\rHost: a\r\n\r\n", "bare CR"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", "bare CR"},
      {"GET / HTTP/1.1\r\nHost: a\r\r\n\r\n", "bare CR"},
      {"GET / HTTP/1.1\r\nHost: a\r\n\r\r\n", "bare CR"},
      /* RFC 9112 §2.2 and §5.2. */
      {"GET / HTTP/1.1\r\n Host: a\r\n\r\n", "whitespace after the start line"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", "obs-fold"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\t2\r\n\r\n", "obs-fold"},
      /* RFC 9112 §5.1 */
      {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "whitespace before colon"},
      {"GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", "whitespace before colon"},
      /* RFC 9110 §5.1: field-name = token. */
      {"GET / HTTP/1.1\r\nHost: a\r\nX[1]: y\r\n\r\n", "invalid byte in field name"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX\x80: y\r\n\r\n", "invalid byte in field name"},
      {"GET / HTTP/1.1\r\nHost: a\r\n: y\r\n\r\n", "empty field name"},
      {"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", "field without a colon"},
      /* RFC 9110 §5.5 */
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n", "control byte in field value"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fz\r\n\r\n", "control byte in field value"},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: \x1b[31m\r\n\r\n", "control byte in field value"},
      /* Connection and Upgrade lists must be what their grammar says. */
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: \"close\"\r\n\r\n", "malformed connection"},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: a b\r\n\r\n", "malformed connection"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: Content-Length\r\n\r\n",
       "connection names content-length"},
      {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: web socket\r\n\r\n",
       "malformed upgrade"},
      {"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket/\r\n\r\n", "malformed upgrade"},
      {"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: /13\r\n\r\n", "malformed upgrade"},
  };
  for (size_t i = 0; i < N_OF(cases); i++)
    expect_refused(cases[i].msg, CE_EPARSE, cases[i].why);
  /* A NUL inside a value (strlen would stop at it, so lengths are given). */
  static const char nul[] = "GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n";
  ce_h1_head_t h;
  const char *why = NULL;
  cr_expect_eq(parse_req_n(nul, sizeof(nul) - 1, &h, &why), CE_EPARSE);
  cr_expect_str_eq(why, "NUL in field value");
}

Test(http1_request, host_refusals) {
  static const struct {
    const char *msg, *why;
  } cases[] = {
      /* RFC 9112 §3.2 */
      {"GET / HTTP/1.1\r\n\r\n", "missing host"},
      {"GET / HTTP/1.1\r\nX: y\r\n\r\n", "missing host"},
      {"GET http://a/ HTTP/1.1\r\n\r\n", "missing host"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "duplicate host"},
      {"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", "duplicate host"},
      {"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", "duplicate host"},
      {"GET / HTTP/1.1\r\nHost:\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a,b\r\n\r\n", NULL},
      {"GET / HTTP/1.1\r\nHost: a:\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a:123456\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a:65536\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a:-1\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: :80\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a?b\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: a\\b\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: [::1/8]\r\n\r\n", "invalid host"},
      {"GET / HTTP/1.1\r\nHost: caf\xc3\xa9\r\n\r\n", "invalid host"},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    if (cases[i].why != NULL) {
      expect_refused(cases[i].msg, CE_EPARSE, cases[i].why);
    } else {
      /* "a,b" is a valid reg-name (sub-delims); the DNS question is the
       * policy engine's. */
      ce_h1_head_t h;
      cr_expect_eq(parse_req(cases[i].msg, &h, NULL), CE_OK, "%s", cases[i].msg);
    }
  }
  static const char *ok[] = {"a", "a.example:8080", "[::1]", "[::1]:443", "127.0.0.1:1",
                             "xn--caf-dma.example", "a:0"};
  for (size_t i = 0; i < N_OF(ok); i++) {
    char msg[128];
    snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", ok[i]);
    ce_h1_head_t h;
    cr_assert_eq(parse_req(msg, &h, NULL), CE_OK, "%s", msg);
    cr_expect(span_is(h.host, h.host_len, ok[i]));
  }
}

Test(http1_request, framing_refusals) {
  static const struct {
    const char *msg, *why;
  } cases[] = {
      /* RFC 9112 §6.1 and §6.3 item 3 */
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
       "content-length with transfer-encoding"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
       "content-length with transfer-encoding"},
      {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "transfer-encoding on http/1.0"},
      {"POST / HTTP/1.0\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
       "transfer-encoding on http/1.0"},
      /* §6.3 item 4, narrowed to exactly one "chunked". */
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n",
       "parameters on chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n",
       "malformed transfer-encoding"},
      /* RFC 9110 §8.6 */
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
       "duplicate content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
       "duplicate content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1.0\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n",
       "content-length too large"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n",
       "content-length too large"},
  };
  for (size_t i = 0; i < N_OF(cases); i++)
    expect_refused(cases[i].msg, CE_EPARSE, cases[i].why);
}

/* The usual request-smuggling probes (TE.CL, CL.TE, TE.TE obfuscations). */
Test(http1_request, smuggling_corpus) {
  static const struct {
    const char *msg, *why;
  } cases[] = {
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n"
       "0\r\n\r\nG",
       "content-length with transfer-encoding"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
       "8\r\nSMUGGLED\r\n0\r\n\r\n",
       "content-length with transfer-encoding"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
       "whitespace before colon"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
       "Transfer-Encoding: x\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
       "Transfer-Encoding: chunked\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
       "Transfer-encoding: cow\r\n\r\n",
       "transfer-encoding other than chunked"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", "obs-fold"},
      {"POST / HTTP/1.1\r\nHost: a\r\n Transfer-Encoding: chunked\r\n\r\n", "obs-fold"},
      {"POST / HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: a\r\n\r\n",
       "whitespace after the start line"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\n\r\n", "bare LF"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0b" "chunked\r\n\r\n",
       "control byte in field value"},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\n\r\n",
       "underscore in a framing field name"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent_Length: 5\r\n\r\n",
       "underscore in a framing field name"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\n", "invalid content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\n",
       "duplicate content-length"},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n", "whitespace before colon"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "duplicate host"},
  };
  for (size_t i = 0; i < N_OF(cases); i++)
    expect_refused(cases[i].msg, CE_EPARSE, cases[i].why);
}

Test(http1_request, early_refusal_before_the_head_is_complete) {
  ce_h1_head_t h;
  const char *why = NULL;
  /* A TLS ClientHello on the plain-text port. */
  static const char tls[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
  cr_expect_eq(ce_h1_parse_request(tls, sizeof(tls) - 1, &h, &why), CE_EPARSE);
  cr_expect_str_eq(why, "malformed method");
  cr_expect_eq(ce_h1_parse_request("GE(", 3, &h, &why), CE_EPARSE);
  cr_expect_eq(ce_h1_parse_request(" GET", 4, &h, &why), CE_EPARSE);
  cr_expect_eq(ce_h1_parse_request("GET / HTTP/1.1\r\nX: a\rb", 23, &h, &why), CE_EPARSE);
  cr_expect_str_eq(why, "bare CR");
  cr_expect_eq(ce_h1_parse_request("GET / HTTP/1.1\nX", 16, &h, &why), CE_EPARSE);
  cr_expect_str_eq(why, "bare LF");
  /* Valid prefixes stay CE_EAGAIN. */
  cr_expect_eq(ce_h1_parse_request("GET", 3, &h, &why), CE_EAGAIN);
  cr_expect_eq(ce_h1_parse_request("GET /", 5, &h, &why), CE_EAGAIN);
  cr_expect_eq(ce_h1_parse_request("GET / HTTP/1.1\r", 15, &h, &why), CE_EAGAIN);
}

/* ------------------------------------------------------------------------
 * Limits
 * ------------------------------------------------------------------------ */

/* A request head of exactly total bytes: a start line, Host, and one big
 * field padded to size. */
static char *head_of_size(size_t total) {
  static const char start[] = "GET / HTTP/1.1\r\nHost: a\r\nX: ";
  size_t fixed = strlen(start) + 4; /* value's CRLF and the final CRLF */
  cr_assert_geq(total, fixed + 1);
  char *p = malloc(total);
  cr_assert_not_null(p);
  memcpy(p, start, strlen(start));
  memset(p + strlen(start), 'v', total - fixed);
  memcpy(p + total - 4, "\r\n\r\n", 4);
  return p;
}

Test(http1_limits, head_bytes) {
  ce_h1_head_t h;
  const char *why = NULL;
  char *p = head_of_size(CE_H1_MAX_HEAD_BYTES);
  cr_expect_eq(ce_h1_parse_request(p, CE_H1_MAX_HEAD_BYTES, &h, &why), CE_OK);
  cr_expect_eq(h.head_len, CE_H1_MAX_HEAD_BYTES);
  free(p);

  p = head_of_size(CE_H1_MAX_HEAD_BYTES + 1);
  cr_expect_eq(ce_h1_parse_request(p, CE_H1_MAX_HEAD_BYTES + 1, &h, &why), CE_ETOOBIG);
  cr_expect_str_eq(why, "head too large");
  /* Refused as soon as the limit is reached, without waiting for more. */
  cr_expect_eq(ce_h1_parse_request(p, CE_H1_MAX_HEAD_BYTES, &h, &why), CE_ETOOBIG);
  cr_expect_eq(ce_h1_parse_request(p, CE_H1_MAX_HEAD_BYTES - 1, &h, &why), CE_EAGAIN);
  free(p);

  /* Leading empty lines count, and there may be only a few. */
  static const char eight[] = "\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
  cr_expect_eq(ce_h1_parse_request(eight, sizeof(eight) - 1, &h, &why), CE_OK);
  cr_expect_eq(h.head_len, sizeof(eight) - 1);
  expect_refused("\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", CE_EPARSE,
                 "too many empty lines before the request line");
  size_t n = CE_H1_MAX_HEAD_BYTES;
  p = malloc(n);
  cr_assert_not_null(p);
  for (size_t i = 0; i + 1 < n; i += 2)
    memcpy(p + i, "\r\n", 2);
  cr_expect_eq(ce_h1_parse_request(p, n, &h, &why), CE_EPARSE);
  free(p);
}

static size_t fields_msg(char *buf, size_t cap, size_t fields, bool response) {
  size_t n = (size_t)snprintf(buf, cap, "%s", response ? "HTTP/1.1 200 OK\r\n"
                                                        : "GET / HTTP/1.1\r\nHost: a\r\n");
  for (size_t i = response ? 0 : 1; i < fields; i++)
    n += (size_t)snprintf(buf + n, cap - n, "X-%zu: %zu\r\n", i, i);
  n += (size_t)snprintf(buf + n, cap - n, "\r\n");
  return n;
}

Test(http1_limits, field_count) {
  static char buf[16384];
  ce_h1_head_t h;
  const char *why = NULL;
  size_t n = fields_msg(buf, sizeof(buf), CE_H1_MAX_FIELDS, false);
  cr_expect_eq(ce_h1_parse_request(buf, n, &h, &why), CE_OK);
  cr_expect_eq(h.field_count, CE_H1_MAX_FIELDS);
  n = fields_msg(buf, sizeof(buf), CE_H1_MAX_FIELDS + 1, false);
  cr_expect_eq(ce_h1_parse_request(buf, n, &h, &why), CE_ETOOBIG);
  cr_expect_str_eq(why, "too many fields");
  n = fields_msg(buf, sizeof(buf), CE_H1_MAX_FIELDS + 1, true);
  cr_expect_eq(ce_h1_parse_response(buf, n, "GET", 3, &h, &why), CE_ETOOBIG);
  /* Refused as soon as the line after the last allowed one is complete,
   * before the head ends, so tiny lines cannot make each call expensive. */
  n = fields_msg(buf, sizeof(buf), CE_H1_MAX_FIELDS + 1, false);
  cr_expect_eq(ce_h1_parse_request(buf, n - 2, &h, &why), CE_ETOOBIG);
  cr_expect_str_eq(why, "too many fields");
  size_t ok_len = fields_msg(buf, sizeof(buf), CE_H1_MAX_FIELDS, false);
  cr_expect_eq(ce_h1_parse_request(buf, ok_len - 2, &h, &why), CE_EAGAIN);
}

/* ------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------ */

Test(http1_response, status_line) {
  ce_h1_head_t h;
  cr_assert_eq(parse_resp("HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabc", &h, NULL),
               CE_OK);
  cr_expect(h.is_response);
  cr_expect_eq(h.status, 404);
  cr_expect(span_is(h.reason, h.reason_len, "Not Found"));
  cr_expect_eq(h.framing, CE_H1_BODY_LENGTH);
  cr_expect_eq(h.content_length, 3);
  cr_expect(h.keep_alive);
  cr_expect_null(h.method);
  /* RFC 9112 §4: the reason may be empty, the SP before it may not. */
  cr_assert_eq(parse_resp("HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.reason_len, 0);
  cr_assert_eq(parse_resp("HTTP/1.0 200 OK \xe2\x9c\x93\t\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.reason_len, 7);
  cr_expect_eq(h.version_minor, 0);
  cr_assert_eq(parse_resp("HTTP/1.1 999 Custom\r\nContent-Length: 0\r\n\r\n", &h, NULL), CE_OK);
  cr_expect_eq(h.status, 999);
  static const struct {
    const char *msg, *why;
  } bad[] = {
      {"HTTP/1.1 200\r\n\r\n", "malformed status line"},
      {"HTTP/1.1  200 OK\r\n\r\n", "malformed status line"},
      {"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line"},
      {"HTTP/1.1 20 OK\r\n\r\n", "malformed status line"},
      {"HTTP/1.1 099 OK\r\n\r\n", "malformed status code"},
      {"HTTP/1.1 2x0 OK\r\n\r\n", "malformed status code"},
      {"HTTP/1.1 -20 OK\r\n\r\n", "malformed status code"},
      {"HTTP/1.1 200 O\x01K\r\n\r\n", "control byte in reason phrase"},
      {"HTTP/1.1 200 O\x7fK\r\n\r\n", "control byte in reason phrase"},
      {"HTTP/2.0 200 OK\r\n\r\n", "unsupported http version"},
      {"HTTP/1.10 200 OK\r\n\r\n", "malformed http version"},
      {"http/1.1 200 OK\r\n\r\n", "malformed status line"},
      {"HTTP/1.1\r\n\r\n", "malformed status line"},
      {"HTTP/\r\n\r\n", "malformed status line"},
      {"\r\nHTTP/1.1 200 OK\r\n\r\n", "empty line before the status line"},
      {"HTTP/1.1 200 OK\r\nX : y\r\n\r\n", "whitespace before colon"},
      {"HTTP/1.1 200 OK\nX: y\r\n\r\n", "bare LF"},
      {"HTTP/1.1 200 OK\r\nX: y\r\n z\r\n\r\n", "obs-fold"},
  };
  for (size_t i = 0; i < N_OF(bad); i++)
    expect_resp_refused(bad[i].msg, "GET", bad[i].why);
  const char *why = NULL;
  cr_expect_eq(ce_h1_parse_response("HTTX", 4, "GET", 3, &h, &why), CE_EPARSE);
  cr_expect_str_eq(why, "malformed status line");
  cr_expect_eq(ce_h1_parse_response("HTTP/1.", 7, "GET", 3, &h, &why), CE_EAGAIN);
}

Test(http1_response, framing_in_rfc9112_6_3_order) {
  static const struct {
    const char *msg, *method;
    ce_h1_framing_t framing;
    uint64_t cl;
    bool keep_alive;
  } cases[] = {
      /* item 1: HEAD, 1xx, 204, 304 have no body whatever the fields say. */
      {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "HEAD", CE_H1_BODY_NONE, 10, true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "HEAD", CE_H1_BODY_NONE,
       0, true},
      {"HTTP/1.1 200 OK\r\n\r\n", "HEAD", CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 100 Continue\r\n\r\n", "POST", CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", "GET",
       CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 204 No Content\r\n\r\n", "DELETE", CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", "GET", CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 304 Not Modified\r\nContent-Length: 123\r\n\r\n", "GET", CE_H1_BODY_NONE, 123,
       true},
      /* item 2: a 2xx to CONNECT is a tunnel. */
      {"HTTP/1.1 200 Connection established\r\n\r\n", "CONNECT", CE_H1_BODY_NONE, 0, true},
      {"HTTP/1.1 407 Proxy Auth\r\nContent-Length: 2\r\n\r\n", "CONNECT", CE_H1_BODY_LENGTH, 2,
       true},
      /* item 4 */
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", CE_H1_BODY_CHUNKED, 0,
       true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "GET",
       CE_H1_BODY_CHUNKED, 0, true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
       "GET", CE_H1_BODY_CHUNKED, 0, true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "GET", CE_H1_BODY_CLOSE,
       0, false},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n", "GET", CE_H1_BODY_CLOSE, 0,
       false},
      /* item 6 */
      {"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n", "GET", CE_H1_BODY_LENGTH, 7, true},
      {"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n", NULL, CE_H1_BODY_LENGTH, 7, true},
      {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "GET",
       CE_H1_BODY_LENGTH, 0, false},
      /* item 8 */
      {"HTTP/1.1 200 OK\r\n\r\n", "GET", CE_H1_BODY_CLOSE, 0, false},
      {"HTTP/1.0 200 OK\r\n\r\n", "GET", CE_H1_BODY_CLOSE, 0, false},
      {"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", "GET", CE_H1_BODY_LENGTH, 1, false},
      {"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\n", "GET",
       CE_H1_BODY_LENGTH, 1, true},
      /* a method is case-sensitive: "head" is not HEAD (RFC 9110 §9.1). */
      {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", "head", CE_H1_BODY_LENGTH, 1, true},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    ce_h1_head_t h;
    const char *why = NULL;
    cr_assert_eq(parse_resp_m(cases[i].msg, cases[i].method, &h, &why), CE_OK, "%s: %s",
                 cases[i].msg, why);
    cr_expect_eq(h.framing, cases[i].framing, "%s (%s)", cases[i].msg,
                 cases[i].method ? cases[i].method : "-");
    cr_expect_eq(h.content_length, cases[i].cl, "%s", cases[i].msg);
    cr_expect_eq(h.keep_alive, cases[i].keep_alive, "%s", cases[i].msg);
  }
}

Test(http1_response, every_split_point_of_valid_responses) {
  static const struct {
    const char *msg, *method;
  } msgs[] = {
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", "GET"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "HEAD"},
      {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "POST"},
      {"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
       "\x81\x05hello",
       "GET"},
      {"HTTP/1.1 204 \r\n\r\n", "GET"},
      {"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nbody until close", "GET"},
  };
  for (size_t i = 0; i < N_OF(msgs); i++)
    check_splits(msgs[i].msg, true, msgs[i].method);
}

Test(http1_response, switching_protocols) {
  ce_h1_head_t h;
  cr_assert_eq(parse_resp("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                          "Upgrade: websocket\r\nSec-WebSocket-Accept: x\r\n\r\n",
                          &h, NULL),
               CE_OK);
  cr_expect_eq(h.status, 101);
  cr_expect_eq(h.framing, CE_H1_BODY_NONE);
  cr_expect(h.upgrade);
  cr_expect(h.upgrade_websocket);
  /* RFC 9110 §15.2.2 */
  expect_resp_refused("HTTP/1.1 101 Switching Protocols\r\n\r\n", "GET", "101 without upgrade");
  expect_resp_refused("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "GET",
                      "101 without upgrade");
}

Test(http1_response, refusals) {
  static const struct {
    const char *msg, *method, *why;
  } cases[] = {
      {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "GET",
       "content-length with transfer-encoding"},
      {"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
       "GET", "content-length with transfer-encoding"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "HEAD",
       "content-length with transfer-encoding"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "GET",
       "chunked applied twice"},
      {"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET",
       "transfer-encoding on http/1.0"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "GET",
       "duplicate content-length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", "GET", "invalid content-length"},
      {"HTTP/1.1 304 Not Modified\r\nContent-Length: x\r\n\r\n", "GET",
       "invalid content-length"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;x=1\r\n\r\n", "GET",
       "parameters on chunked"},
      {"HTTP/1.1 200 OK\r\nTransfer_Encoding: chunked\r\n\r\n", "GET",
       "underscore in a framing field name"},
      {"HTTP/1.1 200 OK\r\nConnection: close, content-length\r\nContent-Length: 1\r\n\r\n",
       "GET", "connection names content-length"},
  };
  for (size_t i = 0; i < N_OF(cases); i++)
    expect_resp_refused(cases[i].msg, cases[i].method, cases[i].why);
  /* Host and Expect mean nothing in a response. */
  ce_h1_head_t h;
  cr_expect_eq(parse_resp("HTTP/1.1 200 OK\r\nHost: a\r\nHost: b\r\nExpect: x\r\n"
                          "Content-Length: 0\r\n\r\n",
                          &h, NULL),
               CE_OK);
}

/* ------------------------------------------------------------------------
 * Bodies
 * ------------------------------------------------------------------------ */

typedef struct {
  int rc;
  char payload[8192];
  size_t payload_len;
  size_t used;        /* bytes of the input the body took */
  const char *why;
} decoded_t;

/* Decodes in[0..len) handed over in pieces of step bytes, each piece in
 * its own exact-size heap buffer, checking the contract of every call. */
static void decode(decoded_t *d, ce_h1_framing_t framing, uint64_t cl, const char *in,
                   size_t len, size_t step) {
  ce_h1_body_t b;
  ce_h1_body_init(&b, framing, cl);
  memset(d, 0, sizeof(*d));
  size_t off = 0;
  for (;;) {
    size_t k = len - off < step ? len - off : step;
    char *piece = dup_exact(in + off, k);
    size_t pos = 0;
    int rc;
    do {
      size_t consumed = 99999;
      const char *data = NULL;
      size_t dlen = 99999;
      rc = ce_h1_body_next(&b, piece + pos, k - pos, &consumed, &data, &dlen, &d->why);
      if (rc < 0) {
        cr_expect_eq(dlen, 0);
        cr_expect_leq(consumed, k - pos);
        pos += consumed;
        break;
      }
      cr_assert_leq(consumed, k - pos);
      cr_assert_leq(dlen, consumed);
      if (dlen > 0) {
        cr_assert(data >= piece + pos && data + dlen <= piece + pos + consumed);
        cr_assert_leq(d->payload_len + dlen, sizeof(d->payload));
        memcpy(d->payload + d->payload_len, data, dlen);
        d->payload_len += dlen;
      }
      if (rc == 0 && k - pos > 0)
        cr_assert_gt(consumed, 0, "a 0 return with input must consume");
      pos += consumed;
    } while (rc == 0 && pos < k);
    free(piece);
    if (rc != 0 || off + k >= len) {
      d->rc = rc;
      d->used = off + pos;
      return;
    }
    off += k;
  }
}

static void expect_decodes(const char *in, size_t len, const char *payload, size_t used) {
  size_t steps[] = {1, 2, 3, 5, 7, 13, len > 0 ? len : 1};
  for (size_t i = 0; i < N_OF(steps); i++) {
    decoded_t d;
    decode(&d, CE_H1_BODY_CHUNKED, 0, in, len, steps[i]);
    cr_expect_eq(d.rc, 1, "step %zu: %d %s", steps[i], d.rc, d.why ? d.why : "");
    cr_expect_eq(d.payload_len, strlen(payload), "step %zu", steps[i]);
    cr_expect(d.payload_len == strlen(payload) && memcmp(d.payload, payload, d.payload_len) == 0,
              "step %zu payload", steps[i]);
    cr_expect_eq(d.used, used, "step %zu: used %zu", steps[i], d.used);
  }
}

Test(http1_body, chunked_with_extensions_and_trailers) {
  const char *in = "5;a=b\r\nhello\r\n"
                   "6 ; x = \"q\\\"v;,\" ;y\t;z=tok\r\n world\r\n"
                   "A\r\n0123456789\r\n"
                   "0001\r\n!\r\n"
                   "0;last\r\n"
                   "Trailer-A: x \t\r\nB:\r\nC:\xff\r\n"
                   "\r\n"
                   "GET / HTTP/1.1\r\n";
  expect_decodes(in, strlen(in), "hello world0123456789!",
                 strlen(in) - strlen("GET / HTTP/1.1\r\n"));
}

Test(http1_body, chunked_minimal_and_empty_trailer) {
  expect_decodes("0\r\n\r\n", 5, "", 5);
  expect_decodes("0\r\n\r\nxyz", 8, "", 5);
  expect_decodes("1\r\na\r\n0\r\n\r\n", 11, "a", 11);
}

Test(http1_body, chunked_refusals) {
  static const struct {
    const char *in;
    int rc;
    const char *why;
  } cases[] = {
      {"0x5\r\nhello\r\n0\r\n\r\n", CE_EPARSE, "malformed chunk size"},
      {"-5\r\nhello\r\n0\r\n\r\n", CE_EPARSE, "malformed chunk size"},
      {"+5\r\nhello\r\n0\r\n\r\n", CE_EPARSE, "malformed chunk size"},
      {" 5\r\nhello\r\n0\r\n\r\n", CE_EPARSE, "malformed chunk size"},
      {"\r\n", CE_EPARSE, "malformed chunk size"},
      {"g\r\n", CE_EPARSE, "malformed chunk size"},
      {"5g\r\n", CE_EPARSE, "malformed chunk size"},
      {"5\n", CE_EPARSE, "bare LF"},
      {"\n", CE_EPARSE, "bare LF"},
      {"5;ext\n", CE_EPARSE, "bare LF"},
      {"5;e=\"a\n", CE_EPARSE, "bare LF"},
      {"5\rx", CE_EPARSE, "bare CR"},
      {"00000000000000005\r\n", CE_EPARSE, "chunk size too long"},
      {"8000000000000000\r\n", CE_EPARSE, "chunk size too large"},
      {"ffffffffffffffff\r\n", CE_EPARSE, "chunk size too large"},
      {"5 \r\nhello\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;\r\nhello\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5; \r\nhello\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;=x\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a =\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a \r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a b\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=b c\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=\"b\"c\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=\"b\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=\"\x01\"\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=\"\\\x01\"\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a=(b)\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5 x\r\n", CE_EPARSE, "malformed chunk extension"},
      {"5;a\x80\r\n", CE_EPARSE, "malformed chunk extension"},
      /* RFC 9112 §7.1: CRLF after the data. */
      {"5\r\nhelloX\r\n0\r\n\r\n", CE_EPARSE, "missing CRLF after chunk data"},
      {"5\r\nhello\n0\r\n\r\n", CE_EPARSE, "bare LF"},
      {"5\r\nhello\rX0\r\n\r\n", CE_EPARSE, "missing CRLF after chunk data"},
      {"3\r\nhello\r\n0\r\n\r\n", CE_EPARSE, "missing CRLF after chunk data"},
      /* Trailers follow the field rules of RFC 9112 §5. */
      {"0\r\n x: y\r\n\r\n", CE_EPARSE, "obs-fold"},
      {"0\r\nX: y\r\n\tz\r\n\r\n", CE_EPARSE, "obs-fold"},
      {"0\r\nX : y\r\n\r\n", CE_EPARSE, "whitespace before colon"},
      {"0\r\nX\r\n\r\n", CE_EPARSE, "field without a colon"},
      {"0\r\nX\n\r\n", CE_EPARSE, "field without a colon"},
      {"0\r\n: y\r\n\r\n", CE_EPARSE, "empty field name"},
      {"0\r\nX(: y\r\n\r\n", CE_EPARSE, "invalid byte in field name"},
      {"0\r\n(X: y\r\n\r\n", CE_EPARSE, "invalid byte in field name"},
      {"0\r\nX: a\x01\r\n\r\n", CE_EPARSE, "control byte in field value"},
      {"0\r\nX: y\n\r\n", CE_EPARSE, "bare LF"},
      {"0\r\nX: y\rZ\r\n", CE_EPARSE, "bare CR"},
      {"0\r\n\n", CE_EPARSE, "bare LF"},
      {"0\r\n\rX", CE_EPARSE, "bare CR"},
  };
  for (size_t i = 0; i < N_OF(cases); i++) {
    size_t len = strlen(cases[i].in);
    decoded_t one, bytes;
    decode(&one, CE_H1_BODY_CHUNKED, 0, cases[i].in, len, len);
    decode(&bytes, CE_H1_BODY_CHUNKED, 0, cases[i].in, len, 1);
    cr_expect_eq(one.rc, cases[i].rc, "%zu %s: %d", i, cases[i].in, one.rc);
    cr_expect(one.why != NULL && strcmp(one.why, cases[i].why) == 0, "%zu: why %s, not %s", i,
              one.why ? one.why : "(null)", cases[i].why);
    cr_expect_eq(bytes.rc, one.rc, "%zu: same verdict byte by byte", i);
    cr_expect_eq(bytes.used, one.used, "%zu: same failing offset", i);
    cr_expect_eq(bytes.payload_len, one.payload_len, "%zu", i);
  }
  /* A NUL in a trailer value. */
  static const char nul[] = "0\r\nX: a\0b\r\n\r\n";
  decoded_t d;
  decode(&d, CE_H1_BODY_CHUNKED, 0, nul, sizeof(nul) - 1, 1);
  cr_expect_eq(d.rc, CE_EPARSE);
  cr_expect_str_eq(d.why, "NUL in field value");
}

Test(http1_body, chunk_size_bounds) {
  ce_h1_body_t b;
  size_t consumed;
  const char *data;
  size_t dlen;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  cr_expect_eq(ce_h1_body_next(&b, "7fffffffffffffff\r\n", 18, &consumed, &data, &dlen, NULL), 0);
  cr_expect_eq(consumed, 18);
  cr_expect_eq(b.remaining, UINT64_C(0x7fffffffffffffff));
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  cr_expect_eq(ce_h1_body_next(&b, "000000000000000F\r\n", 18, &consumed, &data, &dlen, NULL), 0);
  cr_expect_eq(b.remaining, 15);
}

Test(http1_body, bounded_chunk_lines_and_trailers) {
  static char in[32768];
  const char *why = NULL;
  decoded_t d;
  /* A chunk-size line of exactly CE_H1_MAX_CHUNK_LINE_BYTES is fine. */
  size_t n = 0;
  in[n++] = '1';
  in[n++] = ';';
  memset(in + n, 'e', CE_H1_MAX_CHUNK_LINE_BYTES - 2);
  n += CE_H1_MAX_CHUNK_LINE_BYTES - 2;
  memcpy(in + n, "\r\nx\r\n0\r\n\r\n", 10);
  decode(&d, CE_H1_BODY_CHUNKED, 0, in, n + 10, n + 10);
  cr_expect_eq(d.rc, 1, "%s", d.why ? d.why : "");
  cr_expect_eq(d.payload_len, 1);
  /* One more byte is not. */
  memset(in + 2, 'e', CE_H1_MAX_CHUNK_LINE_BYTES - 1);
  n = CE_H1_MAX_CHUNK_LINE_BYTES + 1;
  memcpy(in + n, "\r\nx\r\n0\r\n\r\n", 10);
  decode(&d, CE_H1_BODY_CHUNKED, 0, in, n + 10, 1);
  cr_expect_eq(d.rc, CE_ETOOBIG);
  cr_expect_str_eq(d.why, "chunk-size line too long");
  cr_expect_eq(d.used, CE_H1_MAX_CHUNK_LINE_BYTES);

  /* Trailers: CE_H1_MAX_TRAILER_BYTES including the final CRLF. */
  memcpy(in, "0\r\nX: ", 6);
  size_t trailer = CE_H1_MAX_TRAILER_BYTES;
  memset(in + 6, 'v', trailer - 3 - 4);
  memcpy(in + 3 + trailer - 4, "\r\n\r\n", 4);
  decode(&d, CE_H1_BODY_CHUNKED, 0, in, 3 + trailer, 3 + trailer);
  cr_expect_eq(d.rc, 1, "%s", d.why ? d.why : "");
  memset(in + 6, 'v', trailer - 3 - 4 + 1);
  memcpy(in + 3 + trailer - 3, "\r\n\r\n", 4);
  decode(&d, CE_H1_BODY_CHUNKED, 0, in, 3 + trailer + 1, 3 + trailer + 1);
  cr_expect_eq(d.rc, CE_ETOOBIG);
  cr_expect_str_eq(d.why, "trailers too large");
  (void)why;
}

Test(http1_body, content_length) {
  const char *in = "helloGET / HTTP/1.1\r\n";
  size_t steps[] = {1, 2, 4, 100};
  for (size_t i = 0; i < N_OF(steps); i++) {
    decoded_t d;
    decode(&d, CE_H1_BODY_LENGTH, 5, in, strlen(in), steps[i]);
    cr_expect_eq(d.rc, 1);
    cr_expect_eq(d.used, 5, "bytes after the body are not taken");
    cr_expect(d.payload_len == 5 && memcmp(d.payload, "hello", 5) == 0);
  }
  decoded_t d;
  decode(&d, CE_H1_BODY_LENGTH, 10, "hello", 5, 5);
  cr_expect_eq(d.rc, 0);
  cr_expect_eq(d.payload_len, 5);
  decode(&d, CE_H1_BODY_LENGTH, 0, "hello", 5, 5);
  cr_expect_eq(d.rc, 1);
  cr_expect_eq(d.used, 0);
  decode(&d, CE_H1_BODY_NONE, 0, "hello", 5, 5);
  cr_expect_eq(d.rc, 1);
  cr_expect_eq(d.used, 0);
  /* Until close: everything is payload and it never ends. */
  decode(&d, CE_H1_BODY_CLOSE, 0, "hello\r\n0\r\n\r\n", 12, 3);
  cr_expect_eq(d.rc, 0);
  cr_expect_eq(d.payload_len, 12);
}

Test(http1_body, done_and_failed_are_sticky) {
  ce_h1_body_t b;
  size_t consumed;
  const char *data;
  size_t dlen;
  const char *why = NULL;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  cr_assert_eq(ce_h1_body_next(&b, "0\r\n\r\nabc", 8, &consumed, &data, &dlen, &why), 1);
  cr_expect_eq(consumed, 5);
  cr_expect_eq(ce_h1_body_next(&b, "abc", 3, &consumed, &data, &dlen, &why), 1);
  cr_expect_eq(consumed, 0);
  cr_expect_eq(dlen, 0);

  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  cr_assert_eq(ce_h1_body_next(&b, "z", 1, &consumed, &data, &dlen, &why), CE_EPARSE);
  cr_expect_eq(consumed, 0);
  cr_expect_eq(ce_h1_body_next(&b, "0\r\n\r\n", 5, &consumed, &data, &dlen, &why), CE_EINVAL);
  cr_expect_str_eq(why, "body decoder already failed");

  ce_h1_body_init(&b, (ce_h1_framing_t)42, 0);
  cr_expect_eq(ce_h1_body_next(&b, "x", 1, &consumed, &data, &dlen, &why), CE_EINVAL);
  cr_expect_str_eq(why, "unknown framing");

  /* Data spans stop at the end of a chunk; the framing after it comes
   * with the next call. */
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  const char *in = "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
  cr_assert_eq(ce_h1_body_next(&b, in, strlen(in), &consumed, &data, &dlen, &why), 0);
  cr_expect_eq(consumed, 6);
  cr_expect(data == in + 3 && dlen == 3);
  cr_assert_eq(ce_h1_body_next(&b, in + 6, strlen(in) - 6, &consumed, &data, &dlen, &why), 0);
  cr_expect_eq(consumed, 7);
  cr_expect(data == in + 11 && dlen == 2);
  cr_assert_eq(ce_h1_body_next(&b, in + 13, strlen(in) - 13, &consumed, &data, &dlen, &why), 1);
  cr_expect_eq(consumed, 7);
  cr_expect_eq(dlen, 0);
}

Test(http1_body, trailers_kept_when_asked_in_any_split) {
  const char *in = "5\r\nhello\r\n0\r\nGrpc-Status: 0\r\nX-B: two words \r\n\r\nNEXT";
  for (size_t step = 1; step <= strlen(in); step++) {
    static char keep[CE_H1_MAX_TRAILER_BYTES];
    ce_h1_body_t b;
    ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
    ce_h1_body_keep_trailers(&b, keep);
    size_t off = 0;
    int rc = 0;
    while (off < strlen(in) && rc == 0) {
      size_t k = strlen(in) - off < step ? strlen(in) - off : step;
      size_t used = 0, dl = 0;
      const char *data = NULL, *why = NULL;
      rc = ce_h1_body_next(&b, in + off, k, &used, &data, &dl, &why);
      off += used;
    }
    cr_assert_eq(rc, 1, "step %zu", step);
    cr_assert_eq(off, strlen(in) - 4, "step %zu", step);
    cr_assert_eq(b.kept, strlen("Grpc-Status: 0\r\nX-B: two words \r\n"), "step %zu", step);
    cr_assert(memcmp(keep, "Grpc-Status: 0\r\nX-B: two words \r\n", b.kept) == 0, "step %zu", step);
  }
  static char keep2[CE_H1_MAX_TRAILER_BYTES];
  ce_h1_body_t b;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  ce_h1_body_keep_trailers(&b, keep2);
  size_t used = 0, dl = 0;
  const char *data = NULL, *why = NULL;
  cr_assert_eq(ce_h1_body_next(&b, "0\r\n\r\n", 5, &used, &data, &dl, &why), 1);
  cr_assert_eq(b.kept, 0);
}

Test(http1_body, kept_trailers_walk_field_by_field) {
  const char *tr = "Grpc-Status: 0\r\nX-B:\t two words \t\r\nE:\r\nno colon\r\n:empty\r\nLast:v";
  size_t pos = 0;
  ce_h1_field_t f;
  cr_assert(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  cr_assert(f.name == tr && f.name_len == 11 && f.value_len == 1 && f.value[0] == '0');
  cr_assert(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  cr_assert(f.name_len == 3 && memcmp(f.name, "X-B", 3) == 0);
  cr_assert(f.value_len == 9 && memcmp(f.value, "two words", 9) == 0);
  cr_assert(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  cr_assert(f.name_len == 1 && f.name[0] == 'E' && f.value_len == 0);
  /* The lines the decoder never keeps are skipped; a last line without
   * its CRLF still counts. */
  cr_assert(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  cr_assert(f.name_len == 4 && memcmp(f.name, "Last", 4) == 0 && f.value_len == 1 && f.value[0] == 'v');
  cr_assert_not(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  cr_assert_eq(pos, strlen(tr));
  cr_assert_not(ce_h1_trailer_next(tr, strlen(tr), &pos, &f));
  pos = 0;
  cr_assert_not(ce_h1_trailer_next("", 0, &pos, &f));
}

Test(http1_body, trailers_no_longer_kept_after_keep_null) {
  static char keep[CE_H1_MAX_TRAILER_BYTES];
  ce_h1_body_t b;
  ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
  ce_h1_body_keep_trailers(&b, keep);
  size_t used = 0, dl = 0;
  const char *data = NULL, *why = NULL;
  const char *in = "0\r\nA: 1\r\n";
  cr_assert_eq(ce_h1_body_next(&b, in, strlen(in), &used, &data, &dl, &why), 0);
  cr_assert_eq(b.kept, 6);
  /* The owner frees its buffer and says so: the rest is checked, not kept. */
  ce_h1_body_keep_trailers(&b, NULL);
  cr_assert_eq(b.kept, 0);
  in = "B: 2\r\n\r\n";
  cr_assert_eq(ce_h1_body_next(&b, in, strlen(in), &used, &data, &dl, &why), 1);
  cr_assert_eq(b.kept, 0);
}

Test(http1_parser, a_method_of_31_bytes_is_kept_whole) {
  const char *msg = "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDE / HTTP/1.1\r\nHost: a\r\n\r\n";
  ce_h1_head_t h;
  const char *why = NULL;
  cr_assert_eq(ce_h1_parse_request(msg, strlen(msg), &h, &why), CE_OK, "%s", why ? why : "");
  cr_assert_eq(h.method_len, CE_H1_MAX_METHOD_BYTES);
}
