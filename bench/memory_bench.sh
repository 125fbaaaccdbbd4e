#!/usr/bin/env bash
# Activation recomputation (model.recompute) on the CPU pipeline: peak resident memory per rank
# and step time with recompute none, selective and full, measured on 2 MPI ranks (pp 2, 1F1B;
# DP=2: 4 ranks, pp 2 × dp 2). ROUNDS rounds of one run per mode, the modes' order rotated
# each round; a run's figures are each stage's peak resident set at its last step
# (metrics.jsonl's host_peak_bytes, replica 0) and its mean step time after the first WARMUP
# steps. Printed: per mode and stage the mean peak over rounds, beside what `freeride config
# memory` plans for that stage (the CPU backend's model, moments and slots; the process's code,
# libraries, message buffers and batch are not in it), and the mean step time with a 95%
# t-interval and its ratio to none.
# The model: 8 blocks of n_embd 256, 4 heads, a vocabulary of 4096, 8 micro-batches of one
# sequence of 512 random tokens, one thread per rank (TINY=1: 2 blocks of n_embd 32 and 16
# tokens, the script's own check).
# Log: bench/results/DATE-memory.log (TINY=1: not kept).
# Usage: [DP=1] [KIND=1f1b] [TINY=0] bench/memory_bench.sh [ROUNDS=4] [STEPS=8] [WARMUP=2]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-$root/build}
rounds=${1:-4}
steps=${2:-8}
warmup=${3:-2}
dp=${DP:-1}
kind=${KIND:-1f1b}
tiny=${TINY:-0}
if ((warmup >= steps)); then
  echo "error: WARMUP ($warmup) must be below STEPS ($steps)" >&2
  exit 2
fi
layers=8 embd=256 heads=4 vocab=4096 seq=512
((tiny)) && layers=2 embd=32 heads=2 vocab=512 seq=16
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" "$vocab" <<'PY'
import random, struct, sys
random.seed(7)
n = 200000
header = [20240520, 1, n] + [0] * 253
with open(f"{sys.argv[1]}/train_000.bin", "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{n}H", *[random.randrange(int(sys.argv[2])) for _ in range(n)]))
PY
log=/dev/null
if ((!tiny)); then
  mkdir -p bench/results
  log="bench/results/$(date +%F)-memory.log"
fi
exec > >(tee "$log") 2>&1
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) CPUs;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); rounds $rounds, steps $steps, warm-up $warmup"
echo "== $((2 * dp)) MPI ranks, pp 2 × dp $dp, $kind; $layers blocks of n_embd $embd," \
  "8 micro-batches of 1 × $seq tokens; recompute none, selective, full"

settings=(--set "data.train=\"$work/train_*.bin\"" --set "data.val=\"\""
  --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads"
  --set model.vocab_size="$vocab" --set model.max_seq_len="$seq" --set parallel.pp=2
  --set parallel.dp="$dp" --set "parallel.schedule=\"$kind\""
  --set "parallel.partition=\"even\"" --set train.batch_size=8 --set train.microbatches=8
  --set train.seq_len="$seq" --set train.steps="$steps" --set eval.every=0
  --set checkpoint.every=0 --set run.log_every=1000 --set runtime.threads=1)

# The plan per stage: the last field of each "stage N: ..." line of the CPU backend's report.
plan() {
  "$build/freeride" config memory configs/tiny_cpu.toml "${settings[@]}" \
    --set "model.recompute=\"$1\"" |
    awk '/^host memory per rank on the CPU backend/ {cpu = 1; next}
         cpu && /^stage / {n = split($0, f, "; "); printf "%s ", f[n]}'
}

run() {
  local mode=$1 dir="$work/run_$1"
  rm -rf "$dir"
  BUILD_DIR="$build" launch/run.sh -n $((2 * dp)) configs/tiny_cpu.toml "${settings[@]}" \
    --set "model.recompute=\"$mode\"" --set "run.dir=\"$dir\"" > "$dir.log" 2>&1 || {
    echo "error: the $mode run failed; its output:" >&2
    tail -20 "$dir.log" >&2
    exit 1
  }
  python3 - "$dir/metrics.jsonl" "$warmup" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"kind": "train"' in l]
timed = [r for r in rows if r["step"] > int(sys.argv[2])]
step = sum(r["step_s"] for r in timed) / len(timed) * 1e3
peaks = " ".join(str(b) for b in rows[-1]["host_peak_bytes"])
print(f"{step:.3f} {peaks}")
PY
}

modes=(none selective full)
declare -A plans
for mode in "${modes[@]}"; do plans[$mode]=$(plan "$mode"); done
for mode in "${modes[@]}"; do echo "plan $mode: ${plans[$mode]}"; done
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < 3; k++)); do
    mode=${modes[$(((r + k) % 3))]}
    echo "run $mode $r $(run "$mode")" | tee -a "$work/results"
  done
done
python3 - "$work/results" <<'PY'
import math, sys
from collections import defaultdict
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
def interval(xs):
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, T95.get(n - 1, 1.96) * sd / math.sqrt(n)
runs = defaultdict(dict)  # round -> mode -> (step ms, [peak bytes per stage])
for line in open(sys.argv[1]):
    _, mode, r, step, *peaks = line.split()
    runs[int(r)][mode] = (float(step), [int(p) for p in peaks])
rs = [v for v in runs.values() if len(v) == 3]
MiB = 1 << 20
print("| recompute | peak RSS stage 0, MiB | peak RSS stage 1, MiB | step ms | step / none |")
print("|---|---|---|---|---|")
for mode in ("none", "selective", "full"):
    peaks = [sum(v[mode][1][s] for v in rs) / len(rs) / MiB for s in range(2)]
    step = interval([v[mode][0] for v in rs])
    ratio = interval([v[mode][0] / v["none"][0] for v in rs])
    print(f"| {mode} | {peaks[0]:.1f} | {peaks[1]:.1f} | {step[0]:.1f} ± {step[1]:.1f} "
          f"| {ratio[0]:.3f} ± {ratio[1]:.3f} |")
PY
echo "== done $(date -u); load $(cut -d' ' -f1-3 /proc/loadavg); log $log"
