"""Simulation: rollout makespan and engine idle fraction on one heavy-tailed multi-turn workload, three ways
(paper §3.2, Fig. 7):

- ``static``: even split, all start at once, a barrier per turn (VERL v0.2, the baseline the paper replaces);
- ``barrier``: the balanced scheduler on engines that run one blocking call per batch (the former in-process
  vLLM engine: ``llm.generate`` per batch, so a turn that finishes early waits for its batch's longest turn);
- ``balanced``: the balanced scheduler (KV reserved per trajectory, one queue over all engines) on
  continuous-batching engines (in-process ``AsyncLLM``, a ``vllm serve`` rank, TRL's LLM driven step by step).

The REAL ``Scheduler`` and ``AgentLoop`` run (parsing tool calls, appending masked tool tokens, shared
token budget); only the engines (``rollout.sim.SimEngine``: modelled decode speed, KV capacity, recompute
preemption, optionally one blocking call per batch), the tools (``SimToolRunner``: scripted latency) and the
clock (virtual) are simulated.

Workload (defaults: one paper-scale RL step, 64 prompts x 32 rollouts = 2048 trajectories on 16 engines):
- response length per trajectory: lognormal, mean ~3K tokens (the paper's averages grow 1K -> 8K over
  training), capped at the 8K budget; split over turns by a Dirichlet draw, so some turns are very long;
- tool calls per trajectory: negative binomial with mean 2.7 (the paper's average), at most T - 1;
- tool latency: lognormal, median 0.25 s, heavy tail (sigma 1.2).
Engine model (roughly a 14B model on one H100-class GPU): 20 ms per decode step + 0.1 ms per sequence
+ 20 ns per KV token in use; 250K KV tokens; 20K tokens/s prefill.

Run: ``python benchmarks/bench_scheduler_sim.py [--trajectories 2048 --engines 16 --seed 0]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rstar2 import models
from rstar2.rollout import AgentLoop, RolloutConfig, Scheduler
from rstar2.rollout.sim import SimEngine, SimPolicy, SimToolRunner, SimTurn, run_virtual


def workload(n: int, budget: int, max_turns: int, seed: int) -> list[list[SimTurn]]:
    """Per trajectory, its turns: generated tokens each, and the latency of the tool call that ends it."""
    rng = np.random.default_rng(seed)
    scripts = []
    for _ in range(n):
        total = int(min(rng.lognormal(np.log(2200), 0.8), budget - 600))  # mean ~3K, heavy right tail
        calls = int(min(rng.negative_binomial(2, 2 / (2 + 2.7)), max_turns - 1))  # mean 2.7, overdispersed
        parts = rng.dirichlet(np.full(calls + 1, 0.7)) * total
        turns = [SimTurn(max(int(p), 40), float(min(rng.lognormal(np.log(0.25), 1.2), 30.0))) for p in parts[:-1]]
        scripts.append(turns + [SimTurn(max(int(parts[-1]), 40), None)])
    return scripts


def simulate(mode: str, scripts, tok, n_engines: int, budget: int, max_turns: int, kv_tokens: int) -> dict:
    policy = SimPolicy(tok, scripts)
    engines = [SimEngine(policy, kv_tokens=kv_tokens, batch_barrier=mode == "barrier") for _ in range(n_engines)]
    sched_mode = "static" if mode == "static" else "balanced"
    cfg = RolloutConfig(max_response_tokens=budget, max_turns=max_turns, scheduler=sched_mode)
    agent = AgentLoop(tok, cfg, SimToolRunner())
    trajs = [agent.new_trajectory({"id": i, "problem": f"Problem sim-{i}."}) for i in range(len(scripts))]
    sched = Scheduler(engines, agent, sched_mode, budget, max_inflight=None)

    async def main():
        try:
            await sched.run(trajs)
        finally:
            for e in engines:
                await e.aclose()
    _, makespan = run_virtual(main())
    idle = [1 - e.busy_s / makespan for e in engines]
    return {"mode": mode, "makespan_s": makespan, "idle_mean": statistics.mean(idle), "idle_max": max(idle),
            "tokens_per_s": sum(e.tokens_out for e in engines) / makespan,
            "preemptions": sum(e.preemptions for e in engines),
            "kv_peak": max(e.peak_kv_used / e.kv_tokens for e in engines),
            "finished": sum(t.finish_reason in ("answer", "max_turns", "budget") for t in trajs),
            "tool_calls": sum(len(t.tool_calls) for t in trajs),
            "truncated": sum(t.truncated for t in trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=2048)
    ap.add_argument("--engines", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--kv-tokens", type=int, default=250_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    tok = models.qwen3_tokenizer()
    scripts = workload(a.trajectories, a.budget, a.max_turns, a.seed)
    lens = [sum(t.tokens for t in s) for s in scripts]
    calls = [len(s) - 1 for s in scripts]
    print(f"workload: {a.trajectories} trajectories on {a.engines} engines (KV {a.kv_tokens} tokens each), "
          f"budget {a.budget}, T={a.max_turns}; generated tokens mean {statistics.mean(lens):.0f} / p50 "
          f"{statistics.median(lens):.0f} / max {max(lens)}; tool calls mean {statistics.mean(calls):.2f} / max {max(calls)}")
    rows = []
    for mode in ("static", "barrier", "balanced"):
        t0 = time.time()
        r = simulate(mode, scripts, tok, a.engines, a.budget, a.max_turns, a.kv_tokens)
        r["wall_s"] = time.time() - t0
        rows.append(r)
    print(f"\n{'mode':<10}{'makespan (s)':>14}{'idle mean':>11}{'idle max':>10}{'tok/s':>10}{'preempt':>9}"
          f"{'KV peak':>9}{'calls':>8}{'trunc':>7}{'sim wall (s)':>14}")
    for r in rows:
        print(f"{r['mode']:<10}{r['makespan_s']:>14.1f}{r['idle_mean']:>11.1%}{r['idle_max']:>10.1%}"
              f"{r['tokens_per_s']:>10.0f}{r['preemptions']:>9}{r['kv_peak']:>9.0%}{r['tool_calls']:>8}"
              f"{r['truncated']:>7}{r['wall_s']:>14.1f}")
    by = {r["mode"]: r["makespan_s"] for r in rows}
    print(f"\nmakespan, static / balanced: {by['static'] / by['balanced']:.2f}x; "
          f"per-batch barrier / balanced: {by['barrier'] / by['balanced']:.2f}x")


if __name__ == "__main__":
    main()
