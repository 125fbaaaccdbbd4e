#!/usr/bin/env bash
# CUDA training over NCCL between GPUs, one rank per GPU, against the same run over MPI: the
# 2-stage pipeline on 2 GPUs and pp 2 × dp 2 on 4, losses equal bit for bit (NCCL's algorithm
# pinned, NCCL_ALGO=Ring NCCL_PROTO=Simple; two-member sums are exact in any order), and the
# NCCL run's start log saying NCCL carries the steps. Exits 77 (skipped) with the reason where
# fewer GPUs are visible than the 2-stage layout needs (a layout needing more is skipped with a
# note), or in the emulation build (its NCCL joins threads, not the processes of mpirun).
#   tests/scripts/nccl_pipeline_gpu.sh --build DIR [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 6 "$@"
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
((gpus >= 2)) ||
  { echo "SKIPPED: $gpus GPU(s) visible; the NCCL pipeline needs 2 (4 for pp 2 × dp 2)"; exit 77; }
if "$build/freeride" version | grep -q "emulated"; then
  echo "SKIPPED: the emulation build's NCCL joins threads of one process, not mpirun's ranks"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BUILD_DIR=$build
export NCCL_ALGO=Ring NCCL_PROTO=Simple
work=$(mktemp -d /tmp/freeride_nccl.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; tail -30 "$work/$name.log" >&2 || true; exit 1; }

prepare_corpus "$build/freeride" "$root" "$work/data"
cd "$root"
for layout in "2 2 1" "4 2 2"; do
  read -r ranks pp dp <<< "$layout"
  if ((gpus < ranks)); then
    echo "note: pp $pp × dp $dp left out: it needs $ranks GPUs, $gpus visible"
    continue
  fi
  for transport in nccl mpi; do
    name="pp${pp}_dp${dp}_$transport"
    timeout 600 launch/run.sh -n "$ranks" configs/tiny_cpu.toml --set runtime.device=cuda \
      --set "parallel.pp=$pp" --set "parallel.dp=$dp" --set "parallel.transport=$transport" \
      --set "data.train=$work/data/train_*.bin" --set "data.val=$work/data/val_*.bin" \
      --set "train.steps=$steps" --set eval.every=0 --set "run.dir=$work/$name" \
      > "$work/$name.log" 2>&1 || fail "the $transport run of pp $pp × dp $dp failed"
  done
  name="pp${pp}_dp${dp}_nccl"
  grep -q "transport: NCCL carries" "$work/$name.log" || fail "the start log does not say NCCL"
  nccl=$(train_losses "$work/pp${pp}_dp${dp}_nccl")
  mpi=$(train_losses "$work/pp${pp}_dp${dp}_mpi")
  [[ $nccl == "$mpi" ]] || fail "pp $pp × dp $dp: losses over NCCL $nccl, over MPI $mpi"
  echo "PASS: pp $pp × dp $dp over NCCL equals MPI for $steps steps: $nccl"
done
