#!/usr/bin/env bash
# Activation recomputation (model.recompute) and ZeRO-1 (parallel.zero) on the CPU pipeline:
# peak resident memory per rank and step time with recompute none, selective and full, each
# with zero 0 and 1, measured on 4 MPI ranks (pp 2 × dp 2, 1F1B; DP=1: 2 ranks and zero 0
# only, ZeRO-1 needing replicas). ROUNDS rounds of one run per arm, the arms' order rotated
# each round; a run's figures are each stage's peak resident set at its last step
# (metrics.jsonl's host_peak_bytes: replica 0's rank of the stage) and its mean step time after
# the first WARMUP steps. Printed: per arm and stage the mean peak over rounds, beside the peak
# `freeride config memory` plans for that stage's rank (trainer/rank_memory.h: the process
# before its model, the chunk's model, slots and scratch, the moments or a ZeRO-1 rank's share,
# the message buffers, the batch, the buckets' copy and MPI's temporary) and the plan's error,
# and the mean step time with a 95% t-interval and its ratio to recompute none, zero 0.
# The model: 8 blocks of n_embd 256, 4 heads, a vocabulary of 4096, 8 micro-batches of one
# sequence of 512 random tokens per replica, one thread per rank (TINY=1: 2 blocks of n_embd 32
# and 16 tokens, the script's own check). ARCH=llama: the same shape as a Llama-family model
# (RMSNorm, rotary positions, SwiGLU of its default width, key/value heads half the heads).
# Log: bench/results/DATE-memory.log, DATE-memory-llama.log for ARCH=llama (TINY=1: not kept).
# Usage: [DP=2] [KIND=1f1b] [TINY=0] [ARCH=gpt2] bench/memory_bench.sh [ROUNDS=4] [STEPS=8] [WARMUP=2]
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"
bench_args 4 8 2 "$@"
dp=${DP:-2}
kind=${KIND:-1f1b}
tiny=${TINY:-0}
arch=${ARCH:-gpt2}
layers=8 embd=256 heads=4 vocab=4096 seq=512
((tiny)) && layers=2 embd=32 heads=2 vocab=512 seq=16
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
write_tokens "$work" "$vocab" train_000.bin:200000
log=/dev/null
if ((!tiny)); then
  mkdir -p bench/results
  log="bench/results/$(date +%F)-memory$([[ $arch == gpt2 ]] || echo "-$arch").log"
fi
exec > >(tee "$log") 2>&1
bench_header
zeros=(0 1)
((dp > 1)) || zeros=(0)
echo "== $((2 * dp)) MPI ranks, pp 2 × dp $dp, $kind; $arch, $layers blocks of n_embd $embd," \
  "8 micro-batches of 1 × $seq tokens; recompute none, selective, full; zero ${zeros[*]}"

settings=(--set "data.train=\"$work/train_*.bin\"" --set "data.val=\"\""
  --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads"
  --set model.vocab_size="$vocab" --set model.max_seq_len="$seq" --set parallel.pp=2
  --set parallel.dp="$dp" --set "parallel.schedule=\"$kind\""
  --set "parallel.partition=\"even\"" --set train.batch_size=8 --set train.microbatches=8
  --set train.seq_len="$seq" --set train.steps="$steps" --set eval.every=0
  --set checkpoint.every=0 --set run.log_every=1000 --set runtime.threads=1
  --set "model.arch=\"$arch\"")
if [[ $arch == llama ]]; then settings+=(--set model.n_kv_head=$((heads / 2))); fi

# The plan per stage in bytes: the peak that ends each "stage N: ..." line of the CPU
# backend's report ("peak 264.4 MiB"). An arm is "RECOMPUTE/ZERO".
plan() {
  "$build/freeride" config memory configs/tiny_cpu.toml "${settings[@]}" \
    --set "model.recompute=\"${1%/*}\"" --set parallel.zero="${1#*/}" |
    awk '/^host memory per rank on the CPU backend/ {cpu = 1; next}
         /^memory for side work/ {cpu = 0}
         cpu && /^stage / {n = split($0, f, " "); v = f[n - 1];
           s = f[n] == "GiB" ? 1073741824 : f[n] == "MiB" ? 1048576 : f[n] == "KiB" ? 1024 : 1;
           printf "%.0f ", v * s}'
}

run() {
  local arm=$1 dir="$work/run_${1/\//_}"
  rm -rf "$dir"
  BUILD_DIR="$build" launch/run.sh -n $((2 * dp)) configs/tiny_cpu.toml "${settings[@]}" \
    --set "model.recompute=\"${arm%/*}\"" --set parallel.zero="${arm#*/}" \
    --set "run.dir=\"$dir\"" > "$dir.log" 2>&1 || {
    echo "error: the $arm run failed; its output:" >&2
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

arms=()
for zero in "${zeros[@]}"; do
  for mode in none selective full; do arms+=("$mode/$zero"); done
done
declare -A plans
for arm in "${arms[@]}"; do plans[$arm]=$(plan "$arm"); done
for arm in "${arms[@]}"; do echo "plan $arm ${plans[$arm]}" | tee -a "$work/plans"; done
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < ${#arms[@]}; k++)); do
    arm=${arms[$(((r + k) % ${#arms[@]}))]}
    # An assignment of its own, so that a failed run (its exit inside $(...)) stops the bench
    # with its error rather than going on with empty figures.
    figures=$(run "$arm")
    echo "run $arm $r $figures" | tee -a "$work/results"
  done
done
python3 - "$work/results" "$work/plans" <<'PY'
import sys
from collections import defaultdict
from bench_stats import interval
runs = defaultdict(dict)  # round -> arm -> (step ms, [peak bytes per stage])
for line in open(sys.argv[1]):
    _, arm, r, step, *peaks = line.split()
    runs[int(r)][arm] = (float(step), [int(p) for p in peaks])
arms = sorted({a for v in runs.values() for a in v},
              key=lambda a: (a.split("/")[1], ("none", "selective", "full").index(a.split("/")[0])))
rs = [v for v in runs.values() if len(v) == len(arms)]
MiB = 1 << 20
plans = {}
for line in open(sys.argv[2]):
    _, arm, *bytes_ = line.split()
    plans[arm] = [int(b) for b in bytes_]
print("| recompute | zero | stage 0 peak RSS / plan, MiB | plan error | stage 1 peak RSS / plan, "
      "MiB | plan error | step ms | step / none, 0 |")
print("|---|---|---|---|---|---|---|---|")
for arm in arms:
    peaks = [sum(v[arm][1][s] for v in rs) / len(rs) for s in range(2)]
    cells = []
    for s in range(2):
        plan = plans[arm][s]
        cells.append(f"{peaks[s] / MiB:.1f} / {plan / MiB:.1f} | {(plan / peaks[s] - 1) * 100:+.1f}%")
    step = interval([v[arm][0] for v in rs])
    ratio = interval([v[arm][0] / v["none/0"][0] for v in rs])
    mode, zero = arm.split("/")
    print(f"| {mode} | {zero} | {cells[0]} | {cells[1]} | {step[0]:.1f} ± {step[1]:.1f} "
          f"| {ratio[0]:.3f} ± {ratio[1]:.3f} |")
PY
bench_footer "$log"
