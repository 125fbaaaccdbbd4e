#!/usr/bin/env bash
# `freeride project` against runs it can be checked on, on this machine:
#   real: the tiny 2-stage CPU pipeline with its side tasks (configs/tiny_cpu_pp2_freeride.toml)
#     on 2 bound ranks of one OpenMP thread each. The link first: bench/allreduce_bench on the
#     same 2 ranks fits the α–β of an MPI sum (to 16 MiB; docs/scale.md says what this VM does
#     above). Then REPEATS rounds of one run (RUN_STEPS steps, harvesting in alternate blocks
#     of 4) and one projection (part costs measured anew); from each run's metrics.jsonl the
#     mean step time and waits of the plain steps, and the BUBBLEs and the side work in them of
#     the harvesting steps (the first step left out: it warms up; so is the executor's first
#     sighting of each BUBBLE, which it measures rather than fills).
#     A second projection is given the tasks' step times measured inside the run's bubbles
#     (--task_ms), which separates the packing rule from the standalone calibration.
#   emulated: the same model as a 2- and a 4-stage pipeline with one real stage and emulated
#     peers (runtime.emulate_peers, side tasks off), step time against the projection's.
# Prints every figure and a summary: mean and range of each, and the difference of the means.
# Usage: bench/projection_check.sh [RUN_STEPS=24] [REPEATS=3]   (build first: launch/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-24}
repeats=${2:-3}
build=${BUILD_DIR:-build}
[[ -x $build/freeride ]] || build=build-cpu
export BUILD_DIR=$build OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
config=configs/tiny_cpu_pp2_freeride.toml
dir=$(mktemp -d /tmp/projection_check.XXXXXX)
trap 'rm -rf "$dir"' EXIT
figures=$dir/figures  # lines "case quantity source value"

echo "== $(date -u) $(git rev-parse --short HEAD); $(nproc --all) cores; $config"
echo "-- link: mpirun -n 2 --bind-to core $build/bench/allreduce_bench 16"
link=$(mpirun -n 2 --bind-to core "$build/bench/allreduce_bench" 16)
echo "$link"
latency=$(sed -n 's/^fit: latency \([0-9.]*\) us.*/\1/p' <<<"$link")
gbs=$(sed -n 's/.*bandwidth \([0-9.]*\) GB\/s.*/\1/p' <<<"$link")

# The pp = P, dp = 1 row of a projection onto P GPUs: "step bubble_without_sync harvested".
project_row() {
  local pp=$1
  shift
  "$build/freeride" project --config "$config" --gpus "$pp" --kinds 1f1b --link_gbs "$gbs" \
    --link_latency_us "$latency" --format csv "$@" 2>/dev/null |
    awk -F, -v pp="$pp" '$4 == pp && $5 == 1 { print $7, $10 - $19, $12 }'
}

for ((i = 1; i <= repeats; ++i)); do
  echo "-- round $i: launch/run.sh -n 2 $config --set train.steps=$steps --set eval.every=0"
  rm -rf "$dir/run"
  launch/run.sh -n 2 "$config" --set "train.steps=$steps" --set "run.dir=$dir/run" \
    --set eval.every=0 >"$dir/run.log" 2>&1 || { tail -20 "$dir/run.log"; exit 1; }
  python3 - "$dir/run/metrics.jsonl" <<'EOF' | tee -a "$figures"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
train = {r["step"]: r for r in records if r["kind"] == "train" and r["step"] > 1}
harvesting = lambda step: (step - 1) // 4 % 2 == 0  # alternate_every = 4
plain = [r for step, r in train.items() if not harvesting(step)]
# The executor measures each BUBBLE once before it fills it (its first harvesting step); the
# projection is the steady state, so harvesting steps count from the first one predicted whole.
unpredicted = {r["step"] for r in records if r["kind"] == "bubble" and r["predicted_s"] is None}
on = [s for s in train if harvesting(s) and s not in unpredicted]
bubbles = [r for r in records if r["kind"] == "bubble" and r["step"] in on]
time = 2 * sum(train[s]["step_s"] for s in on)
print("real step_ms measured", 1e3 * sum(r["step_s"] for r in plain) / len(plain))
print("real bubble measured", sum(b["measured_s"] for b in bubbles) / time)
print("real side_work measured", sum(b["harvested_s"] for b in bubbles) / time)
EOF
  echo "-- round $i: freeride project --config $config --gpus 2 --kinds 1f1b --link_gbs $gbs --link_latency_us $latency"
  read -r step bubble side < <(project_row 2)
  printf 'real step_ms projected %s\nreal bubble projected %s\nreal side_work projected %s\n' \
    "$step" "$bubble" "$side" | tee -a "$figures"
  # The packing rule apart from the calibration: the same projection given each task's mean
  # step time inside this run's bubbles (harvested_s / steps over both ranks) as --task_ms.
  in_bubble=$(python3 -c '
import collections, glob, json, sys
seconds, steps = collections.Counter(), collections.Counter()
for path in glob.glob(sys.argv[1] + "/side_tasks_rank*.jsonl"):
    for r in map(json.loads, open(path)):
        seconds[r["name"]] += r["harvested_s"]
        steps[r["name"]] += r["steps"]
print(",".join(f"{n}={1e3 * seconds[n] / steps[n]:.4f}" for n in steps if steps[n]))' "$dir/run")
  echo "-- round $i: the same with --task_ms $in_bubble (steps timed inside the run's bubbles)"
  read -r _ _ side < <(project_row 2 --task_ms "$in_bubble")
  grep "real side_work measured" "$figures" | tail -1 | sed 's/side_work/side_work_in_bubble_steps/' >> "$figures"
  echo "real side_work_in_bubble_steps projected $side" | tee -a "$figures"
done

for pp in 2 4; do
  echo "-- emulated pp $pp: freeride train --config $config --set parallel.pp=$pp --set runtime.emulate_peers=true"
  for ((i = 1; i <= repeats; ++i)); do
    rm -rf "$dir/emu"
    "$build/freeride" train --config "$config" --set "parallel.pp=$pp" \
      --set runtime.emulate_peers=true --set freeride.enabled=false --set "train.steps=$steps" \
      --set "run.dir=$dir/emu" --set eval.every=0 >"$dir/emu.log" 2>&1 ||
      { tail -20 "$dir/emu.log"; exit 1; }
    python3 -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step_s"] for r in steps if r["kind"] == "train" and r["step"] > 1]
print(f"emulated_pp{sys.argv[2]} step_ms measured", 1e3 * sum(steps) / len(steps))
' "$dir/emu/metrics.jsonl" "$pp" | tee -a "$figures"
    read -r step _ _ < <(project_row "$pp" --set freeride.enabled=false)
    echo "emulated_pp$pp step_ms projected $step" | tee -a "$figures"
  done
done

echo "-- summary: mean [min, max] of $repeats; difference = projected mean / measured mean − 1"
python3 - "$figures" <<'EOF'
import collections, sys
values = collections.defaultdict(list)
for line in open(sys.argv[1]):
    case, quantity, source, value = line.split()
    values[(case, quantity, source)].append(float(value))
print(f"| case | quantity | measured | projected | difference |\n|---|---|---|---|---|")
for case, quantity in dict.fromkeys((c, q) for c, q, _ in values):
    cell = lambda v: f"{sum(v) / len(v):.4g} [{min(v):.4g}, {max(v):.4g}]"
    m, p = values[(case, quantity, "measured")], values[(case, quantity, "projected")]
    diff = (sum(p) / len(p)) / (sum(m) / len(m)) - 1
    print(f"| {case} | {quantity} | {cell(m)} | {cell(p)} | {diff:+.1%} |")
EOF
