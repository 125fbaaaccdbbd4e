#!/usr/bin/env bash
# The schedule-aware harvesting question on one machine: the harvest study of the tiny 2-stage
# pipeline (stage 0 real, stage 1 emulated) under GPipe, 1F1B, ZB-H1 and interleaved (2 chunks
# per stage), each with PageRank and the image pipeline.
# Prints, per schedule, the study's "training alone" and "+ all" rows.
# Usage: bench/schedule_study.sh [rounds=2] [block_steps=4]   (needs data/kjv)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
rounds=${1:-2}
block=${2:-4}
echo "| schedule | arm | steps | step s | overhead | bubble s | harvested s | utilisation | overrun s | reclaimed |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for kind in gpipe 1f1b zbh1 interleaved; do
  dir="runs/schedule_study_$kind"
  "$build/freeride" study --config "$root/configs/tiny_cpu_pp2_freeride.toml" \
    --set runtime.emulate_peers=true --set parallel.schedule="$kind" \
    --set parallel.chunks="$([ "$kind" = interleaved ] && echo 2 || echo 1)" \
    --set side_tasks.0.args.tolerance=0.0 --set run.dir="\"$dir\"" \
    --rounds "$rounds" --block_steps "$block" > /dev/null 2>&1
  grep -E '^\| (training alone|\+ all) ' "$dir/study.md" | sed "s/^|/| $kind |/"
done
