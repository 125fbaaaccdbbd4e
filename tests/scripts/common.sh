# Shared by the scripts in tests/scripts (sourced, not run): the --build/--steps options, a
# corpus of the project's own docs as token shards, and a run's training losses in step order.

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

# The train losses of RUN_DIR/metrics.jsonl as one line: "[l1, l2, ...]".
train_losses() {
  python3 -c '
import json, sys
print([r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"])' \
    "$1/metrics.jsonl"
}
