/* Tests for c_src/proxy/conn.c: one HTTP/1.1 workspace connection driven
 * over a socketpair, without network namespaces. The connection is given
 * its "dialled address" (ce_conn_adopt) instead of a redirect's original
 * destination; its events go to a recorder (ce_proxy_t.channel); the test
 * plays the workspace on the other end of the pair and, for an allowed
 * request, the upstream on 127.0.0.1. Refused requests: the deny page and
 * its framing, keep-alive, a refused body skipped (a short one) or closing
 * the connection (a chunked one). Allowed ones: the head and a chunked
 * body as the upstream receives them, the answer as the workspace does.
 * And a workspace that resets in the middle of a head. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "support/loopback.h"
#include "common/error.h"
#include "dns/stub.h"
#include "policy/policy.h"
#include "proxy/conn.h"
#include "proxy/conn_internal.h"
#include "proxy/exchange.h"
#include "proxy/options.h"
#include "proxy/proxy.h"
#include "proxy/stats.h"
#include "support/failalloc.h"

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
  /* The upstream, for an allowed request: it answers once it has seen
   * up_until in what it read. */
  uv_tcp_t server, peer;
  bool peer_open;
  uint16_t port;
  char up_got[8192];
  size_t up_got_len;
  const char *up_until;
  bool up_answered;
  /* The upstream takes one connection after another (each answered
   * once), counting them and their closes. */
  bool up_many;
  int up_conns, up_closed;
  char *up_answer;    /* what the upstream answers (NULL: a short 200) */
  size_t up_answer_len;
  bool up_hold;       /* answer only when the test says (up_answer_now) */
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

static void on_up_written(uv_write_t *w, int status) {
  (void)status;
  free(w);
}

static void up_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  fx_t *f = h->data;
  *buf = uv_buf_init(f->up_got + f->up_got_len, (unsigned)(sizeof(f->up_got) - 1 - f->up_got_len));
}

static void on_peer_closed(uv_handle_t *h) {
  fx_t *f = h->data;
  f->peer_open = false;
  f->up_closed++;
}

static void up_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  fx_t *f = st->data;
  if (nread < 0 && f->up_many && !uv_is_closing((uv_handle_t *)st)) {
    uv_close((uv_handle_t *)st, on_peer_closed);
    return;
  }
  if (nread <= 0)
    return;
  f->up_got_len += (size_t)nread;
  f->up_got[f->up_got_len] = '\0';
  if (f->up_answered || f->up_hold || strstr(f->up_got, f->up_until) == NULL)
    return;
  f->up_answered = true;
  static char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  uv_write_t *w = malloc(sizeof(*w));
  cr_assert_not_null(w);
  uv_buf_t b = f->up_answer != NULL ? uv_buf_init(f->up_answer, (unsigned)f->up_answer_len)
                                    : uv_buf_init(answer, sizeof(answer) - 1);
  uv_write(w, st, &b, 1, on_up_written);
}

/* The held answer (up_hold) goes now. */
static void up_answer_now(fx_t *f) {
  cr_assert(f->peer_open && !f->up_answered && f->up_answer != NULL);
  f->up_hold = false;
  f->up_answered = true;
  uv_write_t *w = malloc(sizeof(*w));
  cr_assert_not_null(w);
  uv_buf_t b = uv_buf_init(f->up_answer, (unsigned)f->up_answer_len);
  uv_write(w, (uv_stream_t *)&f->peer, &b, 1, on_up_written);
}

/* A 200 whose body is n bytes, byte i being i % 251. */
static void big_answer(fx_t *f, size_t n) {
  char head[100];
  int hl = snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
  f->up_answer = malloc((size_t)hl + n);
  cr_assert_not_null(f->up_answer);
  memcpy(f->up_answer, head, (size_t)hl);
  for (size_t i = 0; i < n; i++)
    f->up_answer[hl + i] = (char)(i % 251);
  f->up_answer_len = (size_t)hl + n;
}

static void on_up_peer(uv_stream_t *server, int status) {
  fx_t *f = server->data;
  cr_assert_eq(status, 0);
  cr_assert_not(f->peer_open, "one upstream connection at a time");
  cr_assert(f->up_many || f->up_conns == 0, "one upstream connection");
  f->up_conns++;
  f->up_got_len = 0;
  f->up_got[0] = '\0';
  f->up_answered = false;
  uv_tcp_init(&f->loop, &f->peer);
  f->peer.data = f;
  cr_assert_eq(uv_accept(server, (uv_stream_t *)&f->peer), 0);
  f->peer_open = true;
  uv_read_start((uv_stream_t *)&f->peer, up_alloc, up_read);
}

static void fixture_at(fx_t *f, const struct sockaddr_in *dialled);

static void fixture(fx_t *f) {
  struct sockaddr_in dialled = {.sin_family = AF_INET, .sin_port = htons(80)};
  dialled.sin_addr.s_addr = htonl(0x7f000003); /* 127.0.0.3 */
  memset(f, 0, sizeof(*f));
  fixture_at(f, &dialled);
}

/* An upstream on 127.0.0.1 that the policy allows (and the private
 * address rule lets through); the workspace dialled it. */
static void fixture_upstream(fx_t *f, const char *until) {
  memset(f, 0, sizeof(*f));
  f->up_until = until;
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->port = ce_test_bind_loopback(&f->loop, &f->server);
  f->server.data = f;
  cr_assert_eq(uv_listen((uv_stream_t *)&f->server, 8, on_up_peer), 0);
  cr_assert_eq(ce_cidr_parse("127.0.0.0/8", &f->opts.allow_private[0]), CE_OK);
  f->opts.allow_private_count = 1;
  f->opts.mark = 0x2a;
  struct sockaddr_in sa; /* the workspace dialled the upstream's address */
  uv_ip4_addr("127.0.0.1", 0, &sa);
  fixture_at(f, &sa);
}

static void fixture_at(fx_t *f, const struct sockaddr_in *dialled_in) {
  struct sockaddr_in dialled = *dialled_in;
  if (f->port != 0)
    dialled.sin_port = htons(f->port);
  if (f->server.data == NULL)
    cr_assert_eq(uv_loop_init(&f->loop), 0);
  static const char policy[] = "{\"version\":1,\"default\":\"deny\",\"rules\":["
                               "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"127.0.0.1\"]}]}";
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
  if (f->peer_open && !uv_is_closing((uv_handle_t *)&f->peer))
    uv_close((uv_handle_t *)&f->peer, NULL);
  if (f->server.data != NULL)
    uv_close((uv_handle_t *)&f->server, NULL);
  ce_dns_stub_close(f->dns);
  ce_conn_writes_close(&f->proxy);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  ce_bufpool_clear(&f->proxy.inbufs);
  free(f->proxy.decisions);
  free(f->proxy.read_buf);
  free(f->proxy.head_buf);
  ce_policy_free(f->policy);
  cr_assert_eq(uv_loop_close(&f->loop), 0);
  free(f->up_answer);
}

static void send_text(fx_t *f, const char *text) {
  size_t len = strlen(text);
  cr_assert_eq(write(f->ws, text, len), (ssize_t)len);
}

/* One turn of the loop, then what the proxy sent the workspace. */
static void turn(fx_t *f) {
  uv_run(&f->loop, UV_RUN_NOWAIT);
  ssize_t r;
  while ((r = read(f->ws, f->got + f->got_len, sizeof(f->got) - 1 - f->got_len)) > 0)
    f->got_len += (size_t)r;
  f->got[f->got_len] = '\0';
  if (r == 0)
    f->ws_eof = true;
}

/* Runs the loop and reads what the proxy sent until want appears n times
 * in it (or the proxy closed, or about two seconds passed). */
static void run_until(fx_t *f, const char *want, int n) {
  for (int i = 0; i < 2000; i++) {
    turn(f);
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

Test(conn, an_allowed_request_is_framed_to_the_upstream_and_its_answer_back) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "\r\n\r\n");
  char req[200];
  snprintf(req, sizeof(req), "GET /x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nAccept: */*\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  run_until(f, "\r\n\r\nok", 1);
  cr_assert(strncmp(f->got, "HTTP/1.1 200 ", 13) == 0, "%s / events: %s", f->got, f->events);
  cr_assert(strncmp(f->up_got, "GET /x?y=1 HTTP/1.1\r\n", 21) == 0, "%s", f->up_got);
  cr_assert_not_null(strcasestr(f->up_got, "\r\nhost: 127.0.0.1:"), "%s", f->up_got);
  cr_assert_not_null(strstr(f->events, "request_allowed"), "%s", f->events);
  cr_assert_not(f->ws_eof);
  fixture_free(f);
  free(f);
}

Test(conn, an_allowed_chunked_body_goes_up_chunked_to_its_last_chunk) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "0\r\n\r\n");
  char req[300];
  snprintf(req, sizeof(req),
           "POST /up HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
           (unsigned)f->port);
  send_text(f, req);
  run_until(f, "\r\n\r\nok", 1);
  cr_assert(strncmp(f->got, "HTTP/1.1 200 ", 13) == 0, "%s / events: %s", f->got, f->events);
  const char *body = strstr(f->up_got, "\r\n\r\n");
  cr_assert_not_null(body, "%s", f->up_got);
  /* The payload arrives whole, however the proxy re-chunks it. */
  cr_assert_not_null(strcasestr(f->up_got, "transfer-encoding: chunked"), "%s", f->up_got);
  cr_assert(strstr(body, "hello") != NULL && strstr(body, " world") != NULL, "%s", f->up_got);
  cr_assert_not_null(strstr(body, "0\r\n\r\n"), "%s", f->up_got);
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

/* Runs the loop until the upstream saw n connections closed (or about
 * ms milliseconds passed), reading what the workspace gets meanwhile. */
static void run_until_up_closed(fx_t *f, int n, int ms) {
  for (int i = 0; i < ms && f->up_closed < n; i++) {
    turn(f);
    usleep(1000);
  }
}

/* docs/proxy.md "Idle connections": a keep-alive connection idle for
 * --idle-release-ms closes its upstream connection and stays open; a
 * refusal after it connects nothing; the next allowed request is
 * evaluated and reported on its own and connects again. */
Test(conn, an_idle_connection_releases_its_upstream_and_the_next_request_connects_again) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "\r\n\r\n");
  f->up_many = true;
  f->opts.release_ms = 50;
  char req[200];
  snprintf(req, sizeof(req), "GET /first HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  run_until(f, "\r\n\r\nok", 1);
  cr_assert(strncmp(f->got, "HTTP/1.1 200 ", 13) == 0, "%s / events: %s", f->got, f->events);
  cr_assert_eq(f->up_conns, 1);

  run_until_up_closed(f, 1, 2000);
  cr_assert_eq(f->up_closed, 1, "the idle connection released its upstream");
  cr_assert_not(f->ws_eof, "the workspace's connection stays open");
  ce_buffer_stats_t st;
  ce_proxy_buffer_stats(&f->proxy, &st);
  cr_expect_eq(st.connections, 1);
  cr_expect_eq(st.upstreams, 0, "no upstream held for an idle connection");
  cr_expect_eq(st.input, 0);
  cr_expect_eq(count(f->events, "request_closed"), 1, "%s", f->events);

  send_text(f, "GET /refused HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "HTTP/1.1 403 ", 1);
  cr_assert_eq(count(f->got, "HTTP/1.1 403 "), 1, "%s", f->got);
  cr_assert_eq(count(f->events, "request_denied"), 1, "%s", f->events);
  cr_assert_eq(f->up_conns, 1, "a refused request connects nothing");

  snprintf(req, sizeof(req), "GET /again HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  run_until(f, "\r\n\r\nok", 2);
  cr_assert_eq(count(f->got, "\r\n\r\nok"), 2, "%s / events: %s", f->got, f->events);
  cr_assert_eq(f->up_conns, 2, "the next request connected again");
  cr_assert(strncmp(f->up_got, "GET /again HTTP/1.1\r\n", 21) == 0, "%s", f->up_got);
  cr_assert_eq(count(f->events, "request_opened"), 3, "%s", f->events);
  cr_assert_eq(count(f->events, "request_allowed"), 2, "%s", f->events);
  cr_assert_eq(count(f->events, "request_closed"), 2, "%s", f->events);
  cr_assert_not(f->ws_eof);

  /* And rests again. */
  run_until_up_closed(f, 2, 2000);
  cr_assert_eq(f->up_closed, 2);
  fixture_free(f);
  free(f);
}

/* --idle-release-ms 0: the upstream is kept for the connection's life. */
Test(conn, without_idle_release_the_upstream_is_kept_between_requests) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "\r\n\r\n");
  f->up_many = true;
  char req[200];
  snprintf(req, sizeof(req), "GET /first HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  run_until(f, "\r\n\r\nok", 1);
  run_until_up_closed(f, 1, 300); /* six times the release of the test above: nothing closes */
  cr_assert_eq(f->up_closed, 0);
  ce_buffer_stats_t st;
  ce_proxy_buffer_stats(&f->proxy, &st);
  cr_expect_eq(st.upstreams, 1);
  fixture_free(f);
  free(f);
}

/* A request head is parsed into a record taken for the call (the
 * connection keeps none between requests): when it cannot be had, the
 * connection fails with out_of_memory, and nothing is answered. */
Test(conn, a_head_record_that_cannot_be_had_fails_the_connection) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f);
  /* A first request leaves a spare input buffer in the pool: the next
   * one's first allocation is its head record. */
  send_text(f, "GET /one HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, "HTTP/1.1 403 ", 1);
  size_t before = f->got_len;
  ce_failalloc_arm(0);
  send_text(f, "GET /two HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n");
  run_until(f, NULL, 0);
  ce_failalloc_disarm();
  cr_assert_eq(ce_failalloc_failures(), 1);
  cr_assert(f->ws_eof, "the connection was closed");
  cr_assert_eq(f->got_len, before, "nothing answered: %s", f->got);
  cr_assert_not_null(strstr(f->events, "request_failed out_of_memory"), "%s", f->events);
  fixture_free(f);
  free(f);
}

/* Runs the loop until pred holds (or about two seconds pass). */
static bool run_while_not(fx_t *f, bool (*pred)(fx_t *)) {
  for (int i = 0; i < 2000; i++) {
    if (pred(f))
      return true;
    uv_run(&f->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  return pred(f);
}

static bool up_has_head(fx_t *f) { return strstr(f->up_got, "\r\n\r\n") != NULL; }

Test(conn, a_workspace_that_reads_nothing_stops_the_upstream_reads_then_gets_every_byte_in_order) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "\r\n\r\n");
  /* More than the kernel's socket buffers on both connections hold, so
   * that the upstream cannot be done sending while the proxy reads no more. */
  size_t body = 48u * 1024u * 1024u;
  big_answer(f, body);
  char req[200];
  snprintf(req, sizeof(req), "GET /big HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  cr_assert(run_while_not(f, up_has_head));
  for (int i = 0; i < 300; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  ce_conn_t *c = f->proxy.conns;
  cr_assert_not_null(c);
  cr_assert_not(c->u.reading, "the proxy stopped reading the upstream");
  cr_assert_leq(c->c.queued, CE_CONN_HIGH_WATER + CE_CONN_INPUT_MAX, "%zu bytes queued", c->c.queued);
  cr_assert_gt(uv_stream_get_write_queue_size((uv_stream_t *)&f->peer), 0,
               "the upstream still holds bytes it could not send");

  /* The workspace reads now: the head, then every body byte in order. */
  size_t head = 0, got = 0;
  uint8_t buf[65536];
  char hbuf[1024];
  size_t hlen = 0;
  for (int i = 0; i < 20000 && got < body; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    ssize_t r;
    while ((r = read(f->ws, buf, sizeof(buf))) > 0) {
      size_t off = 0;
      while (head == 0 && off < (size_t)r) {
        cr_assert_lt(hlen, sizeof(hbuf) - 1);
        hbuf[hlen++] = (char)buf[off++];
        hbuf[hlen] = '\0';
        if (hlen >= 4 && memcmp(hbuf + hlen - 4, "\r\n\r\n", 4) == 0)
          head = hlen;
      }
      for (; off < (size_t)r; off++, got++)
        if (buf[off] != (uint8_t)(got % 251))
          cr_assert_fail("body byte %zu is %u", got, buf[off]);
    }
    if (r == 0)
      break;
    if (got < body)
      usleep(100);
  }
  cr_assert(strncmp(hbuf, "HTTP/1.1 200 ", 13) == 0, "%s", hbuf);
  cr_assert_eq(got, body, "every body byte arrived");
  cr_assert_not_null(strstr(f->events, "request_closed"), "%s", f->events);
  fixture_free(f);
  cr_assert_eq(f->proxy.recbufs.out, 0);
  cr_assert_eq(f->proxy.inbufs.out, 0);
  free(f);
}

Test(conn, a_workspace_gone_while_its_answer_is_written_fails_the_request_and_frees_everything) {
  signal(SIGPIPE, SIG_IGN);
  fx_t *f = calloc(1, sizeof(*f));
  fixture_upstream(f, "\r\n\r\n");
  f->up_hold = true;
  big_answer(f, 100000);
  char req[200];
  snprintf(req, sizeof(req), "GET /gone HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", (unsigned)f->port);
  send_text(f, req);
  cr_assert(run_while_not(f, up_has_head));
  close(f->ws);
  f->ws = -1;
  up_answer_now(f);
  fixture_free(f); /* asserts the connection is gone */
  cr_assert_eq(count(f->events, "request_failed"), 1, "%s", f->events);
  cr_assert_eq(f->proxy.recbufs.out, 0, "no record buffer is left behind");
  cr_assert_eq(f->proxy.inbufs.out, 0);
  free(f);
}
