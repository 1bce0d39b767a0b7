"""The scheduler, driven on simulated engines and a virtual clock (rollout/sim.py)."""

import asyncio

from rstar2.rollout import AgentLoop, RolloutConfig, Scheduler
from rstar2.rollout.sim import SimEngine, SimPolicy, SimToolRunner, SimTurn, run_virtual


def _run(tok, scripts, mode, n_engines=2, kv=100_000, budget=4096):
    policy = SimPolicy(tok, scripts)
    engines = [SimEngine(policy, kv_tokens=kv) for _ in range(n_engines)]
    cfg = RolloutConfig(max_response_tokens=budget, max_turns=10, scheduler=mode)
    agent = AgentLoop(tok, cfg, SimToolRunner())
    trajs = [agent.new_trajectory({"id": i, "problem": f"Problem sim-{i}."}) for i in range(len(scripts))]
    sched = Scheduler(engines, agent, mode, budget)
    seen = []

    async def main():
        try:
            await sched.run(trajs, progress=lambda d, n: seen.append((d, n)))
        finally:
            for e in engines:
                await e.aclose()
    _, makespan = run_virtual(main())
    return trajs, sched, engines, makespan, seen


def test_virtual_clock_jumps_over_sleeps():
    async def nap():
        await asyncio.sleep(3600)
        return "ok"
    assert run_virtual(nap()) == ("ok", 3600.0)


def test_every_trajectory_finishes_with_its_scripted_turns(qwen_tokenizer):
    scripts = [[SimTurn(100, 0.5), SimTurn(50 + 10 * i, 1.0), SimTurn(80, None)] for i in range(6)]
    for mode in ("balanced", "static"):
        trajs, _, _, _, seen = _run(qwen_tokenizer, scripts, mode)
        assert all(t.finish_reason == "answer" and len(t.turns) == 3 for t in trajs)
        assert all(len(t.tool_calls) == 2 and t.tool_calls[0]["status"] == "ok" for t in trajs)
        assert seen[-1] == (6, 6)
        assert all(len(t.response_ids) == len(t.response_mask) for t in trajs)


def test_admission_is_bounded_by_free_kv(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = [[SimTurn(200, None)] for _ in range(10)]
    prompt = len(AgentLoop(tok, RolloutConfig(), SimToolRunner()).new_trajectory({"id": 0, "problem": "Problem sim-0."}).prompt_ids)
    kv = 3 * (prompt + 1024) + 10  # room for exactly K = 3 trajectories at once
    _, sched, engines, _, _ = _run(tok, scripts, "balanced", n_engines=1, kv=kv, budget=1024)
    assert sched.admissions[0] == (0, 3)
    assert sum(k for _, k in sched.admissions) == 10 and all(k <= 3 for _, k in sched.admissions)
    assert engines[0].preemptions == 0


def test_balanced_beats_static_when_one_turn_is_long(qwen_tokenizer):
    # one straggler per engine share: static waits at every turn barrier, balanced keeps the engines busy
    scripts = [[SimTurn(3000, 0.2), SimTurn(100, None)]] + [[SimTurn(100, 2.0)] * 3 + [SimTurn(100, None)]] * 7
    _, _, _, t_static, _ = _run(qwen_tokenizer, scripts, "static")
    _, _, _, t_balanced, _ = _run(qwen_tokenizer, scripts, "balanced")
    assert t_balanced < t_static
