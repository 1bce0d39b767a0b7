"""The RL step around TRL: rollouts -> RoC -> batch -> TRL loss; token-level loss weights (handed cases R02,
R03), metrics, and a step with no surviving group (no update)."""

import json
import random
import types

import pytest
import torch

from rstar2 import chat
from rstar2 import rollout as rollout_lib
from rstar2.rl import trainer as rl_trainer
from rstar2.rl.trainer import PenaltyConfig, RolloutFunc, build_batch, step_metrics, trajectory_penalties
from rstar2.rollout import RolloutConfig, Trajectory

REQUIRED_KEYS = {"reward_mean", "accuracy", "response_length_mean", "response_length_max", "tool_calls_per_traj",
                 "tool_error_ratio", "tool_error_ratio_pos", "format_penalty_mean", "truncation_ratio",
                 "all_correct_frac", "all_wrong_frac", "kept_pos", "kept_neg", "tool_error_ratio_pos_kept",
                 "groups_dropped"}


class CyclingModel:
    """Emits scripted turns in a fixed cycle so a group holds both correct and wrong trajectories."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.n = tok, turns, 0
        self.training = True

    def eval(self):
        return self

    def train(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        rows = []
        for _ in range(input_ids.shape[0]):
            rows.append(self.tok.encode(self.turns[self.n % len(self.turns)], add_special_tokens=False))
            self.n += 1
        width = max(map(len, rows))
        rows = [r + [self.tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)


CALL = "Compute.</reason>\n" + chat.tool_call_text("print(6*7)") + "<|im_end|>"
BAD_CALL = "Compute.</reason>\n" + chat.tool_call_text("print(x)") + "<|im_end|>"
RIGHT = "It is 42.</reason>\n<answer>\\boxed{42}</answer><|im_end|>"
WRONG = "It is 41.</reason>\n<answer>\\boxed{41}</answer><|im_end|>"
Q = "What is 6 times 7?"


def _fake_trainer(model, tok):
    return types.SimpleNamespace(model=model, processing_class=tok,
                                 accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))


def test_rollout_func_oversamples_selects_and_masks(qwen_tokenizer, tmp_path):
    tok = qwen_tokenizer
    model = CyclingModel(tok, [RIGHT, WRONG, WRONG, CALL, RIGHT, WRONG, RIGHT, WRONG])
    fn = RolloutFunc({Q: {"id": "p1", "answer": "42"}}, RolloutConfig(max_response_tokens=200, batch_size=8),
                     group_size=4, oversample=2, mode="grpo_roc", positive_selection="inverse_prob", seed=0,
                     out_dir=str(tmp_path))
    trajs, adv = fn([Q] * 4, _fake_trainer(model, tok))
    assert len(trajs) == 4 == len(adv)
    assert REQUIRED_KEYS <= set(fn.pending)
    assert fn.pending["kept_pos"] + fn.pending["kept_neg"] == 4 and fn.pending["groups_dropped"] == 0
    rewards = [t.reward for t in trajs]
    assert 0 < sum(rewards) < 4   # mixed group: both kinds kept
    for t, a in zip(trajs, adv):
        assert (a > 0) == (t.reward > 0)
        masked = tok.decode([i for i, m in zip(t.response_ids, t.response_mask) if not m])
        assert "<tool_response>" not in tok.decode([i for i, m in zip(t.response_ids, t.response_mask) if m])
        if masked:
            assert masked.startswith("\n<|im_start|>user\n<tool_response>")
    records = [json.loads(r) for r in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 8 and sum(r["kept"] for r in records) == 4
    assert all((r["advantage"] is None) != r["kept"] for r in records)
    assert all(r["penalty"] == pytest.approx(r["p_err"] + r["p_format"]) for r in records)


def test_all_equal_group_leaves_the_update(qwen_tokenizer, tmp_path):
    tok = qwen_tokenizer
    fn = RolloutFunc({Q: {"id": "p1", "answer": "42"}}, RolloutConfig(max_response_tokens=200, batch_size=8),
                     group_size=2, oversample=2, mode="grpo_roc", positive_selection="topk", seed=0,
                     out_dir=str(tmp_path))
    trajs, adv = fn([Q] * 2, _fake_trainer(CyclingModel(tok, [WRONG]), tok))
    assert trajs == [] and adv == []
    assert fn.pending["groups_dropped"] == 1 and fn.pending["all_wrong_frac"] == 1.0
    assert fn.pending["kept_total"] == 0 and fn.pending["tool_error_ratio_pos"] is None


def test_penalties_from_real_trajectories_status_and_substring(qwen_tokenizer, tmp_path):
    """A failing call ('print(x)' -> NameError) counts as an error under both definitions."""
    tok = qwen_tokenizer
    # the rollout layer directly: a group of one has equal rewards, so RolloutFunc would drop it
    (t,) = rollout_lib.run_rollouts(CyclingModel(tok, [BAD_CALL, CALL, RIGHT]), tok,
                                    [{"id": "p1", "problem": Q, "answer": "42"}],
                                    RolloutConfig(max_response_tokens=300, batch_size=1), answer_type="integer")
    assert [c["status"] for c in t.tool_calls] == ["error", "ok"] and t.reward == 1.0
    texts = rl_trainer.tool_response_texts(t, tok)
    assert len(texts) == 2 and "NameError" in texts[0] and "42" in texts[1]
    assert trajectory_penalties(t, tok, PenaltyConfig("status", "paper")) == (0.5, 0.0)
    assert trajectory_penalties(t, tok, PenaltyConfig("substring", "paper")) == (0.5, 0.0)
    assert trajectory_penalties(t, tok, PenaltyConfig("status", "released")) == (0.5, 0.0)  # 2 later turns


def _traj(prompt, resp, mask, reward):
    return Trajectory(problem_id="p", question="q", gold="1", prompt_ids=prompt, response_ids=resp,
                      response_mask=mask, turns=[{"text": "", "tool_calls": []}], finish_reason="answer",
                      reward=reward)


@pytest.fixture(scope="module")
def tiny_trainer(qwen_tokenizer, tmp_path_factory):
    """A real RoCGRPOTrainer on a tiny random Qwen3 (the loss path is TRL's own)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2 import models

    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("t")), use_cpu=True, per_device_train_batch_size=2,
                      num_generations=2, max_steps=2, beta=0.0, entropy_coef=0.0, epsilon=0.2, epsilon_high=0.28,
                      loss_type="dapo", num_iterations=1, logging_steps=1, save_strategy="no", report_to=[],
                      learning_rate=1e-2, max_completion_length=64, disable_tqdm=True)
    tr = make_tiny(model, tok, args, Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]))
    tr.current_gradient_accumulation_steps = 1  # set by the training loop; _compute_loss is called directly here
    return tr


def make_tiny(model, tok, args, dataset, rollout_fn=None, callbacks=None, micro_batch_tokens=4096):
    return rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                           train_dataset=dataset, processing_class=tok,
                                           rollout_fn=rollout_fn, callbacks=callbacks,
                                           micro_batch_tokens=micro_batch_tokens)


def test_token_loss_weights_are_the_advantage_on_generated_tokens_only(tiny_trainer):
    """Handed cases R02/R03, token by token through TRL's _compute_loss: d loss / d logp_t = -A_i / N on
    every generated token of trajectory i (the final EOS included), 0 on tool-response tokens and padding,
    and a zero-length response gets no weight anywhere (never a write at the last padded slot)."""
    tr = tiny_trainer
    eos = pad = 7  # pad == eos: masks must come from lengths, not from token ids
    t1 = _traj([1, 2, 3], [10, 11, 12, 90, 91, 92, 13, 14, eos], [1, 1, 1, 0, 0, 0, 1, 1, 1], 1.0)
    t2 = _traj([4, 5], [20, 21, 22, 23, eos], [1, 1, 1, 1, 1], 0.0)
    t3 = _traj([6], [], [], 0.0)  # zero-length response
    adv = [1.5, -0.5, -0.5]
    batch = build_batch([t1, t2, t3], adv, pad)
    assert batch["completion_mask"].tolist()[0] == [1] * 9 and batch["completion_mask"].tolist()[2] == [0] * 9
    assert batch["prompt_mask"].tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    n_tokens = 6 + 5
    assert int(batch["num_items_in_batch"]) == n_tokens
    B, C = batch["completion_ids"].shape
    logps = torch.zeros(B, C, requires_grad=True)
    orig = tr._get_per_token_logps_and_entropies
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros(B, C), None)
    try:
        loss = tr._compute_loss(tr.model, batch)
    finally:
        tr._get_per_token_logps_and_entropies = orig
    loss.backward()
    weights = (-logps.grad * n_tokens).tolist()
    loss_mask = (batch["completion_mask"] * batch["tool_mask"]).tolist()
    for i in range(B):
        for j in range(C):
            expected = adv[i] if loss_mask[i][j] else 0.0
            assert weights[i][j] == pytest.approx(expected, abs=1e-6), (i, j)
    assert weights[0][8] == pytest.approx(1.5)           # the EOS is trained on
    assert weights[0][3:6] == [0.0, 0.0, 0.0]            # tool response tokens: zero weight
    assert weights[2] == [0.0] * C


def test_tool_tokens_do_not_change_loss_or_gradient_with_the_real_model(tiny_trainer):
    """R03 with the real forward pass: perturbing the log-probs at the tool-response positions (the handed
    case's "change logits only at positions 3-5") changes neither the loss nor any parameter gradient."""
    tr = tiny_trainer
    t1 = _traj([1, 2, 3], [10, 11, 12, 90, 91, 92, 13, 14, 7], [1, 1, 1, 0, 0, 0, 1, 1, 1], 1.0)
    t2 = _traj([4, 5], [20, 21, 22, 23, 7], [1, 1, 1, 1, 1], 0.0)
    batch = build_batch([t1, t2], [0.7, -0.7], 7)
    orig = tr._get_per_token_logps_and_entropies
    results = []
    for noise in (0.0, 5.0):
        def perturbed(*a, _noise=noise, **k):
            logps, ent, aux = orig(*a, **k)
            return logps + _noise * (1 - batch["tool_mask"]) * batch["completion_mask"], ent, aux
        tr.model.zero_grad()
        tr._get_per_token_logps_and_entropies = perturbed
        try:
            loss = tr._compute_loss(tr.model, batch)
        finally:
            tr._get_per_token_logps_and_entropies = orig
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in tr.model.parameters() if p.grad is not None]))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    assert any(g.abs().sum() > 0 for g in results[0][1])


def test_build_batch_rejects_a_shifted_mask():
    with pytest.raises(ValueError, match="response_mask has 2 entries but response_ids 3"):
        build_batch([_traj([1], [1, 2, 3], [1, 1], 1.0)], [1.0], 0)


class _ScriptedRollouts:
    """Step 1: every group removed (no data); step 2: one kept pair with advantages +-1."""
    G = 2

    def __init__(self):
        self.step, self.pending, self.last_results = 0, None, []

    def set_process(self, index, count):
        assert (index, count) == (0, 1)

    def __call__(self, prompts, trainer, engines=None):
        self.step += 1
        if self.step == 1:
            self.pending = {"kept_total": 0, "reward_mean": 0.0, "groups": 1, "groups_dropped": 1,
                            "tool_calls_per_traj": 0.0, "response_length_mean": 5.0}
            return [], []
        self.pending = {"kept_total": 2, "reward_mean": 0.5, "groups": 1, "groups_dropped": 0,
                        "tool_calls_per_traj": 0.0, "response_length_mean": 5.0}
        return ([_traj([1, 2], [10, 11, 12, 7], [1, 1, 1, 1], 1.0), _traj([1, 2], [20, 21, 7], [1, 1, 1], 0.0)],
                [1.0, -1.0])

    def state_dict(self):
        return {"step": self.step}


def test_step_without_groups_skips_the_update(qwen_tokenizer, tmp_path):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from rstar2 import models

    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    snapshots = []

    class Snap(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            snapshots.append(([p.detach().clone() for p in model.parameters()], len(optimizer.state)))

    fn = _ScriptedRollouts()
    args = GRPOConfig(output_dir=str(tmp_path / "t"), use_cpu=True, per_device_train_batch_size=2,
                      num_generations=2, max_steps=2, beta=0.0, entropy_coef=0.0, loss_type="dapo",
                      logging_steps=1, save_strategy="no", report_to=[], learning_rate=1e-2, weight_decay=0.01,
                      max_completion_length=64, disable_tqdm=True)
    before = [p.detach().clone() for p in model.parameters()]
    tr = make_tiny(model, tok, args, Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]), fn,
                   [Snap(), rl_trainer.make_metrics_callback(fn, str(tmp_path / "metrics.jsonl"),
                                                             str(tmp_path / "tb"))])
    tr.train()
    (after1, opt_state1), (after2, _) = snapshots
    assert all(torch.equal(a, b) for a, b in zip(before, after1)) and opt_state1 == 0   # no update at all
    assert any(not torch.equal(a, b) for a, b in zip(after1, after2))                  # a real step moves
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["update_skipped"] and rows[0]["loss"] is None and rows[0]["grad_norm"] is None
    assert [r["micro_batches"] for r in rows] == [0, 1]   # no forward pass at all on the skipped step
    assert not rows[1]["update_skipped"] and rows[1]["loss"] is not None
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


def test_step_metrics_keys_and_values():
    def t(reward, statuses, truncated=False):
        return types.SimpleNamespace(reward=reward, tool_calls=[{"status": s} for s in statuses],
                                     response_ids=[0] * 10, response_mask=[1] * 8 + [0] * 2,
                                     truncated=truncated)
    res = [rl_trainer.GroupResult([t(1, ["ok", "error"]), t(1, ["ok"]), t(0, [], True), t(0, ["timeout"])],
                                  [(0.5, 0.0), (0.0, 0.0), (0.5, 1.0), (1.0, 0.0)], [1, 2], [0.7, -0.7], False),
           rl_trainer.GroupResult([t(1, [])] * 4, [(0.5, 0.0)] * 4, [], [], True)]
    m = step_metrics(res)
    assert REQUIRED_KEYS <= set(m)
    assert m["tool_error_ratio"] == pytest.approx(2 / 4)
    assert m["tool_error_ratio_pos"] == pytest.approx(1 / 3) and m["tool_error_ratio_pos_kept"] == 0.0
    assert m["all_correct_frac"] == 0.5 and m["all_wrong_frac"] == 0.0 and m["groups_dropped"] == 1
    assert (m["kept_pos"], m["kept_neg"], m["kept_total"], m["loss_tokens"]) == (1, 1, 2, 16)
    assert m["truncation_ratio"] == 1 / 8 and m["accuracy"] == 6 / 8
    assert m["penalty_pos_kept_mean"] == 0.0 and m["penalty_pos_mean"] == pytest.approx((0.5 + 0 + 4 * 0.5) / 6)


def test_rollout_state_is_the_step_and_streams_derive_from_seed_and_step(monkeypatch):
    """A resumed stage restores only the step counter; each step's sampling seed and RoC selection
    stream derive from (seed, step), so they need no saved RNG state, and differ between steps and seeds."""
    fn = RolloutFunc({}, RolloutConfig(), 2, 2, "grpo_roc", "topk", 3, "/nonexistent")
    fn.step = 5
    state = json.loads(json.dumps(fn.state_dict()))
    assert state == {"step": 5}
    other = RolloutFunc({}, RolloutConfig(), 2, 2, "grpo_roc", "topk", 3, "/nonexistent")
    other.load_state_dict(state)
    assert other.step == 5
    from rstar2 import seeds
    assert seeds.derive(3, "rollout", 6) == seeds.derive(3, "rollout", 6)
    assert len({seeds.derive(3, "rollout", 6), seeds.derive(3, "rollout", 7), seeds.derive(4, "rollout", 6),
                seeds.derive(3, "select", 6)}) == 4


class _FixedRollouts:
    """Returns the same kept trajectories every step (varied prompt and response lengths, tool spans masked)."""
    G = 2

    def __init__(self, trajs, advantages):
        self.trajs, self.advantages = trajs, advantages
        self.pending, self.last_results = None, []

    def set_process(self, index, count):
        pass

    def __call__(self, prompts, trainer, engines=None):
        self.pending = {"kept_total": len(self.trajs)}
        return self.trajs, self.advantages

    def state_dict(self):
        return {}


def _varied_trajectories(n, seed):
    g = torch.Generator().manual_seed(seed)
    trajs, adv = [], []
    for i in range(n):
        p, c = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 24, (1,), generator=g))
        mask = [1] * c
        if c > 6:  # a tool response in the middle: context, zero loss weight
            mask[2:5] = [0, 0, 0]
        trajs.append(_traj(torch.randint(100, 900, (p,), generator=g).tolist(),
                           torch.randint(100, 900, (c,), generator=g).tolist(), mask, float(i % 2)))
        adv.append(float(torch.randn((), generator=g)))
    return trajs, adv


def test_micro_batched_step_gradient_equals_the_single_pass_gradient(qwen_tokenizer, tmp_path):
    """One RL step through RoCGRPOTrainer.training_step with a small micro-batch budget (several micro-batches,
    gradients accumulated, each normalised by the whole step's token count) gives the gradient of one pass over
    the whole batch through TRL's loss: equal to float32 rounding (|diff| <= 1e-6 + 1e-5 |g|; bf16 off, since
    GRPOConfig turns bf16 autocast on by default and bf16 sums in another order differ by ~0.3%)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2 import models

    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4)
    trajs, adv = _varied_trajectories(12, seed=0)
    fn = _FixedRollouts(trajs, adv)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      per_device_train_batch_size=2, num_generations=2, max_steps=1, beta=0.0, entropy_coef=0.0, loss_type="dapo", logging_steps=1,
                      save_strategy="no", report_to=[], max_completion_length=64, disable_tqdm=True)
    tr = make_tiny(model, tok, args, Dataset.from_list([{"prompt": "a"}]), fn, micro_batch_tokens=64)
    tr.current_gradient_accumulation_steps = 1
    model.train()

    batch = build_batch(trajs, adv, tok.pad_token_id)
    model.zero_grad()
    single_loss = tr.compute_loss(model, batch)
    single_loss.backward()
    single = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    loss = tr.training_step(model, [{"prompt": "a"}] * 2)
    micro = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    assert fn.pending["micro_batches"] >= 4, fn.pending   # 12 rows of up to 29 tokens in 64-token micro-batches
    assert loss.item() == pytest.approx(single_loss.item(), rel=1e-5, abs=1e-7)
    assert single.keys() == micro.keys() and any(g.abs().sum() > 0 for g in single.values())
    for name, g in single.items():
        assert torch.allclose(micro[name], g, rtol=1e-5, atol=1e-6), (name, (micro[name] - g).abs().max())


def test_micro_batch_plan_covers_every_row_once_within_the_budget():
    """Three processes with different row counts and lengths: every micro-batch has the same row count on each
    process, each row appears exactly once, and the padded size stays within the budget unless one row alone
    exceeds it (then it runs alone)."""
    from rstar2.rl.batch import padded_tokens, plan_micro_batches

    g = random.Random(0)
    shapes = [[(g.randint(1, 40), g.randint(1, 300)) for _ in range(n)] for n in (37, 5, 0)]
    shapes[1].append((10, 900))  # alone over the budget
    budget = 700
    plan, oversize = plan_micro_batches(shapes, budget)
    assert oversize == 1
    for p, rows in enumerate(shapes):
        seen = [i for mb in plan for i in mb[p] if i >= 0]
        assert sorted(seen) == list(range(len(rows))), p
    for mb in plan:
        assert len({len(col) for col in mb}) == 1
        for p, col in enumerate(mb):
            real = [shapes[p][i] for i in col if i >= 0]
            width = max([1] + [a for a, _ in real]) + max([1] + [b for _, b in real])
            assert len(col) * width <= budget or (len(col) == 1 and padded_tokens(real) > budget)
    # longest rows first and as few micro-batches as the longest process needs: not one row per micro-batch
    assert len(plan) < 37
