"""The sampler/learner log-prob mismatch of an RL step (rstar2/rl/logprob_gap.py): the arithmetic over loss tokens
and micro-batches and processes, and the engines' log-probabilities carried into the training batch."""

import math

import pytest
import torch

from rstar2.rl.batch import PaddingRow, build_batch
from rstar2.rl.logprob_gap import LogprobGap, sampler_logps
from rstar2.rollout import Trajectory


def _traj(ids, mask, lps):
    return Trajectory("p", "q", None, prompt_ids=[1, 2], response_ids=ids, response_mask=mask, response_logprobs=lps)


def test_mean_and_max_over_loss_tokens_of_every_micro_batch():
    gap = LogprobGap()
    learner = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, 0.0]])
    sampler = torch.tensor([[-1.5, -2.0, 0.0], [-0.25, -1.0, -7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])        # tool tokens and padding (0) are not compared
    gap.add(learner, sampler, mask)
    gap.add(torch.tensor([[-4.0]]), torch.tensor([[-3.0]]), torch.tensor([[1]]))  # a second micro-batch
    row = gap.row()
    assert row["train_rollout_logprob_abs_diff"] == pytest.approx((0.5 + 0.0 + 0.25 + 1.0) / 4)
    assert row["train_rollout_logprob_abs_diff_max"] == pytest.approx(1.0)
    gap.reset()
    assert gap.row() == {"train_rollout_logprob_abs_diff": None, "train_rollout_logprob_abs_diff_max": None}


def test_a_micro_batch_without_sampler_logprobs_leaves_the_step_undefined():
    gap = LogprobGap()
    gap.add(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    gap.add(torch.zeros(1, 2), None, torch.ones(1, 2))
    assert gap.row()["train_rollout_logprob_abs_diff"] is None


def test_processes_are_combined_token_weighted():
    a, b = LogprobGap(), LogprobGap()
    a.add(torch.tensor([[0.0]]), torch.tensor([[-3.0]]), torch.tensor([[1]]))            # 1 token, |d| 3
    b.add(torch.zeros(1, 3), torch.full((1, 3), -1.0), torch.ones(1, 3))                 # 3 tokens, |d| 1
    every = [a, b]

    def gather(x):  # what accelerator.gather returns: both processes' stats, concatenated
        return torch.cat([torch.tensor([g.total, float(g.count), g.max, float(g.missing)], dtype=torch.float64)
                          for g in every])
    row = a.row(gather)
    assert row["train_rollout_logprob_abs_diff"] == pytest.approx(6 / 4)
    assert row["train_rollout_logprob_abs_diff_max"] == pytest.approx(3.0)


def test_batch_carries_the_engines_logprobs_aligned_with_the_completion():
    t1 = _traj([5, 6, 7], [1, 0, 1], [-0.5, 0.0, -1.5])
    t2 = _traj([8], [1], [-2.0])
    batch = build_batch([t1, t2, PaddingRow(0)], [1.0, -1.0, 0.0], pad_id=0)
    assert batch["rollout_logps"].tolist() == [[-0.5, 0.0, -1.5], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert batch["rollout_logps"].shape == batch["completion_ids"].shape
    assert "rollout_logps" not in build_batch([t1, _traj([8], [1], None)], [1.0, 1.0], pad_id=0)
    assert sampler_logps([_traj([8, 9], [1, 1], [-1.0])], 2) is None  # misaligned: no figure, never a wrong one
    gap = LogprobGap()
    learner = batch["rollout_logps"] - 0.125 * batch["tool_mask"]  # a learner off by 0.125 on every loss token
    gap.add(learner, batch["rollout_logps"], batch["completion_mask"] * batch["tool_mask"])
    assert math.isclose(gap.row()["train_rollout_logprob_abs_diff"], 0.125)


def exact_sampler_trajectories():
    """A tiny float32 Qwen3 (seed 0), its tokenizer, and 4 trajectories of random tokens (a masked tool span in
    each) whose sampling log-probs are the model's own from a plain forward pass: an exact float32 sampler."""
    import torch

    from rstar2 import models

    torch.manual_seed(0)
    model, tok = models.tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    g = torch.Generator().manual_seed(1)
    trajs = []
    for i in range(4):
        prompt = torch.randint(100, 900, (3 + i,), generator=g).tolist()
        response = torch.randint(100, 900, (9 - i,), generator=g).tolist()
        mask = [1, 1, 0, 0] + [1] * (len(response) - 4)   # a masked tool span
        with torch.no_grad():
            logp = model(torch.tensor([prompt + response])).logits.float().log_softmax(-1)[0]
        lps = [logp[len(prompt) + j - 1, tid].item() if m else 0.0 for j, (tid, m) in enumerate(zip(response, mask))]
        trajs.append(Trajectory(f"p{i}", "q", None, prompt, response_ids=response, response_mask=mask,
                                response_logprobs=lps))
    return model, tok, trajs


class _Fixed:
    """Rollout function returning the given trajectories (the trainer's interface, rl/rollout_func.py)."""
    G = 2

    def __init__(self, trajs):
        self.trajs, self.pending, self.last_results = trajs, None, []

    def set_process(self, index, count):
        pass

    def __call__(self, prompts, trainer, engines=None):
        self.pending = {"kept_total": len(self.trajs)}
        return self.trajs, [1.0 if i % 2 else -1.0 for i in range(len(self.trajs))]

    def state_dict(self):
        return {}


def test_trainer_step_records_the_mismatch_zero_for_an_exact_sampler_and_not_for_a_perturbed_one(tmp_path):
    """One RoCGRPOTrainer.training_step each on trajectories whose sampling log-probs are the policy's own (an exact
    float32 sampler: a plain forward pass of the model; tests/test_tis.py has the hf engine's own) and on the same with
    every sampled token's log-prob moved by 0.3: the step's mismatch is ~0, then 0.3 (so the trainer compares the
    right positions, over loss tokens only: the tool span carries a wrong 0.0 that must not count)."""
    import copy

    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2.rl import trainer as rl_trainer

    model, tok, trajs = exact_sampler_trajectories()
    shifted = copy.deepcopy(trajs)
    for t in shifted:
        t.response_logprobs = [lp + 0.3 * m for lp, m in zip(t.response_logprobs, t.response_mask)]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, beta=0.0, loss_type="dapo", save_strategy="no",
                      report_to=[], max_completion_length=16, disable_tqdm=True, temperature=1.0)
    gaps = []
    for rollouts in (trajs, shifted):
        fn = _Fixed(rollouts)
        tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                             train_dataset=Dataset.from_list([{"prompt": "a"}]),
                                             processing_class=tok, rollout_fn=fn, micro_batch_tokens=40)
        tr.current_gradient_accumulation_steps = 1
        model.train()
        model.zero_grad()
        tr.training_step(model, [{"prompt": "a"}] * 2)
        assert fn.pending["micro_batches"] >= 2  # the figure is over the whole step, not its last micro-batch
        gaps.append((fn.pending["train_rollout_logprob_abs_diff"], fn.pending["train_rollout_logprob_abs_diff_max"]))
    print("mismatch (mean, max): exact sampler", gaps[0], "perturbed sampler", gaps[1])
    assert gaps[0][0] < 1e-5 and gaps[0][1] < 1e-4
    assert gaps[1][0] == pytest.approx(0.3, abs=1e-4) and gaps[1][1] == pytest.approx(0.3, abs=1e-4)
