#!/usr/bin/env bash
# What launch/quickstart.sh installs and builds (its --dry-run): the binaries it runs and
# nothing of the tests (no test targets, no Chromium or clang), the CUDA backend only where a GPU
# is visible or FREERIDE_CUDA asks; and launch/test.sh still installs and builds everything.
#   tests/scripts/quickstart_plan.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/freeride_quickstart_plan.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
has() { [[ $1 == *"$2"* ]] || fail "expected '$2' in: $1"; }
lacks() { [[ $1 != *"$2"* ]] || fail "did not expect '$2' in: $1"; }

# nvidia-smi as a machine without a GPU has it (none listed), and as one with a GPU.
mkdir -p "$work/nogpu" "$work/gpu"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n' > "$work/nogpu/nvidia-smi"
printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' > "$work/gpu/nvidia-smi"
chmod +x "$work/nogpu/nvidia-smi" "$work/gpu/nvidia-smi"
plan() { env -u FREERIDE_CUDA PATH="$1:$PATH" "$root/launch/quickstart.sh" --dry-run; }

out=$(plan "$work/nogpu") || fail "quickstart --dry-run failed: $out"
has "$out" "install: $root/launch/install_deps.sh --run-only"
has "$out" "TARGETS=freeride freeride_side_worker "
has "$out" "-DFREERIDE_CUDA=OFF"
out=$(plan "$work/gpu")
has "$out" "-DFREERIDE_CUDA=AUTO"
out=$(FREERIDE_CUDA=ON "$root/launch/quickstart.sh" --dry-run)
has "$out" "-DFREERIDE_CUDA=ON"

# The packages: the quickstart's leave out what only tests use; launch/test.sh's hold them.
run_only=$("$root/launch/install_deps.sh" --run-only --list | tr '\n' ' ')
all=$("$root/launch/install_deps.sh" --list | tr '\n' ' ')
for p in chromium clang iproute2 libboost-context-dev; do
  lacks " $run_only" " $p "
  has " $all" " $p "
done
for p in cmake libabsl-dev libopenmpi-dev bible-kjv; do has " $run_only" " $p "; done
# launch/test.sh: every package and every target.
grep -qx '"$root/launch/install_deps.sh"' "$root/launch/test.sh" ||
  fail "launch/test.sh does not run install_deps.sh with every package"
# (CMake arguments may follow, CI's choices of debug information and CUDA architecture; no
# TARGETS.)
grep -qE '^"\$root/launch/build.sh"( |$)' "$root/launch/test.sh" &&
  ! grep -q 'TARGETS=' "$root/launch/test.sh" ||
  fail "launch/test.sh does not build every target"

if ((failures > 0)); then
  echo "quickstart_plan: $failures failure(s)" >&2
  exit 1
fi
echo "quickstart_plan: the binaries only, CUDA where a GPU is; test.sh installs and builds all"
