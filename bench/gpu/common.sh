# Sourced by the GPU procedure's steps (bench/gpu/{preflight,build,test,bench,study}.sh) after
# they set `step` and `estimate_s`. Each step is called as
#   bench/gpu/STEP.sh OUT_DIR [--dry-run] [step arguments]
# and writes everything it produces under OUT_DIR: STEP.log (all of its output) and
# STEP.time (its estimate and what it took). Only OUT_DIR comes back from a GPU run, and a run
# may last 10 minutes, so every command runs under what is left of the step's budget
# (`budget_s`, below the estimate's ceiling) and a step that runs out stops cleanly, saying what
# it left; state that lets a second call go on where the first stopped (the build, finished
# sanitizer runs and benchmarks) lives in the checkout, under build-gpu/ and runs/gpu/, which a
# warm machine keeps between calls.
#
# --dry-run runs every step's logic on a machine without a GPU: the CPU build standing in
# (BUILD_DIR, default build/), no nvidia-smi, and each GPU-only command printed and its
# program looked for instead of run.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dry_run=0
positional=()
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    *) positional+=("$arg") ;;
  esac
done
if [[ ${#positional[@]} -eq 0 ]]; then
  echo "usage: bench/gpu/$step.sh OUT_DIR [--dry-run] [arguments]" >&2
  exit 2
fi
mkdir -p "${positional[0]}" || exit 2
out=$(cd "${positional[0]}" && pwd)
step_args=("${positional[@]:1}")
cd "$root"
if [[ $dry_run == 1 ]]; then
  build=${BUILD_DIR:-$root/build}
else
  build=${BUILD_DIR:-$root/build-gpu}
fi
state=$root/runs/gpu
mkdir -p "$state"
# Budget: the estimate's ceiling less a minute for the machine's start and the transfers.
budget_s=${GPU_STEP_BUDGET_S:-480}
started=$SECONDS
log=$out/$step.log
exec > >(tee -a "$log") 2>&1
tee_pid=$!

say() { echo "== [$step] $*"; }

# Seconds left of the budget (0 when spent).
remaining() {
  local left=$((budget_s - (SECONDS - started)))
  ((left > 0)) && echo "$left" || echo 0
}

# Runs a command under min(CAP, what is left); 124 when it was stopped for time.
within_budget() {
  local cap=$1
  shift
  local left
  left=$(remaining)
  ((left < cap)) && cap=$left
  if ((cap <= 0)); then
    say "budget spent: not run: $*"
    return 124
  fi
  timeout --kill-after=10 "$cap" "$@"
}

# A command that needs the GPU: run within the budget, or in a dry run printed and its program
# looked for. A dry run fails on a missing program of this checkout or its CUDA build; a tool
# missing from this machine (compute-sanitizer, PyTorch's python) is only reported: the GPU
# machine's preflight checks for it there.
gpu_run() {
  local cap=$1
  shift
  if [[ $dry_run == 0 ]]; then
    within_budget "$cap" "$@"
    return
  fi
  say "dry run: would run (at most ${cap}s): $*"
  local args=("$@")
  while [[ ${args[0]} == env || ${args[0]} == -u || ${args[0]} == LD_LIBRARY_PATH ]]; do
    args=("${args[@]:1}")
  done
  local program=${args[0]}
  if command -v "$program" >/dev/null 2>&1; then
    say "dry run: found $(command -v "$program")"
  elif [[ $program == "$build"/* ]] && ! cuda_build; then
    say "dry run: $program is not built (CPU-only build)"
  elif [[ $program == "$root"/* || $program == "$build"/* ]]; then
    say "dry run: MISSING $program"
    return 1
  else
    say "dry run: $program is not installed on this machine"
  fi
}

# Whether the build in $build has the CUDA backend.
cuda_build() {
  [[ -f $build/CMakeCache.txt ]] && grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.\+' "$build/CMakeCache.txt"
}

# The gpu-kit (docs/training.md#the-gpu-procedure), carried as .gpu-kit: its packages unpacked outside
# / and its environment (CMake, pkg-config, the loader, OpenMPI) loaded. A dry run uses the
# machine's own packages.
load_kit() {
  if [[ ! -x .gpu-kit/unpack-debs.sh || ! -d .gpu-kit/debs ]]; then
    say "no .gpu-kit here: using the machine's own packages"
    return
  fi
  if [[ $dry_run == 1 ]]; then
    say "dry run: would load .gpu-kit ($(ls .gpu-kit/debs | wc -l) packages) into /tmp/freeride-kit"
    return
  fi
  local env_lines
  env_lines=$(.gpu-kit/unpack-debs.sh .gpu-kit/debs /tmp/freeride-kit) || {
    say "unpacking .gpu-kit failed"
    exit 1
  }
  eval "$env_lines"
  # The build links the OpenMP OpenBLAS (cmake/FreerideDeps.cmake says why); the kit's loader path
  # names the pthread build's folder, which would override the binaries' run path and load that
  # one (bench/gpu_rehearsal.sh saw GEMM bits change with the thread count).
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH//openblas-pthread/openblas-openmp}
  say "kit loaded: $(ls .gpu-kit/debs | wc -l) packages in /tmp/freeride-kit"
}

# OpenMPI starts even a single process (MPI_Init in every freeride binary, gtest discovery at
# build time) through its rsh launcher, which fails where no ssh or rsh is installed, as in a
# bare image; its `isolated` launcher starts local processes without one.
if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null && [[ -z ${OMPI_MCA_plm:-} ]]; then
  export OMPI_MCA_plm=isolated
  say "no ssh or rsh here: OMPI_MCA_plm=isolated (OpenMPI launches local processes only)"
fi

# Writes STEP.time and says how the step ended.
finish() {
  local rc=$1
  local took=$((SECONDS - started))
  printf 'step %s: estimate %ss, budget %ss, took %ss, exit %s%s\n' "$step" "$estimate_s" \
    "$budget_s" "$took" "$rc" "$([[ $dry_run == 1 ]] && echo ' (dry run)')" >"$out/$step.time"
  say "done in ${took}s (estimate ${estimate_s}s), exit $rc; log $log"
  # The log is whole before the step returns.
  exec >&- 2>&-
  wait "$tee_pid"
  exit "$rc"
}

# FREERIDE_COMMIT, set by whoever sends the tree, comes first: the device tool's copy has no
# .git of its own, and the one a machine may hold from elsewhere names another commit (on
# 2026-11-26 it said 477cdf0 for 404d65e plus work in progress).
say "$(date -u +%FT%TZ) commit ${FREERIDE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
  "build $build$([[ $dry_run == 1 ]] && echo ', DRY RUN')"
