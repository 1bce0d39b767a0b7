#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for running the workflow with profiles/slurm locally and in CI
# (tests/test_slurm_live.py). Daemons are started directly (no systemd): munged, slurmctld, slurmd, all as root.
#   scripts/local_slurm.sh start    install what is missing (apt), write the config, start the daemons, wait for
#                                   the node to be idle; prints `export SLURM_CONF=...` for the client commands
#   scripts/local_slurm.sh stop     stop the daemons this script started (by their pid files)
#   scripts/local_slurm.sh status   the daemons' pids and `sinfo`
# Config, keys, state, spool and logs live in one folder: $RSTAR2_SLURM_DIR (default .local_slurm in the repo).
# Partitions mirror profiles/slurm: `cpu` (default) and `gpu`; the gpu partition has no gres (no GPU is faked),
# so it shows partition routing only. The node has 2 CPUs (SlurmdParameters=config_overrides) and the machine's
# memory as RealMemory. No accounting daemon: the executor plugin polls job states with squeue (MinJobAge is
# long enough for it), and jobs are inspected with `scontrol show job`. Memory limits are scheduled, not
# enforced (no cgroups here). slurmctld and slurmd listen on free ports chosen at start, on 127.0.0.1 only where
# the host name resolves to a loopback address (below); the node's address is 127.0.0.1.
# Job steps: the executor's job step (snakemake-executor-plugin-slurm-jobstep) runs `srun` with the SLURM_*
# variables removed, SLURM_CONF among them, so srun finds the config where a configless compute node keeps it:
# /run/slurm/conf/slurm.conf, a link to this cluster's file while it runs (so one such cluster per machine; a
# system cluster's /etc/slurm/slurm.conf would win over it, and start refuses then).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${RSTAR2_SLURM_DIR:-$REPO/.local_slurm}"
CONF="$DIR/slurm.conf"
CPUS="${RSTAR2_SLURM_CPUS:-2}"
LINK=/run/slurm/conf/slurm.conf

die() { echo "local_slurm: $*" >&2; exit 1; }

install_missing() {
  declare -A cmd=([munge]=munged [slurmctld]=slurmctld [slurmd]=slurmd [slurm-client]=sbatch)
  local missing=() pkg
  for pkg in munge slurmctld slurmd slurm-client; do
    command -v "${cmd[$pkg]}" >/dev/null 2>&1 || [ -x "/usr/sbin/${cmd[$pkg]}" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "cannot start: ${missing[*]} not installed and no apt-get to install them"
  echo "local_slurm: installing ${missing[*]}" >&2
  apt-get update -qq >&2 || die "cannot start: apt-get update failed (installing ${missing[*]})"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "cannot start: apt-get install ${missing[*]} failed"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

running() { [ -f "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

last_log_line() { [ -f "$DIR/log/$1.log" ] && grep -E "error|fatal" "$DIR/log/$1.log" | tail -1 || true; }

write_config() {
  local host mem ctl_port d_port
  host="$(hostname -s)"
  mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))   # MB, as slurmd -C counts it
  ctl_port="$(free_port)"; d_port="$(free_port)"
  # Bind the daemons to the address the host name resolves to, not to every interface, when that is loopback
  # (the usual /etc/hosts entry): then the cluster is reachable from this machine only.
  bind=""
  case "$(getent hosts "$host" | awk '{print $1; exit}')" in
    127.*) bind="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" ;;
    *) echo "local_slurm: $host does not resolve to a loopback address; slurmctld and slurmd listen on all interfaces" >&2 ;;
  esac
  mkdir -p "$DIR"/{state,spool,log,munge}
  cat >"$CONF" <<EOF
# written by scripts/local_slurm.sh: a one-node cluster on localhost
ClusterName=rstar2local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
$bind
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# finished jobs stay visible to squeue / scontrol for an hour (the executor plugin polls with squeue)
MinJobAge=3600
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
EOF
}

start() {
  [ "$(id -u)" -eq 0 ] || die "cannot start: needs root (to install packages and start munged, slurmctld and slurmd as root)"
  command -v python3 >/dev/null 2>&1 || die "cannot start: python3 missing (used to pick free ports)"
  install_missing
  [ -e /etc/slurm/slurm.conf ] && die "cannot start: /etc/slurm/slurm.conf exists (a system cluster), which job steps would read instead of this cluster's config"
  if [ -e "$LINK" ] && [ "$(readlink "$LINK")" != "$CONF" ]; then
    [ -L "$LINK" ] || die "cannot start: $LINK exists and is not a link of this script"
    if SLURM_CONF="$(readlink "$LINK")" scontrol ping >/dev/null 2>&1; then
      die "cannot start: another local cluster runs ($LINK -> $(readlink "$LINK"))"
    fi
  fi
  if running slurmctld && running slurmd && running munged; then
    echo "export SLURM_CONF=$CONF"; return 0
  fi
  stop >/dev/null 2>&1 || true
  write_config
  [ -f "$DIR/munge/munge.key" ] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; }
  chmod 700 "$DIR/munge"; chmod 600 "$DIR/munge/munge.key"
  /usr/sbin/munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || die "cannot start: munged failed ($(tail -1 "$DIR/log/munged.log" 2>/dev/null))"
  export SLURM_CONF="$CONF"
  mkdir -p "$(dirname "$LINK")" && ln -sfn "$CONF" "$LINK" || die "cannot start: cannot write $LINK"
  /usr/sbin/slurmctld -c -f "$CONF" || die "cannot start: slurmctld failed ($(last_log_line slurmctld))"
  /usr/sbin/slurmd -f "$CONF" -N "$(hostname -s)" || die "cannot start: slurmd failed ($(last_log_line slurmd))"
  local i state=""
  for i in $(seq 1 60); do
    state="$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)"
    [ "$state" = "idle" ] && { echo "export SLURM_CONF=$CONF"; return 0; }
    sleep 0.5
  done
  die "cannot start: the node did not become idle in 30 s (state '${state:-none}'; slurmctld: $(last_log_line slurmctld); slurmd: $(last_log_line slurmd))"
}

stop() {
  local d pid i
  for d in slurmd slurmctld munged; do
    if running "$d"; then
      pid="$(cat "$DIR/$d.pid")"; kill "$pid"
      for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$DIR/$d.pid"
  done
  [ -L "$LINK" ] && [ "$(readlink "$LINK")" = "$CONF" ] && rm -f "$LINK"
  other_cluster
  return 0
}

# A cluster started from another folder (another clone, another RSTAR2_SLURM_DIR) is not this folder's to stop or
# report on: say that it runs, so that "stopped" here is not read as "no cluster on this machine".
other_cluster() {
  if [ -L "$LINK" ] && [ "$(readlink "$LINK")" != "$CONF" ]; then
    echo "local_slurm: another local cluster runs ($LINK -> $(readlink "$LINK")); stop it from there" >&2
  fi
}

status() {
  local d
  for d in munged slurmctld slurmd; do
    if running "$d"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: stopped"; fi
  done
  [ -f "$CONF" ] && SLURM_CONF="$CONF" sinfo 2>/dev/null || true
  other_cluster
  running slurmctld && running slurmd && running munged
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status   (state in \$RSTAR2_SLURM_DIR, default $REPO/.local_slurm)" >&2; exit 2 ;;
esac
