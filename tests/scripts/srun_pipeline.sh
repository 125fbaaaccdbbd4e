#!/usr/bin/env bash
# `launch/run.sh` under a real Slurm: starts a one-node Slurm (launch/slurm_local.sh), runs the
# tiny 2-stage pipeline with side tasks through launch/run.sh inside `salloc -n 2` (so srun,
# with PMIx, launches the ranks), and again with mpirun outside Slurm. Passes when the srun run
# completes with one process per rank joined into one MPI world, and its losses equal the
# mpirun run's bit for bit. Exits 77 (skipped) without slurm-wlm and munge, or when not root.
#   tests/scripts/srun_pipeline.sh --build DIR [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 8 "$@"
for tool in slurmctld slurmd munged salloc srun; do
  command -v "$tool" >/dev/null ||
    { echo "SKIPPED: $tool not found (Debian: apt-get install slurm-wlm munge)"; exit 77; }
done
[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: the one-node Slurm runs its daemons as root"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BUILD_DIR=$build
work=$(mktemp -d /tmp/freeride_srun.XXXXXX)
trap '"$root/launch/slurm_local.sh" stop "$work/slurm"; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; tail -30 "$work/srun.log" >&2 || true; exit 1; }

eval "$("$root/launch/slurm_local.sh" start "$work/slurm")"
prepare_corpus "$build/freeride" "$root" "$work/data"
args=(configs/tiny_cpu_pp2_freeride.toml --set "data.train=$work/data/train_*.bin"
      --set "data.val=$work/data/val_*.bin" --set "train.steps=$steps" --set eval.every=0)
cd "$root"
timeout 300 salloc -n 2 --quiet launch/run.sh -n 2 "${args[@]}" --set "run.dir=$work/srun" \
  > "$work/srun.log" 2>&1 || fail "the run under salloc/srun failed"
# slurmd launched the step's tasks, bound one core each; both ranks logged as ranks of one world.
grep -q "launch task StepId=" "$work/slurm/slurmd.log" || fail "slurmd launched no job step"
grep -q "mask_cpu,one_thread, 0x1,0x2" "$work/slurm/slurmd.log" ||
  echo "note: the tasks were not bound to cores 0 and 1 (fewer than 2 cores?)"
grep -q " r1 " "$work/srun.log" || fail "rank 1 did not log: not one 2-rank MPI world"
launch/run.sh -n 2 "${args[@]}" --set "run.dir=$work/mpirun" > "$work/mpirun.log" 2>&1 ||
  fail "the same run under mpirun failed"
srun_losses=$(train_losses "$work/srun")
mpirun_losses=$(train_losses "$work/mpirun")
[[ $srun_losses == "$mpirun_losses" ]] ||
  fail "losses differ: srun $srun_losses, mpirun $mpirun_losses"
echo "PASS: $steps steps of a 2-rank pipeline under srun (PMIx) equal mpirun's: $srun_losses"
