# Shared by the scripts in tests/scripts (sourced, not run): the --build/--steps options, a
# corpus of the project's own docs as token shards, a run's training losses in step order,
# the marks of a run's processes and a wait for a condition while a run lives.

# Sets `build` (--build DIR, default $BUILD_DIR or ROOT/build) and `steps` (--steps N, default
# DEFAULT_STEPS); any other argument is a usage error.
#   build_and_steps ROOT DEFAULT_STEPS "$@"
build_and_steps() {
  local root=$1
  steps=$2
  build=${BUILD_DIR:-$root/build}
  shift 2
  while (($#)); do
    case $1 in
      --build) build=$2; shift 2 ;;
      --steps) steps=$2; shift 2 ;;
      *) echo "usage: $0 --build DIR [--steps N]" >&2; exit 2 ;;
    esac
  done
}

# Tokenizes docs/*.md and README.md into DIR (train and val shards) with `freeride prepare`.
#   prepare_corpus FREERIDE ROOT DIR [VAL_TOKENS=2048]
prepare_corpus() {
  local freeride=$1 root=$2 dir=$3 val=${4:-2048}
  mkdir -p "$dir"
  cat "$root"/docs/*.md "$root"/README.md > "$dir/corpus.txt"
  "$freeride" prepare --input "$dir/corpus.txt" --out "$dir" --val_tokens "$val" \
    --tokenizer "$root/data/r50k_base.tiktoken" > /dev/null
}

# The scripts' small GPT-2 as a config's [model] table: two layers of two heads, GPT-2's
# vocabulary (the corpus is tokenized with its tokenizer).
#   model_toml N_EMBD MAX_SEQ_LEN
model_toml() {
  printf '[model]\nn_layer = 2\nn_head = 2\nn_embd = %s\nmax_seq_len = %s\nvocab_size = 50257\n' \
    "$1" "$2"
}

# The scripts' tiny run as a config's [run], [model], [data] and [train] tables: model_toml's
# GPT at width 32, 4 sequences of 32 tokens a step from the shards in DATA_DIR, shuffled when
# the fifth argument says `shuffle`. The caller appends the tables its test needs.
#   tiny_run_toml SEED DATA_DIR MICROBATCHES STEPS [shuffle]
tiny_run_toml() {
  printf '[run]\nseed = %s\nlog_every = 1000\n' "$1"
  model_toml 32 32
  printf '[data]\ntrain = "%s/train_*.bin"\n' "$2"
  [[ ${5:-} == shuffle ]] && printf 'shuffle = true\n'
  printf '[train]\nbatch_size = 4\nseq_len = 32\nmicrobatches = %s\nsteps = %s\n' "$3" "$4"
}

# The train losses of RUN_DIR/metrics.jsonl as one line: "[l1, l2, ...]".
train_losses() {
  python3 -c '
import json, sys
print([r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"])' \
    "$1/metrics.jsonl"
}

# A mark for the processes of one run: pass `FREERIDE_RUN_MARK=$mark` in the environment of the
# command that starts the run (never export it in the script itself). Every process the run
# makes inherits it, including those that escape its process tree (setsid, double forks), and
# nothing else carries it: `marked_processes` finds exactly them.
new_run_mark() { od -An -N8 -tx8 /dev/urandom | tr -d ' '; }

# The pids of live processes whose environment holds FREERIDE_RUN_MARK=MARK (zombies, whose
# environment is gone, are not listed), one a line.
#   marked_processes MARK
marked_processes() {
  grep -laF "FREERIDE_RUN_MARK=$1" /proc/[0-9]*/environ 2> /dev/null |
    sed -E 's#^/proc/([0-9]+)/environ$#\1#' || true
}

# SIGKILLs every process marked MARK (the cleanup on every exit path of a script).
#   kill_marked MARK
kill_marked() {
  local pid
  for pid in $(marked_processes "$1"); do kill -KILL "$pid" 2> /dev/null || true; done
}

# Waits up to 300 s for COMMAND (eval'd) to succeed, while the run $pid lives; calls the
# script's own `fail MESSAGE` when the run ends first or time is up (a loaded machine is slow,
# never wrong).
#   wait_for COMMAND
wait_for() {
  for _ in $(seq 3000); do
    if eval "$1"; then return 0; fi
    kill -0 "$pid" 2> /dev/null || fail "the run ended while waiting for: $1"
    sleep 0.1
  done
  fail "gave up after 300 s waiting for: $1"
}
