#!/usr/bin/env bash
# `freeride report` in a real browser: the quickstart's 2-rank pipeline with side tasks, the
# same as a ZB-V pipeline, a `freeride study` (one real stage, an emulated peer), a run that
# fails (a learning rate that makes the loss non-finite) and the comparison of the two
# pipelines (`freeride report A B`). Each page is rendered by headless Chromium: it must load
# with no console message, every plot in the DOM Chromium built must draw data with its legend
# right of the data area, a stage must have one colour in every plot, and each page must show
# what it is for (the failed run why it failed, the study its side-task bars and emulated
# stage, the comparison both runs and their config differences). Screenshots go to SHOTS.
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
"$root/launch/run.sh" -n 2 "$config" "${data[@]}" --set train.steps=12 --set eval.every=4 \
  --set parallel.schedule=zbv --set run.dir="$work/zbv" > "$work/zbv.log" 2>&1 ||
  fail "zbv run failed: $(tail -3 "$work/zbv.log")"
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

"$freeride" report "$work/pipeline" "$work/zbv" --out "$work/compare.html" > /dev/null \
  2> "$work/compare.notes" || fail "freeride report pipeline zbv: $(cat "$work/compare.notes")"
set +e
"$freeride" report "$work/pipeline" "$work/nothing" --out "$work/none.html" > /dev/null \
  2> "$work/none.err"
code=$?
set -e
[[ $code == 2 ]] && grep -q "$work/nothing is not a run directory" "$work/none.err" ||
  fail "a comparison with a directory holding no run: exit $code, $(cat "$work/none.err")"

for run in pipeline zbv study failed compare; do
  if [[ $run != compare ]]; then
    "$freeride" report "$work/$run" --out "$work/$run.html" > /dev/null 2> "$work/$run.notes" ||
      fail "freeride report $run: $(cat "$work/$run.notes")"
  fi
  "$browser" --headless --no-sandbox --disable-gpu --no-first-run --enable-logging=stderr --v=0 \
    --user-data-dir="$work/profile" --virtual-time-budget=2000 --dump-dom \
    "file://$work/$run.html" > "$work/$run.dom" 2> "$work/$run.console" ||
    fail "$run: chromium could not load the report: $(tail -5 "$work/$run.console")"
  # Chromium logs page console messages as "CONSOLE(line)" or ":CONSOLE:"; none is expected.
  if grep -E "CONSOLE|Uncaught" "$work/$run.console"; then fail "$run: console messages above"; fi
  "$browser" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
    --user-data-dir="$work/profile" --window-size=1200,4400 --screenshot="$shots/$run.png" \
    "file://$work/$run.html" > /dev/null 2>&1 || fail "$run: no screenshot"
  python3 - "$work/$run.dom" "$run" <<'EOF' || fail "$run: the DOM check above"
import sys
from html.parser import HTMLParser

class Plots(HTMLParser):
    def __init__(self):
        super().__init__()
        self.plots, self.depth, self.text = [], 0, []
        self.timeline_side_bars = 0
        self.in_title = False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "plot" in (a.get("class") or "").split():
            self.plots.append({"title": a.get("aria-label"), "points": int(a.get("data-points", 0)),
                               "marks": 0, "frame_right": None, "legend_x": [], "legend": [],
                               "shaded": 0, "fill": None})
            self.depth = 1
        elif self.depth:
            self.depth += tag != "svg"
            p = self.plots[-1]
            if tag in ("polyline", "circle") or (tag == "rect" and a.get("class") == "bar-part"):
                p["marks"] += 1
            if tag == "rect" and a.get("class") == "frame":
                p["frame_right"] = float(a["x"]) + float(a["width"])
            if tag == "rect" and a.get("class") == "shade":
                p["shaded"] += 1
            if tag == "g" and a.get("class") == "legend-entry":
                p["in_legend"] = True
            if tag == "rect" and p.get("in_legend"):
                p["legend_x"].append(float(a["x"]))
                p["fill"] = a.get("fill")
        if tag == "title":
            self.in_title = True
    def handle_endtag(self, tag):
        if self.depth and tag == "svg":
            self.depth = 0
        if tag == "title":
            self.in_title = False
    def handle_data(self, data):
        self.text.append(data)
        if self.in_title and data == "side task step":
            self.timeline_side_bars += 1
        if self.depth and self.plots[-1].get("in_legend"):
            p = self.plots[-1]
            p["legend"].append((data, p["fill"]))
            p["in_legend"] = False

dom, run = open(sys.argv[1]).read(), sys.argv[2]
p = Plots()
p.feed(dom)
text = " ".join(p.text)
per_step = ["Loss", "Throughput", "Step time", "MFU", "Host memory peak"]
expected = {"pipeline": per_step + ["Waiting, % of step time",
                                    "Bubble and harvested time by stage and kind",
                                    "Bubbles: predicted against measured"],
            "zbv": per_step + ["Waiting, % of step time", "Bubbles: predicted against measured"],
            "study": ["Bubble and harvested time per arm"],
            "failed": ["Loss", "Gradient norm (before clipping)"],
            "compare": ["Loss", "Loss against tokens", "Validation loss", "Throughput", "MFU",
                        "Host memory peak (largest stage)"]}[run]
titles = [x["title"] for x in p.plots]
for title in expected:
    assert title in titles, f"{run}: no plot '{title}' in {titles}"
stage_colours = {}
for x in p.plots:
    assert x["points"] > 0 and x["marks"] > 0, f"{run}: plot '{x['title']}' draws no data: {x}"
    for lx in x["legend_x"]:
        assert x["frame_right"] is not None and lx > x["frame_right"], \
            f"{run}: plot '{x['title']}' has a legend on its data: {x}"
    for name, fill in x["legend"]:
        if name.startswith("stage ") and fill:
            assert stage_colours.setdefault(name, fill) == fill, \
                f"{run}: {name} is {fill} in '{x['title']}', {stage_colours[name]} before"
if run in ("pipeline", "zbv"):
    assert stage_colours.get("stage 0") == "#1f77b4" and stage_colours.get("stage 1") == "#d62728", \
        f"{run}: stage colours {stage_colours}"
    waiting = next(x for x in p.plots if x["title"] == "Waiting, % of step time")
    assert waiting["shaded"] > 0, f"{run}: no harvesting steps shaded"
    for row in ("command line", "commit", "host", "overrides", "wall time"):
        assert row in text, f"{run}: the header has no {row}"
    assert "differ from the defaults" in text and "The whole config.toml" in text, run
    assert "e+0" not in text, f"{run}: a number in exponent notation"
if run == "pipeline":
    assert "Side tasks" in text and "pagerank" in text and "finished at step 12" in text, run
    loss = next(x for x in p.plots if x["title"] == "Loss")
    assert any(name == "val" for name, _ in loss["legend"]), "pipeline: no validation loss"
if run == "study":
    assert "+ pagerank" in text and "A/A" in text, run
    assert p.timeline_side_bars > 0, "study: the timeline has no side-task bars"
    assert "emulated (runtime.emulate_peers)" in text, "study: the emulated stage is not named"
if run == "failed":
    assert "failed at step" in text and "not finite" in text, run
if run == "compare":
    assert "run 1" in text and "run 2" in text and "Config differences" in text, run
    assert "parallel.schedule" in text and "zbv" in text, run
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
echo "PASS: 5 pages load in $(basename "$browser") with no console message; screenshots in $shots"
