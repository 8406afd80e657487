#!/bin/sh
# Runs each libFuzzer binary for a bounded time from its committed seed
# corpus (native_test/fuzz/corpus/NAME). New inputs go to a scratch copy;
# a crash leaves its reproducer in build/fuzz/crashes/ and fails the run.
#
# With FUZZ_MERGE=1 (`make fuzz`), the inputs found that reach code the
# committed corpus does not are merged back into it afterwards
# (libFuzzer's -merge=1: only inputs adding coverage, so the corpus stays
# small); without it (`make fuzz-smoke`) the tree stays clean.
#   usage: run-fuzzers.sh SECONDS BIN...
set -eu
seconds=$1
shift
[ "$#" -gt 0 ] || { echo "fuzz: no targets"; exit 0; }
merge=${FUZZ_MERGE:-0}
crashes=build/fuzz/crashes
mkdir -p "$crashes"
total=0
for bin in "$@"; do
  name=$(basename "$bin")
  seeds=native_test/fuzz/corpus/$name
  work=$(mktemp -d)
  trap 'rm -rf "$work" "$work.log"' EXIT
  if [ -d "$seeds" ]; then cp -r "$seeds/." "$work/"; fi
  echo "fuzz: $name for ${seconds}s"
  start=$(date +%s)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/$name-" -print_final_stats=1 "$work" \
      >"$work.log" 2>&1 || {
        tail -60 "$work.log"
        echo "fuzz: $name failed; reproducer in $crashes" >&2
        exit 1
      }
  total=$((total + $(date +%s) - start))
  grep -E '^(stat::number_of_executed_units|#[0-9]+ *DONE)' "$work.log" | tail -2 || true
  if [ "$merge" = 1 ]; then
    mkdir -p "$seeds"
    before=$(ls "$seeds" | wc -l)
    "$bin" -merge=1 -timeout=10 -rss_limit_mb=2048 "$seeds" "$work" >"$work.log" 2>&1 || {
      tail -30 "$work.log"
      echo "fuzz: merging $name's corpus failed" >&2
      exit 1
    }
    echo "fuzz: $name: corpus $before -> $(ls "$seeds" | wc -l) files ($(du -sk "$seeds" | cut -f1) KiB)"
  fi
  rm -rf "$work" "$work.log"
  trap - EXIT
done
echo "fuzz: $# target(s), ${total} s of fuzzing (one core each, one after the other)"
