#!/usr/bin/env bash
# GPU procedure, step 2: the CUDA build (Release, sm_90 unless CUDA_ARCHS says otherwise) in
# build-gpu/ with the kit's packages. Idempotent: configured once, then built incrementally, so a
# call stopped by its budget is finished by the next.
# Estimate: 7 minutes from nothing on 16 cores (the kernels and the trainer dominate), seconds
# when the previous call's build is there. Usage: bench/gpu/build.sh OUT_DIR [--dry-run]
step=build
estimate_s=420
source "$(dirname "$0")/common.sh"
load_kit
archs=${CUDA_ARCHS:-90}
generator=()
command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]] && generator=(-G Ninja)
configure=(cmake -S . -B "$build" "${generator[@]}" -DFREERIDE_CUDA=ON -DCMAKE_BUILD_TYPE=Release
           -DCMAKE_CUDA_ARCHITECTURES="$archs" -DFREERIDE_BUILD_TESTS=ON
           -DFREERIDE_CUDA_RESOURCE_USAGE=ON)
if [[ $dry_run == 1 ]]; then
  say "dry run: would configure: ${configure[*]}"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    say "dry run: no build in $build"
    finish 1
  fi
  say "dry run: what the next build would redo in $build:"
  cmake --build "$build" -- -n | tail -3
  finish "${PIPESTATUS[0]}"
fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  within_budget 120 "${configure[@]}" || finish $?
else
  say "reusing the configured $build"
fi
within_budget "$(remaining)" cmake --build "$build" -j "$(nproc)"
rc=$?
[[ $rc == 124 ]] && say "stopped by the budget: call build.sh again to finish the build"
finish $rc
