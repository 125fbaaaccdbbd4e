#!/usr/bin/env bash
# Launches `freeride train` (or `freeride study` with --study) on RANKS processes: mpirun (or
# srun inside a Slurm allocation).
#   launch/run.sh -n RANKS [--hostfile FILE] [--study] [--dry-run] CONFIG
#                 [--set section.key=value]... [study flags] [-- LAUNCHER ARGS...]
# --hostfile FILE: mpirun's hostfile, for ranks on several machines (every one must have this
# checkout and build at the same path). Arguments after `--` go to mpirun (or srun) as they are,
# before the program: `-- --mca btl_tcp_if_include eth0`. --dry-run prints the command instead
# of running it.
# The world must be parallel.pp × parallel.dp ranks (one with runtime.emulate_peers): checked
# here before anything starts.
# Ranks on one machine share its cores: each gets cores / (ranks on the machine) OpenMP threads
# unless OMP_NUM_THREADS is set (with a hostfile, ranks are taken to spread evenly over its
# hosts, and the machines to have this one's cores). Each rank and its threads are bound to
# cores of their own (Open MPI --map-by slot:PE=threads --bind-to core, srun --cpu-bind=cores,
# OMP_PLACES=cores, OMP_PROC_BIND=close), so a rank's threads do not wander onto another rank's
# cores and block times stay comparable; where ranks × threads exceed the cores, or
# FREERIDE_BIND=none, nothing is bound. A side task in process runs on its rank's cores; a
# worker inherits them. Local rank → GPU mapping (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) is
# the CUDA backend's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
usage="usage: launch/run.sh -n RANKS [--hostfile FILE] [--study] [--dry-run] CONFIG
         [--set section.key=value]... [study flags] [-- LAUNCHER ARGS...]"
ranks="" hostfile="" dry_run=false
command=train
while (($#)); do
  case $1 in
    -n) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; ranks=$2; shift 2 ;;
    --hostfile) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; hostfile=$2; shift 2 ;;
    --hostfile=*) hostfile=${1#--hostfile=}; shift ;;
    --study) command=study; shift ;;
    --dry-run) dry_run=true; shift ;;
    -h | --help) echo "$usage"; exit 0 ;;
    -*) echo "run.sh: unknown option $1 before CONFIG" >&2; echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [[ -z $ranks || -z ${1:-} ]]; then echo "$usage" >&2; exit 2; fi
config=$1
shift
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then echo "run.sh: RANKS must be a positive integer" >&2; exit 2; fi
# freeride's own arguments, then the launcher's after `--`.
args=() launcher_args=()
while (($#)); do
  if [[ $1 == -- ]]; then
    shift
    launcher_args=("$@")
    break
  fi
  args+=("$1")
  shift
done
hosts=1
if [[ -n $hostfile ]]; then
  [[ -r $hostfile ]] || { echo "run.sh: --hostfile $hostfile: no such readable file" >&2; exit 2; }
  hosts=$(grep -cvE '^[[:space:]]*(#|$)' "$hostfile" || true)
  ((hosts > 0)) || { echo "run.sh: --hostfile $hostfile names no host" >&2; exit 2; }
fi

# The effective config (validated, overrides applied) tells pp and dp.
overrides=()
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == --set && $((i + 1)) -lt ${#args[@]} ]]; then
    overrides+=(--set "${args[i + 1]}")
    i=$((i + 1))
  elif [[ ${args[i]} == --set=* ]]; then
    overrides+=("${args[i]}")
  fi
done
# --config_only: the ranks open the data (on their own hosts, with --hostfile); a dry run needs none.
effective=$("$build/freeride" config check --config_only "$config" "${overrides[@]}") || exit 1
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
per_host=$(( (ranks + hosts - 1) / hosts ))
threads=${OMP_NUM_THREADS:-$(( cores / per_host > 0 ? cores / per_host : 1 ))}
export OMP_NUM_THREADS=$threads
bind=${FREERIDE_BIND:-core}
if [[ $bind == core ]] && (( per_host * threads <= cores )); then
  export OMP_PLACES=${OMP_PLACES:-cores} OMP_PROC_BIND=${OMP_PROC_BIND:-close}
else
  bind=none
fi
# The command, printed (--dry-run: one shell-quoted line, with the variables it sets) or run.
launch() {
  if $dry_run; then
    local env_line="OMP_NUM_THREADS=$OMP_NUM_THREADS"
    [[ $bind == core ]] && env_line+=" OMP_PLACES=$OMP_PLACES OMP_PROC_BIND=$OMP_PROC_BIND"
    echo "$env_line $(printf '%q ' "$@")" | sed 's/ $//'
    exit 0
  fi
  exec "$@"
}
program=("$build/freeride" "$command" --config "$config" "${args[@]}")
if [[ $emulated == true ]]; then
  # One process, no MPI: OMP_PLACES/OMP_PROC_BIND bind its threads.
  if [[ -n $hostfile || ${#launcher_args[@]} -gt 0 ]]; then
    echo "run.sh: runtime.emulate_peers = true runs one process without a launcher: no" \
      "--hostfile or launcher arguments" >&2
    exit 2
  fi
  launch "${program[@]}"
fi
if [[ -n ${SLURM_JOB_ID:-} ]] && command -v srun >/dev/null; then
  if [[ -n $hostfile ]]; then
    echo "run.sh: inside a Slurm allocation srun places the ranks on the allocation's nodes:" \
      "no --hostfile (give sbatch/salloc --nodes instead)" >&2
    exit 2
  fi
  slurm_bind=(--cpu-bind=none)
  if [[ $bind == core ]]; then slurm_bind=(--cpus-per-task="$threads" --cpu-bind=cores); fi
  # Open MPI joins a Slurm step through PMIx; SLURM_MPI_TYPE names another plug-in.
  launch srun -n "$ranks" --mpi="${SLURM_MPI_TYPE:-pmix}" "${slurm_bind[@]}" \
    "${launcher_args[@]}" "${program[@]}"
fi
# A run.dir that holds another run is refused by one process before the ranks start: one
# message and status 2, not rank 0's among an aborted MPI job's lines. (With --hostfile rank 0
# may run elsewhere, where its run.dir is: it decides.)
if [[ -z $hostfile ]] && ! $dry_run; then
  "${program[@]}" --check_run_dir || exit $?
fi
extra=()
if [[ -n $hostfile ]]; then extra+=(--hostfile "$hostfile"); fi
if (( per_host > cores )); then extra+=(--oversubscribe); fi
if [[ $(id -u) -eq 0 ]]; then extra+=(--allow-run-as-root); fi
if [[ $bind == core ]]; then
  extra+=(--map-by "slot:PE=$threads" --bind-to core -x OMP_PLACES -x OMP_PROC_BIND)
else
  extra+=(--bind-to none)
fi
extra+=(-x OMP_NUM_THREADS)
# Forwarded only when set: Open MPI warns of every -x variable it cannot find. Unset, each rank
# picks its BLAS kernels itself (core/blas_setup.h).
if [[ -n ${OPENBLAS_CORETYPE:-} ]]; then extra+=(-x OPENBLAS_CORETYPE); fi
launch mpirun -n "$ranks" "${extra[@]}" "${launcher_args[@]}" "${program[@]}"
