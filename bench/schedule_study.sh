#!/usr/bin/env bash
# The schedule-aware harvesting question on one machine: the harvest study of a 2-stage
# pipeline (stage 0 real, stage 1 emulated) under each of the 7 schedule kinds, each with
# PageRank and the image pipeline, on balanced stages (parallel.partition = "balanced").
# MODEL=demo runs the tiny head-heavy demo model (configs/tiny_cpu_pp2_freeride.toml: its
# LM head costs ~25 blocks, so its bubbles are mostly imbalance); MODEL=balanced (default)
# the same config with 8 blocks of n_embd 512, whose head (~8 blocks) a split can balance, so
# that the bubbles are the schedule's own.
# Prints per schedule: stage 0's measured idle fraction (training alone) next to the
# simulator's for the measured costs, then the study's "training alone" and "+ all" rows.
# Usage: bench/schedule_study.sh [rounds=2] [block_steps=4]   (needs data/kjv)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
rounds=${1:-2}
block=${2:-4}
model=()
if [ "${MODEL:-balanced}" = balanced ]; then
  model=(--set model.n_layer=8 --set model.n_embd=512 --set model.n_head=8
         --set train.batch_size=4)
fi
echo "| schedule | split | stage-0 idle measured / simulated | arm | steps | step s | overhead | bubble s | harvested s | utilisation | overrun s | reclaimed |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for kind in gpipe 1f1b interleaved zbh1 zbh2 zbv dualpipev; do
  dir="runs/schedule_study_$kind"
  chunks=1
  [ "$kind" = interleaved ] && chunks=2
  "$build/freeride" study --config "$root/configs/tiny_cpu_pp2_freeride.toml" \
    --set runtime.emulate_peers=true --set parallel.schedule="\"$kind\"" \
    --set parallel.chunks=$chunks "${model[@]}" \
    --set side_tasks.0.args.tolerance=0.0 --set run.dir="\"$dir\"" \
    --rounds "$rounds" --block_steps "$block" --overwrite > "$dir.log" 2>&1
  split=$(grep -o 'pipeline split.*' "$dir.log" | sed 's/.*): //; s/|/,/g' | head -1)
  simulated=$(grep -o 'idle fraction per stage: .*' "$dir.log" | awk '{print $5}' | head -1)
  # The training-alone arm's measured bubble time over its steps' time (stage 0 is the real one).
  measured=$(grep -E '^\| training alone ' "$dir/study/study.md" |
    awk -F'|' '{gsub(/ /, ""); printf "%.3f", $6 / ($3 * $4)}')
  grep -E '^\| (training alone|\+ all) ' "$dir/study/study.md" |
    sed "s/^|/| $kind | $split | $measured \/ $simulated |/"
done
