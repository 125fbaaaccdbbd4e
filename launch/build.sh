#!/usr/bin/env bash
# Configures and builds freeride into build/ (the binary is build/freeride). Extra arguments
# go to CMake, e.g. `launch/build.sh -DFREERIDE_CUDA=OFF`. BUILD_DIR overrides the folder.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
generator=()
if command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
