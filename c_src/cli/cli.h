/*
 * Subcommands of condukt-egress. Each takes the arguments after its own
 * name (argv[0] is the subcommand name) and returns the process exit code:
 * 0 success, 1 the operation failed (message on stderr), 2 usage error.
 */
#ifndef CE_CLI_CLI_H
#define CE_CLI_CLI_H

#define CE_EXIT_OK 0
#define CE_EXIT_FAIL 1
#define CE_EXIT_USAGE 2

/* `condukt-egress policy check FILE` and `policy eval FILE URL`. */
int ce_cmd_policy(int argc, char **argv);

#endif
