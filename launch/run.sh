#!/usr/bin/env bash
# Launches `freeride train` on RANKS processes: mpirun (or srun inside a Slurm allocation).
#   launch/run.sh -n RANKS CONFIG [--set section.key=value]...
# The world must be parallel.pp × parallel.dp ranks: checked here before anything starts.
# Ranks on one machine share its cores: each gets cores / ranks OpenMP threads unless
# OMP_NUM_THREADS is set. Local rank → GPU mapping (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID)
# is the CUDA backend's (runtime.device = "cuda").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
usage="usage: launch/run.sh -n RANKS CONFIG [--set section.key=value]..."
ranks=""
if [[ ${1:-} == "-n" && -n ${2:-} ]]; then ranks=$2; shift 2; fi
if [[ -z $ranks || -z ${1:-} ]]; then echo "$usage" >&2; exit 2; fi
config=$1
shift
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then echo "run.sh: RANKS must be a positive integer" >&2; exit 2; fi

# The effective config (validated, overrides applied) tells pp and dp.
effective=$("$build/freeride" config check "$config" "$@") || exit 1
value() { awk -v sec="[$1]" -v key="$2" '$0==sec{on=1;next} /^\[/{on=0} on && $1==key{print $3}' <<<"$effective"; }
pp=$(value parallel pp)
dp=$(value parallel dp)
layers=$(value model n_layer)
if (( pp * dp != ranks )); then
  fits=()
  for ((p = 1; p <= ranks; p++)); do
    if (( ranks % p == 0 && p <= layers )); then fits+=("pp=$p dp=$((ranks / p))"); fi
  done
  echo "run.sh: $ranks ranks, but parallel.pp × parallel.dp = $pp × $dp = $((pp * dp))." >&2
  joined=$(printf '%s, ' "${fits[@]}")
  echo "  With $ranks ranks these fit: ${joined%, }; or launch $((pp * dp)) ranks." >&2
  exit 1
fi

cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / ranks > 0 ? cores / ranks : 1 ))}
if [[ -n ${SLURM_JOB_ID:-} ]] && command -v srun >/dev/null; then
  exec srun -n "$ranks" "$build/freeride" train --config "$config" "$@"
fi
extra=()
if (( ranks > cores )); then extra+=(--oversubscribe); fi
if [[ $(id -u) -eq 0 ]]; then extra+=(--allow-run-as-root); fi
exec mpirun -n "$ranks" "${extra[@]}" --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE \
  "$build/freeride" train --config "$config" "$@"
