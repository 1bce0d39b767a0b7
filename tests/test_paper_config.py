"""configs/paper-qwen3-14b.yaml holds the paper's recipe (paper §4.3, §5.1; the released examples/run_qwen3-14b_rstar2_agent_weave.sh); tests/test_cluster.py checks the trainers
built from its rule parameters.

The table below is written from the reference spec, not from the config: every paper number with its
config key path and the section it comes from.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "configs" / "paper-qwen3-14b.yaml"

# (config key path, paper value, source)
PAPER_TABLE = [
    ("model.hub_id", "Qwen/Qwen3-14B-Base", "§5.1"),
    ("sft.epochs", 3, "§5.2 SFT 3 epochs"),
    ("sft.learning_rate", 5e-6, "§5.2 lr 5e-6"),
    ("sft.batch_size", 128, "§5.2 batch size 128"),
    ("sft.warmup_ratio", 0.04, "§5.2 4% warm-up"),
    ("rl.prompts_per_step", 512, "§5.5 512 prompts per step"),
    ("rl.oversample", 2, "§5.5 32 rollouts drawn = 2 x 16"),
    ("rl.group_size", 16, "§5.5 32 -> 16 kept"),
    ("rl.learning_rate", 1e-6, "§5.5 lr 1e-6"),
    ("rl.warmup_steps", 20, "§5.5 linear warm-up 20 rollout steps"),
    ("rl.clip_low", 0.2, "§5.5 clip 0.2"),
    ("rl.clip_high", 0.28, "§5.5 clip-high 0.28"),
    ("rl.temperature", 1.0, "§5.5 temperature 1.0"),
    ("rl.mode", "grpo_roc", "§1 GRPO-RoC"),
    ("rl.tis.enabled", False, "§2.2 the GRPO-RoC loss has no sampler/learner importance correction"),
    ("rl.stages.stage1.max_response_tokens", 8192, "§5.4 stage 1: 8K"),
    ("rl.stages.stage1.max_turns", 10, "§5.4 stage 1: 10 turns"),
    ("rl.stages.stage1.steps", 300, "§5.4 stage 1: 300 steps"),
    ("rl.stages.stage2.max_response_tokens", 12288, "§5.4 stage 2: 12K"),
    ("rl.stages.stage2.max_turns", 10, "§5.4 stage 2: 10 turns"),
    ("rl.stages.stage2.steps", 85, "§5.4 stage 2: 85 steps"),
    ("rl.stages.stage3.max_response_tokens", 12288, "§5.4 stage 3 (hard): 12K"),
    ("rl.stages.stage3.max_turns", 15, "§5.4 stage 3 (hard): 15 turns"),
    ("rl.stages.stage3.steps", 125, "§5.4 stage 3 (hard): 125 steps"),
    ("hard_problems.k", 8, "§5.4 8 rollouts per problem"),
    ("hard_problems.subset_size", 0, "§5.4 over all problems"),
    ("rl_data.max_prompt_tokens", 2048, "§2.1, §5.5 released code drops prompts over 2048 tokens"),
    ("label_verification.enabled", True, "§5.3 step 2 labels verified (OpenMathReasoning)"),
    ("label_verification.model.hub_id", "Qwen/Qwen3-32B", "§5.3 Qwen3-32B verifier"),
    ("label_verification.samples", 16, "§5.3 16 responses"),
    ("label_verification.min_matches", 2, "§5.3 at least twice"),
    ("evaluate.max_response_tokens", 30720, "§6.1 30K tokens (released script: 30720)"),
    ("evaluate.max_turns", 30, "§6.1 30 turns"),
    ("evaluate.temperature", 0.6, "§6.1 temperature 0.6"),
    ("evaluate.k", 16, "§6.1 16 samples, avg@16"),
    ("evaluate.limit", 0, "§6.1 every problem"),
]


def _get(cfg: dict, path: str):
    for key in path.split("."):
        cfg = cfg[key]
    return cfg


@pytest.fixture(scope="module")
def paper():
    return yaml.safe_load(PAPER.read_text())


@pytest.mark.parametrize("path,value,source", PAPER_TABLE, ids=[p for p, _, _ in PAPER_TABLE])
def test_paper_number(paper, path, value, source):
    assert _get(paper, path) == value, f"{path} should be {value!r} ({source})"


def _key_lines(text: str) -> dict[str, str]:
    """Dotted key path -> its line, for block mappings; a flow mapping line counts for the keys inside it."""
    out, stack = {}, []
    for line in text.splitlines():
        body = line.split("#", 1)[0]
        if ":" not in body or not body.strip() or body.strip().startswith("-"):
            continue
        indent = len(line) - len(line.lstrip())
        key = body.strip().split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        path = ".".join(k for _, k in stack)
        out[path] = line
        if "{" in body:  # flow mapping: its keys share the line
            for inner in body.split("{", 1)[1].split(","):
                if ":" in inner:
                    out[f"{path}.{inner.split(':', 1)[0].strip()}"] = line
    return out


def test_every_paper_number_cites_its_section():
    """The line of each table entry in the config, or its section's header line, carries a comment."""
    lines = _key_lines(PAPER.read_text())
    for path, _, _ in PAPER_TABLE:
        assert path in lines, f"{path} not set in {PAPER.name}"
        parents = [".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 1)]
        assert "#" in lines[path] or any("#" in lines[p] for p in parents[-1:]), f"no comment on {path}"


# --- the memory plan at DAG time (rstar2/rl/memory_plan.py via workflow/rules/rl.smk) and the optimizer flags ---

def _dry_run(tmp_path, override: str | None = None):
    import os
    import subprocess
    import sys

    from conftest import copy_workflow

    (tmp_path / "wf").mkdir()
    work = copy_workflow(tmp_path / "wf")  # plans in a scratch copy, never against the repository's results/
    files = [str(PAPER)]
    if override:
        (tmp_path / "override.yaml").write_text(override)
        files.append(str(tmp_path / "override.yaml"))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--configfile", *files], cwd=work,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)


def test_dry_run_prints_the_memory_plan_per_rl_rule_and_carries_the_optimizer(tmp_path):
    r = _dry_run(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for stage in ("rl_stage1", "rl_stage2", "rl_stage3"):
        assert f"memory plan {stage}: Qwen/Qwen3-14B-Base, 14.77B parameters, 8 x 80 GB GPUs, FSDP full shard" in r.stderr
    assert r.stderr.count("(163,840 B/token)") == 3 and r.stderr.count(": fits") == 3
    assert "= 29.5 GB per GPU (float32)" in r.stderr
    # stage 1 leaves its optimizer for stage 2 (paper §4.3); stage 3 starts fresh
    shells = {m: line for line in r.stdout.splitlines() for m in ("stage1", "stage2", "stage3")
              if line.startswith("Shell command: accelerate") and f"--out results/rl/{m} " in line}
    assert '"save_optimizer": true' in shells["stage1"] and '"continue_optimizer": false' in shells["stage1"]
    assert '"continue_optimizer": true' in shells["stage2"] and "--optimizer-from results/rl/stage1/optimizer" in shells["stage2"]
    assert '"continue_optimizer": false' in shells["stage3"] and "--optimizer-from" not in shells["stage3"]
    assert '"save_optimizer": false' in shells["stage2"]


def test_dry_run_on_141_gb_gpus_fits_too(tmp_path):
    r = _dry_run(tmp_path, "distributed: {gpu_memory_gb: 141}\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("of 141 GB: fits") == 3


@pytest.mark.parametrize("override,message", [
    ("distributed: {vllm: {gpu_memory_utilization: 0.35}}\n",
     "rl_stage1: distributed.vllm.gpu_memory_utilization: 0.35 gives vLLM 28.0 GB of a 80 GB GPU"),
    ("rl: {micro_batch_tokens: {cuda: 200000}}\n", "rl_stage1: rl.micro_batch_tokens.cuda: 200000 (with gradient "
                                                    "checkpointing) needs"),
])
def test_a_config_that_cannot_fit_fails_before_any_job(tmp_path, override, message):
    r = _dry_run(tmp_path, override)
    out = r.stdout + r.stderr   # snakemake prints the parse error on stdout, the plan goes to stderr
    assert r.returncode != 0
    assert "config: the RL memory plan does not fit" in out and message in out, out[-3000:]
    assert "Job stats" not in out   # nothing was scheduled
