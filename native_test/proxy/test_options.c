/* Tests for c_src/proxy/options.c: flags, environment variables, defaults
 * and the words usage errors name. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "proxy/options.h"

#define REQUIRED "--policy", "p.json", "--ca-cert", "ca.pem", "--ca-key", "ca.key", "--session-id", "s1", \
                 "--token-file", "tok"

static void clear_env(void) {
  static const char *const vars[] = {"CONDUKT_EGRESS_LISTEN", "CONDUKT_EGRESS_MARK", "CONDUKT_EGRESS_POLICY",
                                     "CONDUKT_EGRESS_ALLOW_PRIVATE", "CONDUKT_EGRESS_BODY_PREVIEW",
                                     "CONDUKT_EGRESS_VERBOSE", "CONDUKT_EGRESS_REDACT_HEADER",
                                     "CONDUKT_EGRESS_CA_CERT", "CONDUKT_EGRESS_CA_KEY",
                                     "CONDUKT_EGRESS_SESSION_ID", "CONDUKT_EGRESS_TOKEN_FILE"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
    unsetenv(vars[i]);
}

static int parse(ce_proxy_options_t *o, int argc, const char **argv) {
  return ce_proxy_options_parse(argc, (char **)argv, o);
}

Test(proxy_options, defaults, .init = clear_env) {
  const char *argv[] = {"proxy", REQUIRED};
  ce_proxy_options_t o;
  cr_assert_eq(parse(&o, 11, argv), CE_EXIT_OK);
  cr_expect_eq(o.listen_count, 2);
  cr_expect_str_eq(o.listen[0], "127.0.0.1:15001");
  cr_expect_str_eq(o.listen[1], "[::1]:15001");
  cr_expect_str_eq(o.control, "127.0.0.1:15002");
  cr_expect_eq(o.mark, 0x539u);
  cr_expect_eq(o.user, 0u);
  cr_expect_eq(o.max_connections, 1024u);
  cr_expect_eq(o.clienthello_ms, 10000u);
  cr_expect_eq(o.idle_ms, 300000u);
  cr_expect_eq(o.release_ms, 500u);
  cr_expect_eq(o.body_preview, 0u);
  cr_expect_null(o.trust_bundle_path);
  cr_expect(!o.verbose);
  ce_proxy_options_free(&o);
}

Test(proxy_options, idle_release_takes_zero_for_never, .init = clear_env) {
  const char *never[] = {"proxy", REQUIRED, "--idle-release-ms", "0"};
  ce_proxy_options_t o;
  cr_assert_eq(parse(&o, 13, never), CE_EXIT_OK);
  cr_expect_eq(o.release_ms, 0u);
  ce_proxy_options_free(&o);
  const char *some[] = {"proxy", REQUIRED, "--idle-release-ms=2500"};
  cr_assert_eq(parse(&o, 12, some), CE_EXIT_OK);
  cr_expect_eq(o.release_ms, 2500u);
  ce_proxy_options_free(&o);
  const char *bad[] = {"proxy", REQUIRED, "--idle-release-ms", "-1"};
  cr_expect_eq(parse(&o, 13, bad), CE_EXIT_USAGE);
}

Test(proxy_options, flags_and_equals_forms, .init = clear_env) {
  const char *argv[] = {"proxy",          REQUIRED,        "--listen",  "127.0.0.1:9",   "--listen=[::1]:9",
                        "--mark=0x10",    "--allow-private", "10.0.0.0/8", "--body-preview", "100",
                        "--redact-header", "X-Api-Key",    "--verbose", "--user", "1337"};
  ce_proxy_options_t o;
  cr_assert_eq(parse(&o, (int)(sizeof(argv) / sizeof(argv[0])), argv), CE_EXIT_OK);
  cr_expect_eq(o.listen_count, 2);
  cr_expect_str_eq(o.listen[1], "[::1]:9");
  cr_expect_eq(o.mark, 16u);
  cr_expect_eq(o.user, 1337u);
  cr_expect_eq(o.allow_private_count, 1);
  cr_expect_eq(o.allow_private[0].prefix, 8);
  cr_expect_eq(o.body_preview, 100u);
  cr_expect_eq(o.redact_count, 1);
  cr_expect(o.verbose);
  ce_proxy_options_free(&o);
}

Test(proxy_options, environment_fills_and_flags_win, .init = clear_env) {
  setenv("CONDUKT_EGRESS_MARK", "1337", 1);
  setenv("CONDUKT_EGRESS_ALLOW_PRIVATE", "10.0.0.0/8,fd00::/8,", 1);
  setenv("CONDUKT_EGRESS_POLICY", "from-env.json", 1);
  setenv("CONDUKT_EGRESS_CA_CERT", "c", 1);
  setenv("CONDUKT_EGRESS_CA_KEY", "k", 1);
  setenv("CONDUKT_EGRESS_SESSION_ID", "s", 1);
  setenv("CONDUKT_EGRESS_TOKEN_FILE", "t", 1);
  const char *argv[] = {"proxy", "--policy", "flag.json"};
  ce_proxy_options_t o;
  cr_assert_eq(parse(&o, 3, argv), CE_EXIT_OK);
  cr_expect_str_eq(o.policy_path, "flag.json");
  cr_expect_eq(o.mark, 1337u);
  cr_expect_eq(o.allow_private_count, 2, "an empty list item is skipped");
  ce_proxy_options_free(&o);
  clear_env();
}

static void redirect_stderr(void) {
  clear_env();
  cr_redirect_stderr();
}

Test(proxy_options, missing_required_is_a_usage_error, .init = redirect_stderr) {
  const char *argv[] = {"proxy", "--policy", "p.json"};
  ce_proxy_options_t o;
  cr_expect_eq(parse(&o, 3, argv), CE_EXIT_USAGE);
  ce_proxy_options_free(&o);
  fflush(stderr);
  cr_expect_stderr_eq_str("condukt-egress proxy: missing required option '--ca-cert'\n"
                          "run 'condukt-egress proxy --help' for the options\n");
}

Test(proxy_options, bad_values_name_the_word, .init = clear_env) {
  static const char *const cases[][2] = {
      {"--mark", "0"},          {"--mark", "junk"},          {"--body-preview", "65537"},
      {"--max-connections", "0"}, {"--allow-private", "10.0.0.0/40"}, {"--idle-timeout-ms", "-5"},
      {"--verbose=maybe", NULL}, {"--nope", NULL},           {"stray", NULL},
      {"--policy", ""},         {"--user", "0"},             {"--user", "root"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *argv[14] = {"proxy", REQUIRED};
    int argc = 11;
    argv[argc++] = cases[i][0];
    if (cases[i][1] != NULL)
      argv[argc++] = cases[i][1];
    ce_proxy_options_t o;
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    int rc = parse(&o, argc, argv);
    fclose(stderr);
    stderr = saved;
    cr_expect_eq(rc, CE_EXIT_USAGE, "%s %s", cases[i][0], cases[i][1] != NULL ? cases[i][1] : "");
    ce_proxy_options_free(&o);
  }
}

Test(proxy_options, missing_value_at_the_end, .init = redirect_stderr) {
  const char *argv[] = {"proxy", REQUIRED, "--mark"};
  ce_proxy_options_t o;
  cr_expect_eq(parse(&o, 12, argv), CE_EXIT_USAGE);
  ce_proxy_options_free(&o);
}
