#!/usr/bin/env bash
# layout_check on a copy of the sources without git, as the GPU machine and the rehearsal's root
# hold them: with a build directory of another name beside them (its generated protobuf code is
# longer than 600 lines and lives in no documented folder) and npm packages under data/, it must
# judge the project's sources only. Found by bench/gpu_rehearsal.sh: the GPU procedure's
# `ctest -LE gpu` failed on build-gpu/trainer/tensorboard_event.pb.h.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# The copy is made from git; a copy without git (where layout_check itself then takes the find
# path this test rehearses) has nothing to make it from.
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "SKIPPED: $root is not a git checkout (layout_check runs on it as a copy already)"
  exit 77
fi
work=$(mktemp -d /tmp/freeride_layout_copy.XXXXXX)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive HEAD | tar -x -C "$work"
# Uncommitted changes too, so that the check runs on the tree being tested.
git -C "$root" diff HEAD | (cd "$work" && git apply --allow-empty 2>/dev/null || true)
mkdir -p "$work/build-gpu/trainer" "$work/data/npm/node_modules/addon/include"
touch "$work/build-gpu/CMakeCache.txt"
seq 700 | sed 's#^#// generated #' >"$work/build-gpu/trainer/tensorboard_event.pb.h"
seq 700 | sed 's#^#// npm #' >"$work/data/npm/node_modules/addon/include/addon.h"
"$root/tests/scripts/layout_check.sh" "$work"
