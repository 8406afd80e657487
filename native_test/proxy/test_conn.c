/* Tests for c_src/proxy/conn.c: one HTTP/1.1 workspace connection driven
 * over a socketpair, without network namespaces. The connection is given
 * its "dialled address" (ce_conn_adopt) instead of a redirect's original
 * destination; its events go to a recorder (ce_proxy_t.channel); the test
 * plays the workspace on the other end of the pair. The policy allows
 * nothing, so every request is answered by the proxy itself: the deny
 * page, its framing, keep-alive, a refused body skipped (a short one) or
 * closing the connection (a chunked one), and a workspace that resets in the middle of a head. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "dns/stub.h"
#include "policy/policy.h"
#include "proxy/conn.h"
#include "proxy/exchange.h"
#include "proxy/options.h"
#include "proxy/proxy.h"

typedef struct {
  uv_loop_t loop;
  ce_proxy_t proxy;
  ce_proxy_options_t opts;
  ce_policy_t *policy;
  ce_dns_stub_t *dns;
  int ws;             /* the workspace's end of the pair */
  char got[16384];    /* what the workspace read */
  size_t got_len;
  bool ws_eof;        /* the proxy closed the connection */
  char events[4096];  /* "name reason\n" per event */
} fx_t;

static void rec_emit(void *ctx, const char *name, const ce_reqinfo_t *r, const char *reason) {
  (void)r;
  fx_t *f = ctx;
  size_t n = strlen(f->events);
  snprintf(f->events + n, sizeof(f->events) - n, "%s %s\n", name, reason != NULL ? reason : "-");
}

static uint64_t rec_ask(void *ctx, const ce_reqinfo_t *r, int32_t rule, uint32_t timeout_ms, ce_control_decision_cb cb,
                        void *data) {
  (void)ctx, (void)r, (void)rule, (void)timeout_ms, (void)cb, (void)data;
  return 0; /* no decider: nothing sent */
}

static void rec_cancel(void *ctx, uint64_t id) { (void)ctx, (void)id; }

static const ce_exchange_channel_t recorder = {rec_emit, rec_ask, rec_cancel};

static void fixture(fx_t *f) {
  memset(f, 0, sizeof(*f));
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  static const char policy[] = "{\"version\":1,\"default\":\"deny\",\"rules\":["
                               "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"allowed.example\"]}]}";
  ce_policy_error_t err;
  cr_assert_eq(ce_policy_load_buffer(policy, strlen(policy), &f->policy, &err), 0, "%s", err.message);
  f->opts.max_connections = 8;
  f->opts.clienthello_ms = 5000;
  f->opts.handshake_ms = 5000;
  f->opts.connect_ms = 5000;
  f->opts.header_ms = 5000;
  f->opts.idle_ms = 5000;
  ce_dns_stub_opts_t dopts = {0};
  cr_assert_eq(ce_dns_stub_new(&f->loop, &dopts, &f->dns), CE_OK);
  ce_proxy_t *p = &f->proxy;
  p->loop = &f->loop;
  p->opts = &f->opts;
  p->policy = f->policy;
  p->dns = f->dns;
  p->channel = &recorder;
  p->channel_ctx = f;
  p->decisions = calloc(CE_DECISION_CACHE_SIZE, sizeof(*p->decisions));
  ce_bufpool_init(&p->inbufs, CE_CONN_INPUT_MAX, CE_CONN_SPARE_INPUTS);
  p->read_buf = malloc(CE_CONN_READ_CHUNK);
  p->head_buf = malloc(CE_CONN_HEAD_OUT_MAX);
  cr_assert(p->decisions != NULL && p->read_buf != NULL && p->head_buf != NULL);

  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  f->ws = sv[0];
  struct sockaddr_in dialled = {.sin_family = AF_INET, .sin_port = htons(80)};
  dialled.sin_addr.s_addr = htonl(0x7f000003); /* 127.0.0.3 */
  cr_assert_eq(ce_conn_adopt(p, sv[1], (const struct sockaddr *)&dialled), CE_OK);
  cr_assert_eq(p->conn_count, 1);
}

static void fixture_free(fx_t *f) {
  if (f->ws >= 0)
    close(f->ws);
  for (int i = 0; i < 2000 && f->proxy.conn_count > 0; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  cr_assert_eq(f->proxy.conn_count, 0, "the connection ended when the workspace went");
  ce_dns_stub_close(f->dns);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  ce_bufpool_clear(&f->proxy.inbufs);
  free(f->proxy.decisions);
  free(f->proxy.read_buf);
  free(f->proxy.head_buf);
  ce_policy_free(f->policy);
  cr_assert_eq(uv_loop_close(&f->loop), 0);
}

static void send_text(fx_t *f, const char *text) {
  size_t len = strlen(text);
  cr_assert_eq(write(f->ws, text, len), (ssize_t)len);
}

/* Runs the loop and reads what the proxy sent until want appears n times
 * in it (or the proxy closed, or about two seconds passed). */
static void run_until(fx_t *f, const char *want, int n) {
  for (int i = 0; i < 2000; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    ssize_t r;
    while ((r = read(f->ws, f->got + f->got_len, sizeof(f->got) - 1 - f->got_len)) > 0)
      f->got_len += (size_t)r;
    f->got[f->got_len] = '\0';
    if (r == 0)
      f->ws_eof = true;
    int seen = 0;
    for (const char *p = f->got; want != NULL && (p = strstr(p, want)) != NULL; p++)
      seen++;
    if ((want != NULL && seen >= n) || f->ws_eof)
      return;
    usleep(1000);
  }
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
    n++;
  return n;
}

Test(conn, a_refused_request_gets_the_deny_page_framed_and_the_connection_kept) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  send_text(f, "GET /x HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "refused the request", 1);
  cr_assert(strncmp(f->got, "HTTP/1.1 403 ", 13) == 0, "%s", f->got);
  cr_assert_not_null(strstr(f->got, "\r\n\r\n"), "a whole head");
  /* The body is framed: its length is what the head says. */
  const char *cl = strcasestr(f->got, "content-length: ");
  cr_assert_not_null(cl, "%s", f->got);
  size_t body = strlen(strstr(f->got, "\r\n\r\n") + 4);
  cr_assert_eq((size_t)strtoul(cl + 16, NULL, 10), body, "%s", f->got);
  cr_assert_not(f->ws_eof, "a refusal keeps the connection");
  cr_assert_not_null(strstr(f->events, "request_denied"), "%s", f->events);
  fixture_free(f);
  free(f);
}

Test(conn, two_requests_on_one_connection_are_answered_in_order) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  send_text(f, "GET /one HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\nGET /two HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "HTTP/1.1 403 ", 2);
  cr_assert_eq(count(f->got, "HTTP/1.1 403 "), 2, "%s", f->got);
  cr_assert_not(f->ws_eof);
  cr_assert_eq(count(f->events, "request_denied"), 2, "%s", f->events);
  fixture_free(f);
  free(f);
}

Test(conn, a_refused_small_body_is_read_and_dropped_then_the_next_request_is_served) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  send_text(f, "POST /up HTTP/1.1\r\nHost: 127.0.0.3\r\nContent-Length: 11\r\n\r\nhello world"
               "GET /after HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "HTTP/1.1 403 ", 2);
  cr_assert_eq(count(f->got, "HTTP/1.1 403 "), 2, "the body was not taken for a request: %s", f->got);
  cr_assert_null(strstr(f->got, "HTTP/1.1 400"), "%s", f->got);
  cr_assert_not(f->ws_eof);
  fixture_free(f);
  free(f);
}

Test(conn, a_refused_chunked_body_closes_the_connection_and_is_never_taken_for_a_request) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  /* A chunked body's end cannot be skipped to cheaply: the answer says
   * close, and what follows the body is never read as a request. */
  send_text(f, "POST /up HTTP/1.1\r\nHost: 127.0.0.3\r\nTransfer-Encoding: chunked\r\n\r\n"
               "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
               "GET /after HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "HTTP/1.1 403 ", 2);
  cr_assert_eq(count(f->got, "HTTP/1.1 403 "), 1, "%s", f->got);
  cr_assert_not_null(strcasestr(f->got, "connection: close"), "%s", f->got);
  cr_assert(f->ws_eof, "the proxy closed the connection");
  cr_assert_eq(count(f->events, "request_denied"), 1, "%s", f->events);
  fixture_free(f);
  free(f);
}

Test(conn, a_dialled_address_that_is_not_ip_is_refused_and_the_socket_closed) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  struct sockaddr unix_addr = {.sa_family = AF_UNIX};
  cr_assert_eq(ce_conn_adopt(&f->proxy, sv[1], &unix_addr), CE_EINVAL);
  cr_assert_eq(f->proxy.conn_count, 1, "no connection was made");
  char b;
  cr_assert_eq(read(sv[0], &b, 1), 0, "the adopted end was closed");
  close(sv[0]);
  fixture_free(f);
  free(f);
}

Test(conn, a_workspace_reset_in_the_middle_of_a_head_ends_the_connection) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  send_text(f, "GET /half HTTP/1.1\r\nHost: 127.0");
  run_until(f, NULL, 0);
  for (int i = 0; i < 20; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  cr_assert_eq(f->got_len, 0, "nothing is answered to half a head");
  struct linger lg = {1, 0};
  setsockopt(f->ws, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(f->ws);
  f->ws = -1;
  fixture_free(f); /* asserts the connection is gone */
  cr_assert_eq(count(f->events, "request_denied"), 0, "%s", f->events);
  free(f);
}
