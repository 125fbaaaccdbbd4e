# Sourced by the bench scripts that train a small model on synthetic tokens and compare arms
# over rounds (dp_bucket_bench.sh, memory_bench.sh, step_sync_bench.sh, zero_overlap_bench.sh):
# strict mode, the repository root as the working folder, `build` (BUILD_DIR or build/), the
# ROUNDS STEPS WARMUP arguments, the token shards, the log's first and last lines, and
# bench_stats.py (the summaries' 95% intervals) on PYTHONPATH for the scripts' Python.
#   source "$(dirname "${BASH_SOURCE[0]}")/bench_common.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-$root/build}
export PYTHONPATH="$root/bench${PYTHONPATH:+:$PYTHONPATH}"

# bench_args ROUNDS STEPS WARMUP "$@": sets rounds, steps and warmup from the script's first
# three arguments, each defaulting to the value given. A warm-up of every step leaves none to
# time: exit 2.
bench_args() {
  rounds=${4:-$1}
  steps=${5:-$2}
  warmup=${6:-$3}
  if ((warmup >= steps)); then
    echo "error: WARMUP ($warmup) must be below STEPS ($steps)" >&2
    exit 2
  fi
}

# write_tokens DIR VOCAB NAME:COUNT...: llm.c token shards in DIR, COUNT tokens each drawn
# uniformly below VOCAB, from one generator seeded 7 (the same files on every run).
write_tokens() {
  python3 - "$@" <<'PY'
import random, struct, sys
random.seed(7)
folder, vocab = sys.argv[1], int(sys.argv[2])
for spec in sys.argv[3:]:
    name, n = spec.split(":")
    n = int(n)
    header = [20240520, 1, n] + [0] * 253
    with open(f"{folder}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *[random.randrange(vocab) for _ in range(n)]))
PY
}

# The log's first line: when, which commit, the machine and its load, and the arguments.
bench_header() {
  echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) CPUs;" \
    "load $(cut -d' ' -f1-3 /proc/loadavg); rounds $rounds, steps $steps, warm-up $warmup"
}

# The log's last line (LOG: where it is kept).
bench_footer() {
  echo "== done $(date -u); load $(cut -d' ' -f1-3 /proc/loadavg); log $1"
}
