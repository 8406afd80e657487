/* Tests for the Kubernetes client (c_src/kube/client.c, connect.c, tls.c,
 * rest.c, exec.c, credentials.c) against the fake API server of
 * fake_apiserver.c on 127.0.0.1, and the resolver of support/resolver.c:
 * no cluster and no network namespace. The real API server is the ExUnit
 * tier's (test/condukt/native_kube_test.exs). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/error.h"
#include "kube/client.h"
#include "kube/fake_apiserver.h"
#include "support/failalloc.h"
#include "support/resolver.h"

#define TEST_ALARM_S 60

static uv_loop_t loop;
static ce_kube_client_t *client;
static char dir[64];
/* The API server of the running test (static: its thread reads it). */
static fake_apiserver_t fa;

static void setup(void) {
  alarm(TEST_ALARM_S);
  cr_assert_eq(uv_loop_init(&loop), 0);
  client = ce_kube_client_new(&loop);
  cr_assert_not_null(client);
  strcpy(dir, "/tmp/ce_test_kclient_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
  fa_stop(&fa);
  ce_kube_client_destroy(client);
  uv_run(&loop, UV_RUN_DEFAULT);
  ce_kube_client_free(client);
  /* As the port does: libwebsockets' last handles close on this turn. */
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert_eq(uv_loop_close(&loop), 0, "a handle was left on the loop");
  ce_test_resolver_set(NULL, NULL, 0);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", dir);
}

TestSuite(kube_client, .init = setup, .fini = teardown);

/* A port on 127.0.0.1 and ::1 where nothing listens. */
static int closed_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(fd, (struct sockaddr *)&a, sizeof(a));
  socklen_t al = sizeof(a);
  getsockname(fd, (struct sockaddr *)&a, &al);
  close(fd);
  return ntohs(a.sin_port);
}

/* A handle on https://NAME:PORT with ca as the CA (NULL: none) and a
 * bearer token. */
static ce_kube_t *open_on(const char *name, int port, const char *ca, const char *token) {
  ce_kube_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  char url[300], err[256];
  snprintf(url, sizeof(url), "https://%s:%d", name, port);
  cr_assert_eq(ce_kube_config_set_server(&cfg, url, err, sizeof(err)), CE_OK, "%s", err);
  if (ca != NULL) {
    cfg.ca_pem = strdup(ca);
    cfg.ca_len = strlen(ca);
  }
  if (token != NULL) {
    cfg.auth = CE_KUBE_AUTH_TOKEN;
    cfg.token = strdup(token);
  }
  ce_kube_t *k = NULL;
  cr_assert_eq(ce_kube_open(client, &cfg, &k, err, sizeof(err)), CE_OK, "%s", err);
  return k;
}

typedef struct {
  bool done;
  int err;
  char msg[CE_KUBE_MSG_MAX];
  int status;
  char ctype[128];
  char body[4096];
  size_t body_len;
} http_out_t;

static void on_http(void *arg, const ce_kube_http_res_t *r) {
  http_out_t *o = arg;
  cr_assert_not(o->done, "a completion callback ran twice");
  o->done = true;
  o->err = r->err;
  snprintf(o->msg, sizeof(o->msg), "%s", r->msg);
  o->status = r->status;
  snprintf(o->ctype, sizeof(o->ctype), "%s", r->content_type);
  o->body_len = r->body_len < sizeof(o->body) - 1 ? r->body_len : sizeof(o->body) - 1;
  memcpy(o->body, r->body, o->body_len);
  o->body[o->body_len] = '\0';
}

static void run_until(const bool *done) {
  while (!*done)
    uv_run(&loop, UV_RUN_ONCE);
}

static void request(ce_kube_t *k, const char *method, const char *path, const char *body,
                    http_out_t *o) {
  ce_kube_http_req_t req = {.method = method, .path = path, .body = body,
                            .body_len = body != NULL ? strlen(body) : 0,
                            .timeout_ms = 20000};
  char err[256];
  memset(o, 0, sizeof(*o));
  cr_assert_eq(ce_kube_request(k, &req, on_http, o, err, sizeof(err)), CE_OK, "%s", err);
  run_until(&o->done);
}

#define OK_JSON                                                                              \
  "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"

/* ---- reaching the server ---------------------------------------------------------------- */

/* The name resolves to ::1 first, where nothing listens (the server is on
 * 127.0.0.1 only): the second address is tried and answers. The name, not
 * the address, is the Host header, the SNI and the certificate's name. */
Test(kube_client, second_address_is_tried) {
  fa = (fake_apiserver_t){.mode = FA_HTTP, .response = OK_JSON};
  fa_start(&fa);
  const char *addrs[] = {"::1", "127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  ce_kube_t *k = open_on("kube.test", fa.port, fa_cert_pem(), "tok-1");
  http_out_t o;
  request(k, "GET", "/api/v1/namespaces?limit=1", NULL, &o);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_eq(o.status, 200);
  cr_assert_str_eq(o.ctype, "application/json");
  cr_assert_str_eq(o.body, "{\"ok\":true}");
  cr_assert_eq(ce_test_resolver_calls(), 1);
  fa_stop(&fa);
  cr_assert_eq(fa.connections, 1);
  cr_assert_str_eq(fa.sni, "kube.test");
  cr_assert(strncmp(fa.request, "GET /api/v1/namespaces?limit=1 HTTP/1.1\r\n", 41) == 0, "%s",
            fa.request);
  char host[64];
  snprintf(host, sizeof(host), "\r\nhost: kube.test:%d\r\n", fa.port);
  cr_assert_not_null(strcasestr(fa.request, host), "%s", fa.request);
  cr_assert_not_null(strcasestr(fa.request, "\r\nauthorization: Bearer tok-1\r\n"));
  cr_assert_null(strcasestr(fa.request, "content-length"), "a GET carries no body");
}

/* An address where connections hang (a listener whose queue is full:
 * the kernel drops the SYNs) gets CE_KUBE_CONNECT_ATTEMPT_MS, then the
 * next address is tried. */
/* 127.0.0.2:port, where a connection hangs: a listener with a full queue
 * (the kernel drops the SYNs). Its two descriptors go into fds. */
static void blackhole(int port, int fds[2]) {
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
  cr_assert_eq(bind(fds[0], (struct sockaddr *)&a, sizeof(a)), 0);
  cr_assert_eq(listen(fds[0], 0), 0);
  fds[1] = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_eq(connect(fds[1], (struct sockaddr *)&a, sizeof(a)), 0);
}

Test(kube_client, an_address_that_hangs_gets_its_deadline_then_the_next) {
  fa = (fake_apiserver_t){.mode = FA_HTTP, .response = OK_JSON};
  fa_start(&fa);
  int hole[2];
  blackhole(fa.port, hole);
  const char *addrs[] = {"127.0.0.2", "127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  ce_kube_t *k = open_on("kube.test", fa.port, fa_cert_pem(), NULL);
  uv_update_time(&loop);
  uint64_t t0 = uv_now(&loop);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  uint64_t took = uv_now(&loop) - t0;
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_eq(o.status, 200);
  cr_assert_geq(took, CE_KUBE_CONNECT_ATTEMPT_MS - 100, "took %llu ms", (unsigned long long)took);
  cr_assert_lt(took, 3 * CE_KUBE_CONNECT_ATTEMPT_MS, "took %llu ms", (unsigned long long)took);
  close(hole[1]);
  close(hole[0]);
}

/* The request's own deadline ends a connect that hangs (and leaves no
 * handle behind: the teardown closes the loop). */
Test(kube_client, the_request_deadline_ends_a_hanging_connect) {
  int port = closed_port();
  int hole[2];
  blackhole(port, hole);
  const char *addrs[] = {"127.0.0.2"};
  ce_test_resolver_set("kube.test", addrs, 1);
  ce_kube_t *k = open_on("kube.test", port, NULL, NULL);
  ce_kube_http_req_t req = {.method = "GET", .path = "/api", .timeout_ms = 300};
  char err[256];
  http_out_t o = {0};
  cr_assert_eq(ce_kube_request(k, &req, on_http, &o, err, sizeof(err)), CE_OK, "%s", err);
  run_until(&o.done);
  cr_assert_eq(o.err, CE_ETIMEDOUT, "%d %s", o.err, o.msg);
  close(hole[1]);
  close(hole[0]);
}

Test(kube_client, every_address_fails_and_is_named) {
  int port = closed_port();
  const char *addrs[] = {"::1", "127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  ce_kube_t *k = open_on("kube.test", port, fa_cert_pem(), NULL);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_EUNAVAIL, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, "cannot connect to \"kube.test\""), "%s", o.msg);
  cr_assert_not_null(strstr(o.msg, "::1: "), "%s", o.msg);
  cr_assert_not_null(strstr(o.msg, "; 127.0.0.1: "), "%s", o.msg);
}

Test(kube_client, a_name_that_does_not_resolve) {
  ce_test_resolver_set("kube.test", NULL, 0);
  ce_kube_t *k = open_on("kube.test", 443, NULL, NULL);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_EUNAVAIL);
  cr_assert_not_null(strstr(o.msg, "cannot resolve \"kube.test\""), "%s", o.msg);
}

/* A server that was reached and failed TLS is the answer: the other
 * addresses are not tried. */
Test(kube_client, an_untrusted_server_is_not_retried_elsewhere) {
  fa = (fake_apiserver_t){.mode = FA_HTTP, .response = OK_JSON};
  fa_start(&fa);
  const char *addrs[] = {"127.0.0.1", "::1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  ce_kube_t *k = open_on("kube.test", fa.port, fa_other_pem(), NULL);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_ETLS, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, "not trusted"), "%s", o.msg);
  cr_assert_null(strstr(o.msg, "::1"), "%s", o.msg);
  fa_stop(&fa);
}

/* ---- REST -------------------------------------------------------------------------------- */

Test(kube_client, post_sends_the_body_with_its_length_and_type) {
  fa = (fake_apiserver_t){.mode = FA_HTTP,
                         .response = "HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n"};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  http_out_t o;
  request(k, "POST", "/api/v1/namespaces/a/pods", "{\"kind\":\"Pod\"}", &o);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_eq(o.status, 201);
  cr_assert_eq(o.body_len, 0);
  fa_stop(&fa);
  cr_assert_not_null(strcasestr(fa.request, "\r\ncontent-length: 14\r\n"), "%s", fa.request);
  cr_assert_not_null(strcasestr(fa.request, "\r\ncontent-type: application/json\r\n"));
  cr_assert_null(strcasestr(fa.request, "\r\nauthorization:"), "no credential, no header");
  const char *body = strstr(fa.request, "\r\n\r\n");
  cr_assert_str_eq(body + 4, "{\"kind\":\"Pod\"}");
  /* An IP literal is never a server name (RFC 6066 §3). */
  cr_assert_str_eq(fa.sni, "");
}

Test(kube_client, an_error_status_is_an_answer) {
  fa = (fake_apiserver_t){.mode = FA_HTTP,
                         .response = "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                                     "content-length: 17\r\n\r\n{\"kind\":\"Status\"}"};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  http_out_t o;
  request(k, "GET", "/api/v1/namespaces/a/pods/b", NULL, &o);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_eq(o.status, 404);
  cr_assert_str_eq(o.body, "{\"kind\":\"Status\"}");
  fa_stop(&fa);
}

Test(kube_client, a_server_that_hangs_up_is_an_error) {
  fa = (fake_apiserver_t){.mode = FA_HANG_UP};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_neq(o.err, CE_OK);
  cr_assert_eq(o.status, 0);
  fa_stop(&fa);
  /* Reached once: a request is never sent twice. */
  cr_assert_eq(fa.connections, 1);
}

Test(kube_client, a_path_too_long_is_refused_at_once) {
  ce_kube_t *k = open_on("127.0.0.1", 443, NULL, NULL);
  size_t n = 17 * 1024;
  char *path = malloc(n + 1);
  memset(path, 'a', n);
  path[0] = '/';
  path[n] = '\0';
  ce_kube_http_req_t req = {.method = "GET", .path = path, .timeout_ms = 1000};
  char err[256];
  http_out_t o = {0};
  cr_assert_eq(ce_kube_request(k, &req, on_http, &o, err, sizeof(err)), CE_ETOOBIG);
  cr_assert_not(o.done);
  free(path);
}

Test(kube_client, closing_the_handle_completes_with_closed) {
  int port = closed_port();
  const char *addrs[] = {"127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 1);
  ce_kube_t *k = open_on("kube.test", port, NULL, NULL);
  ce_kube_http_req_t req = {.method = "GET", .path = "/api", .timeout_ms = 1000};
  char err[256];
  http_out_t o = {0};
  cr_assert_eq(ce_kube_request(k, &req, on_http, &o, err, sizeof(err)), CE_OK);
  /* Still resolving: closing ends it now, once. */
  ce_kube_close(k);
  cr_assert(o.done);
  cr_assert_eq(o.err, CE_ECLOSED);
}

/* ---- credentials ------------------------------------------------------------------------ */

static ce_kube_t *open_with(ce_kube_config_t *cfg) {
  char err[256];
  ce_kube_t *k = NULL;
  cr_assert_eq(ce_kube_open(client, cfg, &k, err, sizeof(err)), CE_OK, "%s", err);
  return k;
}

static void base_cfg(ce_kube_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  char err[256];
  cr_assert_eq(ce_kube_config_set_server(cfg, "https://127.0.0.1:1", err, sizeof(err)), CE_OK);
}

Test(kube_client, a_token_file_that_is_missing_or_empty) {
  ce_kube_config_t cfg;
  base_cfg(&cfg);
  char path[128];
  snprintf(path, sizeof(path), "%s/token", dir);
  cfg.auth = CE_KUBE_AUTH_TOKEN_FILE;
  cfg.token_file = strdup(path);
  ce_kube_t *k = open_with(&cfg);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_ENOENT, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, path), "%s", o.msg);

  FILE *f = fopen(path, "w");
  fputs("two words\n", f);
  fclose(f);
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_EINVAL, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, "holds no token"), "%s", o.msg);
}

static void plugin_cfg(ce_kube_config_t *cfg, const char *script) {
  base_cfg(cfg);
  cfg->auth = CE_KUBE_AUTH_EXEC;
  cfg->exec.api_version = strdup("client.authentication.k8s.io/v1");
  cfg->exec.argc = 3;
  cfg->exec.argv = calloc(4, sizeof(char *));
  cfg->exec.argv[0] = strdup("/bin/sh");
  cfg->exec.argv[1] = strdup("-c");
  cfg->exec.argv[2] = strdup(script);
  cfg->exec.env = calloc(1, sizeof(char *));
}

Test(kube_client, an_exec_plugin_that_fails) {
  ce_kube_config_t cfg;
  plugin_cfg(&cfg, "echo no such user >&2; exit 3");
  ce_kube_t *k = open_with(&cfg);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_EPERM, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, "exit status 3"), "%s", o.msg);
  cr_assert_not_null(strstr(o.msg, "no such user"), "%s", o.msg);
}

Test(kube_client, an_exec_plugin_that_writes_no_credential) {
  ce_kube_config_t cfg;
  plugin_cfg(&cfg, "echo '{\"kind\":\"ExecCredential\"}'");
  ce_kube_t *k = open_with(&cfg);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_EINVAL, "%d %s", o.err, o.msg);
  cr_assert_not_null(strstr(o.msg, "exec plugin \"/bin/sh\""), "%s", o.msg);
}

/* Two requests while the plugin runs: one run serves both, and its
 * token goes to the server. */
Test(kube_client, an_exec_plugin_token_is_used) {
  fa = (fake_apiserver_t){.mode = FA_HTTP, .response = OK_JSON};
  fa_start(&fa);
  ce_kube_config_t cfg;
  plugin_cfg(&cfg, "echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\","
                   "\"kind\":\"ExecCredential\",\"status\":{\"token\":\"from-plugin\"}}'");
  char err[256], url[64];
  snprintf(url, sizeof(url), "https://127.0.0.1:%d", fa.port);
  cr_assert_eq(ce_kube_config_set_server(&cfg, url, err, sizeof(err)), CE_OK);
  cfg.ca_pem = strdup(fa_cert_pem());
  cfg.ca_len = strlen(cfg.ca_pem);
  ce_kube_t *k = open_with(&cfg);
  http_out_t o;
  request(k, "GET", "/api", NULL, &o);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_eq(o.status, 200);
  fa_stop(&fa);
  cr_assert_not_null(strcasestr(fa.request, "\r\nauthorization: Bearer from-plugin\r\n"), "%s",
                     fa.request);
}

/* ---- exec ------------------------------------------------------------------------------- */

typedef struct {
  bool done;
  int err;
  char msg[CE_KUBE_MSG_MAX];
  bool has_exit;
  int exit_code;
  char out[256], errout[256], protocol[32];
} exec_out_t;

static void on_exec(void *arg, const ce_kube_exec_res_t *r) {
  exec_out_t *o = arg;
  cr_assert_not(o->done, "a completion callback ran twice");
  o->done = true;
  o->err = r->err;
  snprintf(o->msg, sizeof(o->msg), "%s", r->msg);
  o->has_exit = r->has_exit;
  o->exit_code = r->exit_code;
  snprintf(o->out, sizeof(o->out), "%.*s", (int)r->out_len, r->out);
  snprintf(o->errout, sizeof(o->errout), "%.*s", (int)r->err_len, r->errout);
  snprintf(o->protocol, sizeof(o->protocol), "%s", r->protocol);
}

/* v5.channel.k8s.io: stdin goes in channel-0 frames and is closed with
 * {255, 0}; stdout and stderr come back apart; the Status on channel 3
 * is the exit code. */
Test(kube_client, exec_channels_both_ways) {
  static const char st[] = "\x03{\"kind\":\"Status\",\"status\":\"Failure\",\"reason\":"
                           "\"NonZeroExitCode\",\"details\":{\"causes\":[{\"reason\":"
                           "\"ExitCode\",\"message\":\"3\"}]}}";
  const char *frames[] = {"\x01hello ", "\x02oops", "\x01world", st};
  size_t lens[] = {7, 5, 6, sizeof(st) - 1};
  fa = (fake_apiserver_t){.mode = FA_EXEC, .frames = frames, .frame_lens = lens, .n_frames = 4,
                         .expect_stdin = true};
  fa_start(&fa);
  const char *addrs[] = {"::1", "127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  ce_kube_t *k = open_on("kube.test", fa.port, fa_cert_pem(), "tok-x");
  const char *argv[] = {"sh", "-c", "cat; exit 3"};
  ce_kube_exec_req_t req = {.ns = "ns", .pod = "p", .container = "c", .argv = argv, .argc = 3,
                            .has_stdin = true, .stdin_data = "input-data", .stdin_len = 10,
                            .timeout_ms = 20000, .max_output = 1024};
  exec_out_t o = {0};
  char err[256];
  cr_assert_eq(ce_kube_exec(k, &req, on_exec, &o, err, sizeof(err)), CE_OK, "%s", err);
  run_until(&o.done);
  fa_stop(&fa);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_str_eq(o.protocol, "v5.channel.k8s.io");
  cr_assert_str_eq(o.out, "hello world");
  cr_assert_str_eq(o.errout, "oops");
  cr_assert(o.has_exit);
  cr_assert_eq(o.exit_code, 3);
  cr_assert_eq(fa.stdin_len, 10);
  cr_assert(memcmp(fa.stdin_got, "input-data", 10) == 0);
  cr_assert(fa.stdin_closed, "stdin was not closed with {255, 0}");
  cr_assert(strncmp(fa.request,
                    "GET /api/v1/namespaces/ns/pods/p/exec?container=c&command=sh&command=-c&"
                    "command=cat%3B%20exit%203&stdin=true&stdout=true&stderr=true HTTP/1.1\r\n",
                    128) == 0,
            "%s", fa.request);
  cr_assert_not_null(strcasestr(fa.request, "\r\nauthorization: Bearer tok-x\r\n"));
  cr_assert_not_null(strcasestr(fa.request, "v5.channel.k8s.io"));
}

/* Output past max_output is counted, not kept. */
Test(kube_client, exec_output_over_the_limit_is_counted) {
  static const char st[] = "\x03{\"kind\":\"Status\",\"status\":\"Success\"}";
  const char *frames[] = {"\x01" "0123456789", st};
  size_t lens[] = {11, sizeof(st) - 1};
  fa = (fake_apiserver_t){.mode = FA_EXEC, .frames = frames, .frame_lens = lens, .n_frames = 2};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  const char *argv[] = {"true"};
  ce_kube_exec_req_t req = {.ns = "ns", .pod = "p", .container = "c", .argv = argv, .argc = 1,
                            .timeout_ms = 20000, .max_output = 4};
  exec_out_t o = {0};
  char err[256];
  cr_assert_eq(ce_kube_exec(k, &req, on_exec, &o, err, sizeof(err)), CE_OK, "%s", err);
  run_until(&o.done);
  fa_stop(&fa);
  cr_assert_eq(o.err, CE_OK, "%s", o.msg);
  cr_assert_str_eq(o.out, "0123");
  cr_assert(o.has_exit);
  cr_assert_eq(o.exit_code, 0);
}

/* ---- port-forward ----------------------------------------------------------------------- */

typedef struct {
  int calls;
  char msg[CE_KUBE_MSG_MAX];
} fwd_err_t;

static void on_fwd_err(void *arg, uint64_t fchan, const char *msg) {
  fwd_err_t *e = arg;
  e->calls++;
  snprintf(e->msg, sizeof(e->msg), "%s", msg);
}

static int forward_on(ce_kube_t *k, uint16_t port, fwd_err_t *e, uint64_t *fchan) {
  ce_kube_fwd_req_t req = {.ns = "ns", .pod = "p", .port = port, .listen = "127.0.0.1:0"};
  uint16_t bound = 0;
  char err[256];
  cr_assert_eq(ce_kube_forward(k, &req, on_fwd_err, e, fchan, &bound, err, sizeof(err)), CE_OK,
               "%s", err);
  cr_assert_gt(bound, 0);
  /* The kernel completes the connection from the listen queue; the tunnel
   * starts when the loop accepts it. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(bound),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  return fd;
}

/* Runs the loop until fd has n bytes or is closed; returns what came. */
static size_t pump_read(int fd, char *buf, size_t cap, bool *closed) {
  size_t got = 0;
  *closed = false;
  while (got < cap - 1 && !*closed) {
    uv_run(&loop, UV_RUN_NOWAIT);
    ssize_t r = recv(fd, buf + got, cap - 1 - got, MSG_DONTWAIT);
    if (r > 0)
      got += (size_t)r;
    else if (r == 0)
      *closed = true;
    else
      usleep(1000);
  }
  buf[got] = '\0';
  return got;
}

/* Bytes go both ways as channel-0 messages after both channels' port
 * prefix; the tunnel ends with the server's close. */
Test(kube_client, forward_tunnels_bytes_after_the_port_prefix) {
  fa = (fake_apiserver_t){.mode = FA_FORWARD, .fwd_port = 8080};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), "tok-f");
  fwd_err_t e = {0};
  uint64_t fchan = 0;
  int fd = forward_on(k, 8080, &e, &fchan);
  cr_assert_eq(send(fd, "ping", 4, 0), 4);
  char buf[64];
  bool closed;
  pump_read(fd, buf, sizeof(buf), &closed);
  cr_assert_str_eq(buf, "pong:ping");
  cr_assert(closed);
  close(fd);
  fa_stop(&fa);
  cr_assert_eq(e.calls, 0, "%s", e.msg);
  cr_assert_eq(fa.stdin_len, 4);
  cr_assert(strncmp(fa.request, "GET /api/v1/namespaces/ns/pods/p/portforward?ports=8080 ", 56) ==
                0,
            "%s", fa.request);
  cr_assert_not_null(strcasestr(fa.request, "\r\nauthorization: Bearer tok-f\r\n"));
  cr_assert(ce_kube_forward_close(client, fchan));
  cr_assert_not(ce_kube_forward_close(client, fchan));
}

/* What the error channel says ends the tunnel and goes to the listener's
 * owner; the listener stays. */
Test(kube_client, forward_error_channel_reaches_the_owner) {
  fa = (fake_apiserver_t){.mode = FA_FORWARD, .fwd_port = 8080,
                          .fwd_error = "unable to do port forwarding: socat not found"};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  fwd_err_t e = {0};
  uint64_t fchan = 0;
  int fd = forward_on(k, 8080, &e, &fchan);
  char buf[64];
  bool closed;
  pump_read(fd, buf, sizeof(buf), &closed);
  cr_assert(closed);
  cr_assert_eq(buf[0], '\0');
  while (e.calls == 0)
    uv_run(&loop, UV_RUN_ONCE);
  cr_assert_eq(e.calls, 1);
  cr_assert_not_null(strstr(e.msg, "port-forward to ns/p:8080: unable to do port forwarding"),
                     "%s", e.msg);
  close(fd);
  fa_stop(&fa);
  cr_assert(ce_kube_forward_close(client, fchan), "the listener went with the tunnel");
}

/* A prefix naming another port is a protocol error: the tunnel is cut. */
Test(kube_client, forward_prefix_of_another_port_is_refused) {
  fa = (fake_apiserver_t){.mode = FA_FORWARD, .fwd_port = 9090};
  fa_start(&fa);
  ce_kube_t *k = open_on("127.0.0.1", fa.port, fa_cert_pem(), NULL);
  fwd_err_t e = {0};
  uint64_t fchan = 0;
  int fd = forward_on(k, 8080, &e, &fchan);
  while (e.calls == 0)
    uv_run(&loop, UV_RUN_ONCE);
  cr_assert_not_null(strstr(e.msg, "the data channel named port 9090, not 8080"), "%s", e.msg);
  char buf[64];
  bool closed;
  pump_read(fd, buf, sizeof(buf), &closed);
  cr_assert(closed);
  close(fd);
  fa_stop(&fa);
}

/* ---- allocation failures ---------------------------------------------------------------- */

/* Each allocation of opening a handle, starting a request and trying two
 * addresses fails in turn: every failure is reported (once), nothing
 * leaks (LSan), and the loop closes (the teardown). */
Test(kube_client, allocation_failures) {
  int port = closed_port();
  const char *addrs[] = {"::1", "127.0.0.1"};
  ce_test_resolver_set("kube.test", addrs, 2);
  char url[64];
  snprintf(url, sizeof(url), "https://kube.test:%d", port);
  for (size_t n = 0;; n++) {
    ce_kube_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[256];
    cr_assert_eq(ce_kube_config_set_server(&cfg, url, err, sizeof(err)), CE_OK);
    cfg.ca_pem = strdup(fa_cert_pem());
    cfg.ca_len = strlen(cfg.ca_pem);
    cfg.auth = CE_KUBE_AUTH_TOKEN;
    cfg.token = strdup("t");
    ce_kube_t *k = NULL;
    http_out_t o = {0};
    ce_failalloc_arm(n);
    int rc = ce_kube_open(client, &cfg, &k, err, sizeof(err));
    if (rc == CE_OK) {
      ce_kube_http_req_t req = {.method = "POST", .path = "/api", .body = "{}", .body_len = 2,
                                .timeout_ms = 10000};
      rc = ce_kube_request(k, &req, on_http, &o, err, sizeof(err));
      if (rc == CE_OK)
        run_until(&o.done);
    }
    ce_failalloc_disarm();
    bool injected = ce_failalloc_failures() > 0;
    if (rc != CE_OK) {
      cr_assert(injected, "allocation %zu: %d %s", n, rc, err);
      cr_assert(rc == CE_ENOMEM || rc == CE_ETLS, "allocation %zu: %d %s", n, rc, err);
    } else {
      cr_assert(o.done);
      cr_assert(o.err == CE_EUNAVAIL || (injected && o.err == CE_ENOMEM),
                "allocation %zu: %d %s", n, o.err, o.msg);
    }
    if (k != NULL)
      ce_kube_close(k);
    uv_run(&loop, UV_RUN_NOWAIT);
    if (!injected) {
      /* The handle's TLS context alone takes dozens (OpenSSL's are
       * counted when its allocator could be hooked). */
      cr_assert_gt(n, ce_failalloc_openssl_hooked() ? 50 : 5, "only %zu allocations", n);
      break;
    }
  }
}
