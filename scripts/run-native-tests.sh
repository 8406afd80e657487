#!/bin/sh
# Runs the Criterion suite built with ASan/UBSan/LSan and fails on any
# sanitizer report. Criterion alone is not enough: LeakSanitizer reports at
# a worker's exit, after the test has been counted as passed, and Criterion
# only prints "crashed during its setup or teardown". So the output is kept
# and scanned as well as the exit status.
set -u
bin=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT

"$bin" "$@" >"$log" 2>&1
status=$?
cat "$log"

if grep -qE 'Sanitizer|runtime error:|crashed during its setup or teardown' "$log"; then
  echo "native tests: a sanitizer report (above) fails the run" >&2
  exit 1
fi
exit $status
