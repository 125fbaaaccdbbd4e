#!/usr/bin/env bash
# `freeride report` in a real browser: the quickstart's 2-rank pipeline with side tasks, a
# `freeride study` (one real stage, an emulated peer) and a run that fails (a learning rate
# that makes the loss non-finite). Each report is rendered by headless Chromium: it must load
# with no console message, every plot in the DOM Chromium built must draw data, and the
# failed run must say why it failed. Screenshots go to SHOTS (outside the repository).
#   tests/scripts/report_browser.sh --build DIR [--shots DIR]
# Exits 77 (skipped) when no Chromium is installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-$root/build} shots=""
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --shots) shots=$2; shift 2 ;;
    *) echo "usage: $0 --build DIR [--shots DIR]" >&2; exit 2 ;;
  esac
done
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z $browser ]]; then
  echo "SKIPPED: no chromium on PATH (Debian: apt-get install chromium)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export BUILD_DIR=$build
work=$(mktemp -d /tmp/freeride_report.XXXXXX)
trap 'rm -rf "$work"' EXIT
shots=${shots:-$build/Testing/report_screenshots}
mkdir -p "$shots"
freeride=$build/freeride
fail() { echo "FAIL: $*" >&2; exit 1; }

source "$root/tests/scripts/common.sh"
prepare_corpus "$freeride" "$root" "$work/data"
data=(--set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin")
config=$root/configs/tiny_cpu_pp2_freeride.toml

"$root/launch/run.sh" -n 2 "$config" "${data[@]}" --set train.steps=12 --set eval.every=4 \
  --set run.dir="$work/pipeline" > "$work/pipeline.log" 2>&1 || fail "pipeline run failed"
grep -q "freeride report $work/pipeline" "$work/pipeline.log" ||
  fail "the training log does not end with the report command"
# A study writes into run.dir/study: here $work/study.
"$root/launch/run.sh" -n 1 --study "$config" "${data[@]}" --set runtime.emulate_peers=true \
  --set run.dir="$work" --rounds 1 --block_steps 2 > "$work/study.log" 2>&1 ||
  fail "study failed"
if "$freeride" train "${data[@]}" --set optim.lr=1e12 --set optim.on_nonfinite=stop \
  --set train.steps=20 --set run.dir="$work/failed" > "$work/failed.log" 2>&1; then
  fail "the run with lr 1e12 did not fail"
fi

for run in pipeline study failed; do
  "$freeride" report "$work/$run" --out "$work/$run.html" > /dev/null 2> "$work/$run.notes" ||
    fail "freeride report $run: $(cat "$work/$run.notes")"
  "$browser" --headless --no-sandbox --disable-gpu --no-first-run --enable-logging=stderr --v=0 \
    --user-data-dir="$work/profile" --virtual-time-budget=2000 --dump-dom \
    "file://$work/$run.html" > "$work/$run.dom" 2> "$work/$run.console" ||
    fail "$run: chromium could not load the report: $(tail -5 "$work/$run.console")"
  # Chromium logs page console messages as "CONSOLE(line)" or ":CONSOLE:"; none is expected.
  if grep -E "CONSOLE|Uncaught" "$work/$run.console"; then fail "$run: console messages above"; fi
  "$browser" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
    --user-data-dir="$work/profile" --window-size=1200,2600 --screenshot="$shots/$run.png" \
    "file://$work/$run.html" > /dev/null 2>&1 || fail "$run: no screenshot"
  python3 - "$work/$run.dom" "$run" <<'EOF' || fail "$run: the DOM check above"
import sys
from html.parser import HTMLParser

class Plots(HTMLParser):
    def __init__(self):
        super().__init__()
        self.plots, self.depth, self.text = [], 0, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "plot" in (a.get("class") or "").split():
            self.plots.append({"title": a.get("aria-label"), "points": int(a.get("data-points", 0)), "marks": 0})
            self.depth = 1
        elif self.depth:
            self.depth += tag != "svg"
            if tag in ("polyline", "circle") or (tag == "rect" and a.get("class") == "bar-part"):
                self.plots[-1]["marks"] += 1
    def handle_endtag(self, tag):
        if self.depth and tag == "svg":
            self.depth = 0
    def handle_data(self, data):
        self.text.append(data)

dom, run = open(sys.argv[1]).read(), sys.argv[2]
p = Plots()
p.feed(dom)
text = " ".join(p.text)
expected = {"pipeline": ["Loss", "Throughput", "Bubble and harvested time by stage and kind",
                         "Bubbles: predicted against measured"],
            "study": ["Bubble and harvested time per arm"],
            "failed": ["Loss", "Gradient norm (before clipping)"]}[run]
titles = [x["title"] for x in p.plots]
for title in expected:
    assert title in titles, f"{run}: no plot '{title}' in {titles}"
for x in p.plots:
    assert x["points"] > 0 and x["marks"] > 0, f"{run}: plot '{x['title']}' draws no data: {x}"
if run == "pipeline":
    assert "Side tasks" in text and "pagerank" in text and "finished at step 12" in text, run
if run == "study":
    assert "+ pagerank" in text and "A/A" in text, run
if run == "failed":
    assert "failed at step" in text and "not finite" in text, run
print(f"{run}: {len(p.plots)} plots, all with data: {', '.join(titles)}")
EOF
done
[[ -s $work/pipeline/trace.json ]] || fail "no merged trace.json for the 2-rank run"
python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["args"]["name"] for e in t if e.get("ph") == "M" and e["name"] == "process_name"}
assert names == {"rank 0 (stage 0)", "rank 1 (stage 1)"}, names
' "$work/pipeline/trace.json" || fail "trace.json does not name both ranks"
echo "PASS: 3 reports load in $(basename "$browser") with no console message; screenshots in $shots"
