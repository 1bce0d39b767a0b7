"""The bug classes the released rStar2-Agent code shipped with, each guarded on our RL step (paper §2.2.3, Eqs. 4-7).

* rewards written to other rollouts of a batch (microsoft/rStar #47: row ``i*64+j`` instead of the rollout's own);
* a reward or advantage placed at a stale length (rStar #53/#54: every sample of a chunk used the last sample's
  valid length), here: the advantage's token span in a padded micro-batch;
* failures chosen by penalty (rStar #49/#50) or by position (the released fix keeps the first k in rollout order)
  instead of uniformly at random;
* the positive-selection rule (paper: prefer clean successes, probability 1/(p_total + eps); released: top-k).

Hand-built groups with known outcomes; no model. Each test was checked to fail on a deliberately reintroduced
version of its bug (docs/grpo-roc.md lists how).
"""

import json
import math
import random
from types import SimpleNamespace

import pytest
from scipy.stats import binomtest, chisquare

from rstar2.rl import roc
from rstar2.rl import rollout_func as rollout_func_module
from rstar2.rl.batch import micro_batches, plan_micro_batches
from rstar2.rl.rollout_func import RolloutFunc
from rstar2.rl.selection import PenaltyConfig, select
from rstar2.rollout import RolloutConfig, Trajectory, grade_all

#: False-alarm rate of each statistical test below: the chance that a correct (uniform) implementation fails
#: it with a fresh random seed. The seeds are fixed, so every run gives the same verdict.
ALPHA = 1e-3


def _traj(uid: int, reward: float, prompt_len: int = 3, tool_span: int = 0, statuses=(), problem="p"):
    """A trajectory whose response tokens spell its uid: 4 + uid % 5 generated tokens, then optionally a
    tool-response span (mask 0) and two more generated tokens."""
    gen = [1000 + uid] * (4 + uid % 5)
    resp, mask = gen + [7] * tool_span + ([2000 + uid] * 2 if tool_span else []), \
        [1] * len(gen) + [0] * tool_span + ([1] * 2 if tool_span else [])
    calls = [{"code": "", "status": s, "output": ""} for s in statuses]
    return Trajectory(problem_id=problem, question=problem, gold="1", prompt_ids=list(range(1, prompt_len + 1)),
                      key=f"{problem}#{uid}", response_ids=resp, response_mask=mask,
                      turns=[{"text": "<answer>\\boxed{1}</answer>", "tool_calls": calls}], finish_reason="answer",
                      reward=reward)


def _expected_advantage(reward: float, kept_rewards: list[float]) -> float:
    """Eq. 7 written out independently of roc.group_advantages: (r - mean) / (unbiased std + 1e-6)."""
    n = len(kept_rewards)
    mean = sum(kept_rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in kept_rewards) / (n - 1))
    return (reward - mean) / (std + 1e-6)


def _groups(n_groups: int, draw: int, seed: int):
    """Groups of ``draw`` rollouts with mixed rewards and varied penalties; uids unique across groups."""
    rng = random.Random(seed)
    groups, pens = [], []
    for g in range(n_groups):
        rewards = [1.0, 0.0] + [float(rng.random() < 0.5) for _ in range(draw - 2)]
        rng.shuffle(rewards)
        groups.append([_traj(g * 100 + i, r, prompt_len=2 + (g + i) % 4, tool_span=(i % 3) * 2, problem=f"p{g}")
                       for i, r in enumerate(rewards)])
        pens.append([(rng.choice([0.0, 0.5, 1.0]), rng.choice([0.0, 1.0])) for _ in rewards])
    return groups, pens


# ---- rewards on their own rollouts (rStar #47) ---------------------------------------------------------------

def test_rewards_are_written_to_their_own_rollouts():
    """A shuffled batch of 6 problems x 4 rollouts graded through the grading workers: every rollout gets the
    reward of its own answer against its own gold. Wrong answers are another problem's gold, so a reward
    written one row off shows up."""
    golds = [str(101 + 7 * k) for k in range(6)]
    trajs, want = [], {}
    for k in range(6):
        for j in range(4):
            right = (k + j) % 3 == 0
            t = _traj(k * 10 + j, 0.0, problem=f"p{k}")
            t.gold = golds[k]
            t.turns = [{"text": f"<answer>\\boxed{{{golds[k] if right else golds[(k + 1) % 6]}}}</answer>",
                        "tool_calls": []}]
            trajs.append(t)
            want[t.key] = float(right)
    random.Random(0).shuffle(trajs)
    grade_all(trajs, answer_types=["integer"] * len(trajs))
    assert {t.key: t.reward for t in trajs} == want
    assert all(t.pred == (t.gold if want[t.key] else t.pred) for t in trajs)


# ---- every kept trajectory carries its own reward and advantage, in any order and batching ---------------------

@pytest.mark.parametrize("positive_selection", roc.POSITIVE_SELECTIONS)
def test_kept_trajectories_carry_their_own_advantage_in_any_order(positive_selection):
    """Step A (an all-correct and an all-wrong group leave) and Step B on groups and rollouts shuffled four ways:
    every kept trajectory carries its own reward and the advantage Eq. 7 gives it within its own kept group."""
    groups, pens = _groups(n_groups=5, draw=8, seed=1)
    for g, r in ((5, 1.0), (6, 0.0)):                  # Step A: equal-reward groups
        groups.append([_traj(g * 100 + i, r, problem=f"p{g}") for i in range(8)])
        pens.append([(0.0, 0.0)] * 8)
    for shuffle_seed in range(4):
        order = random.Random(shuffle_seed)
        idx = list(range(len(groups)))
        order.shuffle(idx)
        shuffled, shuffled_pens = [], []
        for g in idx:                                  # groups in another order, rollouts within them too
            perm = list(range(8))
            order.shuffle(perm)
            shuffled.append([groups[g][i] for i in perm])
            shuffled_pens.append([pens[g][i] for i in perm])
        results = select(shuffled, shuffled_pens, 4, "grpo_roc", positive_selection, 1e-3, random.Random(7))
        for r in results:
            kept = [r.trajs[i] for i in r.kept]
            if r.trajs[0].problem_id in ("p5", "p6"):
                assert r.dropped and kept == [] and r.advantages == []
                continue
            assert len(kept) == 4 and len({t.problem_id for t in kept}) == 1
            assert {t.reward for t in kept} == {0.0, 1.0}
            for t, a in zip(kept, r.advantages):
                assert a == pytest.approx(_expected_advantage(t.reward, [k.reward for k in kept]), abs=1e-12)
                assert (a > 0) == (t.reward > 0)


def test_micro_batches_keep_each_rows_advantage_and_tokens():
    """Kept rows reordered and split into micro-batches (longest first, budget 60 padded tokens): each row of each
    micro-batch holds its own trajectory's tokens and advantage."""
    groups, pens = _groups(n_groups=4, draw=8, seed=2)
    results = select(groups, pens, 4, "grpo_roc", "inverse_prob", 1e-3, random.Random(3))
    trajs = [r.trajs[i] for r in results for i in r.kept]
    advs = [a for r in results for a in r.advantages]
    own = {t.key: a for t, a in zip(trajs, advs)}
    plan, _ = plan_micro_batches([[(len(t.prompt_ids), len(t.response_ids)) for t in trajs]], 60)
    assert len(plan) > 2
    seen = []
    for build in micro_batches(trajs, advs, [mb[0] for mb in plan], pad_id=0, num_items_in_batch=1):
        b = build()
        for row in range(b["completion_ids"].shape[0]):
            n = int(b["completion_mask"][row].sum())
            t = next(t for t in trajs if t.response_ids == b["completion_ids"][row, :n].tolist())
            assert float(b["advantages"][row]) == pytest.approx(own[t.key], rel=1e-6)
            seen.append(t.key)
    assert sorted(seen) == sorted(own)


# ---- the advantage covers exactly the row's own generated tokens (rStar #53/#54) ---------------------------------

def test_advantage_covers_exactly_each_rows_own_generated_tokens():
    """Rows of different prompt and response lengths, tool-response spans and an empty response in one
    micro-batch: the loss weight TRL's dapo loss gives token j of row b, advantages[b] * completion_mask *
    tool_mask (tests/test_rl_trainer.py checks that against TRL's _compute_loss), is the row's own advantage on
    its own generated tokens and 0 on its tool-response tokens, its padding and beyond its own length; its
    attention span (completion_mask) is its own length."""
    trajs = [_traj(0, 1.0, prompt_len=5, tool_span=3), _traj(3, 0.0, prompt_len=1),
             _traj(11, 0.0, prompt_len=3, tool_span=4), _traj(4, 1.0, prompt_len=2)]
    empty = _traj(5, 0.0)
    empty.response_ids, empty.response_mask = [], []
    trajs.append(empty)
    advs = [0.9, -0.4, -0.7, 1.3, -0.2]
    (b,) = [build() for build in micro_batches(trajs, advs, [list(range(5))], pad_id=0, num_items_in_batch=1)]
    weight = b["advantages"][:, None] * b["completion_mask"] * b["tool_mask"]
    width, prompt_width = weight.shape[1], b["prompt_ids"].shape[1]
    assert len({len(t.response_ids) for t in trajs}) == 5
    for row, (t, a) in enumerate(zip(trajs, advs)):
        want = [a * m for m in t.response_mask] + [0.0] * (width - len(t.response_ids))
        assert weight[row].tolist() == pytest.approx(want, rel=1e-6, abs=0), row
        assert b["completion_ids"][row, :len(t.response_ids)].tolist() == t.response_ids
        pad = [0] * (width - len(t.response_ids))      # the row's own span, attended and masked, never another's
        assert b["completion_mask"][row].tolist() == [1] * len(t.response_ids) + pad
        assert b["tool_mask"][row].tolist() == t.response_mask + pad
        assert b["prompt_ids"][row, prompt_width - len(t.prompt_ids):].tolist() == t.prompt_ids
    assert int((b["completion_mask"] * b["tool_mask"]).sum()) == sum(sum(t.response_mask) for t in trajs)


# ---- failures are kept uniformly at random (rStar #49/#50) -------------------------------------------------------

@pytest.mark.parametrize("positive_selection", roc.POSITIVE_SELECTIONS)
def test_failures_are_kept_uniformly_at_random(positive_selection):
    """Chi-square over which pair of the 5 failures Step B keeps (3 successes, 5 failures, G = 4: 2 of each),
    over 3,000 groups. Failures sit first, last and between successes, with penalties from 0 to 2, so keeping
    them by penalty, by position or by an inverse-penalty draw concentrates the counts. H0 (each of the 10
    pairs equally likely) is rejected at p < ALPHA."""
    rewards = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    penalties = [(2.0, 0.0), (0.0, 0.0), (0.0, 0.0), (1.0, 0.5), (0.5, 0.0), (0.5, 1.0), (1.0, 0.0), (0.0, 1.0)]
    failures = [i for i, r in enumerate(rewards) if r == 0]
    pairs = [(a, b) for a in failures for b in failures if a < b]
    n = 3000
    groups = [[SimpleNamespace(reward=r) for r in rewards] for _ in range(n)]
    results = select(groups, [penalties] * n, 4, "grpo_roc", positive_selection, 1e-3, random.Random(12345))
    counts = {p: 0 for p in pairs}
    for r in results:
        kept_failures = tuple(i for i in r.kept if rewards[i] == 0)
        assert len(kept_failures) == 2
        counts[kept_failures] += 1
    stat, p_value = chisquare(list(counts.values()))
    assert p_value > ALPHA, (counts, stat, p_value)


# ---- the positive-selection rule, as configured ----------------------------------------------------------------

def _fake_rollouts(statuses_by_index, rewards_by_index):
    """run_rollouts for RolloutFunc: rollout j of each group gets rewards_by_index[j] and those tool statuses."""
    def run(model, tok, problems, cfg, **kw):
        out = []
        for n, p in enumerate(problems):
            j = n % len(rewards_by_index)
            t = _traj(n, rewards_by_index[j], statuses=statuses_by_index[j], problem=p["id"])
            t.question, t.gold = p["problem"], p["answer"]
            out.append(t)
        return out
    return run


@pytest.mark.parametrize("positive_selection", roc.POSITIVE_SELECTIONS)
def test_positive_selection_as_configured_prefers_clean_successes(positive_selection, monkeypatch, tmp_path):
    """RolloutFunc with rl.positive_selection and rl.penalty_eps = 1 on 300 prompts: 8 drawn per prompt (3
    successes with a clean tool call, p_total 0; 3 with a failed one, p_total 1; 2 failures), 4 kept, 2 of them
    successes. topk (released code) keeps 2 clean successes every time. inverse_prob (paper) draws with weights
    1/(0 + 1) and 1/(1 + 1): both kept successes are clean with probability 3/4.5 * 2/3.5 = 8/21 per group (a
    uniform pick: 3/15, top-k: 1); a binomial test rejects that law at p < ALPHA."""
    rewards = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    statuses = [("ok",), ("error",), ("ok",), ("error",), ("ok",), ("error",), ("ok",), ("error",)]
    monkeypatch.setattr(rollout_func_module.rollout_lib, "run_rollouts", _fake_rollouts(statuses, rewards))
    n = 300
    prompts = {f"q{i}": {"id": f"p{i}", "answer": "1"} for i in range(n)}
    fn = RolloutFunc(prompts, RolloutConfig(), group_size=4, oversample=2, mode="grpo_roc",
                     positive_selection=positive_selection, seed=0, out_dir=str(tmp_path),
                     penalty=PenaltyConfig("status", "paper", eps=1.0))
    trainer = SimpleNamespace(model=SimpleNamespace(train=lambda: None), processing_class=None,
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    trajs, advs = fn([q for q in prompts for _ in range(4)], trainer)
    assert len(trajs) == 4 * n and [t.problem_id for t in trajs[::4]] == [f"p{i}" for i in range(n)]
    both_clean = 0
    for g in range(n):
        kept = trajs[4 * g:4 * g + 4]
        assert len({t.problem_id for t in kept}) == 1 and sum(t.reward for t in kept) == 2
        both_clean += all(t.tool_calls[0]["status"] == "ok" for t in kept if t.reward > 0)
        for t, a in zip(kept, advs[4 * g:4 * g + 4]):
            assert a == pytest.approx(_expected_advantage(t.reward, [k.reward for k in kept]), abs=1e-12)
    if positive_selection == "topk":
        assert both_clean == n
    else:
        assert binomtest(both_clean, n, 8 / 21).pvalue > ALPHA, both_clean
    rows = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 8 * n and sum(r["kept"] for r in rows) == 4 * n
    assert all((r["advantage"] is None) != r["kept"] for r in rows)
