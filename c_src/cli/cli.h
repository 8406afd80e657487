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

/* `condukt-egress proxy [options]`: the sidecar data plane (docs/proxy.md). */
int ce_cmd_proxy(int argc, char **argv);

/* `condukt-egress ready [--listen ADDR:PORT]... [--control EP]`: exit 0 when
 * the sidecar accepts connections (the pod's startupProbe; docs/cli.md). */
int ce_cmd_ready(int argc, char **argv);

/* `condukt-egress netfilter-setup [options]`: the init container's
 * iptables/ip6tables rules (docs/netfilter.md). */
int ce_cmd_netfilter_setup(int argc, char **argv);

/* `condukt-egress ca new ...`: a per-session CA (docs/tls.md). */
int ce_cmd_ca(int argc, char **argv);

/* `condukt-egress port`: the BEAM's port program, {packet, 4} terms on
 * stdin/stdout (docs/port-protocol.md). */
int ce_cmd_port(int argc, char **argv);

#endif
