"""The workflow through a live one-node SLURM cluster (scripts/local_slurm.sh, started once for this module):
snakemake-executor-plugin-slurm submits every job with sbatch (``--profile profiles/slurm --workflow-profile
profiles/slurm-local``), and SLURM's own record of each job (``scontrol show job``; the environment slurmctld
stored for it) is checked against the rule's CPUs, memory, time limit and partition and against the config's
sandbox section (RSTAR2_SANDBOX). An RL job cancelled mid-stage (``scancel``) is resubmitted by the profile's
retry and resumes from its checkpoint to the results of the uninterrupted run (rstar2 compare-runs); a job that
fails on bad input ends the workflow with the job's own one-line error.

Covered: the whole tiny DAG, every rule through sbatch: the jobs up to RL stage 1 first (base_model, sft_data,
sft, rl_candidates, rl_data, rl), where the cancel lands, then the rest in the same folder (RL stages 2-3,
hard_problems, evaluate of the final model, report). Not shown: several nodes, GPUs (the gpu partition has no
gres), memory enforcement (no cgroups). Snakemake runs as ``python -m snakemake`` does, except that the executor
checks the jobs' states every 3 s at most instead of 10 s longer after each check (tests/slurm_snakemake.py).
Where SLURM cannot start (not root, packages not installable), the module fails with the script's one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "local_slurm.sh"
PROFILE = ["--profile", "profiles/slurm", "--workflow-profile", "profiles/slurm-local"]

# Distinct per family, so a value that reached the wrong job shows; sandbox values none of the defaults.
TEST_CONFIG = {
    "distributed": {"resources": {"default": {"gpu": 0, "mem_mb": 1100, "runtime": 21},
                                  "sft": {"mem_mb": 1300, "runtime": 23},
                                  "rl": {"mem_mb": 1500, "runtime": 25},
                                  "generate": {"mem_mb": 1200, "runtime": 22}}},
    "sandbox": {"slots": 7, "batch_size": 17},
    "rl": {"stages": {"stage1": {"steps": 3}}},   # long enough for a cancel to land between checkpoints
    "evaluate": {"models": ["rl_stage3"], "benchmarks": ["math500", "ifeval"]},   # one evaluate job, for time
}
# rule -> (CPUs, MB, minutes, partition): threads from the rule or profiles/slurm-local's set-threads, memory and
# time from TEST_CONFIG's family, partition from profiles/slurm-local
EXPECTED = {"base_model": (1, 1100, 21, "cpu"), "sft_data": (1, 1100, 21, "cpu"), "rl_candidates": (1, 1100, 21, "cpu"),
            "sft": (2, 1300, 23, "gpu"), "rl_data": (1, 1200, 22, "gpu"), "rl": (2, 1500, 25, "gpu")}
# the rest of the DAG: rule -> (jobs, CPUs, MB, minutes, partition)
EXPECTED_REST = {"rl": (2, 2, 1500, 25, "gpu"), "hard_problems": (1, 1, 1200, 22, "gpu"),
                 "evaluate": (1, 1, 1200, 22, "gpu"), "report": (1, 1, 1100, 21, "cpu")}
STAGE1 = "results/rl/stage1/manifest.json"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment of a started local cluster (SLURM_CONF set); stopped after the module."""
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "RSTAR2_SLURM_DIR": str(state), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        pytest.fail(lines[-1] if lines else f"{SCRIPT.name} start exited {r.returncode}", pytrace=False)
    env["SLURM_CONF"] = re.search(r"export SLURM_CONF=(\S+)", r.stdout).group(1)
    yield env
    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)


def _workdir(root: Path, extra: dict) -> Path:
    wd = copy_workflow(root)
    (wd / "configs" / "slurm_test.yaml").write_text(yaml.safe_dump(extra))
    return wd


def _snakemake(wd: Path, env: dict, *targets: str, popen: bool = False, extra: tuple = ()):
    # python -m snakemake with status checks at most 3 s apart (tests/slurm_snakemake.py); targets first:
    # --configfile takes a list
    cmd = [sys.executable, str(REPO / "tests" / "slurm_snakemake.py"), *targets, *PROFILE, *extra,
           "--configfile", "configs/tiny.yaml", "configs/slurm_test.yaml"]
    if popen:   # output to a file: a pipe nobody reads while the run goes on could fill and stall it
        return subprocess.Popen(cmd, cwd=wd, env=env, stdout=open(wd / "snakemake.out", "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
    return subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=1500)


def _jobs(env: dict) -> dict[int, dict]:
    """Every job slurmctld still holds (MinJobAge = 1 h), by id: `scontrol show job` fields, 'rule' added."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner"], env=env, capture_output=True, text=True,
                         check=True).stdout
    jobs = {}
    for line in out.splitlines():
        if not line.strip() or line.startswith("No jobs"):
            continue
        fields = dict(re.findall(r"(\S+?)=(\S*)", line))
        m = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", fields.get("Comment", ""))
        # the two RL rules (rl, and rl_keeping_optimizer for a stage whose optimizer the next continues) are one stage
        fields["rule"] = {"rl_keeping_optimizer": "rl"}.get(m.group(1), m.group(1)) if m else None
        jobs[int(fields["JobId"])] = fields
    return jobs


def _show(jobs: dict[int, dict]) -> None:
    """SLURM's record of each job, one line per job (in the test log: pytest -rA)."""
    keys = ("JobId", "JobState", "ExitCode", "Partition", "NumCPUs", "MinMemoryNode", "TimeLimit", "SubmitTime",
            "StartTime", "EndTime", "Comment")
    for _, j in sorted(jobs.items()):
        print("[slurm] " + " ".join(f"{k}={j.get(k)}" for k in keys))


def _stored_env(env: dict, job_id: int) -> dict:
    """The environment slurmctld stored for a batch job (StateSaveLocation/hash.N/job.ID/environment)."""
    state = Path(env["RSTAR2_SLURM_DIR"]) / "state"
    raw = (state / f"hash.{job_id % 10}" / f"job.{job_id}" / "environment").read_bytes()
    return dict(kv.split("=", 1) for kv in raw.decode().split("\0") if "=" in kv)


@pytest.fixture(scope="module")
def stage1_run(slurm, tmp_path_factory):
    """The tiny DAG up to RL stage 1 through SLURM: (workdir, snakemake result, the jobs it submitted)."""
    wd = _workdir(tmp_path_factory.mktemp("wf"), TEST_CONFIG)
    before = set(_jobs(slurm))
    t0 = time.time()
    r = _snakemake(wd, slurm, STAGE1)
    print(f"[slurm] tiny DAG to rl_stage1 through SLURM: {time.time() - t0:.0f} s", file=sys.stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    jobs = {i: j for i, j in _jobs(slurm).items() if i not in before}
    return wd, r, jobs


def test_every_job_goes_through_sbatch_with_its_rules_resources(slurm, stage1_run):
    wd, r, jobs = stage1_run
    _show(jobs)
    log = r.stdout + r.stderr
    assert "localrule" not in log, "a job ran on the submitting host, not through SLURM"
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    assert sorted(map(int, submitted)) == sorted(jobs) and len(re.findall(r"Finished jobid: ", log)) == len(jobs)
    by_rule = {j["rule"]: j for j in jobs.values()}
    assert sorted(by_rule) == sorted(EXPECTED) and len(jobs) == len(EXPECTED), sorted(j["rule"] for j in jobs.values())
    for rule, (cpus, mem, minutes, partition) in EXPECTED.items():
        j = by_rule[rule]
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", (rule, j["JobState"], j["ExitCode"])
        got = (int(j["NumCPUs"]), j["MinMemoryNode"], j["TimeLimit"], j["Partition"])
        assert got == (cpus, f"{mem}M", f"00:{minutes:02d}:00", partition), (rule, got)
        assert j["WorkDir"] == str(wd)
        sandbox = json.loads(_stored_env(slurm, int(j["JobId"]))["RSTAR2_SANDBOX"])
        assert (sandbox["slots"], sandbox["batch_size"]) == (7, 17), (rule, sandbox)
    # the stage's work was done in that job: its SLURM log (kept: profiles/slurm-local) holds the stage's output
    rl_log = next((wd / ".snakemake" / "slurm_logs").glob(f"rule_rl*/**/{by_rule['rl']['JobId']}.log")).read_text()
    assert "[rl] step 3:" in rl_log, rl_log[-2000:]
    assert json.loads((wd / STAGE1).read_text())["counts"]["resumed_from_step"] == 0


def test_cancelled_rl_job_is_resubmitted_and_resumes_to_the_same_results(slurm, stage1_run, tmp_path):
    from rstar2.reproduce import compare_runs

    wd, _, _ = stage1_run
    reference = shutil.copytree(wd / "results", tmp_path / "uninterrupted")
    shutil.rmtree(wd / "results" / "rl" / "stage1")   # stage 1 only is redone; upstream stages stay
    before = set(_jobs(slurm))
    proc = _snakemake(wd, slurm, STAGE1, popen=True)
    marker = wd / "results" / "rl" / "checkpoints" / "stage1" / "checkpoint-1" / "rstar2_state.json"
    deadline, cancelled = time.time() + 600, None
    try:
        while cancelled is None:
            assert proc.poll() is None, ("snakemake ended before a checkpoint was written: "
                                         + (wd / "snakemake.out").read_text()[-3000:])
            assert time.time() < deadline, "no checkpoint of stage 1 within 600 s"
            if marker.exists():
                running = [i for i, j in _jobs(slurm).items() if i not in before and j["rule"] == "rl"
                           and j["JobState"] == "RUNNING"]
                assert len(running) <= 1, running
                if running:   # the job that wrote the checkpoint, still mid-stage
                    cancelled = running[0]
                    subprocess.run(["scancel", str(cancelled)], env=slurm, check=True)
            time.sleep(0.2)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, (wd / "snakemake.out").read_text()[-4000:]
    rl_jobs = {i: j for i, j in _jobs(slurm).items() if i not in before and j["rule"] == "rl"}
    _show(rl_jobs)
    assert [j["JobState"] for _, j in sorted(rl_jobs.items())] == ["CANCELLED", "COMPLETED"], rl_jobs
    manifest = json.loads((wd / STAGE1).read_text())
    assert manifest["counts"]["resumed_from_step"] >= 1, manifest["counts"]   # from a checkpoint, not step 0
    assert [str(d) for d in compare_runs(reference, wd / "results")] == []
    # what was compared changed: every step updated the weights (tiny.yaml's reward, which a random model earns part of)
    metrics = [json.loads(line) for line in (wd / "results/rl/stage1/metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all(not m["update_skipped"] and m["kept_total"] > 0 for m in metrics), metrics


def test_the_rest_of_the_dag_runs_through_slurm_to_the_report(slurm, stage1_run):
    """After stage 1 (and its cancel), the workflow's default target in the same folder: every remaining job is
    submitted with its rule's resources, and the run ends with the report."""
    wd, _, _ = stage1_run
    before = set(_jobs(slurm))
    t0 = time.time()
    r = _snakemake(wd, slurm)
    print(f"[slurm] rest of the tiny DAG through SLURM: {time.time() - t0:.0f} s", file=sys.stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    log = r.stdout + r.stderr
    assert re.findall(r"^localrule (\w+):", log, re.M) == ["all"], "a job ran on the submitting host, not SLURM"
    jobs = {i: j for i, j in _jobs(slurm).items() if i not in before}
    _show(jobs)
    rules = sorted(j["rule"] for j in jobs.values())
    assert rules == sorted(rule for rule, (n, *_) in EXPECTED_REST.items() for _ in range(n)), rules
    for j in jobs.values():
        _, cpus, mem, minutes, partition = EXPECTED_REST[j["rule"]]
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", (j["rule"], j["JobState"], j["ExitCode"])
        got = (int(j["NumCPUs"]), j["MinMemoryNode"], j["TimeLimit"], j["Partition"])
        assert got == (cpus, f"{mem}M", f"00:{minutes:02d}:00", partition), (j["rule"], got)
        assert json.loads(_stored_env(slurm, int(j["JobId"]))["RSTAR2_SANDBOX"])["slots"] == 7, j["rule"]
    for stage in ("rl/stage2", "hard_problems", "rl/stage3", "eval/rl_stage3", "report"):
        assert (wd / "results" / stage / "manifest.json").exists(), stage
    assert (wd / "results/report/summary.md").read_text().count("|") > 20


def test_failed_job_shows_its_own_one_line_error(slurm, tmp_path):
    """Bad input that only the job can see: an rl_data source read through the hub path (a local dataset
    folder here) without the configured split. The workflow stops, and its output carries the job's error."""
    import datasets

    ds = tmp_path / "problems"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"problem": ["1+1?"], "answer": ["2"]})}).save_to_disk(ds)
    bad = {**TEST_CONFIG, "rl_data": {"sources": [
        {"name": "mine", "path": f"hub:{ds}", "split": "test", "fields": {"problem": "problem", "answer": "answer"}}]}}
    wd = _workdir(tmp_path / "wf", bad)
    # one attempt (the profile's retry would fail the same way again, a minute later)
    r = _snakemake(wd, slurm, "results/rl_candidates/manifest.json", extra=("--retries", "0"))
    assert r.returncode != 0
    line = f"rstar2 rl-candidates: error: dataset 'mine' (file hub:{ds}): no split 'test'; splits: ['train']"
    assert line in r.stdout + r.stderr, (r.stdout + r.stderr)[-4000:]


def test_start_without_root_fails_with_one_line(tmp_path):
    """What a machine where SLURM cannot start gets: one line naming what is missing, exit status 1."""
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    if drop and not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to drop root")
    env = {**os.environ, "RSTAR2_SLURM_DIR": str(tmp_path / "slurm")}
    r = subprocess.run([*drop, str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == ["local_slurm: cannot start: needs root (to install packages and start munged, "
                                     "slurmctld and slurmd as root)"], r.stderr
