#!/usr/bin/env bash
# A two-node SLURM cluster on one machine: the nodes of scripts/netns_nodes.sh (two network namespaces, each with
# its own address and host name), one slurmd per node, slurmctld on node 0, one munged shared through its socket.
# For tests/test_two_nodes.py, which submits a two-node job that runs scripts/slurm_accelerate.sh.
#   scripts/netns_slurm.sh start DIR     nodes up, config written, daemons started, both nodes idle; prints
#                                        `export SLURM_CONF=DIR/slurm.conf`. Client commands (sbatch, squeue ...)
#                                        run on a node: scripts/netns_nodes.sh on DIR 0 sbatch ...
#   scripts/netns_slurm.sh stop DIR      daemons stopped, nodes down (also after a failed start)
# Everything lives in DIR: config, munge key and socket, state, spool and logs (per node: %n). Both nodes declare
# the machine's CPUs (they share them). Nothing is installed here: scripts/system_deps.sh test installs SLURM and
# munge. The controller and the daemons listen inside the namespaces only; the /run/slurm/conf link that
# scripts/local_slurm.sh makes is not touched (commands here find the config through SLURM_CONF), so both
# clusters may run at once.
set -euo pipefail
die() { echo "netns_slurm: $*" >&2; exit 1; }
verb=${1:-}; dir=${2:-}
[ -n "$verb" ] && [ -n "$dir" ] || die "usage: $0 start|stop DIR"
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
NODES="$(cd "$(dirname "$0")" && pwd)/netns_nodes.sh"
CONF="$dir/slurm.conf"
CPUS=$(nproc)

running() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }
last_error() { grep -hE "error|fatal" "$dir"/log/"$1"*.log 2>/dev/null | tail -1 || true; }

write_config() {
  mkdir -p "$dir"/{state,spool,log,munge}
  cat >"$CONF" <<EOF
# written by scripts/netns_slurm.sh: two nodes in two network namespaces of one machine
ClusterName=rstar2netns
SlurmctldHost=$HOST_0($ADDR_0)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName=$HOST_0 NodeAddr=$ADDR_0 CPUs=$CPUS State=UNKNOWN
NodeName=$HOST_1 NodeAddr=$ADDR_1 CPUs=$CPUS State=UNKNOWN
PartitionName=two Nodes=$HOST_0,$HOST_1 Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  [ "$(id -u)" -eq 0 ] || die "cannot start: needs root (network namespaces, munged and the SLURM daemons as root)"
  local exe
  for exe in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd; do
    [ -x "$exe" ] || die "cannot start: $exe missing (scripts/system_deps.sh test installs munge, slurmctld, slurmd)"
  done
  command -v sinfo >/dev/null 2>&1 || die "cannot start: sinfo missing (scripts/system_deps.sh test installs slurm-client)"
  "$NODES" up "$dir"
  # shellcheck source=/dev/null
  . "$dir/nodes.env"
  write_config
  mkdir -p "$dir/spool/$HOST_0" "$dir/spool/$HOST_1"
  [ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 700 "$dir/munge"; chmod 600 "$dir/munge/munge.key"
  /usr/sbin/munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" \
    || die "cannot start: munged failed ($(tail -1 "$dir/log/munged.log" 2>/dev/null))"
  export SLURM_CONF="$CONF"
  "$NODES" on "$dir" 0 /usr/sbin/slurmctld -c -f "$CONF" || die "cannot start: slurmctld failed ($(last_error slurmctld))"
  local i host
  for i in 0 1; do
    host="HOST_$i"
    "$NODES" on "$dir" "$i" /usr/sbin/slurmd -f "$CONF" -N "${!host}" \
      || die "cannot start: slurmd on ${!host} failed ($(last_error "slurmd-${!host}"))"
  done
  local states=""
  for i in $(seq 1 60); do
    states=$("$NODES" on "$dir" 0 sinfo -h -N -o %t 2>/dev/null | sort | tr '\n' ' ' || true)
    [ "$states" = "idle idle " ] && { echo "export SLURM_CONF=$CONF"; return 0; }
    sleep 0.5
  done
  die "cannot start: the nodes did not both become idle in 30 s (states '${states:-none}'; slurmctld: $(last_error slurmctld); slurmd: $(last_error slurmd))"
}

stop() {
  local f pids=() pid i
  # jobs still running (a test that failed or timed out): SLURM ends their process trees, sandboxes included
  if running slurmctld; then SLURM_CONF="$CONF" "$NODES" on "$dir" 0 scancel --partition=two 2>/dev/null || true; fi
  for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -f "$f" ] && pid=$(cat "$f") && kill "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  for pid in "${pids[@]}"; do
    for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  done
  "$NODES" down "$dir"   # ends whatever job processes are left on the nodes
}

case "$verb" in
  start) start ;;
  stop) stop ;;
  *) die "unknown verb $verb (start | stop)" ;;
esac
