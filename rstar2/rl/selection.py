"""GRPO-RoC selection of one RL step (paper §2.2, Eqs. 4-5): each trajectory's tool-error and format
penalties, then per group Step A (drop equal-reward groups) and Step B (keep G of the 2G drawn), and the
advantages over the kept rollouts. The arithmetic itself is in ``roc``; this module applies it to trajectories."""

from __future__ import annotations

import re
import random
from dataclasses import dataclass

from .. import rollout as rollout_lib
from . import roc

_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


@dataclass
class PenaltyConfig:
    """Which p_err / p_format definitions to use (paper Eqs. 4-5 or released code) and the eps of 1/(p_total + eps).

    error: ``"status"`` (paper) or ``"substring"`` (released code). format: ``"paper"`` or ``"released"``.
    """
    error: str = "status"
    format: str = "paper"
    eps: float = 1e-3

    def __post_init__(self):
        if self.error not in roc.ERROR_PENALTY_MODES:
            raise ValueError(f"rl.error_penalty must be one of {roc.ERROR_PENALTY_MODES}, got {self.error!r}")
        if self.format not in roc.FORMAT_PENALTY_MODES:
            raise ValueError(f"rl.format_penalty must be one of {roc.FORMAT_PENALTY_MODES}, got {self.format!r}")


def tool_response_texts(t: rollout_lib.Trajectory, tok) -> list[str]:
    """The ``<tool_response>`` blocks the model saw, decoded from the non-generated spans of the response
    (what the released code's regex runs over)."""
    spans, cur = [], []
    for tid, m in zip(t.response_ids, t.response_mask):
        if m:
            if cur:
                spans.append(cur)
                cur = []
        else:
            cur.append(tid)
    if cur:
        spans.append(cur)
    return [b for s in spans for b in _TOOL_RESPONSE.findall(tok.decode(s, skip_special_tokens=False))]


def trajectory_penalties(t: rollout_lib.Trajectory, tok, pcfg: PenaltyConfig) -> tuple[float, float]:
    """(p_err, p_format) of one trajectory (Eqs. 4-5); p_total is their sum."""
    if pcfg.error == "status":
        p_err = roc.tool_error_penalty([c["status"] for c in t.tool_calls])
    else:
        p_err = roc.tool_error_penalty_substring(tool_response_texts(t, tok))
    return p_err, roc.format_penalty([turn["text"] for turn in t.turns], pcfg.format)


@dataclass
class GroupResult:
    """One prompt's rollouts: all drawn trajectories, their penalties, the kept indices and advantages.

    kept is empty when the group was removed (all rewards equal, either mode); advantages[j] belongs to
    trajs[kept[j]]."""
    trajs: list
    penalties: list[tuple[float, float]]
    kept: list[int]
    advantages: list[float]
    dropped: bool


def select(groups: list[list[rollout_lib.Trajectory]], penalties: list[list[tuple[float, float]]], G: int,
           mode: str, positive_selection: str, eps: float, rng: random.Random) -> list[GroupResult]:
    """Step A (drop equal-reward groups) and Step B (RoC 2G -> G) per group, then advantages over the kept.

    Both modes drop equal-reward groups (``roc.kept_for_update``: the same loss normalisation);
    ``mode="grpo"`` keeps every rollout of the other groups, ``mode="grpo_roc"`` down-samples them.
    """
    out = []
    for g, pens in zip(groups, penalties):
        rewards = [t.reward for t in g]
        # one rule for both modes: equal-reward groups kept in one mode would only grow its loss's token count
        kept = roc.kept_for_update(rewards, [a + b for a, b in pens], G, mode, rng, positive_selection, eps)
        dropped = roc.rewards_equal(rewards)
        adv = roc.group_advantages([rewards[i] for i in kept])
        out.append(GroupResult(g, pens, kept, adv, dropped))
    return out
