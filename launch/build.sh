#!/usr/bin/env bash
# Configures and builds freeride into build/ (the binary is build/freeride). Extra arguments
# go to CMake, e.g. `launch/build.sh -DFREERIDE_CUDA=OFF`. BUILD_DIR overrides the folder;
# TARGETS="freeride freeride_side_worker" builds only those (default: everything, the tests too).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
generator=()
if command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" "$@"
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
