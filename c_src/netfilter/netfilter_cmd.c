/*
 * `condukt-egress netfilter-setup`: the init container that makes every
 * TCP 80/443 connection of the pod go to the proxy and rejects every other
 * egress (docs/netfilter.md, DESIGN §4 "Interception").
 *
 *   condukt-egress netfilter-setup [options]           install or refresh
 *   condukt-egress netfilter-setup --remove [options]  uninstall
 *   condukt-egress netfilter-setup --dry-run [...]     print, touch nothing
 *
 * The rule text comes from rules.c; this file gathers the options, reads
 * resolv.conf, finds the iptables programs and runs them (exec.c). Per
 * family, installing is three steps, each safe to interrupt:
 *   1. iptables-restore --noflush with our two chains declared and filled:
 *      one transaction per table, so a rerun swaps the old rules for the
 *      new ones with no moment in between;
 *   2. `iptables -t TABLE -C OUTPUT -j CHAIN` for each of the two jumps;
 *   3. iptables-restore --noflush inserting only the jumps step 2 did not
 *      find, so a rerun never adds a second one.
 *
 * Exit codes follow cli.h: 2 for a bad command line or a bad option value
 * (the message names the flag or environment variable and the word), 1 when
 * the rules could not be read, written or removed.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "netfilter/exec.h"
#include "netfilter/rules.h"

#define PROG "condukt-egress"
#define CMD "netfilter-setup"
#define PFX PROG ": " CMD ": "

#define DEFAULT_RESOLV_CONF "/etc/resolv.conf"
/* Present exactly when the kernel has IPv6 (the ipv6 module is loaded or
 * built in), whether or not any interface has an address yet. */
#define IF_INET6_PATH "/proc/net/if_inet6"
/* resolv.conf is a few lines; a larger file is not one. */
#define RESOLV_CONF_MAX 65536
/* How many times --remove deletes our jump from one OUTPUT chain. We add
 * one; more can only come from other tools copying it, and a bound keeps a
 * misbehaving iptables from looping us forever. */
#define REMOVE_JUMPS_MAX 64
/* Passed as `-w 5`: the legacy backend serialises writers on the xtables
 * lock and would otherwise fail at once when another tool (a CNI plugin)
 * holds it. The nf_tables backend accepts and ignores it. */
#define XTABLES_WAIT "5"
/* The sbin directories searched after PATH: a non-root PATH often lacks
 * them, and they are where every distribution installs iptables. */
static const char *const SBIN_DIRS[] = {"/usr/local/sbin", "/usr/sbin", "/sbin"};

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " " CMD " [options]\n"
          "\n"
          "Redirects the pod's TCP 80/443 (IPv4 and IPv6) to the proxy and its\n"
          "DNS (UDP/TCP 53) to the sidecar's resolver, and rejects all other\n"
          "egress except loopback and the sidecar's own traffic (the mark on a\n"
          "socket of the sidecar's uid) (docs/netfilter.md). Safe to run again.\n"
          "\n"
          "  --proxy-port N     local port TCP is redirected to (default %d)\n"
          "  --mark VALUE       SO_MARK of the proxy's upstream sockets, decimal\n"
          "                     or 0x hex (default 0x%x)\n"
          "  --sidecar-uid UID  the proxy's uid; the mark on a socket of this uid\n"
          "                     is exempt from all rules (default %u, never 0)\n"
          "  --dns-port N       local port the workspace's UDP/TCP 53 is\n"
          "                     redirected to (default %d)\n"
          "  --ports LIST       TCP ports redirected (default " CE_NF_DEFAULT_PORTS ")\n"
          "  --dns LIST         resolvers the sidecar's uid may query: addresses,\n"
          "                     \"none\", or \"any\" (no DNS redirect: port 53 open\n"
          "                     to every process, unsafe) (default: the\n"
          "                     nameserver lines of the resolv.conf file)\n"
          "  --resolv-conf PATH (default " DEFAULT_RESOLV_CONF ")\n"
          "  --ipv6 MODE        auto, on or off (default auto: on when the kernel\n"
          "                     has IPv6)\n"
          "  --iptables PATH    iptables program; PATH-restore must sit beside it\n"
          "  --ip6tables PATH   the same for IPv6 (default: searched in $PATH)\n"
          "  --dry-run          print the iptables-restore input, change nothing\n"
          "  --remove           delete our chains and jumps\n"
          "\n"
          "Each valued option can also come from CONDUKT_EGRESS_<NAME>\n"
          "(CONDUKT_EGRESS_PROXY_PORT, ...); the flag wins.\n",
          CE_NF_DEFAULT_PROXY_PORT, CE_NF_DEFAULT_MARK,
          CE_NF_DEFAULT_SIDECAR_UID, CE_NF_DEFAULT_DNS_PORT);
}

/* Writes bytes that came from outside (a word, iptables' output) so that
 * they cannot carry terminal control sequences. Unlike ce_text_sanitize it
 * does not shorten: iptables' lines are longer than a quoted word. */
static void put_clean(FILE *out, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\t' || (c >= 0x20 && c < 0x7f))
      fputc(c, out);
    else
      fprintf(out, "\\x%02x", c);
  }
}

static int usage_error(const char *what, const char *word) {
  fprintf(stderr, PFX "%s", what);
  if (word != NULL) {
    char shown[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown, sizeof(shown), word, strlen(word), 0);
    fprintf(stderr, " '%s'", shown);
  }
  fputc('\n', stderr);
  usage(stderr);
  return CE_EXIT_USAGE;
}

/* The options that take a value. Each can also come from its environment
 * variable. The two mode flags (--dry-run, --remove) deliberately have no
 * variable: a stray CONDUKT_EGRESS_REMOVE in a pod spec must never turn
 * the init container that locks the pod into one that opens it. */
enum {
  OPT_PROXY_PORT,
  OPT_MARK,
  OPT_SIDECAR_UID,
  OPT_DNS_PORT,
  OPT_PORTS,
  OPT_DNS,
  OPT_RESOLV_CONF,
  OPT_IPV6,
  OPT_IPTABLES,
  OPT_IP6TABLES,
  OPT_COUNT
};

static const struct {
  const char *flag, *env;
} OPTS[OPT_COUNT] = {
    [OPT_PROXY_PORT] = {"--proxy-port", "CONDUKT_EGRESS_PROXY_PORT"},
    [OPT_MARK] = {"--mark", "CONDUKT_EGRESS_MARK"},
    [OPT_SIDECAR_UID] = {"--sidecar-uid", "CONDUKT_EGRESS_SIDECAR_UID"},
    [OPT_DNS_PORT] = {"--dns-port", "CONDUKT_EGRESS_DNS_PORT"},
    [OPT_PORTS] = {"--ports", "CONDUKT_EGRESS_PORTS"},
    [OPT_DNS] = {"--dns", "CONDUKT_EGRESS_DNS"},
    [OPT_RESOLV_CONF] = {"--resolv-conf", "CONDUKT_EGRESS_RESOLV_CONF"},
    [OPT_IPV6] = {"--ipv6", "CONDUKT_EGRESS_IPV6"},
    [OPT_IPTABLES] = {"--iptables", "CONDUKT_EGRESS_IPTABLES"},
    [OPT_IP6TABLES] = {"--ip6tables", "CONDUKT_EGRESS_IP6TABLES"},
};

typedef struct {
  const char *value[OPT_COUNT];
  /* The flag or variable name each value came from, for messages. */
  const char *source[OPT_COUNT];
  bool dry_run, remove;
} args_t;

/* Returns CE_EXIT_OK, or the exit code of a usage error already
 * reported; -1 means --help was printed (exit 0). */
static int parse_args(int argc, char **argv, args_t *a) {
  memset(a, 0, sizeof(*a));
  for (int i = 1; i < argc; i++) {
    const char *w = argv[i];
    if (strcmp(w, "-h") == 0 || strcmp(w, "--help") == 0) {
      usage(stdout);
      return -1;
    }
    if (strcmp(w, "--dry-run") == 0) {
      a->dry_run = true;
      continue;
    }
    if (strcmp(w, "--remove") == 0) {
      a->remove = true;
      continue;
    }
    if (w[0] != '-')
      return usage_error("unexpected argument", w);
    int k = -1;
    const char *value = NULL;
    for (int j = 0; j < OPT_COUNT && k < 0; j++) {
      size_t fl = strlen(OPTS[j].flag);
      if (strcmp(w, OPTS[j].flag) == 0) {
        k = j;
        if (i + 1 >= argc)
          return usage_error("missing value after", w);
        value = argv[++i];
      } else if (strncmp(w, OPTS[j].flag, fl) == 0 && w[fl] == '=') {
        k = j;
        value = w + fl + 1;
      }
    }
    if (k < 0)
      return usage_error("unknown option", w);
    /* A repeated flag: the last one wins, as with most tools. */
    a->value[k] = value;
    a->source[k] = OPTS[k].flag;
  }
  for (int k = 0; k < OPT_COUNT; k++) {
    if (a->value[k] != NULL)
      continue;
    const char *v = getenv(OPTS[k].env);
    if (v == NULL)
      continue;
    a->value[k] = v;
    a->source[k] = OPTS[k].env;
  }
  for (int k = 0; k < OPT_COUNT; k++) {
    if (a->value[k] != NULL && a->value[k][0] == '\0') {
      fprintf(stderr, PFX "%s: empty value\n", a->source[k]);
      usage(stderr);
      return CE_EXIT_USAGE;
    }
  }
  return CE_EXIT_OK;
}

static int value_error(const char *source, const ce_nf_error_t *err) {
  fprintf(stderr, PFX "%s: bad %s '%s': %s\n", source, err->what, err->word,
          err->why);
  usage(stderr);
  return CE_EXIT_USAGE;
}

typedef struct {
  const char *path;
} resolv_ctx_t;

static void resolv_skip(void *ctx, size_t line, const char *word,
                        const char *why) {
  const resolv_ctx_t *r = ctx;
  fprintf(stderr, PFX "note: %s:%zu: nameserver '%s' gets no rule: %s\n",
          r->path, line, word, why);
}

/* Fills cfg->dns from the resolv.conf file. Returns CE_EXIT_OK or
 * CE_EXIT_FAIL after printing why. */
static int load_resolv_conf(const char *path, ce_nf_config_t *cfg) {
  static char text[RESOLV_CONF_MAX + 1];
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr,
            PFX "cannot read %s: %s (give --dns LIST, --dns any or --dns "
                "none)\n",
            path, strerror(errno));
    return CE_EXIT_FAIL;
  }
  size_t n = fread(text, 1, sizeof(text), f);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    fprintf(stderr, PFX "cannot read %s\n", path);
    return CE_EXIT_FAIL;
  }
  if (n > RESOLV_CONF_MAX) {
    fprintf(stderr, PFX "%s is larger than %d bytes; it is not a resolv.conf\n",
            path, RESOLV_CONF_MAX);
    return CE_EXIT_FAIL;
  }
  resolv_ctx_t ctx = {path};
  ce_nf_parse_resolv_conf(text, n, cfg, resolv_skip, &ctx);
  if (cfg->ndns == 0)
    fprintf(stderr,
            PFX "note: %s names no usable nameserver, so the sidecar may "
                "query no resolver\n",
            path);
  return CE_EXIT_OK;
}

/* One address family: its programs and the rule text for it. */
typedef struct {
  ce_nf_family_t family;
  const char *label;   /* "IPv4" */
  const char *name;    /* "iptables" */
  const char *override; /* --iptables value, or NULL */
  const char *override_source;
  char cmd[PATH_MAX];     /* the iptables program */
  char restore[PATH_MAX]; /* the iptables-restore program beside it */
} family_t;

static bool executable_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Appends s to the searched-directories text, shortening at the end. */
static void note_dir(char *buf, size_t cap, const char *dir, size_t n) {
  size_t len = strlen(buf);
  int w = snprintf(buf + len, cap - len, "%s%.*s", len > 0 ? ":" : "", (int)n,
                   dir);
  if (w < 0 || (size_t)w >= cap - len)
    memcpy(buf + cap - 4, "...", 4);
}

/* Looks for NAME and NAME-restore side by side: both must come from the
 * same installation, or we could check jumps with one backend (nf_tables)
 * and write rules with the other (legacy). Directories: $PATH (absolute
 * entries only: a relative one would make the result depend on the current
 * directory), then SBIN_DIRS. Returns true when found. */
static bool search(family_t *f, const char *name, char *searched, size_t cap) {
  const char *path = getenv("PATH");
  const char *dirs[64 + sizeof(SBIN_DIRS) / sizeof(SBIN_DIRS[0])];
  size_t lens[sizeof(dirs) / sizeof(dirs[0])];
  size_t nd = 0;
  searched[0] = '\0';
  for (const char *p = path; p != NULL && *p != '\0' && nd < 64;) {
    const char *colon = strchr(p, ':');
    size_t n = colon != NULL ? (size_t)(colon - p) : strlen(p);
    if (n > 0 && p[0] == '/') {
      dirs[nd] = p;
      lens[nd++] = n;
    }
    if (colon == NULL)
      break;
    p = colon + 1;
  }
  for (size_t s = 0; s < sizeof(SBIN_DIRS) / sizeof(SBIN_DIRS[0]); s++) {
    bool seen = false;
    for (size_t i = 0; i < nd; i++)
      seen = seen || (lens[i] == strlen(SBIN_DIRS[s]) &&
                      memcmp(dirs[i], SBIN_DIRS[s], lens[i]) == 0);
    if (!seen) {
      dirs[nd] = SBIN_DIRS[s];
      lens[nd++] = strlen(SBIN_DIRS[s]);
    }
  }
  for (size_t i = 0; i < nd; i++) {
    note_dir(searched, cap, dirs[i], lens[i]);
    int a = snprintf(f->cmd, sizeof(f->cmd), "%.*s/%s", (int)lens[i], dirs[i],
                     name);
    int b = snprintf(f->restore, sizeof(f->restore), "%.*s/%s-restore",
                     (int)lens[i], dirs[i], name);
    if (a < 0 || b < 0 || (size_t)b >= sizeof(f->restore))
      continue;
    if (executable_file(f->cmd) && executable_file(f->restore))
      return true;
  }
  return false;
}

/* Fills f->cmd and f->restore. Returns CE_EXIT_OK or CE_EXIT_FAIL after
 * printing what was looked for and where. */
static int locate(family_t *f) {
  char searched[1024];
  if (f->override == NULL || strchr(f->override, '/') == NULL) {
    const char *name = f->override != NULL ? f->override : f->name;
    if (search(f, name, searched, sizeof(searched)))
      return CE_EXIT_OK;
    fprintf(stderr,
            PFX "cannot find %s and %s-restore in one directory; searched "
                "%s (install iptables, or give %s PATH)\n",
            name, name, searched, f->family == CE_NF_IPV4 ? "--iptables" : "--ip6tables");
    return CE_EXIT_FAIL;
  }
  int a = snprintf(f->cmd, sizeof(f->cmd), "%s", f->override);
  int b = snprintf(f->restore, sizeof(f->restore), "%s-restore", f->override);
  if (a < 0 || b < 0 || (size_t)b >= sizeof(f->restore)) {
    fprintf(stderr, PFX "%s: path too long\n", f->override_source);
    return CE_EXIT_FAIL;
  }
  const char *paths[] = {f->cmd, f->restore};
  for (size_t i = 0; i < 2; i++) {
    struct stat st;
    const char *why = NULL;
    if (stat(paths[i], &st) != 0)
      why = strerror(errno);
    else if (!executable_file(paths[i]))
      why = "not an executable file";
    if (why != NULL) {
      fprintf(stderr, PFX "cannot run %s (from %s %s): %s\n", paths[i],
              f->override_source, f->override, why);
      return CE_EXIT_FAIL;
    }
  }
  return CE_EXIT_OK;
}

static void put_output(const ce_nf_exec_result_t *res) {
  const char *s = res->output;
  size_t n = res->output_len;
  while (n > 0) {
    const char *nl = memchr(s, '\n', n);
    size_t len = nl != NULL ? (size_t)(nl - s) : n;
    if (len > 0) {
      fputs("  ", stderr);
      put_clean(stderr, s, len);
      fputc('\n', stderr);
    }
    s += len + (nl != NULL);
    n -= len + (nl != NULL);
  }
  if (res->truncated)
    fputs("  [further output dropped]\n", stderr);
}

/* Capability numbers from <linux/capability.h>, which we do not include
 * for two constants. */
#define NF_CAP_NET_ADMIN 12
#define NF_CAP_NET_RAW 13

/* Our effective capabilities (CapEff in /proc/self/status); all bits set
 * when that cannot be read, so that we never blame a missing capability
 * without evidence. */
static unsigned long long effective_caps(void) {
  unsigned long long caps = ~0ULL;
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return caps;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "CapEff:", 7) == 0) {
      caps = strtoull(line + 7, NULL, 16);
      break;
    }
  }
  fclose(f);
  return caps;
}

static bool has_cap(unsigned long long caps, int cap) {
  return (caps >> cap) & 1u;
}

/* Whether iptables failed for want of CAP_NET_ADMIN: the nf_tables
 * backend says "Permission denied (you must be root)", netlink says EPERM,
 * and the legacy backend only says "unable to initialize table", so our
 * own capability set is asked as well. */
static bool looks_unprivileged(const ce_nf_exec_result_t *res,
                               unsigned long long caps) {
  return !has_cap(caps, NF_CAP_NET_ADMIN) ||
         strstr(res->output, "Permission denied") != NULL ||
         strstr(res->output, "must be root") != NULL ||
         strstr(res->output, "Operation not permitted") != NULL;
}

/* Runs one program. Returns its exit code (0 to 255); or -1 after
 * reporting that it could not be run, timed out or died of a signal.
 * Non-zero exit codes are the caller's to judge and report (fail()). */
static int run(const char *path, char *const argv[], const char *input,
               size_t n, const char *doing, ce_nf_exec_result_t *res) {
  int rc = ce_nf_exec(path, argv, input, n, CE_NF_EXEC_TIMEOUT_MS, res);
  if (rc == CE_ETIMEDOUT) {
    fprintf(stderr, PFX "%s did not finish within %d s while %s; killed it\n",
            path, CE_NF_EXEC_TIMEOUT_MS / 1000, doing);
    put_output(res);
    return -1;
  }
  if (rc != 0) {
    fprintf(stderr, PFX "cannot run %s while %s: %s\n", path, doing,
            strerror(res->spawn_errno != 0 ? res->spawn_errno : EIO));
    return -1;
  }
  if (res->exit_code < 0) {
    fprintf(stderr, PFX "%s was killed by signal %d while %s\n", path,
            res->signal, doing);
    put_output(res);
    return -1;
  }
  return res->exit_code;
}

static int fail(const char *path, const char *doing,
                const ce_nf_exec_result_t *res) {
  unsigned long long caps = effective_caps();
  if (looks_unprivileged(res, caps))
    fprintf(stderr,
            PROG ": " CMD " needs CAP_NET_ADMIN in the pod's network "
                 "namespace: %s exited with status %d while %s:\n",
            path, res->exit_code, doing);
  else if (!has_cap(caps, NF_CAP_NET_RAW) &&
           strstr(res->output, "(legacy)") != NULL)
    /* The legacy backend talks to the kernel through a raw socket. */
    fprintf(stderr,
            PROG ": " CMD " needs CAP_NET_RAW as well with the legacy "
                 "iptables backend: %s exited with status %d while %s:\n",
            path, res->exit_code, doing);
  else
    fprintf(stderr, PFX "%s exited with status %d while %s:\n", path,
            res->exit_code, doing);
  put_output(res);
  return CE_EXIT_FAIL;
}

/* iptables-restore --noflush with text on stdin. */
static int restore(const family_t *f, const char *text, size_t n,
                   const char *doing) {
  char *argv[] = {(char *)f->restore, "-w", XTABLES_WAIT, "--noflush", NULL};
  static ce_nf_exec_result_t res;
  int code = run(f->restore, argv, text, n, doing, &res);
  if (code < 0)
    return CE_EXIT_FAIL;
  if (code != 0)
    return fail(f->restore, doing, &res);
  return CE_EXIT_OK;
}

/* `iptables -t TABLE OP OUTPUT -j CHAIN`. Returns the exit code (0 or 1
 * for -C), or -1 after reporting any other outcome. */
static int jump_op(const family_t *f, const ce_nf_hook_t *h, const char *op,
                   const char *doing) {
  char *argv[] = {(char *)f->cmd, "-w", XTABLES_WAIT, "-t", (char *)h->table,
                  (char *)op,     "OUTPUT", "-j", (char *)h->chain, NULL};
  static ce_nf_exec_result_t res;
  int code = run(f->cmd, argv, "", 0, doing, &res);
  if (code < 0)
    return -1;
  /* -C answers 1 for "no such rule"; everything else is a failure. The
   * chain itself always exists here (declared in the step before), so 1
   * cannot mean "no such chain", which iptables reports with 2. */
  if (code == 0 || (code == 1 && strcmp(op, "-C") == 0))
    return code;
  fail(f->cmd, doing, &res);
  return -1;
}

static int install(const family_t *f, const ce_nf_config_t *cfg) {
  static char text[CE_NF_TEXT_MAX];
  char doing[96];
  size_t n;
  if (ce_nf_rules_text(cfg, f->family, text, sizeof(text), &n) != 0) {
    fprintf(stderr, PFX "internal error: the %s rules do not fit\n", f->label);
    return CE_EXIT_FAIL;
  }
  snprintf(doing, sizeof(doing), "installing the %s rules", f->label);
  if (restore(f, text, n, doing) != CE_EXIT_OK)
    return CE_EXIT_FAIL;

  unsigned missing = 0;
  snprintf(doing, sizeof(doing), "checking the %s jumps", f->label);
  for (size_t i = 0; i < CE_NF_HOOK_COUNT; i++) {
    int code = jump_op(f, &ce_nf_hooks[i], "-C", doing);
    if (code < 0)
      return CE_EXIT_FAIL;
    if (code == 1)
      missing |= 1u << i;
  }
  if (missing == 0)
    return CE_EXIT_OK;
  ce_nf_jumps_text(missing, text, sizeof(text), &n);
  snprintf(doing, sizeof(doing), "adding the %s jumps", f->label);
  return restore(f, text, n, doing);
}

static int uninstall(const family_t *f) {
  static char text[CE_NF_TEXT_MAX];
  char doing[96];
  size_t n;
  snprintf(doing, sizeof(doing), "emptying the %s chains", f->label);
  ce_nf_flush_text(text, sizeof(text), &n);
  if (restore(f, text, n, doing) != CE_EXIT_OK)
    return CE_EXIT_FAIL;
  snprintf(doing, sizeof(doing), "removing the %s jumps", f->label);
  for (size_t i = 0; i < CE_NF_HOOK_COUNT; i++) {
    int k = 0;
    for (;; k++) {
      int code = jump_op(f, &ce_nf_hooks[i], "-C", doing);
      if (code < 0)
        return CE_EXIT_FAIL;
      if (code == 1)
        break;
      if (k == REMOVE_JUMPS_MAX) {
        fprintf(stderr,
                PFX "%s: still a jump to %s in %s OUTPUT after deleting %d\n",
                f->cmd, ce_nf_hooks[i].chain, ce_nf_hooks[i].table,
                REMOVE_JUMPS_MAX);
        return CE_EXIT_FAIL;
      }
      if (jump_op(f, &ce_nf_hooks[i], "-D", doing) < 0)
        return CE_EXIT_FAIL;
    }
  }
  snprintf(doing, sizeof(doing), "deleting the %s chains", f->label);
  ce_nf_delete_text(text, sizeof(text), &n);
  return restore(f, text, n, doing);
}

static void print_dry_run(const family_t *f, const ce_nf_config_t *cfg,
                          bool remove) {
  static char text[CE_NF_TEXT_MAX];
  size_t n;
  const char *prog = f->family == CE_NF_IPV4 ? "iptables" : "ip6tables";
  if (remove) {
    ce_nf_flush_text(text, sizeof(text), &n);
    printf("# %s, step 1: %s-restore -w " XTABLES_WAIT " --noflush\n%s",
           f->label, prog, text);
    printf("# %s, step 2: `%s -t TABLE -D OUTPUT -j CHAIN` while\n"
           "# `%s -t TABLE -C OUTPUT -j CHAIN` finds the jump\n",
           f->label, prog, prog);
    ce_nf_delete_text(text, sizeof(text), &n);
    printf("# %s, step 3: %s-restore -w " XTABLES_WAIT " --noflush\n%s",
           f->label, prog, text);
    return;
  }
  ce_nf_rules_text(cfg, f->family, text, sizeof(text), &n);
  printf("# %s, step 1: %s-restore -w " XTABLES_WAIT " --noflush\n%s",
         f->label, prog, text);
  ce_nf_jumps_text((1u << CE_NF_HOOK_COUNT) - 1, text, sizeof(text), &n);
  printf("# %s, step 2: %s-restore -w " XTABLES_WAIT " --noflush, each jump\n"
         "# only when `%s -t TABLE -C OUTPUT -j CHAIN` does not find it\n%s",
         f->label, prog, prog, text);
}

static void print_summary(const family_t *fams, size_t nf,
                          const ce_nf_config_t *cfg) {
  printf(PFX "installed the ");
  for (size_t i = 0; i < nf; i++)
    printf("%s%s", i > 0 ? " and " : "", fams[i].label);
  printf(" rules: TCP ");
  for (size_t i = 0; i < cfg->nports; i++)
    printf("%s%u", i > 0 ? "," : "", (unsigned)cfg->ports[i]);
  printf(" to local port %u, mark 0x%x from uid %u exempt, ",
         (unsigned)cfg->proxy_port, (unsigned)cfg->mark,
         (unsigned)cfg->sidecar_uid);
  if (cfg->dns_any) {
    printf("DNS open to any address (--dns any)\n");
    return;
  }
  printf("DNS to local port %u, the sidecar's to ", (unsigned)cfg->dns_port);
  if (cfg->ndns == 0)
    printf("no resolver");
  for (size_t i = 0; i < cfg->ndns; i++) {
    char a[CE_NF_ADDR_TEXT_MAX + 1];
    ce_nf_addr_format(&cfg->dns[i], a);
    printf("%s%s", i > 0 ? "," : "", a);
  }
  printf("\n");
}

int ce_cmd_netfilter_setup(int argc, char **argv) {
  args_t a;
  int code = parse_args(argc, argv, &a);
  if (code < 0)
    return CE_EXIT_OK;
  if (code != CE_EXIT_OK)
    return code;

  ce_nf_config_t cfg;
  ce_nf_error_t err;
  ce_nf_ipv6_mode_t mode = CE_NF_IPV6_AUTO;
  ce_nf_config_init(&cfg);
  if (a.value[OPT_PROXY_PORT] != NULL &&
      ce_nf_parse_port(a.value[OPT_PROXY_PORT], &cfg.proxy_port, &err) != 0)
    return value_error(a.source[OPT_PROXY_PORT], &err);
  if (a.value[OPT_MARK] != NULL &&
      ce_nf_parse_mark(a.value[OPT_MARK], &cfg.mark, &err) != 0)
    return value_error(a.source[OPT_MARK], &err);
  if (a.value[OPT_SIDECAR_UID] != NULL &&
      ce_nf_parse_uid(a.value[OPT_SIDECAR_UID], &cfg.sidecar_uid, &err) != 0)
    return value_error(a.source[OPT_SIDECAR_UID], &err);
  if (a.value[OPT_DNS_PORT] != NULL &&
      ce_nf_parse_port(a.value[OPT_DNS_PORT], &cfg.dns_port, &err) != 0)
    return value_error(a.source[OPT_DNS_PORT], &err);
  if (cfg.dns_port == cfg.proxy_port) {
    fprintf(stderr, PFX "the DNS port and the proxy port are both %u\n",
            (unsigned)cfg.dns_port);
    usage(stderr);
    return CE_EXIT_USAGE;
  }
  if (a.value[OPT_PORTS] != NULL &&
      ce_nf_parse_ports(a.value[OPT_PORTS], &cfg, &err) != 0)
    return value_error(a.source[OPT_PORTS], &err);
  if (a.value[OPT_DNS] != NULL &&
      ce_nf_parse_dns(a.value[OPT_DNS], &cfg, &err) != 0)
    return value_error(a.source[OPT_DNS], &err);
  if (cfg.dns_any && !a.remove)
    fprintf(stderr,
            PFX "warning: %s any: UDP and TCP 53 are open to every address "
                "from every process, and DNS bypasses the sidecar\n",
            a.source[OPT_DNS]);
  if (a.value[OPT_IPV6] != NULL &&
      ce_nf_parse_ipv6_mode(a.value[OPT_IPV6], &mode, &err) != 0)
    return value_error(a.source[OPT_IPV6], &err);

  bool kernel_v6 = access(IF_INET6_PATH, F_OK) == 0;
  bool v6 = false;
  if (ce_nf_ipv6_wanted(mode, kernel_v6, &v6) != 0) {
    fprintf(stderr,
            PFX "%s on, but this kernel has no IPv6 (%s is missing)\n",
            a.source[OPT_IPV6], IF_INET6_PATH);
    return CE_EXIT_FAIL;
  }
  if (!v6 && kernel_v6)
    fprintf(stderr,
            PFX "warning: %s off: IPv6 egress from this network namespace is "
                "NOT restricted\n",
            a.source[OPT_IPV6]);
  else if (!v6)
    fprintf(stderr, PFX "note: this kernel has no IPv6 (%s is missing); "
                        "IPv4 rules only\n", IF_INET6_PATH);

  /* --remove deletes whatever we installed, so it needs no resolvers. */
  if (!a.remove && a.value[OPT_DNS] == NULL) {
    const char *rc = a.value[OPT_RESOLV_CONF] != NULL ? a.value[OPT_RESOLV_CONF]
                                                      : DEFAULT_RESOLV_CONF;
    if (load_resolv_conf(rc, &cfg) != CE_EXIT_OK)
      return CE_EXIT_FAIL;
  }

  static family_t fams[2];
  size_t nf = 0;
  fams[nf++] = (family_t){.family = CE_NF_IPV4,
                          .label = "IPv4",
                          .name = "iptables",
                          .override = a.value[OPT_IPTABLES],
                          .override_source = a.source[OPT_IPTABLES]};
  if (v6)
    fams[nf++] = (family_t){.family = CE_NF_IPV6,
                            .label = "IPv6",
                            .name = "ip6tables",
                            .override = a.value[OPT_IP6TABLES],
                            .override_source = a.source[OPT_IP6TABLES]};

  if (a.dry_run) {
    for (size_t i = 0; i < nf; i++)
      print_dry_run(&fams[i], &cfg, a.remove);
    return fflush(stdout) == 0 ? CE_EXIT_OK : CE_EXIT_FAIL;
  }

  /* Find every program before changing anything, so a missing ip6tables
   * fails the run while the namespace is still untouched. */
  for (size_t i = 0; i < nf; i++) {
    if (locate(&fams[i]) != CE_EXIT_OK)
      return CE_EXIT_FAIL;
  }
  for (size_t i = 0; i < nf; i++) {
    code = a.remove ? uninstall(&fams[i]) : install(&fams[i], &cfg);
    if (code != CE_EXIT_OK)
      return code;
  }
  if (a.remove)
    printf(PFX "removed the %s rules\n", nf == 2 ? "IPv4 and IPv6" : "IPv4");
  else
    print_summary(fams, nf, &cfg);
  return fflush(stdout) == 0 ? CE_EXIT_OK : CE_EXIT_FAIL;
}
