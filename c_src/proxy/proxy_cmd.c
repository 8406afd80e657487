/* Placeholder until this command is implemented (issue 3). */
#include <stdio.h>

#include "cli/cli.h"

int ce_cmd_proxy(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "condukt-egress: %s is not implemented yet\n", argv[0]);
  return CE_EXIT_FAIL;
}
