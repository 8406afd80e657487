/*
 * `condukt-egress policy`: check or dry-run a sidecar policy document.
 *
 *   condukt-egress policy check FILE              exit 0, or 1 + error line
 *   condukt-egress policy eval FILE URL_OR_HOST   one JSON verdict on stdout
 *
 * Exit codes follow cli.h: 1 when the document is refused (the loader's
 * one-line message on stderr, prefixed "condukt-egress: FILE: "), 2 for a
 * bad command line. The eval output format is fixed by docs/policy-json.md
 * ("policy eval output"); the Elixir side and operators parse it.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "policy/policy.h"

#define PROG "condukt-egress"

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " policy check FILE\n"
          "       " PROG " policy eval FILE URL_OR_HOST\n"
          "\n"
          "  check  validate a sidecar policy document (docs/policy-json.md)\n"
          "  eval   print the verdict for a URL or host[:port] as one JSON line\n");
}

/* Prints "condukt-egress: WHAT 'WORD'" (WORD may be NULL) and the usage. */
static int usage_error(const char *what, const char *word) {
  if (word != NULL)
    fprintf(stderr, PROG ": %s '%s'\n", what, word);
  else
    fprintf(stderr, PROG ": %s\n", what);
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

/* Every member is either a fixed word, an integer or the normalised host,
 * whose bytes are limited to [a-z0-9._*:-] by host.c, so nothing needs JSON
 * escaping. */
static void print_verdict(const ce_verdict_t *v) {
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
  printf("}\n");
}

int ce_cmd_policy(int argc, char **argv) {
  /* Options are not part of this command's grammar; refusing every word
   * that starts with '-' keeps "-" or "--help" from being read as a file. */
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] == '-')
      return usage_error("policy: unknown option", argv[i]);
  }
  if (argc < 2)
    return usage_error("policy: missing subcommand (check or eval)", NULL);

  const char *sub = argv[1];
  if (strcmp(sub, "check") == 0) {
    if (argc < 3)
      return usage_error("policy check: missing FILE", NULL);
    if (argc > 3)
      return usage_error("policy check: unexpected argument", argv[3]);
    ce_policy_t *policy = NULL;
    int code = load(argv[2], &policy);
    ce_policy_free(policy);
    return code;
  }
  if (strcmp(sub, "eval") == 0) {
    if (argc < 3)
      return usage_error("policy eval: missing FILE", NULL);
    if (argc < 4)
      return usage_error("policy eval: missing URL_OR_HOST", NULL);
    if (argc > 4)
      return usage_error("policy eval: unexpected argument", argv[4]);
    ce_policy_t *policy = NULL;
    int code = load(argv[2], &policy);
    if (code != CE_EXIT_OK)
      return code;
    ce_verdict_t verdict;
    int rc = ce_policy_eval_input(policy, argv[3], strlen(argv[3]), &verdict);
    ce_policy_free(policy);
    if (rc != 0) {
      fprintf(stderr, PROG ": policy eval: %s\n", ce_strerror(rc));
      return CE_EXIT_FAIL;
    }
    print_verdict(&verdict);
    if (fflush(stdout) != 0) {
      fprintf(stderr, PROG ": policy eval: cannot write the verdict\n");
      return CE_EXIT_FAIL;
    }
    return CE_EXIT_OK;
  }
  if (strcmp(sub, "help") == 0)
    return usage_error("policy: not a subcommand (the usage follows)", sub);
  return usage_error("policy: unknown subcommand", sub);
}
