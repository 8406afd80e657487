/* Tests for c_src/kube/config.c: the kubeconfig loader. Every refusal is
 * checked for its code and for naming the file and the YAML path; merging
 * several files follows kubectl (first definition wins, current-context
 * from the first file that sets it, relative paths from each file's
 * directory); allocation failures are injected through the whole load. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "kube/config.h"
#include "support/failalloc.h"

TestSuite(kube_config);

#define HEAD                                                                             \
  "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n"             \
  "contexts:\n- name: x\n  context: {cluster: c, user: u, namespace: ns1}\n"          \
  "current-context: x\n"

static int parse(const char *yaml, ce_kube_config_t *c, char *err) {
  return ce_kube_config_parse(yaml, strlen(yaml), "/etc/kc.yaml", "/etc", NULL, c, err, 512);
}

Test(kube_config, token_user) {
  ce_kube_config_t c;
  char err[512];
  int rc = parse(HEAD "users:\n- name: u\n  user: {token: abc}\n", &c, err);
  cr_assert_eq(rc, CE_OK, "%s", err);
  cr_assert_str_eq(c.server, "https://127.0.0.1:6443");
  cr_assert_str_eq(c.host, "127.0.0.1");
  cr_assert_eq(c.port, 6443);
  cr_assert_str_eq(c.path_prefix, "");
  cr_assert_str_eq(c.context, "x");
  cr_assert_str_eq(c.user, "u");
  cr_assert_str_eq(c.namespace_, "ns1");
  cr_assert_eq(c.auth, CE_KUBE_AUTH_TOKEN);
  cr_assert_str_eq(c.token, "abc");
  cr_assert_str_eq(ce_kube_auth_name(c.auth), "token");
  ce_kube_config_free(&c);
}

Test(kube_config, every_cluster_field_and_exec) {
  ce_kube_config_t c;
  char err[512];
  /* "aGVsbG8=" is "hello". */
  const char *y =
      "clusters:\n- name: c\n  cluster:\n    server: https://[::1]:8443/prefix/\n"
      "    certificate-authority-data: aGVsbG8=\n    tls-server-name: api.example\n"
      "users:\n- name: u\n  user:\n    exec:\n"
      "      apiVersion: client.authentication.k8s.io/v1beta1\n"
      "      command: bin/plugin\n      args: [--a, b]\n"
      "      env:\n      - {name: K, value: V}\n      - {name: E}\n"
      "      provideClusterInfo: true\n      interactiveMode: Never\n"
      "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
      "current-context: x\n";
  cr_assert_eq(parse(y, &c, err), CE_OK, "%s", err);
  cr_assert_str_eq(c.host, "::1");
  cr_assert_eq(c.port, 8443);
  cr_assert_str_eq(c.path_prefix, "/prefix");
  cr_assert_str_eq(c.server, "https://[::1]:8443/prefix");
  cr_assert_eq(c.ca_len, 5);
  cr_assert_str_eq(c.ca_pem, "hello");
  cr_assert_str_eq(c.tls_server_name, "api.example");
  cr_assert_eq(c.auth, CE_KUBE_AUTH_EXEC);
  cr_assert_str_eq(c.exec.argv[0], "/etc/bin/plugin");
  cr_assert_str_eq(c.exec.argv[1], "--a");
  cr_assert_str_eq(c.exec.argv[2], "b");
  cr_assert_null(c.exec.argv[3]);
  cr_assert_str_eq(c.exec.env[0], "K=V");
  cr_assert_str_eq(c.exec.env[1], "E=");
  cr_assert(c.exec.provide_cluster_info);
  cr_assert_null(c.namespace_);
  ce_kube_config_free(&c);
}

Test(kube_config, bare_command_is_left_to_path_and_no_user_is_anonymous) {
  ce_kube_config_t c;
  char err[512];
  const char *y = HEAD "users:\n- name: u\n  user:\n    exec: {apiVersion: "
                       "client.authentication.k8s.io/v1, command: kubelogin}\n";
  cr_assert_eq(parse(y, &c, err), CE_OK, "%s", err);
  cr_assert_str_eq(c.exec.argv[0], "kubelogin");
  ce_kube_config_free(&c);
  const char *anon = "clusters:\n- name: c\n  cluster: {server: 'https://h'}\n"
                     "contexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n";
  cr_assert_eq(parse(anon, &c, err), CE_OK, "%s", err);
  cr_assert_eq(c.auth, CE_KUBE_AUTH_NONE);
  cr_assert_eq(c.port, 443);
  cr_assert_str_eq(c.host, "h");
  ce_kube_config_free(&c);
}

typedef struct {
  const char *yaml;
  int code;
  const char *says; /* a substring of the message */
} bad_t;

static const bad_t BAD[] = {
    {"clusters: [\n", CE_EINVAL, "line 2"},
    {"- a\n- b\n", CE_EINVAL, "the document must be a mapping"},
    {"a: 1\n---\nb: 2\n", CE_EINVAL, "more than one YAML document"},
    {"clusters: {}\n", CE_EINVAL, ": clusters: must be a list"},
    {"clusters: [1]\n", CE_EINVAL, "clusters[0]: must be a mapping"},
    {"clusters: [{cluster: {}}]\n", CE_EINVAL, "clusters[0].name: must be a non-empty string"},
    {"clusters: [{name: c, cluster: 3}]\n", CE_EINVAL, "clusters[0].cluster: must be a mapping"},
    {"users: [{name: []}]\n", CE_EINVAL, "users[0].name"},
    {"contexts: 7\n", CE_EINVAL, "contexts: must be a list"},
    {"current-context: [a]\n", CE_EINVAL, "current-context: must be a string"},
    {"clusters: []\n", CE_EINVAL, "no context given and no current-context set"},
    {"current-context: nope\n", CE_EINVAL, "no context named \"nope\""},
    {"contexts: [{name: x, context: {user: u}}]\ncurrent-context: x\n", CE_EINVAL,
     "contexts[0].context.cluster: is required"},
    {"contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n", CE_EINVAL,
     "contexts[0].context.cluster: names no cluster"},
    {"clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
     "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
     CE_EINVAL, "contexts[0].context.user: names no user"},
    {"clusters: [{name: c}]\ncontexts: [{name: x, context: {cluster: c}}]\n"
     "current-context: x\n",
     CE_EINVAL, "clusters[0].cluster: is required"},
    {"clusters: [{name: c, cluster: {}}]\ncontexts: [{name: x, context: {cluster: c}}]\n"
     "current-context: x\n",
     CE_EINVAL, "clusters[0].cluster.server: is required"},
    {"clusters: [{name: c, cluster: {server: [a]}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "clusters[0].cluster.server: must be a string"},
    {"clusters: [{name: c, cluster: {server: 'http://h'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "must be an https:// URL"},
    {"clusters: [{name: c, cluster: {server: 'https://h:0'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad port"},
    {"clusters: [{name: c, cluster: {server: 'https://h:99999'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad port"},
    {"clusters: [{name: c, cluster: {server: 'https://h:1x'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad port"},
    {"clusters: [{name: c, cluster: {server: 'https://[::1'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "unclosed"},
    {"clusters: [{name: c, cluster: {server: 'https://[::1]x'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad port"},
    {"clusters: [{name: c, cluster: {server: 'https://'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "the host must be"},
    {"clusters: [{name: c, cluster: {server: 'https://u@h'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad character in the host"},
    {"clusters: [{name: c, cluster: {server: 'https://h/a?b'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "query or fragment"},
    {"clusters: [{name: c, cluster: {server: \"https://h/a\\tb\"}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "bad character in the path"},
    {"clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: '!!'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "clusters[0].cluster.certificate-authority-data: is not base64"},
    {"clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: \"\"}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "is empty"},
    {"clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: aGk=, "
     "certificate-authority: /x}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "are both set"},
    {"clusters: [{name: c, cluster: {server: 'https://h', certificate-authority: "
     "/nonexistent/ca.crt}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_ENOENT, "clusters[0].cluster.certificate-authority: cannot open"},
    {"clusters: [{name: c, cluster: {server: 'https://h', insecure-skip-tls-verify: maybe}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "insecure-skip-tls-verify: must be true or false"},
    {"clusters: [{name: c, cluster: {server: 'https://h', insecure-skip-tls-verify: true, "
     "certificate-authority-data: aGk=}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "keep one"},
    {"clusters: [{name: c, cluster: {server: 'https://h', tls-server-name: {}}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "tls-server-name: must be a string"},
    {HEAD "users: [{name: u, user: {username: a, password: b}}]\n", CE_EINVAL,
     "users[0].user.username: is not supported (user \"u\")"},
    {HEAD "users: [{name: u, user: {auth-provider: {name: gcp}}}]\n", CE_EINVAL,
     "users[0].user.auth-provider: is not supported"},
    {HEAD "users: [{name: u, user: {as: admin, token: t}}]\n", CE_EINVAL,
     "users[0].user.as: is not supported"},
    {HEAD "users: [{name: u, user: {token: a, tokenFile: /t}}]\n", CE_EINVAL,
     "sets more than one of"},
    {HEAD "users: [{name: u, user: {token: ''}}]\n", CE_EINVAL, "users[0].user.token: is empty"},
    /* A token goes into a header: no CR, LF, space or control byte. */
    {HEAD "users: [{name: u, user: {token: \"x\\r\\nImpersonate-User: system:admin\"}}]\n",
     CE_EINVAL, "users[0].user.token: must be printable ASCII"},
    {HEAD "users: [{name: u, user: {token: \"a b\"}}]\n", CE_EINVAL,
     "users[0].user.token: must be printable ASCII"},
    {HEAD "users: [{name: u, user: {token: \"a\\tb\"}}]\n", CE_EINVAL,
     "users[0].user.token: must be printable ASCII"},
    /* Duplicate keys, NUL in names, proxy-url. */
    {HEAD "users: [{name: u, user: {token: a, token: b}}]\n", CE_EINVAL,
     "the key \"token\" appears twice"},
    {"current-context: x\ncurrent-context: y\n", CE_EINVAL,
     "line 2: the key \"current-context\" appears twice"},
    {"clusters: [{name: \"c\\0x\", cluster: {server: 'https://h'}}]\n", CE_EINVAL,
     "clusters[0].name: contains a NUL byte"},
    {"clusters: [{name: c, cluster: {server: 'https://h', proxy-url: 'http://p:3128'}}]\n"
     "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n",
     CE_EINVAL, "clusters[0].cluster.proxy-url: is not supported"},
    {HEAD "users: [{name: u, user: {token: [a]}}]\n", CE_EINVAL,
     "users[0].user.token: must be a string"},
    {HEAD "users: [{name: u, user: {client-certificate-data: aGk=}}]\n", CE_EINVAL,
     "is set without its key"},
    {HEAD "users: [{name: u, user: {client-key-data: aGk=}}]\n", CE_EINVAL,
     "is set without its certificate"},
    {HEAD "users: [{name: u, user: {client-key: /nonexistent/key}}]\n", CE_ENOENT,
     "users[0].user.client-key: cannot open"},
    {HEAD "users: [{name: u, user: {exec: 5}}]\n", CE_EINVAL,
     "users[0].user.exec: must be a mapping"},
    {HEAD "users: [{name: u, user: {exec: {command: x}}}]\n", CE_EINVAL,
     "users[0].user.exec.apiVersion: is required"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1alpha1, "
          "command: x}}}]\n",
     CE_EINVAL, "is not supported (client.authentication.k8s.io/v1 or v1beta1)"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1}}}]\n",
     CE_EINVAL, "users[0].user.exec.command: is required"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, args: a}}}]\n",
     CE_EINVAL, "users[0].user.exec.args: must be a list of strings"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, args: [a, [b]]}}}]\n",
     CE_EINVAL, "users[0].user.exec.args[1]: must be a string"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, env: {a: b}}}}]\n",
     CE_EINVAL, "users[0].user.exec.env: must be a list"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, env: [[]]}}}]\n",
     CE_EINVAL, "users[0].user.exec.env[0]: must be a mapping"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, env: [{value: v}]}}}]\n",
     CE_EINVAL, "users[0].user.exec.env[0].name: must be a non-empty string without '='"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, env: [{name: 'a=b'}]}}}]\n",
     CE_EINVAL, "without '='"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x, provideClusterInfo: 3}}}]\n",
     CE_EINVAL, "users[0].user.exec.provideClusterInfo: must be true or false"},
    {HEAD "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, "
          "command: x}, token: t}}]\n",
     CE_EINVAL, "sets more than one of"},
};

Test(kube_config, every_refusal_names_the_file_and_path) {
  for (size_t k = 0; k < sizeof(BAD) / sizeof(BAD[0]); k++) {
    ce_kube_config_t c;
    char err[512];
    int rc = parse(BAD[k].yaml, &c, err);
    cr_assert_eq(rc, BAD[k].code, "case %zu: got %d (%s)", k, rc, rc == CE_OK ? "ok" : err);
    cr_assert(strstr(err, BAD[k].says) != NULL, "case %zu: \"%s\" lacks \"%s\"", k, err,
              BAD[k].says);
    if (strncmp(err, "kubeconfig \"", 12) == 0)
      cr_assert(strstr(err, "/etc/kc.yaml") != NULL, "case %zu: %s", k, err);
    cr_assert_null(c.server, "case %zu: the config is left empty", k);
  }
}

Test(kube_config, null_values_are_absent) {
  ce_kube_config_t c;
  char err[512];
  const char *y = "clusters:\n- name: c\n  cluster:\n    server: https://h\n"
                  "    certificate-authority: ~\n    tls-server-name: null\n"
                  "users:\n- name: u\n  user:\n    token: t\n    client-certificate:\n"
                  "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
  cr_assert_eq(parse(y, &c, err), CE_OK, "%s", err);
  cr_assert_null(c.ca_pem);
  cr_assert_null(c.tls_server_name);
  cr_assert_eq(c.auth, CE_KUBE_AUTH_TOKEN);
  ce_kube_config_free(&c);
}

Test(kube_config, explicit_context_wins) {
  ce_kube_config_t c;
  char err[512];
  const char *y = "clusters:\n- {name: a, cluster: {server: 'https://a'}}\n"
                  "- {name: b, cluster: {server: 'https://b:1'}}\n"
                  "contexts:\n- {name: ca, context: {cluster: a}}\n"
                  "- {name: cb, context: {cluster: b}}\ncurrent-context: ca\n";
  cr_assert_eq(ce_kube_config_parse(y, strlen(y), "f", NULL, "cb", &c, err, sizeof(err)), CE_OK,
               "%s", err);
  cr_assert_str_eq(c.host, "b");
  cr_assert_str_eq(c.context, "cb");
  ce_kube_config_free(&c);
}

/* ---- files ---------------------------------------------------------------------------- */

static char dir[64];

static void mkfile(const char *name, const char *text) {
  char p[256];
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

static void files_setup(void) {
  snprintf(dir, sizeof(dir), "/tmp/kube-config-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void files_teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(kube_config_files, .init = files_setup, .fini = files_teardown);

Test(kube_config_files, merge_like_kubectl) {
  /* a: current-context ctx1, cluster c1 (https://first), user u1 token
   * from a relative tokenFile; b: redefines c1 (ignored), defines ctx2
   * and its own current-context (ignored). */
  mkfile("a", "current-context: ctx1\n"
              "clusters: [{name: c1, cluster: {server: 'https://first', "
              "certificate-authority: ca.pem}}]\n"
              "users: [{name: u1, user: {tokenFile: tok}}]\n");
  mkfile("b", "current-context: ctx2\n"
              "clusters: [{name: c1, cluster: {server: 'https://second'}}]\n"
              "contexts: [{name: ctx1, context: {cluster: c1, user: u1}}, "
              "{name: ctx2, context: {cluster: c1}}]\n");
  mkfile("ca.pem", "PEM");
  char a[128], b[128], missing[128];
  snprintf(a, sizeof(a), "%s/a", dir);
  snprintf(b, sizeof(b), "%s/b", dir);
  snprintf(missing, sizeof(missing), "%s/missing", dir);
  const char *paths[] = {missing, a, b};
  ce_kube_config_t c;
  char err[512];
  cr_assert_eq(ce_kube_config_load(paths, 3, NULL, &c, err, sizeof(err)), CE_OK, "%s", err);
  cr_assert_str_eq(c.context, "ctx1");
  cr_assert_str_eq(c.host, "first");
  cr_assert_str_eq(c.ca_pem, "PEM");
  cr_assert_eq(c.auth, CE_KUBE_AUTH_TOKEN_FILE);
  char want[160];
  snprintf(want, sizeof(want), "%s/tok", dir);
  cr_assert_str_eq(c.token_file, want);
  ce_kube_config_free(&c);
}

Test(kube_config_files, errors_of_files) {
  ce_kube_config_t c;
  char err[512], p1[128], p2[128];
  snprintf(p1, sizeof(p1), "%s/none1", dir);
  snprintf(p2, sizeof(p2), "%s/none2", dir);
  const char *none[] = {p1, p2};
  cr_assert_eq(ce_kube_config_load(none, 2, NULL, &c, err, sizeof(err)), CE_ENOENT);
  cr_assert(strstr(err, "no file exists") != NULL, "%s", err);
  cr_assert_eq(ce_kube_config_load(none, 0, NULL, &c, err, sizeof(err)), CE_EINVAL);
  /* A directory is not a kubeconfig. */
  const char *d[] = {dir};
  cr_assert_eq(ce_kube_config_load(d, 1, NULL, &c, err, sizeof(err)), CE_EIO);
  cr_assert(strstr(err, "not a regular file") != NULL, "%s", err);
  /* An unreadable file (root reads everything: skip then). */
  mkfile("locked", "a: 1\n");
  snprintf(p1, sizeof(p1), "%s/locked", dir);
  chmod(p1, 0);
  if (geteuid() != 0) {
    const char *l[] = {p1};
    cr_assert_eq(ce_kube_config_load(l, 1, NULL, &c, err, sizeof(err)), CE_EIO);
  }
  /* A file over the size limit. */
  snprintf(p2, sizeof(p2), "%s/big", dir);
  FILE *f = fopen(p2, "w");
  cr_assert_not_null(f);
  cr_assert_eq(ftruncate(fileno(f), CE_KUBE_CONFIG_FILE_MAX + 1), 0);
  fclose(f);
  const char *big[] = {p2};
  cr_assert_eq(ce_kube_config_load(big, 1, NULL, &c, err, sizeof(err)), CE_ETOOBIG);
  /* A FIFO is refused without blocking in open() (nobody writes to it). */
  snprintf(p2, sizeof(p2), "%s/fifo", dir);
  cr_assert_eq(mkfifo(p2, 0600), 0);
  const char *fifo[] = {p2};
  cr_assert_eq(ce_kube_config_load(fifo, 1, NULL, &c, err, sizeof(err)), CE_EIO);
  cr_assert(strstr(err, "not a regular file") != NULL, "%s", err);
  /* A syntax error names the file and the line. */
  mkfile("broken", "clusters:\n  - [\n");
  snprintf(p1, sizeof(p1), "%s/broken", dir);
  const char *br[] = {p1};
  cr_assert_eq(ce_kube_config_load(br, 1, NULL, &c, err, sizeof(err)), CE_EINVAL);
  cr_assert(strstr(err, p1) != NULL && strstr(err, "line ") != NULL, "%s", err);
}

Test(kube_config_files, in_cluster) {
  mkfile("token", "tok\n");
  mkfile("ca.crt", "PEM");
  mkfile("namespace", "agents\n");
  ce_kube_config_t c;
  char err[512];
  cr_assert_eq(ce_kube_config_in_cluster(dir, "fd00::1", 443, &c, err, sizeof(err)), CE_OK,
               "%s", err);
  cr_assert_str_eq(c.server, "https://[fd00::1]:443");
  cr_assert_str_eq(c.host, "fd00::1");
  cr_assert_str_eq(c.namespace_, "agents");
  cr_assert_eq(c.auth, CE_KUBE_AUTH_TOKEN_FILE);
  cr_assert_str_eq(c.ca_pem, "PEM");
  ce_kube_config_free(&c);
  /* From the environment. */
  setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
  cr_assert_eq(ce_kube_config_in_cluster(dir, NULL, 0, &c, err, sizeof(err)), CE_OK, "%s", err);
  cr_assert_str_eq(c.server, "https://10.0.0.1:6443");
  ce_kube_config_free(&c);
  setenv("KUBERNETES_SERVICE_PORT", "x", 1);
  cr_assert_eq(ce_kube_config_in_cluster(dir, NULL, 0, &c, err, sizeof(err)), CE_EINVAL);
  unsetenv("KUBERNETES_SERVICE_HOST");
  cr_assert_eq(ce_kube_config_in_cluster(dir, NULL, 0, &c, err, sizeof(err)), CE_EINVAL);
  /* No CA: noent naming it. */
  char sub[128];
  snprintf(sub, sizeof(sub), "%s/empty", dir);
  mkdir(sub, 0700);
  cr_assert_eq(ce_kube_config_in_cluster(sub, "h", 1, &c, err, sizeof(err)), CE_ENOENT);
  cr_assert(strstr(err, "ca.crt") != NULL, "%s", err);
}

/* ---- base64 ----------------------------------------------------------------------------- */

Test(kube_config, base64) {
  char *o;
  size_t n;
  cr_assert_eq(ce_kube_base64_decode("aGVs\nbG8=", 9, &o, &n), CE_OK);
  cr_assert_eq(n, 5);
  cr_assert_str_eq(o, "hello");
  free(o);
  cr_assert_eq(ce_kube_base64_decode("aGVsbG8", 7, &o, &n), CE_OK); /* unpadded */
  cr_assert_str_eq(o, "hello");
  free(o);
  cr_assert_eq(ce_kube_base64_decode("aGVsbG9=", 8, &o, &n), CE_EINVAL); /* stray bits */
  cr_assert_eq(ce_kube_base64_decode("a", 1, &o, &n), CE_EINVAL);
  cr_assert_eq(ce_kube_base64_decode("aG=V", 4, &o, &n), CE_EINVAL);
  cr_assert_eq(ce_kube_base64_decode("aGk===", 6, &o, &n), CE_EINVAL);
  cr_assert_eq(ce_kube_base64_decode("a-k=", 4, &o, &n), CE_EINVAL);
}

/* ---- allocation failures ------------------------------------------------------------ */

Test(kube_config, allocation_failures) {
  const char *y =
      "clusters:\n- name: c\n  cluster:\n    server: https://h:1/p\n"
      "    certificate-authority-data: aGVsbG8=\n    tls-server-name: n\n"
      "users:\n- name: u\n  user:\n    exec:\n"
      "      apiVersion: client.authentication.k8s.io/v1\n"
      "      command: ./p\n      args: [a]\n      env: [{name: K, value: V}]\n"
      "contexts:\n- name: x\n  context: {cluster: c, user: u, namespace: n}\n"
      "current-context: x\n";
  for (size_t k = 0;; k++) {
    ce_kube_config_t c;
    char err[512];
    ce_failalloc_arm(k);
    int rc = parse(y, &c, err);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK, "%s", err);
      ce_kube_config_free(&c);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %d %s", k, rc, err);
  }
}
