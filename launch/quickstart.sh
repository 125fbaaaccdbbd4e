#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job on the
# embedded default config. Today that is what the project can really do: report the build
# and devices, validate the default run's configuration, and show the pipeline schedules the
# trainer will run, with every bubble placed and classified. Later issues grow it into
# "train a small GPT as a pipeline with side tasks in its bubbles and print the report".
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/launch/install_deps.sh"
"$root/launch/build.sh"
cd "$root"
fr="$build/freeride"
echo "== build"
"$fr" version
echo "== devices"
"$fr" devices
echo "== effective config of the default run (configs/tiny_cpu.toml, embedded)"
"$fr" config check
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
