#!/usr/bin/env bash
# The README's first command: installs what is missing, builds what it runs (the `freeride`
# binary and its side-task worker; the CUDA backend only where a GPU is visible or
# FREERIDE_CUDA asks for it), prepares the default corpus (the King James Bible, tokenized with
# GPT-2's BPE), trains the embedded default run (a small GPT on the CPU), prints a sample from
# it, trains it again as a 2-stage pipeline with side tasks in its bubbles, writes the run's HTML
# report, shows the pipeline schedules with every bubble placed and classified, and ends with
# what to try next. The tests, their packages (Chromium, clang) and the CUDA kernels without a
# GPU are launch/test.sh's.
#   launch/quickstart.sh [--dry-run]   (--dry-run: print the install and build commands, stop)
# Measured on a 2-core VM (README.md says the figures and their conditions).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
dry_run=false
case ${1:-} in
  --dry-run) dry_run=true ;;
  "") ;;
  *) echo "quickstart: unknown option $1 (--dry-run)" >&2; exit 2 ;;
esac
# A visible GPU: nvidia-smi lists one. FREERIDE_CUDA=ON|OFF|AUTO|EMULATE decides instead.
cuda=${FREERIDE_CUDA:-OFF}
if [[ -z ${FREERIDE_CUDA:-} ]] && command -v nvidia-smi >/dev/null &&
  nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  cuda=AUTO
fi
targets="freeride freeride_side_worker"
install=("$root/launch/install_deps.sh" --run-only)
configure=(env BUILD_DIR="$build" TARGETS="$targets" "$root/launch/build.sh" -DFREERIDE_CUDA="$cuda")
if $dry_run; then
  echo "install: ${install[*]}"
  echo "build: ${configure[*]}"
  exit 0
fi
started=$SECONDS
"${install[@]}"
"${configure[@]}"
cd "$root"
fr="$build/freeride"
echo "== build ($((SECONDS - started)) s so far)"
"$fr" version
echo "== devices"
"$fr" devices
echo "== data: the King James Bible as GPT-2 tokens (data/kjv/)"
"$root/launch/prepare_data.sh"
echo "== train the default run (configs/tiny_cpu.toml, embedded): metrics in runs/tiny_cpu/"
# --overwrite: run again, the quickstart replaces its own earlier runs.
"$fr" train --overwrite
echo "== a sample from the trained model"
"$fr" sample --checkpoint runs/tiny_cpu/checkpoints --prompt "And God said" --tokens 48 \
  --temperature 0.8 --top_k 40
echo "== the same model as a 2-stage pipeline (2 MPI ranks) with PageRank and an image pipeline"
echo "   running in its bubbles; the harvest report comes at the end"
"$root/launch/run.sh" -n 2 configs/tiny_cpu_pp2_freeride.toml --set train.steps=40 \
  --overwrite 2>&1 | grep -v "\] step "
echo "== that run as one page to open in a browser (docs/report.md)"
"$fr" report runs/tiny_cpu_pp2_freeride
echo "== a 4-stage 1F1B schedule, 8 micro-batches: every idle slot is a BUBBLE instruction"
"$fr" schedule --kind 1f1b --stages 4 --microbatches 8
echo "== how much of a step each schedule leaves idle (uniform costs, f=b=w=1 ms)"
for kind in gpipe 1f1b zbh1; do
  "$fr" simulate --kind "$kind" --stages 4 --microbatches 8 | head -n 1
done
"$fr" simulate --kind interleaved --stages 4 --microbatches 8 --chunks 2 | head -n 1
mkdir -p runs/quickstart
"$fr" schedule --kind zbh1 --stages 4 --microbatches 8 --format svg --out runs/quickstart/zbh1.svg
"$fr" schedule --kind 1f1b --stages 4 --microbatches 8 --format chrome \
  --out runs/quickstart/1f1b.trace.json
echo "pictures: runs/quickstart/zbh1.svg (Gantt chart), runs/quickstart/1f1b.trace.json (Perfetto)"
echo "== done in $((SECONDS - started)) s. Next:"
cat <<'NEXT'
  build/freeride train --help                          # every option; configs/ holds ready-made runs
  build/freeride train --set train.steps=300 --set run.dir=runs/longer   # longer, beside this one
  launch/run.sh -n 2 CONFIG --overwrite              # a 2-stage pipeline of a config in configs/
  build/freeride study --config configs/tiny_cpu_pp2_freeride.toml --set runtime.emulate_peers=true
                                                       # what side work costs, with 95% intervals
  launch/test.sh                                       # the test suite (builds the tests too)
  docs/training.md, docs/side_tasks.md, docs/schedules.md   # how it works and what to change
NEXT
