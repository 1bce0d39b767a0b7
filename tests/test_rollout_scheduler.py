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


class _Recording:
    """Wraps an engine and records every key it is asked to generate for and every release."""

    def __init__(self, inner):
        self.inner, self.generated, self.released = inner, [], []

    def kv_capacity_tokens(self):
        return self.inner.kv_capacity_tokens()

    async def generate(self, key, context_ids, max_new_tokens):
        assert key not in self.released, "a released trajectory came back"
        self.generated.append(key)
        return await self.inner.generate(key, context_ids, max_new_tokens)

    def release(self, key):
        self.released.append(key)
        self.inner.release(key)


def test_every_turn_carries_its_trajectory_key_and_each_end_is_released_once(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = [[SimTurn(60, 0.1)] * (i % 3) + [SimTurn(40, None)] for i in range(7)]
    for mode in ("balanced", "static"):
        policy = SimPolicy(tok, scripts)
        engines = [_Recording(SimEngine(policy, kv_tokens=50_000)) for _ in range(2)]
        cfg = RolloutConfig(max_response_tokens=1024, max_turns=10, scheduler=mode)
        agent = AgentLoop(tok, cfg, SimToolRunner())
        trajs = [agent.new_trajectory({"id": "same", "problem": f"Problem sim-{i}."}) for i in range(len(scripts))]
        assert len({t.key for t in trajs}) == len(trajs)  # unique although the problem id repeats

        async def main():
            try:
                await Scheduler(engines, agent, mode, 1024).run(trajs)
            finally:
                for e in engines:
                    await e.inner.aclose()
        run_virtual(main())
        released = [k for e in engines for k in e.released]
        assert sorted(released) == sorted(t.key for t in trajs), mode
        for t in trajs:  # one engine per trajectory, asked once per turn
            (e,) = [e for e in engines if t.key in e.generated]
            assert e.generated.count(t.key) == len(t.turns)
