#!/usr/bin/env bash
# One training process of scripts/slurm_accelerate.sh: prints one line naming this process, then becomes the
# command it is given (exec: same pid). The line, on stdout:
#   [launch] host=H addr=A rank=R/W local_rank=L node=N/M rendezvous=MASTER_ADDR:MASTER_PORT (IP) pid=P
# A is the source address of this host's route to the rendezvous (the interface the process group's traffic
# leaves by); RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT are what torchrun (under
# `accelerate launch`) set for this process; M is SLURM_JOB_NUM_NODES.
set -euo pipefail
ip_of=$(getent ahostsv4 "$MASTER_ADDR" | awk '{print $1; exit}')
addr="?"
if [ -n "$ip_of" ] && command -v ip >/dev/null 2>&1; then
  addr=$(ip -o route get "$ip_of" | sed -n 's/.* src \([^ ]*\).*/\1/p')
fi
echo "[launch] host=$(hostname) addr=${addr:-?} rank=$RANK/$WORLD_SIZE local_rank=$LOCAL_RANK" \
     "node=$GROUP_RANK/${SLURM_JOB_NUM_NODES:-?} rendezvous=$MASTER_ADDR:$MASTER_PORT (${ip_of:-unresolved}) pid=$$"
exec "$@"
