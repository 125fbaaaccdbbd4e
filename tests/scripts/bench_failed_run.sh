#!/usr/bin/env bash
# A bench whose run fails stops at that run, with its error: bench/zero_overlap_bench.sh on its
# tiny model with a schedule no config accepts (KIND=no_such_schedule), so that its first run
# fails. It must exit non-zero after that one run, print the run's own error (freeride's,
# naming the schedule) and no figures. Its run() exits inside $(...), which used to end only
# that subshell: the bench went on with empty figures through every other run, to a traceback.
# Usage: tests/scripts/bench_failed_run.sh --build BUILD_DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 0 "$@"
out=$(BUILD_DIR="$build" TINY=1 KIND=no_such_schedule "$root/bench/zero_overlap_bench.sh" 1 2 1 \
  2>&1)
rc=$?
echo "$out"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
((rc != 0)) || fail "the bench exited 0 although its runs failed"
runs=$(grep -c '^error: the [a-z]* run failed' <<<"$out")
[[ $runs == 1 ]] || fail "$runs runs failed before the bench stopped, not the first alone"
grep -q 'no_such_schedule' <<<"$out" || fail "the failed run's own error is not shown"
! grep -qE '^run [a-z]+ [0-9]|^\| (overlapped|blocking) |Traceback' <<<"$out" ||
  fail "the bench went on after the failed run (figures, a table or a traceback above)"
if ((failures > 0)); then
  exit 1
fi
echo "bench_failed_run: the bench stopped at its failed run, with its error"
