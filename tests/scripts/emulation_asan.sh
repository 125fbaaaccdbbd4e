#!/usr/bin/env bash
# The emulated GPU suites under AddressSanitizer: an out-of-bounds or misaligned access inside a
# kernel, or a use of freed device memory, is reported with the kernel's source line. The
# fibers switch through ucontext with ASan's annotations in this build (scheduler.cc).
#
#   tests/scripts/emulation_asan.sh [--build DIR] [ctest arguments...]
#
# Builds in DIR (default build-asan/) and runs `ctest -L emulated` there, or what the extra
# arguments select (e.g. -R flash). About 15 minutes from nothing on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$root/build-asan
if [[ ${1:-} == --build ]]; then
  build=$2
  shift 2
fi
generator=()
if command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
flags="-fsanitize=address -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" "${generator[@]}" -DFREERIDE_CUDA=EMULATE \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address \
  >/dev/null
cmake --build "$build" -j "$(nproc)" --target freeride_emulated_tests
# Leaks are the test fixtures' business, not the kernels'; stack-use-after-return needs fiber
# support ASan's ucontext annotations do not give.
export ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0:abort_on_error=1
if (($# == 0)); then set -- -L emulated; fi
cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
