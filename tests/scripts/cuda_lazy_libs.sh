#!/usr/bin/env bash
# In a CUDA build: commands that need no device load none of the CUDA libraries (cuBLAS,
# cuBLASLt, NCCL, cuDNN, the runtime's shared object, the driver), as LD_DEBUG=libs lists every
# object the loader opens; `freeride version`, which reports their versions, opens them on
# demand. Every command of a CUDA build used to load them all (0.2-0.6 s, even `--help`).
# Skipped (77) in a build without the real CUDA backend (CPU-only, or the emulation).
#   tests/scripts/cuda_lazy_libs.sh --build DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 0 "$@"
# `version` says which backend the binary has ("on (architectures ...)", or "emulated").
if ! "$build/freeride" version | grep -q '^CUDA backend  *on '; then
  echo "SKIPPED: $build/freeride is not a CUDA build (the real backend, not the emulation)"
  exit 77
fi
work=$(mktemp -d /tmp/freeride_cuda_lazy.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
cuda_libs='lib(cublas|cublasLt|nccl|cudnn[a-z_]*|cudart|cuda)\.so'

# The objects the loader opened for `freeride ARGS...`.
opened() { LD_DEBUG=libs "$build/freeride" "$@" 2>&1 >/dev/null | grep -E 'calling init: '; }
for args in "--help" "schedule --kind 1f1b --stages 2 --microbatches 4" "config docs"; do
  # shellcheck disable=SC2086  # the arguments, split as written
  loaded=$(opened $args | grep -E "$cuda_libs")
  [[ -z $loaded ]] || fail "freeride $args loaded CUDA libraries: $loaded"
done
loaded=$(opened version)
grep -qE 'libcublasLt\.so' <<<"$loaded" || fail "freeride version did not open cuBLASLt: $loaded"
"$build/freeride" version > "$work/version.txt" || fail "freeride version failed"
grep -q '^cuBLASLt  *[1-9]' "$work/version.txt" || fail "no cuBLASLt version: $(cat "$work/version.txt")"

if ((failures > 0)); then
  echo "cuda_lazy_libs: $failures failure(s)" >&2
  exit 1
fi
echo "cuda_lazy_libs: no CUDA library until a command needs one; version opens them"
