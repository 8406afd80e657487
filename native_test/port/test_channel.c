/* Tests for c_src/port/channel.c: the port binary attaches to a real
 * sidecar control channel. The sidecar side is c_src/control run in this
 * process on a libuv loop (ce_control_start, as the proxy runs it), pumped
 * while the test waits for the port's packets, so events and decision
 * requests can be made at will. Checked: a wrong token is a closed error,
 * welcome is the reply, events arrive as frames in order, the credit
 * window holds frames back until acknowledged, decisions sent with
 * control_send reach the sidecar, and closing either side is reported
 * once. */
#include <criterion/criterion.h>
#include <ei.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "control/control.h"
#include "control/handshake.h"
#include "support/port_proc.h"

#define TEST_ALARM_S 60
#define WAIT_MS 10000
/* How long "nothing more arrives" is watched for. */
#define QUIET_MS 300

static uv_loop_t loop;
static ce_control_t *ctl;
static ce_test_port_t pp;
static char dir[64];
static char sock[128];

static const uint8_t TOKEN[16] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                  0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0xff};
#define TOKEN_HEX "000102030405060708090a0b0c0d0eff"
#define SID_OPT "#{session_id => <<\"sess-port\">>}"

static void pump_once(void *arg) { uv_run(&loop, UV_RUN_NOWAIT); }

static void start_sidecar(const char *listen) {
  ce_control_opts_t o;
  memset(&o, 0, sizeof(o));
  o.listen = listen;
  o.token = TOKEN;
  o.token_len = sizeof(TOKEN);
  o.session_id = "sess-port";
  o.stdout_fd = -1;
  char err[256];
  cr_assert_eq(ce_control_start(&loop, &o, &ctl, err, sizeof(err)), 0, "%s", err);
}

static void setup(void) {
  signal(SIGPIPE, SIG_IGN);
  alarm(TEST_ALARM_S);
  ei_init();
  cr_assert_eq(uv_loop_init(&loop), 0);
  strcpy(dir, "/tmp/ce_test_pchan_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(sock, sizeof(sock), "%s/ctl.sock", dir);
  char listen[160];
  snprintf(listen, sizeof(listen), "unix:%s", sock);
  start_sidecar(listen);
  ce_test_port_start(&pp);
  pp.idle = pump_once;
}

static void on_closed(void *data) { (*(int *)data)++; }

static void stop_sidecar(void) {
  if (ctl == NULL)
    return;
  int done = 0;
  ce_control_close(ctl, on_closed, &done);
  ctl = NULL;
  for (int k = 0; k < 20000 && done == 0; k++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(done, 1);
}

static void teardown(void) {
  unlink(sock);
  rmdir(dir);
}

TestSuite(port_channel, .init = setup, .fini = teardown);

/* Ends a test: the port exits 0 on stdin EOF with channels open, then the
 * sidecar closes and the loop is empty. */
static void finish(void) {
  int code = ce_test_port_finish(&pp, WAIT_MS);
  cr_assert_eq(code, 0, "exit status %d", code);
  stop_sidecar();
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(uv_loop_close(&loop), 0, "handles left on the loop");
}

static char *recv_term(void) {
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_not_null(r, "no packet from the port");
  return r;
}

static void expect_packet(const char *expected) {
  char *got = recv_term();
  char shown[2048];
  snprintf(shown, sizeof(shown), "%s", got);
  bool same = strcmp(got, expected) == 0;
  free(got);
  cr_assert(same, "\n     got: %s\nexpected: %s", shown, expected);
}

static void expect_quiet(void) {
  char *r = ce_test_port_recv(&pp, QUIET_MS);
  char shown[1024];
  snprintf(shown, sizeof(shown), "%s", r != NULL ? r : "");
  free(r);
  cr_assert_eq(r, NULL, "unexpected packet %s", shown);
}

static void attach(int window) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, "
           "#{window => %d, timeout => 5000, session_id => <<\"sess-port\">>}}}",
           sock, window);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,1,{ok,{1,#{<<\"type\">> => <<\"welcome\">>,<<\"version\">> => 2,"
                "<<\"session_id\">> => <<\"sess-port\">>,<<\"dropped\">> => 0}}}}");
}

static void emit(int n) {
  json_t *e = json_pack("{s:s, s:i, s:[[s,s]], s:n}", "event", "request_opened", "n", n,
                        "headers", "a", "b", "query");
  ce_control_emit(ctl, e);
}

static char *event_frame(int seq, int n) {
  static char buf[512];
  snprintf(buf, sizeof(buf),
           "{control,1,{frame,#{<<\"type\">> => <<\"event\">>,<<\"seq\">> => %d,"
           "<<\"event\">> => <<\"request_opened\">>,<<\"n\">> => %d,"
           "<<\"headers\">> => [[<<\"a\">>,<<\"b\">>]],<<\"query\">> => nil}}}",
           seq, n);
  return buf;
}

Test(port_channel, welcome_then_buffered_and_live_events) {
  emit(1); /* buffered before any peer */
  attach(16);
  expect_packet(event_frame(1, 1));
  emit(2);
  expect_packet(event_frame(2, 2));
  finish();
}

Test(port_channel, wrong_token_is_closed_before_welcome) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 7, {control_attach, {unix, <<\"%s\">>}, <<\"" "ff" TOKEN_HEX "\">>, " SID_OPT
           "}}",
           sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,7,{error,{closed,<<\"the control channel closed during the handshake (a "
                "wrong token or session id, another protocol version, or not a condukt "
                "sidecar)\">>}}}");
  ce_control_stats_t st;
  ce_control_stats(ctl, &st);
  cr_assert_eq(st.auth_failures, 1);
  finish();
}

/* The frames of one read are written to stdout together, at most
 * CE__PORT_BATCH_MAX at a time: more than two batches' worth, arriving at
 * once after the welcome, all come through whole and in order. */
Test(port_channel, many_frames_of_one_read_arrive_whole_and_in_order) {
  enum { N = 150 };
  for (int k = 1; k <= N; k++)
    emit(k); /* buffered, sent together after the welcome */
  attach(256);
  for (int k = 1; k <= N; k++)
    expect_packet(event_frame(k, k));
  emit(N + 1);
  expect_packet(event_frame(N + 1, N + 1));
  finish();
}

/* The BEAM's end of stdout goes away while the sidecar sends a burst of
 * frames (held and written together, as many as one read brings): the
 * write of held packets fails, they are freed, and the port stops with
 * status 1 (it neither hangs nor dies of SIGPIPE). */
Test(port_channel, a_failed_write_of_held_frames_stops_the_port) {
  attach(256);
  close(pp.out);
  pp.out = -1;
  for (int k = 1; k <= 100; k++)
    emit(k); /* one read of the port: written together */
  int status = 0;
  pid_t r = 0;
  for (int k = 0; k < WAIT_MS && r == 0; k++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    r = waitpid(pp.pid, &status, WNOHANG);
    if (r == 0)
      poll(NULL, 0, 1);
  }
  cr_assert_eq(r, pp.pid, "the port did not stop");
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
  FILE *f = fopen(pp.err_path, "r");
  cr_assert_not_null(f);
  char line[256] = "";
  bool said = false;
  while (fgets(line, sizeof(line), f) != NULL)
    said = said || strstr(line, "cannot write to stdout") != NULL;
  fclose(f);
  cr_assert(said, "the port did not say why it stopped");
  close(pp.in);
  unlink(pp.err_path);
  stop_sidecar();
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(uv_loop_close(&loop), 0, "handles left on the loop");
}

Test(port_channel, credit_window_holds_frames_until_ack) {
  attach(3);
  for (int k = 1; k <= 10; k++)
    emit(k);
  for (int k = 1; k <= 3; k++)
    expect_packet(event_frame(k, k));
  expect_quiet();
  ce_test_port_send(&pp, "{ack, 1, 2}");
  expect_packet(event_frame(4, 4));
  expect_packet(event_frame(5, 5));
  expect_quiet();
  /* Acks beyond what was delivered grant no more than the window. */
  ce_test_port_send(&pp, "{ack, 1, 1000}");
  for (int k = 6; k <= 8; k++)
    expect_packet(event_frame(k, k));
  expect_quiet();
  ce_test_port_send(&pp, "{ack, 1, 3}");
  expect_packet(event_frame(9, 9));
  expect_packet(event_frame(10, 10));
  expect_quiet();
  finish();
}

typedef struct {
  int calls;
  int status;
  bool allow;
  char reason[64];
  bool cacheable;
} answer_t;

static void on_decision(void *data, int status, bool allow, const char *reason, bool cacheable) {
  answer_t *a = data;
  a->calls++;
  a->status = status;
  a->allow = allow;
  a->cacheable = cacheable;
  snprintf(a->reason, sizeof(a->reason), "%s", reason != NULL ? reason : "");
}

Test(port_channel, decisions_round_trip) {
  attach(8);
  answer_t ans = {0};
  uint64_t id = ce_control_ask(ctl, json_pack("{s:s}", "host", "evil.com"), 5000, on_decision,
                               &ans);
  cr_assert_eq(id, 1);
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"decision_request\">>,"
                "<<\"id\">> => <<\"1\">>,<<\"host\">> => <<\"evil.com\">>}}}");
  ce_test_port_send(&pp, "{call, 2, {control_send, 1, #{type => decision, id => <<\"1\">>, "
                         "decision => deny, reason => <<\"exfiltration\">>, cache => false}}}");
  expect_packet("{reply,2,ok}");
  for (int k = 0; k < 5000 && ans.calls == 0; k++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(ans.calls, 1);
  cr_assert_eq(ans.status, CE_OK);
  cr_assert_not(ans.allow);
  cr_assert_not(ans.cacheable);
  cr_assert_str_eq(ans.reason, "exfiltration");
  /* ping is relayed too, and the pong comes back as a frame. */
  ce_test_port_send(&pp, "{call, 3, {control_send, 1, #{<<\"type\">> => <<\"ping\">>}}}");
  expect_packet("{reply,3,ok}");
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"pong\">>}}}");
  finish();
}

Test(port_channel, control_send_refusals) {
  attach(8);
  ce_test_port_send(&pp, "{call, 2, {control_send, 1, #{type => decision, id => <<\"x\">>, "
                         "decision => allow}}}");
  expect_packet("{reply,2,{error,{inval,<<\"control_send: frame: decision: \\\"id\\\" must be a "
                "decimal string of a uint64\">>}}}");
  ce_test_port_send(&pp, "{call, 3, {control_send, 1, #{type => auth, proof => <<\""
                         "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\">>}}}");
  expect_packet("{reply,3,{error,{inval,<<\"control_send: frame: the handshake is "
                "control_attach's alone\">>}}}");
  ce_test_port_send(&pp, "{call, 4, {control_send, 1, #{type => ping, x => {1, 2}}}}");
  expect_packet("{reply,4,{error,{badarg,<<\"control_send: frame.x: a tuple is not JSON\">>}}}");
  ce_test_port_send(&pp, "{call, 5, {control_send, 1, [ping]}}");
  expect_packet("{reply,5,{error,{badarg,<<\"control_send: Frame must be a map\">>}}}");
  ce_test_port_send(&pp, "{call, 6, {control_send, 9, #{type => ping}}}");
  expect_packet("{reply,6,{error,{closed,<<\"control_send: channel 9 is not open\">>}}}");
  ce_test_port_send(&pp, "{call, 7, {control_send, 0, #{type => ping}}}");
  expect_packet("{reply,7,{error,{badarg,<<\"control_send: Chan must be a positive integer\">>}}}");
  /* Deeper than the sidecar's parser goes (16), within the mapping's 32. */
  ce_test_port_send(&pp, "{call, 9, {control_send, 1, #{type => ping, x => "
                         "[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}}}");
  expect_packet("{reply,9,{error,{inval,<<\"control_send: frame: frame nested deeper than "
                "16\">>}}}");
  /* Over 1 MiB of JSON with its newline, and just within it. */
  size_t room = CE_CONTROL_MAX_FRAME - strlen("{\"type\":\"ping\",\"x\":\"\"}\n");
  for (int k = 0; k < 2; k++) {
    size_t n = room + (k == 0 ? 1 : 0);
    char *req = malloc(n + 100);
    cr_assert_not_null(req);
    int len = snprintf(req, 100, "{call, %d, {control_send, 1, #{type => ping, x => <<\"",
                       10 + k);
    memset(req + len, 'a', n);
    strcpy(req + (size_t)len + n, "\">>}}}");
    ce_test_port_send(&pp, req);
    free(req);
  }
  expect_packet("{reply,10,{error,{toobig,<<\"control_send: the frame is over the control "
                "channel's limit of 1048576 bytes of JSON\">>}}}");
  expect_packet("{reply,11,ok}");
  /* The sidecar read the 1 MiB line: its pong. */
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"pong\">>}}}");
  /* The channel survived all of that. */
  ce_test_port_send(&pp, "{call, 8, {control_send, 1, #{type => ping}}}");
  expect_packet("{reply,8,ok}");
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"pong\">>}}}");
  finish();
}

static void on_post_decision(void *data, int status, bool allow, const char *reason,
                             bool cacheable) {
  int *got = data;
  *got = status == CE_OK && allow ? 1 : -1;
}

/* A post is control_send without the reply: a frame that is queued gets
 * no answer at all, one that is not gets {send_failed, Tag, {Code, Msg}}
 * on the channel, with the poster's Tag as it was sent. */
Test(port_channel, post_answers_only_failures) {
  attach(8);
  int got = 0;
  cr_assert_eq(ce_control_ask(ctl, json_pack("{s:s}", "host", "a.test"), 5000, on_post_decision,
                              &got),
               1);
  char *req = recv_term();
  cr_assert(strstr(req, "decision_request") != NULL, "%s", req);
  free(req);
  ce_test_port_send(&pp, "{post, 1, {decision, <<\"1\">>, allow}, #{type => decision, "
                         "id => <<\"1\">>, decision => allow, cache => false}}");
  for (int k = 0; k < 2000 && got == 0; k++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_assert_eq(got, 1, "the posted decision did not reach the sidecar");
  expect_quiet();
  /* Refused by the sidecar's rules, by the mapping, not a map, and a
   * channel that is not open: each a send_failed with its Tag. */
  ce_test_port_send(&pp, "{post, 1, {t, 1}, #{type => decision, id => <<\"x\">>}}");
  expect_packet("{control,1,{send_failed,{t,1},{inval,<<\"control_send: frame: decision: "
                "\\\"id\\\" must be a decimal string of a uint64\">>}}}");
  ce_test_port_send(&pp, "{post, 1, {t, 2}, #{type => ping, x => {1}}}");
  expect_packet("{control,1,{send_failed,{t,2},{badarg,<<\"post: frame.x: a tuple is not "
                "JSON\">>}}}");
  ce_test_port_send(&pp, "{post, 1, [t, 3], [ping]}");
  expect_packet("{control,1,{send_failed,[t,3],{badarg,<<\"post: Frame must be a map\">>}}}");
  ce_test_port_send(&pp, "{post, 9, <<\"t4\">>, #{type => ping}}");
  expect_packet("{control,9,{send_failed,<<\"t4\">>,{closed,<<\"control_send: channel 9 is not "
                "open\">>}}}");
  /* The channel is fine: a posted ping is answered by the sidecar only. */
  ce_test_port_send(&pp, "{post, 1, t5, #{type => ping}}");
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"pong\">>}}}");
  expect_quiet();
  finish();
}

Test(port_channel, sidecar_gone_is_closed_once_after_pending_frames) {
  attach(1);
  emit(1);
  emit(2);
  expect_packet(event_frame(1, 1));
  expect_quiet();
  stop_sidecar();
  /* The second event was read before the close; it still comes, under
   * credit, and then closed, once. */
  ce_test_port_send(&pp, "{ack, 1, 1}");
  expect_packet(event_frame(2, 2));
  ce_test_port_send(&pp, "{ack, 1, 1}");
  expect_packet("{control,1,{closed,<<\"the sidecar closed the control channel\">>}}");
  expect_quiet();
  ce_test_port_send(&pp, "{call, 2, {control_send, 1, #{type => ping}}}");
  expect_packet("{reply,2,{error,{closed,<<\"control_send: channel 1 is not open\">>}}}");
  finish();
}

Test(port_channel, detach_sends_no_closed) {
  attach(4);
  ce_test_port_send(&pp, "{call, 2, {control_detach, 1}}");
  expect_packet("{reply,2,ok}");
  emit(1);
  expect_quiet();
  /* Detaching again, or a channel never opened, is ok too. */
  ce_test_port_send(&pp, "{call, 3, {control_detach, 1}}");
  expect_packet("{reply,3,ok}");
  /* A second attach gets a new channel number. */
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 4, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, " SID_OPT "}}", sock);
  ce_test_port_send(&pp, req);
  char *r = recv_term();
  bool ok = strncmp(r, "{reply,4,{ok,{2,#{<<\"type\">> => <<\"welcome\">>", 44) == 0;
  free(r);
  cr_assert(ok, "the second attach");
  expect_packet("{control,2,{frame,#{<<\"type\">> => <<\"event\">>,<<\"seq\">> => 1,"
                "<<\"event\">> => <<\"request_opened\">>,<<\"n\">> => 1,"
                "<<\"headers\">> => [[<<\"a\">>,<<\"b\">>]],<<\"query\">> => nil}}}");
  finish();
}

Test(port_channel, attach_errors) {
  ce_test_port_send(&pp, "{call, 1, {control_attach, {unix, <<\"/nonexistent/ctl.sock\">>}, <<\""
                         TOKEN_HEX "\">>, " SID_OPT "}}");
  expect_packet("{reply,1,{error,{unavail,<<\"cannot connect to unix:/nonexistent/ctl.sock: no "
                "such file or directory\">>}}}");
  ce_test_port_send(&pp, "{call, 2, {control_attach, {tcp, <<\"10.1.2.3\">>, 80}, <<\"" TOKEN_HEX
                         "\">>, " SID_OPT "}}");
  expect_packet("{reply,2,{error,{inval,<<\"control_attach: address 10.1.2.3:80: 10.1.2.3 is "
                "not a loopback address (127.0.0.0/8)\">>}}}");
  ce_test_port_send(&pp, "{call, 3, {control_attach, {tcp, <<\"example.com\">>, 80}, <<\""
                         TOKEN_HEX "\">>, " SID_OPT "}}");
  expect_packet("{reply,3,{error,{inval,<<\"control_attach: address example.com:80: "
                "\\\"example.com\\\" is not an IP address (names are not resolved)\">>}}}");
  ce_test_port_send(&pp, "{call, 4, {control_attach, {tcp, <<\"::1\">>, 0}, <<\"" TOKEN_HEX
                         "\">>, " SID_OPT "}}");
  expect_packet("{reply,4,{error,{badarg,<<\"control_attach: PortNumber must be an integer "
                "from 1 to 65535\">>}}}");
  ce_test_port_send(&pp, "{call, 5, {control_attach, {udp, <<\"x\">>}, <<\"" TOKEN_HEX
                         "\">>, " SID_OPT "}}");
  expect_packet("{reply,5,{error,{badarg,<<\"control_attach: Address must be {unix, Path} or "
                "{tcp, Host, PortNumber}\">>}}}");
  char req[512];
  snprintf(req, sizeof(req), "{call, 6, {control_attach, {unix, <<\"%s\">>}, <<\"ABCD\">>, #{}}}",
           sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,6,{error,{inval,<<\"control_attach: Token must be 32 to 256 lowercase "
                "hex digits (16 to 128 bytes)\">>}}}");
  snprintf(req, sizeof(req),
           "{call, 7, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, "
           "#{window => 0}}}", sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,7,{error,{inval,<<\"control_attach: window must be 1 to 65536, not "
                "0\">>}}}");
  snprintf(req, sizeof(req),
           "{call, 8, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, "
           "#{colour => 1}}}", sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,8,{error,{badarg,<<\"control_attach: unknown option \\\"colour\\\" "
                "(expected session_id, timeout, window)\">>}}}");
  snprintf(req, sizeof(req),
           "{call, 9, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, []}}", sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,9,{error,{badarg,<<\"control_attach: AttachOpts must be a map\">>}}}");
  finish();
}

/* Leaves connections in the kernel's queue: they connect, and nobody
 * ever answers their hello. */
static void never_accept(uv_stream_t *server, int status) {}

Test(port_channel, tcp_and_timeout) {
  /* A second sidecar on loopback TCP. */
  ce_control_t *unix_ctl = ctl;
  start_sidecar("127.0.0.1:0");
  int port = ce_control_port(ctl);
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {control_attach, {tcp, <<\"localhost\">>, %d}, <<\"" TOKEN_HEX
           "\">>, " SID_OPT "}}", port);
  ce_test_port_send(&pp, req);
  char *r = recv_term();
  bool ok = strncmp(r, "{reply,1,{ok,{1,#{<<\"type\">> => <<\"welcome\">>", 44) == 0;
  free(r);
  cr_assert(ok, "attach over TCP");
  stop_sidecar();
  expect_packet("{control,1,{closed,<<\"the sidecar closed the control channel\">>}}");
  ctl = unix_ctl;

  /* A listener that never answers: the timeout fires. */
  uv_tcp_t silent;
  cr_assert_eq(uv_tcp_init(&loop, &silent), 0);
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.1", 0, &sa);
  cr_assert_eq(uv_tcp_bind(&silent, (const struct sockaddr *)&sa, 0), 0);
  cr_assert_eq(uv_listen((uv_stream_t *)&silent, 4, never_accept), 0);
  struct sockaddr_storage bound;
  int blen = sizeof(bound);
  uv_tcp_getsockname(&silent, (struct sockaddr *)&bound, &blen);
  snprintf(req, sizeof(req),
           "{call, 2, {control_attach, {tcp, <<\"127.0.0.1\">>, %d}, <<\"" TOKEN_HEX
           "\">>, #{timeout => 200, session_id => <<\"sess-port\">>}}}", ntohs(((struct sockaddr_in *)&bound)->sin_port));
  ce_test_port_send(&pp, req);
  char expect[256];
  snprintf(expect, sizeof(expect),
           "{reply,2,{error,{timedout,<<\"no welcome from 127.0.0.1:%d within 200 ms\">>}}}",
           ntohs(((struct sockaddr_in *)&bound)->sin_port));
  expect_packet(expect);
  uv_close((uv_handle_t *)&silent, NULL);
  finish();
}

/* A process that listens where the sidecar should (a squatter) and plays
 * the sidecar's part as far as it can without the token. */
typedef struct {
  int lfd, c;
} squat_t;

static void squat_start(squat_t *q) {
  stop_sidecar();
  uv_run(&loop, UV_RUN_NOWAIT);
  q->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sun;
  memset(&sun, 0, sizeof(sun));
  sun.sun_family = AF_UNIX;
  strcpy(sun.sun_path, sock);
  unlink(sock);
  cr_assert_eq(bind(q->lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
  cr_assert_eq(listen(q->lfd, 1), 0);
  q->c = -1;
}

/* Sends an attach (id) and accepts it; returns the hello line it got. */
static void squat_accept(squat_t *q, int id, char *line, size_t cap) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, %d, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, " SID_OPT "}}",
           id, sock);
  ce_test_port_send(&pp, req);
  q->c = accept(q->lfd, NULL, NULL);
  cr_assert(q->c >= 0);
  ssize_t n = read(q->c, line, cap - 1);
  cr_assert(n > 0);
  line[n] = '\0';
}

static void squat_say(squat_t *q, const char *text) {
  cr_assert_eq(write(q->c, text, strlen(text)), (ssize_t)strlen(text));
}

static void squat_end(squat_t *q) {
  if (q->c >= 0)
    close(q->c);
  q->c = -1;
}

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* The squatter learns a nonce and the session id, never the token, and
 * whatever it answers, the attach fails. */
Test(port_channel, a_squatter_learns_nothing_and_is_refused) {
  squat_t q;
  squat_start(&q);
  char line[1024], expect[600];

  /* 1. The hello: no token, a fresh nonce. */
  squat_accept(&q, 1, line, sizeof(line));
  cr_assert_null(strstr(line, TOKEN_HEX), "the token was sent: %s", line);
  json_error_t jerr;
  json_t *hello = json_loads(line, 0, &jerr);
  cr_assert_not_null(hello, "%s", line);
  cr_assert_str_eq(json_string_value(json_object_get(hello, "type")), "hello");
  cr_assert_eq(json_integer_value(json_object_get(hello, "version")), 2);
  cr_assert_str_eq(json_string_value(json_object_get(hello, "session_id")), "sess-port");
  const char *nonce_hex = json_string_value(json_object_get(hello, "nonce"));
  cr_assert_eq(strlen(nonce_hex), 64);
  /* The ticket: the token's HMAC over the peer's own nonce, which ranks
   * the connection during the handshake and gives no proof away. */
  const char *ticket_hex = json_string_value(json_object_get(hello, "ticket"));
  cr_assert_not_null(ticket_hex, "%s", line);
  uint8_t tok[16], np[CE_CONTROL_NONCE_LEN], ticket[CE_CONTROL_PROOF_LEN];
  cr_assert(ce_control_unhex(TOKEN_HEX, 32, tok, sizeof(tok)));
  cr_assert(ce_control_unhex(nonce_hex, 64, np, sizeof(np)));
  cr_assert(ce_control_unhex(ticket_hex, strlen(ticket_hex), ticket, sizeof(ticket)));
  cr_assert(ce_control_ticket_ok(tok, sizeof(tok), "sess-port", np, ticket));
  cr_assert_eq(json_object_size(hello), 5);
  json_decref(hello);
  /* Not a challenge at all. */
  squat_say(&q, "{\"type\":\"pong\"}\n");
  snprintf(expect, sizeof(expect),
           "{reply,1,{error,{proto,<<\"the challenge from unix:%s is malformed: neither a "
           "challenge nor a welcome\">>}}}",
           sock);
  expect_packet(expect);
  squat_end(&q);

  /* 2. A made-up proof; 3. the port's own proof reflected back as the
   * sidecar's; 4. another session's sidecar. */
  for (int k = 0; k < 3; k++) {
    int id = 2 + k;
    squat_accept(&q, id, line, sizeof(line));
    squat_say(&q, "{\"type\":\"challenge\",\"version\":2,\"nonce\":\"" H64 "\"}\n");
    ssize_t n = read(q.c, line, sizeof(line) - 1);
    cr_assert(n > 24 + 64);
    line[n] = '\0';
    cr_assert(strncmp(line, "{\"type\":\"auth\",\"proof\":\"", 24) == 0, "%s", line);
    char welcome[400];
    snprintf(welcome, sizeof(welcome),
             "{\"type\":\"welcome\",\"version\":2,\"dropped\":0,\"session_id\":\"%s\","
             "\"proof\":\"%.64s\"}\n",
             k == 2 ? "other" : "sess-port", k == 1 ? line + 24 : H64);
    squat_say(&q, welcome);
    if (k < 2)
      snprintf(expect, sizeof(expect),
               "{reply,%d,{error,{perm,<<\"whatever listens at unix:%s did not prove the "
               "session token (a wrong token, or another process on the sidecar's port)\">>}}}",
               id, sock);
    else
      snprintf(expect, sizeof(expect),
               "{reply,%d,{error,{perm,<<\"the sidecar at unix:%s gates session \\\"other\\\", "
               "not this one\">>}}}",
               id, sock);
    expect_packet(expect);
    squat_end(&q);
  }

  /* 5. Another protocol version. */
  squat_accept(&q, 5, line, sizeof(line));
  squat_say(&q, "{\"type\":\"challenge\",\"version\":1,\"nonce\":\"" H64 "\"}\n");
  snprintf(expect, sizeof(expect),
           "{reply,5,{error,{version,<<\"unix:%s speaks another version of the control channel "
           "than 2 (the sidecar image and this library must be of the same release)\">>}}}",
           sock);
  expect_packet(expect);
  squat_end(&q);

  close(q.lfd);
  finish();
}

Test(port_channel, attach_needs_the_session_id) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, #{}}}", sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,1,{error,{badarg,<<\"control_attach: AttachOpts must name the "
                "session_id\">>}}}");
  snprintf(req, sizeof(req),
           "{call, 2, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, "
           "#{session_id => <<>>}}}",
           sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,2,{error,{badarg,<<\"control_attach: session_id must be a binary of 1 "
                "to 256 bytes without NUL\">>}}}");
  /* A session id the sidecar does not gate: it closes without a word. */
  snprintf(req, sizeof(req),
           "{call, 3, {control_attach, {unix, <<\"%s\">>}, <<\"" TOKEN_HEX "\">>, "
           "#{session_id => <<\"sess-other\">>}}}",
           sock);
  ce_test_port_send(&pp, req);
  expect_packet("{reply,3,{error,{closed,<<\"the control channel closed during the handshake (a "
                "wrong token or session id, another protocol version, or not a condukt "
                "sidecar)\">>}}}");
  finish();
}

/* A sidecar that holds the token (the squatter above, given it) runs the
 * handshake to the welcome, as a real one would. */
static void squat_open(squat_t *q, int id) {
  char line[1024];
  squat_accept(q, id, line, sizeof(line));
  json_error_t jerr;
  json_t *hello = json_loads(line, 0, &jerr);
  cr_assert_not_null(hello, "%s", line);
  uint8_t tok[16], np[CE_CONTROL_NONCE_LEN], ns[CE_CONTROL_NONCE_LEN];
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  cr_assert(ce_control_unhex(TOKEN_HEX, 32, tok, sizeof(tok)));
  cr_assert(ce_control_unhex(json_string_value(json_object_get(hello, "nonce")), 64, np,
                             sizeof(np)));
  json_decref(hello);
  cr_assert(ce_control_unhex(H64, 64, ns, sizeof(ns)));
  squat_say(q, "{\"type\":\"challenge\",\"version\":2,\"nonce\":\"" H64 "\"}\n");
  ssize_t n = read(q->c, line, sizeof(line) - 1);
  cr_assert(n > 0);
  cr_assert_eq(ce_control_proof(tok, sizeof(tok), CE_CONTROL_ROLE_SIDECAR, "sess-port", np, ns,
                                proof),
               CE_OK);
  char welcome[400];
  int len = snprintf(welcome, sizeof(welcome),
                     "{\"type\":\"welcome\",\"version\":2,\"session_id\":\"sess-port\","
                     "\"dropped\":0,\"proof\":\"");
  ce_control_hex(proof, sizeof(proof), welcome + len);
  snprintf(welcome + len + 2 * CE_CONTROL_PROOF_LEN,
           sizeof(welcome) - (size_t)len - 2 * CE_CONTROL_PROOF_LEN, "\"}\n");
  squat_say(q, welcome);
  char expect[256];
  snprintf(expect, sizeof(expect),
           "{reply,%d,{ok,{%d,#{<<\"type\">> => <<\"welcome\">>,<<\"version\">> => 2,"
           "<<\"session_id\">> => <<\"sess-port\">>,<<\"dropped\">> => 0}}}}",
           id, id);
  expect_packet(expect);
}

/* A sidecar's line that is not a frame ends the channel: the frames
 * before it in the same read are delivered, then {closed, Reason} says
 * what was wrong and where, and nothing after it is relayed. */
Test(port_channel, a_malformed_frame_closes_the_channel_with_the_reason) {
  squat_t q;
  squat_start(&q);
  squat_open(&q, 1);
  squat_say(&q, "{\"type\":\"event\",\"seq\":1,\"s\":\"\\u00e9\"}\n"
                "{\"type\":\"event\",\"seq\":2,\"type\":\"x\"}\n"
                "{\"type\":\"event\",\"seq\":3}\n");
  expect_packet("{control,1,{frame,#{<<\"type\">> => <<\"event\">>,<<\"seq\">> => 1,"
                "<<\"s\">> => <<\"é\">>}}}");
  expect_packet("{control,1,{closed,<<\"the sidecar sent a malformed frame: byte 0: the member "
                "\\\"type\\\" appears twice in an object\">>}}");
  expect_quiet();
  squat_end(&q);

  /* Valid JSON nested deeper than the mapping goes. */
  squat_open(&q, 2);
  char deep[200];
  int len = snprintf(deep, sizeof(deep), "{\"type\":\"event\",\"x\":");
  for (int k = 0; k < 40; k++)
    deep[len++] = '[';
  for (int k = 0; k < 40; k++)
    deep[len++] = ']';
  snprintf(deep + len, sizeof(deep) - (size_t)len, "}\n");
  squat_say(&q, deep);
  expect_packet("{control,2,{closed,<<\"the sidecar sent a frame the port cannot relay: byte 52: "
                "nested deeper than 32\">>}}");
  squat_end(&q);
  close(q.lfd);
  finish();
}
