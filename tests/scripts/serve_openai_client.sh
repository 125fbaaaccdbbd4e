#!/usr/bin/env bash
# The `serve` side task as an OpenAI client sees it: the official `openai` npm client
# (launch/fetch_openai_client.sh installs it into data/npm/) drives serve over 127.0.0.1 during
# a training run (stage 0 of a 2-stage pipeline, its peer emulated: one process, no MPI):
# models, plain, streamed, stop, a list of prompts, n, chat (plain and streamed), usage, and
# errors as the client's own exception classes (tests/scripts/serve_openai_client.mjs). The
# server listens on a port the kernel picks (port = 0: no clash with another test).
# Without node at all the test is SKIPPED (exit 77); with node but without the client it FAILS
# (CI runs launch/install_deps.sh, which installs it).
#   tests/scripts/serve_openai_client.sh --build DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 100000 "$@"
if ! command -v node >/dev/null; then
  echo "SKIPPED: node is not installed (launch/install_deps.sh installs it with npm)"
  exit 77
fi
client=$root/data/npm/node_modules/openai
[[ -f $client/package.json ]] || {
  echo "FAIL: the openai npm client is missing from $root/data/npm (run launch/install_deps.sh," \
    "or launch/fetch_openai_client.sh)" >&2
  exit 1
}
export OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/freeride_serve_openai.XXXXXX)
mark=$(new_run_mark)
trap 'kill_marked "$mark"; rm -rf "$work"' EXIT
freeride=$build/freeride
fail() { echo "FAIL: $*" >&2; tail -20 "$work/serve.log" >&2 || true; exit 1; }
cd "$root"

prepare_corpus "$freeride" "$root" "$work/data"
"$freeride" train --set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin" \
  --set train.steps=4 --set eval.every=0 --set run.dir="$work/model" > "$work/model.log" 2>&1 ||
  fail "training the served model failed"
model=$work/model/checkpoints/step_00000004/model.bin

cat > "$work/serve.toml" <<TOML
[run]
seed = 5
log_every = 1000
$(model_toml 64 128)
[data]
train = "$work/data/train_*.bin"
[train]
batch_size = 4
seq_len = 32
microbatches = 4
steps = $steps
[eval]
every = 0
[parallel]
pp = 2
[runtime]
emulate_peers = true
emulated_stage = 0
[freeride]
enabled = true
[[side_tasks]]
type = "serve"
memory_limit = "256MiB"
[side_tasks.args]
checkpoint = "$model"
port = 0
max_batch = 4
max_queue = 16
max_tokens = 64
TOML
FREERIDE_RUN_MARK=$mark "$freeride" train --config "$work/serve.toml" --set run.dir="$work/serve" \
  > "$work/serve.log" 2>&1 &
run=$!
# Up to 100 s: a loaded machine calibrates the emulated peer and loads the model slowly.
for _ in $(seq 400); do
  [[ -s $work/serve/side_tasks/serve_r0/address ]] && break
  kill -0 $run 2>/dev/null || fail "the run ended before the server came up"
  sleep 0.25
done
[[ -s $work/serve/side_tasks/serve_r0/address ]] || fail "no server address after 100 s"
address=$(cat "$work/serve/side_tasks/serve_r0/address")
"$freeride" sample --checkpoint "$model" --prompt "In the beginning" --tokens 12 --seed 3 \
  --temperature 0.9 --top_k 30 --format jsonl > "$work/sample.json"

NODE_PATH=$root/data/npm/node_modules node "$root/tests/scripts/serve_openai_client.mjs" \
  "$address" "$work/sample.json" "$client/index.mjs" || fail "the openai client's checks above"

kill -USR1 $run
status=0
wait $run || status=$?
((status == 3)) || fail "the run with the server ended with status $status, not 3 (stopped)"
grep -q '"name": "serve".*requests served' "$work/serve/side_tasks_rank000.jsonl" ||
  fail "no serve summary in side_tasks_rank000.jsonl"
echo "PASS: the openai npm client's requests were served from the bubbles of a training run"
