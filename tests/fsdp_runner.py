"""What tests/test_fsdp.py runs in each process of an ``accelerate launch`` (FSDP2 over gloo, or one plain process):
a list of actions from a JSON plan, so that one launch does several checks.

    python tests/fsdp_runner.py PLAN.json            (under accelerate launch, or alone for the one-process run)

Actions (each writes ``<out>/<name>.rank<r>.json``: the trainer's distributed type, how its first parameter is
held after training (DTensor and placement under FSDP), the process count and its peak memory):

* ``{"name", "cli": [...]}``: ``rstar2 <args>`` (``rstar2.cli.main``), the real SFT or RL stage. ``probe``: true
  records, at each step's rollouts, vLLM's and the trainer's log-probabilities of a fixed token sequence (the
  rollouts themselves stay the stage's). ``dump_optimizer``: a path; the AdamW state (gathered from the shards)
  and learning rate the stage starts its first step with are saved there.
* ``{"name", "equivalence": {...}}``: RoCGRPOTrainer with the RL stage's own GRPOConfig on rollouts replaced by a
  generator (``rows``): each process trains on its own rows, a one-process run on all of them; the step-1
  gradient and the final weights as each process holds them, and the model folder (``save_model``) are written.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

FIXED = [9707, 11, 1879, 0, 3555, 374, 220, 17, 10, 17, 30, 576, 4226, 374]  # a fixed token sequence


def rows(step: int, rank: int):
    """The kept trajectories and advantages of process ``rank`` at ``step``: step 1 gives processes 0 and 1 ten
    and three rows of different lengths (so the one with fewer fills its micro-batches with padding rows), step 2
    four and none (process 1 trains on padding only)."""
    import torch

    from rstar2 import rollout

    g = torch.Generator().manual_seed(1000 * step + rank)
    n = {(1, 0): 10, (1, 1): 3, (2, 0): 4, (2, 1): 0}[(step, rank)]
    trajs, adv = [], []
    for i in range(n):
        p, c = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(2, 30, (1,), generator=g))
        trajs.append(rollout.Trajectory(problem_id=f"s{step}-r{rank}-{i}", question="q", gold="1",
                                        prompt_ids=torch.randint(100, 900, (p,), generator=g).tolist(),
                                        response_ids=torch.randint(100, 900, (c,), generator=g).tolist(),
                                        response_mask=[1] * c, finish_reason="answer"))
        adv.append(float(torch.randn((), generator=g)))
    return trajs, adv


def equivalence_params(micro_batch_tokens: int) -> dict:
    """The RL stage params of the equivalence runs (tiny.yaml as the workflow builds it): learning rate 1e-3,
    gradient checkpointing on (its recomputed forward passes are part of what is compared), no checkpoints, float32
    training on every machine (the comparison's tolerance is float32's; the default bf16 autocast where the CPU has
    it, AMX or AVX512-BF16, sums micro-batches in another order: gradients then differ by ~1e-3, measured)."""
    from conftest import stage_params

    return stage_params("rl", "stage1", overrides={"seed": 3, "distributed": {"gradient_checkpointing": True,
                                                                              "bf16": False}, "rl": {
        "group_size": 2, "oversample": 2, "prompts_per_step": 2, "learning_rate": 1e-3, "warmup_steps": 0,
        "checkpoint_every": 0, "micro_batch_tokens": {"cpu": micro_batch_tokens}, "stages": {"stage1": {"steps": 2}}}})


def compare(two: Path, one: Path, start: Path) -> dict:
    """What the equivalence tests assert on: the step-1 gradients and final weights of a two-process run (``two``,
    both processes' views) against a one-process run (``one``) on the same rows, from the model in ``start``."""
    import torch
    from safetensors.torch import load_file

    g = [load_file(str(two / f"grads.rank{r}.safetensors")) for r in (0, 1)]
    w = [load_file(str(two / f"weights.rank{r}.safetensors")) for r in (0, 1)]
    g1, w1 = load_file(str(one / "grads.rank0.safetensors")), load_file(str(one / "weights.rank0.safetensors"))
    w0 = load_file(str(start / "model.safetensors"))
    assert g[0].keys() == g[1].keys() == g1.keys() and w[0].keys() == w[1].keys() == w1.keys() == w0.keys()
    return {"grads_same_on_both": all(torch.equal(g[0][k], g[1][k]) for k in g1),
            "weights_same_on_both": all(torch.equal(w[0][k], w[1][k]) for k in w1),
            "grads_close": all(torch.allclose(g[0][k], g1[k], rtol=1e-5, atol=1e-6) for k in g1),
            "grad_nonzero": any(v.abs().sum() > 0 for v in g1.values()),
            "grad_max_diff": max((g[0][k] - g1[k]).abs().max().item() for k in g1),
            "weight_max_diff": max((w[0][k] - w1[k]).abs().max().item() for k in w1),
            "moved": max((w1[k] - w0[k]).abs().max().item() for k in w1)}


def _record(trainer, acc=None) -> dict:
    acc = acc or trainer.accelerator
    p = next(trainer.model_wrapped.parameters())
    return {"distributed_type": str(acc.distributed_type), "num_processes": acc.num_processes,
            "param_class": type(p).__name__, "placements": str(getattr(p, "placements", None)),
            "local_shape": list(getattr(p, "_local_tensor", p).shape), "full_shape": list(p.shape)}


def _logps(model, ids):
    import torch

    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return [logp[i, t].item() for i, t in enumerate(ids[1:])]


def _vllm_logps(llm, ids):
    from vllm import SamplingParams

    (out,) = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)
    return [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])]


def _full(t):
    """A tensor gathered from its shards (a collective under FSDP2), on the CPU."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def _optimizer_dump(trainer, path: str, rank: int):
    """A callback saving (process 0) the AdamW state, gathered and keyed by parameter name, and the learning rate
    the stage starts its first step with."""
    import torch
    from transformers import TrainerCallback

    class Dump(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            names = {id(q): n for n, q in trainer.model.named_parameters()}
            st = {names[id(q)]: {k: _full(v) for k, v in s.items()} for q, s in optimizer.state.items()}
            if rank == 0:
                torch.save({"state": st, "lr": lr_scheduler.get_last_lr()}, path)
    return Dump()


def run_cli(action: dict, rank: int, seen: dict) -> None:
    import transformers

    from rstar2 import cli
    from rstar2.rl import rollout_func

    train = transformers.Trainer.train
    call = rollout_func.RolloutFunc.__call__
    probes = []

    def recording_train(self, *a, **k):
        if action.get("dump_optimizer"):
            self.add_callback(_optimizer_dump(self, action["dump_optimizer"], rank))
        out = train(self, *a, **k)
        seen.update(_record(self))
        return out

    def probing_call(self, prompts, trainer, engines=None):
        # vLLM's and the trainer's log-probs of FIXED before the step's rollouts (the trainer's forward is a
        # collective under FSDP: every process runs it once per step)
        probes.append({"step": self.step + 1, "vllm": _vllm_logps(engines[0].llm, FIXED),
                       "trainer": _logps(trainer.model, FIXED)})
        return call(self, prompts, trainer, engines)

    transformers.Trainer.train = recording_train
    if action.get("probe"):
        rollout_func.RolloutFunc.__call__ = probing_call
    try:
        rc = cli.main([str(a) for a in action["cli"]])
    finally:
        transformers.Trainer.train, rollout_func.RolloutFunc.__call__ = train, call
    if rc:
        raise SystemExit(rc)
    seen["probes"] = probes


def run_equivalence(action: dict, rank: int, seen: dict) -> None:
    """Two RL steps on ``rows``: each process its own rows, or one process all of them. Writes the step-1 gradient
    and the final weights as each process sees them (``grads.rank<r>``, ``weights.rank<r>``), the model folder
    (``save_model``) and, into ``seen``, each step's micro-batch count."""
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    from rstar2 import distributed, models
    from rstar2.rl import checkpoints
    from rstar2.rl import trainer as rl_trainer
    from rstar2.stages import rl
    from rstar2.stages.params import RLParams, parse

    eq, out = action["equivalence"], Path(action["out"])
    p = parse(RLParams, eq["params"], "rl params")
    ps = distributed.process_state({"device": "cpu"})
    n = ps.num_processes

    class Fixed:
        G, last_results, pending, step = 2, [], None, 0

        def set_process(self, index, count):
            pass

        def state_dict(self):
            return {}

        def __call__(self, prompts, trainer, engines=None):
            self.step += 1
            parts = [rows(self.step, r) for r in ([rank] if n > 1 else [0, 1])]
            self.pending = {"kept_total": 0}
            return [t for tr, _ in parts for t in tr], [a for _, ad in parts for a in ad]

    fn = Fixed()

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if state.global_step == 0:  # the first step's gradient as this process sees it (FSDP: gathered)
                grads = {name: _full(q.grad) for name, q in model.named_parameters() if q.grad is not None}
                save_file(grads, str(out / f"grads.rank{rank}.safetensors"))

        def on_step_end(self, args, state, control, **kw):
            seen.setdefault("micro_batches", []).append(fn.pending.get("micro_batches"))

        def on_train_end(self, args, state, control, model=None, **kw):
            # this process's weights (DDP: its own replica; FSDP: gathered), tied copies written once
            save_file({n: _full(q) for n, q in model.named_parameters()}, str(out / f"weights.rank{rank}.safetensors"))

    args = rl.grpo_config(p, str(out / "trainer"), p.seed, n)
    model, tok = models.load(eq["model"])
    checkpoints.mark_tied_weights(model)  # as rl.run does
    tr = rl_trainer.make_trainer_class()(
        model=model, reward_funcs=[rl_trainer.rollout_reward], args=args, processing_class=tok,
        train_dataset=Dataset.from_list([{"prompt": f"q{i}"} for i in range(8)]), rollout_fn=fn,
        callbacks=[Grads()], micro_batch_tokens=p.micro_batch_tokens)
    distributed.check_engine(tr.accelerator)
    tr.train()
    tr.save_model(str(out / "model"))
    seen.update(_record(tr))


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    for action in plan:
        out = Path(action["out"])
        out.mkdir(parents=True, exist_ok=True)
        seen, t0 = {}, time.time()
        (run_cli if "cli" in action else run_equivalence)(action, rank, seen)
        seen.update(seconds=round(time.time() - t0, 1),
                    peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        (out / f"{action['name']}.rank{rank}.json").write_text(json.dumps(seen))
        print(f"[fsdp_runner] {action['name']} done on rank {rank} in {seen['seconds']} s", flush=True)
        # a stage's other processes return while the main one still writes its outputs (tokenizer, manifest):
        # the next action, which may read them (and digest them into its fingerprint), waits for all
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()


if __name__ == "__main__":  # the grading pool's workers start by spawn and import this file
    sys.exit(main(sys.argv[1]))
