/* Tests for c_src/dns/server.c over real sockets on loopback: the
 * workspace's side is a plain UDP or TCP socket of the test, the upstream
 * a fake (fake_upstream.c) on the same loop, pumped in small steps under
 * a deadline. Each test closes the server, then the stub, and checks that
 * uv_loop_close() finds nothing left. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "dns/fake_upstream.h"
#include "dns/server.h"
#include "dns/stub.h"
#include "policy/policy.h"

#define WAIT_MS 4000

static uv_loop_t loop;
static ce_dns_stub_t *stub;
static ce_dns_server_t *srv;
static ce_policy_t *policy;
static fake_upstream_t fake;
static bool fake_on;
static uint64_t next_id;
static struct sockaddr_storage srv_addr;

static const char POLICY[] = "{\"version\":1,\"default\":\"deny\",\"rules\":["
                             "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"*.evil.test\"]},"
                             "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"allowed.test\",\"cname.test\"]},"
                             "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":1000,\"cache\":false}]}";
static const char POLICY_NO_DECIDE[] = "{\"version\":1,\"default\":\"deny\",\"rules\":["
                                       "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"allowed.test\"]}]}";

static void start_with(const char *policy_json, fake_mode_t mode, uint32_t source_rate, uint32_t source_burst) {
  alarm(60);
  cr_assert_eq(uv_loop_init(&loop), 0);
  ce_policy_error_t err;
  cr_assert_eq(ce_policy_load_buffer(policy_json, strlen(policy_json), &policy, &err), 0, "%s", err.message);
  fake_start(&loop, &fake, mode);
  fake_on = true;
  ce_dns_stub_opts_t so;
  memset(&so, 0, sizeof(so));
  so.upstreams[0] = fake.addr;
  so.upstream_count = 1;
  so.attempt_ms = 200;
  so.deadline_ms = 600;
  cr_assert_eq(ce_dns_stub_new(&loop, &so, &stub), CE_OK);
  /* Port 0 gives UDP a free port, which TCP may not have (another test
   * running at the same time): a few tries. */
  static char addr[32] = "127.0.0.1:0";
  static const char *const listen[] = {addr};
  ce_dns_server_opts_t o = {.listen = listen,
                            .listen_count = 1,
                            .policy = policy,
                            .stub = stub,
                            .next_id = &next_id,
                            .source_rate = source_rate,
                            .source_burst = source_burst};
  char e[256];
  int rc = CE_EIO;
  for (int i = 0; i < 20 && rc == CE_EIO; i++) {
    rc = ce_dns_server_start(&loop, &o, &srv, e, sizeof(e));
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  cr_assert_eq(rc, CE_OK, "%s", e);
  cr_assert_eq(ce_dns_server_address(srv, 0, &srv_addr), CE_OK);
}

static void setup(void) {
  start_with(POLICY, FAKE_ANSWER, 0, 0);
}

static void teardown(void) {
  ce_dns_server_close(srv);
  ce_dns_stub_close(stub);
  if (fake_on)
    fake_stop(&fake);
  for (int i = 0; i < 50; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 1);
  }
  cr_expect_eq(uv_loop_close(&loop), 0, "handles left on the loop");
  ce_policy_free(policy);
}

TestSuite(dns_server, .init = setup, .fini = teardown);

/* Sends msg over UDP from a fresh socket and waits for one answer (the
 * loop pumped meanwhile). Returns the answer's length, 0 for none. */
static size_t ask_raw(int fd, const uint8_t *msg, size_t len, uint8_t *out, size_t cap, int wait_ms) {
  cr_assert_eq(send(fd, msg, len, 0), (ssize_t)len);
  uint64_t end = uv_hrtime() + (uint64_t)wait_ms * 1000000u;
  while (uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    ssize_t n = recv(fd, out, cap, MSG_DONTWAIT);
    if (n > 0)
      return (size_t)n;
    poll(NULL, 0, 1);
  }
  return 0;
}

static int udp_client(void) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  cr_assert_geq(fd, 0);
  cr_assert_eq(connect(fd, (struct sockaddr *)&srv_addr, sizeof(struct sockaddr_in)), 0);
  return fd;
}

/* Asks name/type over UDP; the parsed answer in *m. False: no answer. */
static bool ask(const char *name, uint16_t type, ce_dns_msg_t *m) {
  uint8_t q[512], a[4096];
  size_t qlen;
  cr_assert_eq(ce_dns_build_query(q, sizeof(q), 0x4242, name, strlen(name), type, true, 0, &qlen), CE_OK);
  int fd = udp_client();
  size_t n = ask_raw(fd, q, qlen, a, sizeof(a), WAIT_MS);
  close(fd);
  if (n == 0)
    return false;
  cr_assert_eq(ce_dns_parse(a, n, m), CE_OK);
  cr_expect_eq(m->id, 0x4242);
  cr_expect(m->flags & CE_DNS_FLAG_QR);
  return true;
}

Test(dns_server, denied_names_nxdomain_without_asking_upstream) {
  ce_dns_msg_t m;
  cr_assert(ask("secret.evil.test", CE_DNS_TYPE_A, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NXDOMAIN);
  cr_expect_eq(m.answer_count, 0);
  cr_assert(ask("10.0.0.1", CE_DNS_TYPE_A, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NXDOMAIN, "an IP literal is no name");
  cr_expect_eq(fake.udp_queries, 0);
  ce_dns_server_stats_t st;
  ce_dns_server_stats(srv, &st);
  cr_expect_eq(st.denied, 2);
}

Test(dns_server, allowed_names_resolved_upstream) {
  ce_dns_msg_t m;
  cr_assert(ask("Allowed.Test", CE_DNS_TYPE_AAAA, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NOERROR);
  cr_expect(m.flags & CE_DNS_FLAG_RA);
  cr_assert_eq(m.answer_count, 1);
  cr_expect_eq(m.answers[0].type, CE_DNS_TYPE_AAAA);
  cr_expect_str_eq(fake.last_name, "allowed.test");
  cr_assert(ask("cname.test", CE_DNS_TYPE_A, &m));
  cr_assert_eq(m.answer_count, 2, "the chain, without the record off it");
  cr_expect_eq(m.answers[0].type, CE_DNS_TYPE_CNAME);
  cr_expect_str_eq(m.answers[1].name, "target.test");
}

Test(dns_server, decide_only_names_get_the_synthetic_answer) {
  ce_dns_msg_t m;
  cr_assert(ask("maybe.example", CE_DNS_TYPE_A, &m));
  cr_assert_eq(m.answer_count, 1);
  cr_expect_eq(memcmp(m.answers[0].addr, "\xc6\x12\x00\x01", 4), 0, "198.18.0.1");
  cr_assert(ask("maybe.example", CE_DNS_TYPE_AAAA, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NOERROR);
  cr_expect_eq(m.answer_count, 0);
  cr_expect_eq(fake.udp_queries, 0, "nothing asked upstream");
}

Test(dns_server, query_types_and_classes) {
  ce_dns_msg_t m;
  cr_assert(ask("allowed.test", CE_DNS_TYPE_TXT, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_REFUSED);
  cr_assert(ask("allowed.test", CE_DNS_TYPE_HTTPS, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NOERROR);
  cr_expect_eq(m.answer_count, 0);
  cr_assert(ask("allowed.test", CE_DNS_TYPE_ANY, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_NOTIMP);
  /* Class CH (3): REFUSED. */
  uint8_t q[64], a[512];
  size_t qlen;
  cr_assert_eq(ce_dns_build_query(q, sizeof(q), 7, "version.bind", 12, CE_DNS_TYPE_TXT, false, 0, &qlen), CE_OK);
  q[qlen - 1] = 3;
  int fd = udp_client();
  size_t n = ask_raw(fd, q, qlen, a, sizeof(a), WAIT_MS);
  cr_assert_gt(n, 0);
  cr_expect_eq(CE_DNS_RCODE(a[3]), CE_DNS_RCODE_REFUSED);
  /* An opcode other than QUERY: NOTIMP. */
  q[2] |= 0x10; /* opcode 2 (STATUS) */
  n = ask_raw(fd, q, qlen, a, sizeof(a), WAIT_MS);
  cr_assert_gt(n, 0);
  cr_expect_eq(CE_DNS_RCODE(a[3]), CE_DNS_RCODE_NOTIMP);
  close(fd);
  cr_expect_eq(fake.udp_queries, 0);
}

Test(dns_server, malformed_queries) {
  int fd = udp_client();
  uint8_t a[512];
  /* A header and a name cut short: FORMERR with the id. */
  const uint8_t cut[] = {0x11, 0x22, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0x05, 'a'};
  size_t n = ask_raw(fd, cut, sizeof(cut), a, sizeof(a), WAIT_MS);
  cr_assert_eq(n, 12);
  cr_expect_eq(a[0], 0x11);
  cr_expect_eq(CE_DNS_RCODE(a[3]), CE_DNS_RCODE_FORMERR);
  /* A response (QR set) and a short datagram: no answer at all. */
  uint8_t resp[sizeof(cut)];
  memcpy(resp, cut, sizeof(cut));
  resp[2] |= 0x80;
  cr_expect_eq(ask_raw(fd, resp, sizeof(resp), a, sizeof(a), 200), 0);
  cr_expect_eq(ask_raw(fd, cut, 5, a, sizeof(a), 200), 0);
  /* Past CE_DNS_SERVER_MAX_QUERY: dropped. */
  static uint8_t big[CE_DNS_SERVER_MAX_QUERY + 1];
  memcpy(big, cut, 12);
  cr_expect_eq(ask_raw(fd, big, sizeof(big), a, sizeof(a), 200), 0);
  /* No question: FORMERR. */
  const uint8_t none[] = {0x33, 0x44, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0};
  n = ask_raw(fd, none, sizeof(none), a, sizeof(a), WAIT_MS);
  cr_assert_eq(n, 12);
  cr_expect_eq(CE_DNS_RCODE(a[3]), CE_DNS_RCODE_FORMERR);
  close(fd);
  ce_dns_server_stats_t st;
  ce_dns_server_stats(srv, &st);
  cr_expect_geq(st.malformed, 4);
}

Test(dns_server, over_tcp_one_query_at_a_time) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  cr_assert_geq(fd, 0);
  int rc = connect(fd, (struct sockaddr *)&srv_addr, sizeof(struct sockaddr_in));
  cr_assert(rc == 0 || errno == EINPROGRESS);
  /* Two queries pipelined in one write: both answered, in order. */
  uint8_t buf[1024];
  size_t o = 0;
  const char *names[] = {"allowed.test", "x.evil.test"};
  for (int i = 0; i < 2; i++) {
    size_t qlen;
    cr_assert_eq(ce_dns_build_query(buf + o + 2, sizeof(buf) - o - 2, (uint16_t)(100 + i), names[i], strlen(names[i]),
                                    CE_DNS_TYPE_A, true, 0, &qlen),
                 CE_OK);
    buf[o] = (uint8_t)(qlen >> 8);
    buf[o + 1] = (uint8_t)qlen;
    o += 2 + qlen;
  }
  uint64_t end = uv_hrtime() + (uint64_t)WAIT_MS * 1000000u;
  bool sent = false;
  uint8_t in[4096];
  size_t in_len = 0;
  int answers = 0;
  while (uv_hrtime() < end && answers < 2) {
    uv_run(&loop, UV_RUN_NOWAIT);
    if (!sent && send(fd, buf, o, MSG_NOSIGNAL) == (ssize_t)o)
      sent = true;
    ssize_t n = recv(fd, in + in_len, sizeof(in) - in_len, MSG_DONTWAIT);
    if (n > 0)
      in_len += (size_t)n;
    while (in_len >= 2 && in_len >= 2u + (((size_t)in[0] << 8) | in[1])) {
      size_t len = ((size_t)in[0] << 8) | in[1];
      ce_dns_msg_t m;
      cr_assert_eq(ce_dns_parse(in + 2, len, &m), CE_OK);
      cr_expect_eq(m.id, 100 + answers);
      cr_expect_eq(CE_DNS_RCODE(m.flags), answers == 0 ? CE_DNS_RCODE_NOERROR : CE_DNS_RCODE_NXDOMAIN);
      memmove(in, in + 2 + len, in_len - 2 - len);
      in_len -= 2 + len;
      answers++;
    }
    poll(NULL, 0, 1);
  }
  cr_expect_eq(answers, 2);
  close(fd);
}

Test(dns_server, upstream_failure_is_servfail) {
  fake.mode = FAKE_SILENT;
  ce_dns_msg_t m;
  cr_assert(ask("allowed.test", CE_DNS_TYPE_A, &m));
  cr_expect_eq(CE_DNS_RCODE(m.flags), CE_DNS_RCODE_SERVFAIL);
}

Test(dns_server, close_with_queries_pending) {
  fake.mode = FAKE_SILENT;
  uint8_t q[512];
  size_t qlen;
  cr_assert_eq(ce_dns_build_query(q, sizeof(q), 1, "allowed.test", 12, CE_DNS_TYPE_A, true, 0, &qlen), CE_OK);
  int fd = udp_client();
  cr_assert_eq(send(fd, q, qlen, 0), (ssize_t)qlen);
  for (int i = 0; i < 50 && fake.udp_queries == 0; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    poll(NULL, 0, 2);
  }
  cr_expect_eq(fake.udp_queries, 1);
  close(fd);
  /* The teardown closes the server with the query waiting upstream. */
}

Test(dns_server_opts, rate_capped_per_source, .fini = teardown) {
  start_with(POLICY_NO_DECIDE, FAKE_ANSWER, 10, 20);
  int fd = udp_client();
  uint8_t q[512], a[512];
  size_t qlen;
  cr_assert_eq(ce_dns_build_query(q, sizeof(q), 9, "x.example", 9, CE_DNS_TYPE_A, true, 0, &qlen), CE_OK);
  for (int i = 0; i < 60; i++)
    cr_assert_eq(send(fd, q, qlen, 0), (ssize_t)qlen);
  int answers = 0;
  uint64_t end = uv_hrtime() + 500u * 1000000u;
  while (uv_hrtime() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    while (recv(fd, a, sizeof(a), MSG_DONTWAIT) > 0)
      answers++;
    poll(NULL, 0, 1);
  }
  close(fd);
  cr_expect_geq(answers, 20);
  cr_expect_leq(answers, 30, "%d answered: the burst of 20 and about 10/s", answers);
  ce_dns_server_stats_t st;
  ce_dns_server_stats(srv, &st);
  cr_expect_geq(st.rate_limited, 30);
}

Test(dns_server_opts, bad_listen_address, .fini = teardown) {
  start_with(POLICY, FAKE_ANSWER, 0, 0);
  static const char *const bad[] = {"localhost:53"};
  ce_dns_server_opts_t o = {.listen = bad, .listen_count = 1, .policy = policy, .stub = stub, .next_id = &next_id};
  ce_dns_server_t *s2 = NULL;
  char e[256];
  cr_expect_eq(ce_dns_server_start(&loop, &o, &s2, e, sizeof(e)), CE_EINVAL);
  cr_expect_null(s2);
  /* The same address twice: the second cannot bind. */
  char taken[64];
  snprintf(taken, sizeof(taken), "127.0.0.1:%u", (unsigned)ntohs(((struct sockaddr_in *)&srv_addr)->sin_port));
  const char *dup[] = {taken};
  o.listen = dup;
  cr_expect_eq(ce_dns_server_start(&loop, &o, &s2, e, sizeof(e)), CE_EIO);
  cr_expect(strstr(e, "cannot listen for DNS") != NULL, "%s", e);
}
