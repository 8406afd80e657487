/* Tests for c_src/control/control.c: a real libuv loop and real client
 * sockets (TCP on a loopback port chosen by the kernel, and a Unix socket
 * in a fresh directory). The loop is pumped in small non-blocking steps
 * under a deadline, so a test that fails cannot hang; an alarm() in the
 * setup is the last resort. (Criterion's own .timeout is not used: in
 * Criterion 2.4.1 it makes the runner process leak 48 bytes now and then
 * under --jobs 2, which LeakSanitizer rightly reports.) Every test ends by
 * closing the channel and checking that uv_loop_close() finds no handle
 * left. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "control/control.h"
#include "support/failalloc.h"
#include "control/handshake.h"

/* Long enough for a loaded CI machine, short enough to fail fast. */
#define WAIT_MS 3000
/* Closing may wait CE_CONTROL_CLOSE_FLUSH_MS for an unread stdout. */
#define STOP_WAIT_MS (CE_CONTROL_CLOSE_FLUSH_MS + 4000)
#define CLIENT_BUF (512u * 1024u)
/* The slowest test takes about three seconds under the sanitizers. */
#define TEST_ALARM_S 60

static uv_loop_t loop;
static char dir[64];
static ce_control_t *ctl;

static const uint8_t TOKEN[16] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                  0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0xff};
static const char SID[] = "sess-1";

static void setup(void) {
  /* A peer that goes away must not kill the test worker (control.h). */
  signal(SIGPIPE, SIG_IGN);
  /* SIGALRM's default action kills the worker: Criterion reports a crash. */
  alarm(TEST_ALARM_S);
  cr_assert_eq(uv_loop_init(&loop), 0);
  strcpy(dir, "/tmp/ce_test_control_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  ctl = NULL;
}

static void teardown(void) {
  char path[128];
  snprintf(path, sizeof(path), "%s/ctl.sock", dir);
  unlink(path);
  snprintf(path, sizeof(path), "%s/file", dir);
  unlink(path);
  rmdir(dir);
}

TestSuite(control, .init = setup, .fini = teardown);

/* ---- loop driving ------------------------------------------------------- */

static void pump(int ms) {
  uint64_t end = uv_hrtime() + (uint64_t)ms * 1000000u;
  do {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  } while (uv_hrtime() < end);
  uv_run(&loop, UV_RUN_NOWAIT);
}

typedef bool (*cond_fn)(void *arg);

static bool pump_until(cond_fn cond, void *arg, int ms) {
  uint64_t end = uv_hrtime() + (uint64_t)ms * 1000000u;
  for (;;) {
    uv_run(&loop, UV_RUN_NOWAIT);
    if (cond(arg))
      return true;
    if (uv_hrtime() >= end)
      return false;
    poll(NULL, 0, 1);
  }
}

static void on_done(void *data) {
  (*(int *)data)++;
}

/* Closes the channel and checks that done ran once and nothing is left. */
static void stop(void) {
  int done = 0;
  ce_control_close(ctl, on_done, &done);
  uint64_t end = uv_hrtime() + (uint64_t)STOP_WAIT_MS * 1000000u;
  while (done == 0 && uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(done, 1, "done was not called exactly once");
  ctl = NULL;
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(uv_loop_close(&loop), 0, "handles left on the loop");
}

static ce_control_opts_t default_opts(void) {
  ce_control_opts_t o;
  memset(&o, 0, sizeof(o));
  o.listen = "127.0.0.1:0";
  o.token = TOKEN;
  o.token_len = sizeof(TOKEN);
  o.session_id = "sess-1";
  o.stdout_fd = -1;
  return o;
}

static void start_with(const ce_control_opts_t *o) {
  char err[256];
  int rc = ce_control_start(&loop, o, &ctl, err, sizeof(err));
  cr_assert_eq(rc, 0, "start: %s (%s)", err, ce_err_name(rc));
  cr_assert_not_null(ctl);
}

static void start(void) {
  ce_control_opts_t o = default_opts();
  start_with(&o);
}

static ce_control_stats_t stats(void) {
  ce_control_stats_t s;
  ce_control_stats(ctl, &s);
  return s;
}

/* ---- clients -------------------------------------------------------------- */

typedef struct {
  int fd;
  char buf[CLIENT_BUF];
  size_t len;
  size_t total; /* bytes ever received */
  bool closed;
} client_t;

static client_t *client_new(int fd) {
  client_t *c = calloc(1, sizeof(*c));
  cr_assert_not_null(c);
  c->fd = fd;
  return c;
}

static client_t *connect_tcp_rcvbuf(int port, int rcvbuf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  /* Set before connect so that the advertised window is small too. */
  if (rcvbuf > 0)
    cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0, "connect: %s",
               strerror(errno));
  return client_new(fd);
}

static client_t *connect_ctl(void) {
  return connect_tcp_rcvbuf(ce_control_port(ctl), 0);
}

/* A peer whose socket holds little, so that not reading backs up fast. */
static client_t *connect_ctl_slow(void) {
  return connect_tcp_rcvbuf(ce_control_port(ctl), 16 * 1024);
}

static client_t *connect_unix(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof(sun));
  sun.sun_family = AF_UNIX;
  strcpy(sun.sun_path, path);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0, "connect %s: %s", path,
               strerror(errno));
  return client_new(fd);
}

static void client_free(client_t *c) {
  close(c->fd);
  free(c);
}

static void client_send(client_t *c, const char *text) {
  size_t n = strlen(text), off = 0;
  while (off < n) {
    ssize_t w = send(c->fd, text + off, n - off, MSG_NOSIGNAL);
    cr_assert_gt(w, 0, "send: %s", strerror(errno));
    off += (size_t)w;
  }
}

/* Reads what is there without waiting. */
static void client_poll(client_t *c) {
  while (!c->closed && c->len < CLIENT_BUF) {
    ssize_t r = recv(c->fd, c->buf + c->len, CLIENT_BUF - c->len, MSG_DONTWAIT);
    if (r > 0) {
      c->len += (size_t)r;
      c->total += (size_t)r;
    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      c->closed = true;
    } else {
      return;
    }
  }
}

static bool client_has_line(void *arg) {
  client_t *c = arg;
  client_poll(c);
  return memchr(c->buf, '\n', c->len) != NULL || c->closed;
}

/* The next line as a JSON object (the caller decrefs), or NULL when the
 * connection closed first. Fails the test on a timeout. */
static json_t *client_read(client_t *c) {
  cr_assert(pump_until(client_has_line, c, WAIT_MS), "no line within %d ms", WAIT_MS);
  char *nl = memchr(c->buf, '\n', c->len);
  if (nl == NULL)
    return NULL;
  size_t n = (size_t)(nl - c->buf);
  json_error_t jerr;
  json_t *j = json_loadb(c->buf, n, 0, &jerr);
  cr_assert_not_null(j, "bad JSON line: %.*s (%s)", (int)n, c->buf, jerr.text);
  cr_assert(json_is_object(j));
  memmove(c->buf, nl + 1, c->len - n - 1);
  c->len -= n + 1;
  return j;
}

static bool client_closed(void *arg) {
  client_t *c = arg;
  client_poll(c);
  return c->closed;
}

/* The sidecar closed the connection without writing a byte. */
static void expect_dropped_silently(client_t *c) {
  cr_assert(pump_until(client_closed, c, WAIT_MS), "connection not closed");
  cr_assert_eq(c->total, 0, "the sidecar wrote to an unauthenticated peer: %.*s",
               (int)c->len, c->buf);
}

/* Nothing arrives and the connection stays open for ms. */
static void expect_quiet(client_t *c, int ms) {
  pump(ms);
  client_poll(c);
  cr_assert_eq(c->len, 0, "unexpected bytes: %.*s", (int)c->len, c->buf);
  cr_assert_not(c->closed, "connection closed");
}

static const char *str(json_t *j, const char *key) {
  const char *s = json_string_value(json_object_get(j, key));
  cr_assert_not_null(s, "member %s missing or not a string", key);
  return s;
}

static void expect_type(json_t *j, const char *type) {
  cr_assert_str_eq(str(j, "type"), type);
}

/* A peer's side of the handshake (control/handshake.h), step by step. */
typedef struct {
  uint8_t np[CE_CONTROL_NONCE_LEN];
  uint8_t ns[CE_CONTROL_NONCE_LEN];
} hs_t;

static void send_hello_sid(client_t *c, hs_t *hs, const char *sid) {
  cr_assert_eq(ce_control_nonce(hs->np), CE_OK);
  char nonce[2 * CE_CONTROL_NONCE_LEN + 1], text[600];
  ce_control_hex(hs->np, sizeof(hs->np), nonce);
  snprintf(text, sizeof(text),
           "{\"type\":\"hello\",\"version\":2,\"session_id\":\"%s\",\"nonce\":\"%s\"}\n", sid,
           nonce);
  client_send(c, text);
}

/* Sends hello and reads the challenge into hs->ns. */
static void hello_challenge(client_t *c, hs_t *hs) {
  send_hello_sid(c, hs, SID);
  json_t *j = client_read(c);
  cr_assert_not_null(j, "closed instead of a challenge");
  expect_type(j, "challenge");
  cr_assert_eq(json_integer_value(json_object_get(j, "version")), 2);
  const char *n = str(j, "nonce");
  cr_assert(ce_control_unhex(n, strlen(n), hs->ns, sizeof(hs->ns)), "nonce %s", n);
  json_decref(j);
}

static void send_proof(client_t *c, const uint8_t proof[CE_CONTROL_PROOF_LEN]) {
  char hex[2 * CE_CONTROL_PROOF_LEN + 1], text[200];
  ce_control_hex(proof, CE_CONTROL_PROOF_LEN, hex);
  snprintf(text, sizeof(text), "{\"type\":\"auth\",\"proof\":\"%s\"}\n", hex);
  client_send(c, text);
}

/* The proof of `role` for hs with the test token and session. */
static void proof_of(ce_control_role_t role, const hs_t *hs, uint8_t out[CE_CONTROL_PROOF_LEN]) {
  cr_assert_eq(ce_control_proof(TOKEN, sizeof(TOKEN), role, SID, hs->np, hs->ns, out), CE_OK);
}

/* Reads the welcome, checks the sidecar's proof, returns its "dropped". */
static json_int_t read_welcome(client_t *c, const hs_t *hs) {
  json_t *w = client_read(c);
  cr_assert_not_null(w, "closed instead of a welcome");
  expect_type(w, "welcome");
  cr_assert_eq(json_integer_value(json_object_get(w, "version")), 2);
  cr_assert_str_eq(str(w, "session_id"), SID);
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  const char *p = str(w, "proof");
  cr_assert(ce_control_unhex(p, strlen(p), proof, sizeof(proof)));
  cr_assert(ce_control_proof_ok(TOKEN, sizeof(TOKEN), CE_CONTROL_ROLE_SIDECAR, SID, hs->np,
                                hs->ns, proof),
            "the sidecar's proof does not check out");
  json_t *d = json_object_get(w, "dropped");
  cr_assert(json_is_integer(d));
  json_int_t dropped = json_integer_value(d);
  json_decref(w);
  return dropped;
}

/* Authenticates and returns the welcome's "dropped". */
static json_int_t authenticate(client_t *c) {
  hs_t hs;
  hello_challenge(c, &hs);
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
  send_proof(c, proof);
  return read_welcome(c, &hs);
}

/* After the challenge, the sidecar closes without one more byte. */
static void expect_closed_after_challenge(client_t *c) {
  size_t before = c->total;
  cr_assert(pump_until(client_closed, c, WAIT_MS), "connection not closed");
  cr_assert_eq(c->total, before, "the sidecar wrote after a refused proof: %.*s", (int)c->len,
               c->buf);
}

static bool is_disconnected(void *arg) {
  (void)arg;
  return !stats().peer_connected;
}

/* The next frame that is not a control_refused event (refusals of other
 * connections reach the peer as events). */
static json_t *client_read_skip_refused(client_t *c) {
  for (;;) {
    json_t *j = client_read(c);
    const char *ev = j != NULL ? json_string_value(json_object_get(j, "event")) : NULL;
    if (ev == NULL || strcmp(ev, "control_refused") != 0)
      return j;
    json_decref(j);
  }
}

static void ping_pong(client_t *c) {
  client_send(c, "{\"type\":\"ping\"}\n");
  json_t *j = client_read_skip_refused(c);
  cr_assert_not_null(j, "closed instead of a pong");
  expect_type(j, "pong");
  json_decref(j);
}

static void emit_n(int first, int count) {
  for (int i = first; i < first + count; i++)
    ce_control_emit(ctl, json_pack("{s:s, s:i}", "event", "request_opened", "n", i));
}

/* ---- members written as text ------------------------------------------- */

/* ,"event":"request_opened","host":ARG,"port":443 */
static void write_text(ce_jsonw_t *w, const void *arg) {
  ce_jsonw_raw(w, ",\"event\":\"request_opened\",\"host\":", 33);
  ce_jsonw_string(w, arg, strlen(arg));
  ce_jsonw_raw(w, ",\"port\":443", 11);
}

static void write_failing(ce_jsonw_t *w, const void *arg) {
  ce_jsonw_raw(w, ",\"a\":1", 6);
  ce_jsonw_fail(w, CE_EINVAL);
}

static void write_huge(ce_jsonw_t *w, const void *arg) {
  static char chunk[64 * 1024];
  memset(chunk, 'x', sizeof(chunk));
  ce_jsonw_raw(w, ",\"pad\":\"", 8);
  for (size_t i = 0; i <= CE_CONTROL_MAX_FRAME / sizeof(chunk); i++)
    ce_jsonw_raw(w, chunk, sizeof(chunk));
  ce_jsonw_raw(w, "\"", 1);
}

/* The next line's exact text, without its '\n' (the caller frees). */
static char *client_read_text(client_t *c) {
  cr_assert(pump_until(client_has_line, c, WAIT_MS), "no line within %d ms", WAIT_MS);
  char *nl = memchr(c->buf, '\n', c->len);
  cr_assert_not_null(nl, "closed instead of a line");
  size_t n = (size_t)(nl - c->buf);
  char *text = strndup(c->buf, n);
  cr_assert_not_null(text);
  memmove(c->buf, nl + 1, c->len - n - 1);
  c->len -= n + 1;
  return text;
}

/* ---- decisions ---------------------------------------------------------- */

typedef struct {
  int calls;
  int status;
  bool allow;
  bool reason_null;
  char reason[600];
  bool cacheable;
  bool close_channel; /* the callback closes the channel (re-entrancy) */
  int *done;
} answer_t;

static void on_answer(void *data, int status, bool allow, const char *reason,
                      bool cacheable) {
  answer_t *a = data;
  a->calls++;
  a->status = status;
  a->allow = allow;
  a->reason_null = reason == NULL;
  snprintf(a->reason, sizeof(a->reason), "%s", reason != NULL ? reason : "");
  a->cacheable = cacheable;
  if (a->close_channel) {
    ce_control_close(ctl, on_done, a->done);
    /* Calls after close only free; they must not crash or call back. */
    ce_control_emit(ctl, json_object());
    cr_assert_eq(ce_control_ask(ctl, json_object(), 10, on_answer, a), 0);
    ce_control_emit_with(ctl, write_text, "x");
    cr_assert_eq(ce_control_ask_with(ctl, write_text, "x", 10, on_answer, a), 0);
  }
}

static bool answered(void *arg) {
  return ((answer_t *)arg)->calls > 0;
}

static uint64_t ask(answer_t *a, uint32_t timeout_ms) {
  json_t *req = json_pack("{s:s, s:s, s:i}", "host", "api.example.com", "method", "GET",
                          "port", 443);
  uint64_t id = ce_control_ask(ctl, req, timeout_ms, on_answer, a);
  cr_assert_gt(id, 0);
  cr_assert_eq(a->calls, 0, "called before ce_control_ask returned");
  return id;
}

/* Reads a decision_request and checks its id and fields. */
static void expect_request(client_t *c, uint64_t id) {
  json_t *j = client_read(c);
  cr_assert_not_null(j, "closed instead of a decision_request");
  expect_type(j, "decision_request");
  char want[24];
  snprintf(want, sizeof(want), "%llu", (unsigned long long)id);
  cr_assert_str_eq(str(j, "id"), want);
  cr_assert_str_eq(str(j, "host"), "api.example.com");
  cr_assert_eq(json_integer_value(json_object_get(j, "port")), 443);
  json_decref(j);
}

static void send_decision(client_t *c, uint64_t id, const char *extra) {
  char text[800];
  snprintf(text, sizeof(text), "{\"type\":\"decision\",\"id\":\"%llu\",%s}\n",
           (unsigned long long)id, extra);
  client_send(c, text);
}

/* ---- start refusals ----------------------------------------------------- */

static void refused_start(ce_control_opts_t o, int code, const char *why_part) {
  char err[256] = "";
  ce_control_t *out = (ce_control_t *)&loop; /* a marker: must stay untouched */
  int rc = ce_control_start(&loop, &o, &out, err, sizeof(err));
  cr_assert_eq(rc, code, "%s: got %s (%s)", o.listen, ce_err_name(rc), err);
  cr_assert_eq(out, (ce_control_t *)&loop);
  cr_assert_not_null(strstr(err, why_part), "%s: \"%s\" lacks \"%s\"", o.listen, err,
                     why_part);
}

Test(control, start_refusals) {
  static const char *const not_loopback[] = {
      "0.0.0.0:1234", "10.0.0.1:80", "192.168.1.1:0", "[::]:1", "[2001:db8::1]:80",
      "[::ffff:127.0.0.1]:80",
  };
  for (size_t i = 0; i < sizeof(not_loopback) / sizeof(not_loopback[0]); i++) {
    ce_control_opts_t o = default_opts();
    o.listen = not_loopback[i];
    refused_start(o, CE_EINVAL, "loopback");
  }
  static const char *const malformed[] = {
      "localhost:1", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
      "127.0.0.1:+1", "127.0.0.1:80x", "[::1]", "::1:80", "127.1:80", "", "unix:",
      "unix:relative.sock", "tcp://127.0.0.1:80",
  };
  for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
    ce_control_opts_t o = default_opts();
    o.listen = malformed[i];
    refused_start(o, CE_EINVAL, "listen");
  }
  ce_control_opts_t o = default_opts();
  o.listen = NULL;
  refused_start(o, CE_EINVAL, "missing");

  o = default_opts();
  o.token_len = 15;
  refused_start(o, CE_EINVAL, "token");
  o.token = NULL;
  o.token_len = 16;
  refused_start(o, CE_EINVAL, "token");
  o = default_opts();
  o.token_len = 129;
  refused_start(o, CE_EINVAL, "token");

  o = default_opts();
  o.session_id = "bad \xff utf-8";
  refused_start(o, CE_EINVAL, "session_id");
  /* Both proofs cover the session id: it may not be empty. */
  o.session_id = "";
  refused_start(o, CE_EINVAL, "session_id");
  o.session_id = NULL;
  refused_start(o, CE_EINVAL, "session_id");

  o = default_opts();
  o.stdout_fd = 1000; /* not open */
  refused_start(o, CE_EINVAL, "stdout_fd");

  char path[128], listen[160];
  snprintf(path, sizeof(path), "%s/file", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(listen, sizeof(listen), "unix:%s", path);
  o = default_opts();
  o.listen = listen;
  refused_start(o, CE_EINVAL, "not a socket");
  cr_assert_eq(access(path, F_OK), 0, "a file that is not a socket was removed");

  /* Refusals leave nothing on the loop. */
  cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(control, port_in_use) {
  start();
  char listen[32];
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", ce_control_port(ctl));
  ce_control_opts_t o = default_opts();
  o.listen = listen;
  refused_start(o, CE_EIO, "listen");
  stop();
}

/* ---- authentication -------------------------------------------------------- */

Test(control, tcp_hello_welcome_ping) {
  start();
  cr_assert_gt(ce_control_port(ctl), 0);
  client_t *c = connect_ctl();
  cr_assert_eq(authenticate(c), 0);
  cr_assert(stats().peer_connected);
  cr_assert_eq(stats().auth_failures, 0);
  ping_pong(c);
  ping_pong(c);
  client_free(c);
  cr_assert(pump_until(is_disconnected, NULL, WAIT_MS));
  stop();
}

Test(control, ipv6_loopback) {
  ce_control_opts_t o = default_opts();
  o.listen = "[::1]:0";
  char err[256];
  int rc = ce_control_start(&loop, &o, &ctl, err, sizeof(err));
  if (rc == CE_EIO) {
    uv_loop_close(&loop);
    cr_skip_test("no IPv6 loopback here: %s", err);
  }
  cr_assert_eq(rc, 0, "%s", err);
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in6 sin6;
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons((uint16_t)ce_control_port(ctl));
  sin6.sin6_addr = in6addr_loopback;
  cr_assert_eq(connect(fd, (struct sockaddr *)&sin6, sizeof(sin6)), 0);
  client_t *c = client_new(fd);
  authenticate(c);
  client_free(c);
  stop();
}

Test(control, unix_socket) {
  char path[128], listen[160];
  snprintf(path, sizeof(path), "%s/ctl.sock", dir);
  snprintf(listen, sizeof(listen), "unix:%s", path);
  ce_control_opts_t o = default_opts();
  o.listen = listen;
  start_with(&o);
  cr_assert_eq(ce_control_port(ctl), 0);

  struct stat st;
  cr_assert_eq(lstat(path, &st), 0);
  cr_assert(S_ISSOCK(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);

  client_t *c = connect_unix(path);
  authenticate(c);
  ping_pong(c);
  client_t *bad = connect_unix(path);
  hs_t hs;
  send_hello_sid(bad, &hs, "another-session");
  expect_dropped_silently(bad);
  cr_assert_eq(stats().auth_failures, 1);
  client_free(bad);
  client_free(c);
  stop();
  cr_assert_neq(access(path, F_OK), 0, "the socket file was left behind");
}

Test(control, unix_stale_socket_replaced_live_one_refused) {
  char path[128], listen[160];
  snprintf(path, sizeof(path), "%s/ctl.sock", dir);
  snprintf(listen, sizeof(listen), "unix:%s", path);

  /* A socket file whose listener is gone. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof(sun));
  sun.sun_family = AF_UNIX;
  strcpy(sun.sun_path, path);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
  close(fd);

  ce_control_opts_t o = default_opts();
  o.listen = listen;
  start_with(&o);

  /* A second channel on the same path finds a live listener. */
  ce_control_t *second = NULL;
  char err[256];
  cr_assert_eq(ce_control_start(&loop, &o, &second, err, sizeof(err)), CE_EIO);
  cr_assert_not_null(strstr(err, "in use"), "%s", err);
  cr_assert_null(second);

  client_t *c = connect_unix(path);
  authenticate(c);
  client_free(c);
  stop();
}

/* A process that does not hold the token gets a challenge and then
 * nothing: every wrong proof closes the connection without another byte. */
Test(control, wrong_proof_dropped) {
  start();
  for (int i = 0; i < 6; i++) {
    client_t *c = connect_ctl();
    hs_t hs;
    hello_challenge(c, &hs);
    uint8_t proof[CE_CONTROL_PROOF_LEN];
    static const uint8_t other[16] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
    switch (i) {
    case 0: /* another token */
      cr_assert_eq(ce_control_proof(other, sizeof(other), CE_CONTROL_ROLE_PEER, SID, hs.np, hs.ns,
                                    proof),
                   CE_OK);
      break;
    case 1: /* the sidecar's own proof reflected back */
      proof_of(CE_CONTROL_ROLE_SIDECAR, &hs, proof);
      break;
    case 2: { /* a proof for another session */
      cr_assert_eq(ce_control_proof(TOKEN, sizeof(TOKEN), CE_CONTROL_ROLE_PEER, "other", hs.np,
                                    hs.ns, proof),
                   CE_OK);
      break;
    }
    case 3: { /* the nonces swapped */
      hs_t sw;
      memcpy(sw.np, hs.ns, 32);
      memcpy(sw.ns, hs.np, 32);
      proof_of(CE_CONTROL_ROLE_PEER, &sw, proof);
      break;
    }
    case 4: /* one bit off */
      proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
      proof[0] ^= 0x80;
      break;
    default: /* not an auth at all */
      client_send(c, "{\"type\":\"ping\"}\n");
      break;
    }
    if (i < 5)
      send_proof(c, proof);
    expect_closed_after_challenge(c);
    client_free(c);
    cr_assert_eq(stats().auth_failures, (uint64_t)i + 1);
  }
  cr_assert_not(stats().peer_connected);
  stop();
}

/* A proof is good for its connection only: one seen on another (an
 * attacker relaying or recording) is refused, since the sidecar's nonce
 * differs. */
Test(control, proof_not_replayable) {
  start();
  client_t *a = connect_ctl();
  hs_t hs;
  hello_challenge(a, &hs);
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
  send_proof(a, proof);
  read_welcome(a, &hs);

  /* The same hello nonce and the recorded proof on a new connection. */
  client_t *b = connect_ctl();
  char nonce[65], text[300];
  ce_control_hex(hs.np, 32, nonce);
  snprintf(text, sizeof(text),
           "{\"type\":\"hello\",\"version\":2,\"session_id\":\"%s\",\"nonce\":\"%s\"}\n", SID,
           nonce);
  client_send(b, text);
  json_t *j = client_read(b);
  cr_assert_not_null(j);
  expect_type(j, "challenge");
  cr_assert_str_neq(str(j, "nonce"), "", "");
  json_decref(j);
  send_proof(b, proof);
  expect_closed_after_challenge(b);
  cr_assert_eq(stats().auth_failures, 1);
  client_free(a);
  client_free(b);
  stop();
}

Test(control, bad_first_frames_dropped) {
  start();
  static const char *const frames[] = {
      "{\"type\":\"ping\"}\n",
      "{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"allow\"}\n",
      /* The first protocol's hello, with the right token: refused unread. */
      "{\"type\":\"hello\",\"version\":1,\"token\":\"000102030405060708090a0b0c0d0eff\"}\n",
      "{\"type\":\"hello\",\"version\":2,\"session_id\":\"sess-1\"}\n",
      "{\"type\":\"hello\",\"version\":2,\"session_id\":\"\",\"nonce\":\"" /* empty id */
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
      "{\"type\":\"hello\",\"version\":2,\"session_id\":\"sess-2\",\"nonce\":\"" /* another */
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
      "{\"type\":\"auth\",\"proof\":\"" /* a proof before any challenge */
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
      "not json\n",
      "\n",
  };
  size_t count = sizeof(frames) / sizeof(frames[0]);
  for (size_t i = 0; i < count; i++) {
    client_t *c = connect_ctl();
    client_send(c, frames[i]);
    expect_dropped_silently(c);
    client_free(c);
  }
  /* Connecting and leaving without a word is a missing hello too. */
  client_t *c = connect_ctl();
  pump(20);
  client_free(c);
  pump(50);
  cr_assert_eq(stats().auth_failures, count + 1);
  stop();
}

Test(control, slow_handshake_dropped) {
  ce_control_opts_t o = default_opts();
  o.hello_timeout_ms = 60;
  start_with(&o);
  client_t *silent = connect_ctl();
  client_t *partial = connect_ctl();
  client_send(partial, "{\"type\":\"hello\",\"version\":2,\"session_id\":\"se");
  client_t *no_auth = connect_ctl();
  hs_t hs;
  hello_challenge(no_auth, &hs); /* and then nothing */
  expect_dropped_silently(silent);
  expect_dropped_silently(partial);
  expect_closed_after_challenge(no_auth);
  cr_assert_eq(stats().auth_failures, 3);
  /* A prompt peer still gets in. */
  client_t *c = connect_ctl();
  authenticate(c);
  pump(120);
  ping_pong(c); /* the deadline no longer applies */
  client_free(silent);
  client_free(partial);
  client_free(no_auth);
  client_free(c);
  stop();
}

Test(control, preauth_byte_limit) {
  start();
  client_t *c = connect_ctl();
  char junk[5000];
  memset(junk, ' ', sizeof(junk) - 1);
  junk[sizeof(junk) - 1] = '\0';
  client_send(c, junk);
  expect_dropped_silently(c);
  cr_assert_eq(stats().auth_failures, 1);
  client_free(c);
  stop();
}

Test(control, hello_split_and_auth_pipelined) {
  start();
  client_t *c = connect_ctl();
  hs_t hs;
  cr_assert_eq(ce_control_nonce(hs.np), CE_OK);
  char nonce[65], rest[200];
  ce_control_hex(hs.np, 32, nonce);
  client_send(c, "{\"type\":\"hello\",\"vers");
  pump(20);
  snprintf(rest, sizeof(rest), "ion\":2,\"session_id\":\"%s\",\"nonce\":\"%s\"}\n", SID, nonce);
  client_send(c, rest);
  json_t *j = client_read(c);
  cr_assert_not_null(j);
  expect_type(j, "challenge");
  const char *n = str(j, "nonce");
  cr_assert(ce_control_unhex(n, strlen(n), hs.ns, 32));
  json_decref(j);
  /* The auth and two pings in one write. */
  uint8_t proof[32];
  char hex[65], text[300];
  proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
  ce_control_hex(proof, 32, hex);
  snprintf(text, sizeof(text),
           "{\"type\":\"auth\",\"proof\":\"%s\"}\n{\"type\":\"ping\"}\n{\"type\":\"ping\"}\n", hex);
  client_send(c, text);
  read_welcome(c, &hs);
  for (int i = 0; i < 2; i++) {
    j = client_read(c);
    cr_assert_not_null(j);
    expect_type(j, "pong");
    json_decref(j);
  }
  client_free(c);
  stop();
}

static bool all_closed_up_to(void *arg) {
  client_t **cs = arg;
  for (size_t i = 0; cs[i] != NULL; i++) {
    client_poll(cs[i]);
    if (!cs[i]->closed)
      return false;
  }
  return true;
}

/* A workspace that holds more connections in the handshake than there
 * are slots cannot keep the peer out: each newcomer pushes one out, the
 * oldest of the lowest rank (those that sent no valid hello go before
 * those that did), never the newcomer itself. */
Test(control, preauth_slots_drop_the_oldest_of_the_lowest_rank) {
  start();
  enum { HOLD = CE_CONTROL_MAX_PREAUTH + 40 };
  client_t **held = calloc(HOLD + 1, sizeof(*held));
  cr_assert_not_null(held);
  for (int i = 0; i < HOLD; i++) {
    held[i] = connect_ctl();
    if (i % 2 == 1) { /* half of them mid-handshake, after their challenge */
      hs_t hs;
      hello_challenge(held[i], &hs);
    }
    pump(1);
  }
  /* The 40 newcomers pushed out the 40 oldest silent ones: 0, 2, ..., 78. */
  client_t *gone[41] = {0};
  for (int i = 0; i < 40; i++)
    gone[i] = held[2 * i];
  cr_assert(pump_until(all_closed_up_to, gone, WAIT_MS), "the oldest silent were not dropped");
  for (int i = 0; i < HOLD; i++) {
    if (i % 2 == 0 && i < 80)
      continue;
    client_poll(held[i]);
    cr_assert_not(held[i]->closed, "connection %d was closed", i);
  }
  cr_assert_eq(stats().auth_failures, 40);

  /* The peer connects while every slot is held, and gets in. */
  client_t *c = connect_ctl();
  authenticate(c);
  cr_assert(stats().peer_connected);
  ping_pong(c);
  /* The peer's connection took the slot of held[80], the oldest silent one. */
  cr_assert(pump_until(client_closed, held[80], WAIT_MS));
  for (int i = 0; i < HOLD; i++)
    client_free(held[i]);
  free(held);
  client_free(c);
  stop();
}

/* A hello with a ticket (control/handshake.h) into text; hs->np fresh. */
static void ticket_hello(hs_t *hs, char *text, size_t cap) {
  cr_assert_eq(ce_control_nonce(hs->np), CE_OK);
  uint8_t ticket[CE_CONTROL_PROOF_LEN];
  cr_assert_eq(ce_control_ticket(TOKEN, sizeof(TOKEN), SID, hs->np, ticket), CE_OK);
  char nonce[2 * CE_CONTROL_NONCE_LEN + 1], tk[2 * CE_CONTROL_PROOF_LEN + 1];
  ce_control_hex(hs->np, sizeof(hs->np), nonce);
  ce_control_hex(ticket, sizeof(ticket), tk);
  snprintf(text, cap,
           "{\"type\":\"hello\",\"version\":2,\"session_id\":\"%s\",\"nonce\":\"%s\","
           "\"ticket\":\"%s\"}\n",
           SID, nonce, tk);
}

static void read_challenge(client_t *c, hs_t *hs) {
  json_t *j = client_read(c);
  cr_assert_not_null(j, "closed instead of a challenge");
  expect_type(j, "challenge");
  const char *n = str(j, "nonce");
  cr_assert(ce_control_unhex(n, strlen(n), hs->ns, sizeof(hs->ns)), "nonce %s", n);
  json_decref(j);
}

/* The workspace floods the port while the peer's handshake is in flight,
 * after its hello and before its proof: many times more connections than
 * there are slots, half silent and half with a valid hello (the session
 * id is no secret), and one that replays the peer's hello, ticket and
 * all. None of it pushes out the peer, whose hello carried a ticket; a
 * decision the sidecar was waiting on is asked and answered well inside
 * the handshake's deadline. */
Test(control, a_flood_during_the_handshake_cannot_push_out_the_peer) {
  start();
  answer_t a = {0};
  uint64_t id = ask(&a, 20000);
  uv_update_time(&loop);
  uint64_t t0 = uv_now(&loop);

  client_t *c = connect_ctl();
  hs_t hs;
  char hello[600];
  ticket_hello(&hs, hello, sizeof(hello));
  client_send(c, hello);
  read_challenge(c, &hs);
  client_t *replay = connect_ctl();
  client_send(replay, hello);
  pump(1);

  enum { FLOOD = 3 * CE_CONTROL_MAX_PREAUTH };
  client_t **flood = calloc(FLOOD + 1, sizeof(*flood));
  cr_assert_not_null(flood);
  for (int i = 0; i < FLOOD; i++) {
    flood[i] = connect_ctl();
    if (i % 2 == 1) {
      hs_t x;
      send_hello_sid(flood[i], &x, SID);
    }
    if (i % 16 == 15)
      pump(0);
  }
  pump(5);
  ce_control_stats_t st = stats();
  cr_assert_geq(st.auth_failures, FLOOD + 2 - CE_CONTROL_MAX_PREAUTH, "%llu evicted",
                (unsigned long long)st.auth_failures);
  /* The replayed ticket ranked as a plain hello, and went with them. */
  cr_assert(pump_until(client_closed, replay, WAIT_MS), "the replayed hello kept its slot");

  /* One round trip later, the peer's proof. */
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
  send_proof(c, proof);
  read_welcome(c, &hs);
  expect_request(c, id);
  send_decision(c, id, "\"decision\":\"allow\"");
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_OK);
  cr_assert(a.allow);
  uv_update_time(&loop);
  uint64_t elapsed = uv_now(&loop) - t0;
  cr_assert_lt(elapsed, CE_CONTROL_HELLO_TIMEOUT_MS, "the answer took %llu ms",
               (unsigned long long)elapsed);
  cr_assert(stats().peer_connected);

  for (int i = 0; i < FLOOD; i++)
    client_free(flood[i]);
  free(flood);
  client_free(replay);
  client_free(c);
  stop();
}

/* A ticket that does not check out is refused with the hello: a
 * mistyped one like any malformed member, a wrong one as a plain hello
 * (the proof decides). */
Test(control, hello_ticket_checked) {
  start();
  client_t *c = connect_ctl();
  client_send(c, "{\"type\":\"hello\",\"version\":2,\"session_id\":\"sess-1\",\"nonce\":\"" 
                 "00000000000000000000000000000000000000000000000000000000000000aa\","
                 "\"ticket\":\"XYZ\"}\n");
  expect_dropped_silently(c);
  client_free(c);
  /* A wrong ticket: the handshake goes on (and a right proof gets in). */
  c = connect_ctl();
  hs_t hs;
  cr_assert_eq(ce_control_nonce(hs.np), CE_OK);
  char nonce[65], text[600];
  ce_control_hex(hs.np, sizeof(hs.np), nonce);
  snprintf(text, sizeof(text),
           "{\"type\":\"hello\",\"version\":2,\"session_id\":\"%s\",\"nonce\":\"%s\","
           "\"ticket\":\"%s\"}\n",
           SID, nonce, nonce);
  client_send(c, text);
  read_challenge(c, &hs);
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  proof_of(CE_CONTROL_ROLE_PEER, &hs, proof);
  send_proof(c, proof);
  read_welcome(c, &hs);
  client_free(c);
  stop();
}

static int connect6_fd(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in6 sin6;
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons((uint16_t)port);
  sin6.sin6_addr = in6addr_loopback;
  if (connect(fd, (struct sockaddr *)&sin6, sizeof(sin6)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static bool have_ipv6_loopback(void) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in6 sin6;
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_addr = in6addr_loopback;
  bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sin6, sizeof(sin6)) == 0;
  if (fd >= 0)
    close(fd);
  return ok;
}

/* 127.0.0.1:PORT also holds [::1]:PORT, so that nobody else can listen
 * there for a peer (or a port-forward) that falls back to IPv6. */
Test(control, tcp_binds_both_loopback_families) {
  if (!have_ipv6_loopback()) {
    uv_loop_close(&loop);
    cr_skip_test("no IPv6 loopback here");
  }
  start();
  int port = ce_control_port(ctl);
  int fd = connect6_fd(port);
  cr_assert_geq(fd, 0, "[::1]:%d is not ours", port);
  client_t *c = client_new(fd);
  authenticate(c);

  /* A squatter cannot take [::1]:PORT while we hold it. */
  int sq = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(sq, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  setsockopt(sq, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in6 sin6;
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons((uint16_t)port);
  sin6.sin6_addr = in6addr_loopback;
  cr_assert_neq(bind(sq, (struct sockaddr *)&sin6, sizeof(sin6)), 0);
  close(sq);
  client_free(c);
  stop();
}

/* A sidecar that finds its port taken in either family refuses to start
 * rather than leave that family to whoever took it. */
Test(control, start_refused_when_the_other_family_is_taken) {
  if (!have_ipv6_loopback()) {
    uv_loop_close(&loop);
    cr_skip_test("no IPv6 loopback here");
  }
  int sq = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(sq, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  struct sockaddr_in6 sin6;
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_addr = in6addr_loopback;
  cr_assert_eq(bind(sq, (struct sockaddr *)&sin6, sizeof(sin6)), 0);
  cr_assert_eq(listen(sq, 1), 0);
  socklen_t len = sizeof(sin6);
  cr_assert_eq(getsockname(sq, (struct sockaddr *)&sin6, &len), 0);
  char listen_addr[32];
  snprintf(listen_addr, sizeof(listen_addr), "127.0.0.1:%d", ntohs(sin6.sin6_port));
  ce_control_opts_t o = default_opts();
  o.listen = listen_addr;
  refused_start(o, CE_EIO, "[::1]");

  /* And the same from the other side: [::1]:PORT with 127.0.0.1:PORT taken. */
  int sq4 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(bind(sq4, (struct sockaddr *)&sin, sizeof(sin)), 0);
  cr_assert_eq(listen(sq4, 1), 0);
  len = sizeof(sin);
  cr_assert_eq(getsockname(sq4, (struct sockaddr *)&sin, &len), 0);
  snprintf(listen_addr, sizeof(listen_addr), "[::1]:%d", ntohs(sin.sin_port));
  o.listen = listen_addr;
  refused_start(o, CE_EIO, "IPv4");
  close(sq);
  close(sq4);
  cr_assert_eq(uv_loop_close(&loop), 0);
}

static bool has_refused_events(void *arg) {
  return stats().refused_events >= *(uint64_t *)arg;
}

/* Refusals become control_refused events for the audit trail (stdout and
 * the peer), at most one a second: a workspace that connects in a loop
 * cannot push the request events out of the buffer. */
Test(control, refusals_are_events_rate_limited) {
  start();
  client_t *peer = connect_ctl();
  authenticate(peer);
  for (int i = 0; i < 20; i++) {
    client_t *c = connect_ctl();
    hs_t hs;
    hello_challenge(c, &hs);
    uint8_t proof[32];
    proof_of(CE_CONTROL_ROLE_SIDECAR, &hs, proof); /* a wrong proof */
    send_proof(c, proof);
    expect_closed_after_challenge(c);
    client_free(c);
  }
  uint64_t two = 2;
  cr_assert(pump_until(has_refused_events, &two, WAIT_MS), "no summary event");
  pump(50);
  cr_assert_eq(stats().refused_events, 2, "%llu events for 20 refusals in a second",
               (unsigned long long)stats().refused_events);
  json_int_t total = 0;
  for (int k = 0; k < 2; k++) {
    json_t *j = client_read(peer);
    cr_assert_not_null(j);
    expect_type(j, "event");
    cr_assert_str_eq(str(j, "event"), "control_refused");
    cr_assert_str_eq(str(j, "reason"), "wrong proof");
    cr_assert_not_null(strstr(str(j, "at"), "Z"));
    total += json_integer_value(json_object_get(j, "count"));
    json_decref(j);
  }
  cr_assert_eq(total, 20);
  client_free(peer);
  stop();
}

Test(control, replacement_peer) {
  start();
  client_t *a = connect_ctl();
  authenticate(a);
  client_t *b = connect_ctl();
  authenticate(b);
  cr_assert(pump_until(client_closed, a, WAIT_MS), "the replaced peer stays open");
  cr_assert(stats().peer_connected);
  emit_n(1, 1);
  json_t *j = client_read(b);
  cr_assert_not_null(j);
  expect_type(j, "event");
  cr_assert_eq(json_integer_value(json_object_get(j, "seq")), 1);
  json_decref(j);
  client_free(a);
  client_free(b);
  stop();
}

Test(control, protocol_violations_close_the_peer) {
  start();
  static const char *const frames[] = {
      "{\"type\":\"hello\",\"version\":2,\"session_id\":\"sess-1\",\"nonce\":\""
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
      "{\"type\":\"auth\",\"proof\":\""
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
      "{\"type\":\"pong\"}\n",
      "{\"type\":\"decision\",\"id\":\"01\",\"decision\":\"allow\"}\n",
      "[]\n",
  };
  for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
    client_t *c = connect_ctl();
    authenticate(c);
    client_send(c, frames[i]);
    cr_assert(pump_until(client_closed, c, WAIT_MS), "frame %zu did not close", i);
    cr_assert_not(stats().peer_connected);
    client_free(c);
  }
  cr_assert_eq(stats().auth_failures, 0, "violations after auth are not auth failures");
  stop();
}

/* ---- events -------------------------------------------------------------- */

static void expect_event(client_t *c, json_int_t seq, int n) {
  json_t *j = client_read(c);
  cr_assert_not_null(j, "closed instead of event %lld", (long long)seq);
  expect_type(j, "event");
  cr_assert_eq(json_integer_value(json_object_get(j, "seq")), seq);
  cr_assert_str_eq(str(j, "event"), "request_opened");
  cr_assert_eq(json_integer_value(json_object_get(j, "n")), n);
  /* The envelope comes first. */
  void *it = json_object_iter(j);
  cr_assert_str_eq(json_object_iter_key(it), "type");
  cr_assert_str_eq(json_object_iter_key(json_object_iter_next(j, it)), "seq");
  json_decref(j);
}

Test(control, buffered_events_flushed_in_order) {
  ce_control_opts_t o = default_opts();
  o.buffer_events = 3;
  start_with(&o);
  emit_n(1, 5);
  ce_control_stats_t s = stats();
  cr_assert_eq(s.events, 5);
  cr_assert_eq(s.dropped, 2);

  client_t *c = connect_ctl();
  cr_assert_eq(authenticate(c), 2);
  expect_event(c, 3, 3);
  expect_event(c, 4, 4);
  expect_event(c, 5, 5);
  emit_n(6, 1);
  expect_event(c, 6, 6);
  expect_quiet(c, 20);

  /* A later peer is told the running total. */
  client_free(c);
  cr_assert(pump_until(is_disconnected, NULL, WAIT_MS));
  emit_n(7, 4);
  c = connect_ctl();
  cr_assert_eq(authenticate(c), 3);
  expect_event(c, 8, 8);
  expect_event(c, 9, 9);
  expect_event(c, 10, 10);
  s = stats();
  cr_assert_eq(s.events, 10);
  cr_assert_eq(s.dropped, 3);
  client_free(c);
  stop();
}

static size_t lines_in(client_t *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->len; i++)
    n += c->buf[i] == '\n';
  return n;
}

/* Events for the peer are not written one by one: they gather and go
 * together a millisecond later, or at once with the next decision
 * request, ahead of it, in the same write. */
Test(control, events_to_the_peer_are_batched_and_an_ask_takes_them_along) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  emit_n(1, 3);
  client_poll(c);
  cr_assert_eq(c->len, 0, "an event was written on its own: %.*s", (int)c->len, c->buf);
  answer_t a = {0};
  ask(&a, 5000);
  /* No turn of the loop since: the one write happened inside the ask. */
  client_poll(c);
  cr_assert_eq(lines_in(c), 4, "got: %.*s", (int)c->len, c->buf);
  expect_event(c, 1, 1);
  expect_event(c, 2, 2);
  expect_event(c, 3, 3);
  expect_request(c, 1);
  /* Alone, events arrive within the batch's millisecond. */
  emit_n(4, 2);
  client_poll(c);
  cr_assert_eq(c->len, 0);
  expect_event(c, 4, 4);
  expect_event(c, 5, 5);
  client_free(c);
  stop();
}

Test(control, a_full_batch_of_events_goes_at_once) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  emit_n(1, 63);
  client_poll(c);
  cr_assert_eq(c->len, 0);
  emit_n(64, 1); /* the 64th fills the batch */
  client_poll(c);
  cr_assert_eq(lines_in(c), 64, "got %zu lines", lines_in(c));
  for (int i = 1; i <= 64; i++)
    expect_event(c, i, i);
  expect_quiet(c, 20);
  client_free(c);
  stop();
}

/* Closing writes the events still gathered for the peer before its end
 * of stream: nothing emitted is lost on the way out. */
/* A ring smaller than a batch is written when full, before an event
 * would push its oldest out. */
Test(control, a_small_ring_is_flushed_when_full) {
  ce_control_opts_t o = default_opts();
  o.buffer_events = 3;
  start_with(&o);
  client_t *c = connect_ctl();
  authenticate(c);
  emit_n(1, 7);
  for (int i = 1; i <= 7; i++)
    expect_event(c, i, i);
  cr_assert_eq(stats().dropped, 0);
  client_free(c);
  stop();
}

Test(control, close_writes_the_gathered_events_first) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  emit_n(1, 2);
  client_poll(c);
  cr_assert_eq(c->len, 0);
  stop(); /* the loop is closed after it: read the socket alone */
  for (int k = 0; k < WAIT_MS && !c->closed; k++) {
    client_poll(c);
    if (!c->closed)
      poll(NULL, 0, 1);
  }
  cr_assert(c->closed, "no end of stream");
  cr_assert_eq(lines_in(c), 2, "got: %.*s", (int)c->len, c->buf);
  client_free(c);
}

static bool peer_gone(void *arg) {
  return !stats().peer_connected;
}

/* Every allocation of an ask with events gathered in front of it failing
 * in turn: either the ask fails (and says so through its callback), or the
 * write cannot be made and the peer is closed; then the ask waits for the
 * next peer, which gets it. Nothing leaks, nothing is answered twice. */
Test(control, an_ask_and_its_events_under_allocation_failures) {
  start();
  int peer_closed = 0;
  for (size_t n = 0;; n++) {
    client_t *c = connect_ctl();
    authenticate(c);
    /* More than libuv's four inline buffers: its own allocation fails too. */
    emit_n(1, 6);
    uint64_t dropped = stats().dropped;
    answer_t a = {0};
    json_t *req = json_pack("{s:s}", "host", "api.example.com");
    ce_failalloc_arm(n);
    uint64_t id = ce_control_ask(ctl, req, 5000, on_answer, &a);
    ce_failalloc_disarm();
    size_t failures = ce_failalloc_failures();
    if (id == 0) {
      cr_assert_gt(failures, 0);
    } else if (!stats().peer_connected) {
      /* The write failed: events it held are counted as dropped, and the
       * next peer is sent the waiting ask. */
      uint64_t lost = stats().dropped - dropped;
      cr_assert(lost == 0 || lost == 6, "%llu events counted as dropped", (unsigned long long)lost);
      peer_closed++;
      client_free(c);
      c = connect_ctl();
      authenticate(c);
      json_t *j = NULL;
      while ((j = client_read(c)) != NULL && strcmp(str(j, "type"), "decision_request") != 0)
        json_decref(j);
      cr_assert_not_null(j, "the waiting ask was not sent to the next peer");
      json_decref(j);
      ce_control_cancel(ctl, id);
    } else {
      pump(5);
      if (a.calls == 0)
        ce_control_cancel(ctl, id);
    }
    cr_assert_leq(a.calls, 1);
    client_free(c);
    cr_assert(pump_until(peer_gone, NULL, WAIT_MS));
    if (failures == 0)
      break;
  }
  cr_assert_gt(peer_closed, 0, "no failure reached the write itself");
  stop();
}

Test(control, bad_events_counted_as_dropped) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  ce_control_emit(ctl, NULL);
  ce_control_emit(ctl, json_array());
  ce_control_emit(ctl, json_pack("{s:s}", "event", "ok"));
  json_t *j = client_read(c);
  cr_assert_not_null(j);
  cr_assert_eq(json_integer_value(json_object_get(j, "seq")), 3, "seq counts the drops");
  json_decref(j);
  ce_control_stats_t s = stats();
  cr_assert_eq(s.events, 3);
  cr_assert_eq(s.dropped, 2);
  client_free(c);
  stop();
}

Test(control, events_written_as_text) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  ce_control_emit_with(ctl, write_text, "api.example.com");
  ce_control_emit_with(ctl, write_failing, NULL); /* seq 2: dropped */
  ce_control_emit_with(ctl, write_huge, NULL);    /* seq 3: over 1 MiB, dropped */
  ce_control_emit_with(ctl, write_text, "caf\xe9"); /* seq 4: not UTF-8, dropped */
  ce_control_emit_with(ctl, write_text, "b\"\n");
  char *line = client_read_text(c);
  cr_assert_str_eq(line, "{\"type\":\"event\",\"seq\":1,\"event\":\"request_opened\","
                         "\"host\":\"api.example.com\",\"port\":443}");
  free(line);
  line = client_read_text(c);
  cr_assert_str_eq(line, "{\"type\":\"event\",\"seq\":5,\"event\":\"request_opened\","
                         "\"host\":\"b\\\"\\n\",\"port\":443}");
  free(line);
  ce_control_stats_t s = stats();
  cr_assert_eq(s.events, 5);
  cr_assert_eq(s.dropped, 3);
  client_free(c);
  stop();
}

/* Reads everything from a non-blocking pipe end into buf. */
static size_t drain_pipe(int fd, char *buf, size_t cap, size_t have) {
  for (;;) {
    if (have == cap)
      return have;
    ssize_t r = read(fd, buf + have, cap - have);
    if (r <= 0)
      return have;
    have += (size_t)r;
  }
}

Test(control, events_on_stdout) {
  int fds[2];
  cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
  cr_assert_eq(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  ce_control_opts_t o = default_opts();
  o.stdout_fd = fds[1];
  start_with(&o);
  /* The channel writes through its own open file description. */
  cr_assert_eq(fcntl(fds[1], F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK leaked to the caller's fd");

  emit_n(1, 2); /* no peer */
  client_t *c = connect_ctl();
  authenticate(c);
  emit_n(3, 1);
  expect_event(c, 1, 1);
  expect_event(c, 2, 2);
  expect_event(c, 3, 3);
  pump(20);

  char buf[4096];
  size_t n = drain_pipe(fds[0], buf, sizeof(buf), 0);
  buf[n] = '\0';
  const char *line = buf;
  for (int i = 1; i <= 3; i++) {
    const char *nl = strchr(line, '\n');
    cr_assert_not_null(nl, "stdout has %d lines: %s", i - 1, buf);
    json_t *j = json_loadb(line, (size_t)(nl - line), 0, NULL);
    cr_assert_not_null(j, "bad stdout line: %.*s", (int)(nl - line), line);
    expect_type(j, "event");
    cr_assert_eq(json_integer_value(json_object_get(j, "seq")), i);
    json_decref(j);
    line = nl + 1;
  }
  cr_assert_str_empty(line, "only events go to stdout: %s", line);
  cr_assert_eq(stats().stdout_dropped, 0);
  client_free(c);
  stop();
  close(fds[0]);
  close(fds[1]);
}

Test(control, events_on_stdout_file) {
  char path[128];
  snprintf(path, sizeof(path), "%s/file", dir);
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0);
  ce_control_opts_t o = default_opts();
  o.stdout_fd = fd;
  start_with(&o);
  emit_n(1, 2);
  stop();
  char buf[1024];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  cr_assert_gt(n, 0);
  buf[n] = '\0';
  cr_assert_str_eq(buf, "{\"type\":\"event\",\"seq\":1,\"event\":\"request_opened\",\"n\":1}\n"
                        "{\"type\":\"event\",\"seq\":2,\"event\":\"request_opened\",\"n\":2}\n");
  close(fd);
}

static json_t *big_event(int n, size_t size) {
  char *pad = malloc(size + 1);
  cr_assert_not_null(pad);
  memset(pad, 'p', size);
  pad[size] = '\0';
  json_t *e = json_pack("{s:s, s:i, s:s}", "event", "request_opened", "n", n, "pad", pad);
  free(pad);
  return e;
}

/* stdout is written a millisecond after the first line of a batch, not
 * once per event nor once per turn of the loop; a line larger than the
 * batch goes out on its own, in order; close writes what the batch still
 * holds. */
Test(control, stdout_batched_per_millisecond) {
  char path[128];
  snprintf(path, sizeof(path), "%s/file", dir);
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0);
  ce_control_opts_t o = default_opts();
  o.stdout_fd = fd;
  start_with(&o);
  emit_n(1, 3);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert_eq(st.st_size, 0, "written before the loop turned");
  usleep(3000);
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert_gt(st.st_size, 0, "not written a millisecond later");

  emit_n(4, 1);
  ce_control_emit(ctl, big_event(5, 100 * 1024)); /* flushes 4, then itself */
  emit_n(6, 1);                                      /* batched until close */
  cr_assert_eq(stats().stdout_dropped, 0);
  stop();
  size_t cap = 256 * 1024;
  char *buf = malloc(cap);
  cr_assert_not_null(buf);
  ssize_t n = pread(fd, buf, cap - 1, 0);
  cr_assert_gt(n, 0);
  buf[n] = '\0';
  const char *line = buf;
  for (int i = 1; i <= 6; i++) {
    const char *nl = strchr(line, '\n');
    cr_assert_not_null(nl, "stdout has %d lines", i - 1);
    json_t *j = json_loadb(line, (size_t)(nl - line), 0, NULL);
    cr_assert_not_null(j);
    cr_assert_eq(json_integer_value(json_object_get(j, "seq")), i);
    cr_assert_eq(json_integer_value(json_object_get(j, "n")), i);
    json_decref(j);
    line = nl + 1;
  }
  cr_assert_str_empty(line);
  free(buf);
  close(fd);
}

/* Neither a stdout nobody reads nor a peer that does not read stalls the
 * loop: stdout drops past its bound, the peer's events wait in the ring
 * past the peer's bound and reach it in order once it reads again. */
Test(control, slow_readers_never_block_the_loop) {
  int fds[2];
  cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
  cr_assert_eq(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  ce_control_opts_t o = default_opts();
  o.stdout_fd = fds[1];
  o.buffer_events = 400;
  start_with(&o);
  client_t *c = connect_ctl_slow();
  authenticate(c);

  const int count = 300;
  const size_t size = 60 * 1024; /* 18 MB in all */
  for (int i = 1; i <= count; i++) {
    ce_control_emit(ctl, big_event(i, size));
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  ce_control_stats_t s = stats();
  cr_assert_eq(s.events, (uint64_t)count);
  cr_assert_gt(s.stdout_dropped, 0, "an unread stdout must drop past 8 MiB");
  cr_assert_eq(s.dropped, 0, "the ring holds 400");

  int next = 1;
  while (next <= count) {
    json_t *j = client_read(c);
    cr_assert_not_null(j);
    cr_assert_eq(json_integer_value(json_object_get(j, "seq")), next, "out of order");
    json_decref(j);
    next++;
  }
  client_free(c);
  /* Leave the pipe unread: close gives stdout its flush deadline. */
  stop();
  close(fds[0]);
  close(fds[1]);
}

Test(control, ring_overflow_behind_a_stuck_peer_keeps_order) {
  ce_control_opts_t o = default_opts();
  o.buffer_events = 20;
  start_with(&o);
  client_t *c = connect_ctl_slow();
  authenticate(c);
  const int count = 400; /* 24 MB: more than the kernel, the queue and the ring hold */
  for (int i = 1; i <= count; i++) {
    ce_control_emit(ctl, big_event(i, 60 * 1024));
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  uint64_t dropped = stats().dropped;
  cr_assert_gt(dropped, 0);
  int got = 0;
  json_int_t last = 0;
  while (last < count) {
    json_t *j = client_read(c);
    cr_assert_not_null(j);
    json_int_t seq = json_integer_value(json_object_get(j, "seq"));
    cr_assert_gt(seq, last, "out of order");
    last = seq;
    got++;
    json_decref(j);
  }
  cr_assert_eq((uint64_t)got + dropped, (uint64_t)count);
  client_free(c);
  stop();
}

/* ---- decisions ------------------------------------------------------------- */

Test(control, decision_round_trip) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);

  answer_t a1 = {0}, a2 = {0};
  uint64_t id1 = ask(&a1, 5000);
  uint64_t id2 = ask(&a2, 5000);
  cr_assert_eq(id1, 1);
  cr_assert_eq(id2, 2);
  cr_assert_eq(stats().pending_asks, 2);
  expect_request(c, 1);
  expect_request(c, 2);

  send_decision(c, 2, "\"decision\":\"deny\"");
  cr_assert(pump_until(answered, &a2, WAIT_MS));
  cr_assert_eq(a2.status, CE_OK);
  cr_assert_not(a2.allow);
  cr_assert(a2.reason_null, "no reason → NULL");
  cr_assert_not(a2.cacheable, "no cache member → not cached");

  send_decision(c, 1, "\"decision\":\"allow\",\"reason\":\"looks fine\",\"cache\":false");
  cr_assert(pump_until(answered, &a1, WAIT_MS));
  cr_assert_eq(a1.status, CE_OK);
  cr_assert(a1.allow);
  cr_assert_str_eq(a1.reason, "looks fine");
  cr_assert_not(a1.cacheable);

  /* A second answer for the same id is ignored, not a violation. */
  send_decision(c, 1, "\"decision\":\"deny\"");
  ping_pong(c);
  cr_assert_eq(a1.calls, 1);
  cr_assert_eq(stats().pending_asks, 0);
  client_free(c);
  stop();
}

Test(control, timeout_then_late_decision_ignored) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  answer_t a = {0};
  uint64_t id = ask(&a, 40);
  expect_request(c, id);
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_ETIMEDOUT);
  cr_assert_not(a.allow);
  cr_assert(a.reason_null);

  send_decision(c, id, "\"decision\":\"allow\"");
  send_decision(c, 999, "\"decision\":\"allow\"");
  ping_pong(c);
  cr_assert_eq(a.calls, 1);
  cr_assert(stats().peer_connected, "a late answer is not a violation");
  client_free(c);
  stop();
}

Test(control, ask_without_peer_then_drop_mid_decision) {
  start();
  answer_t a = {0};
  uint64_t id = ask(&a, 10000); /* queued: nobody is connected */

  client_t *first = connect_ctl();
  authenticate(first);
  expect_request(first, id);
  client_free(first); /* drops mid-decision */
  cr_assert(pump_until(is_disconnected, NULL, WAIT_MS));
  cr_assert_eq(a.calls, 0);

  client_t *second = connect_ctl();
  authenticate(second);
  expect_request(second, id); /* sent again */
  send_decision(second, id, "\"decision\":\"allow\"");
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_OK);
  cr_assert(a.allow);
  client_free(second);
  stop();
}

Test(control, violation_keeps_asks_waiting) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  answer_t a = {0};
  uint64_t id = ask(&a, 10000);
  expect_request(c, id);
  client_send(c, "{\"type\":\"decision\",\"id\":\"1\",\"decision\":\"maybe\"}\n");
  cr_assert(pump_until(client_closed, c, WAIT_MS));
  cr_assert_eq(a.calls, 0);
  client_free(c);

  c = connect_ctl();
  authenticate(c);
  expect_request(c, id);
  send_decision(c, id, "\"decision\":\"deny\",\"reason\":\"no\"");
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_OK);
  cr_assert_str_eq(a.reason, "no");
  client_free(c);
  stop();
}

Test(control, cancel) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  answer_t a = {0};
  uint64_t id = ask(&a, 30);
  expect_request(c, id);
  ce_control_cancel(ctl, id);
  ce_control_cancel(ctl, id);     /* twice is fine */
  ce_control_cancel(ctl, 123456); /* unknown is fine */
  cr_assert_eq(stats().pending_asks, 0);
  pump(80);
  send_decision(c, id, "\"decision\":\"allow\"");
  ping_pong(c);
  cr_assert_eq(a.calls, 0);
  client_free(c);
  stop();
}

Test(control, bad_requests_fail_asynchronously) {
  start();
  answer_t a = {0}, b = {0};
  uint64_t id = ce_control_ask(ctl, json_array(), 5000, on_answer, &a);
  cr_assert_gt(id, 0);
  uint64_t id2 = ce_control_ask(ctl, NULL, 5000, on_answer, &b);
  cr_assert_gt(id2, id);
  cr_assert_eq(a.calls + b.calls, 0);
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert(pump_until(answered, &b, WAIT_MS));
  cr_assert_eq(a.status, CE_EINVAL);
  cr_assert_eq(b.status, CE_EINVAL);
  cr_assert_eq(stats().pending_asks, 0);
  stop();
}

Test(control, asks_written_as_text) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  answer_t a = {0}, bad = {0}, huge = {0};
  uint64_t id = ce_control_ask_with(ctl, write_text, "api.example.com", 5000, on_answer, &a);
  cr_assert_gt(id, 0);
  char *line = client_read_text(c);
  char want[256];
  snprintf(want, sizeof(want),
           "{\"type\":\"decision_request\",\"id\":\"%llu\",\"event\":\"request_opened\","
           "\"host\":\"api.example.com\",\"port\":443}",
           (unsigned long long)id);
  cr_assert_str_eq(line, want);
  free(line);
  /* Text that cannot be sent fails the ask, later, with CE_EINVAL. */
  cr_assert_gt(ce_control_ask_with(ctl, write_failing, NULL, 5000, on_answer, &bad), id);
  cr_assert_gt(ce_control_ask_with(ctl, write_huge, NULL, 5000, on_answer, &huge), id);
  cr_assert_eq(bad.calls + huge.calls, 0, "called before ce_control_ask_with returned");
  cr_assert(pump_until(answered, &bad, WAIT_MS));
  cr_assert(pump_until(answered, &huge, WAIT_MS));
  cr_assert_eq(bad.status, CE_EINVAL);
  cr_assert_eq(huge.status, CE_EINVAL);
  cr_assert_not(bad.allow);
  send_decision(c, id, "\"decision\":\"allow\"");
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_OK);
  cr_assert(a.allow);
  ping_pong(c); /* nothing else was sent to the peer */
  client_free(c);
  stop();
}

Test(control, pending_overflow_and_close) {
  start();
  static answer_t answers[CE_CONTROL_MAX_PENDING_ASKS];
  memset(answers, 0, sizeof(answers));
  for (size_t i = 0; i < CE_CONTROL_MAX_PENDING_ASKS; i++)
    ask(&answers[i], 20000);
  cr_assert_eq(stats().pending_asks, CE_CONTROL_MAX_PENDING_ASKS);

  answer_t extra = {0};
  uint64_t id = ask(&extra, 20000);
  cr_assert_eq(id, CE_CONTROL_MAX_PENDING_ASKS + 1);
  cr_assert_eq(extra.calls, 0);
  cr_assert(pump_until(answered, &extra, WAIT_MS));
  cr_assert_eq(extra.status, CE_EUNAVAIL);
  cr_assert_eq(stats().pending_asks, CE_CONTROL_MAX_PENDING_ASKS);

  /* A peer that connects now gets every pending request, in order. */
  client_t *c = connect_ctl();
  authenticate(c);
  for (uint64_t i = 1; i <= CE_CONTROL_MAX_PENDING_ASKS; i++)
    expect_request(c, i);

  int done = 0;
  ce_control_close(ctl, on_done, &done);
  for (size_t i = 0; i < CE_CONTROL_MAX_PENDING_ASKS; i++) {
    cr_assert_eq(answers[i].calls, 1, "ask %zu not answered by close", i);
    cr_assert_eq(answers[i].status, CE_EUNAVAIL);
  }
  cr_assert_eq(done, 0, "done before the handles closed");
  cr_assert(pump_until(client_closed, c, WAIT_MS), "the peer was not closed");
  uint64_t end = uv_hrtime() + (uint64_t)WAIT_MS * 1000000u;
  while (done == 0 && uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(done, 1);
  cr_assert_eq(uv_loop_close(&loop), 0);
  client_free(c);
}

Test(control, close_from_a_decision_callback) {
  start();
  client_t *c = connect_ctl();
  authenticate(c);
  int done = 0;
  answer_t a = {0}, b = {0};
  a.close_channel = true;
  a.done = &done;
  uint64_t id = ask(&a, 10000);
  ask(&b, 10000);
  expect_request(c, id);
  expect_request(c, id + 1);
  /* The answer and more frames in one read: the frames after the close
   * must not be processed. */
  char text[300];
  snprintf(text, sizeof(text),
           "{\"type\":\"decision\",\"id\":\"%llu\",\"decision\":\"allow\"}\n"
           "{\"type\":\"decision\",\"id\":\"%llu\",\"decision\":\"allow\"}\n"
           "{\"type\":\"ping\"}\n",
           (unsigned long long)id, (unsigned long long)id + 1);
  client_send(c, text);
  cr_assert(pump_until(answered, &a, WAIT_MS));
  cr_assert_eq(a.status, CE_OK);
  cr_assert_eq(b.calls, 1);
  cr_assert_eq(b.status, CE_EUNAVAIL, "the close answered b before its decision was read");
  uint64_t end = uv_hrtime() + (uint64_t)WAIT_MS * 1000000u;
  while (done == 0 && uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(done, 1);
  cr_assert_eq(uv_loop_close(&loop), 0);
  client_poll(c);
  cr_assert_null(strstr(c->buf, "pong"), "a frame after the close was answered");
  client_free(c);
}

/* ---- credential frames (a rotated secret) ---------------------------------- */

typedef struct {
  int calls;
  char name[64];
  char value[64];
  size_t len;
  int answer;
} cred_seen_t;

static int on_cred(void *data, const char *name, const char *value, size_t len) {
  cred_seen_t *s = data;
  s->calls++;
  snprintf(s->name, sizeof(s->name), "%s", name);
  snprintf(s->value, sizeof(s->value), "%.*s", (int)len, value);
  s->len = len;
  return s->answer;
}

Test(control, credential_frame_taken_then_refused) {
  cred_seen_t seen = {0};
  ce_control_opts_t o = default_opts();
  o.on_credential = on_cred;
  o.credential_data = &seen;
  start_with(&o);
  client_t *c = connect_ctl();
  cr_assert_eq(authenticate(c), 0);
  client_send(c, "{\"type\":\"credential\",\"name\":\"github\",\"value\":\"Bearer two\"}\n");
  /* The pong after it: the value was handed over before. */
  ping_pong(c);
  cr_assert_eq(seen.calls, 1);
  cr_assert_str_eq(seen.name, "github");
  cr_assert_str_eq(seen.value, "Bearer two");
  cr_assert_eq(seen.len, 10);

  /* The proxy refuses it (no such secret): the peer is closed. */
  seen.answer = CE_EINVAL;
  client_send(c, "{\"type\":\"credential\",\"name\":\"nope\",\"value\":\"x\"}\n");
  cr_assert(pump_until(client_closed, c, WAIT_MS), "a refused credential did not close the peer");
  cr_assert_eq(seen.calls, 2);
  client_free(c);
  cr_assert(pump_until(is_disconnected, NULL, WAIT_MS));
  stop();
}

Test(control, credential_frame_without_a_taker_is_a_violation) {
  start();
  client_t *c = connect_ctl();
  cr_assert_eq(authenticate(c), 0);
  client_send(c, "{\"type\":\"credential\",\"name\":\"github\",\"value\":\"v\"}\n");
  cr_assert(pump_until(client_closed, c, WAIT_MS), "a credential frame without a taker did not close the peer");
  client_free(c);
  stop();
}
