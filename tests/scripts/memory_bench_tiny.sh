#!/usr/bin/env bash
# bench/memory_bench.sh on its tiny model (TINY=1: 2 blocks, 16 tokens, one round of 3 steps
# per recompute mode and zero 0 / 1 on 4 MPI ranks, pp 2 × dp 2), so that the script cannot rot
# between the runs that measure: it runs every arm, reads each run's peaks and step times, and
# prints the table with the plan's per-stage peaks (in bytes, from `config memory`) beside the
# measured ones. Figures are not checked: this is the script's logic, not a measurement (on
# the tiny model the process before its model is nearly all of a rank's peak, so the arms'
# plans differ by less than its resident set does from one process to the next; how
# recomputation and ZeRO-1 change the plan is tested exactly in MemoryHeadroomTest and
# RecomputePlanTest).
# Usage: memory_bench_tiny.sh --build BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$root/build
[[ ${1:-} == --build ]] && build=$2
out=$(BUILD_DIR="$build" TINY=1 "$root/bench/memory_bench.sh" 1 3 1 2>&1) || {
  echo "$out"
  echo "FAIL: bench/memory_bench.sh exited non-zero"
  exit 1
}
echo "$out"
for zero in 0 1; do
  for mode in none selective full; do
    grep -Eq "^\| $mode \| $zero \| ([0-9.]+ / [0-9.]+ \| [-+][0-9.]+% \| ){2}[0-9.]+ ± nan \| [0-9.]+ ± nan \|$" <<<"$out" || {
      echo "FAIL: no table row for recompute $mode, zero $zero"
      exit 1
    }
  done
done
python3 - "$out" <<'PY'
import re, sys
plans = {arm: [int(a), int(b)] for arm, a, b in re.findall(r"^plan (\w+/\d) (\d+) (\d+) *$", sys.argv[1], re.M)}
assert len(plans) == 6, plans
assert all(p > 0 for peaks in plans.values() for p in peaks), plans
print("ok: stage 0 plans", {m: p[0] for m, p in plans.items()})
PY
