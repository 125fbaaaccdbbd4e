#!/usr/bin/env bash
# A background checkpoint (checkpoint.background) killed mid-write: the run is held, by the
# test hook FREERIDE_TEST_HOLD_CHECKPOINT, inside the write of its checkpoint of step 10 (its
# state file written, no manifest, no rename yet), training is seen to go on past it, and the
# process is SIGKILLed. Passes when `latest` still names step 5, no step_00000010 exists, and
# resuming from `latest` ends with every step's loss equal to an uninterrupted run's, each step
# once; the checkpoint of step 10 written by the resumed run verifies.
#   tests/scripts/background_checkpoint_kill.sh [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 24 "$@"
freeride=$build/freeride
work=$(mktemp -d /tmp/freeride_bgckpt.XXXXXX)
pid=""
trap '[[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/run.toml" <<TOML
$(tiny_run_toml 7 "$work/data" 2 $steps shuffle)
[optim]
lr = 3e-3
warmup_steps = 5
[checkpoint]
every = 5
background = true
TOML

fail() { echo "background_checkpoint_kill: $*" >&2; tail -20 "$work/log.txt" >&2; exit 1; }

"$freeride" train --config "$work/run.toml" --set "run.dir=\"$work/reference\"" \
  >> "$work/log.txt" 2>&1 || fail "the uninterrupted run failed"

killed=$work/killed
FREERIDE_TEST_HOLD_CHECKPOINT=10 "$freeride" train --config "$work/run.toml" \
  --set "run.dir=\"$killed\"" >> "$work/log.txt" 2>&1 &
pid=$!
wait_for "[[ -e $killed/checkpoints/step_00000010.partial/held_r000 ]]"
# The checkpoint is being written, and training goes on beside it.
wait_for "grep -q '\"kind\": \"train\", \"step\": 12,' $killed/metrics.jsonl"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
pid=""

[[ $(cat "$killed/checkpoints/latest") == step_00000005 ]] ||
  fail "latest names $(cat "$killed/checkpoints/latest"), not step_00000005"
[[ ! -e $killed/checkpoints/step_00000010 ]] || fail "a torn step_00000010 was renamed into place"
[[ -d $killed/checkpoints/step_00000010.partial ]] || fail "no step_00000010.partial was being written"

"$freeride" train --config "$work/run.toml" --set "run.dir=\"$killed\"" \
  --set checkpoint.resume=latest >> "$work/log.txt" 2>&1 || fail "the resumed run failed"
grep -q "resumed from $killed/checkpoints/step_00000005 at step 5" "$work/log.txt" ||
  fail "the run did not resume from step 5"
expected=$(train_losses "$work/reference")
got=$(train_losses "$killed")
[[ $got == "$expected" ]] || fail "losses differ from the uninterrupted run:
  expected $expected
  got      $got"
[[ ! -e $killed/checkpoints/step_00000010.partial ]] || fail "step_00000010.partial was left"
"$freeride" checkpoint verify "$killed/checkpoints" >> "$work/log.txt" 2>&1 ||
  fail "the resumed run's checkpoints do not verify"
grep -q "written in the background while training went on" "$work/log.txt" ||
  fail "no log line of a background checkpoint"
echo "background_checkpoint_kill: killed mid-write at step 10, resumed from step 5, $steps steps equal"
