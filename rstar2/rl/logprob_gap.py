"""The sampler/learner log-probability mismatch of one RL step: how far the rollout engine's sampling
log-probabilities (``Trajectory.response_logprobs``) are from the trainer's own log-probabilities of the same
tokens, over the loss tokens (response_mask 1). slime logs the mean as ``train_rollout_logprob_abs_diff``; a large
gap means the rollouts were sampled from another policy than the one trained (stale weights, bf16 vs fp32
kernels), which the paper's GRPO-RoC loss does not correct for.

Both sides must be log-probabilities of the same distribution: the engines report the processed distribution
(after temperature), and TRL's per-token log-probabilities divide the logits by ``GRPOConfig.temperature``, so the
two temperatures must be equal (the RL stage sets both from ``rollout.temperature``)."""

from __future__ import annotations

import torch


def sampler_logps(trajs: list, width: int) -> torch.Tensor | None:
    """(B, width) float32: each trajectory's ``response_logprobs``, right-padded with 0; None when any trajectory
    has none (an engine that reports no log-probabilities: the step has no mismatch figure)."""
    if not trajs or any(t.response_logprobs is None or len(t.response_logprobs) != len(t.response_ids)
                        for t in trajs):
        return None
    out = torch.zeros((len(trajs), width), dtype=torch.float32)
    for b, t in enumerate(trajs):
        if t.response_logprobs:
            out[b, :len(t.response_logprobs)] = torch.tensor(t.response_logprobs, dtype=torch.float32)
    return out


class LogprobGap:
    """Accumulates |log p_sampler - log p_learner| over the loss tokens of one step's micro-batches."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.total, self.count, self.max, self.missing = 0.0, 0, 0.0, False

    def add(self, learner: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor) -> None:
        """learner, sampler: (B, C) log-probabilities (natural log) of the completion tokens; mask: (B, C), 1 on
        loss tokens. sampler None: this micro-batch's rollouts carry no log-probabilities."""
        if sampler is None:
            self.missing = True
            return
        keep = mask.bool()
        diff = (learner.detach().float() - sampler.to(learner.device).float()).abs()[keep]
        if diff.numel():
            self.total += float(diff.sum())
            self.count += int(diff.numel())
            self.max = max(self.max, float(diff.max()))

    def row(self, gather=None) -> dict:
        """``{"train_rollout_logprob_abs_diff": mean, "train_rollout_logprob_abs_diff_max": max}`` over every
        process (``gather``: a function of a 1-D float tensor returning the concatenation over processes; None =
        one process); both None when no loss token had a sampler log-probability or any micro-batch had none."""
        stats = torch.tensor([self.total, float(self.count), self.max, float(self.missing)], dtype=torch.float64)
        if gather is not None:
            stats = gather(stats).reshape(-1, 4)
            stats = torch.stack([stats[:, 0].sum(), stats[:, 1].sum(), stats[:, 2].max(), stats[:, 3].max()])
        total, count, top, missing = stats.tolist()
        if missing or count == 0:
            return {"train_rollout_logprob_abs_diff": None, "train_rollout_logprob_abs_diff_max": None}
        return {"train_rollout_logprob_abs_diff": total / count, "train_rollout_logprob_abs_diff_max": top}
