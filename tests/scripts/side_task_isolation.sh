#!/usr/bin/env bash
# Side tasks that cannot hurt training (issue 17), on a 2-rank CPU pipeline. One run carries, at
# once: a plugin that segfaults, a `command` that ignores SIGTERM, never ends and leaves a child
# in a session of its own, a task over its memory cap at load, one that outgrows its cap while
# running, one that throws, and PageRank. Passes when the run completes every step with losses
# bit-identical to the same run with freeride.enabled = false, each failure is reported FAILED
# with its reason, no process of the run is left afterwards (escaped or not: found by a mark in
# their environment), and stage 0 harvests some of its bubbles.
#   tests/scripts/side_task_isolation.sh --build DIR --plugin PATH [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build} plugin="" steps=60
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --plugin) plugin=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 --build DIR --plugin PATH [--steps N]" >&2; exit 2 ;;
  esac
done
[[ -n $plugin ]] || { echo "--plugin (the misbehave test plugin) is required" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
source "$root/tests/scripts/common.sh"
work=$(mktemp -d /tmp/freeride_isolation.XXXXXX)
# Every process of the two runs carries this mark in its environment (common.sh): how the end
# finds what is left of them, escaped or not, and nothing else.
mark=$(new_run_mark)
trap 'kill_marked "$mark"; rm -rf "$work"' EXIT
freeride=$build/freeride
fail() { echo "FAIL: $*" >&2; tail -40 "$work/log.txt" >&2 || true; exit 1; }

prepare_corpus "$freeride" "$root" "$work/data" 512
cat > "$work/run.toml" <<TOML
[run]
seed = 11
log_every = 1000
$(model_toml 64 64)
[data]
train = "$work/data/train_*.bin"
[train]
batch_size = 8
seq_len = 64
microbatches = 4
steps = $steps
[optim]
lr = 3e-3
warmup_steps = 5
[parallel]
pp = 2
schedule = "1f1b"
[runtime]
comm_timeout_s = 60
[freeride]
enabled = true
step_timeout_s = 10

[[side_tasks]]
type = "misbehave"
name = "segfaults"
plugin = "$plugin"
[side_tasks.args]
mode = "segfault"
after = 40

[[side_tasks]]
type = "command"
name = "stubborn"
[side_tasks.args]
argv = ["sh", "-c", "setsid sh -c 'trap : TERM HUP; while :; do sleep 1; done' & trap '' TERM; while :; do :; done"]

[[side_tasks]]
type = "spin"
name = "over_cap"
memory_limit = "16MiB"
[side_tasks.args]
memory = 67108864

[[side_tasks]]
type = "misbehave"
name = "hog"
plugin = "$plugin"
memory_limit = "32MiB"
[side_tasks.args]
mode = "hog"
after = 10

[[side_tasks]]
type = "misbehave"
name = "throws"
plugin = "$plugin"
isolation = "inprocess"
[side_tasks.args]
mode = "throw"
after = 30

[[side_tasks]]
type = "pagerank"
memory_limit = "64MiB"
[side_tasks.args]
scale = 14
rows_per_step = 1024
TOML

"$freeride" config check "$work/run.toml" > /dev/null 2>> "$work/log.txt" ||
  fail "config check refused the run's config"
run() {  # run.dir, extra --set...
  local dir=$1; shift
  FREERIDE_RUN_MARK=$mark mpirun -n 2 --oversubscribe --bind-to none "$freeride" train \
    --config "$work/run.toml" \
    --set "run.dir=\"$dir\"" "$@" >> "$work/log.txt" 2>&1
}
losses() { grep '"kind": "train"' "$1/metrics.jsonl" | sed -E 's/.*"step": ([0-9]+).*"loss": ([^,]+),.*/\1 \2/'; }

run "$work/plain" --set freeride.enabled=false || fail "the run without side tasks failed"
run "$work/tasks" || fail "the run with misbehaving side tasks did not complete"
[[ $(losses "$work/plain" | wc -l) -eq $steps ]] || fail "the plain run has no $steps losses"
diff <(losses "$work/plain") <(losses "$work/tasks") > /dev/null ||
  fail "losses differ from the run without side tasks"

# Each failure with its reason (stage 0, whose bubbles are long enough for every task to reach
# its failure); the healthy tasks alive at the end on every rank.
report=$work/tasks/side_tasks_rank000.jsonl
record() { grep "\"name\": \"$1\"" "$2"; }
expect() {  # name, state, reason fragment
  record "$1" "$report" | grep -q "\"state\": \"$2\"" || fail "$1 is not $2: $(record "$1" "$report")"
  record "$1" "$report" | grep -qF "$3" || fail "$1's reason lacks '$3': $(record "$1" "$report")"
}
expect segfaults FAILED "killed by signal 11 (SIGSEGV"
expect over_cap FAILED "load: spin working memory"
expect hog FAILED "exceeded its memory limit of 32.0 MiB"
expect throws FAILED "threw misbehave: thrown on purpose"
for rank in 000 001; do
  for healthy in stubborn pagerank; do
    record $healthy "$work/tasks/side_tasks_rank$rank.jsonl" | grep -q '"state": "FAILED"' &&
      fail "rank $rank: $healthy FAILED: $(record $healthy "$work/tasks/side_tasks_rank$rank.jsonl")"
  done
done

# Nothing of the run is left: workers, the command, its children, the one that escaped into a
# session of its own (all carry the mark). They are killed as the ranks end; a loaded machine
# may take a moment to reap them, so this waits (up to 60 s) for them to go rather than for a
# fixed time.
for ((w = 0; w < 600; ++w)); do
  [[ -z $(marked_processes "$mark") ]] && break
  sleep 0.1
done
if [[ -n $(marked_processes "$mark") ]]; then
  left=$(marked_processes "$mark" | paste -sd,)
  fail "processes of the run survived it by 60 s: $(ps -o pid=,args= -p "$left" || true)"
fi

# Stage 0 harvested its bubbles despite the failing tasks beside PageRank. How much of them
# (the utilisation) is a speed figure, measured by bench/harvest_bench.sh: here, only that it is
# more than nothing, which holds however loaded the machine (1F1B gives stage 0 its warm-up
# and cooldown bubbles every step, and PageRank's steps are small).
util=$(grep '"kind": "harvest", .*"stage": 0,' "$work/tasks/metrics.jsonl" |
  sed -E 's/.*"utilisation": ([0-9.]+).*/\1/')
echo "stage 0 utilisation: $util"
awk -v u="$util" 'BEGIN { exit !(u > 0) }' || fail "stage 0 harvested nothing (utilisation $util)"
grep -h '"kind": "side_task"' "$work"/tasks/side_tasks_rank*.jsonl |
  sed -E 's/.*"rank": ([0-9]+).*"name": "([^"]*)".*"state": "([^"]*)".*"harvested_s": ([0-9.]+).*"overrun_s": ([0-9.]+).*"reason": ("[^"]*").*/rank \1 \2 \3 harvested \4 s overrun \5 s reason \6/'
echo "PASS: $steps steps bit-identical to the plain run; every failure reported; nothing left"
