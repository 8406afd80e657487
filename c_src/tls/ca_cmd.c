/*
 * `condukt-egress ca`: create a per-session certificate authority.
 *
 *   condukt-egress ca new --cert PATH --key PATH [--common-name NAME] [--days N]
 *   condukt-egress ca bundle --ca-cert PATH --out-dir DIR [--roots PATH]
 *   condukt-egress ca help
 *
 * Options take their value as the next word or after '=' ("--days=7"); the
 * '=' form is the way to give a value that starts with '-'. Nothing is
 * printed on success. Exit codes follow cli.h: 1 when the CA cannot be
 * created (one sentence on stderr, naming the file at fault; an existing
 * file is never overwritten), 2 for a bad command line (the message names
 * the offending word). docs/cli.md and docs/tls.md describe the result.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "tls/bundle.h"
#include "tls/ca.h"

#define PROG "condukt-egress"
/* Room for ce_ca_generate's sentence: a sanitised path and a reason. */
#define CA_ERR_MAX 512

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " ca new --cert PATH --key PATH [--common-name NAME] "
          "[--days N]\n"
          "       " PROG " ca bundle --ca-cert PATH --out-dir DIR [--roots PATH]\n"
          "       " PROG " ca help\n"
          "\n"
          "  new     create a self-signed ECDSA P-256 CA; the key file is created\n"
          "          0600 and neither file may exist already (docs/tls.md)\n"
          "  bundle  write DIR/" CE_BUNDLE_CA_NAME " (the CA certificate), DIR/" CE_BUNDLE_STORE_NAME "\n"
          "          (the roots and the CA as a PKCS#12 trust store for the JVM) and\n"
          "          DIR/" CE_BUNDLE_NAME " (the roots, then the CA certificate) for a\n"
          "          workspace\n"
          "\n"
          "  --cert PATH         where to write the CA certificate (PEM)\n"
          "  --key PATH          where to write the CA private key (PEM, PKCS#8)\n"
          "  --common-name NAME  the CA's subject CN (default \"%s\")\n"
          "  --days N            validity in days, 1 to %u (default %u)\n"
          "  --ca-cert PATH      the session CA certificate to trust (PEM)\n"
          "  --out-dir DIR       where to write the three files (an existing directory)\n"
          "  --roots PATH        the public roots (default: ca-certificates/mozilla.pem\n"
          "                      next to the binary)\n",
          CE_CA_DEFAULT_COMMON_NAME, CE_CA_MAX_DAYS, CE_CA_DEFAULT_DAYS);
}

/* Prints "condukt-egress: WHAT 'WORD' (HINT)" (WORD and HINT may be NULL)
 * and the usage; returns the usage exit code. */
static int usage_error(const char *what, const char *word, const char *hint) {
  fprintf(stderr, PROG ": %s", what);
  if (word != NULL) {
    char shown[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown, sizeof(shown), word, strlen(word), 0);
    fprintf(stderr, " '%s'", shown);
  }
  if (hint != NULL)
    fprintf(stderr, " (%s)", hint);
  fputc('\n', stderr);
  usage(stderr);
  return CE_EXIT_USAGE;
}

typedef struct {
  const char *name; /* without the leading "--" */
  const char *value;
} ca_option_t;

enum { OPT_CERT, OPT_KEY, OPT_CN, OPT_DAYS, OPT_COUNT };

/* Parses a whole number of days: digits only, 1 to CE_CA_MAX_DAYS. */
static bool parse_days(const char *s, unsigned *out) {
  unsigned v = 0;
  if (s[0] == '\0')
    return false;
  for (const char *p = s; *p != '\0'; p++) {
    if (*p < '0' || *p > '9')
      return false;
    v = v * 10 + (unsigned)(*p - '0');
    if (v > CE_CA_MAX_DAYS)
      return false;
  }
  if (v < 1)
    return false;
  *out = v;
  return true;
}

/* Parses "--NAME VALUE" and "--NAME=VALUE" words into opts (count
 * entries; values start NULL). Returns -1 when the line is good, or the
 * exit code to return (help printed, or a usage error); cmd names the
 * subcommand in messages ("ca new"). */
static int parse_options(const char *cmd, ca_option_t *opts, int count, int argc, char **argv) {
  char what[64];
  for (int i = 1; i < argc; i++) {
    const char *w = argv[i];
    if (strcmp(w, "-h") == 0 || strcmp(w, "--help") == 0) {
      usage(stdout);
      return CE_EXIT_OK;
    }
    if (strncmp(w, "--", 2) != 0) {
      snprintf(what, sizeof(what), "%s: %s", cmd, w[0] == '-' ? "unknown option" : "unexpected argument");
      return usage_error(what, w, NULL);
    }
    const char *name = w + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    int which = -1;
    for (int k = 0; k < count; k++) {
      if (strlen(opts[k].name) == name_len && strncmp(opts[k].name, name, name_len) == 0)
        which = k;
    }
    if (which < 0) {
      snprintf(what, sizeof(what), "%s: unknown option", cmd);
      return usage_error(what, w, NULL);
    }
    if (opts[which].value != NULL) {
      snprintf(what, sizeof(what), "%s: option given twice", cmd);
      return usage_error(what, w, NULL);
    }
    const char *value;
    if (eq != NULL) {
      value = eq + 1;
    } else {
      /* A following word that starts with '-' is taken for a forgotten
       * value rather than a file name: "--cert --key k.pem" is a mistake
       * far more often than a file called "--key". */
      if (i + 1 >= argc || argv[i + 1][0] == '-') {
        snprintf(what, sizeof(what), "%s: missing value after", cmd);
        return usage_error(what, w, "use --NAME=VALUE for a value starting with '-'");
      }
      value = argv[++i];
    }
    if (value[0] == '\0') {
      snprintf(what, sizeof(what), "%s: empty value for option", cmd);
      return usage_error(what, w, NULL);
    }
    opts[which].value = value;
  }
  return -1;
}

static int cmd_new(int argc, char **argv) {
  ca_option_t opts[OPT_COUNT] = {
      [OPT_CERT] = {"cert", NULL},
      [OPT_KEY] = {"key", NULL},
      [OPT_CN] = {"common-name", NULL},
      [OPT_DAYS] = {"days", NULL},
  };
  int parsed = parse_options("ca new", opts, OPT_COUNT, argc, argv);
  if (parsed >= 0)
    return parsed;
  if (opts[OPT_CERT].value == NULL)
    return usage_error("ca new: missing --cert PATH", NULL, NULL);
  if (opts[OPT_KEY].value == NULL)
    return usage_error("ca new: missing --key PATH", NULL, NULL);

  const char *cn = opts[OPT_CN].value != NULL ? opts[OPT_CN].value
                                              : CE_CA_DEFAULT_COMMON_NAME;
  char hint[96];
  if (!ce_ca_common_name_ok(cn)) {
    snprintf(hint, sizeof(hint), "1 to %u printable UTF-8 characters",
             CE_CA_COMMON_NAME_MAX);
    return usage_error("ca new: bad --common-name", cn, hint);
  }
  unsigned days = CE_CA_DEFAULT_DAYS;
  if (opts[OPT_DAYS].value != NULL && !parse_days(opts[OPT_DAYS].value, &days)) {
    snprintf(hint, sizeof(hint), "a whole number from 1 to %u", CE_CA_MAX_DAYS);
    return usage_error("ca new: bad --days", opts[OPT_DAYS].value, hint);
  }
  if (strcmp(opts[OPT_CERT].value, opts[OPT_KEY].value) == 0)
    return usage_error("ca new: --cert and --key name the same file",
                       opts[OPT_CERT].value, NULL);

  char err[CA_ERR_MAX];
  int rc = ce_ca_generate(cn, days, opts[OPT_CERT].value, opts[OPT_KEY].value,
                          err, sizeof(err));
  if (rc != CE_OK) {
    fprintf(stderr, PROG ": ca new: %s\n", err);
    return CE_EXIT_FAIL;
  }
  return CE_EXIT_OK;
}

enum { BOPT_CA, BOPT_OUT, BOPT_ROOTS, BOPT_COUNT };

static int cmd_bundle(int argc, char **argv) {
  ca_option_t opts[BOPT_COUNT] = {
      [BOPT_CA] = {"ca-cert", NULL},
      [BOPT_OUT] = {"out-dir", NULL},
      [BOPT_ROOTS] = {"roots", NULL},
  };
  int parsed = parse_options("ca bundle", opts, BOPT_COUNT, argc, argv);
  if (parsed >= 0)
    return parsed;
  if (opts[BOPT_CA].value == NULL)
    return usage_error("ca bundle: missing --ca-cert PATH", NULL, NULL);
  if (opts[BOPT_OUT].value == NULL)
    return usage_error("ca bundle: missing --out-dir DIR", NULL, NULL);
  char roots[PATH_MAX];
  const char *roots_path = opts[BOPT_ROOTS].value;
  if (roots_path == NULL) {
    roots_path = ce_trust_default_roots(roots, sizeof(roots));
    if (roots_path == NULL) {
      fprintf(stderr, PROG ": ca bundle: cannot find the binary's ca-certificates/mozilla.pem; pass --roots\n");
      return CE_EXIT_FAIL;
    }
  }
  char err[CA_ERR_MAX];
  if (ce_trust_bundle_write(opts[BOPT_CA].value, roots_path, opts[BOPT_OUT].value, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": ca bundle: %s\n", err);
    return CE_EXIT_FAIL;
  }
  return CE_EXIT_OK;
}

int ce_cmd_ca(int argc, char **argv) {
  if (argc < 2)
    return usage_error("ca: missing subcommand (new, bundle or help)", NULL, NULL);
  const char *sub = argv[1];
  if (strcmp(sub, "new") == 0)
    return cmd_new(argc - 1, argv + 1);
  if (strcmp(sub, "bundle") == 0)
    return cmd_bundle(argc - 1, argv + 1);
  if (strcmp(sub, "help") == 0 || strcmp(sub, "-h") == 0 ||
      strcmp(sub, "--help") == 0) {
    usage(stdout);
    return CE_EXIT_OK;
  }
  if (sub[0] == '-')
    return usage_error("ca: unknown option", sub, NULL);
  return usage_error("ca: unknown subcommand", sub, NULL);
}
