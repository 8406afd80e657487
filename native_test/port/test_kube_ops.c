/* Tests for c_src/port/kube_ops.c through the real port binary: the
 * kube_* operations' argument decoding (badarg for shapes, inval for
 * values), kube_open of each source, errors with no HTTP answer
 * (unavail), forward listeners (loopback only, unix sockets created and
 * removed, a tunnel that cannot reach the server reported asynchronously
 * while the listener stays), and closing. The real API server is the
 * ExUnit tier's (test/condukt/native_kube_test.exs). */
#include <criterion/criterion.h>
#include <ei.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "support/port_proc.h"
#include "support/term.h"

#define TEST_ALARM_S 60
#define WAIT_MS 10000

static ce_test_port_t pp;
static char dir[64];

static void setup(void) {
  alarm(TEST_ALARM_S);
  ei_init();
  strcpy(dir, "/tmp/ce_test_kube_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  ce_test_port_start(&pp);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", dir);
}

TestSuite(port_kube, .init = setup, .fini = teardown);

static void finish_clean(void) {
  close(pp.in);
  pp.in = -1;
  size_t n = 0;
  char *extra = ce_test_port_recv_raw(&pp, WAIT_MS, &n);
  cr_assert_null(extra, "a packet after stdin EOF");
  cr_assert_eq(ce_test_port_finish(&pp, WAIT_MS), 0);
}

/* Sends request and asserts the reply contains every one of the texts. */
static char *expect_has(const char *request, const char *a, const char *b) {
  ce_test_port_send(&pp, request);
  char *got = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_not_null(got, "no reply to %s", request);
  cr_assert(strstr(got, a) != NULL, "%s: \"%s\" lacks \"%s\"", request, got, a);
  cr_assert(b == NULL || strstr(got, b) != NULL, "%s: \"%s\" lacks \"%s\"", request, got, b);
  return got;
}

static void has(const char *request, const char *a, const char *b) {
  free(expect_has(request, a, b));
}

/* A loopback TCP port where nothing listens. */
static unsigned closed_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
  socklen_t l = sizeof(a);
  getsockname(s, (struct sockaddr *)&a, &l);
  close(s);
  return ntohs(a.sin_port);
}

Test(port_kube, open_refusals) {
  has("{call, 1, {kube_open, []}}", "{badarg,<<\"kube_open: KubeOpts must be a map", NULL);
  has("{call, 2, {kube_open, #{}}}", "badarg", "source is required");
  has("{call, 3, {kube_open, #{source => other}}}", "badarg",
      "source must be kubeconfig, in_cluster or explicit");
  has("{call, 4, {kube_open, #{source => kubeconfig}}}", "badarg", "needs paths");
  has("{call, 5, {kube_open, #{source => kubeconfig, paths => []}}}", "badarg",
      "paths must be a list of 1 to 32 binaries");
  has("{call, 6, {kube_open, #{source => kubeconfig, paths => [<<>>]}}}", "badarg",
      "paths[0] must be a binary");
  has("{call, 7, {kube_open, #{source => explicit}}}", "badarg", "needs server");
  has("{call, 8, {kube_open, #{source => explicit, server => <<\"https://h\">>, paths => "
      "[<<\"/x\">>]}}}",
      "badarg", "paths does not apply to source explicit");
  has("{call, 9, {kube_open, #{source => kubeconfig, paths => [<<\"/x\">>], server => "
      "<<\"https://h\">>}}}",
      "badarg", "does not apply to source kubeconfig");
  has("{call, 10, {kube_open, #{source => in_cluster, context => <<\"c\">>}}}", "badarg",
      "context does not apply");
  has("{call, 11, {kube_open, #{source => explicit, server => <<\"http://h\">>}}}",
      "{inval,", "must be an https:// URL");
  has("{call, 12, {kube_open, #{source => explicit, server => <<\"https://h\">>, token => "
      "<<\"t\">>, token_file => <<\"/t\">>}}}",
      "inval", "give one of");
  has("{call, 13, {kube_open, #{source => explicit, server => <<\"https://h\">>, "
      "client_cert_pem => <<\"c\">>}}}",
      "inval", "go together");
  /* A token goes into a header: CR/LF (header injection), spaces refused. */
  has("{call, 16, {kube_open, #{source => explicit, server => <<\"https://h\">>, token => "
      "<<\"x\\r\\nImpersonate-User: system:admin\">>}}}",
      "inval", "token must be printable ASCII");
  has("{call, 17, {kube_open, #{source => explicit, server => <<\"https://h\">>, token => "
      "<<\"a b\">>}}}",
      "inval", "token must be printable ASCII");
  has("{call, 14, {kube_open, #{source => explicit, server => <<\"https://h\">>, insecure => "
      "yes}}}",
      "badarg", "insecure must be true or false");
  has("{call, 15, {kube_open, #{source => explicit, server => <<\"https://h\">>, bogus => 1}}}",
      "badarg", "unknown option \\\"bogus\\\"");
  has("{call, 16, {kube_open, #{source => kubeconfig, paths => [<<\"/nonexistent/kc\">>]}}}",
      "{noent,", "no file exists");
  has("{call, 17, {kube_open, #{source => in_cluster, dir => <<\"/nonexistent\">>, host => "
      "<<\"h\">>, port => 1}}}",
      "noent", "ca.crt");
  has("{call, 18, {kube_open, #{source => in_cluster, host => <<\"h\">>, port => 70000}}}",
      "inval", "port must be 1 to 65535");
  /* A CA that is not PEM: tls at open, before anything is sent. */
  has("{call, 19, {kube_open, #{source => explicit, server => <<\"https://h\">>, ca_pem => "
      "<<\"junk\">>}}}",
      "{tls,", "no PEM certificate");
  has("{call, 20, {kube_open, #{source => explicit, server => <<\"https://h\">>, "
      "client_cert_pem => <<\"junk\">>, client_key_pem => <<\"junk\">>}}}",
      "tls", "client certificate is not usable PEM");
  has("{call, 21, {kube_open, #{source => explicit}, extra}}", "badarg",
      "kube_open takes 1 argument");
  finish_clean();
}

Test(port_kube, open_kubeconfig_and_close) {
  char path[128], req[512];
  snprintf(path, sizeof(path), "%s/kc", dir);
  FILE *f = fopen(path, "w");
  fputs("clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: n}}]\n"
        "current-context: x\n",
        f);
  fclose(f);
  snprintf(req, sizeof(req), "{call, 1, {kube_open, #{source => kubeconfig, paths => [<<\"%s\">>]}}}",
           path);
  has(req, "{reply,1,{ok,#{", "kube => 1");
  snprintf(req, sizeof(req), "{call, 2, {kube_open, #{<<\"source\">> => kubeconfig, paths => "
                             "[<<\"%s\">>], context => <<\"x\">>}}}",
           path);
  char *got = expect_has(req, "kube => 2", "auth => token");
  cr_assert(strstr(got, "namespace => <<\"n\">>") != NULL, "%s", got);
  cr_assert(strstr(got, "server => <<\"https://127.0.0.1:1\">>") != NULL, "%s", got);
  free(got);
  ce_test_port_expect(&pp, "{call, 3, {kube_close, 1}}", "{reply,3,ok}");
  ce_test_port_expect(&pp, "{call, 4, {kube_close, 1}}", "{reply,4,ok}");
  has("{call, 5, {kube_request, 1, #{method => get, path => <<\"/\">>}}}", "{closed,",
      "no open Kubernetes handle 1");
  has("{call, 6, {kube_close, x}}", "badarg", "Kube must be a positive integer");
  /* Handles are never reused. */
  has(req, "kube => 3", NULL);
  finish_clean();
}

Test(port_kube, exec_plugin_that_cannot_run) {
  char path[128], req[512];
  snprintf(path, sizeof(path), "%s/kc", dir);
  FILE *f = fopen(path, "w");
  fprintf(f,
          "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:%u', "
          "insecure-skip-tls-verify: true}}]\n"
          "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: ./no-such-plugin}}}]\n"
          "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
          closed_port());
  fclose(f);
  snprintf(req, sizeof(req), "{call, 1, {kube_open, #{source => kubeconfig, paths => [<<\"%s\">>]}}}",
           path);
  has(req, "kube => 1", "auth => exec");
  /* Two requests wait for the same run; both get its error. */
  ce_test_port_send(&pp, "{call, 2, {kube_request, 1, #{method => get, path => <<\"/\">>}}}");
  ce_test_port_send(&pp, "{call, 3, {kube_request, 1, #{method => get, path => <<\"/\">>}}}");
  for (int k = 0; k < 2; k++) {
    char *got = ce_test_port_recv(&pp, WAIT_MS);
    cr_assert_not_null(got);
    cr_assert(strstr(got, "{error,{perm,") != NULL, "%s", got);
    cr_assert(strstr(got, "no-such-plugin") != NULL && strstr(got, "cannot run") != NULL, "%s",
              got);
    free(got);
  }
  finish_clean();
}

Test(port_kube, request_refusals_and_unavail) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {kube_open, #{source => explicit, server => <<\"https://127.0.0.1:%u\">>, "
           "token => <<\"t\">>}}}",
           closed_port());
  has(req, "kube => 1", "auth => token");
  has("{call, 2, {kube_request, 1, #{path => <<\"/\">>}}}", "badarg",
      "method and path are required");
  has("{call, 3, {kube_request, 1, #{method => head, path => <<\"/\">>}}}", "badarg",
      "method must be get, post, put, patch or delete");
  has("{call, 4, {kube_request, 1, #{method => get, path => <<\"api\">>}}}", "inval",
      "must start with '/'");
  has("{call, 5, {kube_request, 1, #{method => get, path => <<\"/a b\">>}}}", "inval",
      "without spaces");
  has("{call, 6, {kube_request, 1, #{method => get, path => <<\"/\">>, timeout => 0}}}", "inval",
      "timeout must be 1 to 3600000 ms");
  has("{call, 7, {kube_request, 1, #{method => post, path => <<\"/\">>, body => {a}}}}",
      "badarg", "a tuple is not JSON");
  has("{call, 8, {kube_request, 1, #{method => get, path => <<\"/\">>, x => 1}}}", "badarg",
      "unknown key \\\"x\\\"");
  has("{call, 9, {kube_request, 1, #{method => get, path => <<\"/\">>, content_type => "
      "<<\"a\\nb\">>}}}",
      "badarg", "content_type");
  has("{call, 10, {kube_request, 1, []}}", "badarg", "Req must be a map");
  /* Nothing listens: unavail, from the loop, after the call returned. */
  has("{call, 11, {kube_request, 1, #{method => post, path => <<\"/api\">>, body => #{a => "
      "1}}}}",
      "{reply,11,{error,{unavail,", "cannot connect");
  finish_clean();
}

Test(port_kube, exec_refusals) {
  has("{call, 1, {kube_open, #{source => explicit, server => <<\"https://127.0.0.1:1\">>}}}",
      "auth => none", NULL);
  has("{call, 2, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>}}}",
      "badarg", "are required");
  has("{call, 3, {kube_exec, 1, #{namespace => <<\"A_B\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => [<<\"true\">>]}}}",
      "inval", "is not a Kubernetes name");
  /* Names that would climb the path, or are no DNS-1123 names. */
  static const char *const BADNAMES[] = {
      "namespace => <<\"..\">>, pod => <<\"p\">>, container => <<\"c\">>",
      "namespace => <<\".\">>, pod => <<\"p\">>, container => <<\"c\">>",
      "namespace => <<\"a.b\">>, pod => <<\"p\">>, container => <<\"c\">>",
      "namespace => <<\"-a\">>, pod => <<\"p\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\"..\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\"p.\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\".p\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\"p..q\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\"p-\">>, container => <<\"c\">>",
      "namespace => <<\"a\">>, pod => <<\"p\">>, container => <<\"c.d\">>",
      "namespace => <<\"a\">>, pod => <<\"p\">>, container => <<\"c-\">>",
  };
  for (size_t k = 0; k < sizeof(BADNAMES) / sizeof(BADNAMES[0]); k++) {
    char req[256];
    snprintf(req, sizeof(req),
             "{call, %zu, {kube_exec, 1, #{%s, command => [<<\"true\">>]}}}", 100 + k,
             BADNAMES[k]);
    has(req, "inval", "is not a Kubernetes name");
    snprintf(req, sizeof(req),
             "{call, %zu, {kube_forward, 1, #{%.*s, port => 80, listen => {tcp, "
             "<<\"127.0.0.1\">>, 0}}}}",
             200 + k, (int)(strstr(BADNAMES[k], ", container") - BADNAMES[k]), BADNAMES[k]);
    if (strstr(BADNAMES[k], "container => <<\"c\">>") != NULL)
      has(req, "inval", "is not a Kubernetes name");
  }
  /* A subdomain pod name with dots is fine (the call goes on: unavail). */
  has("{call, 20, {kube_exec, 1, #{namespace => <<\"a-1\">>, pod => <<\"p.q-r.s\">>, "
      "container => <<\"c\">>, command => [<<\"x\">>]}}}",
      "{reply,20,{error,{unavail,", NULL);
  has("{call, 4, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => []}}}",
      "badarg", "command must be a list of 1 to");
  has("{call, 5, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => [<<\"a\\x00\">>]}}}",
      "badarg", "command[0]");
  has("{call, 6, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => [<<\"x\">>], max_output => 0}}}",
      "inval", "max_output must be");
  has("{call, 7, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => [<<\"x\">>], stdin => 3}}}",
      "badarg", "stdin must be a binary");
  has("{call, 8, {kube_exec, 2, #{}}}", "closed", "no open Kubernetes handle 2");
  has("{call, 9, {kube_exec, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, container => "
      "<<\"c\">>, command => [<<\"x\">>, <<\"a b&c\">>], stdin => <<\"in\">>}}}",
      "{reply,9,{error,{unavail,", NULL);
  finish_clean();
}

Test(port_kube, forward_listeners) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {kube_open, #{source => explicit, server => <<\"https://127.0.0.1:%u\">>, "
           "token => <<\"t\">>}}}",
           closed_port());
  has(req, "kube => 1", NULL);
  has("{call, 2, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 80, "
      "listen => {tcp, <<\"0.0.0.0\">>, 0}}}}",
      "inval", "loopback");
  has("{call, 3, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 80, "
      "listen => {unix, <<\"relative\">>}}}}",
      "inval", NULL);
  has("{call, 4, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 0, "
      "listen => {tcp, <<\"127.0.0.1\">>, 0}}}}",
      "badarg", "port (1 to 65535)");
  has("{call, 5, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 80, "
      "listen => {udp, <<\"x\">>}}}}",
      "badarg", "listen must be {unix, Path} or {tcp, Host, Port}");
  char sock[128];
  snprintf(sock, sizeof(sock), "%s/fwd.sock", dir);
  snprintf(req, sizeof(req),
           "{call, 6, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 80, "
           "listen => {unix, <<\"%s\">>}}}}",
           sock);
  char *got = expect_has(req, "{reply,6,{ok,{1,#{address => {unix,", sock);
  free(got);
  struct stat st;
  cr_assert_eq(stat(sock, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600);
  /* A connection: the tunnel cannot reach the server; reported, twice. */
  for (int k = 0; k < 2; k++) {
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", sock);
    cr_assert_eq(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
    char *async = ce_test_port_recv(&pp, WAIT_MS);
    cr_assert_not_null(async);
    cr_assert(strstr(async, "{kube_forward,1,{error,<<\"") != NULL, "%s", async);
    cr_assert(strstr(async, "cannot connect") != NULL, "%s", async);
    free(async);
    char b;
    cr_assert_eq(read(c, &b, 1), 0, "the local socket is closed");
    close(c);
  }
  has("{call, 7, {kube_forward, 1, #{namespace => <<\"a\">>, pod => <<\"p\">>, port => 80, "
      "listen => {tcp, <<\"localhost\">>, 0}}}}",
      "{reply,7,{ok,{2,#{address => {tcp,<<\"127.0.0.1\">>,", NULL);
  ce_test_port_expect(&pp, "{call, 8, {kube_forward_close, 1}}", "{reply,8,ok}");
  cr_assert_neq(stat(sock, &st), 0, "the socket file is removed");
  ce_test_port_expect(&pp, "{call, 9, {kube_forward_close, 1}}", "{reply,9,ok}");
  /* kube_close closes listener 2 as well. */
  ce_test_port_expect(&pp, "{call, 10, {kube_close, 1}}", "{reply,10,ok}");
  finish_clean();
}
