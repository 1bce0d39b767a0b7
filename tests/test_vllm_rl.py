"""RL on the real vLLM (its CPU build, requirements-vllm.txt): RoCGRPOTrainer in TRL's colocate mode, two steps of
a tiny Qwen3, rollouts by ``StepVLLMEngine`` on TRL's own ``vllm.LLM``. The weight-sync check: at each step's
rollouts, vLLM's log-probabilities of a fixed token sequence equal the trainer's within float32 tolerance, and
after the first update they differ from step 1's (so a skipped sync fails the second comparison). The step's
recorded sampler/learner mismatch (rl/logprob_gap.py) over vLLM's own rollouts is within the same tolerance, and
truncated importance sampling (rl/tis.py, on here) weighted every loss token from vLLM's log-probs, none capped.

One engine for the module; about 3 minutes on a 2-core AMD EPYC Zen 4 shared with other jobs."""

import os

import pytest
from vllm_cpu import ENV, tiny_model

pytest.importorskip("vllm")

FIXED = [9707, 11, 1879, 0, 3555, 374, 220, 17, 10, 17, 30, 576, 4226, 374]  # a fixed token sequence
TOL = 2e-2  # TRL builds its LLM compiled (no enforce_eager): its fused float32 kernels differ by up to ~7e-3


@pytest.fixture(autouse=True)
def _vllm_cpu_env(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def _vllm_logprobs(llm, ids):
    from vllm import SamplingParams

    (out,) = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)
    return [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]


def _trainer_logprobs(model, ids):
    import torch

    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return [logp[i, t].item() for i, t in enumerate(ids[1:])]


class VLLMRollouts:
    """Rolls a group out on the engines the trainer hands over (real vLLM) and, before that, records vLLM's and
    the trainer's log-probabilities of FIXED. A random model solves nothing, so the advantages are set +-1 by
    position (the step's update must move the weights for the check to mean anything)."""
    G = 2

    def __init__(self, tok):
        from rstar2.rollout import RolloutConfig

        self.tok, self.rcfg = tok, RolloutConfig(max_response_tokens=12, max_turns=1, temperature=1.0)
        self.pending, self.last_results, self.seen = None, [], []

    def set_process(self, index, count):
        assert (index, count) == (0, 1)

    def __call__(self, prompts, trainer, engines=None):
        from rstar2.rollout import StepVLLMEngine, run_rollouts

        assert len(engines) == 1 and isinstance(engines[0], StepVLLMEngine)
        assert engines[0].llm is trainer.vllm_generation.llm
        self.seen.append((_vllm_logprobs(engines[0].llm, FIXED), _trainer_logprobs(trainer.model, FIXED)))
        problems = [{"id": f"p{i}", "problem": p, "answer": "4"} for i, p in enumerate(prompts)]
        trajs = run_rollouts(None, self.tok, problems, self.rcfg, engines=engines)
        assert all(t.response_ids and len(t.response_logprobs) == len(t.response_ids) for t in trajs)
        self.pending = {"kept_total": len(trajs), "reward_mean": 0.0, "groups": 1, "groups_dropped": 0,
                        "tool_calls_per_traj": 0.0, "response_length_mean": 1.0}
        return trajs, [1.0 if i % 2 == 0 else -1.0 for i in range(len(trajs))]

    def state_dict(self):
        return {}


def test_two_rl_steps_on_colocated_vllm_sync_the_policy(tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from rstar2.rl import trainer as rl_trainer
    from rstar2.rl.tis import TISConfig

    tiny_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    args = GRPOConfig(output_dir=str(tmp_path / "t"), use_cpu=True, per_device_train_batch_size=2,
                      num_generations=2, max_steps=2, beta=0.0, loss_type="dapo", save_strategy="no",
                      report_to=[], learning_rate=3e-2, max_completion_length=12, disable_tqdm=True,
                      use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_correction=False,
                      vllm_max_model_length=1024, vllm_gpu_memory_utilization=0.1)
    fn = VLLMRollouts(tok)
    tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                         train_dataset=Dataset.from_list([{"prompt": "What is 2 plus 2?"}] * 2),
                                         processing_class=tok, rollout_fn=fn, micro_batch_tokens=4096,
                                         tis=TISConfig(enabled=True, cap=3.0))
    tr.train()
    (v1, h1), (v2, h2) = fn.seen
    gap = lambda x, y: max(abs(a - b) for a, b in zip(x, y))  # noqa: E731
    print(f"step 1 |vLLM - trainer| {gap(v1, h1):.2e}; update moved the trainer {gap(h1, h2):.2e}; "
          f"step 2 |vLLM - trainer| {gap(v2, h2):.2e}")
    assert gap(v1, h1) < TOL                  # step 1: vLLM holds the initial policy
    assert gap(h1, h2) > 20 * TOL             # the first update moved the policy well beyond the tolerance
    assert gap(v2, h2) < TOL, "vLLM did not get the updated weights"
    # the step's recorded sampler/learner mismatch: vLLM's sampling log-probs of its own rollouts vs the trainer's
    mean, top = fn.pending["train_rollout_logprob_abs_diff"], fn.pending["train_rollout_logprob_abs_diff_max"]
    print(f"step 2 train_rollout_logprob_abs_diff {mean:.2e} (max {top:.2e})")
    assert mean < TOL
    # TIS ran on vLLM's log-probs: every loss token corrected, ratios within e^(+-TOL), so none reached the cap
    assert fn.pending["tis_enabled"] is True and fn.pending["tis_uncorrected_tokens"] == 0
    assert fn.pending["tis_clipped_share"] == 0.0
