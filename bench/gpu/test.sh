#!/usr/bin/env bash
# GPU procedure, step 3: every GPU test (`ctest -L gpu --timeout 120`, each kernel and library
# call checked: FREERIDE_CUDA_CHECK_LAUNCHES=1), then compute-sanitizer's memcheck, racecheck and
# initcheck over each GPU test binary, one log each under OUT_DIR/sanitizer/. A sanitizer run
# that finished is remembered (runs/gpu/sanitizer/) and not repeated, so a second call goes on
# where the budget stopped the first; a run its 180 s stopped counts as done for what it checked
# by then (its errors fail the step); `test.sh OUT_DIR sanitize` skips ctest.
# Estimate: 8 minutes (ctest about 1, the sanitizers the rest; what does not fit is left to the
# next call). Usage: bench/gpu/test.sh OUT_DIR [--dry-run] [all|sanitize]
step=test
estimate_s=480
source "$(dirname "$0")/common.sh"
load_kit
what=${step_args[0]:-all}
rc=0
export FREERIDE_CUDA_CHECK_LAUNCHES=1
binaries=(device_gpu_test cuda_kernels_gpu_test flash_attention_gpu_test fused_kernels_gpu_test
          head_kernels_gpu_test nccl_gpu_test cuda_model_gpu_test cuda_pipeline_gpu_test)

if [[ $what != sanitize ]]; then
  say "ctest -L gpu"
  # In a dry run the GPU tests run for real and skip (exit 77) for want of a GPU.
  within_budget 300 ctest --test-dir "$build" -L gpu --timeout 120 --output-on-failure
  rc=$?
fi

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mkdir -p "$out/sanitizer" "$state/sanitizer"
left=()
for tool in memcheck racecheck initcheck; do
  for binary in "${binaries[@]}"; do
    done_mark=$state/sanitizer/$tool-$binary.done
    if [[ -f $done_mark && $dry_run == 0 ]]; then
      say "$tool $binary: done in an earlier call ($(cat "$done_mark"))"
      continue
    fi
    if (($(remaining) < 30)); then
      left+=("$tool:$binary")
      continue
    fi
    say "compute-sanitizer --tool $tool $binary"
    # API errors are not the sanitizer's to report: every runtime call is checked by the project
    # (CUDA_CHECK) and the tests provoke some on purpose (device_gpu_test's out-of-memory), and
    # NCCL 2.28's init makes one of its own (a cudaFuncGetAttributes without a kernel image,
    # results/2026-11-26-gpu-sanitizer.log). Memory errors, races and uninitialised reads are.
    command=("$sanitizer" --tool "$tool" --report-api-errors no --error-exitcode 99
             "$build/tests/$binary")
    if [[ $dry_run == 1 ]]; then
      gpu_run 180 "${command[@]}" || rc=1
      if cuda_build && [[ ! -x $build/tests/$binary ]]; then
        say "dry run: MISSING $build/tests/$binary"
        rc=1
      fi
      continue
    fi
    within_budget 180 "${command[@]}" >"$out/sanitizer/$tool-$binary.log" 2>&1
    status=$?
    tail -3 "$out/sanitizer/$tool-$binary.log"
    case $status in
      0 | 77) echo "exit $status" >"$done_mark" ;;
      124)
        # A tool that cannot finish a binary within 180 s never will: what it checked before the
        # limit is kept (an error found is a failure), and the next call goes on to the others.
        if grep -qE '^========= (Invalid|Race|Uninitialized|Program hit|Error)' \
          "$out/sanitizer/$tool-$binary.log"; then
          say "$tool $binary: errors before the 180 s limit (log: sanitizer/$tool-$binary.log)"
          rc=1
        fi
        echo "stopped at 180 s; checked until then" >"$done_mark"
        ;;
      *) say "$tool $binary: exit $status (log: sanitizer/$tool-$binary.log)"; rc=1 ;;
    esac
  done
done
if ((${#left[@]} > 0)); then
  say "left for the next call (budget): ${left[*]}"
fi
finish $rc
