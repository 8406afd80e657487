/*
 * condukt-egress: the native core of Condukt's network policy.
 *
 * One binary, several modes (docs/cli.md). This file only dispatches on the
 * first argument; every mode lives in its own subsystem folder.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#ifndef CE_VERSION
#define CE_VERSION "0.0.0-dev"
#endif

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} ce_command_t;

static const ce_command_t commands[] = {
    {"policy", ce_cmd_policy, "check or dry-run a sidecar policy document"},
    {"proxy", ce_cmd_proxy, "run the sidecar data plane"},
    {"ready", ce_cmd_ready, "exit 0 once the sidecar accepts connections (startupProbe)"},
    {"netfilter-setup", ce_cmd_netfilter_setup,
     "install the iptables/ip6tables interception rules"},
    {"ca", ce_cmd_ca, "create a per-session certificate authority"},
    {"port", ce_cmd_port, "the BEAM's port program (Erlang terms on stdin/stdout)"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: condukt-egress <command> [args...]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "  %-16s %s\n", "version", "print the version");
  fprintf(out, "  %-16s %s\n", "help", "print this message");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CE_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
      strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return CE_EXIT_OK;
  }
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("condukt-egress %s\n", CE_VERSION);
    return CE_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
    if (strcmp(cmd, commands[i].name) == 0)
      return commands[i].run(argc - 1, argv + 1);
  }
  fprintf(stderr, "condukt-egress: unknown command '%s'\n", cmd);
  usage(stderr);
  return CE_EXIT_USAGE;
}
