"""Two training processes on CPU (``accelerate launch`` with configs/accelerate/cpu_2proc.yaml, gloo backend):
SFT and RL stages run as they would on a multi-GPU node, and the processes end with identical weights.

* ``test_rl_two_processes_sync_gradients``: two RL steps with rollouts replaced by a generator whose rewards
  depend on the process, so that in each step one process keeps trajectories and the other keeps none (its
  group has equal rewards). Each process saves a digest of its own weights: they must be equal (gradients
  all-reduced, the empty process joined the collectives with a zero-weight batch) and differ from the start.
* ``test_rl_cli_one_step_two_processes`` and ``test_sft_cli_two_processes``: the real ``rstar2 rl`` / ``rstar2 sft``
  commands (real rollouts through the sandbox, real TRL trainers) under ``accelerate launch``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import stage_params, write_tiny_rl_inputs

REPO = Path(__file__).resolve().parents[1]
ACCEL_CFG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
       "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}

RL_PARAMS = stage_params("rl", "stage1", overrides={"seed": 3, "tool": {"timeout_s": 3}, "rl": {
    "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 2, "oversample": 2, "prompts_per_step": 2,
    "learning_rate": 1e-2, "warmup_steps": 0, "checkpoint_every": 1, "temperature": 1.0, "top_p": 1.0,
    "batch_size": 4, "stages": {"stage1": {"max_response_tokens": 16, "max_turns": 2, "steps": 2}}}})

# Rollouts replaced by a generator: process r keeps trajectories (mixed rewards) in step r + 1 only; in the
# other step its group has equal rewards and is dropped, so it trains on nothing while the other process does.
RUNNER = textwrap.dedent('''
    import json, os, sys
    import torch
    from rstar2 import rollout
    from rstar2.rl import trainer as rl_trainer
    from rstar2.stages import rl

    rank = int(os.environ["RANK"])
    calls = {"n": 0}

    def fake_run_rollouts(model, tok, problems, cfg, progress=None, **kw):  # kw: answer_type
        calls["n"] += 1
        mixed = calls["n"] == rank + 1
        out = []
        for i, p in enumerate(problems):
            ids = [100 + 7 * i + rank + j for j in range(3 + i)] + [tok.eos_token_id]
            out.append(rollout.Trajectory(
                problem_id=str(p["id"]), question=p["problem"], gold=p["answer"],
                prompt_ids=tok.encode(p["problem"], add_special_tokens=False), response_ids=ids,
                response_mask=[1] * len(ids), turns=[{"text": "<answer>x</answer>", "tool_calls": []}],
                finish_reason="answer", reward=float(mixed and i % 2 == 0)))
        return out

    rollout.run_rollouts = fake_run_rollouts
    made = rl_trainer.make_trainer_class
    box = {}

    def capture():
        cls = made()

        class Captured(cls):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                box["trainer"] = self
        return Captured

    rl_trainer.make_trainer_class = capture  # rl.run imports it from the module at call time
    params, model, data, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    rl.run(params, model, data, out)
    from safetensors.torch import save_model
    # this process's own weights (tied tensors written once, as save_pretrained does)
    save_model(box["trainer"].accelerator.unwrap_model(box["trainer"].model),
               os.path.join(sys.argv[5], f"rank{rank}.safetensors"))
    with open(os.path.join(sys.argv[5], f"rank{rank}.json"), "w") as f:
        json.dump({"world": box["trainer"].accelerator.num_processes}, f)
''')


# A micro-batched step on two processes (gloo): each process trains on its own kept trajectories (different
# counts and lengths, so the process with fewer rows fills micro-batches with padding rows), once in a single
# micro-batch and once in several; the gradients seen at the optimizer step are saved per process. Rank 0
# also computes, unwrapped and on one process, the single-pass gradient over both processes' rows.
# Rows of the micro-batched two-process step: process 0 keeps 10 trajectories, process 1 three (different lengths).
GRAD_ROWS = textwrap.dedent('''
    import torch
    from rstar2 import rollout

    def rows(r):
        g = torch.Generator().manual_seed(100 + r)
        trajs, adv = [], []
        for i in range(10 if r == 0 else 3):
            p, c = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(2, 30, (1,), generator=g))
            trajs.append(rollout.Trajectory(problem_id=f"r{r}-{i}", question="q", gold="1",
                                            prompt_ids=torch.randint(100, 900, (p,), generator=g).tolist(),
                                            response_ids=torch.randint(100, 900, (c,), generator=g).tolist(),
                                            response_mask=[1] * c, finish_reason="answer"))
            adv.append(float(torch.randn((), generator=g)))
        return trajs, adv
''')

# Each process trains on its own rows (the process with fewer rows fills micro-batches with padding rows), once
# in a single micro-batch and once in several; the gradient seen at the optimizer step is saved per process.
GRAD_RUNNER = GRAD_ROWS + textwrap.dedent('''
    import json, os, sys
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import TrainerCallback
    from trl import GRPOConfig
    from rstar2 import models
    from rstar2.rl import trainer as rl_trainer

    rank = int(os.environ["RANK"])
    model_dir, out = sys.argv[1], sys.argv[2]

    class Fixed:
        G, last_results, pending = 2, [], None
        def set_process(self, index, count): pass
        def state_dict(self): return {}
        def __call__(self, prompts, trainer, engines=None):
            self.pending = {"kept_total": 0}
            return rows(rank)

    class Grads(TrainerCallback):
        def __init__(self): self.grads = None
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    def step(budget):
        model, tok = models.load(model_dir)
        # gradient checkpointing on (TRL's default): the recomputed forward passes are part of what is checked
        args = GRPOConfig(output_dir=os.path.join(out, f"t{budget}"), use_cpu=True, bf16=False, seed=0,
                          gradient_checkpointing=True,
                          per_device_train_batch_size=2, num_generations=2, max_steps=1, beta=0.0, entropy_coef=0.0,
                          loss_type="dapo", logging_steps=1, save_strategy="no", report_to=[], max_grad_norm=0.0,
                          max_completion_length=64, disable_tqdm=True)
        fn, cb = Fixed(), Grads()
        tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                             train_dataset=Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}]),
                                             processing_class=tok, rollout_fn=fn, callbacks=[cb],
                                             micro_batch_tokens=budget)
        tr.train()
        save_file(cb.grads, os.path.join(out, f"rank{rank}-budget{budget}.safetensors"))
        return fn.pending["micro_batches"]

    counts = {b: step(b) for b in (100000, 40)}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(counts, f)
''')


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*args) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCEL_CFG),
            "--main_process_port", str(_port()), *map(str, args)]


def _run(cmd, timeout=420):
    r = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return r


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    write_tiny_rl_inputs(root, 8)
    return root


def _weights(path):
    from safetensors.torch import load_file

    path = Path(path)
    return load_file(str(path / "model.safetensors" if path.is_dir() else path))


def _same(a, b) -> bool:
    """Equal weights; a tied embedding / lm_head pair may be stored under either name."""
    import torch

    tied = {"lm_head.weight", "model.embed_tokens.weight"}
    a, b = ({(k if k not in tied else "tied"): v for k, v in d.items()} for d in (a, b))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rl_two_processes_sync_gradients(setup):
    root = setup
    (root / "runner.py").write_text(RUNNER)
    out, digests = root / "fake" / "stage1", root / "fake_digests"
    digests.mkdir()
    _run(_launch(root / "runner.py", json.dumps(RL_PARAMS), root / "model", root / "train.jsonl", out, digests))
    assert [json.loads((digests / f"rank{r}.json").read_text())["world"] for r in (0, 1)] == [2, 2]
    w0, w1 = _weights(digests / "rank0.safetensors"), _weights(digests / "rank1.safetensors")
    assert _same(w0, w1), "the two processes ended with different weights"
    assert not _same(w0, _weights(root / "model")), "training changed nothing"
    assert _same(_weights(out / "model"), w0), "the saved model is not the trained one"
    metrics = _rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2], "metrics written once per step, by one process"
    # each step: 2 prompts (one per process) x 4 drawn; one group kept (2 trajectories), one dropped
    assert [(m["groups"], m["groups_dropped"], m["kept_total"]) for m in metrics] == [(2, 1, 2), (2, 1, 2)]
    assert not any(m["update_skipped"] for m in metrics)
    rows = _rows(out / "rollouts.jsonl")
    assert len(rows) == 16 and {(r["step"], r["group"]) for r in rows} == {(s, g) for s in (1, 2) for g in (0, 1)}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["steps"] == 2 and not (root / "fake" / "checkpoints" / "stage1").exists()


def test_micro_batched_gradient_on_two_processes_equals_the_single_pass_gradient(setup):
    """Two processes (gloo, DDP) with 10 and 3 kept trajectories: one micro-batch or several per step (the one
    with fewer rows padding its micro-batches), the all-reduced gradient is the same on both processes and equals
    the one-process single-pass gradient over all 13 rows with the step's token mean (|diff| <= 1e-6 + 1e-5 |g|,
    float32)."""
    import torch

    root = setup
    (root / "grad_runner.py").write_text(GRAD_RUNNER)
    out = root / "grads"
    out.mkdir()
    _run(_launch(root / "grad_runner.py", root / "model", out))
    counts = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert counts[0] == counts[1] and counts[0]["100000"] == 1 and counts[0]["40"] >= 4, counts
    # the reference: one pass over both processes' rows in this (single) process through TRL's loss as is, which
    # divides by num_items_in_batch / 1 = the token count of all 13 rows
    from datasets import Dataset
    from trl import GRPOConfig

    from rstar2 import models
    from rstar2.rl import trainer as rl_trainer

    scope = {}
    exec(GRAD_ROWS, scope)
    model, tok = models.load(root / "model")
    args = GRPOConfig(output_dir=str(out / "ref"), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, beta=0.0, loss_type="dapo", report_to=[], max_completion_length=64)
    tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                         train_dataset=Dataset.from_list([{"prompt": "a"}]), processing_class=tok,
                                         rollout_fn=None)
    tr.current_gradient_accumulation_steps = 1
    (t0, a0), (t1, a1) = scope["rows"](0), scope["rows"](1)
    model.train()
    tr._compute_loss(model, rl_trainer.build_batch(t0 + t1, a0 + a1, tok.pad_token_id)).backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert any(g.abs().sum() > 0 for g in ref.values())
    for budget in (100000, 40):
        g0, g1 = (_weights(out / f"rank{r}-budget{budget}.safetensors") for r in (0, 1))
        assert g0.keys() == g1.keys() == ref.keys()
        for k in ref:
            assert torch.equal(g0[k], g1[k]), (budget, k)   # all-reduced: identical on both processes
            assert torch.allclose(g0[k], ref[k], rtol=1e-5, atol=1e-6), (budget, k, (g0[k] - ref[k]).abs().max())


def test_rl_cli_one_step_two_processes(setup):
    root = setup
    out = root / "cli" / "stage1"
    params = {**RL_PARAMS, "steps": 1}
    r = _run(_launch("-m", "rstar2.cli", "rl", "--params", json.dumps(params), "--model", root / "model",
                     "--data", root / "train.jsonl", "--out", out))
    assert r.stdout.count("[rl] step 1:") == 1, r.stdout[-2000:]
    metrics = _rows(out / "metrics.jsonl")
    assert len(metrics) == 1 and metrics[0]["groups"] == 2   # both processes' groups counted
    rows = _rows(out / "rollouts.jsonl")
    assert len(rows) == 8 and len({r["problem_id"] for r in rows}) == 2   # 2 prompts x 2G, one per process
    assert json.loads((out / "manifest.json").read_text())["counts"]["steps"] == 1


def test_sft_cli_two_processes(setup, tmp_path):
    root = setup
    data = tmp_path / "sft.jsonl"
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"s{i}", "messages": [
                {"role": "user", "content": f"Say the number {i}."},
                {"role": "assistant", "content": f"<reason>It is {i}.</reason>\n<answer>{i}</answer>"}]}) + "\n")
    out = tmp_path / "sft"
    params = stage_params("sft", overrides={"seed": 0, "sft": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 4,
                                                           "grad_accum": 1, "max_length": 256, "warmup_ratio": 0.0}})
    _run(_launch("-m", "rstar2.cli", "sft", "--params", json.dumps(params), "--model", root / "model",
                 "--data", data, "--out", out))
    m = json.loads((out / "manifest.json").read_text())
    # 8 examples, global batch 4 = 2 per process x 2 processes: 2 optimizer steps
    assert m["counts"]["examples"] == 8 and m["counts"]["optimizer_steps"] == 2
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2]
    assert not _same(_weights(out / "model"), _weights(root / "model")), "SFT changed nothing"


def test_vllm_weights_are_synced_before_each_steps_rollouts(qwen_tokenizer):
    """With use_vllm, _prepare_inputs pushes the policy to vLLM (TRL's sync_weights, once per global step)
    before the rollouts, and the rollouts get engines on TRL's vLLM (server mode here: OpenAIEngine on the
    trl vllm-serve address; colocate mode needs vLLM itself and is covered by scripts/gpu_vllm_smoke.py)."""
    import types

    import torch

    from rstar2.rl import trainer as rl_trainer
    from rstar2.rollout.engines import OpenAIEngine

    events = []

    class FakeVLLM:
        def sync_weights(self):
            events.append(("sync", fake.state.global_step))

    class FakeRollouts:
        G, last_results, pending = 2, [], None
        rcfg = types.SimpleNamespace(temperature=1.0, top_p=1.0, batch_size=4)

        def __call__(self, prompts, trainer, engines=None):
            events.append(("rollout", trainer.state.global_step, engines))
            return [], []

    acc = types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True, device=torch.device("cpu"),
                                wait_for_everyone=lambda: None, unwrap_model=lambda m: m)
    fake = types.SimpleNamespace(
        use_vllm=True, vllm_generation=FakeVLLM(), _last_loaded_step=-1, state=types.SimpleNamespace(global_step=0),
        micro_batch_tokens=64,
        args=types.SimpleNamespace(vllm_mode="server", vllm_enable_sleep_mode=False,
                                   vllm_server_base_url="http://127.0.0.1:9", vllm_server_host="127.0.0.1",
                                   vllm_server_port=9),
        model=types.SimpleNamespace(training=True, config=types.SimpleNamespace(_name_or_path="policy")),
        processing_class=qwen_tokenizer, accelerator=acc, rollout_fn=FakeRollouts())
    cls = rl_trainer.make_trainer_class()
    for name in ("_rollout_engines", "_after_rollouts"):
        setattr(fake, name, types.MethodType(getattr(cls, name), fake))
    batch = [{"prompt": "q"}, {"prompt": "q"}]
    assert cls._rollout_micro_batches(fake, batch) == []    # no group kept: no micro-batch, no update
    assert cls._rollout_micro_batches(fake, batch) == []    # same global step: no second sync
    fake.state.global_step = 1
    cls._rollout_micro_batches(fake, batch)
    kinds = [e[:2] for e in events]
    assert kinds == [("sync", 0), ("rollout", 0), ("rollout", 0), ("sync", 1), ("rollout", 1)]
    engines = events[1][2]
    assert len(engines) == 1 and isinstance(engines[0], OpenAIEngine)
    assert engines[0].base_url == "http://127.0.0.1:9" and engines[0].model == "policy"
