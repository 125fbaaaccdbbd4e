#!/usr/bin/env bash
# The CUDA chunk trains a config under the CUDA emulation build (by default the project's default
# config, configs/tiny_cpu.toml: 4 layers, C = 128, GPT-2's vocabulary, 4 micro-batches of
# 2 × 64; --config configs/llama_tiny_cpu.toml the Llama family's, of the same size): STEPS steps
# with runtime.device = "cuda" in fp32 and in bf16 against the same steps on the CPU backend of
# the same binary. Passes when every step's loss is within the GPU suites' tolerances of the
# CPU's (fp32: 1e-4 relative, bf16: 2e-2, tests/gpu/cuda_model_gpu_test.cc).
#   tests/scripts/emulated_tiny_train.sh --build DIR [--steps N] [--config FILE]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
config=$root/configs/tiny_cpu.toml
args=()
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
build_and_steps "$root" 4 "${args[@]}"
freeride=$build/freeride
if ! "$freeride" version | grep -q "CUDA backend.*emulated"; then
  echo "$freeride is not an emulation build (-DFREERIDE_CUDA=EMULATE)" >&2
  exit 2
fi
work=$(mktemp -d /tmp/freeride_emulated_tiny.XXXXXX)
trap 'rm -rf "$work"' EXIT
prepare_corpus "$freeride" "$root" "$work/data"

# Trains DEVICE PRECISION into $work/DEVICE-PRECISION; prints its losses. No validation: the
# train losses are what is compared, and the evaluations a validation set brings (before the
# first step and after the last, 4 batches' forward passes each) cost as much as the 3 steps.
train() {
  local run=$work/$1-$2
  "$freeride" train --config "$config" --set run.dir="$run" \
    --set data.train="$work/data/train_*.bin" --set 'data.val=""' \
    --set train.steps="$steps" --set eval.every=0 --set runtime.device="$1" \
    --set runtime.precision="$2" >"$run.log" 2>&1 || { tail -20 "$run.log"; exit 1; }
  train_losses "$run"
}
cpu=$(train cpu fp32)
status=0
for precision in fp32 bf16; do
  cuda=$(train cuda "$precision")
  echo "cpu:         $cpu"
  echo "cuda $precision: $cuda"
  python3 - "$cpu" "$cuda" "$precision" <<'PY' || status=1
import ast, sys
cpu, cuda, precision = ast.literal_eval(sys.argv[1]), ast.literal_eval(sys.argv[2]), sys.argv[3]
tolerance = 1e-4 if precision == "fp32" else 2e-2
assert len(cpu) == len(cuda) > 0, (len(cpu), len(cuda))
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, cuda))
print(f"{precision}: worst relative difference {worst:.2e} (tolerance {tolerance:.0e})")
sys.exit(0 if worst <= tolerance else 1)
PY
done
exit $status
