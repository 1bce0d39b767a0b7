#!/usr/bin/env bash
# Multi-node training inside one SLURM allocation: one `accelerate launch` per node (srun, one task per node),
# each starting PROCS_PER_NODE training processes; the first node of the allocation hosts the rendezvous.
#   scripts/slurm_accelerate.sh ACCELERATE_CONFIG STAGE ARGS...     runs `rstar2 STAGE ARGS...` on every process
# Use it as a training rule's launcher, e.g. in the workflow config:
#   distributed: {launch: {rl: "scripts/slurm_accelerate.sh configs/accelerate/fsdp.yaml"},
#                 resources: {rl: {gpu: 8, nodes: 8}}}
# and give the rule `mpi: srun` in the SLURM profile so that the job step does not wrap it in `srun -n1`
# (see profiles/slurm/config.yaml). The accelerate config gives the engine (FSDP, DDP); this script sets
# the layout over it: --num_machines, --num_processes, --machine_rank, --main_process_ip/port, static rendezvous.
# Environment: PROCS_PER_NODE (default: SLURM_GPUS_ON_NODE, the GPUs SLURM gave each node, else 8 as on the paper's
# nodes), MASTER_PORT (default 29500), PYTHON (default: python3 on PATH; runs accelerate and the stage, so both
# come from the same environment).
# Each training process first prints one line naming itself (scripts/slurm_process.sh): host, the address it
# reaches the rendezvous from, its rank, the rendezvous address. Run across two SLURM nodes in two network
# namespaces of one machine by tests/test_two_nodes.py (see docs/scale.md, "Multi-node launch").
set -euo pipefail
die() { echo "slurm_accelerate: $*" >&2; exit 2; }
config=${1:?usage: slurm_accelerate.sh ACCELERATE_CONFIG STAGE ARGS...}
shift
[ -f "$config" ] || die "accelerate config $config not found"
nodes=${SLURM_JOB_NUM_NODES:?run this inside a SLURM allocation (sbatch or salloc)}
procs_per_node=${PROCS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=${MASTER_PORT:-29500}
python=${PYTHON:-$(command -v python3 || true)}
[ -n "$python" ] || die "no python3 on PATH (set PYTHON to the environment's interpreter)"
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC2016  # expanded on each node, where SLURM_NODEID differs
exec srun --nodes="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
  exec "$5" -m accelerate.commands.launch --config_file "$0" --num_machines "$1" --num_processes "$(( $1 * $2 ))" \
    --machine_rank "$SLURM_NODEID" --main_process_ip "$3" --main_process_port "$4" --rdzv_backend static \
    --no_python "$6" "$5" -m rstar2.cli "${@:7}"' \
  "$config" "$nodes" "$procs_per_node" "$master" "$port" "$python" "$here/slurm_process.sh" "$@"
