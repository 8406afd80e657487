/* Tests for `condukt-egress netfilter-setup` through the built binary
 * ($CONDUKT_EGRESS_BIN, set by `make c-test`).
 *
 * Three tiers:
 *   - nf_cmd: the command line, --dry-run and the error messages; nothing
 *     here can change the machine's rules (every case exits before running
 *     iptables, or runs a fake one);
 *   - nf_fake: the exact sequence of iptables programs and their input,
 *     against a fake iptables (a shell script that keeps the jumps in
 *     files), so idempotency and --remove are tested without root;
 *   - nf_netns: as root, the real programs in fresh network namespaces,
 *     and behaviour.sh for what the rules do to traffic. Without root (or
 *     without `ip`) these are skipped with the reason printed, and with
 *     CONDUKT_REQUIRE_ALL_TIERS=1 the skip is a failure (DESIGN §9). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netfilter/rules.h"
#include "support/run.h"

/* No test here sets Criterion's .timeout: with --jobs 2, Criterion 2.4.1's
 * runner leaks 48 bytes when two tests with timeouts overlap, and
 * LeakSanitizer's report then fails the run. Each test bounds itself
 * instead (the exec timeout, `timeout` around behaviour.sh). */

#ifndef CE_SOURCE_ROOT
#define CE_SOURCE_ROOT "."
#endif

/* Captured output: the dry run of both families is under 6 KiB, an
 * iptables-save of a namespace under 4 KiB. */
#define OUT_MAX 32768

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/ce_test_nf_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void teardown(void) { nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

static void in_dir(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
}

static const char *binary(void) {
  const char *bin = getenv("CONDUKT_EGRESS_BIN");
  cr_assert_not_null(bin, "CONDUKT_EGRESS_BIN is not set; run the tests with `make c-test`");
  cr_assert_eq(access(bin, X_OK), 0, "%s is not an executable", bin);
  return bin;
}

static bool kernel_has_ipv6(void) { return access("/proc/net/if_inet6", F_OK) == 0; }

static void write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  size_t n = strlen(text);
  cr_assert_eq(write(fd, text, n), (ssize_t)n);
  cr_assert_eq(close(fd), 0);
}

static void slurp(const char *path, char *out) {
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return;
  size_t n = fread(out, 1, OUT_MAX - 1, f);
  out[n] = '\0';
  fclose(f);
}

typedef struct {
  int status;
  char out[OUT_MAX];
  char err[OUT_MAX];
} result_t;

/* Every variable the command reads, so the caller's environment cannot
 * leak into a test. */
static const char *const OPTION_VARS[] = {
    "CONDUKT_EGRESS_PROXY_PORT", "CONDUKT_EGRESS_MARK",     "CONDUKT_EGRESS_PORTS",
    "CONDUKT_EGRESS_DNS",        "CONDUKT_EGRESS_RESOLV_CONF", "CONDUKT_EGRESS_IPV6",
    "CONDUKT_EGRESS_IPTABLES",   "CONDUKT_EGRESS_IP6TABLES", NULL};

/* Runs argv (argv[0] is looked up in PATH when it has no '/') with the
 * extra "NAME=VALUE" settings in env (NULL-terminated, may be NULL), and
 * captures its exit status, stdout and stderr. */
static void run_argv(result_t *r, const char *const *argv, const char *const *env) {
  char out_path[128], err_path[128];
  in_dir(out_path, sizeof(out_path), "stdout");
  in_dir(err_path, sizeof(err_path), "stderr");
  r->status = ce_test_run(argv[0], (char *const *)argv, out_path, err_path, OPTION_VARS, env);
  slurp(out_path, r->out);
  slurp(err_path, r->err);
}

/* Runs `condukt-egress netfilter-setup ARGS...` (args NULL-terminated). */
static void run(result_t *r, const char *const *args, const char *const *env) {
  const char *argv[40];
  size_t n = 0;
  argv[n++] = binary();
  argv[n++] = "netfilter-setup";
  for (size_t i = 0; args[i] != NULL && n < 39; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  run_argv(r, argv, env);
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
    n++;
  return n;
}

static const char *resolv_conf(void) {
  static char path[128];
  in_dir(path, sizeof(path), "resolv.conf");
  write_file(path,
             "# test\nsearch example.org\nnameserver 192.0.2.53\n"
             "nameserver 2001:db8::53\noptions ndots:5\n",
             0644);
  return path;
}

TestSuite(nf_cmd, .init = setup, .fini = teardown);

/* Criterion does not run a suite's fini after cr_skip_test. */
static void skip_without_fini(const char *why) {
  teardown();
  cr_skip_test("%s", why);
}

/* What --dry-run prints for one family, built from the same generators
 * the command uses, so the test pins the framing around them. */
static void expected_dry_run(char *buf, size_t cap, const ce_nf_config_t *cfg,
                             ce_nf_family_t fam) {
  static char rules[CE_NF_TEXT_MAX], jumps[CE_NF_TEXT_MAX];
  size_t n;
  cr_assert_eq(ce_nf_rules_text(cfg, fam, rules, sizeof(rules), &n), 0);
  cr_assert_eq(ce_nf_jumps_text(3, jumps, sizeof(jumps), &n), 0);
  const char *label = fam == CE_NF_IPV4 ? "IPv4" : "IPv6";
  const char *prog = fam == CE_NF_IPV4 ? "iptables" : "ip6tables";
  size_t len = strlen(buf);
  snprintf(buf + len, cap - len,
           "# %s, step 1: %s-restore -w 5 --noflush\n%s"
           "# %s, step 2: %s-restore -w 5 --noflush, each jump\n"
           "# only when `%s -t TABLE -C OUTPUT -j CHAIN` does not find it\n%s",
           label, prog, rules, label, prog, prog, jumps);
}

Test(nf_cmd, dry_run_prints_the_exact_restore_input) {
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("192.0.2.53,2001:db8::53", &cfg, &err), 0);
  static char want[OUT_MAX];
  want[0] = '\0';
  expected_dry_run(want, sizeof(want), &cfg, CE_NF_IPV4);

  static result_t r;
  run(&r, (const char *[]){"--dry-run", "--ipv6", "off", "--resolv-conf", resolv_conf(), NULL},
      NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, want);
  if (kernel_has_ipv6())
    cr_assert_not_null(strstr(r.err, "warning: --ipv6 off: IPv6 egress from this network "
                                     "namespace is NOT restricted"),
                       "%s", r.err);

  if (!kernel_has_ipv6())
    return;
  expected_dry_run(want, sizeof(want), &cfg, CE_NF_IPV6);
  run(&r, (const char *[]){"--dry-run", "--resolv-conf", resolv_conf(), NULL}, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, want);
  cr_assert_str_empty(r.err);
  cr_assert_not_null(strstr(r.out, "-A CONDUKT_FILTER -d 2001:db8::53/128 -p udp --dport 53"));
}

Test(nf_cmd, options_from_the_environment_and_the_flag_wins) {
  static result_t r;
  const char *env[] = {"CONDUKT_EGRESS_PROXY_PORT=8443", "CONDUKT_EGRESS_MARK=0x10",
                       "CONDUKT_EGRESS_PORTS=80", "CONDUKT_EGRESS_DNS=any",
                       "CONDUKT_EGRESS_IPV6=off", NULL};
  run(&r, (const char *[]){"--dry-run", NULL}, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "--dports 80 -j REDIRECT --to-ports 8443\n"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "--mark 0x10/0xffffffff"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "-A CONDUKT_FILTER -p udp --dport 53 -j ACCEPT\n"), "%s", r.out);
  cr_assert_not_null(strstr(r.err, "warning: CONDUKT_EGRESS_DNS any: UDP and TCP 53 are open"), "%s", r.err);
  cr_assert_null(strstr(r.out, "IPv6"), "%s", r.out);
  if (kernel_has_ipv6())
    cr_assert_not_null(strstr(r.err, "CONDUKT_EGRESS_IPV6 off: IPv6 egress"), "%s", r.err);

  run(&r, (const char *[]){"--dry-run", "--proxy-port", "9443", "--mark=1337", NULL}, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "--to-ports 9443\n"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "--mark 0x539/0xffffffff"), "%s", r.out);

  /* The sidecar's uid and the DNS port, by variable and by flag. */
  const char *env2[] = {"CONDUKT_EGRESS_SIDECAR_UID=4242", "CONDUKT_EGRESS_DNS_PORT=5353",
                        "CONDUKT_EGRESS_DNS=none", "CONDUKT_EGRESS_IPV6=off", NULL};
  run(&r, (const char *[]){"--dry-run", NULL}, env2);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "-m owner --uid-owner 4242 -j RETURN\n"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "--dport 53 -j REDIRECT --to-ports 5353\n"), "%s", r.out);
  run(&r, (const char *[]){"--dry-run", "--sidecar-uid", "7", "--dns-port=15054", NULL}, env2);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "-m owner --uid-owner 7 -j RETURN\n"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "--dport 53 -j REDIRECT --to-ports 15054\n"), "%s", r.out);

  /* A resolv.conf named by the variable. */
  char rc[160];
  snprintf(rc, sizeof(rc), "CONDUKT_EGRESS_RESOLV_CONF=%s", resolv_conf());
  run(&r, (const char *[]){"--dry-run", "--ipv6", "off", NULL}, (const char *[]){rc, NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.out, "-d 192.0.2.53/32 -p tcp --dport 53"), "%s", r.out);
}

Test(nf_cmd, dry_run_remove) {
  static result_t r;
  run(&r, (const char *[]){"--dry-run", "--remove", "--ipv6", "off", NULL}, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out,
                   "# IPv4, step 1: iptables-restore -w 5 --noflush\n"
                   "*nat\n:CONDUKT_NAT - [0:0]\nCOMMIT\n"
                   "*filter\n:CONDUKT_FILTER - [0:0]\nCOMMIT\n"
                   "# IPv4, step 2: `iptables -t TABLE -D OUTPUT -j CHAIN` while\n"
                   "# `iptables -t TABLE -C OUTPUT -j CHAIN` finds the jump\n"
                   "# IPv4, step 3: iptables-restore -w 5 --noflush\n"
                   "*nat\n:CONDUKT_NAT - [0:0]\n-X CONDUKT_NAT\nCOMMIT\n"
                   "*filter\n:CONDUKT_FILTER - [0:0]\n-X CONDUKT_FILTER\nCOMMIT\n");
}

Test(nf_cmd, resolv_conf_notes_and_errors) {
  static result_t r;
  char path[128];
  in_dir(path, sizeof(path), "resolv.conf");
  write_file(path, "nameserver dns.example\nsearch x\n", 0644);
  run(&r, (const char *[]){"--dry-run", "--ipv6", "off", "--resolv-conf", path, NULL}, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_not_null(strstr(r.err, ":1: nameserver 'dns.example' gets no rule: not an IPv4 "
                                   "or IPv6 address\n"),
                     "%s", r.err);
  cr_assert_not_null(strstr(r.err, "names no usable nameserver, so the sidecar may query no "
                                   "resolver"),
                     "%s", r.err);
  /* No resolver for the sidecar; the workspace's DNS is still redirected. */
  cr_assert_null(strstr(r.out, "--dport 53 -m owner --uid-owner 1337 -j ACCEPT"), "%s", r.out);
  cr_assert_not_null(strstr(r.out, "-p udp --dport 53 -j REDIRECT --to-ports 15053"), "%s", r.out);

  in_dir(path, sizeof(path), "missing.conf");
  run(&r, (const char *[]){"--dry-run", "--resolv-conf", path, NULL}, NULL);
  cr_assert_eq(r.status, 1);
  cr_assert_str_empty(r.out);
  char want[256];
  snprintf(want, sizeof(want),
           "condukt-egress: netfilter-setup: cannot read %s: No such file or directory "
           "(give --dns LIST, --dns any or --dns none)\n",
           path);
  cr_assert_not_null(strstr(r.err, want), "%s", r.err);
}

static void expect_usage(const char *const *args, const char *const *env, const char *needle) {
  static result_t r;
  run(&r, args, env);
  cr_expect_eq(r.status, 2, "%s: %s", needle, r.err);
  cr_expect_str_empty(r.out, "%s", needle);
  cr_expect_not_null(strstr(r.err, needle), "stderr should contain \"%s\": %s", needle, r.err);
  cr_expect_not_null(strstr(r.err, "usage: condukt-egress netfilter-setup [options]"), "%s",
                     r.err);
}

Test(nf_cmd, usage_errors_exit_2_and_name_the_word) {
  /* None of these gets as far as running iptables, so they are safe on
   * any machine. */
  expect_usage((const char *[]){"--proxy-port", "0", NULL}, NULL,
               "netfilter-setup: --proxy-port: bad port '0': not a port number from 1 to 65535");
  expect_usage((const char *[]){"--proxy-port", "65536", NULL}, NULL, "bad port '65536'");
  expect_usage((const char *[]){"--proxy-port=abc", NULL}, NULL, "bad port 'abc'");
  expect_usage((const char *[]){"--ports", "80,,443", NULL}, NULL, "--ports: bad port ''");
  expect_usage((const char *[]){"--ports", "80,80", NULL}, NULL,
               "--ports: bad port '80': listed twice");
  expect_usage((const char *[]){"--mark", "junk", NULL}, NULL, "--mark: bad mark 'junk'");
  expect_usage((const char *[]){"--mark", "0", NULL}, NULL,
               "--mark: bad mark '0': 0 is the mark of every unmarked packet");
  expect_usage((const char *[]){"--dns", "junk", NULL}, NULL,
               "--dns: bad resolver address 'junk': not an IPv4 or IPv6 address");
  expect_usage((const char *[]){"--dns", "10.0.0.1,fe80::1%eth+", NULL}, NULL,
               "bad resolver address 'fe80::1%eth+'");
  expect_usage((const char *[]){"--sidecar-uid", "0", NULL}, NULL,
               "--sidecar-uid: bad uid '0': 0 is root, and the workspace may be root");
  expect_usage((const char *[]){"--sidecar-uid", "nobody", NULL}, NULL, "--sidecar-uid: bad uid 'nobody'");
  expect_usage((const char *[]){"--dry-run", NULL},
               (const char *[]){"CONDUKT_EGRESS_SIDECAR_UID=0", NULL},
               "CONDUKT_EGRESS_SIDECAR_UID: bad uid '0'");
  expect_usage((const char *[]){"--dns-port", "0", NULL}, NULL, "--dns-port: bad port '0'");
  expect_usage((const char *[]){"--dns-port", "15001", NULL}, NULL,
               "the DNS port and the proxy port are both 15001");
  expect_usage((const char *[]){"--ipv6", "maybe", NULL}, NULL,
               "--ipv6: bad IPv6 mode 'maybe': not auto, on or off");
  expect_usage((const char *[]){"--frobnicate", NULL}, NULL, "unknown option '--frobnicate'");
  expect_usage((const char *[]){"--dry-run", "extra", NULL}, NULL, "unexpected argument 'extra'");
  expect_usage((const char *[]){"--mark", NULL}, NULL, "missing value after '--mark'");
  expect_usage((const char *[]){"--dry-run", NULL},
               (const char *[]){"CONDUKT_EGRESS_MARK=junk", NULL},
               "netfilter-setup: CONDUKT_EGRESS_MARK: bad mark 'junk'");
  expect_usage((const char *[]){"--dry-run", NULL},
               (const char *[]){"CONDUKT_EGRESS_PORTS=", NULL},
               "netfilter-setup: CONDUKT_EGRESS_PORTS: empty value");
  expect_usage((const char *[]){"--proxy-port", "\x1b[2J", NULL}, NULL, "bad port '\\x1b[2J'");
}

Test(nf_cmd, help_on_stdout) {
  static result_t r;
  run(&r, (const char *[]){"--help", NULL}, NULL);
  cr_assert_eq(r.status, 0);
  cr_assert_not_null(strstr(r.out, "usage: condukt-egress netfilter-setup [options]"));
  cr_assert_not_null(strstr(r.out, "--proxy-port N"));
  cr_assert_str_empty(r.err);
}

Test(nf_cmd, missing_iptables_is_named) {
  static result_t r;
  run(&r, (const char *[]){"--dns", "none", "--ipv6", "off", "--iptables", "/nonexistent/iptables",
                           NULL},
      NULL);
  cr_assert_eq(r.status, 1);
  cr_assert_str_empty(r.out);
  cr_assert_not_null(strstr(r.err, "condukt-egress: netfilter-setup: cannot run /nonexistent/iptables "
                                   "(from --iptables /nonexistent/iptables): No such file or "
                                   "directory\n"),
                     "%s", r.err);

  run(&r, (const char *[]){"--dns", "none", "--ipv6", "off", NULL},
      (const char *[]){"CONDUKT_EGRESS_IPTABLES=/nonexistent/xt", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_not_null(strstr(r.err, "(from CONDUKT_EGRESS_IPTABLES /nonexistent/xt)"), "%s", r.err);

  /* A bare name is searched in PATH and the sbin directories. */
  run(&r, (const char *[]){"--dns", "none", "--ipv6", "off", "--iptables", "iptables-nope", NULL},
      (const char *[]){"PATH=/nonexistent:relative/dir:/bin", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_not_null(strstr(r.err,
                            "condukt-egress: netfilter-setup: cannot find iptables-nope and "
                            "iptables-nope-restore in one directory; searched "
                            "/nonexistent:/bin:/usr/local/sbin:/usr/sbin:/sbin (install "
                            "iptables, or give --iptables PATH)\n"),
                     "%s", r.err);
}

/* A stand-in for iptables, ip6tables and their -restore programs. It logs
 * each call's arguments to $FAKE_STATE/log and each restore input to
 * $FAKE_STATE/in.N, and keeps one line per installed jump in
 * $FAKE_STATE/PROG-TABLE, so -C, -D and "-I OUTPUT 1 -j" behave like the
 * real thing. FAKE_FAIL=PROG makes that program print $FAKE_MSG and exit
 * with $FAKE_RC. */
static const char FAKE[] =
    "#!/bin/sh\n"
    "me=${0##*/}\n"
    "s=$FAKE_STATE\n"
    "echo \"$me $*\" >> \"$s/log\"\n"
    "if [ \"${FAKE_FAIL:-}\" = \"$me\" ]; then echo \"$FAKE_MSG\" >&2; exit \"$FAKE_RC\"; fi\n"
    "case $me in\n"
    "*-restore)\n"
    "  n=$(wc -l < \"$s/log\")\n"
    "  cat > \"$s/in.$n\"\n"
    "  fam=${me%-restore}; table=\n"
    "  while read -r line; do\n"
    "    case $line in\n"
    "    \\**) table=${line#?} ;;\n"
    "    '-I OUTPUT 1 -j '*) echo jump >> \"$s/$fam-$table\" ;;\n"
    "    esac\n"
    "  done < \"$s/in.$n\" ;;\n"
    "*)\n"
    "  f=\"$s/$me-$4\"\n"
    "  case $5 in\n"
    "  -C) [ -s \"$f\" ] || exit 1 ;;\n"
    "  -D) [ -s \"$f\" ] || exit 1; sed -i 1d \"$f\" ;;\n"
    "  *) exit 2 ;;\n"
    "  esac ;;\n"
    "esac\n"
    "exit 0\n";

TestSuite(nf_fake, .init = setup, .fini = teardown);

static char fake_v4[160], fake_v6[160], fake_env[160];

static void fake_setup(void) {
  char path[160];
  static const char *const names[] = {"iptables", "iptables-restore", "ip6tables",
                                      "ip6tables-restore"};
  for (size_t i = 0; i < 4; i++) {
    in_dir(path, sizeof(path), names[i]);
    write_file(path, FAKE, 0755);
  }
  in_dir(fake_v4, sizeof(fake_v4), "iptables");
  in_dir(fake_v6, sizeof(fake_v6), "ip6tables");
  snprintf(fake_env, sizeof(fake_env), "FAKE_STATE=%s", dir);
}

static void fake_file(const char *name, char *out) {
  char path[160];
  in_dir(path, sizeof(path), name);
  slurp(path, out);
}

/* The log with the temporary directory's path taken out. */
static const char *fake_log(void) {
  static char log[OUT_MAX];
  fake_file("log", log);
  return log;
}

static void truncate_log(void) {
  char path[160];
  in_dir(path, sizeof(path), "log");
  write_file(path, "", 0644);
}

Test(nf_fake, install_then_rerun_adds_each_jump_once) {
  fake_setup();
  static result_t r;
  const char *args[] = {"--dns", "192.0.2.53", "--ipv6", "off", "--iptables", fake_v4, NULL};
  const char *env[] = {fake_env, NULL};
  run(&r, args, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "condukt-egress: netfilter-setup: installed the IPv4 rules: TCP "
                          "80,443 to local port 15001, mark 0x539 from uid 1337 exempt, DNS to local "
                          "port 15053, the sidecar's to 192.0.2.53\n");
  cr_assert_str_eq(fake_log(), "iptables-restore -w 5 --noflush\n"
                               "iptables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "iptables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n"
                               "iptables-restore -w 5 --noflush\n");
  static char in[OUT_MAX], want[CE_NF_TEXT_MAX];
  ce_nf_config_t cfg;
  ce_nf_error_t err;
  size_t n;
  ce_nf_config_init(&cfg);
  cr_assert_eq(ce_nf_parse_dns("192.0.2.53", &cfg, &err), 0);
  cr_assert_eq(ce_nf_rules_text(&cfg, CE_NF_IPV4, want, sizeof(want), &n), 0);
  fake_file("in.1", in);
  cr_assert_str_eq(in, want);
  fake_file("in.4", in);
  cr_assert_str_eq(in, "*nat\n-I OUTPUT 1 -j CONDUKT_NAT\nCOMMIT\n"
                       "*filter\n-I OUTPUT 1 -j CONDUKT_FILTER\nCOMMIT\n");

  /* The rerun rewrites the chains but finds both jumps. */
  truncate_log();
  run(&r, args, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(fake_log(), "iptables-restore -w 5 --noflush\n"
                               "iptables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "iptables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n");
  fake_file("iptables-nat", in);
  cr_assert_str_eq(in, "jump\n");
  fake_file("iptables-filter", in);
  cr_assert_str_eq(in, "jump\n");

  /* Only a missing jump is added back. */
  char path[160];
  in_dir(path, sizeof(path), "iptables-filter");
  unlink(path);
  truncate_log();
  run(&r, args, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  fake_file("in.4", in);
  cr_assert_str_eq(in, "*filter\n-I OUTPUT 1 -j CONDUKT_FILTER\nCOMMIT\n");
}

Test(nf_fake, both_families_and_remove) {
  if (!kernel_has_ipv6())
    skip_without_fini("this kernel has no IPv6, so --ipv6 on is refused");
  fake_setup();
  static result_t r;
  const char *env[] = {fake_env, NULL};
  run(&r, (const char *[]){"--dns", "none", "--ipv6", "on", "--iptables", fake_v4, "--ip6tables",
                           fake_v6, NULL},
      env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(count(fake_log(), "ip6tables-restore -w 5 --noflush\n"), 2, "%s", fake_log());
  cr_assert_eq(count(fake_log(), "ip6tables -w 5 -t"), 2, "%s", fake_log());

  /* Someone copied our jump: --remove deletes both copies. */
  char path[160];
  in_dir(path, sizeof(path), "ip6tables-nat");
  write_file(path, "jump\njump\n", 0644);
  truncate_log();
  const char *rm[] = {"--remove", "--ipv6", "on", "--iptables", fake_v4, "--ip6tables", fake_v6,
                      NULL};
  run(&r, rm, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "condukt-egress: netfilter-setup: removed the IPv4 and IPv6 rules\n");
  cr_assert_str_eq(fake_log(), "iptables-restore -w 5 --noflush\n"
                               "iptables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "iptables -w 5 -t nat -D OUTPUT -j CONDUKT_NAT\n"
                               "iptables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "iptables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n"
                               "iptables -w 5 -t filter -D OUTPUT -j CONDUKT_FILTER\n"
                               "iptables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n"
                               "iptables-restore -w 5 --noflush\n"
                               "ip6tables-restore -w 5 --noflush\n"
                               "ip6tables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "ip6tables -w 5 -t nat -D OUTPUT -j CONDUKT_NAT\n"
                               "ip6tables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "ip6tables -w 5 -t nat -D OUTPUT -j CONDUKT_NAT\n"
                               "ip6tables -w 5 -t nat -C OUTPUT -j CONDUKT_NAT\n"
                               "ip6tables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n"
                               "ip6tables -w 5 -t filter -D OUTPUT -j CONDUKT_FILTER\n"
                               "ip6tables -w 5 -t filter -C OUTPUT -j CONDUKT_FILTER\n"
                               "ip6tables-restore -w 5 --noflush\n");
  /* Again: nothing left to delete, still exit 0. */
  truncate_log();
  run(&r, rm, env);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_eq(count(fake_log(), "-D OUTPUT"), 0, "%s", fake_log());
}

Test(nf_fake, ip6tables_failure_is_exit_1) {
  if (!kernel_has_ipv6())
    skip_without_fini("this kernel has no IPv6");
  fake_setup();
  static result_t r;
  run(&r, (const char *[]){"--dns", "none", "--iptables", fake_v4, "--ip6tables", fake_v6, NULL},
      (const char *[]){fake_env, "FAKE_FAIL=ip6tables-restore",
                       "FAKE_MSG=ip6tables-restore: line 3 failed", "FAKE_RC=1", NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_str_empty(r.out);
  /* Without CAP_NET_ADMIN (not root) the line starts by blaming that
   * instead; the rest is the same. */
  char want[512];
  snprintf(want, sizeof(want),
           "%s-restore exited with status 1 while installing the IPv6 rules:\n"
           "  ip6tables-restore: line 3 failed\n",
           fake_v6);
  cr_assert_not_null(strstr(r.err, want), "%s", r.err);
  if (geteuid() == 0)
    cr_assert_not_null(strstr(r.err, "condukt-egress: netfilter-setup: /"), "%s", r.err);
}

Test(nf_fake, a_missing_ip6tables_fails_before_anything_changes) {
  if (!kernel_has_ipv6())
    skip_without_fini("this kernel has no IPv6");
  fake_setup();
  static result_t r;
  run(&r, (const char *[]){"--dns", "none", "--iptables", fake_v4, "--ip6tables",
                           "/nonexistent/ip6tables", NULL},
      (const char *[]){fake_env, NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_not_null(strstr(r.err, "cannot run /nonexistent/ip6tables (from --ip6tables"), "%s",
                     r.err);
  cr_assert_str_empty(fake_log(), "iptables ran although ip6tables is missing");
}

Test(nf_fake, no_cap_net_admin_is_explained) {
  fake_setup();
  static result_t r;
  const char *msg = "FAKE_MSG=iptables-restore v1.8.9 (nf_tables): Could not fetch rule set "
                    "generation id: Permission denied (you must be root)";
  run(&r, (const char *[]){"--dns", "none", "--ipv6", "off", "--iptables", fake_v4, NULL},
      (const char *[]){fake_env, "FAKE_FAIL=iptables-restore", msg, "FAKE_RC=4", NULL});
  cr_assert_eq(r.status, 1);
  char want[512];
  snprintf(want, sizeof(want),
           "condukt-egress: netfilter-setup needs CAP_NET_ADMIN in the pod's network namespace: "
           "%s-restore exited with status 4 while installing the IPv4 rules:\n  %s\n",
           fake_v4, msg + strlen("FAKE_MSG="));
  cr_assert_not_null(strstr(r.err, want), "%s", r.err);
}

Test(nf_fake, an_unexpected_check_answer_is_a_failure) {
  fake_setup();
  static result_t r;
  run(&r, (const char *[]){"--dns", "none", "--ipv6", "off", "--iptables", fake_v4, NULL},
      (const char *[]){fake_env, "FAKE_FAIL=iptables", "FAKE_MSG=\x1b[31mweird", "FAKE_RC=2",
                       NULL});
  cr_assert_eq(r.status, 1);
  cr_assert_not_null(strstr(r.err, "iptables exited with status 2 while checking the IPv4 jumps:\n"
                                   "  \\x1b[31mweird\n"),
                     "%s", r.err);
  cr_assert_eq(count(fake_log(), "restore"), 1, "no jump is added after a failed check: %s",
               fake_log());
}

/* ---- nf_netns: real iptables in fresh network namespaces (root) ---- */

#define NETNS_MAX 4
static char netns[NETNS_MAX][48];
static int n_netns;

static void netns_teardown(void) {
  for (int i = 0; i < n_netns; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      execlp("ip", "ip", "netns", "delete", netns[i], (char *)NULL);
      _exit(127);
    }
    if (pid > 0)
      waitpid(pid, NULL, 0);
  }
  n_netns = 0;
  teardown();
}

static void tier_unavailable(const char *why) {
  const char *req = getenv("CONDUKT_REQUIRE_ALL_TIERS");
  if (req != NULL && strcmp(req, "1") == 0)
    cr_assert_fail("netns tier required (CONDUKT_REQUIRE_ALL_TIERS=1) but it cannot run: %s", why);
  /* Criterion does not run a suite's fini after cr_skip_test, so clean
   * up here. */
  netns_teardown();
  /* Printed as well, so the reason shows whatever Criterion's verbosity. */
  fprintf(stderr, "nf_netns: skipped: %s\n", why);
  cr_skip_test("netns tier skipped: %s", why);
}

static bool on_path(const char *name) {
  const char *path = getenv("PATH");
  char buf[512];
  for (const char *p = path; p != NULL && *p != '\0';) {
    const char *colon = strchr(p, ':');
    size_t n = colon != NULL ? (size_t)(colon - p) : strlen(p);
    snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, name);
    if (access(buf, X_OK) == 0)
      return true;
    if (colon == NULL)
      break;
    p = colon + 1;
  }
  return false;
}

static void need_netns_tier(void) {
  if (geteuid() != 0)
    tier_unavailable("not running as root (network namespaces and iptables need it)");
  if (!on_path("ip"))
    tier_unavailable("`ip` (iproute2) is not in PATH");
  if (!on_path("iptables-save") || !on_path("iptables-restore"))
    tier_unavailable("iptables is not installed");
}

/* Creates a fresh namespace, remembered so the suite's fini deletes it
 * whether the test passed or failed. */
static const char *new_netns(void) {
  cr_assert_lt(n_netns, NETNS_MAX);
  char *name = netns[n_netns];
  snprintf(name, sizeof(netns[0]), "ce-nf-%d-%d", (int)getpid(), n_netns);
  static result_t r;
  run_argv(&r, (const char *[]){"ip", "netns", "add", name, NULL}, NULL);
  if (r.status != 0)
    tier_unavailable(r.err);
  n_netns++;
  return name;
}

TestSuite(nf_netns, .init = setup, .fini = netns_teardown);

static void in_netns(result_t *r, const char *ns, const char *const *cmd) {
  const char *argv[40];
  size_t n = 0;
  argv[n++] = "ip";
  argv[n++] = "netns";
  argv[n++] = "exec";
  argv[n++] = ns;
  for (size_t i = 0; cmd[i] != NULL && n < 39; i++)
    argv[n++] = cmd[i];
  argv[n] = NULL;
  run_argv(r, argv, NULL);
}

static void setup_in(result_t *r, const char *ns, const char *const *args) {
  const char *argv[40];
  size_t n = 0;
  argv[n++] = binary();
  argv[n++] = "netfilter-setup";
  for (size_t i = 0; args[i] != NULL && n < 39; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  in_netns(r, ns, argv);
}

/* Asserts what `iptables-save` (prog) shows in ns after our setup. */
static void expect_installed(const char *ns, const char *prog, size_t filter_rules) {
  static result_t r;
  in_netns(&r, ns, (const char *[]){prog, NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  const char *s = r.out;
  cr_assert_eq(count(s, "\n-A OUTPUT -j CONDUKT_NAT\n"), 1, "%s", s);
  cr_assert_eq(count(s, "\n-A OUTPUT -j CONDUKT_FILTER\n"), 1, "%s", s);
  cr_assert_eq(count(s, "\n-A CONDUKT_NAT "), 8, "%s", s);
  /* The proxy's connections get its mark as their connection mark. */
  cr_assert_not_null(strstr(s, "-A CONDUKT_NAT -m mark --mark 0x539 -m owner --uid-owner 1337 -j CONNMARK "
                               "--set-xmark 0x539/0xffffffff\n-A CONDUKT_NAT -m mark --mark 0x539 -m owner "
                               "--uid-owner 1337 -j RETURN\n"),
                     "%s", s);
  cr_assert_eq(count(s, "\n-A CONDUKT_FILTER "), filter_rules, "%s", s);
  cr_assert_eq(count(s, "\n:CONDUKT_NAT - "), 1, "%s", s);
  cr_assert_eq(count(s, "\n:CONDUKT_FILTER - "), 1, "%s", s);
  cr_assert_not_null(
      strstr(s, "-A CONDUKT_NAT -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 15001\n"),
      "%s", s);
  /* Our jump comes before the rule that was there first. */
  const char *ours = strstr(s, "\n-A OUTPUT -j CONDUKT_FILTER\n");
  const char *theirs = strstr(s, "\n-A OUTPUT -d ");
  cr_assert_not_null(theirs, "the existing rule is kept: %s", s);
  cr_assert_lt(ours, theirs, "%s", s);
}

static void expect_removed(const char *ns, const char *prog) {
  static result_t r;
  in_netns(&r, ns, (const char *[]){prog, NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_null(strstr(r.out, "CONDUKT"), "%s", r.out);
  cr_assert_eq(count(r.out, "\n-A OUTPUT -d "), 1, "the existing rule is kept: %s", r.out);
}

Test(nf_netns, install_twice_then_remove_twice) {
  need_netns_tier();
  const char *ns = new_netns();
  bool v6 = kernel_has_ipv6();
  static result_t r;
  /* Someone else's rules, which --noflush must leave alone. */
  in_netns(&r, ns, (const char *[]){"iptables", "-A", "OUTPUT", "-d", "192.0.2.1", "-j", "ACCEPT",
                                    NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  if (v6) {
    in_netns(&r, ns, (const char *[]){"ip6tables", "-A", "OUTPUT", "-d", "2001:db8::1", "-j",
                                      "ACCEPT", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
  }
  for (int i = 0; i < 2; i++) {
    setup_in(&r, ns, (const char *[]){"--dns", "192.0.2.53,2001:db8::53", NULL});
    cr_assert_eq(r.status, 0, "run %d: %s", i + 1, r.err);
    cr_assert_str_empty(r.err, "run %d", i + 1);
  }
  /* lo, three DNAT (proxy, DNS udp + tcp), the exemption, the closed
   * sockets, conntrack, the sidecar's DNS udp + tcp, two rejects; IPv6
   * adds three neighbour-discovery rules, and no MLD rule. */
  expect_installed(ns, "iptables-save", 11);
  if (v6)
    expect_installed(ns, "ip6tables-save", 14);

  for (int i = 0; i < 2; i++) {
    setup_in(&r, ns, (const char *[]){"--remove", NULL});
    cr_assert_eq(r.status, 0, "remove %d: %s", i + 1, r.err);
  }
  expect_removed(ns, "iptables-save");
  if (v6)
    expect_removed(ns, "ip6tables-save");
}

Test(nf_netns, remove_on_a_clean_namespace) {
  need_netns_tier();
  const char *ns = new_netns();
  static result_t r;
  setup_in(&r, ns, (const char *[]){"--remove", NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  in_netns(&r, ns, (const char *[]){"iptables-save", NULL});
  cr_assert_null(strstr(r.out, "CONDUKT"), "%s", r.out);
}

Test(nf_netns, without_cap_net_admin) {
  need_netns_tier();
  if (!on_path("setpriv"))
    tier_unavailable("setpriv (util-linux) is not in PATH");
  const char *ns = new_netns();
  static result_t r;
  /* Root, but with CAP_NET_ADMIN gone from the bounding set: what an
   * init container without the capability sees. */
  in_netns(&r, ns, (const char *[]){"setpriv", "--bounding-set", "-net_admin", binary(),
                                    "netfilter-setup", "--dns", "none", NULL});
  cr_assert_eq(r.status, 1, "%s", r.err);
  cr_assert_not_null(strstr(r.err, "condukt-egress: netfilter-setup needs CAP_NET_ADMIN in the "
                                   "pod's network namespace: "),
                     "%s", r.err);
  cr_assert_not_null(strstr(r.err, "Permission denied"), "iptables' own words: %s", r.err);
}

Test(nf_netns, legacy_backend_capabilities) {
  need_netns_tier();
  if (!on_path("setpriv") || !on_path("iptables-legacy"))
    tier_unavailable("setpriv or iptables-legacy is not in PATH");
  const char *ns = new_netns();
  static result_t r;
  /* The legacy backend says only "unable to initialize table" when a
   * capability is missing; the command names the capability anyway. */
  in_netns(&r, ns, (const char *[]){"setpriv", "--bounding-set", "-net_admin", binary(),
                                    "netfilter-setup", "--dns", "none", "--ipv6", "off",
                                    "--iptables", "iptables-legacy", NULL});
  cr_assert_eq(r.status, 1, "%s", r.err);
  cr_assert_not_null(strstr(r.err, "netfilter-setup needs CAP_NET_ADMIN in the pod's network "
                                   "namespace: "),
                     "%s", r.err);
  in_netns(&r, ns, (const char *[]){"setpriv", "--bounding-set", "-net_raw", binary(),
                                    "netfilter-setup", "--dns", "none", "--ipv6", "off",
                                    "--iptables", "iptables-legacy", NULL});
  cr_assert_eq(r.status, 1, "%s", r.err);
  cr_assert_not_null(strstr(r.err, "netfilter-setup needs CAP_NET_RAW as well with the legacy "
                                   "iptables backend: "),
                     "%s", r.err);
  /* With both, the same rules as with nf_tables, and a rerun is a no-op. */
  for (int i = 0; i < 2; i++) {
    setup_in(&r, ns, (const char *[]){"--dns", "192.0.2.53", "--ipv6", "off", "--iptables",
                                      "iptables-legacy", NULL});
    cr_assert_eq(r.status, 0, "%s", r.err);
  }
  in_netns(&r, ns, (const char *[]){"iptables-legacy-save", NULL});
  cr_assert_eq(count(r.out, "\n-A OUTPUT -j CONDUKT_"), 2, "%s", r.out);
  cr_assert_eq(count(r.out, "\n-A CONDUKT_FILTER "), 11, "%s", r.out);
  setup_in(&r, ns, (const char *[]){"--remove", "--ipv6", "off", "--iptables", "iptables-legacy",
                                    NULL});
  cr_assert_eq(r.status, 0, "%s", r.err);
  in_netns(&r, ns, (const char *[]){"iptables-legacy-save", NULL});
  cr_assert_null(strstr(r.out, "CONDUKT"), "%s", r.out);
}

Test(nf_netns, behaviour) {
  need_netns_tier();
  static result_t r;
  run_argv(&r,
           (const char *[]){"timeout", "-k", "5", "150", "sh",
                            CE_SOURCE_ROOT "/native_test/netfilter/behaviour.sh", binary(), NULL},
           NULL);
  if (r.status == 77) {
    const char *last = strstr(r.out, "skip: ");
    tier_unavailable(last != NULL ? last : r.out);
  }
  cr_assert_eq(r.status, 0, "behaviour.sh failed (exit %d):\n%s%s", r.status, r.out, r.err);
  cr_assert_null(strstr(r.out, "not ok"), "%s", r.out);
}
