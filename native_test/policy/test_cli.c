/* Tests for c_src/cli/policy_cmd.c through the built binary
 * ($CONDUKT_EGRESS_BIN, set by `make c-test`): exit codes, the stderr line
 * of `policy check`, and the exact JSON line of `policy eval`. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/run.h"

/* Captured output is small: one JSON line or the usage text. */
#define OUT_MAX 8192

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/ce_test_cli_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void path_in_dir(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
}

static void teardown(void) {
  static const char *names[] = {"policy.json", "bad.json", "mp.json", "cred.json", "stdout", "stderr"};
  char path[128];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    path_in_dir(path, sizeof(path), names[i]);
    unlink(path);
  }
  rmdir(dir);
}

TestSuite(cli, .init = setup, .fini = teardown);

static const char *binary(void) {
  const char *bin = getenv("CONDUKT_EGRESS_BIN");
  cr_assert_not_null(bin, "CONDUKT_EGRESS_BIN is not set; run the tests with `make c-test`");
  cr_assert_eq(access(bin, X_OK), 0, "%s is not an executable", bin);
  return bin;
}

static void write_file(const char *name, const char *text) {
  char path[128];
  path_in_dir(path, sizeof(path), name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

static void slurp(const char *name, char *out) {
  char path[128];
  path_in_dir(path, sizeof(path), name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t n = fread(out, 1, OUT_MAX - 1, f);
  out[n] = '\0';
  fclose(f);
}

typedef struct {
  int status;
  char out[OUT_MAX];
  char err[OUT_MAX];
} result_t;

/* Runs the binary with args (NULL-terminated, without argv[0]) and
 * captures its exit status, stdout and stderr. */
static void run(result_t *r, const char *const *args) {
  const char *bin = binary();
  char *argv[16];
  size_t n = 0;
  argv[n++] = (char *)bin;
  for (; args[n - 1] != NULL && n < 15; n++)
    argv[n] = (char *)args[n - 1];
  argv[n] = NULL;

  char out_path[128], err_path[128];
  path_in_dir(out_path, sizeof(out_path), "stdout");
  path_in_dir(err_path, sizeof(err_path), "stderr");

  r->status = ce_test_run(bin, argv, out_path, err_path, NULL, NULL);
  slurp("stdout", r->out);
  slurp("stderr", r->err);
}

static const char *POLICY =
    "{\"version\":1,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"*.internal.example.com\"]},"
    "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"api.github.com\",\"*.openai.com\"]},"
    "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":5000,\"cache\":true}]}";

static void policy_path(char *buf, size_t cap) {
  write_file("policy.json", POLICY);
  path_in_dir(buf, cap, "policy.json");
}

Test(cli, check_accepts_a_valid_document) {
  char p[128];
  result_t r;
  policy_path(p, sizeof(p));
  run(&r, (const char *[]){"policy", "check", p, NULL});
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  cr_assert_str_empty(r.out);
  cr_assert_str_empty(r.err);
}

Test(cli, check_reports_the_first_error) {
  char p[128], expected[512];
  result_t r;
  write_file("bad.json", "{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,"
                         "\"kind\":\"allow\",\"hosts\":[\"https://api.github.com\"]}]}");
  path_in_dir(p, sizeof(p), "bad.json");
  run(&r, (const char *[]){"policy", "check", p, NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_str_empty(r.out);
  snprintf(expected, sizeof(expected),
           "condukt-egress: %s: $.rules[0].hosts[0]: bad pattern "
           "\"https://api.github.com\" (scheme): write the host only, without \"://\"\n",
           p);
  cr_assert_str_eq(r.err, expected);

  write_file("bad.json", "{\"version\":4}");
  run(&r, (const char *[]){"policy", "check", p, NULL});
  cr_assert_eq(r.status, 1);
  snprintf(expected, sizeof(expected),
           "condukt-egress: %s: $.version: unsupported version 4 (this build reads "
           "versions 1 to 3)\n",
           p);
  cr_assert_str_eq(r.err, expected);

  write_file("bad.json", "not json");
  run(&r, (const char *[]){"policy", "check", p, NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_not_null(strstr(r.err, ": invalid JSON at line 1"), "%s", r.err);
}

Test(cli, check_missing_file) {
  char p[128], expected[256];
  result_t r;
  path_in_dir(p, sizeof(p), "nope.json");
  run(&r, (const char *[]){"policy", "check", p, NULL});
  cr_assert_eq(r.status, 1);
  snprintf(expected, sizeof(expected),
           "condukt-egress: %s: cannot open: No such file or directory\n", p);
  cr_assert_str_eq(r.err, expected);
}

Test(cli, eval_prints_one_json_line) {
  static const struct {
    const char *input, *line;
  } cases[] = {
      {"https://api.github.com/repos",
       "{\"decision\":\"allow\",\"reason\":null,\"matched_rule\":{\"index\":1,"
       "\"kind\":\"allow\"},\"host\":\"api.github.com\"}\n"},
      {"x.internal.example.com:443",
       "{\"decision\":\"deny\",\"reason\":\"denied_by_rule\",\"matched_rule\":"
       "{\"index\":0,\"kind\":\"deny\"},\"host\":\"x.internal.example.com\"}\n"},
      {"Example.ORG.",
       "{\"decision\":\"decide\",\"reason\":null,\"matched_rule\":{\"index\":2,"
       "\"kind\":\"decide\"},\"host\":\"example.org\"}\n"},
      {"[::FFFF:127.0.0.1]:80",
       "{\"decision\":\"decide\",\"reason\":null,\"matched_rule\":{\"index\":2,"
       "\"kind\":\"decide\"},\"host\":\"127.0.0.1\"}\n"},
      {"127.1",
       "{\"decision\":\"deny\",\"reason\":\"invalid_host\",\"matched_rule\":null,"
       "\"host\":null}\n"},
      {"ftp://api.github.com",
       "{\"decision\":\"deny\",\"reason\":\"invalid_url\",\"matched_rule\":null,"
       "\"host\":null}\n"},
      {"https://evil.net\\@api.github.com",
       "{\"decision\":\"deny\",\"reason\":\"invalid_url\",\"matched_rule\":null,"
       "\"host\":null}\n"},
      {"", "{\"decision\":\"deny\",\"reason\":\"invalid_host\",\"matched_rule\":null,"
           "\"host\":null}\n"},
  };
  char p[128];
  result_t r;
  policy_path(p, sizeof(p));
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    run(&r, (const char *[]){"policy", "eval", p, cases[i].input, NULL});
    cr_expect_eq(r.status, 0, "%s: %s", cases[i].input, r.err);
    cr_expect_str_eq(r.out, cases[i].line, "%s", cases[i].input);
    cr_expect_str_empty(r.err, "%s", cases[i].input);
  }
}

Test(cli, eval_default_deny_and_bad_policy) {
  char p[128];
  result_t r;
  write_file("bad.json", "{\"version\":1,\"default\":\"deny\",\"rules\":[]}");
  path_in_dir(p, sizeof(p), "bad.json");
  run(&r, (const char *[]){"policy", "eval", p, "a.com", NULL});
  cr_assert_eq(r.status, 0);
  cr_assert_str_eq(r.out, "{\"decision\":\"deny\",\"reason\":\"default_deny\","
                          "\"matched_rule\":null,\"host\":\"a.com\"}\n");

  write_file("bad.json", "{\"version\":1,\"default\":\"deny\",\"rules\":[],\"x\":1}");
  run(&r, (const char *[]){"policy", "eval", p, "a.com", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_str_empty(r.out);
  cr_assert_not_null(strstr(r.err, ": $.x: unknown member\n"), "%s", r.err);
}

static void expect_usage(const char *const *args, const char *needle);

static const char *show_method(const char *m) { return m != NULL ? m : "(none)"; }

Test(cli, eval_takes_a_method) {
  char p[128];
  result_t r;
  write_file("mp.json", "{\"version\":2,\"default\":\"deny\",\"rules\":[{\"index\":0,\"kind\":\"allow\","
                        "\"hosts\":[{\"host\":\"a.com\",\"methods\":[\"GET\"],\"paths\":[\"/r/**\"]}]}]}");
  path_in_dir(p, sizeof(p), "mp.json");
  run(&r, (const char *[]){"policy", "eval", "--method", "GET", p, "https://a.com/r/x", NULL});
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.out, "{\"decision\":\"allow\",\"reason\":null,\"matched_rule\":{\"index\":0,"
                          "\"kind\":\"allow\"},\"host\":\"a.com\"}\n");
  run(&r, (const char *[]){"policy", "eval", p, "--method", "POST", "https://a.com/r/x", NULL});
  cr_expect_str_eq(r.out, "{\"decision\":\"deny\",\"reason\":\"default_deny\",\"matched_rule\":null,"
                          "\"host\":\"a.com\"}\n");
  /* No method given: a rule with methods does not match. */
  run(&r, (const char *[]){"policy", "eval", p, "https://a.com/r/x", NULL});
  cr_expect_str_eq(r.out, "{\"decision\":\"deny\",\"reason\":\"default_deny\",\"matched_rule\":null,"
                          "\"host\":\"a.com\"}\n");
  run(&r, (const char *[]){"policy", "eval", "--method", "GET", p, "https://a.com/r/%2e%2e%2fx", NULL});
  cr_expect_str_eq(r.out, "{\"decision\":\"deny\",\"reason\":\"invalid_path\",\"matched_rule\":{\"index\":0,"
                          "\"kind\":\"allow\"},\"host\":\"a.com\"}\n");
  expect_usage((const char *[]){"policy", "eval", p, "a.com", "--method", NULL}, "--method needs a value");
  expect_usage((const char *[]){"policy", "check", "--method", "GET", p, NULL}, "--method is an option of eval");
}

/* A policy with credentials: the line names the entries the request
 * would get (index, header, secret name), the first per header, none for a
 * deny, a plain URL or an invalid one; a decide lists what an allow by the
 * decider would add. */
Test(cli, eval_names_the_credentials) {
  static const char *policy =
      "{\"version\":3,\"default\":\"deny\",\"rules\":["
      "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"d.a.com\"]},"
      "{\"index\":1,\"kind\":\"allow\",\"hosts\":[\"*.a.com\",\"b.com\"]},"
      "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":1000,\"cache\":false}],"
      "\"credentials\":["
      "{\"host\":\"api.a.com\",\"methods\":[\"POST\"],\"paths\":[\"/r/**\"],\"header\":\"Authorization\","
      "\"secret\":\"narrow\"},"
      "{\"host\":\"*.a.com\",\"header\":\"authorization\",\"secret\":\"wide\"},"
      "{\"host\":\"*.a.com\",\"header\":\"x-key\",\"secret\":\"key\"},"
      "{\"host\":\"c.com\",\"header\":\"x-key\",\"secret\":\"c\"}]}";
#define ALLOW1(host)                                                                            \
  "{\"decision\":\"allow\",\"reason\":null,\"matched_rule\":{\"index\":1,\"kind\":\"allow\"},\"host\":\"" \
  host "\""
#define C_NARROW "{\"index\":0,\"header\":\"authorization\",\"secret\":\"narrow\"}"
#define C_WIDE "{\"index\":1,\"header\":\"authorization\",\"secret\":\"wide\"}"
#define C_KEY "{\"index\":2,\"header\":\"x-key\",\"secret\":\"key\"}"
  static const struct {
    const char *method, *input, *line;
  } cases[] = {
      {"POST", "https://api.a.com/r/x", ALLOW1("api.a.com") ",\"credentials\":[" C_NARROW "," C_KEY "]}\n"},
      {"GET", "https://api.a.com/r/x", ALLOW1("api.a.com") ",\"credentials\":[" C_WIDE "," C_KEY "]}\n"},
      {"POST", "https://api.a.com/r/../x", ALLOW1("api.a.com") ",\"credentials\":[" C_WIDE "," C_KEY "]}\n"},
      {NULL, "WSS://x.a.com/", ALLOW1("x.a.com") ",\"credentials\":[" C_WIDE "," C_KEY "]}\n"},
      /* A bare host has no path: the entry with paths does not match. */
      {"POST", "api.a.com:443", ALLOW1("api.a.com") ",\"credentials\":[" C_WIDE "," C_KEY "]}\n"},
      {"GET", "http://api.a.com/r/x", ALLOW1("api.a.com") ",\"credentials\":[]}\n"},
      {NULL, "ws://api.a.com/", ALLOW1("api.a.com") ",\"credentials\":[]}\n"},
      {NULL, "https://b.com/", ALLOW1("b.com") ",\"credentials\":[]}\n"},
      {NULL, "https://d.a.com/",
       "{\"decision\":\"deny\",\"reason\":\"denied_by_rule\",\"matched_rule\":{\"index\":0,\"kind\":\"deny\"},"
       "\"host\":\"d.a.com\",\"credentials\":[]}\n"},
      {NULL, "https://c.com/",
       "{\"decision\":\"decide\",\"reason\":null,\"matched_rule\":{\"index\":2,\"kind\":\"decide\"},"
       "\"host\":\"c.com\",\"credentials\":[{\"index\":3,\"header\":\"x-key\",\"secret\":\"c\"}]}\n"},
      {NULL, "ftp://api.a.com/",
       "{\"decision\":\"deny\",\"reason\":\"invalid_url\",\"matched_rule\":null,\"host\":null,"
       "\"credentials\":[]}\n"},
  };
#undef ALLOW1
#undef C_NARROW
#undef C_WIDE
#undef C_KEY
  char p[128];
  result_t r;
  write_file("cred.json", policy);
  path_in_dir(p, sizeof(p), "cred.json");
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (cases[i].method != NULL)
      run(&r, (const char *[]){"policy", "eval", "--method", cases[i].method, p, cases[i].input, NULL});
    else
      run(&r, (const char *[]){"policy", "eval", p, cases[i].input, NULL});
    cr_expect_eq(r.status, 0, "%s: %s", cases[i].input, r.err);
    cr_expect_str_eq(r.out, cases[i].line, "%s %s", show_method(cases[i].method), cases[i].input);
  }
}

static void expect_usage(const char *const *args, const char *needle) {
  result_t r;
  run(&r, args);
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect_str_empty(r.out);
  cr_expect_not_null(strstr(r.err, needle), "stderr should name \"%s\": %s", needle, r.err);
  cr_expect_not_null(strstr(r.err, "usage: condukt-egress policy check [--] FILE"), "%s", r.err);
}

Test(cli, usage_errors_exit_2) {
  char p[128];
  policy_path(p, sizeof(p));
  expect_usage((const char *[]){"policy", NULL}, "missing subcommand");
  expect_usage((const char *[]){"policy", "lint", p, NULL}, "unknown subcommand 'lint'");
  expect_usage((const char *[]){"policy", "check", NULL}, "missing FILE");
  expect_usage((const char *[]){"policy", "check", p, "extra", NULL},
               "unexpected argument 'extra'");
  expect_usage((const char *[]){"policy", "eval", NULL}, "missing FILE");
  expect_usage((const char *[]){"policy", "eval", p, NULL}, "missing URL_OR_HOST");
  expect_usage((const char *[]){"policy", "eval", p, "a.com", "b.com", NULL},
               "unexpected argument 'b.com'");
  expect_usage((const char *[]){"policy", "--verbose", NULL}, "unknown option '--verbose'");
  expect_usage((const char *[]){"policy", "check", "-", NULL}, "unknown option '-'");
  expect_usage((const char *[]){"policy", "check", "--strict", p, NULL},
               "unknown option '--strict'");
  expect_usage((const char *[]){"policy", "eval", p, "-x", NULL}, "unknown option '-x'");
}

Test(cli, help_prints_usage_on_stdout) {
  static const char *const forms[][3] = {{"policy", "help", NULL},
                                         {"policy", "--help", NULL},
                                         {"policy", "-h", NULL}};
  result_t r;
  for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
    run(&r, forms[i]);
    cr_expect_eq(r.status, 0, "%s", forms[i][1]);
    cr_expect_not_null(strstr(r.out, "usage: condukt-egress policy check [--] FILE"), "%s",
                       r.out);
    cr_expect_str_empty(r.err);
  }
}

Test(cli, double_dash_ends_options) {
  char p[128];
  result_t r;
  policy_path(p, sizeof(p));
  run(&r, (const char *[]){"policy", "eval", "--", p, "-x.example.org", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "\"host\":\"-x.example.org\""), "%s", r.out);
  /* Only the first "--" is special; after it "--" is an ordinary word
   * (here a host made of one label of two hyphens). */
  run(&r, (const char *[]){"policy", "eval", "--", p, "--", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "\"host\":\"--\""), "%s", r.out);
}

Test(cli, usage_error_escapes_control_bytes) {
  result_t r;
  run(&r, (const char *[]){"policy", "\x1b[2Jwipe", NULL});
  cr_assert_eq(r.status, 2);
  cr_assert_null(strchr(r.err, '\x1b'), "%s", r.err);
  cr_assert_not_null(strstr(r.err, "unknown subcommand '\\x1b[2Jwipe'"), "%s", r.err);
}
