"""Do the same-seed and resume comparisons fail when what they guard is broken? On the tiny workflow's stage 1
(configs/tiny.yaml: RL updates every step): the stage run uninterrupted (a), SIGKILLed after its checkpoint-1 and
rerun (b), and run again with the same seed (c); ``rstar2.reproduce.compare_runs`` (what tests/test_workflow.py and
tests/test_slurm_live.py use) between a and b, and a and c.

    python benchmarks/break_demo.py REPO WF OUT

REPO: a copy of this repository, with a bug put in on purpose or not (its ``rstar2`` is the one the stage
processes import: they start in REPO); WF: a finished tiny workflow folder (its sft model, rl_data and stage-1
params); OUT: a new folder. Output kept in docs/measurements/tests/break_demo.txt, with the two bugs used."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

repo, wf, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
params = json.loads((wf / "results/rl/stage1/manifest.json").read_text())["params"]
params["steps"] = 3
env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(repo)}

def cmd(dest):
    return [sys.executable, "-m", "rstar2.cli", "rl", "--params", json.dumps(params), "--model",
            str(wf / "results/sft/model"), "--data", str(wf / "results/rl_data/train.jsonl"), "--out", str(dest)]

def run(dest, kill_after=None):
    p = subprocess.Popen(cmd(dest), cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    if kill_after:
        ck = dest.parent / "checkpoints" / dest.name / "checkpoint-1" / "rstar2_state.json"
        while not ck.exists():
            assert p.poll() is None, "ended before checkpoint-1"
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return run(dest)
    assert p.wait() == 0, dest

import shutil
print("stage code:", subprocess.run([sys.executable, "-c", "import rstar2.stages.rl as r; print(r.__file__)"], cwd=repo,
                                    env=env, capture_output=True, text=True).stdout.strip())
sys.path.insert(0, str(repo))
from rstar2.reproduce import compare_runs
t = time.time()
run(out / "a" / "rl" / "stage1")
run(out / "b" / "rl" / "stage1", kill_after=1)
run(out / "c" / "rl" / "stage1")
for x in "abc":
    shutil.rmtree(out / x / "rl" / "finished", ignore_errors=True)   # hard links kept until Snakemake records a job
m = [json.loads(l) for l in (out / "a/rl/stage1/metrics.jsonl").read_text().splitlines()]
print("updates:", [(r["step"], r["update_skipped"], r["kept_total"], r.get("loss")) for r in m])
print("resumed_from_step:", json.loads((out / "b/rl/stage1/manifest.json").read_text())["counts"].get("resumed_from_step"))
print("uninterrupted vs killed+resumed:", [str(d) for d in compare_runs(out / "a", out / "b")] or "identical")
print("same seed twice:", [str(d) for d in compare_runs(out / "a", out / "c")] or "identical")
print(f"{time.time() - t:.0f} s")
