"""CPU: the HF engine against vLLM's CPU build on the default run's RL rollouts (issue 32, item 5).

Both engines roll out the same RL steps of the default config (config.yaml): ``rl.prompts_per_step`` prompts x
``2G`` trajectories per step from the stage-1 pool (data/learning/train.jsonl, kinds bare and one_step), stage 1's
``max_response_tokens`` and ``max_turns``, ``rl.temperature`` / ``top_p``, real sandbox calls, through
``rstar2.rollout.run_rollouts`` (the agent loop and scheduler the RL stages use). Same model folder, same dtype
(float32 by default: the CPU target without native bf16; ``--dtype bfloat16`` where the CPU has it), same seed.

Printed per engine: load time (model read + engine start), seconds per step (median of ``--steps``, after one
warm-up step that is not counted), generated tokens per second over the counted steps, and the tool calls made.
The HF engine is ``HFEngine`` as ``default_engines`` builds it (``rollout.precision`` fp32 or bf16); vLLM is
``AsyncVLLMEngine`` on an in-process ``AsyncLLM`` (prefix caching on, processed log-probs, ``enforce_eager``:
vLLM's CPU compile takes minutes for a two-step benchmark; pass ``--vllm-compile`` to include it).

Run: ``python benchmarks/bench_engines.py [--model DIR] [--steps 3] [--dtype float32] [--engines hf vllm]``;
without ``--model`` the default base model (SmolLM2-135M-Instruct from its wheel) is written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")),
                platform.processor())
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    return f"{name}, {os.cpu_count()} CPUs, flags: {' '.join(have) or 'none of avx2/avx512'}"


def _problems(cfg: dict, n: int) -> list[dict]:
    rows = [json.loads(line) for line in open(ROOT / "data/learning/train.jsonl")]
    rows = [r for r in rows if r.get("kind") in ("bare", "one_step")][:n]
    return [{"id": str(r["id"]), "problem": r["problem"], "answer": str(r["answer"]), "answer_type": "integer"}
            for r in rows]


def _engines(name: str, model_dir: str, tok, rcfg, dtype: str, compile_: bool, seed: int):
    """(engines, model or None, load seconds)."""
    t0 = time.time()
    if name == "hf":
        import torch
        from transformers import AutoModelForCausalLM

        from rstar2.rollout import default_engines

        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        return default_engines(model, tok, rcfg, seed=seed), model, time.time() - t0
    from vllm import AsyncEngineArgs

    from rstar2.rollout import AsyncVLLMEngine, start_async_llm

    args = AsyncEngineArgs(model=model_dir, dtype=dtype, enforce_eager=not compile_, max_model_len=2048,
                           enable_prefix_caching=True, logprobs_mode="processed_logprobs", seed=seed)
    llm = start_async_llm(args)
    engine = AsyncVLLMEngine(llm, [tok.eos_token_id], rcfg.temperature, rcfg.top_p, seed=seed)
    return [engine], None, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a HF model folder (default: the default base model, written to a temp dir)")
    ap.add_argument("--steps", type=int, default=3, help="counted RL steps per engine (after one warm-up step)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--vllm-compile", action="store_true", help="let vLLM compile (no enforce_eager)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from rstar2 import models
    from rstar2.rollout import RolloutConfig, run_rollouts

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")   # GiB; the default (4) is more than 135M needs
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the table, not vLLM's start-up log
    cfg = yaml.safe_load(open(ROOT / "config.yaml"))
    rl, st = cfg["rl"], cfg["rl"]["stages"]["stage1"]
    per_step = rl["prompts_per_step"]
    draws = rl["group_size"] * rl["oversample"]
    model_dir = a.model or str(Path(tempfile.mkdtemp(prefix="bench_engines_")) / "model")
    if not a.model:
        models.materialise(cfg["model"], model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rcfg = RolloutConfig(max_response_tokens=st["max_response_tokens"], max_turns=st["max_turns"],
                         temperature=rl["temperature"], top_p=rl["top_p"], batch_size=rl["batch_size"],
                         precision="bf16" if a.dtype == "bfloat16" else "fp32")
    pool = _problems(cfg, per_step * (a.steps + 1))
    print(f"CPU: {_cpu()}; torch threads {__import__('torch').get_num_threads()}")
    print(f"default run's RL step: {per_step} prompts x {draws} rollouts, {st['max_response_tokens']} tokens, "
          f"{st['max_turns']} turns, T={rl['temperature']}, top_p={rl['top_p']}; dtype {a.dtype}; model {model_dir}")
    table = [f"{'engine':8s} {'load s':>7s} {'s/step (median)':>16s} {'tokens/s':>9s} {'tokens':>7s} {'tool calls':>10s}"]
    for name in a.engines:
        engines, model, load_s = _engines(name, model_dir, tok, rcfg, a.dtype, a.vllm_compile, a.seed)
        times, tokens, calls = [], 0, 0
        for step in range(a.steps + 1):
            probs = [p for p in pool[step * per_step:(step + 1) * per_step] for _ in range(draws)]
            probs = [{**p, "id": p["id"]} for p in probs]
            t0 = time.time()
            trajs = run_rollouts(model, tok, probs, rcfg, engines=engines, seed=a.seed + step)
            if step:   # step 0 warms caches and lazy initialisation up
                times.append(time.time() - t0)
                tokens += sum(t.num_generated_tokens for t in trajs)
                calls += sum(len(t.tool_calls) for t in trajs)
        table.append(f"{name:8s} {load_s:7.1f} {statistics.median(times):16.2f} {tokens / sum(times):9.1f} "
                     f"{tokens:7d} {calls:10d}")
        print(table[-1], flush=True)
        for e in engines:
            getattr(e, "shutdown", lambda: None)()
    print("\n".join(table), flush=True)


if __name__ == "__main__":
    main()
