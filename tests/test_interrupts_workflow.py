"""A signal to the ``snakemake`` process alone (a script or a scheduler stopping it) stops a running RL job within
seconds, and the rerun resumes from the last checkpoint (rstar2/stages/interrupts.py ``forward_signals``). One tiny
workflow: the upstream outputs are written directly (a tiny model as base and SFT model, a few problems as the
curated data), so only rl_stage1 runs (2 steps, a checkpoint per step): SIGINT to snakemake once it has checkpoint 1,
then a rerun to the end. Also: the jobs' `reason:` lines are short (a params digest) and the job's log holds the
params JSON under the digest Snakemake recorded. SIGTERM to snakemake takes the same path (the same handler, checked
with a stand-in process in test_interrupts.py, which also tests the job's own signal handling)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
import served
from conftest import copy_workflow

from rstar2.stage_client import ENV_VAR

pytestmark = pytest.mark.slow   # whole-workflow runs: `make test-fast` leaves them out

# unserved (tests/served.py): _rl_processes finds the job by its command line, which a served job's process has not
ENV = {k: v for k, v in served.env().items() if k != ENV_VAR}
STOP_WITHIN_S = 30   # from the signal to snakemake's exit: the job stops, then Snakemake cleans up and exits
STAGE = "results/rl/stage1/manifest.json"
SNAKEMAKE = [sys.executable, "-m", "snakemake", *served.snakemake_args(), "--cores", "2", "--configfile",
             "configs/tiny.yaml", "interrupt.yaml", "--"]


def _upstream(wd: Path) -> None:
    """The outputs of base_model, sft_data, sft, rl_candidates and rl_data, older than nothing they depend on."""
    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4}},
                       wd / "results/base_model/model")
    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4}},
                       wd / "results/sft/model")
    rows = "".join(json.dumps({"id": f"mine-{i}", "source": "mine", "problem": f"What is {i} plus {i}?",
                               "answer": str(2 * i), "answer_type": "integer"}) + "\n" for i in range(6))
    for f in ("mine.jsonl", "results/sft_data/train.jsonl", "results/rl_candidates/train.jsonl",
              "results/rl_data/train.jsonl"):
        (wd / f).parent.mkdir(parents=True, exist_ok=True)
        (wd / f).write_text(rows)
    for stage in ("base_model", "sft_data", "sft", "rl_candidates", "rl_data"):
        (wd / f"results/{stage}/manifest.json").write_text("{}\n")
    for f in ("rl_candidates/funnel.json", "rl_data/funnel.json", "rl_data/funnel.png"):
        (wd / "results" / f).write_text("{}\n")
    # mtimes in dependency order: the source, base_model, sft_data, rl_candidates, then sft and rl_data
    t = time.time() - 100
    os.utime(wd / "mine.jsonl", (t - 10, t - 10))
    for stage, dt in (("base_model", 0), ("sft_data", 0), ("rl_candidates", 0), ("sft", 10), ("rl_data", 10)):
        for p in [wd / "results" / stage, *(wd / "results" / stage).rglob("*")]:
            os.utime(p, (t + dt, t + dt))


def _snakemake(wd: Path, log: Path):
    return subprocess.Popen([*SNAKEMAKE, STAGE], cwd=wd, env=ENV, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _rl_processes(wd: Path) -> list[int]:
    """Processes running this workflow's rl_stage1 job (`rstar2 rl ... --out results/rl/stage1`)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd == str(wd) and b"rl" in args and b"results/rl/stage1" in args:
            found.append(int(proc.name))
    return found


def _interrupt(wd: Path, log: Path, checkpoint: int, sig: int) -> float:
    """Run the stage, send ``sig`` to the snakemake process alone once checkpoint ``checkpoint`` is complete;
    returns the seconds from the signal to snakemake's exit (every RL process gone)."""
    marker = wd / f"results/rl/checkpoints/stage1/checkpoint-{checkpoint}/rstar2_state.json"
    proc = _snakemake(wd, log)
    jobs_planned = False
    try:
        deadline = time.time() + 400
        while not marker.exists():
            assert proc.poll() is None, "snakemake ended before the checkpoint:\n" + log.read_text()[-4000:]
            if not jobs_planned and "total" in log.read_text():   # only the RL job runs: the upstream is complete
                stats = log.read_text().split("Job stats:")[1].split("total")[0]
                assert [line.split()[0] for line in stats.splitlines()[3:] if line.strip()] == ["rl"], stats
                jobs_planned = True
            assert time.time() < deadline, "no checkpoint in time:\n" + log.read_text()[-4000:]
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        t0 = time.time()
        proc.wait(timeout=STOP_WITHIN_S + 60)
        while _rl_processes(wd) and time.time() < t0 + STOP_WITHIN_S + 60:
            time.sleep(0.2)
        took = time.time() - t0
        assert not _rl_processes(wd), "the RL job outlived snakemake"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert not (wd / STAGE).exists(), "interrupted too late: the stage had finished"
    return took


def test_a_signal_to_snakemake_alone_stops_the_rl_job_and_a_rerun_resumes(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    _upstream(wd)
    (wd / "interrupt.yaml").write_text(
        "rl_data: {sources: [{name: mine, path: mine.jsonl, fields: {problem: problem, "
        "answer: answer, id: id}}], decontaminate_against: [], max_prompt_tokens: null}\n"
        "rl: {checkpoint_every: 1, stages: {stage1: {max_response_tokens: 16, max_turns: 1, steps: 2}, "
        "stage2: null, stage3: null}}\n"
        "evaluate: {models: []}\n")

    took = _interrupt(wd, tmp_path / "run1.log", 1, signal.SIGINT)
    print(f"[interrupts] SIGINT to snakemake alone: exited {took:.1f} s after the signal")
    assert took < STOP_WITHIN_S
    job_log = (wd / "logs/rl/stage1.log").read_text()
    assert "[rl] SIGINT: stopped; a rerun resumes from results/rl/checkpoints/stage1/checkpoint-1 (step 1)" in job_log, \
        job_log[-3000:]

    done = subprocess.run([*SNAKEMAKE, STAGE], cwd=wd, env=ENV, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    manifest = json.loads((wd / STAGE).read_text())
    assert manifest["counts"]["resumed_from_step"] == 1 and manifest["counts"]["steps"] == 2
    steps = [json.loads(line)["step"] for line in (wd / "results/rl/stage1/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert "[rl] resuming rl_stage1 from results/rl/checkpoints/stage1/checkpoint-1 (step 1)" in out
    # recorded complete: its kept outputs and checkpoints are gone (onsuccess)
    assert not (wd / "results/rl/checkpoints").exists() and not (wd / "results/rl/finished").exists()
    # short reason lines; the params' JSON is in the job's log, under the digest Snakemake recorded
    reasons = [line for line in out.splitlines() if line.strip().startswith("reason:")]
    assert reasons and max(map(len, reasons)) < 400, max(reasons, key=len)
    first = (wd / "logs/rl/stage1.log").read_text().splitlines()[0]
    digest, text = first.split(" ", 2)[1], first.split(" ", 2)[2]
    assert json.loads(text)["name"] == "rl_stage1"
    record = wd / ".snakemake/metadata" / urlsafe_b64encode(STAGE.encode()).decode()   # Snakemake's record
    assert json.loads(record.read_text())["params"] == [f"params {digest}"]
