"""Evaluation metrics: pass@k, avg@k (average pass@1), maj@k and a bootstrap confidence interval.

The paper reports avg@16: 16 samples per problem at temperature 0.6, the mean reward over the samples of a
problem, averaged over problems (paper §5.1). Confidence intervals resample *problems* (the samples of one
problem are not independent draws from the benchmark).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

    With ``n`` samples of which ``c`` are correct::

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that at least one of ``k`` samples drawn without replacement from the ``n`` is correct.
    It is 1 when ``n - c < k``. Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` for numerical stability.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def avg_at_k(rewards_per_problem: Sequence[Sequence[float]]) -> float:
    """avg@k, the average pass@1 over k samples per problem::

        avg@k = (1 / P) * sum_p (1 / k_p) * sum_j r_{p,j}

    the mean over problems of the mean reward over that problem's samples (problems weigh equally even if
    their sample counts differ).

    Raises:
        ValueError: no problems, or a problem with no samples.
    """
    return float(np.mean(per_problem_means(rewards_per_problem)))


def per_problem_means(rewards_per_problem: Sequence[Sequence[float]]) -> list[float]:
    """``[mean_j r_{p,j} for each problem p]``: the per-problem values that avg@k and its CI are built on."""
    if len(rewards_per_problem) == 0:
        raise ValueError("no problems")
    out = []
    for i, rewards in enumerate(rewards_per_problem):
        if len(rewards) == 0:
            raise ValueError(f"problem {i} has no samples")
        out.append(float(np.mean(np.asarray(rewards, dtype=float))))
    return out


def maj_at_k(preds_per_problem: Sequence[Sequence[str | None]],
             rewards_per_problem: Sequence[Sequence[float]],
             k: int | None = None,
             key: Callable[[str], object] | None = None) -> float:
    """maj@k (majority voting, self-consistency)::

        maj@k = (1 / P) * sum_p r_{p, j*(p)},   j*(p) = first sample whose answer is the most frequent
                                                         among the first k answers of problem p

    Samples without an answer (None) do not vote; a problem where none of the first k samples has an
    answer scores 0. Ties go to the answer that appears first. The reward of the winning answer is the
    reward of its first sample (samples with the same key got the same grade).

    Args:
        preds_per_problem: extracted answers, one list per problem.
        rewards_per_problem: the matching 0/1 rewards.
        k: use the first ``k`` samples of each problem (default: all).
        key: maps an answer to its vote key; default :func:`rstar2.grading.normalize_answer`, so ``004`` and
            ``4`` vote together.

    Raises:
        ValueError: no problems, or predictions and rewards whose shapes differ.
    """
    if key is None:
        from rstar2.grading import normalize_answer as key
    if len(preds_per_problem) == 0:
        raise ValueError("no problems")
    if len(preds_per_problem) != len(rewards_per_problem):
        raise ValueError("preds_per_problem and rewards_per_problem differ in length")
    scores = []
    for i, (preds, rewards) in enumerate(zip(preds_per_problem, rewards_per_problem)):
        if len(preds) != len(rewards):
            raise ValueError(f"problem {i}: {len(preds)} predictions but {len(rewards)} rewards")
        preds, rewards = list(preds)[:k], list(rewards)[:k]
        keys = [key(p) if p is not None else None for p in preds]
        votes = Counter(x for x in keys if x is not None)
        if not votes:
            scores.append(0.0)
            continue
        best = max(votes.values())
        winner = next(x for x in keys if x is not None and votes[x] == best)
        scores.append(float(rewards[keys.index(winner)]))
    return float(np.mean(scores))


def bootstrap_ci(values: Sequence[float], n_boot: int = 1000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of ``values`` (one value per problem).

    Draw ``n_boot`` resamples of the P values with replacement, take each resample's mean
    ``m_b = (1/P) sum_i v_{i_b}``, and return the ``alpha/2`` and ``1 - alpha/2`` quantiles of the m_b
    (numpy's linear interpolation). Deterministic for a given ``seed``.

    For avg@k pass ``per_problem_means(rewards_per_problem)``.

    Raises:
        ValueError: ``values`` is empty, ``n_boot < 1`` or ``alpha`` not in (0, 1).
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    if not (0.0 < alpha < 1.0):
        raise ValueError("alpha must be in (0, 1)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_boot, v.size))
    means = v[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def summarize_rewards(rewards_per_problem: Sequence[Sequence[float]], k: int | None = None,
                      n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict:
    """avg@k with its bootstrap CI and pass@k, in the shape of an eval ``summary.json`` benchmark entry.

    ``k`` defaults to the smallest sample count; pass@k uses each problem's own n and c (rewards > 0.5
    count as correct).
    """
    means = per_problem_means(rewards_per_problem)
    ns = [len(r) for r in rewards_per_problem]
    k = min(ns) if k is None else k
    cs = [int(sum(1 for x in r if x > 0.5)) for r in rewards_per_problem]
    return {
        "n_problems": len(means),
        "k": k,
        "avg_at_k": float(np.mean(means)),
        "avg_at_k_ci": list(bootstrap_ci(means, n_boot=n_boot, alpha=alpha, seed=seed)),
        "pass_at_k": float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)])),
    }


def summarise(rows: list[dict], k: int) -> dict:
    """One benchmark's entry of ``summary.json`` from its per-problem rows.

    Args:
        rows: per-problem records with ``rewards``, ``preds``, ``response_tokens``, ``tool_calls``,
            ``truncated`` (one entry per sample) and optionally ``tool_calls_ok`` (calls with status ok).
        k: samples per problem.
    Returns:
        ``{"n_problems", "k", "avg_at_k", "avg_at_k_ci" [lo, hi], "pass_at_k", "maj_at_k",
        "mean_response_tokens", "mean_tool_calls", "tool_ok_ratio", "truncation_ratio"}``; scores are fractions
        in [0, 1], means are over problems of the per-problem mean over samples; ``tool_ok_ratio`` is the share of
        all tool calls that ran cleanly (None without calls or without ``tool_calls_ok``). With no rows every
        value is None.
    """
    if not rows:
        return {"n_problems": 0, "k": k, "avg_at_k": None, "avg_at_k_ci": None, "pass_at_k": None,
                "maj_at_k": None, "mean_response_tokens": None, "mean_tool_calls": None, "tool_ok_ratio": None,
                "truncation_ratio": None}
    rewards = [r["rewards"] for r in rows]
    out = summarize_rewards(rewards, k=min(k, min(len(r) for r in rewards)))
    out["k"] = k

    def mean_of_means(key):
        return statistics.fmean(statistics.fmean(float(x) for x in r[key]) for r in rows)
    calls = sum(sum(r["tool_calls"]) for r in rows)
    ok = sum(sum(r["tool_calls_ok"]) for r in rows) if all("tool_calls_ok" in r for r in rows) else None
    out.update(maj_at_k=maj_at_k([r["preds"] for r in rows], rewards),
               mean_response_tokens=mean_of_means("response_tokens"), mean_tool_calls=mean_of_means("tool_calls"),
               tool_ok_ratio=ok / calls if ok is not None and calls else None,
               truncation_ratio=mean_of_means("truncated"))
    return out


__all__ = ["pass_at_k", "avg_at_k", "per_problem_means", "maj_at_k", "bootstrap_ci", "summarize_rewards", "summarise"]
