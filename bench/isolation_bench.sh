#!/usr/bin/env bash
# In-process against process-isolated side tasks on the CPU with 2 ranks: the tiny 2-stage
# pipeline (configs/tiny_cpu_pp2.toml) with one task at a time, run once in each isolation,
# harvesting alternating with plain blocks of 4 steps so each run measures its own overhead.
# Prints each run's harvest report and task lines.
# Usage: bench/isolation_bench.sh [steps=40]   (needs data/kjv: launch/prepare_data.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${1:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  local name=$1 task=$2
  echo "== $name"
  { cat "$root/configs/tiny_cpu_pp2.toml"
    printf '\n[freeride]\nenabled = true\nalternate_every = 4\n\n[[side_tasks]]\n%s\n' "$task"
  } > "$tmp/$name.toml"
  "$root/launch/run.sh" -n 2 "$tmp/$name.toml" --set train.steps="$steps" --set eval.every=0 \
    --set run.dir="\"runs/isolation_$name\"" 2>&1 |
    grep -E "harvest:|overhead:|reclaimed:|side task '.*' \(.*\): " | sed 's/^.*\] //'
}
for isolation in inprocess process; do
  run "spin_$isolation" "type = \"spin\"
isolation = \"$isolation\"
[side_tasks.args]
step_ms = 0.5"
  run "pagerank_$isolation" "type = \"pagerank\"
isolation = \"$isolation\"
[side_tasks.args]
scale = 17
rows_per_step = 4096
tolerance = 0.0"
done
