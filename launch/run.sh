#!/usr/bin/env bash
# Launches `freeride train` (or `freeride study` with --study) on RANKS processes: mpirun (or
# srun inside a Slurm allocation).
#   launch/run.sh -n RANKS [--study] CONFIG [--set section.key=value]... [study flags]
# The world must be parallel.pp × parallel.dp ranks (one with runtime.emulate_peers): checked
# here before anything starts.
# Ranks on one machine share its cores: each gets cores / ranks OpenMP threads unless
# OMP_NUM_THREADS is set. Each rank and its threads are bound to cores of their own (Open MPI
# --map-by slot:PE=threads --bind-to core, srun --cpu-bind=cores, OMP_PLACES=cores,
# OMP_PROC_BIND=close), so a rank's threads do not wander onto another rank's cores and block
# times stay comparable; where ranks × threads exceed the cores, or FREERIDE_BIND=none, nothing
# is bound. A side task in process runs on its rank's cores; a worker inherits them. Local
# rank → GPU mapping (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) is the CUDA backend's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
usage="usage: launch/run.sh -n RANKS [--study] CONFIG [--set section.key=value]... [study flags]"
ranks=""
command=train
if [[ ${1:-} == "-n" && -n ${2:-} ]]; then ranks=$2; shift 2; fi
if [[ ${1:-} == "--study" ]]; then command=study; shift; fi
if [[ -z $ranks || -z ${1:-} ]]; then echo "$usage" >&2; exit 2; fi
config=$1
shift
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then echo "run.sh: RANKS must be a positive integer" >&2; exit 2; fi

# The effective config (validated, overrides applied) tells pp and dp.
overrides=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == --set && $((i + 1)) -lt ${#args[@]} ]]; then
    overrides+=(--set "${args[i + 1]}")
    i=$((i + 1))
  elif [[ ${args[i]} == --set=* ]]; then
    overrides+=("${args[i]}")
  fi
done
effective=$("$build/freeride" config check "$config" "${overrides[@]}") || exit 1
value() { awk -v sec="[$1]" -v key="$2" '$0==sec{on=1;next} /^\[/{on=0} on && $1==key{print $3}' <<<"$effective"; }
pp=$(value parallel pp)
dp=$(value parallel dp)
layers=$(value model n_layer)
emulated=$(value runtime emulate_peers)
if [[ $emulated == true ]]; then
  if (( ranks != 1 )); then
    echo "run.sh: runtime.emulate_peers = true runs one process (its peers emulated); launch -n 1" >&2
    exit 1
  fi
elif (( pp * dp != ranks )); then
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
threads=${OMP_NUM_THREADS:-$(( cores / ranks > 0 ? cores / ranks : 1 ))}
export OMP_NUM_THREADS=$threads
bind=${FREERIDE_BIND:-core}
if [[ $bind == core ]] && (( ranks * threads <= cores )); then
  export OMP_PLACES=${OMP_PLACES:-cores} OMP_PROC_BIND=${OMP_PROC_BIND:-close}
else
  bind=none
fi
if [[ $emulated == true ]]; then
  # One process, no MPI: OMP_PLACES/OMP_PROC_BIND bind its threads.
  exec "$build/freeride" "$command" --config "$config" "$@"
fi
if [[ -n ${SLURM_JOB_ID:-} ]] && command -v srun >/dev/null; then
  slurm_bind=(--cpu-bind=none)
  if [[ $bind == core ]]; then slurm_bind=(--cpus-per-task="$threads" --cpu-bind=cores); fi
  # Open MPI joins a Slurm step through PMIx; SLURM_MPI_TYPE names another plug-in.
  exec srun -n "$ranks" --mpi="${SLURM_MPI_TYPE:-pmix}" "${slurm_bind[@]}" "$build/freeride" \
    "$command" --config "$config" "$@"
fi
extra=()
if (( ranks > cores )); then extra+=(--oversubscribe); fi
if [[ $(id -u) -eq 0 ]]; then extra+=(--allow-run-as-root); fi
if [[ $bind == core ]]; then
  extra+=(--map-by "slot:PE=$threads" --bind-to core -x OMP_PLACES -x OMP_PROC_BIND)
else
  extra+=(--bind-to none)
fi
exec mpirun -n "$ranks" "${extra[@]}" -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE \
  "$build/freeride" "$command" --config "$config" "$@"
