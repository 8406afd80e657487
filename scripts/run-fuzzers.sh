#!/bin/sh
# Runs each libFuzzer binary for a bounded time from its committed seed
# corpus (native_test/fuzz/corpus/NAME). New inputs go to a scratch copy so
# the tree stays clean; a crash leaves its reproducer in build/fuzz/crashes/
# and fails the run.
#   usage: run-fuzzers.sh SECONDS BIN...
set -eu
seconds=$1
shift
[ "$#" -gt 0 ] || { echo "fuzz: no targets"; exit 0; }
crashes=build/fuzz/crashes
mkdir -p "$crashes"
for bin in "$@"; do
  name=$(basename "$bin")
  seeds=native_test/fuzz/corpus/$name
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if [ -d "$seeds" ]; then cp -r "$seeds/." "$work/"; fi
  echo "fuzz: $name for ${seconds}s"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/$name-" -print_final_stats=1 "$work" \
      >"$work.log" 2>&1 || {
        tail -60 "$work.log"
        echo "fuzz: $name failed; reproducer in $crashes" >&2
        rm -f "$work.log"
        exit 1
      }
  grep -E '^(stat::number_of_executed_units|#[0-9]+ *DONE)' "$work.log" | tail -2 || true
  rm -rf "$work" "$work.log"
  trap - EXIT
done
