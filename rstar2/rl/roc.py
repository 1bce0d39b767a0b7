"""GRPO-RoC down-sampling: oversample 2G rollouts per prompt, keep G (paper §2.2.3, Eqs. 4-5; spec §1.4-1.5).

Pure functions over rewards and penalties, so they are unit-testable and reusable from any trainer.
"""

from __future__ import annotations

import random

ERROR_STATUSES = ("error", "timeout", "memory", "output-limit", "parse-error")


def tool_error_penalty(statuses: list[str]) -> float:
    """p_err (Eq. 4): erroneous tool calls / all tool calls; 0.5 when the trajectory made no tool call.

    Erroneous = an execution error (incl. memory/output limits), a timeout, or a call that failed to parse,
    judged from the structured status, not from substrings of the output.
    """
    if not statuses:
        return 0.5
    return sum(s in ERROR_STATUSES for s in statuses) / len(statuses)


def format_penalty(turn_texts: list[str]) -> float:
    """p_format (Eq. 5): 1 without an ``<answer>`` block, else min(1, (#answer blocks - 1) / #turns)."""
    n_answer = sum(t.count("<answer>") for t in turn_texts)
    if n_answer == 0:
        return 1.0
    return min(1.0, (n_answer - 1) / max(len(turn_texts), 1))


def split_counts(n_pos: int, n_neg: int, keep: int, min_each: int = 2) -> tuple[int, int]:
    """How many positives and negatives to keep out of a group (the released code's rule, spec §1.4).

    k_neg = round(n_neg * keep / N) and k_pos = keep - k_neg (Python round: half to even), then at least
    ``min_each`` of each kind where that many exist, never more than exist. Returns (k_pos, k_neg) with
    k_pos + k_neg == min(keep, n_pos + n_neg).
    """
    n = n_pos + n_neg
    keep = min(keep, n)
    k_neg = round(n_neg * keep / n) if n else 0
    k_neg = max(k_neg, min(min_each, n_neg))
    k_pos = keep - k_neg
    if k_pos < min(min_each, n_pos):
        k_pos = min(min_each, n_pos)
        k_neg = keep - k_pos
    # respect availability on both sides
    k_pos, k_neg = min(k_pos, n_pos), min(k_neg, n_neg)
    short = keep - k_pos - k_neg
    if short > 0:
        extra_pos = min(short, n_pos - k_pos)
        k_pos += extra_pos
        k_neg += min(short - extra_pos, n_neg - k_neg)
    return k_pos, k_neg


def select_group(rewards: list[float], penalties: list[float], keep: int, rng: random.Random,
                 positive_selection: str = "inverse_prob", eps: float = 1e-3) -> list[int]:
    """Indices (sorted) of the ``keep`` rollouts RoC keeps from one group.

    Negatives (reward <= 0) are sampled uniformly without replacement. Positives are sampled without
    replacement with probability proportional to 1 / (p_total + eps) (``inverse_prob``, the paper) or the
    lowest p_total are kept by a stable sort (``topk``, the released code).
    """
    pos = [i for i, r in enumerate(rewards) if r > 0]
    neg = [i for i, r in enumerate(rewards) if r <= 0]
    k_pos, k_neg = split_counts(len(pos), len(neg), keep)
    kept = rng.sample(neg, k_neg)
    if positive_selection == "topk":
        kept += sorted(pos, key=lambda i: penalties[i])[:k_pos]
    elif positive_selection == "inverse_prob":
        pool = list(pos)
        for _ in range(k_pos):
            weights = [1.0 / (penalties[i] + eps) for i in pool]
            pick = rng.choices(range(len(pool)), weights=weights)[0]
            kept.append(pool.pop(pick))
    else:
        raise ValueError(f"positive_selection must be 'inverse_prob' or 'topk', got {positive_selection!r}")
    return sorted(kept)
