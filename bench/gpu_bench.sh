#!/usr/bin/env bash
# The GPU verification in one command, for a machine with a GPU and no package access: builds
# with the gpu-kit's packages (../shared/gpu-kit), runs every GPU test (ctest label gpu), then
# GPT-2 124M training throughput at T = 1024 in bf16, freeride (bench/gpu_train_bench) beside
# PyTorch (bench/pytorch_gpt2.py) at each micro-batch size that fits both, on the same GPU in
# the same run. Everything goes to one log.
# Usage: bench/gpu_bench.sh [OUT_DIR=bench/results] [BATCH_SIZES="4 8 16 32"]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results}
batches=${2:-"4 8 16 32"}
mkdir -p "$out"
log="$out/$(date +%F)-gpu-verify.log"
exec > >(tee "$log") 2>&1

if [ -x .gpu-kit/unpack-debs.sh ] && [ -d .gpu-kit/debs ]; then
  eval "$(.gpu-kit/unpack-debs.sh .gpu-kit/debs /tmp/freeride-kit)"
fi
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
generator=$(command -v ninja >/dev/null && echo "-G Ninja" || echo "")
cmake -S . -B build-gpu $generator -DFREERIDE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DFREERIDE_BUILD_TESTS=ON || exit 1
cmake --build build-gpu -j "$(nproc)" || exit 1

echo "== GPU tests"
(cd build-gpu && ctest -L gpu --output-on-failure)
tests_rc=$?

echo "== throughput: GPT-2 124M, T=1024, bf16"
for b in $batches; do
  echo "-- freeride B=$b"
  build-gpu/bench/gpu_train_bench 20 "$b" 1024 bf16 || echo "freeride B=$b: failed (out of memory?)"
  echo "-- PyTorch B=$b"
  python3 bench/pytorch_gpt2.py --steps 20 --batch "$b" --seq 1024 ||
    echo "PyTorch B=$b: failed (out of memory?)"
done
echo "== done: GPU tests exit $tests_rc; log $log"
exit $tests_rc
