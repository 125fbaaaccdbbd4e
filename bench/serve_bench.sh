#!/usr/bin/env bash
# Serving from bubbles under load: the tiny 2-stage CPU pipeline (2 bound ranks, one thread
# each) with the `serve` task on stage 0, a model trained first on the KJV shards. Per request
# rate, an open-loop Poisson load generator on localhost (prompts from a fixed list, 32 tokens
# each, bounded at the rate × the run's length) runs against:
#   1. a run that harvests every step: latency and time-to-first-token p50/p95/p99, completed
#      requests/s and tokens/s, rejections;
#   2. a run in alternating blocks of 4 steps (freeride.alternate_every): the training's
#      overhead, with the load on.
# Then one run without side tasks: its losses must equal every served run's.
# Usage: bench/serve_bench.sh [STEPS=64] [RATES="0.5 1 2 4"]   (after launch/prepare_data.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-64}
rates=${2:-"0.5 1 2 4"}
build=${BUILD_DIR:-build}
[[ -x $build/freeride ]] || build=build-cpu
export BUILD_DIR=$build OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/serve_bench.XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "== $(date -u) $(git rev-parse --short HEAD); $(nproc --all) cores; $steps steps per run"
"$build/freeride" train --set train.steps=60 --set eval.every=0 --set run.dir="$work/model" \
  > "$work/model.log" 2>&1
model=$work/model/checkpoints/step_00000060/model.bin
{
  cat configs/tiny_cpu_pp2.toml
  printf '\n[freeride]\nenabled = false\n\n[[side_tasks]]\ntype = "serve"\nstages = [0]\n'
  printf 'memory_limit = "256MiB"\n[side_tasks.args]\ncheckpoint = "%s"\nport = 0\n' "$model"
  printf 'max_batch = 4\nmax_queue = 32\nmax_tokens = 64\n'
} > "$work/serve.toml"
base=("$work/serve.toml" --set "train.steps=$steps" --set eval.every=0)

cat > "$work/load.py" <<'EOF'
import concurrent.futures, json, random, sys, threading, time, urllib.error, urllib.request
address_file, rate, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
for _ in range(400):
    try:
        address = open(address_file).read().strip()
        break
    except OSError:
        time.sleep(0.1)
prompts = ["And God said", "In the beginning", "The LORD is my shepherd", "Blessed are",
           "And it came to pass", "Let there be light"]
rng = random.Random(1)
results, lock, stop = [], threading.Lock(), threading.Event()

def one(i):
    body = json.dumps({"prompt": prompts[i % len(prompts)], "max_tokens": 32, "seed": i}).encode()
    t0 = time.time()
    try:
        req = urllib.request.Request(address + "/v1/completions", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        record = {"status": 200, "latency_ms": (time.time() - t0) * 1e3,
                  "first_token_ms": reply["timings"]["first_token_ms"],
                  "tokens": reply["usage"]["completion_tokens"]}
    except urllib.error.HTTPError as e:
        record = {"status": e.code}
    except OSError:
        record = {"status": 0}  # the run ended under it
    with lock:
        results.append(record)

def alive():
    try:
        urllib.request.urlopen(address + "/health", timeout=5).read()
        return True
    except OSError:
        return False

start, i = time.time(), 0
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    while alive() and i < 100000:
        time.sleep(rng.expovariate(rate))
        pool.submit(one, i)
        i += 1
    elapsed = time.time() - start
json.dump({"sent": i, "seconds": elapsed, "results": results}, open(out, "w"))
EOF

summarize() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
load, rate = json.load(open(sys.argv[1])), sys.argv[2]
ok = [r for r in load["results"] if r["status"] == 200]
def pct(key, q):
    v = sorted(r[key] for r in ok)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
rejected = sum(r["status"] in (429, 503) for r in load["results"])
print(f"| {rate} | {load['sent']} | {len(ok)} | {rejected} | "
      f"{pct('latency_ms', .5):.0f} / {pct('latency_ms', .95):.0f} / {pct('latency_ms', .99):.0f} | "
      f"{pct('first_token_ms', .5):.0f} / {pct('first_token_ms', .95):.0f} / {pct('first_token_ms', .99):.0f} | "
      f"{len(ok) / load['seconds']:.2f} | {sum(r['tokens'] for r in ok) / load['seconds']:.1f} |")
EOF
}
losses() { python3 -c '
import json, sys
print([r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"])' "$1"; }

launch/run.sh -n 2 "${base[@]}" --set run.dir="$work/plain" > "$work/plain.log" 2>&1
plain=$(losses "$work/plain/metrics.jsonl")
table="| req/s | sent | served | rejected | latency ms p50 / p95 / p99 | first token ms p50 / p95 / p99 | served/s | tokens/s |
|---|---|---|---|---|---|---|---|"
overheads=""
for rate in $rates; do
  for mode in always alternate; do
    every=0
    [[ $mode == alternate ]] && every=4
    dir=$work/${mode}_$rate
    launch/run.sh -n 2 "${base[@]}" --set run.dir="$dir" --set freeride.enabled=true \
      --set "freeride.alternate_every=$every" > "$dir.log" 2>&1 &
    run=$!
    python3 "$work/load.py" "$dir/side_tasks/serve_r0/address" "$rate" "$dir.load.json"
    wait $run
    [[ $(losses "$dir/metrics.jsonl") == "$plain" ]] || { echo "LOSSES DIFFER at $rate req/s ($mode)"; exit 1; }
    if [[ $mode == always ]]; then
      table+=$'\n'$(summarize "$dir.load.json" "$rate")
      grep -o '"summary": "[^"]*requests served[^"]*"' "$dir/side_tasks_rank000.jsonl" | sed "s/^/$rate req\/s: /"
    else
      overheads+=$(python3 -c '
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "harvest_summary" in l][-1]
overhead = 100 * s["overhead"]
print(f"| {sys.argv[2]} | {overhead:+.2f}% |")' \
        "$dir/metrics.jsonl" "$rate")$'\n'
    fi
  done
done
echo
echo "$table"
echo
echo "| req/s | training overhead (alternating blocks of 4) |"
echo "|---|---|"
echo -n "$overheads"
echo
echo "losses of every served run equal the run without side tasks: $plain"
