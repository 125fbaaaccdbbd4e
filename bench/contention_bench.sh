#!/usr/bin/env bash
# Side work beside other work on the host (issue 47): the quickstart's 2-rank pipeline
# (configs/tiny_cpu_pp2_freeride.toml, PageRank and images in its bubbles), three arms in
# alternating rounds, on an idle machine and beside a competing load of two busy processes:
#   plain    freeride.enabled = false (the reference);
#   harvest  side work in every step, the guard off (freeride.overhead_check = "off");
#   guarded  side work under the overhead budget (overhead_check = "on", max_overhead 1%);
#   strict   the same with overhead_check = "strict" (a level kept only while shown within 1%).
# Each round runs the arms in a shuffled order; an arm's overhead is the mean of its rounds'
# ratios (mean step time after the first WARMUP steps over the plain arm's in the same round,
# minus 1) with a 95% t-interval; reclaimed is the run's own figure (side work in seconds of the
# tasks alone over the training's device-seconds); the guard's back-offs are counted, with the
# run's own in-run interval and the level it ended at. ARMS="plain guarded strict" picks arms
# (plain is always run: the reference).
# One log: bench/results/DATE-cpu-contention.log, with each run's log under runs/contention/.
# Usage: bench/contention_bench.sh [ROUNDS=3] [STEPS=64] [LOADS="idle busy"]
#   (needs data/kjv: launch/prepare_data.sh; a build in $BUILD_DIR, default build/)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
rounds=${1:-3}
steps=${2:-64}
loads=${3:-idle busy}
warmup=8
arms="plain ${ARMS:-harvest guarded strict}"
arms=$(printf '%s\n' $arms | awk '!seen[$0]++' | xargs)
config=configs/tiny_cpu_pp2_freeride.toml
out=runs/contention
mkdir -p bench/results "$out"
log="bench/results/$(date +%F)-cpu-contention.log"
exec > >(tee "$log") 2>&1
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) CPUs;" \
  "$rounds rounds of $steps steps; loads: $loads"
busy_pids=()
stop_busy() {
  ((${#busy_pids[@]})) && kill "${busy_pids[@]}" 2>/dev/null || true
  busy_pids=()
}
trap stop_busy EXIT

arm_sets() {
  case $1 in
    plain) echo "--set freeride.enabled=false" ;;
    harvest) echo "--set freeride.overhead_check=\"off\" --set freeride.alternate_every=0" ;;
    guarded) echo "--set freeride.overhead_check=\"on\" --set freeride.alternate_every=0" ;;
    strict) echo "--set freeride.overhead_check=\"strict\" --set freeride.alternate_every=0" ;;
  esac
}

for load in $loads; do
  if [[ $load == busy ]]; then
    for _ in 1 2; do
      (while :; do :; done) &
      busy_pids+=($!)
    done
  fi
  for ((r = 1; r <= rounds; r++)); do
    for arm in $(printf '%s\n' $arms | shuf); do
      dir=$out/$load-$arm-$r
      # shellcheck disable=SC2046
      launch/run.sh -n 2 "$config" --set run.dir="\"$dir\"" --set train.steps="$steps" \
        --set eval.every=0 --set checkpoint.every=0 $(arm_sets "$arm") --overwrite \
        >"$out/$load-$arm-$r.log" 2>&1 || echo "round $r $arm: exit $? (see $out/$load-$arm-$r.log)"
      echo "$load round $r $arm: $(grep -cE 'backing off' "$out/$load-$arm-$r.log" || true) back-offs"
    done
  done
  stop_busy
done

python3 - "$out" "$rounds" "$warmup" "$loads" "$arms" <<'PY'
import json, math, statistics, sys
out, rounds, warmup, loads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
arms = sys.argv[5].split()
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}
def run(load, arm, r):
    steps, summary = [], {}
    for line in open(f"{out}/{load}-{arm}-{r}/metrics.jsonl"):
        rec = json.loads(line)
        if rec.get("kind") == "train" and rec["step"] > warmup:
            steps.append(rec["step_s"])
        if rec.get("kind") == "harvest_summary":
            summary = rec
    return statistics.mean(steps), summary
def interval(values):
    m = statistics.mean(values)
    if len(values) < 2:
        return m, float("nan"), float("nan")
    h = T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return m, m - h, m + h
for load in loads:
    print(f"== {load}: per arm, against plain in the same round")
    print("| arm | mean step s | overhead (95% CI) | reclaimed | back-offs | in-run interval, end level |")
    print("|---|---|---|---|---|---|")
    for arm in arms:
        ratios, step_s, reclaimed, back, inrun = [], [], [], 0, []
        for r in range(1, rounds + 1):
            plain, _ = run(load, "plain", r)
            mine, summary = run(load, arm, r)
            ratios.append(mine / plain - 1)
            step_s.append(mine)
            reclaimed.append(summary.get("reclaimed") or 0.0)
            back += summary.get("back_offs") or 0
            ci = summary.get("overhead_ci")
            if summary.get("overhead") is not None:
                inrun.append(f"{100*summary['overhead']:+.1f}%" +
                             (f" [{100*ci[0]:+.1f}, {100*ci[1]:+.1f}]" if ci else "") +
                             (f" {summary['guard_level']}" if summary.get("guard_level") else ""))
        m, lo, hi = interval(ratios)
        print(f"| {arm} | {statistics.mean(step_s):.4f} | {100*m:+.2f}% [{100*lo:+.2f}%, "
              f"{100*hi:+.2f}%] | {100*statistics.mean(reclaimed):.2f}% | {back} | "
              f"{'; '.join(inrun) or '—'} |")
PY
