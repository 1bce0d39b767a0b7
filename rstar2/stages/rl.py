"""RL stage entry point (rl_stage1/2/3): start from the previous stage's model, train, save (paper §4.3, Table 2)."""

from __future__ import annotations

import os
import random
import shutil
import time
import zlib
from pathlib import Path

from ..io import read_jsonl, write_manifest
from ..rollout import RolloutConfig


def rollout_config(p: dict) -> RolloutConfig:
    """Build a RolloutConfig from a stage's ``rollout`` + ``tool`` params (unknown keys are a config error)."""
    tool = p.get("tool", {})
    return RolloutConfig(**p["rollout"], tool_name=tool.get("name", RolloutConfig.tool_name),
                         tool_max_chars=tool.get("max_output_chars", RolloutConfig.tool_max_chars),
                         tool_timeout_s=tool.get("timeout_s", RolloutConfig.tool_timeout_s),
                         tool_memory_mb=tool.get("memory_mb", RolloutConfig.tool_memory_mb))


def run(params: dict, model_dir: str, data_path: str, out_dir: str) -> None:
    """Train one RL stage with TRL's GRPOTrainer and our rollout layer.

    Args:
        params: the stage's resolved config: steps, prompts_per_step, group_size, oversample, mode,
            positive_selection, learning_rate, warmup_steps, clip_low, clip_high, rollout{...}, tool{...}, seed.
        model_dir: folder of the starting model (previous stage's ``model/``).
        data_path: JSON Lines with ``id``, ``problem``, ``answer`` (rl_data's train.jsonl or hard_problems' hard.jsonl).
        out_dir: ``results/rl/stageN``; writes ``model/``, ``metrics.jsonl``, ``rollouts.jsonl``, then ``manifest.json``.
    Raises:
        ValueError: the training set is empty (e.g. hard-problem mining kept nothing).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from .. import models
    from ..rl.trainer import RolloutFunc, make_metrics_callback, rollout_reward

    t0 = time.time()
    out = Path(out_dir)
    for stale in ("metrics.jsonl", "rollouts.jsonl"):  # a rerun starts the stage's logs afresh
        (out / stale).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no training problems; nothing to train on")
    # Each stage draws its own prompt order: with one seed for all, stage 2 would replay stage 1's prompts.
    seed = params["seed"] + zlib.crc32(params.get("name", "rl").encode()) % 10_000
    random.Random(seed).shuffle(rows)
    answers = {r["problem"]: {"id": r["id"], "answer": r["answer"]} for r in rows}
    dataset = Dataset.from_list([{"prompt": q} for q in answers])

    model, tok = models.load(model_dir)
    G = params["group_size"]
    args = GRPOConfig(
        output_dir=str(out / "trainer_scratch"), use_cpu=True, bf16=False, seed=seed,
        per_device_train_batch_size=params["prompts_per_step"] * G, gradient_accumulation_steps=1,
        num_generations=G, max_steps=params["steps"], learning_rate=params["learning_rate"],
        lr_scheduler_type="constant_with_warmup", warmup_steps=params.get("warmup_steps", 0),
        beta=0.0, epsilon=params["clip_low"], epsilon_high=params["clip_high"], loss_type="dapo",
        scale_rewards="group", num_iterations=1, max_completion_length=params["rollout"]["max_response_tokens"],
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=False, remove_unused_columns=False,
        weight_decay=0.01, max_grad_norm=1.0,
    )
    rollout_fn = RolloutFunc(answers, rollout_config(params), G, params.get("oversample", 2), params["mode"],
                             params.get("positive_selection", "inverse_prob"), seed, str(out))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(model=model, reward_funcs=[rollout_reward], args=args, train_dataset=dataset,
                          processing_class=tok, rollout_func=rollout_fn,
                          callbacks=[make_metrics_callback(rollout_fn, str(out / "metrics.jsonl"))])
    trainer.train()
    trainer.model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    shutil.rmtree(out / "trainer_scratch", ignore_errors=True)
    metrics = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    write_manifest(out, stage=params.get("name", "rl"), params=params, inputs=[model_dir, data_path],
                   counts={"steps": len(metrics), "train_problems": len(rows),
                           "rollouts": sum(1 for _ in open(out / "rollouts.jsonl")) if (out / "rollouts.jsonl").exists() else 0},
                   started=t0)
