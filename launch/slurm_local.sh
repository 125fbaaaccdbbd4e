#!/usr/bin/env bash
# A one-node Slurm on this machine, for trying `launch/run.sh` under srun without a cluster:
# munge, slurmctld and slurmd, all state under DIR, every CPU of this machine one node.
# MpiDefault=none, as on many clusters: launch/run.sh asks srun for PMIx itself (Open MPI joins
# through it; freeride sees PMIX_RANK). Debian: apt-get install slurm-wlm munge. Root only (the
# daemons run as root here).
#   eval "$(launch/slurm_local.sh start DIR)"   # prints SLURM_CONF=...; then salloc/srun/sbatch
#   launch/slurm_local.sh stop DIR
set -euo pipefail
action=${1:-} dir=${2:-}
[[ ($action == start || $action == stop) && -n $dir ]] ||
  { echo "usage: $0 start|stop DIR" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
  for d in slurmd slurmctld munged; do
    [[ -f $dir/$d.pid ]] && kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
  done
  sleep 1
}
if [[ $action == stop ]]; then stop; exit 0; fi

for tool in slurmctld slurmd munged srun; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install slurm-wlm munge" >&2; exit 3; }
done
[[ $(id -u) -eq 0 ]] || { echo "$0 runs the daemons as root; run it as root" >&2; exit 3; }
host=$(hostname -s)
cpus=$(nproc --all)
memory=$(awk '/MemTotal/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
cat > "$dir/slurm.conf" <<EOF
ClusterName=freeride
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
# munge: a fresh key and a daemon of our own, on its own socket.
[[ -f $dir/munge/munge.key ]] ||
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
chmod 700 "$dir/munge"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 30); do
  if sinfo -h -o %t 2>/dev/null | grep -q idle; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 1
done
echo "slurm did not come up; logs in $dir" >&2
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
