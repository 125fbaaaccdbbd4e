#!/usr/bin/env bash
# The suite under competing load, N times (default 3): every core is kept busy by another
# process (stress-ng where installed, else one shell busy loop per core) while `ctest -j NPROC`
# runs the whole suite, as CI's shared 2-core machines do. Reports each run's wall time and
# every test that failed (or timed out) at least once; exit 1 if any did.
#   tests/scripts/flake_check.sh [N] [--build DIR] [--load K] [-- CTEST ARGS...]
# --load K: K competing busy processes (default: one per core). Needs a built tree
# (launch/build.sh) and the tokenizer (launch/fetch_tokenizer.sh), as launch/test.sh leaves them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
runs=3
load=$(nproc)
ctest_args=()
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    [0-9]*) runs=$1; shift ;;
    *) echo "usage: $0 [N] [--build DIR] [--load K] [-- CTEST ARGS...]" >&2; exit 2 ;;
  esac
done
if [[ ! -f $build/CTestTestfile.cmake ]]; then
  echo "flake_check: no test tree in $build (run launch/build.sh)" >&2
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

loaders=()
stop_load() {
  ((${#loaders[@]})) && kill "${loaders[@]}" 2>/dev/null
  wait 2>/dev/null || true
}
trap stop_load EXIT
if ((load > 0)); then
  if command -v stress-ng > /dev/null; then
    stress-ng --cpu "$load" --quiet --timeout 0 &
    loaders+=($!)
  else
    for ((i = 0; i < load; ++i)); do
      sh -c 'while :; do :; done' &
      loaders+=($!)
    done
  fi
fi

out=$(mktemp -d)
declare -A failed_in=()
for ((run = 1; run <= runs; ++run)); do
  start=$(date +%s)
  status=0
  (cd "$build" && ctest -j "$(nproc)" --output-on-failure "${ctest_args[@]}") \
    > "$out/run$run.log" 2>&1 || status=$?
  took=$(($(date +%s) - start))
  # ctest's summary: "\t 63 - Name (Failed)", "(Timeout)", "(Subprocess aborted)", ...
  mapfile -t failures < <(sed -n '/The following tests FAILED:/,/^Errors while running/p' \
    "$out/run$run.log" | grep -E '^\s+[0-9]+ - ' | sed -E 's/^\s+[0-9]+ - //')
  summary=$(grep -E 'tests passed, [0-9]+ tests failed' "$out/run$run.log" || echo "no summary")
  printf 'run %d: %d s, ctest exit %d, %s\n' "$run" "$took" "$status" "$summary"
  # A ctest that failed without naming a test (it crashed, or found none) fails the run too.
  if ((status != 0 && ${#failures[@]} == 0)); then
    failures=("ctest itself (exit $status, no failed test named)")
  fi
  for f in "${failures[@]}"; do
    failed_in[$f]+=" $run"
    echo "  failed: $f"
  done
done
stop_load
trap - EXIT

echo "load: $load competing busy process(es) on $(nproc) cores; logs in $out"
if ((${#failed_in[@]} == 0)); then
  echo "flake_check: $runs of $runs runs green"
  exit 0
fi
echo "flake_check: tests that failed at least once:"
for f in "${!failed_in[@]}"; do echo "  $f: run(s)${failed_in[$f]}"; done
exit 1
