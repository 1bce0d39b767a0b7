"""The GRPO / GRPO-RoC ablation is fair: on equal inputs both modes put the same rows into the
batch and TRL's dapo loss normalises them the same way; the old GRPO rule (equal-reward groups kept with zero
advantage) would not have."""

import math
import types

import pytest
import torch

from rstar2.rl import rollout_func
from rstar2.rl import trainer as rl_trainer
from rstar2.rl.trainer import RolloutFunc, build_batch
from rstar2.rollout import RolloutConfig, Trajectory

Q1, Q2 = "mixed rewards", "all correct"


def _traj(q, n_resp, reward, tool_at=()):
    mask = [0 if j in tool_at else 1 for j in range(n_resp)]
    calls = [{"status": "ok", "code": "print(1)", "output": "1", "duration_s": 0.0}] if tool_at else []
    return Trajectory(problem_id=q, question=q, gold="1", prompt_ids=[1, 2, 3],
                      response_ids=[10 + (7 * j + n_resp) % 50 for j in range(n_resp)], response_mask=mask,
                      turns=[{"text": "<answer>\\boxed{1}</answer>", "tool_calls": calls}], finish_reason="answer",
                      reward=reward)


DRAWN = ([_traj(Q1, 9, 1.0, (3, 4)), _traj(Q1, 5, 0.0), _traj(Q1, 12, 1.0), _traj(Q1, 7, 0.0, (2,))]
         + [_traj(Q2, n, 1.0) for n in (6, 11, 8, 10)])


@pytest.fixture(scope="module")
def tiny_trainer(tmp_path_factory):
    """A real RoCGRPOTrainer on a tiny random Qwen3: the loss path is TRL's own ``_compute_loss``."""
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2 import models

    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("t")), use_cpu=True, per_device_train_batch_size=4,
                      num_generations=4, max_steps=1, beta=0.0, entropy_coef=0.0, epsilon=0.2, epsilon_high=0.28,
                      loss_type="dapo", num_iterations=1, logging_steps=1, save_strategy="no", report_to=[],
                      learning_rate=1e-2, max_completion_length=64, disable_tqdm=True)
    tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                         train_dataset=Dataset.from_list([{"prompt": Q1}, {"prompt": Q2}]),
                                         processing_class=tok, rollout_fn=None)
    tr.current_gradient_accumulation_steps = 1  # set by the training loop; _compute_loss is called directly here
    return tr


def _loss_and_grads(tr, batch):
    tr.model.zero_grad()
    loss = tr._compute_loss(tr.model, batch)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in tr.model.parameters() if p.grad is not None]


def _rows_reaching_the_batch(mode, oversample, tok, tmp_path, monkeypatch):
    """What RolloutFunc hands RoCGRPOTrainer._prepare_inputs for one step whose rollouts are DRAWN."""
    monkeypatch.setattr(rollout_func.rollout_lib, "run_rollouts",
                        lambda model, tok, problems, cfg, **kw: [DRAWN[i] for i in range(len(problems))])
    fn = RolloutFunc({Q1: {"id": "q1", "answer": "1"}, Q2: {"id": "q2", "answer": "1"}}, RolloutConfig(),
                     group_size=4, oversample=oversample, mode=mode, positive_selection="inverse_prob", seed=0,
                     out_dir=str(tmp_path / mode))
    (tmp_path / mode).mkdir()
    fake = types.SimpleNamespace(model=types.SimpleNamespace(train=lambda: None), processing_class=tok,
                                 accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))
    trajs, adv = fn([Q1] * 4 + [Q2] * 4, fake)
    return trajs, adv, fn.pending


def test_grpo_and_roc_loss_normalisations_agree_on_equal_inputs(tiny_trainer, tmp_path, monkeypatch):
    """Same drawn rollouts (RoC drawing as many as it keeps): same rows, advantages, num_items_in_batch, loss and
    gradient in both modes; the all-correct group enters neither. Under the old GRPO rule its zero-advantage
    tokens stayed in the denominator and scaled the gradient by (mixed group's tokens / all tokens)."""
    tr, pad = tiny_trainer, tiny_trainer.processing_class.pad_token_id
    out = {}
    for mode in ("grpo", "grpo_roc"):
        trajs, adv, metrics = _rows_reaching_the_batch(mode, 1, tr.processing_class, tmp_path, monkeypatch)
        batch = build_batch(trajs, adv, pad)
        out[mode] = (trajs, adv, batch, metrics, *_loss_and_grads(tr, batch))
    (t_g, a_g, b_g, m_g, loss_g, grad_g), (t_r, a_r, b_r, m_r, loss_r, grad_r) = out["grpo"], out["grpo_roc"]
    assert [t.response_ids for t in t_g] == [t.response_ids for t in t_r] == [t.response_ids for t in DRAWN[:4]]
    assert a_g == a_r and m_g["groups_dropped"] == m_r["groups_dropped"] == 1
    n_mixed = sum(sum(t.response_mask) for t in DRAWN[:4])
    assert int(b_g["num_items_in_batch"]) == int(b_r["num_items_in_batch"]) == n_mixed
    assert loss_g == loss_r
    assert all(torch.equal(a, b) for a, b in zip(grad_g, grad_r)) and any(g.abs().sum() > 0 for g in grad_g)

    # the rule this replaces: the all-correct group in the batch with advantage 0 only dilutes the gradient
    old = build_batch(DRAWN, a_g + [0.0] * 4, pad)
    n_all = n_mixed + sum(sum(t.response_mask) for t in DRAWN[4:])
    assert int(old["num_items_in_batch"]) == n_all > n_mixed
    _, grad_old = _loss_and_grads(tr, old)
    for a, b in zip(grad_old, grad_g):
        # equal up to bf16 rounding (the batch is wider, so the kernels differ): within 2% of the largest entry,
        # where the new rule's gradient is n_all / n_mixed = 2.2 times the old one
        assert (a - b * n_mixed / n_all).abs().max() <= 0.02 * a.abs().max()
        assert (a - b).abs().max() > 0.5 * a.abs().max()


def _run(mode, seed, err_tail, length_tail, acc_end, steps=9):
    """A run whose last third (3 of 9 steps) has the given tool-error ratio of positives and length; earlier steps
    hold other values that must not reach the table; one tail step has no positive with a call (None)."""
    metrics = [{"step": s, "reward_mean": 0.1 * seed + 0.01 * s, "step_time_s": 30.0,
                "tool_error_ratio_pos": 0.9 if s <= 6 else (None if s == 8 else err_tail),
                "response_length_mean": 999.0 if s <= 6 else length_tail} for s in range(1, steps + 1)]
    heldout = [{"step": 0, "accuracy": 0.1, "accuracy_ci": [0.02, 0.18]},
               {"step": steps, "accuracy": acc_end, "accuracy_ci": [acc_end - 0.1, acc_end + 0.1]}]
    return {"mode": mode, "seed": seed, "metrics": metrics, "heldout": heldout}


def test_ablation_table_reads_per_seed_values_and_means():
    from scipy import stats

    from rstar2.report import ablation
    from rstar2.report.document import Para, Table

    errs = {"grpo": [0.30, 0.20, 0.25], "grpo_roc": [0.10, 0.08, 0.12]}
    lens = {"grpo": [200.0, 210.0, 190.0], "grpo_roc": [180.0, 170.0, 200.0]}
    accs = {"grpo": [0.40, 0.50, 0.30], "grpo_roc": [0.44, 0.46, 0.36]}
    runs = [_run(m, s, errs[m][s], lens[m][s], accs[m][s]) for m in errs for s in range(3)]
    blocks = ablation.ablation_section(runs)
    per_run, paired = [b for b in blocks if isinstance(b, Table)]
    rows = {(r[0], r[1]): r for r in per_run.rows}
    col = {h: i for i, h in enumerate(per_run.header)}
    err_col, len_col = col["tool-error ratio of positives % (last third)"], col["response tokens (last third)"]
    end_col = col["held-out acc. % at the last step [95% CI]"]
    for m in errs:
        for s in range(3):
            row = rows[(m, str(s))]
            assert row[col["steps (averaged)"]] == "9 (last 3)"
            assert row[err_col] == f"{100 * errs[m][s]:.1f}" and row[len_col] == f"{lens[m][s]:.0f}"
            assert row[end_col] == f"{100 * accs[m][s]:.1f} [{100 * accs[m][s] - 10:.1f}, {100 * accs[m][s] + 10:.1f}]"

        def t_interval(xs, scale, digits, low=-math.inf):
            mean, h = sum(xs) / 3, stats.t.ppf(0.975, 2) * stats.tstd(xs) / 3 ** 0.5
            return f"{scale * mean:.{digits}f} [{scale * max(low, mean - h):.{digits}f}, {scale * (mean + h):.{digits}f}]"
        mean_row = rows[(f"**{m} mean**", "3 seeds")]
        assert mean_row[err_col] == t_interval(errs[m], 100, 1, low=0.0)   # a ratio's interval stops at 0
        assert mean_row[len_col] == t_interval(lens[m], 1, 0)
        assert mean_row[end_col] == t_interval(accs[m], 100, 1, low=0.0)
    # paired table: RoC - GRPO per seed, then the mean difference with its interval
    d_err = [100 * (r - g) for r, g in zip(errs["grpo_roc"], errs["grpo"])]
    assert [r[1] for r in paired.rows[:3]] == [f"{d:+.1f}" for d in d_err]
    assert [r[2] for r in paired.rows[:3]] == [f"{r - g:+.0f}" for r, g in zip(lens["grpo_roc"], lens["grpo"])]
    h = stats.t.ppf(0.975, 2) * stats.tstd(d_err) / 3 ** 0.5
    m = sum(d_err) / 3
    assert paired.rows[3][1] == f"{m:+.1f} [{m - h:+.1f}, {m + h:+.1f}]"
    verdict = next(b.text for b in blocks if isinstance(b, Para) and "seed pairs" in b.text)
    assert "lower than GRPO's in 3 of 3 seed pairs" in verdict and "excludes 0" in verdict


def test_ablation_summary_counts_kept_positives_with_failed_calls_and_writes_the_reports_section(tmp_path):
    """benchmarks/ablation_summary.py, the source of docs/measurements/ablation.md: positives that entered the loss
    and how many hold a failed call, read from rollouts.jsonl; the report's section and figure from the folders."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ablation_summary", Path(__file__).resolve().parents[1] / "benchmarks" / "ablation_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)

    def call(status):
        return {"code": "print(1)", "status": status, "output": ""}
    for mode, recs in {"grpo_roc": [(True, 1.0, ["ok"]), (True, 1.0, ["error", "ok"]), (False, 1.0, ["error"]),
                                    (True, 0.0, ["error"])],
                       "grpo": [(True, 1.0, ["timeout"]), (True, 1.0, [])]}.items():
        d = tmp_path / f"{mode}-seed0"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": s, "reward_mean": 0.5, "tool_error_ratio_pos": e, "response_length_mean": 100.0,
             "step_time_s": 10.0}) + "\n" for s, e in ((1, 0.5), (2, 0.1), (3, None))))
        (d / "heldout.jsonl").write_text(json.dumps({"step": 0, "accuracy": 0.1, "n": 10}) + "\n")
        (d / "rollouts.jsonl").write_text("".join(json.dumps(
            {"step": 1, "kept": k, "reward": r, "turns": [{"text": "", "tool_calls": [call(c) for c in cs]}]}) + "\n"
            for k, r, cs in recs))
    out = summary.main([f"grpo_roc={tmp_path / 'grpo_roc-seed0'}", f"grpo={tmp_path / 'grpo-seed0'}",
                        "--markdown", str(tmp_path / "a.md"), "--plot", str(tmp_path / "a.png")])
    roc, grpo = out["grpo_roc"]["runs"][0], out["grpo"]["runs"][0]
    assert (roc["kept_positives"], roc["kept_positives_failed_call"]) == (2, 1)
    assert (grpo["kept_positives"], grpo["kept_positives_failed_call"]) == (2, 1)
    assert roc["err_all_steps"] == pytest.approx(0.3)   # steps with a value only
    md = (tmp_path / "a.md").read_text()
    assert "| grpo_roc | 0 |" in md and "RoC − GRPO" in md
    assert (tmp_path / "a.png").stat().st_size > 0
