#!/bin/sh
# `make bench`: installs the peers (bench/setup.sh), builds the release
# sidecar, runs bench/run.exs with the given arguments (--quick for a short
# run; bench/README.md), or bench/soak.exs when the first argument is
# --soak (`make soak`), or bench/wakeups.exs when it is --wakeups (`make
# bench-wakeups`), and whatever happens (failure, Ctrl-C) removes the
# testbed's namespaces, the processes inside them and their iptables rules
# afterwards.
set -eu
cd "$(dirname "$0")/.."

sh bench/setup.sh
make -s priv/condukt-egress
mix compile

cleanup() {
  # The run's BEAM is gone by now, so Testbed.sweep/0 sees its testbed as
  # a dead run's leftovers and removes it (namespaces, the processes in
  # them, /etc/netns entries, the temporary directory). Testbeds of live
  # runs (other users of the machine) are left alone.
  mix run --no-compile --no-start bench/cleanup.exs || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# +Bd: Ctrl-C ends the BEAM at once (no break menu), then the trap cleans
# up. The BEAM (the ControlBridge and its decider included) shares CPU 1
# with the load generator; CPU 0 is the proxy's alone.
script=bench/run.exs
case "${1:-}" in
  --soak) script=bench/soak.exs; shift ;;
  --wakeups) script=bench/wakeups.exs; shift ;;
esac
ELIXIR_ERL_OPTIONS="+Bd" taskset -c 1 mix run "$script" "$@"
