#!/usr/bin/env bash
# The GPU procedure (bench/gpu/) in its dry run, so that it cannot rot between the rare GPU
# runs: every step's logic on this machine with the CPU build standing in. Passes when each step
# exits 0 and leaves its log and its time (estimate beside what it took) in the output folder.
# Usage: tests/scripts/gpu_procedure_dry_run.sh --build BUILD_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rc=0
for step in preflight build test bench study; do
  BUILD_DIR=$build "$root/bench/gpu/$step.sh" "$out" --dry-run >/dev/null 2>&1
  status=$?
  if [[ $status != 0 || ! -s $out/$step.log || ! -s $out/$step.time ]]; then
    echo "FAIL: bench/gpu/$step.sh --dry-run: exit $status; its log:"
    cat "$out/$step.log" 2>/dev/null
    rc=1
  else
    cat "$out/$step.time"
  fi
done
exit $rc
