#!/usr/bin/env bash
# The `serve` side task during a 2-rank pipeline run: completions answered from stage 0's
# bubbles equal `freeride sample` for the same checkpoint, prompt and seed (text and token ids);
# bad requests get a 400 naming what is wrong (tests/scripts/serve_openai_client.sh drives the
# OpenAI API subset with the official client); a full queue answers 429 with Retry-After; a
# client that goes away is counted cancelled; /health and /metrics answer; and the run's losses
# equal the same run without side tasks, bit for bit. The served run trains until the client's
# checks are done (at most --steps steps) and is then stopped by SIGUSR1 at a step boundary, so
# no check races the end of training; the plain run then trains as many steps.
#   tests/scripts/serve_pipeline.sh --build DIR [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 100000 "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export BUILD_DIR=$build
work=$(mktemp -d /tmp/freeride_serve.XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
freeride=$build/freeride
fail() { echo "FAIL: $*" >&2; tail -20 "$work/serve.log" >&2 || true; exit 1; }
cd "$root"

prepare_corpus "$freeride" "$root" "$work/data"
data=(--set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin")
"$freeride" train "${data[@]}" --set train.steps=10 --set eval.every=0 \
  --set run.dir="$work/model" > "$work/model.log" 2>&1 || fail "training the served model failed"
model=$work/model/checkpoints/step_00000010/model.bin

cat > "$work/serve.toml" <<TOML
[run]
seed = 5
log_every = 1000
[model]
n_layer = 4
n_head = 4
n_embd = 128
max_seq_len = 256
vocab_size = 50257
[data]
train = "$work/data/train_*.bin"
[train]
batch_size = 8
seq_len = 64
microbatches = 4
steps = $steps
[optim]
schedule = "constant"
[eval]
every = 0
[parallel]
pp = 2
[freeride]
enabled = true
[[side_tasks]]
type = "serve"
stages = [0]
memory_limit = "128MiB"
[side_tasks.args]
checkpoint = "$model"
port = 0
max_batch = 2
max_queue = 2
max_tokens = 200
TOML
launch/run.sh -n 2 "$work/serve.toml" --set run.dir="$work/serve" > "$work/serve.log" 2>&1 &
run=$!
# Up to 100 s (the entry's TIMEOUT is 300 s): a loaded machine starts two ranks, a model and a
# decoder slowly; a run that dies is noticed at once.
for _ in $(seq 400); do
  [[ -s $work/serve/side_tasks/serve_r0/address ]] && break
  kill -0 $run 2>/dev/null || fail "the run ended before the server came up"
  sleep 0.25
done
address=$(cat "$work/serve/side_tasks/serve_r0/address")
for seed in 1 2; do
  "$freeride" sample --checkpoint "$model" --prompt "In the beginning" --tokens 20 --seed $seed \
    --temperature 0.9 --top_k 30 --format jsonl > "$work/sample_$seed.json"
done

python3 - "$address" "$work" <<'EOF' || fail "the client's checks above"
import concurrent.futures, json, socket, sys, time, urllib.error, urllib.request
address, work = sys.argv[1], sys.argv[2]

def post(body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(address + "/v1/completions", data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())

# Served in bubbles, equal to `freeride sample` (two at once: they share the batch).
asks = {seed: {"prompt": "In the beginning", "max_tokens": 20, "seed": seed,
               "temperature": 0.9, "top_k": 30} for seed in (1, 2)}
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    answers = dict(zip(asks, pool.map(post, asks.values())))
for seed, (status, _, body) in answers.items():
    want = json.load(open(f"{work}/sample_{seed}.json"))
    assert status == 200, (status, body)
    choice = body["choices"][0]
    assert choice["tokens"] == want["tokens"], (seed, choice["tokens"], want["tokens"])
    assert choice["text"] == want["text"], (seed, choice["text"], want["text"])
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}
    assert body["timings"]["total_ms"] >= body["timings"]["first_token_ms"] > 0
print("equal to freeride sample:", [answers[s][2]["choices"][0]["text"] for s in asks])

# Bad input: 400 with the field named.
for body, raw, words in [(None, b"{not json", "not a JSON object"),
                         ({"max_tokens": 4}, None, "'prompt'"),
                         ({"prompt": "a", "bogus": True}, None, "Unrecognized request argument supplied: bogus"),
                         ({"prompt": "a", "max_tokens": 201}, None, "'max_tokens'"),
                         ({"prompt": "a", "temperature": -1}, None, "'temperature'"),
                         ({"prompt": "word " * 300}, None, "exceed the model's context")]:
    status, _, reply = post(body, raw)
    assert status == 400 and words in reply["error"]["message"], (status, reply, words)
print("bad requests: 400 with the reason")

def metrics():
    with urllib.request.urlopen(address + "/metrics?format=json", timeout=10) as r:
        return json.loads(r.read())

def wait_for(what, ok, seconds=60):
    deadline = time.time() + seconds
    while not ok(m := metrics()):
        assert time.time() < deadline, (what, m)
        time.sleep(0.05)
    return m

# A client that leaves while its request waits behind two long ones: it is cancelled (counted)
# and never takes a slot; the long ones are still answered.
long = {"prompt": "And", "max_tokens": 200}
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    busy = [pool.submit(post, dict(long, seed=s)) for s in (1, 2)]
    wait_for("both slots taken", lambda m: m["active"] == 2)
    host, port = address.split("//")[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    payload = json.dumps({"prompt": "And", "max_tokens": 8}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    wait_for("the request queued", lambda m: m["queue"] >= 1 or m["requests_cancelled"] >= 1)
    s.close()
    wait_for("the departed client counted", lambda m: m["requests_cancelled"] >= 1)
    assert [f.result()[0] for f in busy] == [200, 200], [f.result() for f in busy]
print("departed client: cancelled; the long requests answered")

# Overload: 2 slots and a queue of 2, filled only between bubbles; ten at once, most are
# turned away with Retry-After.
with concurrent.futures.ThreadPoolExecutor(10) as pool:
    results = list(pool.map(post, [{"prompt": "And", "max_tokens": 48, "seed": i} for i in range(10)]))
codes = sorted(r[0] for r in results)
assert 429 in codes and 200 in codes, codes
assert all(r[1].get("Retry-After") == "1" for r in results if r[0] == 429)
print("overload:", codes)

m = metrics()
# Served: the two above, the two long ones and at least one of the burst.
assert m["requests_cancelled"] == 1 and m["requests_served"] >= 5, m
assert m["requests_rejected"] >= 1 and m["active"] == 0 and m["queue"] == 0, m
assert m["latency_ms"]["p99"] >= m["latency_ms"]["p50"] > 0, m
with urllib.request.urlopen(address + "/health", timeout=10) as r:
    assert json.loads(r.read())["status"] == "ok"
print("metrics:", json.dumps(m))
EOF
# Stop the served run at a step boundary once it has trained 20 steps or more (mpirun forwards
# SIGUSR1 to the ranks; exit 3).
for _ in $(seq 1000); do  # up to 100 s
  (($(grep -c '"kind": "train"' "$work/serve/metrics.jsonl" || true) >= 20)) && break
  kill -0 $run 2>/dev/null || fail "the run with the server ended before it was stopped"
  sleep 0.1
done
mpirun_pid=$(pgrep -P $run -x mpirun || true)
kill -USR1 "${mpirun_pid:-$run}"
status=0
wait $run || status=$?
((status == 3)) || fail "the run with the server ended with status $status, not 3 (stopped)"
grep -q '"name": "serve".*requests served' "$work/serve/side_tasks_rank000.jsonl" ||
  fail "no serve summary in side_tasks_rank000.jsonl"
done_steps=$(grep -c '"kind": "train"' "$work/serve/metrics.jsonl")
launch/run.sh -n 2 "$work/serve.toml" --set run.dir="$work/plain" --set freeride.enabled=false \
  --set train.steps="$done_steps" > "$work/plain.log" 2>&1 || fail "the run without side tasks failed"
[[ $(train_losses "$work/serve") == "$(train_losses "$work/plain")" ]] ||
  fail "losses with the server differ from the run without side tasks"
echo "PASS: served from bubbles during $done_steps steps; losses equal the run without side tasks"
