#!/usr/bin/env bash
# Harvesting on the CPU, measured by `freeride study` with 95% intervals and the A/A noise
# floor: the tiny 2-stage 1F1B pipeline with PageRank and the image pipeline in its bubbles
# (configs/tiny_cpu_pp2_freeride.toml), run twice through launch/run.sh (ranks and threads
# bound to cores of their own):
#   1. one process, stage 0 real and stage 1 emulated from its measured costs;
#   2. two MPI ranks, both stages real.
# Each study adds rounds until every arm's overhead interval is within ±TARGET percent, at most
# MAX_ROUNDS. ISOLATION ("inprocess" or "process") runs every task so; without it each its
# default. One log: bench/results/DATE-cpu-harvest-study[-ISOLATION].log.
# Usage: bench/harvest_bench.sh [TARGET=2] [MAX_ROUNDS=16] [ISOLATION]
#   (needs data/kjv: launch/prepare_data.sh; a build in $BUILD_DIR, default build/)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=${1:-2}
max_rounds=${2:-16}
isolation=${3:-}
config=configs/tiny_cpu_pp2_freeride.toml
sets=()
suffix=""
if [[ -n $isolation ]]; then
  sets+=(--set "side_tasks.0.isolation=\"$isolation\"" --set "side_tasks.1.isolation=\"$isolation\"")
  suffix="-$isolation"
fi
mkdir -p bench/results
log="bench/results/$(date +%F)-cpu-harvest-study$suffix.log"
exec > >(tee "$log") 2>&1
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) CPUs"
study() {
  local name=$1 ranks=$2
  shift 2
  echo "== $name: launch/run.sh -n $ranks --study $config $* ${sets[*]}"
  launch/run.sh -n "$ranks" --study "$config" --set run.dir="\"runs/harvest_$name\"" \
    "${sets[@]}" "$@" --rounds 3 --block_steps 4 --target_ci "$target" \
    --max_rounds "$max_rounds" --overwrite 2>&1 |
    grep -E "side task '.*' \(|FAILED|error" | sed 's/^.*\] //' || true
  cat "runs/harvest_$name/study/study.md"  # a study writes into run.dir/study
}
study emulated 1 --set runtime.emulate_peers=true
study two_ranks 2
echo "== done; log $log"
