"""The scheduler, driven on simulated engines and a virtual clock (rollout/sim.py): the issue-21 probes (a short
turn is not held back by a long one; KV admission never over-commits; an idle engine takes queued work)."""

import asyncio
import random

from rstar2.rollout import AgentLoop, RolloutConfig, Scheduler
from rstar2.rollout.sim import SimEngine, SimPolicy, SimToolRunner, SimTurn, run_virtual


def _run(tok, scripts, mode, n_engines=2, kv=100_000, budget=4096):
    policy = SimPolicy(tok, scripts)
    engines = [SimEngine(policy, kv_tokens=kv) for _ in range(n_engines)]
    cfg = RolloutConfig(max_response_tokens=budget, max_turns=10, scheduler=mode)
    agent = AgentLoop(tok, cfg, SimToolRunner())
    trajs = [agent.new_trajectory({"id": i, "problem": f"Problem sim-{i}."}) for i in range(len(scripts))]
    sched = Scheduler(engines, agent, mode, budget, max_inflight=256)
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
        self.inner, self.generated, self.released, self.returned_at = inner, [], [], {}

    def kv_capacity_tokens(self):
        return self.inner.kv_capacity_tokens()

    async def generate(self, key, context_ids, max_new_tokens):
        assert key not in self.released, "a released trajectory came back"
        self.generated.append(key)
        out = await self.inner.generate(key, context_ids, max_new_tokens)
        self.returned_at.setdefault(key, asyncio.get_running_loop().time())  # the trajectory's first turn
        return out

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


def _drive(tok, scripts, engines, budget, mode="balanced", kv_override=None, group_prompt=False):
    """Run ``scripts`` (a list) through the real Scheduler on ``engines``; returns (trajs, scheduler, makespan)."""
    cfg = RolloutConfig(max_response_tokens=budget, max_turns=10, scheduler=mode)
    agent = AgentLoop(tok, cfg, SimToolRunner())
    trajs = [agent.new_trajectory({"id": i, "problem": "Problem sim-0." if group_prompt else f"Problem sim-{i}."})
             for i in range(len(scripts))]
    by_key = {t.key: s for t, s in zip(trajs, scripts)}
    for e in engines:
        getattr(e, "inner", e).policy = SimPolicy(tok, by_key)
    sched = Scheduler(engines, agent, mode, budget, kv_override, max_inflight=None)

    async def main():
        try:
            await sched.run(trajs)
        finally:
            for e in engines:
                await getattr(e, "inner", e).aclose()
    _, makespan = run_virtual(main())
    assert all(t.done for t in trajs)
    return trajs, sched, makespan


def test_a_short_turn_is_not_held_back_by_a_long_one(qwen_tokenizer):
    """Probe (a): 1 ms per decode step; a 60-token turn and a 1,000-token turn start together on one engine.
    One blocking call per batch (the former in-process vLLM engine) returns the short turn with the long one,
    after 1.0 s; the continuous-batching engine after its own 60 steps, and its tool call goes out at once."""
    scripts = [[SimTurn(1000, 0.5), SimTurn(60, None)], [SimTurn(60, 0.5), SimTurn(60, None)]]
    at = {}
    for barrier in (True, False):
        eng = _Recording(SimEngine(None, step_s=0.001, step_per_seq_s=0.0, step_per_kv_token_s=0.0,
                                   prefill_tok_s=1e9, batch_barrier=barrier))
        trajs, _, _ = _drive(qwen_tokenizer, scripts, [eng], 2048)
        at[barrier] = eng.returned_at[trajs[1].key]
        assert [len(t.tool_calls) for t in trajs] == [1, 1]
    assert at[True] >= 1.0 and at[False] <= 0.07, at


def _random_workload(rng, n):
    return [[SimTurn(rng.randint(20, 300), rng.uniform(0.0, 2.0)) for _ in range(rng.randint(0, 3))]
            + [SimTurn(rng.randint(20, 300), None)] for _ in range(n)]


def test_kv_admission_never_over_commits_on_random_workloads(qwen_tokenizer):
    """Probe (b), as a property over 25 seeded random workloads (1-3 engines, capacities of 1-5 trajectories'
    worst case, 2-14 trajectories): the tokens reserved on an engine never exceed its KV capacity, the engine
    never holds more than it, never preempts, and the first wave packs every engine full (K = capacity // need)."""
    tok = qwen_tokenizer
    rng = random.Random(21)
    prompt = len(AgentLoop(tok, RolloutConfig(), SimToolRunner()).new_trajectory(
        {"id": 0, "problem": "Problem sim-0."}).prompt_ids)
    for _ in range(25):
        budget = rng.choice([512, 1024, 2048])
        need = prompt + budget
        kvs = [rng.randint(need, 5 * need + need // 2) for _ in range(rng.randint(1, 3))]
        engines = [SimEngine(None, kv_tokens=kv) for kv in kvs]
        n = rng.randint(2, 14)
        _, sched, _ = _drive(tok, _random_workload(rng, n), engines, budget)
        for kv, e, peak in zip(kvs, engines, sched.peak_reserved):
            assert peak <= kv and e.peak_kv_used <= kv and e.preemptions == 0, (kv, peak, e.peak_kv_used)
        first_wave = sum(k for _, k in sched.admissions[:len(engines)])
        assert first_wave == min(n, sum(kv // need for kv in kvs))
        assert sched.reserved == [0] * len(engines)  # every reservation was returned


def test_over_commit_is_seen_by_the_check(qwen_tokenizer):
    """The property above can fail: admitting against 3x the engine's real KV makes it preempt."""
    tok = qwen_tokenizer
    scripts = [[SimTurn(400, 0.1), SimTurn(400, None)] for _ in range(8)]
    eng = SimEngine(None, kv_tokens=4000)
    _drive(tok, scripts, [eng], 1024, kv_override=12_000)
    assert eng.preemptions > 0 and eng.peak_kv_used > 4000


def test_an_idle_engine_takes_queued_work_from_a_full_one(qwen_tokenizer):
    """Probe (c): two engines with room for 2 trajectories each, the first 10x slower; one group of 8 with the same
    prompt. The group goes to the engine holding its prefix until that one is full, then to the other; as the fast
    engine frees room it takes the queue, so it runs the other 6 while the slow one runs its first 2 (the static
    split would give each 4)."""
    tok = qwen_tokenizer
    budget = 1024
    prompt = len(AgentLoop(tok, RolloutConfig(), SimToolRunner()).new_trajectory(
        {"id": 0, "problem": "Problem sim-0."}).prompt_ids)
    scripts = [[SimTurn(200, 0.2), SimTurn(100, None)] for _ in range(8)]

    def engines():
        return [SimEngine(None, kv_tokens=2 * (prompt + budget), step_s=0.2),
                SimEngine(None, kv_tokens=2 * (prompt + budget), step_s=0.02)]
    trajs, sched, t_balanced = _drive(tok, scripts, engines(), budget, group_prompt=True)
    on = [sched.placements[t.key] for t in trajs]
    assert on[:4] == [0, 0, 1, 1]  # prefix engine first, the other once it is full
    assert on.count(1) == 6 and sched.admissions[0] == (0, 2) and sched.admissions[1] == (1, 2), on
    slow_alone = _drive(tok, scripts[:2], engines()[:1], budget, group_prompt=True)[2]
    assert t_balanced <= slow_alone * 1.01  # the step lasts as long as the slow engine's own two trajectories
