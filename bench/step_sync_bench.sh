#!/usr/bin/env bash
# Barrier against post-validated step ends (optim.step_sync), measured per schedule kind on
# two CPU pipelines: 4 stages in one process (stage 0 real, the others emulated from their
# measured costs) and 2 MPI ranks through launch/run.sh (both stages real, bound to cores).
# Each (pipeline, kind) runs ROUNDS rounds of one barrier run and one post-validated run, in
# alternating order; a run's figure is the mean over its steps after the first WARMUP of the
# step time and of each real stage's waiting time (bubble_s). Printed: per kind the mean over
# rounds with a 95% t-interval, and the paired ratio post / barrier with its interval.
# The model: 8 blocks of n_embd 256 and a vocabulary of 4096 (a head of about one block, so the
# bubbles are the schedule's own more than the head's), split evenly, 8 micro-batches of one
# sequence of 64 random tokens; gradient clipping off (emulated peers send synthetic gradients
# whose norm means nothing: with it on every step would be rolled back); one thread per rank
# (on a loaded machine OpenMP's spinning threads made a step of 2 threads 40× slower).
# One log per pipeline: bench/results/DATE-step-sync-PIPELINE.log.
# Usage: [PIPELINES="emulated two_ranks"] [KINDS="gpipe 1f1b ..."] \
#   bench/step_sync_bench.sh [ROUNDS=8] [STEPS=24] [WARMUP=4]
source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"
bench_args 8 24 4 "$@"
pipelines=${PIPELINES:-emulated two_ranks}
exec 3>&1  # each pipeline's log gets only its own lines
kinds=${KINDS:-gpipe 1f1b interleaved zbh1 zbh2 zbv dualpipev}
mkdir -p bench/results runs
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
write_tokens "$data" 4096 train_000.bin:400000 val_000.bin:40000
common=(--set "data.train=\"$data/train_*.bin\"" --set "data.val=\"$data/val_*.bin\""
        --set model.n_layer=8 --set model.n_embd=256 --set model.n_head=4
        --set model.vocab_size=4096 --set parallel.partition=\"even\"
        --set train.batch_size=8 --set train.microbatches=8 --set train.seq_len=64
        --set train.steps="$steps" --set eval.every=0 --set checkpoint.every=0
        --set optim.grad_clip=0 --set run.log_every=1000 --set runtime.threads=1)

# One run; prints "step_ms bubble_ms..." (means over the steps after the warm-up).
run() {
  local setup=$1 kind=$2 sync=$3 dir="runs/step_sync_${1}_${2}_${3}"
  local chunks=1
  [ "$kind" = interleaved ] && chunks=2
  local sets=("${common[@]}" --set "parallel.schedule=\"$kind\"" --set parallel.chunks=$chunks
              --set "optim.step_sync=\"$sync\"" --set "run.dir=\"$dir\"")
  rm -rf "$dir"
  if [ "$setup" = emulated ]; then
    "$build/freeride" train --config configs/tiny_cpu.toml --set parallel.pp=4 \
      --set runtime.emulate_peers=true "${sets[@]}" > "$dir.log" 2>&1
  else
    launch/run.sh -n 2 configs/tiny_cpu.toml --set parallel.pp=2 "${sets[@]}" > "$dir.log" 2>&1
  fi
  python3 - "$dir/metrics.jsonl" "$warmup" "$setup" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"kind": "train"' in l]
rows = [r for r in rows if r["step"] > int(sys.argv[2])]
stages = 1 if sys.argv[3] == "emulated" else 2  # the real ones
step = sum(r["step_s"] for r in rows) / len(rows) * 1e3
bubbles = [sum(r["bubble_s"][s] for r in rows) / len(rows) * 1e3 for s in range(stages)]
print(" ".join(f"{v:.3f}" for v in [step] + bubbles))
EOF
}

for setup in $pipelines; do
  log="bench/results/$(date +%F)-step-sync-${setup//_/-}.log"
  exec > >(tee "$log" >&3) 2>&1
  bench_header
  echo "== $setup: $([ $setup = emulated ] && echo '4 stages, stage 0 real, one process' ||
    echo '2 stages, 2 MPI ranks (launch/run.sh)')"
  results=$(mktemp)
  for kind in $kinds; do
    for ((r = 0; r < rounds; r++)); do
      order=(barrier post_validate)
      ((r % 2 == 1)) && order=(post_validate barrier)
      for sync in "${order[@]}"; do
        line=$(run "$setup" "$kind" "$sync")
        echo "$kind $sync $r $line" | tee -a "$results"
      done
    done
  done
  python3 - "$results" <<'EOF'
import sys
from collections import defaultdict
from bench_stats import interval
runs = defaultdict(dict)  # (kind, round) -> sync -> figures
for line in open(sys.argv[1]):
    kind, sync, r, *values = line.split()
    runs[(kind, int(r))][sync] = [float(v) for v in values]
kinds = list(dict.fromkeys(k for k, _ in runs))
stages = len(next(iter(runs.values()))["barrier"]) - 1
head = " | ".join(f"bubble s{s} ms barrier / post" for s in range(stages))
print(f"| kind | step ms, barrier | step ms, post-validated | post / barrier | {head} |")
print("|---|---|---|---|" + "---|" * stages)
for kind in kinds:
    rs = [v for (k, _), v in sorted(runs.items()) if k == kind]
    b = interval([v["barrier"][0] for v in rs])
    p = interval([v["post_validate"][0] for v in rs])
    ratio = interval([v["post_validate"][0] / v["barrier"][0] for v in rs])
    cells = []
    for s in range(stages):
        bb = interval([v["barrier"][1 + s] for v in rs])
        pb = interval([v["post_validate"][1 + s] for v in rs])
        cells.append(f"{bb[0]:.1f} ± {bb[1]:.1f} / {pb[0]:.1f} ± {pb[1]:.1f}")
    print(f"| {kind} | {b[0]:.1f} ± {b[1]:.1f} | {p[0]:.1f} ± {p[1]:.1f} | "
          f"{ratio[0]:.3f} ± {ratio[1]:.3f} | " + " | ".join(cells) + " |")
EOF
  rm -f "$results"
  bench_footer "$log"
done
