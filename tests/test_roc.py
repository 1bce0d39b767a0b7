import random
from collections import Counter

import pytest

from rstar2.rl import roc


def test_penalties_match_equations():
    assert roc.tool_error_penalty([]) == 0.5
    assert roc.tool_error_penalty(["ok", "error", "timeout", "parse-error"]) == 0.75
    assert roc.format_penalty(["no answer here"]) == 1.0
    assert roc.format_penalty(["call", "<answer>\\boxed{1}</answer>"]) == 0.0
    assert roc.format_penalty(["<answer>1</answer>", "<answer>1</answer>"]) == 0.5


@pytest.mark.parametrize("n_pos,n_neg,keep,expected", [
    (16, 16, 16, (8, 8)),
    (1, 31, 16, (1, 15)),     # only one positive exists
    (31, 1, 16, (15, 1)),
    (30, 2, 16, (14, 2)),     # round(2*16/32)=1 -> raised to the minimum of 2 negatives
    (3, 5, 4, (2, 2)),        # odd split: round(5*4/8)=round(2.5)=2 (half to even)
    (0, 8, 4, (0, 4)),
    (8, 0, 4, (4, 0)),
    (2, 1, 4, (2, 1)),        # fewer than keep: keep all
])
def test_split_counts(n_pos, n_neg, keep, expected):
    assert roc.split_counts(n_pos, n_neg, keep) == expected


def test_select_group_keeps_g_and_prefers_clean_positives():
    rewards = [1, 1, 1, 1, 0, 0, 0, 0]
    penalties = [0.0, 1.5, 0.5, 2.0, 0, 0, 0, 0]
    kept = roc.select_group(rewards, penalties, 4, random.Random(0), "topk")
    assert len(kept) == 4 and [i for i in kept if rewards[i]] == [0, 2]
    counts = Counter()
    rng = random.Random(1)
    for _ in range(4000):
        for i in roc.select_group(rewards, penalties, 4, rng, "inverse_prob"):
            counts[i] += 1
    assert counts[0] > counts[2] > counts[1] > counts[3]
    assert all(1800 < counts[i] < 2200 for i in range(4, 8))  # negatives uniform: 2 of 4 kept each time


def test_unknown_selection_mode_is_an_error():
    with pytest.raises(ValueError):
        roc.select_group([1, 0, 1, 0], [0] * 4, 2, random.Random(0), "best")
