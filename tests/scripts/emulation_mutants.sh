#!/usr/bin/env bash
# Barrier mutants of the CUDA kernels under the emulation build: deletes each __syncthreads()
# and __syncwarp() of models/cuda/*.cu in turn, rebuilds the suite that holds that kernel to
# its reference, and runs it in each thread order (FREERIDE_EMULATE_ORDER) until one fails.
# A deletion no order catches is a barrier the suite cannot see: it must be listed in
# `invisible` below with the reason, or the script fails. Prints one table row per barrier.
#
#   tests/scripts/emulation_mutants.sh [--work DIR] [--only FILE]
#
# Works on a copy of the sources in DIR (default: a temporary folder, removed at the end), so
# the checkout and its builds are never touched. About 3 minutes on 2 cores (ctest runs it,
# label `emulated`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work="" only=""
while (($#)); do
  case $1 in
    --work) work=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--work DIR] [--only FILE]" >&2; exit 2 ;;
  esac
done
if [[ -z $work ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

# file:line of a barrier no suite can see, and why. Line numbers are the unmutated file's.
declare -A invisible=(
  # Lanes write their P row, then a __shfl_xor_sync gathers the warp before the wmma loads:
  # here the shuffle is a barrier; on the GPU it orders no memory, so the __syncwarp stays.
  [flash_attention.cu:259]="the shuffle above gathers the warp (only the GPU's memory model needs it)"
  # The scratch it protects is next written after the loop's __syncthreads, which orders the
  # reuse on the GPU as well: redundant there too.
  [flash_attention.cu:272]="redundant: the next iteration's __syncthreads comes first"
  # Guards warp_values for a caller's second reduction of the same type; no kernel makes one
  # (the softmax's max and sum are two instantiations, two arrays).
  [kernels.cu:44]="no kernel reduces twice with one instantiation"
)

# The suite (and its quickest tests that reach the file's kernels) for each kernel file.
suite_of() {
  case $1 in
    kernels.cu) echo "cuda_kernels_gpu_test *" ;;
    layernorm.cu | column_sums.cu | elementwise.cu) echo "fused_kernels_gpu_test FusedKernelsTest*" ;;
    classifier.cu) echo "head_kernels_gpu_test FusedClassifierTest*" ;;
    multi_tensor.cu) echo "head_kernels_gpu_test MultiTensorTest*" ;;
    flash_attention.cu) echo "flash_attention_gpu_test *MatchesTheReferencePath*" ;;
    *) echo "" ;;
  esac
}

mkdir -p "$work/src"
tar -C "$root" --exclude='./build*' --exclude=./.git --exclude=./data --exclude=./runs \
  --exclude=./.gpu-kit -cf - . | tar -C "$work/src" -xf -
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$work/src" -B "$work/build" "${generator[@]}" -DFREERIDE_CUDA=EMULATE \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(cuda_kernels_gpu_test fused_kernels_gpu_test head_kernels_gpu_test flash_attention_gpu_test)
build() { cmake --build "$work/build" -j "$(nproc)" --target "${targets[@]}" >"$work/build.log" 2>&1; }
build || { tail -30 "$work/build.log"; echo "emulation_mutants: the unmutated build fails" >&2; exit 1; }

# Runs the suite in each order; prints the first order that fails, or nothing.
catching_order() {
  local binary=$1 filter=$2 order
  for order in lane reversed warp warp-reversed; do
    if ! FREERIDE_EMULATE_ORDER=$order FREERIDE_CUDA_CHECK_LAUNCHES=1 timeout 300 \
        "$work/build/tests/$binary" --gtest_filter="$filter" --gtest_brief=1 >"$work/run.log" 2>&1; then
      echo "$order"
      return
    fi
  done
}

printf '%-32s %-22s %s\n' "barrier" "caught by (order)" "suite"
total=0 caught=0 surviving=0
for path in "$work"/src/models/cuda/*.cu; do
  file=$(basename "$path")
  [[ -n $only && $file != "$only" ]] && continue
  read -r binary filter <<<"$(suite_of "$file")"
  [[ -z $binary ]] && continue
  # Lines that call a barrier, comments left out.
  while IFS=: read -r line _; do
    total=$((total + 1))
    cp "$path" "$work/original.cu"
    sed -i "${line}s/__syncthreads()\|__syncwarp()/(void)0/" "$path"
    if ! build; then
      result="build failed"
    else
      order=$(catching_order "$binary" "$filter")
      result=${order:-none}
    fi
    cp "$work/original.cu" "$path"
    key="$file:$line"
    if [[ $result == none ]]; then
      if [[ -n ${invisible[$key]:-} ]]; then
        result="none: ${invisible[$key]}"
      else
        surviving=$((surviving + 1))
        result="NONE (not listed as invisible)"
      fi
    else
      caught=$((caught + 1))
    fi
    printf '%-32s %-22s %s\n' "$key" "$result" "$binary"
  done < <(grep -n '__syncthreads()\|__syncwarp()' "$path" | grep -v '^[0-9]*:[[:space:]]*//')
done
build  # leave the copy as it was
echo "emulation_mutants: $caught of $total deletions caught, $surviving unexplained"
((surviving == 0))
