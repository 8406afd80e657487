/*
 * `condukt-egress policy`: check or dry-run a sidecar policy document.
 *
 *   condukt-egress policy check FILE              exit 0, or 1 + error line
 *   condukt-egress policy eval [--method M] FILE URL_OR_HOST
 *                                                 one JSON verdict on stdout
 *
 * "--" ends the options, for a host or file that starts with '-'.
 *
 * Exit codes follow cli.h: 1 when the document is refused (the loader's
 * one-line message on stderr, prefixed "condukt-egress: FILE: "), 2 for a
 * bad command line. The eval output format is fixed by docs/policy-json.md
 * ("policy eval output"); the Elixir side and operators parse it.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "policy/policy.h"

#define PROG "condukt-egress"

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " policy check [--] FILE\n"
          "       " PROG " policy eval [--method METHOD] [--] FILE URL_OR_HOST\n"
          "\n"
          "  check  validate a sidecar policy document (docs/policy-json.md)\n"
          "  eval   print the verdict for a URL or host[:port] as one JSON line,\n"
          "         with the credentials the request would get (header and\n"
          "         secret name, never a value) when the policy has some;\n"
          "         --method names the request's method (rules with methods\n"
          "         match no request whose method is not given)\n");
}

/* Prints "condukt-egress: WHAT 'WORD'" (WORD may be NULL) and the usage. */
static int usage_error(const char *what, const char *word) {
  if (word != NULL) {
    char shown[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown, sizeof(shown), word, strlen(word), 0);
    fprintf(stderr, PROG ": %s '%s'\n", what, shown);
  } else {
    fprintf(stderr, PROG ": %s\n", what);
  }
  usage(stderr);
  return CE_EXIT_USAGE;
}

static int load(const char *file, ce_policy_t **out) {
  ce_policy_error_t err;
  if (ce_policy_load_file(file, out, &err) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", file, err.message);
    return CE_EXIT_FAIL;
  }
  return CE_EXIT_OK;
}

/* Every member is either a fixed word, an integer, the normalised host,
 * whose bytes are limited to [a-z0-9._*:-] by host.c, or a credential's
 * header (a token) and secret name ([A-Za-z0-9._-]), as the loader checked
 * them, so nothing needs JSON escaping. "credentials" is printed only for a
 * policy that has some: idx[0..n) are the entries the request would get,
 * never a value (the dry run has none). */
static void print_verdict(const ce_verdict_t *v, const ce_policy_t *policy, const size_t *idx, int n) {
  const char *reason = ce_reason_name(v->reason);
  printf("{\"decision\":\"%s\",\"reason\":", ce_decision_name(v->decision));
  if (reason != NULL)
    printf("\"%s\"", reason);
  else
    printf("null");
  printf(",\"matched_rule\":");
  if (v->rule_index >= 0)
    printf("{\"index\":%d,\"kind\":\"%s\"}", (int)v->rule_index,
           ce_rule_kind_name(v->rule_kind));
  else
    printf("null");
  printf(",\"host\":");
  if (v->host_valid)
    printf("\"%s\"", v->host.text);
  else
    printf("null");
  if (ce_policy_credential_count(policy) > 0) {
    printf(",\"credentials\":[");
    for (int i = 0; i < n; i++) {
      ce_credential_info_t info;
      ce_policy_credential(policy, idx[i], &info);
      printf("%s{\"index\":%zu,\"header\":\"%s\",\"secret\":\"%s\"}", i > 0 ? "," : "", idx[i], info.header,
             info.secret);
    }
    printf("]");
  }
  printf("}\n");
}

/* The most positional words any form of the command takes: SUB FILE TARGET. */
#define POLICY_MAX_WORDS 3

int ce_cmd_policy(int argc, char **argv) {
  /* A word starting with '-' is an option, and this command has none but
   * -h/--help; refusing the others keeps "-" or "--verbose" from being read
   * as a file. A lone "--" ends the options, so a host or a file whose name
   * starts with '-' can still be given after it. */
  const char *words[POLICY_MAX_WORDS];
  int n = 0;
  bool options_done = false;
  const char *method = NULL;
  for (int i = 1; i < argc; i++) {
    const char *w = argv[i];
    if (!options_done && strcmp(w, "--method") == 0) {
      if (i + 1 >= argc)
        return usage_error("policy: --method needs a value", NULL);
      method = argv[++i];
      continue;
    }
    if (!options_done && strcmp(w, "--") == 0) {
      options_done = true;
      continue;
    }
    if (!options_done && (strcmp(w, "-h") == 0 || strcmp(w, "--help") == 0)) {
      usage(stdout);
      return CE_EXIT_OK;
    }
    if (!options_done && w[0] == '-')
      return usage_error("policy: unknown option", w);
    if (n == POLICY_MAX_WORDS)
      return usage_error("policy: unexpected argument", w);
    words[n++] = w;
  }
  if (n < 1)
    return usage_error("policy: missing subcommand (check or eval)", NULL);

  const char *sub = words[0];
  if (method != NULL && strcmp(sub, "eval") != 0)
    return usage_error("policy: --method is an option of eval", NULL);
  if (strcmp(sub, "check") == 0) {
    if (n < 2)
      return usage_error("policy check: missing FILE", NULL);
    if (n > 2)
      return usage_error("policy check: unexpected argument", words[2]);
    ce_policy_t *policy = NULL;
    int code = load(words[1], &policy);
    ce_policy_free(policy);
    return code;
  }
  if (strcmp(sub, "eval") == 0) {
    if (n < 2)
      return usage_error("policy eval: missing FILE", NULL);
    if (n < 3)
      return usage_error("policy eval: missing URL_OR_HOST", NULL);
    ce_policy_t *policy = NULL;
    int code = load(words[1], &policy);
    if (code != CE_EXIT_OK)
      return code;
    ce_verdict_t verdict;
    size_t method_len = method != NULL ? strlen(method) : 0;
    size_t idx[CE_POLICY_MAX_CREDENTIALS];
    int n_creds = 0;
    int rc = ce_policy_eval_input(policy, words[2], strlen(words[2]), method, method_len, &verdict);
    if (rc == 0) {
      n_creds = ce_policy_eval_input_credentials(policy, words[2], strlen(words[2]), method, method_len,
                                                 verdict.decision, idx, CE_POLICY_MAX_CREDENTIALS);
      rc = n_creds < 0 ? n_creds : 0;
    }
    if (rc != 0) {
      ce_policy_free(policy);
      fprintf(stderr, PROG ": policy eval: %s\n", ce_strerror(rc));
      return CE_EXIT_FAIL;
    }
    print_verdict(&verdict, policy, idx, n_creds);
    ce_policy_free(policy);
    if (fflush(stdout) != 0) {
      fprintf(stderr, PROG ": policy eval: cannot write the verdict\n");
      return CE_EXIT_FAIL;
    }
    return CE_EXIT_OK;
  }
  if (strcmp(sub, "help") == 0) {
    usage(stdout);
    return CE_EXIT_OK;
  }
  return usage_error("policy: unknown subcommand", sub);
}
