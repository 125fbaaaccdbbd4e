#!/usr/bin/env bash
# Nothing outlives a rank killed with SIGKILL (issue 33): a 2-rank CPU pipeline runs two
# `command` side tasks whose programs escape their parent, one by ignoring SIGHUP in children
# it leaves running, one by a new session (setsid); once every program is running, rank 0 is
# SIGKILLed mid-run. Passes when mpirun exits and no process of the run is left, escaped or
# not: the ranks, their supervisors, the shells and every sleep.
# Every process of the run carries a random mark in its environment (common.sh's
# marked_processes), which a process that escapes keeps and no other process has; the sleeps'
# durations are random too, a second way to find them. Whatever the outcome, the script kills
# what it finds of the run before it exits.
#   tests/scripts/killed_rank_cleanup.sh --build DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 100000 "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/freeride_killed_rank.XXXXXX)
mark=$(new_run_mark)
# Three sleeps per rank, each for a duration no other process uses: ${s}1, ${s}2, ${s}3 seconds.
s=$((1000000 + (RANDOM * 32768 + RANDOM) % 8000000))
sleeps="^sleep ${s}[123]\$"
cleanup() {
  kill_marked "$mark"
  pkill -KILL -f "$sleeps" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
freeride=$build/freeride
fail() { echo "FAIL: $*" >&2; tail -30 "$work/log.txt" >&2 || true; exit 1; }
# "pid command" of what is left of the run, one a line.
left() {
  { marked_processes "$mark"; pgrep -f "$sleeps" || true; } | sort -un |
    while read -r pid; do
      ps -o pid=,args= -p "$pid" 2> /dev/null || true
    done
}

prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/run.toml" <<TOML
$(tiny_run_toml 3 "$work/data" 4 $steps)
[parallel]
pp = 2
[runtime]
comm_timeout_s = 60
[freeride]
enabled = true

[[side_tasks]]
type = "command"
name = "nohup_children"
[side_tasks.args]
argv = ["sh", "-c", "trap '' HUP; sleep ${s}1 & sleep ${s}2 & wait"]

[[side_tasks]]
type = "command"
name = "new_session"
[side_tasks.args]
argv = ["sh", "-c", "setsid sh -c 'sleep ${s}3; :' & wait"]
TOML
"$freeride" config check "$work/run.toml" > /dev/null 2>> "$work/log.txt" ||
  fail "config check refused the run's config"

FREERIDE_RUN_MARK=$mark mpirun -n 2 --oversubscribe --bind-to none "$freeride" train \
  --config "$work/run.toml" --set "run.dir=\"$work/run\"" > "$work/log.txt" 2>&1 &
mpirun_pid=$!

# Mid-run: 8 steps trained and all six sleeps started (both ranks' programs run in bubbles).
# Up to 120 s (the entry's TIMEOUT is 300 s): a loaded machine starts two ranks slowly.
for ((i = 0; i < 1200; ++i)); do
  trained=$(grep -c '"kind": "train"' "$work/run/metrics.jsonl" 2> /dev/null || true)
  ((${trained:-0} >= 8 && $(pgrep -fc "$sleeps" || true) == 6)) && break
  kill -0 $mpirun_pid 2> /dev/null || fail "the run ended before rank 0 was killed"
  sleep 0.1
done
((${trained:-0} >= 8)) || fail "the run did not train 8 steps in 120 s"
(($(pgrep -fc "$sleeps" || true) == 6)) ||
  fail "not every command's sleeps started: $(pgrep -af "$sleeps" || true)"

# Rank 0: mpirun's child whose MPI rank is 0 (its supervisors are the rank's forks, one level
# further down).
rank0=""
for pid in $(pgrep -P $mpirun_pid); do
  grep -qaF "OMPI_COMM_WORLD_RANK=0" "/proc/$pid/environ" 2> /dev/null && rank0=$pid
done
[[ -n $rank0 ]] || fail "rank 0 is not among mpirun's children: $(pgrep -aP $mpirun_pid)"
kill -KILL "$rank0"
echo "killed rank 0 (pid $rank0) after $trained steps"

# mpirun ends once rank 0 is gone (it then kills rank 1): nothing holds its output open. Up to
# 120 s, far beyond what it takes on an idle machine, for a loaded one.
for ((i = 0; i < 1200; ++i)); do
  kill -0 $mpirun_pid 2> /dev/null || break
  sleep 0.1
done
if kill -0 $mpirun_pid 2> /dev/null; then
  fail "mpirun has not exited 120 s after rank 0 was killed; left: $(left)"
fi
status=0
wait $mpirun_pid || status=$?
((status != 0)) || fail "mpirun exited 0 although rank 0 was killed"

# Nothing of the run is left. The kernel ends a PID namespace with its init and a subreaper
# supervisor kills its tree as it goes: both right after the rank, but a loaded machine may take
# a moment to deliver it all, so this waits up to 60 s for them to go rather than a fixed time.
for ((i = 0; i < 600; ++i)); do
  [[ -z $(left) ]] && break
  sleep 0.1
done
[[ -z $(left) ]] || fail "processes of the run outlived it by 60 s:
$(left)"
echo "PASS: mpirun exited ($status) after rank 0 was SIGKILLed; no process of the run is left"
