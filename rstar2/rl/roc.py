"""GRPO-RoC: penalties, group filtering, down-sampling 2G -> G, and advantages (paper §2.2.3, Eqs. 4-7;
released code rstar2_agent/down_sample/reject_sampling.py and roc.py).

Pure functions over rewards, tool-call statuses and turn texts, so every rule is unit-testable against
hand-computed groups and reusable from any trainer.

Paper vs released code (rstar2_agent/down_sample/roc.py), each selectable:
  * p_err: structured statuses (paper: execution error, timeout, parse failure all count) or the released
    code's proxy, the substring "error" in each ``<tool_response>`` block;
  * p_format: Eq. 5 over all turns (paper) or the released code's rule, which counts only the turns after the
    first and gives 1.0 to any tag mismatch;
  * positives: sampled with probability proportional to 1/(p_total + eps) (paper) or a stable top-k (code).
"""

from __future__ import annotations

import math
import random
import re

OK_STATUS = "ok"
ERROR_PENALTY_MODES = ("status", "substring")
FORMAT_PENALTY_MODES = ("paper", "released")
POSITIVE_SELECTIONS = ("inverse_prob", "topk")
ADV_EPS = 1e-6          # verl compute_grpo_outcome_advantage: (r - mean) / (std + 1e-6) (paper Eq. 7)
EQUAL_TOL = 1e-9        # rewards closer than this are "equal": a group with no learning signal
MIN_EACH = 2            # released code: at least 2 positives and 2 negatives kept where available


def tool_error_penalty(statuses: list[str]) -> float:
    """p_err (Eq. 4) from structured tool-call statuses.

    Args:
        statuses: one status per tool call of the trajectory, in order (``rstar2.sandbox.STATUSES``).
            Every status other than ``"ok"`` is erroneous: execution error, timeout, memory or output limit,
            and ``"parse-error"`` (a call that failed to parse never reached the sandbox).
    Returns:
        erroneous calls / all calls in [0, 1]; 0.5 when the trajectory made no tool call (the paper's
        default, which nudges the policy towards using the tool).
    """
    if not statuses:
        return 0.5
    return sum(s != OK_STATUS for s in statuses) / len(statuses)


def tool_error_penalty_substring(tool_responses: list[str]) -> float:
    """p_err as the released code computes it (rstar2_agent/down_sample/roc.py ``calc_error_ratio_penalty_weights``).

    Args:
        tool_responses: the text inside each ``<tool_response>`` block that reached the model.
    Returns:
        blocks containing "error" (case-insensitive) / blocks; 0.5 without blocks. Timeouts and parse
        failures usually do not say "error" and so are missed; that is the quirk this reproduces.
    """
    if not tool_responses:
        return 0.5
    return sum("error" in r.lower() for r in tool_responses) / len(tool_responses)


def format_penalty(turn_texts: list[str], mode: str = "paper") -> float:
    """p_format (Eq. 5) from the model-generated text of each assistant turn.

    Args:
        turn_texts: one string per assistant turn (tool responses excluded).
        mode: ``"paper"``: 1 without an ``<answer>`` tag, else min(1, (#answer tags - 1) / #turns).
            ``"released"``: the released code's rule: 1 if ``<answer>`` or ``</answer>`` is missing or the
            counts of opening tags, closing tags and closed pairs differ; the denominator counts only the turns
            after the first (the first assistant header is in the prompt), and 0 such turns gives 1.
    Returns:
        p_format in [0, 1].
    Raises:
        ValueError: unknown mode.
    """
    text = "".join(turn_texts)
    n_open = text.count("<answer>")
    if mode == "paper":
        if n_open == 0:
            return 1.0
        return min(1.0, (n_open - 1) / max(len(turn_texts), 1))
    if mode == "released":
        n_close = text.count("</answer>")
        n_pairs = len(re.findall(r"<answer>.*?</answer>", text, flags=re.S))
        if n_open == 0 or n_close == 0 or not n_open == n_close == n_pairs:
            return 1.0
        later_turns = len(turn_texts) - 1
        if later_turns <= 0:
            return 1.0
        return min(1.0, (n_open - 1) / later_turns)
    raise ValueError(f"format penalty mode must be one of {FORMAT_PENALTY_MODES}, got {mode!r}")


def rewards_equal(rewards: list[float]) -> bool:
    """True when every reward of the group is the same (all correct or all wrong): the group carries no
    learning signal and GRPO-RoC removes it before down-sampling (released down_sample/reject_sampling.py)."""
    return not rewards or max(rewards) - min(rewards) <= EQUAL_TOL


def split_counts(n_pos: int, n_neg: int, keep: int, min_each: int = MIN_EACH) -> tuple[int, int]:
    """How many positives and negatives to keep out of one group (released rule, rstar2_agent/down_sample/roc.py).

    Rounding: k_neg = round(n_neg * keep / N) with Python's round (half to even), k_pos = keep - k_neg;
    then k_neg is raised to min(m, n_neg) and, after that, k_pos to min(m, n_pos), each time taking the
    difference from the other kind; finally neither count exceeds what exists, any shortfall is filled from
    the other kind. m = min(min_each, keep // 2): with keep < 2 * min_each (never in the paper's 32 -> 16,
    but G = 2 or 3 in CPU runs) the unmodified rule would keep only one kind and zero every advantage.
    Examples: 3 positives and 5 negatives, keep 4: round(2.5) = 2, so (2, 2); 30 positives and 2 negatives,
    keep 16: round(1.0) = 1 is raised to 2, so (14, 2); 2 and 2, keep 2: m = 1, so (1, 1).
    Returns:
        (k_pos, k_neg) with k_pos + k_neg == min(keep, n_pos + n_neg).
    """
    n = n_pos + n_neg
    keep = min(keep, n)
    m = min(min_each, keep // 2)
    k_neg = round(n_neg * keep / n) if n else 0
    k_neg = max(k_neg, min(m, n_neg))
    k_pos = keep - k_neg
    if k_pos < min(m, n_pos):
        k_pos = min(m, n_pos)
        k_neg = keep - k_pos
    k_pos, k_neg = min(k_pos, n_pos), min(k_neg, n_neg)
    short = keep - k_pos - k_neg
    if short > 0:
        extra_pos = min(short, n_pos - k_pos)
        k_pos += extra_pos
        k_neg += min(short - extra_pos, n_neg - k_neg)
    return k_pos, k_neg


def sample_inverse_prob(candidates: list[int], penalties: list[float], k: int, rng: random.Random,
                        eps: float) -> list[int]:
    """Draw ``k`` of ``candidates`` without replacement, each draw picking a remaining candidate with
    probability proportional to 1 / (penalties[i] + eps) (paper §2.2.3: "inversely proportional to p_total";
    the paper gives no normalisation, so successive weighted draws are used)."""
    pool, picked = list(candidates), []
    for _ in range(k):
        weights = [1.0 / (penalties[i] + eps) for i in pool]
        picked.append(pool.pop(rng.choices(range(len(pool)), weights=weights)[0]))
    return picked


def select_group(rewards: list[float], penalties: list[float], keep: int, rng: random.Random,
                 positive_selection: str = "inverse_prob", eps: float = 1e-3) -> list[int]:
    """Indices (sorted) of the rollouts RoC keeps from one group of 2G (Step B, paper §2.2.3).

    Args:
        rewards: one binary reward per rollout (> 0 is a positive). penalties: p_total per rollout (only
            positives' values are used). keep: G. rng: the selection's random source.
        positive_selection: ``"inverse_prob"`` (paper) or ``"topk"`` (released code: stable sort by p_total,
            lowest kept). eps: added to p_total before inverting.
    Returns:
        sorted indices, ``min(keep, len(rewards))`` of them; negatives are a uniform sample without replacement.
        A group whose rewards are all equal must be removed by the caller first (``rewards_equal``).
    Raises:
        ValueError: unknown positive_selection, or penalties and rewards of different lengths.
    """
    if positive_selection not in POSITIVE_SELECTIONS:
        raise ValueError(f"positive_selection must be one of {POSITIVE_SELECTIONS}, got {positive_selection!r}")
    if len(penalties) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(penalties)} penalties")
    pos = [i for i, r in enumerate(rewards) if r > 0]
    neg = [i for i, r in enumerate(rewards) if r <= 0]
    k_pos, k_neg = split_counts(len(pos), len(neg), keep)
    kept = rng.sample(neg, k_neg)
    if positive_selection == "topk":
        kept += sorted(pos, key=lambda i: penalties[i])[:k_pos]  # sorted() is stable: ties keep rollout order
    else:
        kept += sample_inverse_prob(pos, penalties, k_pos, rng, eps)
    return sorted(kept)


MODES = ("grpo_roc", "grpo")


def kept_for_update(rewards: list[float], penalties: list[float], keep: int, mode: str, rng: random.Random,
                    positive_selection: str = "inverse_prob", eps: float = 1e-3) -> list[int]:
    """Indices (sorted) of one group's rollouts that enter the policy update, in either mode (paper §2.2.3).

    A group whose rewards are all equal enters in neither mode: every advantage would be 0, so it adds nothing
    to the gradient, only tokens to the dapo loss's denominator (``num_items_in_batch``, a token mean over
    the batch). Keeping such groups in GRPO but not in GRPO-RoC would give GRPO a smaller
    effective learning rate whenever a step had a uniform group, so the ablation would compare two step sizes as
    well as two selection rules. Otherwise ``"grpo"`` keeps every rollout (it draws G, "GRPO with Tool",
    paper §5.3) and ``"grpo_roc"`` down-samples to ``keep`` with :func:`select_group`.

    Args:
        rewards: one reward per drawn rollout. penalties: p_total per rollout (used by grpo_roc only).
        keep: G. mode: one of :data:`MODES`. rng, positive_selection, eps: as in :func:`select_group`.
    Returns:
        ``[]`` for an equal-reward group; all indices (grpo); ``min(keep, len(rewards))`` indices (grpo_roc).
    Raises:
        ValueError: unknown mode (and :func:`select_group`'s errors).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if rewards_equal(rewards):
        return []
    if mode == "grpo":
        return list(range(len(rewards)))
    return select_group(rewards, penalties, keep, rng, positive_selection, eps)


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO outcome advantages over one (selected) group: (r - mean) / (std + 1e-6) (paper Eq. 7).

    std is the unbiased (Bessel-corrected) standard deviation, as torch.std in verl. Computed in float64 with a
    two-pass variance, and a group whose rewards are all equal (within 1e-9) gets exactly 0, so float error in
    std can never blow an advantage up (handed case R01: eight rewards of 0.35 give 0, not ~1000). A group of
    one gets 0.
    """
    n = len(rewards)
    if n < 2 or rewards_equal(rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + ADV_EPS) for r in rewards]
