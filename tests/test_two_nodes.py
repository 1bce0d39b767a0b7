"""A two-node RL step through SLURM on one machine: scripts/netns_slurm.sh starts a cluster whose two nodes are two
network namespaces (scripts/netns_nodes.sh: own address, own host name, one veth pair between them, no route out),
one slurmd per node; a two-node ``sbatch`` job runs the multi-node launcher, scripts/slurm_accelerate.sh, which
starts one ``accelerate launch`` per node (srun) for one real ``rstar2 rl`` step (a tiny model, real rollouts
through the sandbox) with the rendezvous on the first node's address.

Checked: each training process names its host, the address it reaches the rendezvous from, its rank and the
rendezvous address (``[launch]`` lines, printed by the test: ``pytest -s``); the step ran once over both processes'
groups and updated the weights; the process group's traffic crossed the veth pair (each node's end sent and
received at least the share of a gradient all-reduce that any algorithm sends, half the model's bytes); no node
has a route out; SLURM's record of the job has both nodes; the namespaces are gone afterwards, also when the test
fails. Not shown: several processes per node, GPUs, a real network between machines.

The accelerate config is a parameter (ACCELERATE_CONFIG, or $RSTAR2_TWO_NODE_ACCELERATE_CONFIG): the DDP-over-gloo
config runs here, one process per node; a sharded engine's CPU config goes in its place.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import stage_params

REPO = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIG = os.environ.get("RSTAR2_TWO_NODE_ACCELERATE_CONFIG", "configs/accelerate/cpu_2proc.yaml")
NODES, SLURM = REPO / "scripts" / "netns_nodes.sh", REPO / "scripts" / "netns_slurm.sh"
PORT = 29500
pytestmark = pytest.mark.slow

RL_PARAMS = stage_params("rl", "stage1", overrides={"seed": 3, "tool": {"timeout_s": 3}, "rl": {
    "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 2, "oversample": 2, "prompts_per_step": 2,
    "learning_rate": 1e-2, "warmup_steps": 0, "checkpoint_every": 0, "temperature": 1.0, "top_p": 1.0,
    "batch_size": 4, "stages": {"stage1": {"max_response_tokens": 16, "max_turns": 2, "steps": 1}}}})
LAUNCH = re.compile(r"\[launch\] host=(\S+) addr=(\S+) rank=(\d+)/(\d+) local_rank=(\d+) node=(\d+)/(\d+) "
                    r"rendezvous=(\S+):(\d+) \((\S+)\) pid=\d+")


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(state folder, node settings from nodes.env, environment with SLURM_CONF) of a started two-node cluster;
    stopped and its namespaces deleted after the module, whatever happened."""
    state = tmp_path_factory.mktemp("netns_slurm")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "PROCS_PER_NODE": "1", "MASTER_PORT": str(PORT)}
    try:
        r = subprocess.run([str(SLURM), "start", str(state)], env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            pytest.fail(lines[-1] if lines else f"{SLURM.name} start exited {r.returncode}", pytrace=False)
        env["SLURM_CONF"] = re.search(r"export SLURM_CONF=(\S+)", r.stdout).group(1)
        yield state, _nodes(state), env
    finally:
        made = [v for k, v in _nodes(state).items() if k.startswith("NS_")]
        r = subprocess.run([str(SLURM), "stop", str(state)], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        left = [ns for ns in made if ns in _netns_list()]
        assert not left, f"namespaces left after {SLURM.name} stop: {left}"


def _nodes(state: Path) -> dict[str, str]:
    """NS_i, HOST_i, ADDR_i of the nodes (scripts/netns_nodes.sh's nodes.env); empty when there are none."""
    f = state / "nodes.env"
    return dict(line.split("=", 1) for line in f.read_text().split()) if f.exists() else {}


def _on(state: Path, node: int, *cmd: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(NODES), "on", str(state), str(node), *cmd], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _wait_for(state: Path, job_id: str, env: dict, timeout_s: float) -> dict[str, str]:
    """SLURM's record of job ``job_id`` (``scontrol show job`` fields) once it has ended; polled every 0.5 s
    (``sbatch --wait`` polls at growing intervals, seconds apart, which would add to the module's time)."""
    deadline = time.time() + timeout_s
    while True:
        record = _on(state, 0, "scontrol", "show", "job", "--oneliner", job_id, env=env).stdout
        fields = dict(re.findall(r"(\S+?)=(\S*)", record))
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return fields
        assert time.time() < deadline, f"job {job_id} still {fields.get('JobState')} after {timeout_s} s"
        time.sleep(0.5)


def _tx_rx(state: Path, node: int, env: dict) -> tuple[int, int]:
    """Bytes sent and received so far by node ``node``'s interface (eth0, its end of the veth pair)."""
    out = _on(state, node, "cat", "/proc/net/dev", env=env).stdout
    fields = next(line.split(":", 1)[1].split() for line in out.splitlines() if line.strip().startswith("eth0:"))
    return int(fields[8]), int(fields[0])


def _rl_inputs(root: Path) -> None:
    """A tiny random Qwen3 in ``root/model`` whose turns end early, so rollouts are graded and earn configs/tiny.yaml's
    smoke reward (the step updates), and four addition problems in ``root/train.jsonl``."""
    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4,
                                                         "stop_early": True}}, root / "model")
    with open(root / "train.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"p{i}", "problem": f"What is {i} plus {i}?", "answer": str(2 * i)}) + "\n")


def test_rl_step_across_two_slurm_nodes(cluster, tmp_path):
    state, nodes, env = cluster
    _rl_inputs(tmp_path)
    out = tmp_path / "rl" / "stage1"
    job = tmp_path / "job.sh"
    # the training rule's shell command with distributed.launch.rl = "scripts/slurm_accelerate.sh CONFIG"
    stage = ["rl", "--params", json.dumps(RL_PARAMS), "--model", str(tmp_path / "model"),
             "--data", str(tmp_path / "train.jsonl"), "--out", str(out)]
    job.write_text("#!/usr/bin/env bash\nexec " + shlex.join(["scripts/slurm_accelerate.sh", ACCELERATE_CONFIG,
                                                                *stage]) + "\n")
    before = [_tx_rx(state, i, env) for i in (0, 1)]
    log = tmp_path / "job.log"
    r = _on(state, 0, "sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--chdir={REPO}",
            f"--output={log}", str(job), env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    fields = _wait_for(state, job_id, env, timeout_s=600)
    text = log.read_text() if log.exists() else ""
    launch = [m.groups() for m in LAUNCH.finditer(text)]
    for line in re.findall(r"^\[launch\].*$", text, re.M):
        print(line)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), (fields, text[-6000:])

    # one line per process: rank r on node r, each reporting its own host name and its namespace's address, both
    # with the rendezvous on node 0's host name and address
    by_rank = {int(g[2]): g for g in launch}
    assert len(launch) == 2 and sorted(by_rank) == [0, 1], text[-4000:]
    for rank, (host, addr, _, world, local, node, n_nodes, rdzv_host, rdzv_port, rdzv_ip) in by_rank.items():
        assert (host, addr) == (nodes[f"HOST_{rank}"], nodes[f"ADDR_{rank}"]), by_rank[rank]
        assert (world, local, node, n_nodes) == ("2", "0", str(rank), "2"), by_rank[rank]
        assert (rdzv_host, rdzv_port, rdzv_ip) == (nodes["HOST_0"], str(PORT), nodes["ADDR_0"]), by_rank[rank]

    # the step: one, over both processes' groups (2 prompts x 2G rollouts, one prompt per process)
    assert text.count("[rl] step 1:") == 1, text[-3000:]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["groups"] == 2, metrics
    assert metrics[0]["kept_total"] > 0 and not metrics[0]["update_skipped"], metrics   # a gradient to all-reduce
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and len({row["problem_id"] for row in rows}) == 2
    assert json.loads((out / "manifest.json").read_text())["counts"]["steps"] == 1

    # the process group's traffic crossed the veth pair: an all-reduce of N bytes over two processes sends at least
    # N/2 from each (any algorithm; DDP's gradient is the model's size, and a sharded engine moves more), and no
    # node has a route out of the pair
    model_bytes = (tmp_path / "model" / "model.safetensors").stat().st_size
    after = [_tx_rx(state, i, env) for i in (0, 1)]
    moved = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)]
    print(f"[two-nodes] eth0 bytes (sent, received) during the job: node0 {moved[0]}, node1 {moved[1]}; "
          f"model {model_bytes} bytes")
    assert all(min(tx, rx) >= model_bytes // 2 for tx, rx in moved), (moved, model_bytes)
    for i in (0, 1):
        assert "default" not in _on(state, i, "ip", "route", env=env).stdout

    # SLURM's own record: the job ran on both nodes
    assert fields["NumNodes"] == "2", fields
    assert _on(state, 0, "scontrol", "show", "hostnames", fields["NodeList"], env=env).stdout.split() == \
        [nodes["HOST_0"], nodes["HOST_1"]], fields
