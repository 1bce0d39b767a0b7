"""DAG-time refusals of what a GPU cluster would reject later (rstar2/rl/dag_checks.py), each one a config overlay
on the paper config (configs/paper-qwen3-14b.yaml): one line naming the setting and the limit."""

from __future__ import annotations

import json

import pytest

from rstar2.rl.dag_checks import context_window, refusals
from test_throughput import paper_config

STAGES = ["stage1", "stage2", "stage3"]
GPUS = {"rl": 8, "sft": 8, "generate": 8}


def _refusals(overlay: str, gpus: dict = GPUS) -> list[str]:
    return refusals(paper_config(overlay), STAGES, gpus, "/nonexistent")


def test_the_paper_config_passes():
    assert _refusals("") == []
    assert _refusals("distributed: {gpu: mi300x}\n", {"rl": 64, "sft": 8, "generate": 8}) == []


@pytest.mark.parametrize("overlay,line", [
    ("rl: {stages: {stage2: {max_response_tokens: 31000}}}\n",
     "rl.stages.stage2.max_response_tokens: 31000 + 2048 prompt tokens = 33048 exceeds the context window of 32768 "
     "tokens (max_position_embeddings, Qwen/Qwen3-14B-Base's config.json): lower it to at most 30720"),
    ("hard_problems: {max_response_tokens: 32000}\n",
     "hard_problems.max_response_tokens: 32000 + 2048 prompt tokens = 34048 exceeds the context window of 32768"),
    ("evaluate: {max_response_tokens: 32000}\n",
     "evaluate.max_response_tokens: 32000 + 1024 prompt tokens = 33024 exceeds the context window of 32768"),
    ("sft: {max_length: 40000}\n", "sft.max_length: 40000 exceeds the context window of 32768 tokens"),
    ("distributed: {vllm: {max_model_length: 40960}}\n",
     "distributed.vllm.max_model_length: 40960 exceeds the context window of 32768 tokens"),
    ("distributed: {vllm: {max_model_length: 12000}}\n",
     "distributed.vllm.max_model_length: 12000 is less than the longest RL rollout (14336 prompt + response tokens)"),
])
def test_a_budget_beyond_the_context_window_is_refused(overlay, line):
    found = _refusals(overlay)
    assert any(f.startswith(line) for f in found), found


def test_batch_shapes_that_do_not_split_are_refused():
    (line,) = _refusals("", {"rl": 48, "sft": 8, "generate": 8})
    assert line == ("rl.prompts_per_step: 512 does not split into whole groups over the 48 training processes "
                    "(distributed.resources.rl gpu x nodes): use a multiple of 48")
    (line,) = _refusals("sft: {batch_size: 120}\n")
    assert line.startswith("sft.batch_size: 120 is not a multiple of sft.grad_accum (2) x the 8 training processes")


def test_generation_budgets_whose_kv_cache_does_not_fit_vllm_are_refused():
    """Label verification with Qwen3-32B (65.6 GB of bf16 weights) on an A100 80GB: vLLM's 0.9 x 80 GB leaves
    72 - 65.5 - 2 = 4.5 GB = 17,073 tokens of KV cache (262,144 B/token), so a 30K budget cannot hold one sequence; on MI300X it can."""
    over = "label_verification: {max_response_tokens: 30000}\n"
    (line,) = _refusals(over + "distributed: {gpu: a100-80gb}\n")
    assert line.startswith("label_verification.max_response_tokens: 30000 + 2048 prompt tokens = 32048: the KV cache "
                           "of one sequence needs 8.4 GB, vLLM's 0.9 x 80 GB leaves room for 17073 tokens")
    assert "next to the bf16 weights of Qwen/Qwen3-32B: lower it to at most" in line
    most = int(line.split("lower it to at most ")[1].split(",")[0])
    assert _refusals(f"label_verification: {{max_response_tokens: {most}}}\ndistributed: {{gpu: a100-80gb}}\n") == []
    assert _refusals(over + "distributed: {gpu: mi300x}\n") == []
    # evaluation of the 14B policy at 30K fits an 80 GB GPU, but not a 40 GB one
    (line,) = _refusals("distributed: {gpu_memory_gb: 40}\n" + "rl: {stages: {stage1: {max_response_tokens: 512}, "
                        "stage2: {max_response_tokens: 512}, stage3: {max_response_tokens: 512}}}\n"
                        "hard_problems: {max_response_tokens: 512}\nlabel_verification: {enabled: false}\n")
    assert line.startswith("evaluate.max_response_tokens: 30720 + 1024 prompt tokens = 31744: the KV cache")


def test_the_context_window_comes_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "hidden_size": 8,
                                                       "intermediate_size": 16, "num_hidden_layers": 1,
                                                       "num_attention_heads": 2, "vocab_size": 10}))
    assert context_window({"source": "local", "path": str(tmp_path)}, "/nonexistent") == (4096, f"{tmp_path}/config.json")
    assert context_window({"source": "hub", "hub_id": "org/unknown"}, "/nonexistent") == (None, "")
