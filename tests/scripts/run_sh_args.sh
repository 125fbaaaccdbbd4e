#!/usr/bin/env bash
# launch/run.sh's arguments: the command it would run (--dry-run) for a hostfile, launcher
# arguments after `--`, freeride's own arguments, srun inside Slurm, OPENBLAS_CORETYPE forwarded
# only when set; its usage errors; and one real 2-rank run whose output has no Open MPI warning
# about a missing environment variable; a second run into its run.dir refused with one line.
#   tests/scripts/run_sh_args.sh --build DIR
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 2 "$@"
export BUILD_DIR=$build OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE OMP_NUM_THREADS SLURM_JOB_ID
work=$(mktemp -d /tmp/freeride_run_sh.XXXXXX)
trap 'rm -rf "$work"' EXIT
run=$root/launch/run.sh
config=$root/configs/tiny_cpu_pp2.toml
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# has LINE TEXT: LINE contains TEXT.
has() { [[ $1 == *"$2"* ]] || fail "expected '$2' in: $1"; }
lacks() { [[ $1 != *"$2"* ]] || fail "did not expect '$2' in: $1"; }
# status EXPECTED CMD...: CMD exits with EXPECTED; its stderr in $err.
status() {
  local want=$1 got=0
  shift
  "$@" > /dev/null 2> "$work/err" || got=$?
  err=$(cat "$work/err")
  ((got == want)) || fail "'$*' exited $got, not $want: $err"
}

# Plain: mpirun, freeride's arguments after the binary, no OPENBLAS_CORETYPE when unset.
line=$("$run" -n 2 --dry-run "$config" --set train.steps=5)
has "$line" "mpirun -n 2 "
has "$line" "-x OMP_NUM_THREADS"
lacks "$line" "OPENBLAS_CORETYPE"
has "$line" "$build/freeride train --config $config --set train.steps=5"
line=$(OPENBLAS_CORETYPE=Haswell "$run" -n 2 --dry-run "$config")
has "$line" "-x OPENBLAS_CORETYPE"

# A hostfile of two machines and launcher arguments: both before the program, freeride's after.
printf '# two nodes\nnode1 slots=1\nnode2 slots=1\n\n' > "$work/hosts"
line=$("$run" -n 2 --hostfile "$work/hosts" --dry-run "$config" --set train.steps=5 \
  -- --mca btl_tcp_if_include eth0)
has "$line" "mpirun -n 2 --hostfile $work/hosts "
has "$line" "--mca btl_tcp_if_include eth0 $build/freeride train --config $config --set train.steps=5"
# One rank per machine: every core of each is its rank's.
has "$line" "OMP_NUM_THREADS=$(nproc) "
line=$("$run" -n 2 --study --dry-run "$config" --rounds 2 -- --tag-output)
has "$line" "--tag-output $build/freeride study --config $config --rounds 2"

# Inside a Slurm allocation: srun, with the launcher arguments; a hostfile is refused.
mkdir -p "$work/bin"
printf '#!/bin/sh\nexit 0\n' > "$work/bin/srun"
chmod +x "$work/bin/srun"
line=$(SLURM_JOB_ID=7 PATH="$work/bin:$PATH" "$run" -n 2 --dry-run "$config" -- --exclusive)
has "$line" "srun -n 2 --mpi=pmix"
has "$line" "--exclusive $build/freeride train --config $config"
status 2 env SLURM_JOB_ID=7 PATH="$work/bin:$PATH" "$run" -n 2 --hostfile "$work/hosts" \
  --dry-run "$config"
has "$err" "no --hostfile"

# Usage errors (2) and a world that does not fit the config (1).
status 2 "$run" -n 2 --hostfile "$work/missing" --dry-run "$config"
has "$err" "no such readable file"
status 2 "$run" -n 2 --bogus "$config"
has "$err" "unknown option --bogus"
status 2 "$run" "$config"
status 1 "$run" -n 3 --dry-run "$config"
has "$err" "3 ranks, but parallel.pp × parallel.dp = 2 × 1"

# A real run: Open MPI has no variable to complain about.
prepare_corpus "$build/freeride" "$root" "$work/data"
"$run" -n 2 "$config" --set run.dir="$work/run" --set train.steps="$steps" \
  --set "data.train=\"$work/data/train_*.bin\"" --set "data.val=\"$work/data/val_*.bin\"" \
  --set eval.every=0 > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; fail "the 2-rank run"; }
if grep -q "could not find environment variable" "$work/run.log"; then
  fail "Open MPI warned: $(grep "could not find" "$work/run.log")"
fi
grep -q "step $steps/$steps" "$work/run.log" || fail "no last step in: $(tail -5 "$work/run.log")"

# The same run again into that run.dir: refused (2) with one message, nothing of an aborted MPI
# job after it (Open MPI's ORTE_ERROR_LOG, the other rank's stop line).
status 2 "$run" -n 2 "$config" --set run.dir="$work/run" --set train.steps="$steps" \
  --set "data.train=\"$work/data/train_*.bin\"" --set "data.val=\"$work/data/val_*.bin\"" \
  --set eval.every=0
[[ $(wc -l <<<"$err") == 1 && $err == "error: run.dir = \"$work/run\" holds another run"* ]] ||
  fail "the refusal is not one line: $err"

if ((failures > 0)); then
  echo "run_sh_args: $failures failure(s)" >&2
  exit 1
fi
echo "run_sh_args: hostfile, launcher arguments, srun and the environment as expected"
