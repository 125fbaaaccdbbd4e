#!/usr/bin/env bash
# A second stop signal while a background checkpoint is being written, and a 2-rank run that
# fails while one is: neither may lose the checkpoint in flight.
#  1. one process, checkpoint.every = 10 in the background, the write of step 10 held (test
#     hook FREERIDE_TEST_HOLD_CHECKPOINT) until the test releases it; two SIGTERMs 20 ms apart
#     once step 12 is done. The process must wait for the write, then exit 143: `latest` names
#     step 10, no step_00000010.partial, `checkpoint verify` passes and the run resumes from it.
#  2. the same as a pp 2 pipeline under mpirun, stopped by two SIGUSR1s.
#  3. pp 2, every = 1, each state file slowed by 1 s (FREERIDE_TEST_SLOW_CHECKPOINT_S), a loss
#     that goes non-finite (lr = 1e6, on_nonfinite = "skip" up to 2): the run fails, and leaves
#     no step_N.partial behind.
#   tests/scripts/stop_during_checkpoint.sh [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 16 "$@"
freeride=$build/freeride
work=$(mktemp -d /tmp/freeride_stopckpt.XXXXXX)
pid=""
trap '[[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun -n 2 --oversubscribe --bind-to none)

prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/run.toml" <<TOML
$(tiny_run_toml 7 "$work/data" 2 $steps)
[checkpoint]
every = 10
background = true
TOML

fail() { echo "stop_during_checkpoint: $*" >&2; tail -30 "$work/log.txt" >&2; exit 1; }
# Checks RUN's checkpoints after the stop: step 10 whole, named by latest, verified.
check_kept() {
  local ckpt=$1/checkpoints
  [[ -f $ckpt/latest && $(cat "$ckpt/latest") == step_00000010 ]] ||
    fail "$2: latest is $(cat "$ckpt/latest" 2>/dev/null || echo missing), not step_00000010"
  [[ ! -e $ckpt/step_00000010.partial ]] || fail "$2: step_00000010.partial was left"
  "$freeride" checkpoint verify "$ckpt" >> "$work/log.txt" 2>&1 || fail "$2: verify failed"
}
# Sends SIGNAL to $pid twice, 20 ms apart, once step 12 is in RUN's metrics; then checks the
# process waits for the held write instead of exiting, and releases the write.
stop_twice() {
  local run=$1 signal=$2
  wait_for "grep -q '\"kind\": \"train\", \"step\": 12,' $run/metrics.jsonl"
  kill -"$signal" "$pid"; sleep 0.02; kill -"$signal" "$pid"
  sleep 2
  kill -0 "$pid" 2>/dev/null ||
    fail "$signal twice: the process exited without finishing the checkpoint being written"
  touch "$run/checkpoints/step_00000010.partial/release"
}

# 1. One process, two SIGTERMs.
one=$work/one
FREERIDE_TEST_HOLD_CHECKPOINT=10 "$freeride" train --config "$work/run.toml" \
  --set "run.dir=\"$one\"" >> "$work/log.txt" 2>&1 &
pid=$!
wait_for "[[ -e $one/checkpoints/step_00000010.partial/held_r000 ]]"
stop_twice "$one" TERM
status=0
wait "$pid" || status=$?
pid=""
[[ $status == 143 ]] || fail "two SIGTERMs: exit status $status, not 143"
grep -q "exiting once the checkpoint being written is complete" "$work/log.txt" ||
  fail "no word that the second signal waits for the checkpoint"
check_kept "$one" "one process"
"$freeride" train --config "$work/run.toml" --set "run.dir=\"$one\"" \
  --set checkpoint.resume=latest >> "$work/log.txt" 2>&1 || fail "the resumed run failed"
grep -q "resumed from $one/checkpoints/step_00000010 at step 10" "$work/log.txt" ||
  fail "the run did not resume from step 10"

# 2. A pp 2 pipeline under mpirun, two SIGUSR1s.
two=$work/two
FREERIDE_TEST_HOLD_CHECKPOINT=10 "${mpirun[@]}" -x FREERIDE_TEST_HOLD_CHECKPOINT \
  -x OMP_NUM_THREADS "$freeride" train --config "$work/run.toml" --set parallel.pp=2 \
  --set "run.dir=\"$two\"" >> "$work/log.txt" 2>&1 &
pid=$!
wait_for "[[ -e $two/checkpoints/step_00000010.partial/held_r000 && \
  -e $two/checkpoints/step_00000010.partial/held_r001 ]]"
stop_twice "$two" USR1
status=0
wait "$pid" || status=$?
pid=""
[[ $status != 0 ]] || fail "two SIGUSR1s: mpirun exited 0"
check_kept "$two" "pp 2"

# 3. A pp 2 pipeline that fails on non-finite losses while a checkpoint is being written.
three=$work/three
FREERIDE_TEST_SLOW_CHECKPOINT_S=1 "${mpirun[@]}" -x FREERIDE_TEST_SLOW_CHECKPOINT_S \
  -x OMP_NUM_THREADS "$freeride" train --config "$work/run.toml" --set parallel.pp=2 \
  --set "run.dir=\"$three\"" --set checkpoint.every=1 --set optim.lr=1e6 \
  --set optim.grad_clip=0 --set optim.on_nonfinite=skip --set optim.max_nonfinite_skips=2 \
  >> "$work/log.txt" 2>&1 && fail "lr = 1e6 never diverged"
grep -q "not finite, so the update was not applied" "$work/log.txt" ||
  fail "the run did not stop on a non-finite step"
partial=$(find "$three/checkpoints" -maxdepth 1 -name '*.partial')
[[ -z $partial ]] || fail "the failed run left $partial"
"$freeride" checkpoint verify "$three/checkpoints" >> "$work/log.txt" 2>&1 ||
  fail "the failed run's checkpoints do not verify"
echo "stop_during_checkpoint: a second signal waited for the checkpoint (1 and 2 ranks); a failed run left no partial"
