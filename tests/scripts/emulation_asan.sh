#!/usr/bin/env bash
# The emulated GPU suites under AddressSanitizer: an out-of-bounds or misaligned access inside a
# kernel, or a use of freed device memory, is reported with the kernel's source line. The
# fibers switch through ucontext with ASan's annotations in this build (scheduler.cc).
#
#   tests/scripts/emulation_asan.sh [--build DIR] [--kernels] [ctest arguments...]
#
# Builds in DIR (default build-asan/) and runs `ctest -L emulated` there, or what the extra
# arguments select (e.g. -R flash). --kernels builds and runs only the kernel suites and the
# emulation's own (no trainer: about 8 minutes from nothing on 2 cores, the whole set 20).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$root/build-asan
targets=(freeride_emulated_tests)
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --kernels)
      targets=(cuda_emulation_test blas_emulation_test cuda_kernels_gpu_test
               flash_attention_gpu_test fused_kernels_gpu_test head_kernels_gpu_test)
      set -- -R "^($(IFS='|'; echo "${targets[*]}"))\$" "${@:2}"
      ;;
    *) break ;;
  esac
done
generator=()
if command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
flags="-fsanitize=address -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" "${generator[@]}" -DFREERIDE_CUDA=EMULATE \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address \
  >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
# Leaks are the test fixtures' business, not the kernels'; stack-use-after-return needs fiber
# support ASan's ucontext annotations do not give.
export ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0:abort_on_error=1
if (($# == 0)); then set -- -L emulated; fi
cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
