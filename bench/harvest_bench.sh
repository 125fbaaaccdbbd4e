#!/usr/bin/env bash
# Harvesting on the CPU with 2 ranks: the tiny 2-stage pipeline (configs/tiny_cpu_pp2.toml)
# with one side task at a time (spin, pagerank, image) and harvesting alternating with plain
# blocks of 4 steps, so each run measures its own overhead. Prints each run's harvest report.
# ISOLATION ("inprocess" or "process") runs every task so; without it, each its default.
# Usage: bench/harvest_bench.sh [steps=40] [ISOLATION]   (needs data/kjv: launch/prepare_data.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${1:-40}
isolation=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  local name=$1 task=$2
  if [[ -n $isolation ]]; then
    name=${name}_$isolation
    task=$(printf '%s\n' "$task" | sed "1a isolation = \"$isolation\"")
  fi
  echo "== $name"
  { cat "$root/configs/tiny_cpu_pp2.toml"
    printf '\n[freeride]\nenabled = true\nalternate_every = 4\n\n[[side_tasks]]\n%s\n' "$task"
  } > "$tmp/$name.toml"
  "$root/launch/run.sh" -n 2 "$tmp/$name.toml" --set train.steps="$steps" --set eval.every=0 \
    --set run.dir="\"runs/harvest_$name\"" 2>&1 |
    grep -E "harvest:|overhead:|reclaimed:|side task '.*' \(.*\): " | sed 's/^.*\] //'
}
run spin 'type = "spin"
[side_tasks.args]
step_ms = 0.5'
run pagerank 'type = "pagerank"
[side_tasks.args]
scale = 17
rows_per_step = 4096
tolerance = 0.0'
run image 'type = "image"
[side_tasks.args]
width = 256
height = 256
out_width = 128
out_height = 128'
