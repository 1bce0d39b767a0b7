"""GRPO / GRPO-RoC through TRL's GRPOTrainer with our rollout layer (paper §2.2; spec §1; frameworks.md §1).

TRL does the optimisation; generation, tool execution, grading and RoC selection happen in our
``rollout_func``: for each prompt TRL hands us (repeated G times), we roll out ``oversample * G``
trajectories, grade them, keep G with RoC, and return their token ids with ``env_mask`` = 0 on
tool-response tokens. Only the kept G ever reach TRL's forward/backward pass.

Loss settings (spec §1.7): beta 0 (no KL, no reference model), clip 0.2 / 0.28, ``loss_type="dapo"``
(token-level mean over the group), advantages (r - mean) / (std + eps) per group (TRL ``scale_rewards="group"``).
Truncated trajectories stay in as negatives (no overlong filtering, spec §1.8).
"""

from __future__ import annotations

import os
import random
import statistics
import time

from .. import rollout as rollout_lib
from ..io import append_jsonl
from . import roc


def trajectory_penalty(t: rollout_lib.Trajectory) -> float:
    """p_total = p_err + p_format for one trajectory (Eqs. 4-5)."""
    return roc.tool_error_penalty([c["status"] for c in t.tool_calls]) + roc.format_penalty(
        [turn["text"] for turn in t.turns])


def error_ratio(calls: list[dict]) -> float | None:
    """Share of tool calls whose structured status is an error; None (undefined, not 0) without calls."""
    return sum(c["status"] in roc.ERROR_STATUSES for c in calls) / len(calls) if calls else None


def step_metrics(groups: list[list[rollout_lib.Trajectory]], kept: list[list[int]]) -> dict:
    """Per-step rollout metrics over all 2G rollouts of every group and the kept subset."""
    flat = [t for g in groups for t in g]
    rewards = [t.reward for t in flat]
    calls = [c for t in flat for c in t.tool_calls]
    pos = [t for t in flat if t.reward > 0]
    pos_calls = [c for t in pos for c in t.tool_calls]
    kept_flat = [g[i] for g, idx in zip(groups, kept) for i in idx]
    lengths = [len(t.response_ids) for t in flat]
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "accuracy": sum(r > 0 for r in rewards) / max(len(rewards), 1),
        "response_length_mean": statistics.fmean(lengths) if lengths else 0.0,
        "response_length_max": max(lengths, default=0),
        "tool_calls_per_traj": len(calls) / max(len(flat), 1),
        "tool_error_ratio": error_ratio(calls),
        "tool_error_ratio_pos": error_ratio(pos_calls),
        "format_penalty_mean": statistics.fmean(roc.format_penalty([x["text"] for x in t.turns]) for t in flat)
        if flat else 0.0,
        "truncation_ratio": sum(t.truncated for t in flat) / max(len(flat), 1),
        "all_correct_frac": sum(all(t.reward > 0 for t in g) for g in groups) / max(len(groups), 1),
        "all_wrong_frac": sum(all(t.reward <= 0 for t in g) for g in groups) / max(len(groups), 1),
        "kept_pos": sum(t.reward > 0 for t in kept_flat),
        "kept_neg": sum(t.reward <= 0 for t in kept_flat),
    }


class RolloutFunc:
    """The ``rollout_func`` handed to GRPOTrainer; also collects per-step metrics and rollout records.

    Args:
        answers: problem text -> {"id", "answer"} (TRL only passes prompt texts to rollout_func).
        group_size: G, rollouts kept per prompt. oversample: rollouts drawn per kept rollout (2 in the paper).
        mode: "grpo_roc" (draw oversample*G, keep G with RoC) or "grpo" (draw G, keep all).
    """

    def __init__(self, answers: dict, rcfg: rollout_lib.RolloutConfig, group_size: int, oversample: int,
                 mode: str, positive_selection: str, seed: int, out_dir: str):
        if mode not in ("grpo", "grpo_roc"):
            raise ValueError(f"rl.mode must be 'grpo' or 'grpo_roc', got {mode!r}")
        self.answers, self.rcfg, self.G = answers, rcfg, group_size
        self.n_draw = group_size * oversample if mode == "grpo_roc" else group_size
        self.mode, self.positive_selection = mode, positive_selection
        self.rng = random.Random(seed)
        self.out_dir = out_dir
        self.pending: dict | None = None
        self.step = 0

    def __call__(self, prompts: list, trainer) -> dict:
        t0 = time.time()
        self.step += 1
        model = trainer.accelerator.unwrap_model(trainer.model)
        tok = trainer.processing_class
        uniq = [prompts[i] for i in range(0, len(prompts), self.G)]
        problems = []
        for q in uniq:
            meta = self.answers[q]
            problems += [{"id": meta["id"], "problem": q, "answer": meta["answer"]}] * self.n_draw
        trajs = rollout_lib.run_rollouts(model, tok, problems, self.rcfg,
                                         progress=rollout_lib.Progress(f"rollout step {self.step}"))
        model.train()
        groups = [trajs[i:i + self.n_draw] for i in range(0, len(trajs), self.n_draw)]
        kept = []
        for g in groups:
            penalties = [trajectory_penalty(t) for t in g]  # once per rollout: selection and records share it
            if self.mode == "grpo":
                idx = list(range(len(g)))
            else:
                idx = roc.select_group([t.reward for t in g], penalties, self.G, self.rng, self.positive_selection)
            kept.append(idx)
            for i, (t, pen) in enumerate(zip(g, penalties)):
                append_jsonl(os.path.join(self.out_dir, "rollouts.jsonl"),
                             {"step": self.step, "kept": i in idx, "penalty": pen, **t.record()})
        sel = [g[i] for g, idx in zip(groups, kept) for i in idx]
        self.pending = {**step_metrics(groups, kept), "rollout_time_s": round(time.time() - t0, 2)}
        return {
            "prompt_ids": [t.prompt_ids for t in sel],
            "completion_ids": [t.response_ids for t in sel],
            "logprobs": None,
            "env_mask": [t.response_mask for t in sel],
            "rollout_reward": [t.reward for t in sel],
        }


def rollout_reward(completions, rollout_reward, **kwargs):
    """Reward function for TRL: the binary answer reward already computed in the rollout layer (Eq. 3)."""
    return [float(r) for r in rollout_reward]


def make_metrics_callback(rollout_fn: RolloutFunc, path: str):
    """A TrainerCallback that writes one metrics.jsonl row per optimizer step (rollout metrics + loss)."""
    from transformers import TrainerCallback

    class _MetricsCallback(TrainerCallback):
        def __init__(self):
            self.t0 = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or rollout_fn.pending is None:
                return
            row = {"step": state.global_step, **rollout_fn.pending, "loss": logs["loss"],
                   "grad_norm": logs.get("grad_norm"), "learning_rate": logs.get("learning_rate"),
                   "step_time_s": round(time.time() - self.t0, 2)}
            self.t0 = time.time()
            rollout_fn.pending = None
            append_jsonl(path, row)
            print(f"\n[rl] step {row['step']}: reward {row['reward_mean']:.3f} tool calls/traj "
                  f"{row['tool_calls_per_traj']:.2f} length {row['response_length_mean']:.0f} "
                  f"loss {row['loss']:.4f} ({row['step_time_s']}s)", flush=True)

    return _MetricsCallback()
