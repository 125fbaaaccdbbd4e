#!/usr/bin/env bash
# Barrier mutants of the CUDA kernels under the emulation build: deletes each __syncthreads()
# and __syncwarp() of models/cuda/*.cu in turn and runs the suite that holds that kernel to its
# reference in each thread order (FREERIDE_EMULATE_ORDER) until one fails. A deletion no order
# catches is a barrier the suite cannot see: its line must carry a marker comment saying why,
#   __syncwarp();  // mutant-invisible: REASON
# or the script fails; so does a marker on a barrier some order catches (the reason is stale),
# a marker on a line with no barrier, and a barrier the suite never reaches. Prints one table
# row per barrier.
#
#   tests/scripts/emulation_mutants.sh --build DIR [--only FILE]
#
# The deletion is made at run time (FREERIDE_EMULATE_SKIP_BARRIER=FILE:LINE, which the
# emulation's barriers read: models/cuda/emulation/barrier_mutant.cc), so the binaries of the
# emulation build DIR (-DFREERIDE_CUDA=EMULATE) serve every mutant and nothing is rebuilt or
# changed. About a minute on 2 cores (ctest runs it, label `emulated`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="" only=""
usage() { echo "usage: $0 --build DIR [--only FILE]" >&2; exit 2; }
while (($#)); do
  case $1 in
    --build) (($# >= 2)) || usage; build=$2; shift 2 ;;
    --only) (($# >= 2)) || usage; only=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n $build ]] || usage
if [[ ! -x $build/freeride ]] || ! "$build/freeride" version | grep -q "CUDA backend.*emulated"; then
  echo "emulation_mutants: $build is not a built emulation build (-DFREERIDE_CUDA=EMULATE)" >&2
  exit 2
fi

# The suite (and its quickest tests that reach the file's kernels) for each kernel file.
suite_of() {
  case $1 in
    kernels.cu) echo "cuda_kernels_gpu_test *" ;;
    layernorm.cu) echo "fused_kernels_gpu_test FusedKernelsTest*LayerNorm*" ;;
    column_sums.cu) echo "fused_kernels_gpu_test FusedKernelsTest*ColumnSums*" ;;
    elementwise.cu) echo "fused_kernels_gpu_test FusedKernelsTest*Elementwise*" ;;
    classifier.cu) echo "head_kernels_gpu_test FusedClassifierTest*" ;;
    multi_tensor.cu) echo "head_kernels_gpu_test MultiTensorTest*" ;;
    flash_attention.cu) echo "flash_attention_gpu_test *MatchesTheReferencePath*" ;;
    *) echo "" ;;
  esac
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Runs the suite with the barrier at $1 (FILE:LINE) deleted, in each order; prints the first
# order that fails, or "none", or "not reached" when every order passed without ever calling it.
# A run stops at its first failed assertion (--gtest_throw_on_failure ends the test there, and
# --gtest_fail_fast the suite): whether it fails is all that is asked of it, and a test looping
# over shapes used to go on through every shape after the first had caught the mutant.
catching_order() {
  local site=$1 binary=$2 filter=$3 order
  for order in lane reversed warp warp-reversed; do
    if ! FREERIDE_EMULATE_SKIP_BARRIER=$site FREERIDE_EMULATE_ORDER=$order \
        FREERIDE_CUDA_CHECK_LAUNCHES=1 timeout 300 "$build/tests/$binary" \
        --gtest_filter="$filter" --gtest_brief=1 --gtest_fail_fast --gtest_throw_on_failure \
        >"$log" 2>&1; then
      echo "$order"
      return
    fi
    # The emulation reports the skipped calls at exit; 0 means the filter missed the barrier.
    if grep -q "skipped the barrier at $site 0 times" "$log"; then
      echo "not reached"
      return
    fi
    if ! grep -q "skipped the barrier at $site [0-9]* times" "$log"; then
      echo "no report"
      return
    fi
  done
  echo none
}
# A mutant counts as caught only where the suite passes with every barrier in place.
declare -A intact=()
check_intact() {
  local binary=$1 filter=$2
  [[ -n ${intact[$binary $filter]:-} ]] && return
  [[ -x $build/tests/$binary ]] || { echo "emulation_mutants: $build/tests/$binary is not built" >&2; exit 2; }
  if ! FREERIDE_CUDA_CHECK_LAUNCHES=1 timeout 300 "$build/tests/$binary" --gtest_filter="$filter" \
      --gtest_brief=1 >"$log" 2>&1; then
    tail -30 "$log"
    echo "emulation_mutants: $binary --gtest_filter='$filter' fails with no barrier deleted" >&2
    exit 1
  fi
  intact[$binary $filter]=1
}

printf '%-32s %-22s %s\n' "barrier" "caught by (order)" "suite"
total=0 caught=0 failures=0
marker='//[[:space:]]*mutant-invisible:'
for path in "$root"/models/cuda/*.cu; do
  file=$(basename "$path")
  [[ -n $only && $file != "$only" ]] && continue
  # A marker must sit on a barrier's line: elsewhere it explains nothing.
  while IFS=: read -r line _; do
    echo "emulation_mutants: $file:$line has a mutant-invisible marker but no barrier" >&2
    failures=$((failures + 1))
  done < <(grep -n "$marker" "$path" | grep -v '__syncthreads()\|__syncwarp()' || true)
  read -r binary filter <<<"$(suite_of "$file")"
  [[ -z $binary ]] && continue
  check_intact "$binary" "$filter"
  # Lines that call a barrier, comments left out.
  while IFS=: read -r line text; do
    total=$((total + 1))
    site="$file:$line"
    reason=""
    if [[ $text =~ $marker[[:space:]]*(.*)$ ]]; then reason=${BASH_REMATCH[1]}; fi
    result=$(catching_order "$site" "$binary" "$filter")
    case $result in
      none)
        if [[ -n $reason ]]; then
          result="none: $reason"
        else
          failures=$((failures + 1))
          result="NONE (no mutant-invisible marker says why)"
        fi
        ;;
      "not reached")
        failures=$((failures + 1))
        result="NOT REACHED by $filter"
        ;;
      "no report")
        failures=$((failures + 1))
        result="NO REPORT of the deleted barrier (not an emulation build's binary?)"
        ;;
      *)
        caught=$((caught + 1))
        if [[ -n $reason ]]; then
          failures=$((failures + 1))
          result="$result (but marked invisible: remove the marker)"
        fi
        ;;
    esac
    printf '%-32s %-22s %s\n' "$site" "$result" "$binary"
  done < <(grep -n '__syncthreads()\|__syncwarp()' "$path" | grep -v '^[0-9]*:[[:space:]]*//')
done
echo "emulation_mutants: $caught of $total deletions caught, $failures unexplained"
((failures == 0))
