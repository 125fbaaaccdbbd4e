#!/usr/bin/env bash
# Serving beside a fill job of a higher priority (issue 47): a 2-rank pipeline (the KJV shards,
# the quickstart's model) serves completions from stage 0's bubbles while a fill job submitted
# with `--priority 2` wants every bubble of that stage. Arms, on an idle machine and beside two
# busy processes: `alone` (the server only) and `fill` (the server and the job). Each sends
# REQUESTS streaming requests one after another (24 tokens each) and measures the time to the
# first token at the client; the server's own count against its target_ttft_ms comes from
# /metrics. One log: bench/results/DATE-cpu-serve-ttft.log, the runs under runs/serve_ttft/.
# Usage: bench/serve_ttft_bench.sh [REQUESTS=20] [TARGET_MS=1000] [LOADS="idle busy"]
#   (needs data/kjv and data/r50k_base.tiktoken; a build in $BUILD_DIR, default build/)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
requests=${1:-20}
target_ms=${2:-1000}
loads=${3:-idle busy}
build=${BUILD_DIR:-$root/build}
freeride=$build/freeride
out=runs/serve_ttft
mkdir -p bench/results "$out"
log="bench/results/$(date +%F)-cpu-serve-ttft.log"
exec > >(tee "$log") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) CPUs;" \
  "$requests requests an arm; target ${target_ms} ms; loads: $loads"
busy_pids=()
cleanup() {
  ((${#busy_pids[@]})) && kill "${busy_pids[@]}" 2>/dev/null || true
  pkill -KILL -f "$root/$out/" 2>/dev/null || true
}
trap cleanup EXIT

# The served model: the quickstart's, 30 steps on the KJV shards.
model_dir=$out/model
if [[ ! -f $model_dir/checkpoints/latest ]]; then
  "$freeride" train --config configs/tiny_cpu.toml --set run.dir="\"$model_dir\"" \
    --set train.steps=30 --set eval.every=0 --set checkpoint.every=30 --overwrite \
    > "$out/model.log" 2>&1
fi
model=$(ls -d "$model_dir"/checkpoints/step_*/ | tail -1)model.bin

{
  cat configs/tiny_cpu_pp2.toml
  printf '\n[freeride]\nenabled = true\n\n[[side_tasks]]\ntype = "serve"\nstages = [0]\n'
  printf 'memory_limit = "256MiB"\n[side_tasks.args]\ncheckpoint = "%s"\nport = 0\n' "$root/$model"
  printf 'max_tokens = 64\ntarget_ttft_ms = %s\n' "$target_ms"
} > "$out/serve.toml"
cat > "$out/fill.toml" <<'TOML'
[[side_tasks]]
type = "spin"
stages = [0]
[side_tasks.args]
step_ms = 2
TOML

arm() {  # load arm
  local dir=$root/$out/$1-$2
  rm -rf "$dir"
  launch/run.sh -n 2 "$out/serve.toml" --set run.dir="\"$dir\"" \
    --set train.steps=100000 --set eval.every=0 --set checkpoint.every=0 > "$dir.log" 2>&1 &
  local run=$!
  for _ in $(seq 600); do
    [[ -s $dir/side_tasks/serve_r0/address ]] && break
    kill -0 $run 2>/dev/null || { echo "$1 $2: the run ended early (see $dir.log)"; return 1; }
    sleep 0.2
  done
  if [[ $2 == fill ]]; then
    "$freeride" submit "$dir" "$root/$out/fill.toml" --name fill --priority 2 > /dev/null
    for _ in $(seq 600); do
      "$freeride" jobs "$dir" | grep -q "RUNNING" && break
      sleep 0.2
    done
  fi
  python3 - "$(cat "$dir/side_tasks/serve_r0/address")" "$requests" "$1 $2" <<'EOF'
import http.client, json, statistics, sys, time
address, n, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
host, port = address.replace("http://", "").split(":")
ttft = []
for i in range(n):
    body = json.dumps({"prompt": "And God said", "max_tokens": 24, "stream": True,
                       "temperature": 0, "seed": i})
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    for line in resp:
        if line.startswith(b"data: ") and b"[DONE]" not in line and first is None:
            first = time.monotonic() - start
    conn.close()
    ttft.append(first if first is not None else float("nan"))
ttft.sort()
print(f"{label}: TTFT ms median {1e3 * statistics.median(ttft):.0f}, "
      f"p90 {1e3 * ttft[int(0.9 * (len(ttft) - 1))]:.0f}, max {1e3 * ttft[-1]:.0f} "
      f"over {len(ttft)} requests")
EOF
  curl -s "$(cat "$dir/side_tasks/serve_r0/address")/metrics" | grep "ttft_target_total" | sed "s/^/$1 $2: /"
  [[ $2 == fill ]] && "$freeride" jobs "$dir" | sed "s/^/$1 $2: /"
  pkill -USR1 -f "mpirun.*$dir" 2>/dev/null || kill -USR1 $run
  wait $run || true
}

for load in $loads; do
  if [[ $load == busy ]]; then
    for _ in 1 2; do
      (while :; do :; done) &
      busy_pids+=($!)
    done
  fi
  for a in alone fill; do arm "$load" "$a"; done
  cleanup
  busy_pids=()
done
