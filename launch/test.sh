#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. GPU-labelled tests are
# reported as skipped, with the reason, where no GPU is visible; then the fuzz targets run for
# a bounded time (build-fuzz/), and the same GPU suites run on the CPU in the CUDA emulation
# build (build-emulate/). Exit status is the suites'.
# Extra arguments go to ctest, e.g. `launch/test.sh -L gpu` or `launch/test.sh -R Config`.
# The Summary at the end gives each phase's wall-clock seconds, so that a CI log says where its
# time went.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# "name N s" for each phase that ran, in order; `phase_done NAME` closes the phase that began
# at the previous call (or at the start).
phases=()
phase_start=$SECONDS
phase_done() {
  phases+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}
"$root/launch/install_deps.sh"
"$root/launch/fetch_tokenizer.sh"
phase_done install
# CI's builds (CI=true: .ci/run) check that everything compiles, warnings and register spills as
# errors, on a machine without a GPU: they compile the suites' own sources at -O1
# (FREERIDE_TESTS_O1; the libraries and kernels they test keep -O2) and the kernels for one CUDA
# architecture, sm_90, not both of the default. Line tables only for debug information
# (FREERIDE_DEBUG_INFO=lines) and unity batches are every build's default. A person's run builds
# as launch/build.sh does. Measured: launch/README.md.
ci_build=()
if [[ ${CI:-} == true ]]; then
  export FREERIDE_DEBUG_INFO=lines  # the fuzz build's too (tests/fuzz/run.sh)
  export FREERIDE_TESTS_O1=ON  # the emulation build's too
  ci_build=(-DFREERIDE_DEBUG_INFO=lines -DFREERIDE_TESTS_O1=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
"$root/launch/build.sh" "${ci_build[@]}"
phase_done build
# ", failed: A B" from ctest's list of the last run's failures in build dir $1 (empty if none).
failed_tests() {
  local f=$1/Testing/Temporary/LastTestsFailed.log
  [[ -s $f ]] && echo ", failed: $(cut -d: -f2- "$f" | tr '\n' ' ')"
  return 0
}
status=0
summary=()
# Every entry has its own TIMEOUT (tests/CMakeLists.txt); 300 s is the bound of any without.
rc=0
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 300 "$@") || rc=$?
summary+=("main suite: exit $rc$(failed_tests "$build")")
((rc == 0)) || status=$rc
phase_done "main suite"
# The readers of every external format under libFuzzer, AddressSanitizer and UBSan
# (tests/fuzz/README.md): FREERIDE_FUZZ_SECONDS each (default 10; 0 leaves them out).
fuzz_seconds=${FREERIDE_FUZZ_SECONDS:-10}
if [[ $fuzz_seconds != 0 ]]; then
  rc=0
  "$root/tests/fuzz/run.sh" "$fuzz_seconds" || rc=$?
  phase_done "fuzz (build and run)"
  # `|| true`: no finding is grep's exit 1, which set -e would take for the script's end.
  found=$(grep -h FOUND "${FUZZ_BUILD_DIR:-$root/build-fuzz}"/*.verdict 2> /dev/null |
    sed 's/^fuzz: /; /' | tr -d '\n' || true)
  summary+=("fuzz: exit $rc$found")
  ((rc == 0)) || status=$rc
fi
# The CUDA path on the CPU: the GPU suites, the CUDA chunk and the emulation's own suites in
# the emulation build (-DFREERIDE_CUDA=EMULATE, models/cuda/emulation/README.md), label
# `emulated`. FREERIDE_EMULATED_TESTS=0 leaves them out.
if [[ ${FREERIDE_EMULATED_TESTS:-1} != 0 ]]; then
  emulate=${EMULATE_BUILD_DIR:-$root/build-emulate}
  generator=()
  if command -v ninja >/dev/null && [[ ! -f $emulate/CMakeCache.txt ]]; then generator=(-G Ninja); fi
  rc=0
  { cmake -S "$root" -B "$emulate" "${generator[@]}" -DFREERIDE_CUDA=EMULATE \
      -DFREERIDE_DEBUG_INFO="${FREERIDE_DEBUG_INFO:-lines}" \
      -DFREERIDE_TESTS_O1="${FREERIDE_TESTS_O1:-OFF}" >/dev/null &&
    cmake --build "$emulate" -j "$(nproc)" --target freeride_emulated_tests; } || rc=$?
  phase_done "emulation build"
  if ((rc == 0)); then
    (cd "$emulate" && ctest --output-on-failure -j "$(nproc)" --timeout 300 -L emulated "$@") ||
      rc=$?
    phase_done "emulated suite"
  fi
  summary+=("emulated suite: exit $rc$(failed_tests "$emulate")")
  ((rc == 0)) || status=$rc
fi
# ctest does not print why a test skipped; the skipping suites say it on their first line.
log=$build/Testing/Temporary/LastTest.log
if [[ -f $log ]] && grep -q '^SKIPPED:' "$log"; then
  echo "Skipped tests said:"
  grep '^SKIPPED:' "$log" | sort | uniq -c | sed 's/^/  /'
fi
# Last, so that the tail of a long log (all a CI page may show) says what failed where.
echo "Summary:"
printf '  %s\n' "${summary[@]}"
echo "  seconds: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'), total $SECONDS s"
exit $status
