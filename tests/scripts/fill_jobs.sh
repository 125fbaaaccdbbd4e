#!/usr/bin/env bash
# Fill jobs submitted to a running 2-rank CPU pipeline (issue 34). Mid-run, five jobs are
# submitted: one that fits (finishes), one that fits nowhere (REFUSED with its numbers), one that
# segfaults (FAILED, training unharmed), one cancelled while it runs and one still running when
# the training is stopped (SIGUSR1 to mpirun). A sixth is submitted while it is stopped; the
# training is resumed and runs on. Passes when `freeride jobs` shows each state as it should at
# each point, the stop kept the queue (the pending job and the one that ran are placed again
# after the resume), and the losses of every step equal those of the same run without side work.
#   tests/scripts/fill_jobs.sh --build DIR --plugin PATH
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build} plugin=""
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --plugin) plugin=$2; shift 2 ;;
    *) echo "usage: $0 --build DIR --plugin PATH" >&2; exit 2 ;;
  esac
done
[[ -n $plugin ]] || { echo "--plugin (the misbehave test plugin) is required" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/freeride_fill_jobs.XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
freeride=$build/freeride
run=$work/run
fail() { echo "FAIL: $*" >&2; tail -30 "$work/log.txt" >&2 || true; "$freeride" jobs "$run" >&2 || true; exit 1; }

source "$root/tests/scripts/common.sh"
prepare_corpus "$freeride" "$root" "$work/data" 512
# A constant learning rate: the run is stopped wherever the checks are done and resumed for a
# fixed number of steps more, which must not change the schedule of the steps before.
cat > "$work/run.toml" <<TOML
$(tiny_run_toml 5 "$work/data" 2 100000)
[optim]
lr = 1e-3
schedule = "constant"
[parallel]
pp = 2
schedule = "1f1b"
[runtime]
comm_timeout_s = 120
[freeride]
enabled = true
calibration_steps = 1
step_timeout_s = 10
TOML
job() {  # file, [[side_tasks]] body
  printf '[[side_tasks]]\n%s\n' "$2" > "$work/$1.toml"
}
job fits $'type = "spin"\nstages = [0]\n[side_tasks.args]\nstep_ms = 0.05\nsteps = 60'
job nowhere $'type = "spin"\n[side_tasks.args]\nstep_ms = 2000\nsteps = 2'
job crashes $'type = "misbehave"\nstages = [0]\nplugin = "'"$plugin"$'"\n[side_tasks.args]\nmode = "segfault"\nafter = 20\nstep_ms = 0.05'
job cancelled $'type = "spin"\nstages = [0]\n[side_tasks.args]\nstep_ms = 0.05'
job forever $'type = "spin"\nstages = [1]\n[side_tasks.args]\nstep_ms = 0.05'
job later $'type = "spin"\nstages = [0]\n[side_tasks.args]\nstep_ms = 0.05\nsteps = 40'

train() {  # run.dir, extra --set...
  local dir=$1; shift
  mpirun -n 2 --oversubscribe --bind-to none "$freeride" train --config "$work/run.toml" \
    --set "run.dir=\"$dir\"" "$@" >> "$work/log.txt" 2>&1
}
steps_done() {
  local n
  n=$(grep -c '"kind": "train"' "$1/metrics.jsonl" 2>/dev/null || true)
  echo "${n:-0}"
}
placements() { grep -c "\"id\":$1,\"state\":\"PLACED\"" "$run/jobs.jsonl" || true; }
field() {  # id, field: from `freeride jobs --format json`
  "$freeride" jobs "$run" --format json | python3 -c '
import json, sys
job = next(j for j in json.load(sys.stdin) if j["id"] == int(sys.argv[1]))
print(job[sys.argv[2]])' "$1" "$2"
}
# Waits (up to LIMIT seconds: the machine may be loaded) until `freeride jobs` shows STATE.
await() {  # id, state, limit
  for ((w = 0; w < $3 * 5; ++w)); do
    [[ $(field "$1" state) == "$2" ]] && return 0
    kill -0 "$training" 2>/dev/null || fail "the training ended while job $1 was $(field "$1" state), not $2"
    sleep 0.2
  done
  fail "job $1 is $(field "$1" state) after $3 s, not $2 ($(field "$1" reason))"
}
submit() { "$freeride" submit "$run" "$work/$1.toml" --name "$1" 2>> "$work/log.txt"; }

train "$run" &
training=$!
for ((w = 0; w < 1200 && $(steps_done "$run") < 3; ++w)); do
  kill -0 "$training" 2>/dev/null || fail "the training ended before step 3"
  sleep 0.1
done
fits=$(submit fits)
nowhere=$(submit nowhere)
crashes=$(submit crashes)
cancelled=$(submit cancelled)
forever=$(submit forever)

await "$cancelled" RUNNING 120
"$freeride" cancel "$run" "$cancelled" | grep -q "cancellation requested" || fail "cancel was not taken"
await "$cancelled" CANCELLED 60
await "$fits" FINISHED 120
await "$nowhere" REFUSED 60
await "$crashes" FAILED 120
await "$forever" RUNNING 60
field "$nowhere" reason | grep -qE "needs 2[0-9]{3}\.[0-9]{2} ms steps; the longest bubble on stage 0 is .*; needs 2[0-9]{3}\.[0-9]{2} ms steps; the longest bubble on stage 1 is" ||
  fail "the refusal lacks its numbers: $(field "$nowhere" reason)"
field "$crashes" reason | grep -qF "stage 0 (rank 0): the worker was killed by signal 11 (SIGSEGV" ||
  fail "the crash's reason: $(field "$crashes" reason)"
# Its whole count: the calibration step is one of its 60 (it used to end with 59).
[[ $(field "$fits" steps) -eq 60 ]] || fail "the fitting job did $(field "$fits" steps) steps, not its 60 (calibration included)"
[[ -f $run/jobs/$fits/status.json && -d $run/jobs/$fits/fits_r0 ]] || fail "job $fits has no status.json or output directory"
"$freeride" jobs "$run"

# Stop: the job still running is queued again, with the work it had done.
kill -USR1 "$(pgrep -P "$training" -x mpirun)"
status=0
wait "$training" || status=$?
[[ $status -eq 3 ]] || fail "the stopped training exited $status, not 3"
stopped_at=$(cat "$run/checkpoints/latest")
stopped_at=$((10#${stopped_at#step_}))
[[ $(field "$forever" state) == PENDING ]] || fail "job $forever is $(field "$forever" state) after the stop"
field "$forever" reason | grep -qF "the training stopped after step $stopped_at" ||
  fail "job $forever's reason: $(field "$forever" reason)"
later=$(submit later)
[[ $(field "$later" state) == PENDING ]] || fail "job $later is not PENDING"

# Resumed, it places what was queued: the job it had run, and the one submitted meanwhile.
total=$((stopped_at + 40))
train "$run" --set checkpoint.resume=latest --set train.steps=$total || fail "the resumed run failed"
[[ $(field "$later" state) == FINISHED ]] || fail "job $later is $(field "$later" state) after the resume"
[[ $(placements "$forever") -eq 2 ]] ||
  fail "job $forever was placed $(placements "$forever") times, not once in each run"
field "$forever" reason | grep -qF "the training ended at step $total first" ||
  fail "job $forever's reason at the end: $(field "$forever" reason)"
for id in $fits $crashes $cancelled; do  # the ended ones stay as they were
  [[ $(placements "$id") -eq 1 ]] || fail "job $id was placed $(placements "$id") times"
done
[[ $(placements "$nowhere") -eq 0 ]] || fail "job $nowhere was placed"
"$freeride" jobs "$run"
"$freeride" report "$run" > /dev/null 2>> "$work/log.txt" || fail "freeride report failed"
grep -q "<h2>Fill jobs</h2>" "$run/report.html" || fail "the report has no jobs section"

# The same steps without any side work: every loss equal, bit for bit.
train "$work/plain" --set freeride.enabled=false --set train.steps=$total || fail "the plain run failed"
[[ $(steps_done "$work/plain") -eq $total ]] || fail "the plain run has $(steps_done "$work/plain") steps, not $total"
diff <(train_losses "$work/plain") <(train_losses "$run") > /dev/null ||
  fail "losses differ from the run without side work"
for ((w = 0; w < 600; ++w)); do
  pgrep -f "$work" > /dev/null || break
  sleep 0.1
done
pgrep -f "$work" > /dev/null && fail "processes of the run survived it: $(pgrep -af "$work")"
echo "PASS: $total steps bit-identical to the run without side work; jobs FINISHED, REFUSED, FAILED, CANCELLED as submitted; the stop kept the queue"
