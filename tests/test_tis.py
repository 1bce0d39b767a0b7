"""Truncated importance sampling (rstar2/rl/tis.py, rl.tis): the weights, the loss gradient through TRL's
``_compute_loss`` token by token, and whole RoCGRPOTrainer steps: an exact float32 sampler leaves the loss as it
is, a perturbed one changes it by exactly min(exp(logp_learner - logp_sampler), C) per token."""

import copy
import math

import pytest
import torch
from test_logprob_gap import _Fixed, exact_sampler_trajectories

from rstar2.rl.batch import build_batch
from rstar2.rl.tis import TISConfig, TISStats, tis_weights, weighted_advantages
from rstar2.rollout import Trajectory


def _close(x: torch.Tensor, expected, atol=1e-6) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=atol)


def test_weights_are_the_ratio_capped_on_loss_tokens_only():
    learner = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, -3.5], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w, clipped, count = tis_weights(learner, sampler, mask, cap=2.0)
    expected = [[math.exp(0.5), math.exp(-1.0), 2.0], [1.0, 1.0, 1.0]]  # e^3 > 2: capped; masked: 1
    assert _close(w, expected)
    assert (clipped, count) == (1, 4)
    assert _close(weighted_advantages(torch.tensor([2.0, -1.0]), w),
                  [[2 * math.exp(0.5), 2 * math.exp(-1.0), 4.0], [-1.0, -1.0, -1.0]])
    with pytest.raises(ValueError, match="cap"):
        tis_weights(learner, sampler, mask, cap=0.0)


def test_stats_row_off_on_and_without_sampler_logprobs():
    assert TISStats(None).row() == {"tis_enabled": False, "tis_clipped_share": None, "tis_uncorrected_tokens": None}
    off = TISStats(TISConfig(enabled=False, cap=2.0))
    inputs = {"advantages": torch.tensor([1.0]), "completion_mask": torch.ones(1, 2), "tool_mask": torch.ones(1, 2),
              "rollout_logps": torch.tensor([[-5.0, -5.0]])}
    off.apply(inputs, torch.zeros(1, 2))
    assert inputs["advantages"].tolist() == [1.0] and off.row()["tis_enabled"] is False
    on = TISStats(TISConfig(enabled=True, cap=2.0))
    on.apply(inputs, torch.tensor([[-4.0, -6.0]]))       # ratios e^1 (capped), e^-1
    on.apply({**inputs, "rollout_logps": None}, torch.zeros(1, 2))  # a micro-batch without sampler log-probs
    assert _close(inputs["advantages"], [[2.0, math.exp(-1.0)]])
    assert on.row() == {"tis_enabled": True, "tis_clipped_share": 0.5, "tis_uncorrected_tokens": 2}


def _traj(prompt, response, mask, lps=None):
    return Trajectory("p", "q", None, prompt_ids=prompt, response_ids=response, response_mask=mask,
                      response_logprobs=lps)


def test_loss_gradient_per_token_is_the_weighted_advantage(monkeypatch, qwen_tokenizer, tmp_path):
    """Through TRL's _compute_loss with injected learner log-probs 0: d loss / d logp_t = -A_i w_t / N with
    w_t = min(exp(0 - logp_sampler_t), C) on loss tokens, 0 on the tool response (by hand below)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rstar2 import models
    from rstar2.rl import trainer as rl_trainer

    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      max_steps=1, beta=0.0, loss_type="dapo", save_strategy="no", report_to=[],
                      max_completion_length=16, disable_tqdm=True)
    tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                         train_dataset=Dataset.from_list([{"prompt": "a"}]), processing_class=tok,
                                         rollout_fn=None, tis=TISConfig(enabled=True, cap=3.0))
    tr.current_gradient_accumulation_steps = 1
    sampler = [[-0.5, 0.3, 0.0, -2.0], [-0.1, -1.5, 0.0, 0.0]]  # t1's third token is a tool token
    t1 = _traj([1, 2], [10, 11, 90, 12], [1, 1, 0, 1], sampler[0])
    t2 = _traj([3], [20, 21], [1, 1], sampler[1][:2])
    adv = [1.5, -0.5]
    batch = build_batch([t1, t2], adv, pad_id=0)
    B, C = batch["completion_ids"].shape
    logps = torch.zeros(B, C, requires_grad=True)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies",
                        lambda self, *a, **k: (logps, torch.zeros(B, C), None))
    loss = tr.compute_loss(tr.model, batch)
    loss.backward()
    n = 5
    w = [[math.exp(0.5), math.exp(-0.3), 0.0, 3.0], [math.exp(0.1), 3.0, 0.0, 0.0]]  # e^2, e^1.5 > 3: capped
    expected = [[-adv[i] * w[i][j] / n for j in range(C)] for i in range(B)]
    assert _close(logps.grad, expected, atol=1e-7)
    assert loss.item() == pytest.approx(-sum(adv[i] * w[i][j] for i in range(B) for j in range(C)) / n, abs=1e-6)
    assert tr._tis.row() == {"tis_enabled": True, "tis_clipped_share": 0.4, "tis_uncorrected_tokens": 0}


def test_trainer_step_exact_sampler_leaves_the_loss_and_perturbed_one_changes_it_as_defined(tmp_path):
    """Whole training steps (several micro-batches) on one tiny float32 model. Sampler log-probs are the policy's own
    from a plain float32 forward pass (what the hf engine samples from in float32): TIS on gives the loss of TIS
    off. Then the sampler's log-prob of every loss token is moved by a known delta_t (sampler = learner - delta_t),
    so the step's loss must be -sum_t A_t min(exp(delta_t), C) / N (ratio 1 in the dapo surrogate), by hand."""
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2.rl import trainer as rl_trainer

    model, tok, trajs = exact_sampler_trajectories()
    deltas = [0.5, -0.7, 2.0, 0.2]   # cycled over the step's loss tokens; e^2 > C = 3 is capped
    cap = 3.0
    shifted = copy.deepcopy(trajs)
    expected_on, expected_off, n, clipped = 0.0, 0.0, 0, 0
    for i, t in enumerate(shifted):
        adv = 1.0 if i % 2 else -1.0
        for j, m in enumerate(t.response_mask):
            if m:
                d = deltas[n % len(deltas)]
                t.response_logprobs[j] -= d
                expected_on -= adv * min(math.exp(d), cap)
                expected_off -= adv
                n, clipped = n + 1, clipped + (math.exp(d) > cap)
    expected_on, expected_off = expected_on / n, expected_off / n

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, beta=0.0, loss_type="dapo", save_strategy="no",
                      report_to=[], max_completion_length=16, disable_tqdm=True, temperature=1.0)
    state = copy.deepcopy(model.state_dict())
    results = {}
    for name, rollouts, tis in (("off", trajs, None), ("exact", trajs, TISConfig(True, cap)),
                                ("shifted", shifted, TISConfig(True, cap))):
        model.load_state_dict(state)
        fn = _Fixed(rollouts)
        tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                             train_dataset=Dataset.from_list([{"prompt": "a"}]),
                                             processing_class=tok, rollout_fn=fn, micro_batch_tokens=40, tis=tis)
        tr.current_gradient_accumulation_steps = 1
        model.train()
        model.zero_grad()
        loss = tr.training_step(model, [{"prompt": "a"}] * 2).item()
        assert fn.pending["micro_batches"] >= 2
        results[name] = (loss, fn.pending)
    print({k: (v[0], v[1]["tis_clipped_share"], v[1]["train_rollout_logprob_abs_diff"]) for k, v in results.items()},
          "expected", expected_off, expected_on)
    assert results["off"][0] == pytest.approx(expected_off, abs=1e-6)
    assert results["off"][1]["tis_enabled"] is False and results["off"][1]["tis_clipped_share"] is None
    assert results["exact"][1]["train_rollout_logprob_abs_diff"] < 1e-5
    assert results["exact"][0] == pytest.approx(results["off"][0], abs=1e-5)
    assert results["exact"][1]["tis_enabled"] is True and results["exact"][1]["tis_clipped_share"] == 0.0
    assert results["shifted"][0] == pytest.approx(expected_on, abs=1e-4)
    assert abs(expected_on - expected_off) > 100 * 1e-4   # the perturbation matters at this tolerance
    assert results["shifted"][1]["tis_clipped_share"] == pytest.approx(clipped / n)


def test_hf_engine_float32_logprobs_match_the_trainer_and_tis_leaves_the_step_unchanged(tmp_path):
    """Real rollouts of the hf engine (``HFEngine`` through ``run_rollouts``, float32, KV reuse) carry the sampled
    tokens' log-probabilities; one RoCGRPOTrainer step on them records a mismatch of ~0, and TIS on gives the loss
    and the gradient of TIS off (all ratios ~1, none capped)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2 import models
    from rstar2.rl import trainer as rl_trainer
    from rstar2.rollout import RolloutConfig, run_rollouts

    torch.manual_seed(0)
    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    cfg = RolloutConfig(max_response_tokens=12, max_turns=1, temperature=1.0, precision="fp32")
    problems = [{"id": f"p{i // 2}", "problem": f"What is {i // 2} plus 1?"} for i in range(4)]
    trajs = run_rollouts(model, tok, problems, cfg, tools=object(), seed=5)
    assert all(t.response_logprobs and len(t.response_logprobs) == len(t.response_ids) for t in trajs)

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, beta=0.0, loss_type="dapo", save_strategy="no",
                      report_to=[], max_completion_length=16, disable_tqdm=True, temperature=1.0)
    state = copy.deepcopy(model.state_dict())
    results = []
    for tis in (None, TISConfig(True, 2.0)):
        model.load_state_dict(state)
        fn = _Fixed(trajs)
        tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                             train_dataset=Dataset.from_list([{"prompt": "a"}]),
                                             processing_class=tok, rollout_fn=fn, micro_batch_tokens=4096, tis=tis)
        tr.current_gradient_accumulation_steps = 1
        model.train()
        model.zero_grad()
        loss = tr.training_step(model, [{"prompt": "a"}] * 2).item()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((loss, grads, fn.pending))
    (loss_off, g_off, row_off), (loss_on, g_on, row_on) = results
    print(f"hf engine fp32: mismatch {row_on['train_rollout_logprob_abs_diff']:.2e} "
          f"(max {row_on['train_rollout_logprob_abs_diff_max']:.2e}); loss off {loss_off:.8f} on {loss_on:.8f}")
    assert row_on["train_rollout_logprob_abs_diff_max"] < 1e-4
    assert row_on["tis_clipped_share"] == 0.0 and row_on["tis_uncorrected_tokens"] == 0
    assert loss_on == pytest.approx(loss_off, abs=1e-5)
    assert torch.allclose(g_on, g_off, rtol=1e-4, atol=1e-7) and g_off.abs().sum() > 0
