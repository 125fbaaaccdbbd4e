#!/usr/bin/env bash
# bench/memory_bench.sh on its tiny model (TINY=1: 2 blocks, 16 tokens, one round of 3 steps
# per recompute mode and zero 0 / 1 on 4 MPI ranks, pp 2 × dp 2), so that the script cannot rot
# between the runs that measure: it runs every arm, reads each run's peaks and step times, and
# prints the table with the plan's per-stage figures, stage 0's smaller under full than under
# none (it holds 2 micro-batches in 1F1B) with zero 0 and 1 (at dp 2 zero 1's plan is about
# zero 0's: half the moments less, the buckets' copy of the gradients more). Figures are not
# checked: this is the script's logic, not a measurement.
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
    grep -Eq "^\| $mode \| $zero \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ ± nan \| [0-9.]+ ± nan \|$" <<<"$out" || {
      echo "FAIL: no table row for recompute $mode, zero $zero"
      exit 1
    }
  done
done
python3 - "$out" <<'PY'
import re, sys
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
plans = {}
for arm, text in re.findall(r"^plan (\w+/\d): (.*)$", sys.argv[1], re.M):
    plans[arm] = [float(v) * units[u] for v, u in re.findall(r"([0-9.]+) (B|KiB|MiB|GiB)", text)]
assert len(plans) == 6, plans
assert all(len(p) == 2 for p in plans.values()), plans
for zero in "01":
    assert plans[f"full/{zero}"][0] < plans[f"selective/{zero}"][0] < plans[f"none/{zero}"][0], plans
print("ok: stage 0 plans", {m: p[0] for m, p in plans.items()})
PY
