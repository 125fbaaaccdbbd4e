#!/usr/bin/env bash
# The data-parallel sum in buckets (parallel.dp_bucket_mb) against one sum per chunk, measured
# on 2 MPI ranks (pp 1, dp 2, launch/run.sh binds each to a core). ROUNDS rounds of one run
# without buckets and one with BUCKET_MB MiB buckets, in alternating order; a run's figure is
# the mean step time over its steps after the first WARMUP, and its mean waiting time
# (bubble_s, both ranks). Printed: each mean over rounds with a 95% t-interval, and the paired
# ratio bucketed / unbucketed with its interval.
# The model: 8 blocks of n_embd 256 and a vocabulary of 4096 (about 29 MB of gradients), 8
# micro-batches of one sequence of 64 random tokens, one thread per rank.
# Log: bench/results/DATE-dp-buckets.log.
# Usage: [BUCKET_MB=4] [KIND=1f1b] bench/dp_bucket_bench.sh [ROUNDS=8] [STEPS=16] [WARMUP=3]
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"
bench_args 8 16 3 "$@"
bucket_mb=${BUCKET_MB:-4}
kind=${KIND:-1f1b}
mkdir -p bench/results runs
data=$(mktemp -d)
results=$(mktemp)
trap 'rm -rf "$data" "$results"' EXIT
write_tokens "$data" 4096 train_000.bin:400000
log="bench/results/$(date +%F)-dp-buckets.log"
exec > >(tee "$log") 2>&1
bench_header
echo "== 2 MPI ranks, pp 1 × dp 2, $kind; dp_bucket_mb 0 against $bucket_mb"

run() {
  local mb=$1 dir="runs/dp_buckets_$1"
  rm -rf "$dir"
  BUILD_DIR="$build" launch/run.sh -n 2 configs/tiny_cpu.toml \
    --set "data.train=\"$data/train_*.bin\"" --set "data.val=\"\"" \
    --set model.n_layer=8 --set model.n_embd=256 --set model.n_head=4 \
    --set model.vocab_size=4096 --set parallel.pp=1 --set parallel.dp=2 \
    --set "parallel.schedule=\"$kind\"" --set parallel.dp_bucket_mb="$mb" \
    --set train.batch_size=8 --set train.microbatches=8 --set train.seq_len=64 \
    --set train.steps="$steps" --set eval.every=0 --set checkpoint.every=0 \
    --set run.log_every=1000 --set runtime.threads=1 --set "run.dir=\"$dir\"" \
    > "$dir.log" 2>&1
  python3 - "$dir/metrics.jsonl" "$warmup" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"kind": "train"' in l]
rows = [r for r in rows if r["step"] > int(sys.argv[2])]
step = sum(r["step_s"] for r in rows) / len(rows) * 1e3
wait = sum(sum(r["bubble_s"]) for r in rows) / len(rows) * 1e3 / 2
print(f"{step:.3f} {wait:.3f}")
EOF
}

for ((r = 0; r < rounds; r++)); do
  order=(0 "$bucket_mb")
  ((r % 2 == 1)) && order=("$bucket_mb" 0)
  for mb in "${order[@]}"; do
    line=$(run "$mb")
    echo "$mb $r $line" | tee -a "$results"
  done
done
python3 - "$results" "$bucket_mb" <<'EOF'
import sys
from collections import defaultdict
from bench_stats import interval
runs = defaultdict(dict)  # round -> bucket MiB -> [step ms, wait ms]
for line in open(sys.argv[1]):
    mb, r, step, wait = line.split()
    runs[int(r)]["0" if float(mb) == 0 else "b"] = [float(step), float(wait)]
rs = [v for v in runs.values() if len(v) == 2]
s0 = interval([v["0"][0] for v in rs]); sb = interval([v["b"][0] for v in rs])
w0 = interval([v["0"][1] for v in rs]); wb = interval([v["b"][1] for v in rs])
ratio = interval([v["b"][0] / v["0"][0] for v in rs])
print(f"| step ms, one sum | step ms, {sys.argv[2]} MiB buckets | bucketed / one sum "
      "| wait ms per rank, one sum / buckets |")
print("|---|---|---|---|")
print(f"| {s0[0]:.1f} ± {s0[1]:.1f} | {sb[0]:.1f} ± {sb[1]:.1f} | {ratio[0]:.3f} ± {ratio[1]:.3f} "
      f"| {w0[0]:.1f} ± {w0[1]:.1f} / {wb[0]:.1f} ± {wb[1]:.1f} |")
EOF
echo "== done $(date -u); load $(cut -d' ' -f1-3 /proc/loadavg); log $log"
