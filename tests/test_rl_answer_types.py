"""RL on any answer type and the reward registry: rl_data.sources[].answer_type carried through the
funnel to the RL reward (graded symbolically for ``math``), and ``rl.reward`` naming a user function that the RL
step, GRPO-RoC selection and the DAG-time check all use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, stage_params
from test_rl_trainer import CyclingModel, _fake_trainer

from rstar2.data.curate import curate
from rstar2.grading import final_turn_text, rewards
from rstar2.io import read_jsonl
from rstar2.rl.trainer import RolloutFunc
from rstar2.rollout import RolloutConfig

MATH = REPO / "data/rl/math_nonint/math_nonint.jsonl"
MATH_SOURCE = {"name": "math_nonint", "path": str(MATH), "answer_type": "math",
               "fields": {"problem": "problem", "answer": "answer", "id": "id"}}
INT_SOURCE = {"name": "my_problems", "path": str(REPO / "data/examples/custom_problems.csv"),
              "fields": {"problem": "question_text", "answer": "final", "id": "qid"}}
# the user's reward of the RoC test: it pays the near-miss (the opposite of the answer reward), so what RoC keeps
# shows which reward it saw
USER_REWARD = '''
def near_miss(completion, answer, answer_type):
    return 1.0 if "6.667" in completion else 0.0

def two_args(completion, answer):
    return 1.0

def says_yes(completion, answer, answer_type):
    return "yes"

def raises(completion, answer, answer_type):
    raise KeyError("solution")

def by_length(completion, answer, answer_type):
    return float(len(completion) % 2)

def fragile(completion, answer, answer_type):
    return {"6.667": 1.0}["6.667" if "6.667" in completion else completion[-12:]]

def numpy_int(completion, answer, answer_type):
    import numpy
    return numpy.int64("6.667" in completion)
'''


def _say(ans: str) -> str:
    return f"It is {ans}.</reason>\n<answer>\\boxed{{{ans}}}</answer><|im_end|>"


def _row(answer: str) -> dict:
    return next(r for r in read_jsonl(MATH) if r["answer"] == answer)


def test_funnel_skips_the_integer_filter_for_a_math_source_and_rows_carry_their_type():
    rows, funnel = curate([INT_SOURCE, MATH_SOURCE], {}, max_abs_answer=10**9, near_dedupe={"enabled": False})
    by_source = {s: [r for r in rows if r["source"] == s] for s in ("my_problems", "math_nonint")}
    assert len(by_source["math_nonint"]) == 50 and len(by_source["my_problems"]) == 5
    assert {r["answer_type"] for r in by_source["math_nonint"]} == {"math"}
    assert {r["answer_type"] for r in by_source["my_problems"]} == {"integer"}
    assert {r["id"]: r["answer"] for r in by_source["math_nonint"]}["math_nonint-24"] == "\\frac{20}{3}"
    assert funnel["integer_filter_skipped"] == {"math_nonint": "math"}
    assert funnel["per_source"]["math_nonint"]["integer_answer"] == 50
    # the same rows as an integer source: the paper's filter drops every one of them
    _, as_int = curate([{**MATH_SOURCE, "answer_type": "integer"}], {}, max_abs_answer=10**9,
                       near_dedupe={"enabled": False})
    assert as_int["total"]["integer_answer"] == 0 and as_int["integer_filter_skipped"] == {}
    with pytest.raises(ValueError, match=r"rl_data.sources\[0\] \(math_nonint\): answer_type must be one of"):
        curate([{**MATH_SOURCE, "answer_type": "fraction"}], {}, max_abs_answer=10**9)


def _roll(tok, tmp_path, row: dict, turns: list[str], reward: str = "answer", step: list | None = None) -> list[dict]:
    fn = RolloutFunc({row["problem"]: {"id": f"math_nonint-{row['id']}", "answer": row["answer"],
                                       "answer_type": "math"}},
                     RolloutConfig(max_response_tokens=200, batch_size=8), group_size=4, oversample=2,
                     mode="grpo_roc", positive_selection="inverse_prob", seed=0, out_dir=str(tmp_path),
                     reward=reward)
    if step is not None:
        step.append(fn)
    fn([row["problem"]] * 4, _fake_trainer(CyclingModel(tok, turns), tok))
    return read_jsonl(tmp_path / "rollouts.jsonl")


def test_math_rows_are_graded_symbolically_in_the_rl_step(qwen_tokenizer, tmp_path):
    """A real row whose gold is 20/3: the exact fraction (also unreduced) scores 1, near misses 0."""
    turns = [_say("\\frac{20}{3}"), _say("6.667"), _say("\\frac{40}{6}"), _say("\\frac{20}{4}")] * 2
    records = _roll(qwen_tokenizer, tmp_path, _row("\\frac{20}{3}"), turns)
    assert len(records) == 8 and {r["answer_type"] for r in records} == {"math"}
    assert {r["pred"]: r["reward"] for r in records} == {"\\frac{20}{3}": 1.0, "\\frac{40}{6}": 1.0,
                                                         "6.667": 0.0, "\\frac{20}{4}": 0.0}
    assert all((r["advantage"] > 0) == (r["reward"] > 0) for r in records if r["kept"])


def test_a_user_reward_is_what_roc_selects_on(qwen_tokenizer, tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    turns = [_say("\\frac{20}{3}"), _say("6.667"), _say("\\frac{40}{6}"), _say("\\frac{20}{4}")] * 2
    records = _roll(qwen_tokenizer, tmp_path / "out", _row("\\frac{20}{3}"), turns, reward="my_reward:near_miss")
    assert {r["pred"]: r["reward"] for r in records} == {"\\frac{20}{3}": 0.0, "\\frac{40}{6}": 0.0,
                                                         "6.667": 1.0, "\\frac{20}{4}": 0.0}
    kept_pos = [r for r in records if r["kept"] and r["advantage"] > 0]
    assert kept_pos and all(r["pred"] == "6.667" for r in kept_pos)


def test_a_reward_that_fails_on_some_answers_is_counted_and_on_every_answer_stops_the_stage(
        qwen_tokenizer, tmp_path, monkeypatch, capsys):
    """A user reward that raises scores 0, but never silently: counted per step (reward_errors), its message kept
    in the rollout record and logged; failing on every answer of a step stops the stage before its update. A numpy
    number is a number."""
    from rstar2.rl.fault_accounting import RewardFailed

    (tmp_path / "my_reward.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    turns = [_say("\\frac{20}{3}"), _say("6.667"), _say("\\frac{40}{6}"), _say("\\frac{20}{4}")] * 2
    fns: list = []
    records = _roll(qwen_tokenizer, tmp_path / "some", _row("\\frac{20}{3}"), turns, reward="my_reward:fragile",
                    step=fns)
    failed = [r for r in records if r.get("grading_error")]
    assert len(failed) == 6 and all(r["reward"] == 0.0 and r["grading_error"].startswith("KeyError") for r in failed)
    assert {r["reward"] for r in records if "grading_error" not in r} == {1.0}
    assert fns[0].pending["reward_errors"] == 6
    assert "[rl] step 1: rl.reward 'my_reward:fragile' failed on 6 of 8 graded answers (scored 0): KeyError" \
        in capsys.readouterr().out

    with pytest.raises(RewardFailed) as e:
        _roll(qwen_tokenizer, tmp_path / "all", _row("\\frac{20}{3}"), turns, reward="my_reward:raises")
    assert "step 1: rl.reward 'my_reward:raises' failed on all 8 graded answers" in str(e.value)
    assert "\n" not in str(e.value)
    (row,) = read_jsonl(tmp_path / "all" / "metrics.jsonl")
    assert row["update_skipped"] and row["reward_errors"] == 8 and row["stopped"] == str(e.value)

    records = _roll(qwen_tokenizer, tmp_path / "np", _row("\\frac{20}{3}"), turns, reward="my_reward:numpy_int")
    assert {r["pred"]: r["reward"] for r in records}["6.667"] == 1.0 and not any("grading_error" in r for r in records)


def test_a_wrong_user_reward_fails_its_check_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    row = {"id": "r1", "answer": "\\frac{20}{3}", "answer_type": "math"}
    rewards.check("answer", row)
    rewards.check("my_reward:near_miss", row)
    for spec, says in [("my_reward:two_args", "must accept (completion, answer, answer_type)"),
                       ("my_reward:says_yes", "returned 'yes', not a finite number"),
                       ("my_reward:raises", "the dry call on row 'r1' raised KeyError"),
                       ("my_reward:missing", "has no function 'missing'"),
                       ("no_such_module:f", "module 'no_such_module' cannot be imported"),
                       ("just_a_name", "expected a built-in (answer) or 'module:function'")]:
        with pytest.raises(ValueError) as e:
            rewards.check(spec, row)
        assert str(e.value).startswith(f"rl.reward {spec!r}: ") and says in str(e.value) and "\n" not in str(e.value)


def _stopping_tiny_model(path: Path) -> None:
    """The tiny random model whose turns end early (``model.tiny.stop_early``: about one token in six is <|im_end|>);
    without it every tiny-model rollout is cut at the token limit and is never graded."""
    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4,
                                                         "stop_early": True}}, path)


def test_a_tiny_rl_stage_on_a_math_source_with_a_user_reward(tmp_path, monkeypatch):
    """The RL stage end to end (tiny random model, one step): every rollout is graded as math by the user's
    reward, whose value is what rollouts.jsonl records. rl.tis is on: the step's row records it, from the hf
    engine's log-probs (tiny.yaml: bf16 decoding and bf16-autocast training on a CPU with native bf16, so the
    mismatch is bf16-sized; every loss token corrected, none near the cap)."""
    from rstar2.stages import rl

    (tmp_path / "my_reward.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    _stopping_tiny_model(tmp_path / "model")
    rows, _ = curate([MATH_SOURCE], {}, max_abs_answer=10**9, near_dedupe={"enabled": False})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    params = stage_params("rl", "stage1", overrides={"seed": 0, "rl": {
        "reward": "my_reward:by_length", "group_size": 2, "oversample": 2, "prompts_per_step": 2,
        "checkpoint_every": 0, "heldout": {"benchmark": None}, "tis": {"enabled": True, "cap": 2.0},
        "stages": {"stage1": {"max_response_tokens": 24, "max_turns": 1, "steps": 1}}}})
    rl.run(params, str(tmp_path / "model"), str(tmp_path / "train.jsonl"), str(tmp_path / "rl"))
    (row,) = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    print({k: row[k] for k in ("kept_total", "tis_enabled", "tis_clipped_share", "tis_uncorrected_tokens",
                               "train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff_max")})
    assert row["kept_total"] > 0 and row["tis_enabled"] is True and row["tis_uncorrected_tokens"] == 0
    assert row["tis_clipped_share"] == 0.0 and 0.0 <= row["train_rollout_logprob_abs_diff_max"] < 0.5
    assert json.loads((tmp_path / "rl" / "manifest.json").read_text())["vllm_batch_invariant"] is None
    records = read_jsonl(tmp_path / "rl" / "rollouts.jsonl")
    assert len(records) == 8 and {r["answer_type"] for r in records} == {"math"}
    graded = [r for r in records if not r["truncated"]]
    assert len({r["reward"] for r in graded}) == 2, "the rollouts should end early and be graded both ways"
    for r in records:
        want = 0.0 if r["truncated"] else float(len(final_turn_text(r["turns"][-1]["text"])) % 2)
        assert r["reward"] == want, r
    assert (tmp_path / "rl" / "manifest.json").exists()

    bad = {**params, "reward": "my_reward:two_args"}
    with pytest.raises(ValueError, match=r"rl.reward 'my_reward:two_args': must accept"):
        rl.run(bad, str(tmp_path / "model"), str(tmp_path / "train.jsonl"), str(tmp_path / "rl_bad"))
    assert not Path(tmp_path / "rl_bad" / "metrics.jsonl").exists()


def test_hard_problem_mining_grades_each_row_with_its_type(qwen_tokenizer, tmp_path):
    """Mining counts passes with the row's answer_type: under the integer grader no 20/3 could ever pass."""
    from rstar2.stages import hard_problems

    rows, _ = curate([MATH_SOURCE], {}, max_abs_answer=10**9, near_dedupe={"enabled": False})
    row = next(r for r in rows if r["answer"] == "\\frac{20}{3}")
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    params = stage_params("hard_problems", overrides={"hard_problems": {"k": 2, "min_passes": 0, "subset_size": 0,
                                                                        "max_response_tokens": 200}})
    model = CyclingModel(qwen_tokenizer, [_say("20/3"), _say("6.667")])
    hard_problems.run(params, "", str(tmp_path / "train.jsonl"), str(tmp_path / "hard"),
                      model_and_tokenizer=(model, qwen_tokenizer))
    (mined,) = read_jsonl(tmp_path / "hard" / "hard.jsonl")
    assert (mined["passes"], mined["k"], mined["answer_type"]) == (1, 2, "math")


def test_rl_reward_is_checked_when_the_dag_is_built(tmp_path):
    """A user reward with a wrong signature is refused by the workflow's DAG-time checks in one line naming rl.reward
    (in-process, as tests/test_workflow_refusals.py checks every refusal); a right one passes. The end-to-end run of a
    math source is tests/test_workflow.py's custom_run."""
    from conftest import copy_workflow
    from test_workflow_refusals import checked

    wd = copy_workflow(tmp_path / "wf")
    (wd / "my_reward.py").write_text(USER_REWARD)
    for spec, ok in [("my_reward:two_args", False), ("my_reward:near_miss", True)]:
        out = checked(tmp_path, f"rl: {{reward: '{spec}'}}\n", root=wd, cache=tmp_path / "checks")
        if ok:
            assert out == "", out
            continue
        assert "\n" not in out and out.startswith(f"config: rl.reward '{spec}': must accept (completion, answer, "
                                                  "answer_type)"), out


def test_a_float32_rl_stage_samples_every_step_from_the_updated_policy(tmp_path, monkeypatch):
    """Three RL steps in float32 with TRL's default optimizer (fused AdamW, which updates the weights in place
    without bumping their version counter): every step's rollouts come from the policy the trainer holds then,
    so the sampler/learner log-prob gap stays at float32 rounding on every step, not only the first. A decoding
    cache kept across the update (the packed linear weights once were) sampled steps 2 and 3 from step 1's policy."""
    from rstar2.stages import rl

    (tmp_path / "my_reward.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    _stopping_tiny_model(tmp_path / "model")
    rows, _ = curate([MATH_SOURCE], {}, max_abs_answer=10**9, near_dedupe={"enabled": False})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    params = stage_params("rl", "stage1", overrides={"seed": 0, "distributed": {"bf16": False},
                                                     "rollout": {"precision": "fp32"}, "rl": {
        "reward": "my_reward:by_length", "group_size": 2, "oversample": 2, "prompts_per_step": 2,
        "learning_rate": 1e-2, "checkpoint_every": 0, "heldout": {"benchmark": None},
        "stages": {"stage1": {"max_response_tokens": 24, "max_turns": 1, "steps": 3}}}})
    rl.run(params, str(tmp_path / "model"), str(tmp_path / "train.jsonl"), str(tmp_path / "rl"))
    rows = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    gaps = [(r["kept_total"], r["train_rollout_logprob_abs_diff"], r["train_rollout_logprob_abs_diff_max"])
            for r in rows]
    print("per step (kept, mean gap, max gap):", gaps)
    # a step without an update measures no gap; the steps after the first update sample from an updated policy
    first = next(i for i, (kept, _, _) in enumerate(gaps) if kept > 0)
    later = [top for _, _, top in gaps[first + 1:] if top is not None]
    assert len(rows) == 3 and later, gaps
    assert all(top < 1e-4 for _, _, top in gaps if top is not None), gaps
