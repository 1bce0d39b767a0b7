"""Tests for rstar2.metrics against hand-computed values."""

import math

import pytest

from rstar2.metrics import avg_at_k, bootstrap_ci, maj_at_k, pass_at_k, per_problem_means, summarize_rewards


@pytest.mark.parametrize("n,c,k,expected", [
    (1, 0, 1, 0.0),
    (1, 1, 1, 1.0),
    (2, 1, 1, 0.5),            # c/n
    (16, 5, 1, 5 / 16),        # pass@1 = c/n
    (4, 2, 2, 5 / 6),          # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (5, 1, 2, 2 / 5),          # 1 - C(4,2)/C(5,2) = 1 - 6/10
    (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
    (5, 0, 3, 0.0),
    (5, 3, 3, 1.0),            # n - c = 2 < k = 3
    (16, 16, 16, 1.0),
])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k():
    # problem means 0.5 and 0.75 -> 0.625 (problems weigh equally, not samples: 4/6 would be wrong)
    assert avg_at_k([[1, 0], [1, 1, 1, 0]]) == pytest.approx(0.625)
    assert avg_at_k([[1.0] * 16, [0.0] * 16, [1.0] * 8 + [0.0] * 8]) == pytest.approx(0.5)
    assert per_problem_means([[1, 0], [1, 1, 1, 0]]) == [0.5, 0.75]
    with pytest.raises(ValueError):
        avg_at_k([])
    with pytest.raises(ValueError):
        avg_at_k([[1.0], []])


def test_maj_at_k():
    preds = [
        ["4", "004", "5", None],    # "4" and "004" vote together: winner "4" (reward 1)
        ["3", "5", "5", "3"],       # tie 2-2: first answer "3" wins (reward 0)
        [None, None, None, None],   # no answers: 0
        ["7", "8", "8", "8"],       # majority "8" (reward 1)
    ]
    rewards = [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]]
    assert maj_at_k(preds, rewards) == pytest.approx(2 / 4)
    # first k=2 samples only: p1 "4"x2 -> 1; p2 tie "3" -> 0; p3 0; p4 tie "7" first -> 0
    assert maj_at_k(preds, rewards, k=2) == pytest.approx(1 / 4)
    # without normalisation "4" and "004" are separate: tie, first "4" still wins
    assert maj_at_k(preds, rewards, key=lambda s: s) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        maj_at_k([["1"]], [[1, 0]])
    with pytest.raises(ValueError):
        maj_at_k([], [])


def test_bootstrap_ci_hand_computed():
    # two problems with values 0 and 1: resample means are 0, .5, 1 with probability 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles are 0 and 1
    assert bootstrap_ci([0.0, 1.0], n_boot=4000) == (0.0, 1.0)
    # a constant has a zero-width interval
    assert bootstrap_ci([0.7] * 30) == pytest.approx((0.7, 0.7))
    assert bootstrap_ci([0.25]) == (0.25, 0.25)


def test_bootstrap_ci_properties():
    values = [1.0] * 30 + [0.0] * 20          # mean 0.6, sd of the mean ~ 0.069
    lo, hi = bootstrap_ci(values)
    assert lo < 0.6 < hi
    assert 0.4 < lo < 0.55 and 0.65 < hi < 0.8
    assert bootstrap_ci(values) == (lo, hi)               # deterministic for a seed
    cont = [i / 49 for i in range(50)]
    assert bootstrap_ci(cont, seed=1) != bootstrap_ci(cont, seed=0)
    wide = bootstrap_ci(values, alpha=0.01)
    assert wide[0] <= lo and wide[1] >= hi
    lo4, hi4 = bootstrap_ci(values * 4)
    assert hi4 - lo4 < hi - lo                            # more problems, narrower interval
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0], alpha=0)


def test_summarize_rewards():
    s = summarize_rewards([[1, 0], [1, 1], [0, 0]])
    assert s["n_problems"] == 3 and s["k"] == 2
    assert s["avg_at_k"] == pytest.approx(0.5)
    assert s["pass_at_k"] == pytest.approx(2 / 3)   # pass@2: 1, 1, 0
    lo, hi = s["avg_at_k_ci"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
