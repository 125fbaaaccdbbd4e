#!/usr/bin/env bash
# GPU procedure, step 4: GPT-2 124M training throughput at T = 1024 in bf16, freeride
# (build-gpu/bench/gpu_train_bench: the real training step) beside PyTorch (bench/pytorch_gpt2.py,
# the nanoGPT recipe with torch.compile) on the same GPU, per micro-batch size; one log per run
# under OUT_DIR/bench/. PyTorch runs with `env -u LD_LIBRARY_PATH` (the kit's libgomp and libssl
# must not reach it). A size already measured is remembered (runs/gpu/bench/) and skipped, so a
# second call goes on where the budget stopped the first. freeride runs twice per size: its fast
# kernels (runtime.kernels and runtime.attention "auto") and the reference path ("reference").
# Estimate: 8 minutes for four sizes (each: freeride 2 × 20 s, PyTorch 60 to 90 s with its compile).
# Usage: bench/gpu/bench.sh OUT_DIR [--dry-run] [BATCH_SIZES="4 8 16 32"] [STEPS=20]
step=bench
estimate_s=480
source "$(dirname "$0")/common.sh"
load_kit
batches=${step_args[0]:-"4 8 16 32"}
steps=${step_args[1]:-20}
rc=0
mkdir -p "$out/bench" "$state/bench"
for b in $batches; do
  for impl in freeride freeride-reference pytorch; do
    mark=$state/bench/$impl-$b.done
    if [[ -f $mark && $dry_run == 0 ]]; then
      say "$impl B=$b: measured in an earlier call: $(cat "$mark")"
      continue
    fi
    if [[ $impl == freeride ]]; then
      command=("$build/bench/gpu_train_bench" "$steps" "$b" 1024 bf16)
    elif [[ $impl == freeride-reference ]]; then
      command=("$build/bench/gpu_train_bench" "$steps" "$b" 1024 bf16 12 768 12 reference reference)
    else
      command=(env -u LD_LIBRARY_PATH python3 bench/pytorch_gpt2.py --steps "$steps" --batch "$b"
               --seq 1024)
    fi
    say "$impl B=$b"
    if [[ $dry_run == 1 ]]; then
      gpu_run 200 "${command[@]}" || rc=1
      continue
    fi
    gpu_run 200 "${command[@]}" >"$out/bench/$impl-B$b.log" 2>&1
    status=$?
    tail -4 "$out/bench/$impl-B$b.log"
    if [[ $status == 0 ]]; then
      tail -1 "$out/bench/$impl-B$b.log" >"$mark"
    elif [[ $status == 124 ]]; then
      say "$impl B=$b: stopped by the budget; the next call measures it"
    else
      say "$impl B=$b: exit $status (out of memory?)"
    fi
  done
done
finish $rc
