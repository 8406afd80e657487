#!/bin/sh
# Starts the Kubernetes tier's two slow, cached builds (binaries.sh: the
# control plane, the node and its add-ons; images.sh: the node's images)
# in the background and returns at once, so that on a cold cache they use
# the CPU that the C tests, the fuzzers, the Virtual NIF's build and the
# first part of the ExUnit run leave idle (the Go builds run under
# `nice -n 19`, so the tests keep their CPU).
#
#   sh scripts/k8s/prebuild.sh        start what is missing; exit 0
#
# `make elixir-test` calls both scripts again in the foreground before the
# Kubernetes part of the ExUnit run: each takes its cache's lock, so that
# call waits for the background build and prints the directory; when the
# background build failed, the foreground call builds again and its errors
# are shown there. Nothing is started when both caches are complete.
# The background output goes to build/k8s-prebuild.log.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
if sh "$HERE/binaries.sh" --check >/dev/null 2>&1 && sh "$HERE/images.sh" --check >/dev/null 2>&1; then
  exit 0
fi
mkdir -p "$ROOT/build"
log=$ROOT/build/k8s-prebuild.log
echo "k8s-prebuild: building the Kubernetes tier's binaries and images in the background (log: $log)" >&2
# Detached from make's output (a CI harness reading the pipe must not wait
# for it) and from the terminal.
nohup sh -c '
  here=$1
  sh "$here/binaries.sh" >/dev/null & b=$!
  sh "$here/images.sh" >/dev/null & i=$!
  rc=0
  wait "$b" || rc=1
  wait "$i" || rc=1
  echo "k8s-prebuild: ended at $(date -u +%H:%M:%S) (status $rc)" >&2
' k8s-prebuild "$HERE" </dev/null >>"$log" 2>&1 &
