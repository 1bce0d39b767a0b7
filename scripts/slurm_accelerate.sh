#!/usr/bin/env bash
# Multi-node training inside one SLURM allocation: one `accelerate launch` per node (srun, one task per node),
# each starting one training process per GPU; the first node of the allocation hosts the rendezvous.
# Use it as a training rule's launcher, e.g. in the workflow config:
#   distributed: {launch: {rl: "scripts/slurm_accelerate.sh configs/accelerate/fsdp.yaml"},
#                 resources: {rl: {gpu: 8, nodes: 8}}}
# and give the rule `mpi: srun` in the SLURM profile so that the job step does not wrap it in `srun -n1`
# (see profiles/slurm/config.yaml). GPUS_PER_NODE (default 8) and MASTER_PORT (default 29500) may be set.
# Written for the paper's 8 x 8 GPU layout; not run here (no SLURM cluster was available).
set -euo pipefail
config=${1:?usage: slurm_accelerate.sh ACCELERATE_CONFIG STAGE ARGS...}
shift
nodes=${SLURM_JOB_NUM_NODES:?run this inside a SLURM allocation}
gpus_per_node=${GPUS_PER_NODE:-8}
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=${MASTER_PORT:-29500}
# shellcheck disable=SC2016  # expanded on each node, where SLURM_NODEID differs
exec srun --nodes="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
  exec accelerate launch --config_file "$0" --num_machines "$1" --num_processes "$(( $1 * $2 ))" \
    --machine_rank "$SLURM_NODEID" --main_process_ip "$3" --main_process_port "$4" --rdzv_backend static \
    -m rstar2.cli "${@:5}"' "$config" "$nodes" "$gpus_per_node" "$master" "$port" "$@"
