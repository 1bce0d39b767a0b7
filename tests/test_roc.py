"""GRPO-RoC rules against hand-computed groups (paper §2.2.3, Eqs. 4-7; released rstar2_agent/down_sample/reject_sampling.py and roc.py)."""

import itertools
import math
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from rstar2.rl import roc
from rstar2.rl.trainer import select


# ---- p_err (Eq. 4) ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("statuses,expected", [
    ([], 0.5),                                          # no tool call: the paper's default
    (["ok", "ok"], 0.0),
    (["ok", "error"], 0.5),                             # execution error
    (["timeout", "ok", "ok", "ok"], 0.25),              # timeouts count
    (["parse-error", "ok", "ok"], 1 / 3),               # a call that failed to parse counts
    (["memory", "output-limit", "ok", "ok"], 0.5),      # resource limits are execution errors
    (["ok", "error", "timeout", "parse-error"], 0.75),
])
def test_tool_error_penalty_from_statuses(statuses, expected):
    assert roc.tool_error_penalty(statuses) == pytest.approx(expected)


def test_released_substring_penalty_misses_timeouts_and_parse_failures():
    # the released code's proxy (roc.py calc_error_ratio_penalty_weights): only the word "error" counts
    responses = ["Traceback ...\nNameError: name 'x' is not defined", "Tool call failure / reason: worker_timeout",
                 "Failed to decode tool call: Expecting value", "42"]
    assert roc.tool_error_penalty_substring(responses) == 0.25
    assert roc.tool_error_penalty_substring([]) == 0.5
    assert roc.tool_error_penalty_substring(["no ERROR here? it says error"]) == 1.0


# ---- p_format (Eq. 5) -------------------------------------------------------------------------------------

A = "<answer>\\boxed{1}</answer>"


@pytest.mark.parametrize("turns,paper,released", [
    (["no answer here"], 1.0, 1.0),
    ([A], 0.0, 1.0),                         # one turn, one answer: 0 in the paper; 1 in code (no later turn)
    (["call the tool", A], 0.0, 0.0),
    ([A, A], 0.5, 1.0),                      # paper (2-1)/2; code (2-1)/1
    (["t", "t", A + A], 1 / 3, 0.5),
    ([A + A + A], 1.0, 1.0),                 # min(1, 2/1)
    (["x", "<answer>\\boxed{1}"], 0.0, 1.0),  # unclosed tag: code gives 1 for the mismatch
])
def test_format_penalty_paper_and_released(turns, paper, released):
    assert roc.format_penalty(turns, "paper") == pytest.approx(paper)
    assert roc.format_penalty(turns, "released") == pytest.approx(released)


def test_format_penalty_unknown_mode():
    with pytest.raises(ValueError, match="format penalty mode"):
        roc.format_penalty([A], "strict")


# ---- split (paper §2.2.3) ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_pos,n_neg,keep,expected", [
    (16, 16, 16, (8, 8)),
    (1, 31, 16, (1, 15)),     # only one positive exists
    (31, 1, 16, (15, 1)),
    (30, 2, 16, (14, 2)),     # round(2*16/32) = 1 -> raised to the minimum of 2 negatives
    (2, 30, 16, (2, 14)),     # same for positives
    (5, 27, 16, (2, 14)),     # round(13.5) = 14 (half to even): k_pos = 2
    (7, 25, 16, (4, 12)),     # round(12.5) = 12 (half to even): k_pos = 4
    (3, 5, 4, (2, 2)),        # odd split: round(5*4/8) = round(2.5) = 2
    (5, 3, 4, (2, 2)),        # round(1.5) = 2
    (3, 3, 3, (1, 2)),        # keep < 2 + 2: minimum lowered to keep // 2 = 1; round(1.5) = 2 negatives
    (2, 2, 2, (1, 1)),        # G = 2: one of each, never a single-kind (zero-advantage) group
    (1, 3, 2, (1, 1)),
    (0, 8, 4, (0, 4)),
    (8, 0, 4, (4, 0)),
    (2, 1, 4, (2, 1)),        # fewer than keep: keep all
])
def test_split_counts(n_pos, n_neg, keep, expected):
    assert roc.split_counts(n_pos, n_neg, keep) == expected


def test_split_counts_always_fills_keep():
    for n_pos in range(0, 33):
        k_pos, k_neg = roc.split_counts(n_pos, 32 - n_pos, 16)
        assert k_pos + k_neg == 16 and k_pos <= n_pos and k_neg <= 32 - n_pos
        assert k_pos >= min(2, n_pos) and k_neg >= min(2, 32 - n_pos)
    for g in (2, 3, 4):          # small G: both kinds stay whenever both exist
        for n_pos in range(1, 2 * g):
            k_pos, k_neg = roc.split_counts(n_pos, 2 * g - n_pos, g)
            assert k_pos + k_neg == g and k_pos >= 1 and k_neg >= 1


# ---- selection --------------------------------------------------------------------------------------------

def test_equal_reward_groups_are_detected():
    assert roc.rewards_equal([1, 1, 1, 1]) and roc.rewards_equal([0, 0, 0, 0])
    assert roc.rewards_equal([0.35] * 8) and not roc.rewards_equal([1, 0, 0, 0])


def test_topk_keeps_lowest_penalties_stably():
    rewards = [1, 1, 1, 1, 1, 0, 0, 0]      # 5 positives, 3 negatives, keep 4 -> round(1.5)=2 neg, 2 pos
    penalties = [0.5, 0.0, 0.5, 0.0, 1.5, 9, 9, 9]
    kept = roc.select_group(rewards, penalties, 4, random.Random(0), "topk")
    assert [i for i in kept if rewards[i]] == [1, 3]
    penalties = [0.5, 0.0, 0.5, 0.5, 1.5, 9, 9, 9]   # tie at 0.5: rollout order decides (stable sort)
    kept = roc.select_group(rewards, penalties, 4, random.Random(0), "topk")
    assert [i for i in kept if rewards[i]] == [0, 1]


def test_selection_keeps_g_and_negatives_uniformly():
    rewards = [1, 1, 0, 1, 0, 0, 0, 0]      # 3 pos, 5 neg, keep 4 -> (2, 2)
    counts = Counter()
    rng = random.Random(3)
    n = 6000
    for _ in range(n):
        kept = roc.select_group(rewards, [0.0] * 8, 4, rng, "inverse_prob")
        assert len(kept) == 4 and sum(rewards[i] for i in kept) == 2
        counts.update(kept)
    for i in (2, 4, 5, 6, 7):                 # each negative kept with probability 2/5
        assert abs(counts[i] / n - 0.4) < 4 * math.sqrt(0.4 * 0.6 / n)


def _inclusion_probs(weights: list[float], k: int) -> list[float]:
    """Exact inclusion probabilities of successive weighted draws without replacement (enumeration)."""
    probs = [0.0] * len(weights)
    for order in itertools.permutations(range(len(weights)), k):
        p, left = 1.0, sum(weights)
        for i in order:
            p *= weights[i] / left
            left -= weights[i]
        for i in order:
            probs[i] += p
    return probs


@pytest.mark.parametrize("k_pos", [1, 2])
def test_inverse_prob_keeps_positives_with_the_stated_probabilities(k_pos):
    """Statistical test: positives are kept with probability proportional to 1/(p_total + eps), per draw."""
    eps = 1e-3
    pos_pen = [0.0, 0.5, 1.0, 1.5]
    # 4 positives, n_neg negatives, keep so that split_counts gives exactly k_pos positives
    rewards, penalties, keep = ([1] * 4 + [0] * 4, pos_pen + [0] * 4, 2) if k_pos == 1 else \
        ([1] * 4 + [0] * 2, pos_pen + [0] * 2, 4)
    assert roc.split_counts(4, len(rewards) - 4, keep)[0] == k_pos
    expected = _inclusion_probs([1 / (p + eps) for p in pos_pen], k_pos)
    rng, n, counts = random.Random(11), 20000, Counter()
    for _ in range(n):
        counts.update(i for i in roc.select_group(rewards, penalties, keep, rng, "inverse_prob", eps) if i < 4)
    for i in range(4):
        sigma = math.sqrt(max(expected[i] * (1 - expected[i]), 1e-12) / n)
        assert abs(counts[i] / n - expected[i]) <= 4 * sigma + 1e-4, (i, counts[i] / n, expected[i])


def test_inverse_prob_with_a_wider_eps_matches_the_formula():
    # with eps = 1 the law is visibly soft: weights 1, 1/1.5, 1/2, 1/2.5 for one draw
    eps, pen = 1.0, [0.0, 0.5, 1.0, 1.5]
    w = [1 / (p + eps) for p in pen]
    rng, n, counts = random.Random(5), 20000, Counter()
    for _ in range(n):
        counts.update(roc.sample_inverse_prob([0, 1, 2, 3], pen, 1, rng, eps))
    for i in range(4):
        p = w[i] / sum(w)
        assert abs(counts[i] / n - p) <= 4 * math.sqrt(p * (1 - p) / n)


def test_unknown_selection_mode_is_an_error():
    with pytest.raises(ValueError, match="positive_selection"):
        roc.select_group([1, 0, 1, 0], [0] * 4, 2, random.Random(0), "best")


# ---- advantages (Eq. 7) and handed case R01 ---------------------------------------------------------------

def test_advantages_handed_r01():
    assert roc.group_advantages([1, 1, 1, 1]) == [0, 0, 0, 0]
    assert roc.group_advantages([0, 0, 0, 0]) == [0, 0, 0, 0]
    assert roc.group_advantages([1, 0, 0, 0]) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert roc.group_advantages([0.35] * 8) == [0.0] * 8        # never a float-error blow-up
    adv = roc.group_advantages([0.35] * 7 + [0.0])
    assert all(math.isfinite(a) and abs(a) <= 3 for a in adv)
    assert adv[-1] < 0 < adv[0] and sum(adv) == pytest.approx(0, abs=1e-9)
    assert roc.group_advantages([1.0]) == [0.0]


# ---- step A + step B + advantages per group ---------------------------------------------------------------

def _traj(reward):
    return SimpleNamespace(reward=reward)


def test_select_drops_equal_groups_in_both_modes():
    groups = [[_traj(1)] * 4, [_traj(0)] * 4, [_traj(r) for r in (1, 0, 0, 1)]]
    pens = [[(0.0, 0.0)] * 4] * 3
    res = select(groups, pens, 2, "grpo_roc", "topk", 1e-3, random.Random(0))
    assert [r.dropped for r in res] == [True, True, False]
    assert res[0].kept == res[1].kept == [] and res[0].advantages == []
    kept_rewards = [groups[2][i].reward for i in res[2].kept]
    assert sorted(kept_rewards) == [0, 1]
    # advantages over the kept pair only: mean 0.5, unbiased std sqrt(0.5)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert res[2].advantages == pytest.approx([a if r else -a for r in kept_rewards])
    # grpo: equal-reward groups leave the update too, so they do not grow the loss's token count
    res = select(groups, pens, 4, "grpo", "topk", 1e-3, random.Random(0))
    assert [r.kept for r in res] == [[], [], [0, 1, 2, 3]] and [r.dropped for r in res] == [True, True, False]
    assert res[0].advantages == res[1].advantages == []
    assert res[2].advantages == pytest.approx([0.5 / (1 / math.sqrt(3) + 1e-6) * s for s in (1, -1, -1, 1)])


def test_kept_for_update_is_one_rule_for_both_modes():
    """grpo keeps a mixed group whole; grpo_roc with as many drawn as kept keeps the same rollouts; an
    equal-reward group enters neither; an unknown mode is an error."""
    rewards, pens = [1, 0, 1, 0, 0, 1], [0.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    for mode in roc.MODES:
        assert roc.kept_for_update(rewards, pens, 6, mode, random.Random(1)) == list(range(6))
        assert roc.kept_for_update([1.0] * 6, pens, 6, mode, random.Random(1)) == []
        assert roc.kept_for_update([0.0] * 6, pens, 3, mode, random.Random(1)) == []
    assert len(roc.kept_for_update(rewards, pens, 3, "grpo_roc", random.Random(1))) == 3
    assert roc.kept_for_update(rewards, pens, 3, "grpo", random.Random(1)) == list(range(6))  # grpo draws G
    with pytest.raises(ValueError, match="mode must be one of"):
        roc.kept_for_update(rewards, pens, 3, "ppo", random.Random(1))
