#!/usr/bin/env bash
# Stop/resume soak: a 2-rank pipeline with side tasks is started, stopped at a random moment
# by a random signal (SIGTERM to the ranks as srun sends it, SIGUSR1 to mpirun, which forwards
# it, or SIGKILL to one rank), and resumed from its latest checkpoint, CYCLES times; then it
# runs to the end. Passes when every step's loss and gradient norm in metrics.jsonl equal
# those of one uninterrupted run, each step exactly once, and no process of the run is left.
#   tests/scripts/stop_resume_soak.sh [--cycles N] [--build DIR] [--seed S]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cycles=20 build=${BUILD_DIR:-$root/build} seed=$$
while (($#)); do
  case $1 in
    --cycles) cycles=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--cycles N] [--build DIR] [--seed S]" >&2; exit 2 ;;
  esac
done
RANDOM=$seed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/freeride_soak.XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
freeride=$build/freeride

# Data: the project's own docs, tokenized.
source "$root/tests/scripts/common.sh"
prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/soak.toml" <<TOML
$(tiny_run_toml 7 "$work/data" 2 "$((200 * cycles))" shuffle)
[optim]
lr = 3e-3
warmup_steps = 5
[checkpoint]
every = 25
[parallel]
pp = 2
schedule = "1f1b"
[runtime]
comm_timeout_s = 60
[freeride]
enabled = true
[[side_tasks]]
type = "pagerank"
memory_limit = "64MiB"
[side_tasks.args]
scale = 12
rows_per_step = 1024
[[side_tasks]]
type = "image"
memory_limit = "64MiB"
[side_tasks.args]
width = 64
height = 64
out_width = 32
out_height = 32
TOML

launch() {  # run.dir, extra --set...
  local dir=$1; shift
  mpirun -n 2 --oversubscribe --bind-to none "$freeride" train --config "$work/soak.toml" \
    --set "run.dir=\"$dir\"" "$@" >> "$work/log.txt" 2>&1
}

launch "$work/reference" || { tail -20 "$work/log.txt"; echo "soak: reference run failed" >&2; exit 1; }

dir=$work/soak
declare -A outcomes=()
for ((c = 1; c <= cycles; ++c)); do
  # Killed before its first checkpoint, a run is started again: over what it had written.
  resume=(--overwrite)
  [[ -f $dir/checkpoints/latest ]] && resume=(--set checkpoint.resume=latest)
  started=$(grep -c "run_loop.cc.*model:" "$work/log.txt" || true)
  launch "$dir" "${resume[@]}" &
  job=$!
  # Signals go to a run that is training (its handlers installed): until rank 0 logs its model
  # line, a signal would only test the kernel's default action.
  for ((w = 0; w < 1200; ++w)); do  # up to 120 s on a loaded machine
    (( $(grep -c "run_loop.cc.*model:" "$work/log.txt" || true) > started )) && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  sleep "$(printf '0.%03d' $((RANDOM % 1000)))"; sleep $((RANDOM % 3))
  mpirun_pid=$(pgrep -P "$job" -x mpirun || true)
  ranks=$( [[ -n $mpirun_pid ]] && pgrep -P "$mpirun_pid" -f "freeride train" || true)
  how=$((RANDOM % 3))
  if [[ -z $ranks ]]; then how=none
  elif ((how == 0)); then kill -TERM $ranks 2>/dev/null || true; how=TERM
  elif ((how == 1)); then kill -USR1 "$mpirun_pid" 2>/dev/null || true; how=USR1
  else kill -KILL $(echo "$ranks" | shuf -n 1 --random-source=<(yes $RANDOM)) 2>/dev/null || true; how=KILL
  fi
  status=0
  wait "$job" || status=$?
  step=$( [[ -f $dir/checkpoints/latest ]] && cat "$dir/checkpoints/latest" || echo none)
  echo "cycle $c: $how -> exit $status, latest $step"
  outcomes[$how]=$(( ${outcomes[$how]:-0} + 1 ))
  if [[ $how != KILL && $how != none && $status -ne 3 && $status -ne 0 ]]; then
    tail -20 "$work/log.txt"; echo "soak: a stop by $how ended with status $status, not 3" >&2
    exit 1
  fi
done
resume=(--overwrite)
[[ -f $dir/checkpoints/latest ]] && resume=(--set checkpoint.resume=latest)
launch "$dir" "${resume[@]}" || { tail -20 "$work/log.txt"; echo "soak: the final run failed" >&2; exit 1; }

if pgrep -f "$work" > /dev/null; then
  echo "soak: processes of the run survived it:" >&2; pgrep -af "$work" >&2; exit 1
fi
rows() { grep '"kind": "train"' "$1/metrics.jsonl" | sed 's/, "step_s".*//'; }
if ! diff <(rows "$work/reference") <(rows "$dir") > "$work/diff.txt"; then
  echo "soak: metrics differ from the uninterrupted run:" >&2; head -20 "$work/diff.txt" >&2
  exit 1
fi
echo "soak: $cycles cycles (TERM ${outcomes[TERM]:-0}, USR1 ${outcomes[USR1]:-0}, KILL ${outcomes[KILL]:-0}, finished before the signal ${outcomes[none]:-0}): $(rows "$dir" | wc -l) steps, losses and norms equal to the uninterrupted run, each step once"
