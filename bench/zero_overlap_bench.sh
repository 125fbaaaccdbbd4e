#!/usr/bin/env bash
# ZeRO-1's all-gather overlapped with the next step (parallel.zero_overlap = true) against the
# gather waited for at the end of the update (false): step time of the CPU pipeline, 4 MPI
# ranks (pp 2 × dp 2, parallel.zero = 1), memory_bench.sh's model (8 blocks of n_embd 256, 4
# heads, a vocabulary of 4096, 8 micro-batches of one sequence of 512 random tokens per
# replica, one thread per rank). ROUNDS rounds of one run per arm, their order swapped every
# round (ABBA); a run's figure is its mean step time after the first WARMUP steps and each
# stage's mean waiting (bubble_s). Printed: per arm the mean step with a 95% t-interval, and the
# paired ratio overlapped / blocking over rounds with its interval. TINY=1: 2 blocks of n_embd
# 32 and 16 tokens, the script's own check.
# Log: bench/results/DATE-zero-overlap.log (TINY=1: not kept).
# Usage: [KIND=1f1b] [TINY=0] bench/zero_overlap_bench.sh [ROUNDS=4] [STEPS=8] [WARMUP=2]
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"
bench_args 4 8 2 "$@"
kind=${KIND:-1f1b}
tiny=${TINY:-0}
layers=8 embd=256 heads=4 vocab=4096 seq=512
((tiny)) && layers=2 embd=32 heads=2 vocab=512 seq=16
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
write_tokens "$work" "$vocab" train_000.bin:200000
log=/dev/null
if ((!tiny)); then
  mkdir -p bench/results
  log="bench/results/$(date +%F)-zero-overlap.log"
fi
exec > >(tee "$log") 2>&1
bench_header
echo "== 4 MPI ranks, pp 2 × dp 2, $kind, zero 1; $layers blocks of n_embd $embd," \
  "8 micro-batches of 1 × $seq tokens; zero_overlap true / false"

settings=(--set "data.train=\"$work/train_*.bin\"" --set "data.val=\"\""
  --set model.n_layer="$layers" --set model.n_embd="$embd" --set model.n_head="$heads"
  --set model.vocab_size="$vocab" --set model.max_seq_len="$seq" --set parallel.pp=2
  --set parallel.dp=2 --set parallel.zero=1 --set "parallel.schedule=\"$kind\""
  --set "parallel.partition=\"even\"" --set train.batch_size=8 --set train.microbatches=8
  --set train.seq_len="$seq" --set train.steps="$steps" --set eval.every=0
  --set checkpoint.every=0 --set run.log_every=1000 --set runtime.threads=1)

run() {
  local arm=$1 dir="$work/run_$1"
  rm -rf "$dir"
  BUILD_DIR="$build" launch/run.sh -n 4 configs/tiny_cpu.toml "${settings[@]}" \
    --set parallel.zero_overlap="$([[ $arm == overlapped ]] && echo true || echo false)" \
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
waits = [sum(r["bubble_s"][s] for r in timed) / len(timed) * 1e3 for s in range(2)]
print(f"{step:.3f} {waits[0]:.3f} {waits[1]:.3f}")
PY
}

arms=(overlapped blocking)
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < 2; k++)); do
    arm=${arms[$(((r + k) % 2))]}
    # An assignment of its own, so that a failed run (its exit inside $(...)) stops the bench
    # with its error rather than going on with empty figures.
    figures=$(run "$arm")
    echo "run $arm $r $figures" | tee -a "$work/results"
  done
done
python3 - "$work/results" <<'PY'
import sys
from collections import defaultdict
from bench_stats import interval
runs = defaultdict(dict)  # round -> arm -> (step ms, stage 0 waits ms, stage 1 waits ms)
for line in open(sys.argv[1]):
    _, arm, r, *figures = line.split()
    runs[int(r)][arm] = [float(f) for f in figures]
rs = [v for v in runs.values() if len(v) == 2]
print("| zero_overlap | step ms | stage 0 waits ms | stage 1 waits ms | step / blocking |")
print("|---|---|---|---|---|")
for arm in ("overlapped", "blocking"):
    step = interval([v[arm][0] for v in rs])
    ratio = interval([v[arm][0] / v["blocking"][0] for v in rs])
    w0 = sum(v[arm][1] for v in rs) / len(rs)
    w1 = sum(v[arm][2] for v in rs) / len(rs)
    print(f"| {arm} | {step[0]:.1f} ± {step[1]:.1f} | {w0:.1f} | {w1:.1f} "
          f"| {ratio[0]:.3f} ± {ratio[1]:.3f} |")
PY
bench_footer "$log"
