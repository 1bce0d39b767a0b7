"""Truncated importance sampling (TIS) of the sampler/learner mismatch: an optional correction, off by default and
in the paper's config (rStar2-Agent's GRPO-RoC loss, paper §2.2, has none); ``rl.tis.enabled`` / ``rl.tis.cap``.

Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS): the rollout
engine (vLLM, other kernels, bf16) samples token y_t from pi_sampler, not from the learner pi_old whose weights it
holds, so the policy gradient is off-policy by pi_old / pi_sampler; TIS weights each token's policy-gradient term by

    w_t = min(exp(logp_old(y_t) - logp_sampler(y_t)), C)

with a cap C bounding the variance. TRL 1.16 has the same correction (``vllm_importance_sampling_correction=True``
with ``vllm_importance_sampling_mode="token_truncate"``, trl/trainer/grpo_trainer.py: ``_generate_and_score_completions``
computes the ratio from an extra no-grad forward pass, ``_compute_loss`` multiplies ``per_token_loss`` by it), but
only under ``self.use_vllm`` and fed by its own generation path, which ``RoCGRPOTrainer`` replaces: it never applies
with the hf engine and never sees our engines' log-probabilities. So it is done here, in the same loss:

- logp_sampler: ``Trajectory.response_logprobs`` (the engines' log-probabilities of the distribution they sampled
  from, after temperature; ``batch.build_batch`` puts them in the micro-batch as ``rollout_logps``).
- logp_old: the loss's own forward pass, detached. One update per RL step (num_iterations 1, every micro-batch before
  the one optimizer step), so these are the log-probabilities under the weights that sampled: TRL's extra forward
  pass would give the same numbers.
- the weight multiplies each loss token's advantage (``weighted_advantages``): for w > 0,
  -min(r A w, clip(r) A w) = w * -min(r A, clip(r) A), i.e. exactly TRL's ``per_token_loss * importance_sampling_ratio``
  for the dapo loss (and its clip metrics, which read only the advantage's sign, are unchanged).

A trajectory without sampler log-probabilities (an engine that reports none) keeps weight 1 and is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # torch is imported where it is used: the workflow parses TISConfig without it (stages/params.py)
    import torch


@dataclass(frozen=True)
class TISConfig:
    """``rl.tis``: enabled (weight the loss, see the module docstring); cap: C, the largest weight (> 0)."""
    enabled: bool
    cap: float


def tis_weights(learner_old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, int, int]:
    """Per-token TIS weights min(exp(learner_old - sampler), cap) (Yao et al. 2025; TRL's "token_truncate").

    learner_old, sampler: (B, C) natural-log probabilities of the completion tokens; mask: (B, C), 1 on loss tokens.
    Returns (weights (B, C) float32 on learner_old's device, 1 off the loss tokens; clipped: loss tokens whose
    ratio exceeded cap; count: loss tokens). Raises ValueError for cap <= 0.
    """
    import torch

    if not cap > 0:
        raise ValueError(f"rl.tis.cap must be > 0, got {cap!r}")
    keep = mask.to(learner_old.device).bool()
    ratio = torch.exp(learner_old.detach().float() - sampler.to(learner_old.device).float())
    w = torch.where(keep, ratio.clamp(max=cap), torch.ones_like(ratio))
    return w, int((keep & (ratio > cap)).sum()), int(keep.sum())


def weighted_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages (B, C) = advantages (B,) or (B, C) times weights (B, C), which TRL's ``_compute_loss``
    takes as they are (it broadcasts only a (B,) tensor)."""
    a = advantages if advantages.dim() == 2 else advantages[:, None]
    return a * weights.to(a.dtype)


class TISStats:
    """One step's TIS figures over its micro-batches (and processes): ``tis_enabled`` and ``tis_clipped_share``."""

    def __init__(self, config: TISConfig | None):
        self.config = config
        self.reset()

    @property
    def enabled(self) -> bool:
        return bool(self.config and self.config.enabled)

    def reset(self) -> None:
        self.clipped, self.count, self.uncorrected = 0, 0, 0

    def apply(self, inputs: dict, learner: torch.Tensor) -> None:
        """Weight ``inputs["advantages"]`` of one micro-batch in place (``learner``: (B, C), the loss's forward
        pass); its ``rollout_logps`` (B, C) are the sampler's, absent when an engine reported none. No-op when off."""
        if not self.enabled:
            return
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        sampler = inputs.get("rollout_logps")
        if sampler is None:
            self.uncorrected += int(mask.sum())
            return
        w, clipped, count = tis_weights(learner, sampler, mask, self.config.cap)
        inputs["advantages"] = weighted_advantages(inputs["advantages"], w)
        self.clipped, self.count = self.clipped + clipped, self.count + count

    def row(self, gather=None) -> dict:
        """``tis_enabled``; ``tis_clipped_share``: clipped / corrected loss tokens over every process (None when off
        or none corrected); ``tis_uncorrected_tokens``: loss tokens left at weight 1 for want of sampler log-probs
        (None when off). ``gather``: a function of a 1-D float tensor returning the concatenation over processes."""
        if not self.enabled:
            return {"tis_enabled": False, "tis_clipped_share": None, "tis_uncorrected_tokens": None}
        import torch

        stats = torch.tensor([self.clipped, self.count, self.uncorrected], dtype=torch.float64)
        if gather is not None:
            stats = gather(stats).reshape(-1, 3).sum(0)
        clipped, count, uncorrected = stats.tolist()
        return {"tis_enabled": True, "tis_clipped_share": clipped / count if count else None,
                "tis_uncorrected_tokens": int(uncorrected)}
