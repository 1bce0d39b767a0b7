"""The tiny DAG on real vLLM (its CPU build, requirements-vllm.txt): configs/tiny-vllm.yaml over tiny.yaml puts the
three RL stages in TRL's colocate mode (``StepVLLMEngine`` on TRL's ``vllm.LLM``, weights reloaded each step),
hard-problem mining and evaluation on an in-process ``AsyncLLM`` (``rollout.engine: vllm``). The run starts from the
session's upstream stages (conftest ``tiny_upstream``; the overlay changes no upstream stage's params, so none reruns:
asserted) and completes; then rl_stage1 runs again in a copy of that workflow folder with the same seed, and
``rstar2 compare-runs`` finds no difference in its folder, while within each group the samples differ
(per-trajectory seeds, rstar2/rollout/vllm_reproducible.py; one seed per group would give G equal samples).

tiny.yaml's reward is one a random model earns part of, so every RL step updates the weights and the next step's
rollouts come from vLLM after a weight sync: the same-seed rerun compares updated weights generated through those
syncs. The sampler/learner gap after an update is tests/test_vllm_rl.py's. Runs in scratch copies of the workflow;
no network, no model hub."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT, copy_run
from test_workflow import ENV, planned_jobs, smk
from vllm_cpu import ENV as VLLM_CPU_ENV

from rstar2.io import read_jsonl

pytest.importorskip("vllm")

CONFIGS = ("configs/tiny.yaml", "configs/tiny-vllm.yaml")
RL = ("rl/stage1", "rl/stage2", "rl/stage3")
EVALUATED = ("rl_stage3",)   # configs/tiny-vllm.yaml
# the vLLM tests' environment; an AsyncLLM's engine core also runs the model (no worker process), as in the server test
DAG_ENV = {**VLLM_CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_per_trajectory_seeds_reach_the_colocated_engine(qwen_tokenizer):
    """The RL path (``RolloutFunc`` -> ``run_rollouts(seed=...)``): the engine on TRL's colocated LLM
    (``StepVLLMEngine``, built without a seed) samples each trajectory turn with its own ``SamplingParams.seed``
    (``vllm_reproducible.turn_seed`` of the phase's seed, the key, the context length), different within a group,
    and is unseeded again after the phase. (TRL's LLM has one global seed, 0, so the same-seed DAG rerun below
    would match without these; this is what makes a trajectory's tokens independent of its batch.)"""
    from types import SimpleNamespace

    from test_rollout_vllm import CLASSES, FakeLLMEngine

    from rstar2.rollout import RolloutConfig, StepVLLMEngine, run_rollouts
    from rstar2.rollout.vllm_reproducible import turn_seed

    tok, seen = qwen_tokenizer, []

    class Recording(FakeLLMEngine):
        def add_request(self, request_id, prompt, params, **kw):
            seen.append((request_id, len(prompt["prompt_token_ids"]), params.seed))
            super().add_request(request_id, prompt, params, **kw)

    eng = StepVLLMEngine(SimpleNamespace(llm_engine=Recording(lambda ids: [tok.eos_token_id])), [tok.eos_token_id],
                         1.0, 1.0, classes=CLASSES)
    group = [{"id": "p0", "problem": "What is 6 times 7?", "answer": "42"}] * 2
    trajs = run_rollouts(None, tok, group, RolloutConfig(max_response_tokens=8, reproducible=True), engines=[eng],
                         tools=SimpleNamespace(), reward_fn=lambda text, gold: {"pred": None, "reward": 0.0}, seed=7)
    want = {t.key: turn_seed(7, t.key, len(t.prompt_ids)) for t in trajs}
    assert len(seen) == 2 and {rid.rsplit("/", 1)[0]: seed for rid, _, seed in seen} == want
    assert len(set(want.values())) == 2 and None not in want.values() and eng.seed is None


def test_the_overlay_gives_the_jobs_the_vllm_cpu_tests_environment():
    overlay = yaml.safe_load((REPO_ROOT / "configs/tiny-vllm.yaml").read_text())
    assert overlay["distributed"]["vllm"]["env"] == DAG_ENV and overlay["rollout"] == {"engine": "vllm"}


def test_enforce_eager_reaches_the_llm_trl_colocates():
    """TRL builds its colocated ``vllm.LLM`` without ``enforce_eager``: the RL stage hands it in while the trainer is
    built (rstar2.rollout.vllm_settings.colocated_llm_args), and only with the switch set."""
    from trl.generation import vllm_generation

    from rstar2.rollout.vllm_settings import colocated_llm_args

    # TRL still builds it through the module's global LLM, which is what the patch replaces
    assert "LLM" in vllm_generation.VLLMGeneration._init_vllm.__code__.co_names
    built = vllm_generation.LLM
    with colocated_llm_args({"enforce_eager": True, "env": {}}):
        assert vllm_generation.LLM.func is built and vllm_generation.LLM.keywords == {"enforce_eager": True}
    assert vllm_generation.LLM is built
    for off in (None, {"enforce_eager": False}):
        with colocated_llm_args(off):
            assert vllm_generation.LLM is built
    with pytest.raises(RuntimeError), colocated_llm_args({"enforce_eager": True}):
        raise RuntimeError("the trainer failed to build")
    assert vllm_generation.LLM is built


@pytest.fixture(scope="module")
def run(tiny_upstream, tmp_path_factory):
    workdir = copy_run(tiny_upstream, tmp_path_factory.mktemp("vllm_dag") / "a")
    # vLLM settings are the RL stages', evaluation's and mining's: SFT and curation stay as they were
    planned = planned_jobs(workdir, *CONFIGS)
    assert planned and not {"base_model", "sft_data", "sft", "rl_candidates", "rl_data"} & set(planned), planned
    smk(workdir, "--cores", "2", "--configfile", *CONFIGS, timeout=1800)
    return workdir


@pytest.mark.slow
def test_tiny_dag_completes_with_rollout_engine_vllm(run):
    results = run / "results"
    for stage in ("base_model", "sft_data", "sft", "rl_candidates", "rl_data", *RL, "hard_problems", "report"):
        assert (results / stage / "manifest.json").exists(), stage
    generated = [*RL, "hard_problems", *(f"eval/{m}" for m in EVALUATED)]
    for stage in generated:
        params = json.loads((results / stage / "manifest.json").read_text())["params"]
        assert params["rollout"]["engine"] == "vllm", stage
        assert params["rollout"]["vllm"]["env"] == DAG_ENV, stage
    steps = yaml.safe_load((REPO_ROOT / CONFIGS[0]).read_text())["rl"]["stages"]
    for stage in RL:   # each step's rollouts came from TRL's colocated LLM, synced first; every step updated
        log = (run / "logs" / f"{stage}.log").read_text()
        rows = read_jsonl(results / stage / "metrics.jsonl")
        assert len(rows) == steps[stage.split("/")[1]]["steps"], stage
        assert all(not r["update_skipped"] for r in rows), (stage, rows)
        for step in range(len(rows)):
            assert f"[rl] vLLM weights synced at step {step}" in log, (stage, step)
        # TRL's engine was built eager (the overlay's enforce_eager), as the engine's own config says
        assert log.count("[vllm] colocated engine: enforce_eager=True") == 1, stage
    # evaluation set the overlay's environment before its AsyncLLM started (the stage's own line: vLLM's INFO log
    # is hidden where an earlier test's TRL import left VLLM_LOGGING_LEVEL=ERROR in the environment)
    log = (run / "logs/evaluate_rl_stage3.log").read_text()
    env_line = [ln for ln in log.splitlines() if ln.startswith("[vllm] environment: ")]
    assert env_line and "VLLM_CPU_OMP_THREADS_BIND='nobind'" in env_line[0], env_line
    assert "Traceback" not in log, log[-3000:]   # its AsyncLLM was shut down once, not again at exit
    # a random model's evaluation: every benchmark was rolled out and graded on vLLM
    evaluated = json.loads((results / "eval/rl_stage3/summary.json").read_text())["benchmarks"]
    assert evaluated["bfcl"]["n_problems"] == 5 and evaluated["ifeval"]["n_problems"] == 1
    assert (results / "report/summary.md").read_text().count("|") > 20
    dry = smk(run, "-n", "--configfile", *CONFIGS)
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.slow
def test_same_seed_rl_stage_on_vllm_is_identical_and_a_groups_samples_differ(run, tmp_path_factory):
    again = tmp_path_factory.mktemp("vllm_dag_again") / "b"
    shutil.copytree(run, again, symlinks=True)   # copy2 keeps mtimes: only the deleted stage is out of date
    shutil.rmtree(again / "results/rl/stage1")
    smk(again, "results/rl/stage1/manifest.json", "--cores", "2", "--configfile", *CONFIGS, timeout=900)
    a, b = run / "results/rl/stage1", again / "results/rl/stage1"
    proc = subprocess.run([sys.executable, "-m", "rstar2.cli", "compare-runs", str(a), str(b)], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[compare-runs] identical" in proc.stdout, proc.stdout + proc.stderr
    for name in ("rollouts.jsonl", "metrics.jsonl", "model/model.safetensors", "manifest.json"):
        assert (b / name).exists(), name   # what was compared is there
    # a group's samples differ: one seed per group would give G equal samples. Turns that end at their first token
    # (tiny.yaml's stop_early model: about one in ten) are equal whatever the seeds, so the sampled text is compared
    groups: dict = {}
    for row in read_jsonl(b / "rollouts.jsonl"):
        text = "".join(t["text"] for t in row["turns"])
        if text.strip():
            groups.setdefault((row["step"], row["group"]), []).append(text)
    assert any(len(g) >= 2 for g in groups.values()), groups   # something to compare
    assert all(len(set(g)) == len(g) for g in groups.values()), groups
