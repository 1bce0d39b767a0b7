"""CPU: the rollout phase of one RL step with tool latency injected per call — sequential tool
execution (as TRL's built-in tool loop: per-turn generation barrier, then one call after another)
against our loop (balanced scheduler: no barrier, each call dispatched as soon as its turn ends).

Workload: 16 trajectories x 3 tool calls + 1 answer turn each. The "model" is a tiny random Qwen3
(hidden 128, 4 layers, 1024-token vocabulary; real transformers ``generate`` compute on CPU, one thread)
whose output tokens are replaced by a script written in the real Qwen3 tokenizer, so every run does the
same work: turn lengths differ per trajectory (40-160 tokens).
Tool calls run in the real sandbox (a child process each) plus ``--latency`` seconds of injected
latency (``DelayedToolRunner``). The issue's target: our loop at 0.3 s latency <= 1.5x its time at 0 s.

Run: ``python benchmarks/bench_rollout_latency.py [--latency 0.3 --trajectories 16 --batch 8 --repeats 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import time

import torch

from rstar2 import chat, models, sandbox
from rstar2.rollout import DelayedToolRunner, RolloutConfig, run_rollouts


class ScriptedCostModel:
    """Real forward passes of ``inner`` for as many tokens as the scripted turns need, then the scripted tokens.

    ``script(context_ids) -> turn ids``; every row in a batch pays for the longest row (as ``generate`` does).
    """

    def __init__(self, inner, script):
        self.inner, self.script = inner, script

    def eval(self):
        self.inner.eval()
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kw):
        rows = [self.script([i for i, m in zip(ids, mask) if m])[:max_new_tokens]
                for ids, mask in zip(input_ids.tolist(), attention_mask.tolist())]
        width = max(len(r) for r in rows)
        vocab = self.inner.config.vocab_size
        with torch.no_grad():  # the cost model has a small vocabulary: fold the ids into it
            self.inner.generate(input_ids=input_ids % vocab, attention_mask=attention_mask, max_new_tokens=width,
                                min_new_tokens=width, do_sample=False, pad_token_id=0, eos_token_id=None)
        new = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def make_script(tok, n_traj: int, calls: int, seed: int):
    """Trajectory ``bench-<i>`` writes ``calls`` code turns then an answer; lengths drawn once per (i, turn)."""
    rng = random.Random(seed)
    lengths = {(i, k): rng.randint(40, 160) for i in range(n_traj) for k in range(calls + 1)}
    resp = tok.encode("<tool_response>", add_special_tokens=False)
    filler = tok.encode(" x", add_special_tokens=False)[0]

    def script(ctx: list[int]) -> list[int]:
        i = int(re.search(r"bench-(\d+)", tok.decode(ctx[:600])).group(1))
        k = sum(ctx[j:j + len(resp)] == resp for j in range(len(ctx) - len(resp) + 1))
        tail = (f"</reason>\n<answer>\\boxed{{{i}}}</answer>" if k >= calls else
                "</reason>\n" + chat.tool_call_text(f"print({i} * {k + 1})"))
        tail_ids = tok.encode(tail, add_special_tokens=False) + [tok.eos_token_id]
        return [filler] * max(lengths[(i, k)] - len(tail_ids), 0) + tail_ids
    return script


class SerialToolRunner:
    """Runs calls one after another (TRL's built-in loop calls tools sample by sample)."""

    def __init__(self, inner):
        self.inner, self.lock = inner, None

    async def run(self, code: str, stdin: str = ""):
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            return await self.inner.run(code, stdin)


def one_step(model, tok, problems, latency: float, mode: str, serial: bool, batch: int) -> tuple[float, list]:
    base = sandbox.shared_client(sandbox.SandboxLimits(timeout_s=5))
    tools = DelayedToolRunner(base, latency)
    if serial:
        tools = SerialToolRunner(tools)
    cfg = RolloutConfig(max_response_tokens=1024, max_turns=10, temperature=0, scheduler=mode, batch_size=batch)
    t0 = time.perf_counter()
    trajs = run_rollouts(model, tok, problems, cfg, tools=tools)
    dt = time.perf_counter() - t0
    base.close()
    return dt, trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, default=0.3)
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="engine batch size (rollout.batch_size)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)  # several threads on 2 shared cores spin against each other (10x slower here)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    inner = Qwen3ForCausalLM(Qwen3Config(vocab_size=1024, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=a.hidden // 4, max_position_embeddings=4096))
    tok = models.qwen3_tokenizer()
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    model = ScriptedCostModel(inner, make_script(tok, a.trajectories, a.calls, seed=0))
    problems = [{"id": i, "problem": f"Problem bench-{i}.", "answer": str(i)} for i in range(a.trajectories)]
    runs = [("our loop (balanced)", 0.0, "balanced", False), ("our loop (balanced)", a.latency, "balanced", False),
            ("sequential tools (static)", 0.0, "static", True), ("sequential tools (static)", a.latency, "static", True)]
    one_step(model, tok, problems[:2], 0.0, "balanced", False, a.batch)  # warm-up
    print(f"{a.trajectories} trajectories x {a.calls} tool calls, engine batch {a.batch}, tiny Qwen3 "
          f"(hidden {a.hidden}), median of {a.repeats}")
    print(f"{'rollout phase':<28}{'latency/call':>13}{'time (s)':>10}{'calls':>7}{'reward':>8}")
    res = {}
    for name, lat, mode, serial in runs:
        times = []
        for _ in range(a.repeats):
            dt, trajs = one_step(model, tok, problems, lat, mode, serial, a.batch)
            times.append(dt)
        ok = [c for t in trajs for c in t.tool_calls if c["status"] == "ok"]
        res[(name, lat)] = statistics.median(times)
        print(f"{name:<28}{lat:>12.1f}s{res[(name, lat)]:>10.2f}{len(ok):>7}"
              f"{statistics.mean(t.reward for t in trajs):>8.2f}")
    ours = res[("our loop (balanced)", a.latency)] / res[("our loop (balanced)", 0.0)]
    seq_added = res[("sequential tools (static)", a.latency)] - res[("sequential tools (static)", 0.0)]
    print(f"\nour loop: {ours:.2f}x its zero-latency time (target <= 1.5x); "
          f"sequential tools: +{seq_added:.1f} s from latency "
          f"({a.trajectories * a.calls} calls x {a.latency} s = {a.trajectories * a.calls * a.latency:.1f} s)")


if __name__ == "__main__":
    main()
