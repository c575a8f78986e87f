#!/usr/bin/env bash
# A one-node Slurm on this machine, to run pipit under `srun` as a cluster would: Debian's
# slurm-wlm (slurmctld and slurmd) with munge, its state under $PIPIT_SLURM_DIR (default
# /tmp/pipit-slurm). Slurm and Debian's Open MPI meet through PMIx (`srun --mpi=pmix`).
#   tools/slurm_local.sh start     install (tools/install_deps.sh --with-slurm), configure, start
#   tools/slurm_local.sh stop      stop the daemons
#   tools/slurm_local.sh env       print the export that points srun at this Slurm
# Then, e.g.:
#   eval "$(tools/slurm_local.sh env)"
#   srun --mpi=pmix -n 2 build/train_gpt --launcher mpi --steps 20
# Runs as root (the daemons drop nothing here: SlurmUser=root); a test machine's tool only.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PIPIT_SLURM_DIR:-/tmp/pipit-slurm}
conf=$dir/slurm.conf

start() {
  bash tools/install_deps.sh --with-slurm >/dev/null
  mkdir -p "$dir/state" "$dir/spool"
  local host cpus memory
  host=$(hostname -s)
  cpus=$(nproc)
  memory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
  cat >"$conf" <<CONF
ClusterName=pipit-local
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge
    munged --force 2>/dev/null
  fi
  export SLURM_CONF=$conf
  pgrep -x slurmctld >/dev/null || slurmctld -f "$conf"
  pgrep -x slurmd >/dev/null || slurmd -f "$conf"
  for _ in $(seq 1 50); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm_local: $host up, $cpus CPUs (SLURM_CONF=$conf)"
      return 0
    fi
    sleep 0.2
  done
  echo "slurm_local: the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
  return 1
}

stop() {
  pkill -x slurmd || true
  pkill -x slurmctld || true
  echo "slurm_local: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: tools/slurm_local.sh start|stop|env" >&2; exit 2 ;;
esac
