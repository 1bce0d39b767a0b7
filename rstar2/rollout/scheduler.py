"""Rollout scheduling over several inference engines (paper §3.2, Fig. 7; spec §4).

``balanced`` (the paper's design): each engine is given K = floor(free KV tokens / (prompt + L))
trajectories, where L is the response budget and free KV is the engine's KV capacity minus the context
its in-flight trajectories hold now. Every trajectory runs as its own task on its engine (sticky, so a
prefix cache keeps its earlier turns); its tool calls are dispatched the moment its turn ends, with no
per-turn barrier; when a trajectory finishes, the freed capacity is refilled from the queue at once.
Engines without a fixed KV size are filled up to ``max_inflight`` trajectories, least loaded first.

``static`` (the baseline the paper replaces, VERL v0.2): trajectories are split evenly across engines up
front, all start at once, and each engine advances its share turn by turn: every turn ends at a barrier
(the round lasts as long as its longest generation), then the round's tool calls run, and the next
turn waits for the slowest of them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from .agent_loop import AgentLoop, Trajectory


class Scheduler:
    """Runs trajectories to completion on ``engines`` through ``agent``.

    Args:
        engines: ``engines.Engine`` objects (``async generate(key, context_ids, max_new_tokens)``,
            ``release(key)``, ``kv_capacity_tokens()``).
        agent: the per-trajectory steps (AgentLoop).
        mode: "balanced" or "static".
        max_response_tokens: L, the response budget of one trajectory (tokens).
        kv_cache_tokens: overrides every engine's reported KV capacity (tokens); None = ask the engine.
        max_inflight: cap on trajectories per engine (always applies; the only cap without a KV size).
    Raises:
        ValueError: no engines or an unknown mode.
    """

    def __init__(self, engines: list, agent: AgentLoop, mode: str = "balanced", max_response_tokens: int = 512,
                 kv_cache_tokens: int | None = None, max_inflight: int = 256):
        if not engines:
            raise ValueError("the scheduler needs at least one engine")
        if mode not in ("balanced", "static"):
            raise ValueError(f"scheduler mode must be 'balanced' or 'static', got {mode!r}")
        self.engines, self.agent, self.mode = list(engines), agent, mode
        self.L, self.kv_override, self.max_inflight = max_response_tokens, kv_cache_tokens, max_inflight
        self.admissions: list[tuple[int, int]] = []  # (engine index, K admitted) per admission wave

    async def run(self, trajs: list[Trajectory], progress: Callable[[int, int], None] | None = None) -> list[Trajectory]:
        """Drive every trajectory to its end; returns them in input order. Errors in any trajectory propagate."""
        if self.mode == "static":
            await self._run_static(trajs, progress)
        else:
            await self._run_balanced(trajs, progress)
        return trajs

    def capacity(self, i: int) -> int | None:
        return self.kv_override if self.kv_override is not None else self.engines[i].kv_capacity_tokens()

    def slots(self, i: int, inflight: dict[int, Trajectory], need: int) -> int:
        """How many more trajectories engine ``i`` takes now: K = free KV // (prompt + L), capped by max_inflight."""
        room = self.max_inflight - len(inflight)
        cap = self.capacity(i)
        if cap is None:
            return max(room, 0)
        free = cap - sum(t.context_tokens for t in inflight.values())
        k = free // need
        if k < 1 and not inflight:
            k = 1  # an engine smaller than one full trajectory still makes progress (it preempts if it must)
        return max(min(k, room), 0)

    async def _drive(self, t: Trajectory, engine) -> None:
        """One trajectory to its end on ``engine``, which is told when it has ended (also on failure)."""
        try:
            await self.agent.run(t, engine)
        finally:
            engine.release(t.key)

    async def _run_balanced(self, trajs, progress) -> None:
        queue = deque(trajs)
        inflight: list[dict[int, Trajectory]] = [{} for _ in self.engines]  # by id(trajectory)
        tasks: set[asyncio.Task] = set()
        wake = asyncio.Event()
        finished = [0, 0]  # completed, reported
        failures: list[BaseException] = []

        def on_done(task: asyncio.Task, i: int, t: Trajectory) -> None:
            inflight[i].pop(id(t), None)
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())
            finished[0] += 1
            wake.set()

        try:
            while queue or tasks:
                # admission wave: per engine K from its free KV now, most free first, until the queue is empty
                grants = []
                for i in range(len(self.engines)):
                    need = (len(queue[0].prompt_ids) if queue else 0) + self.L
                    grants.append(self.slots(i, inflight[i], need) if queue else 0)
                admitted = [0] * len(self.engines)
                order = sorted(range(len(self.engines)), key=lambda i: (-grants[i], len(inflight[i])))
                while queue and any(grants):
                    for i in order:
                        if grants[i] and queue:
                            t = queue.popleft()
                            grants[i] -= 1
                            inflight[i][id(t)] = t
                            task = asyncio.create_task(self._drive(t, self.engines[i]))
                            task.add_done_callback(lambda tk, i=i, t=t: on_done(tk, i, t))
                            tasks.add(task)
                            admitted[i] += 1
                self.admissions += [(i, k) for i, k in enumerate(admitted) if k]
                if not tasks:
                    raise RuntimeError("no engine can take a trajectory")  # unreachable: an idle engine takes one
                await wake.wait()
                wake.clear()
                if failures:
                    raise failures[0]
                if progress and finished[0] > finished[1]:
                    finished[1] = finished[0]
                    progress(finished[0], len(trajs))
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_static(self, trajs, progress) -> None:
        shares = [trajs[i::len(self.engines)] for i in range(len(self.engines))]
        counter = {"done": 0}

        async def run_share(engine, share):
            try:
                while active := [t for t in share if not t.done]:
                    calls = await asyncio.gather(*(self.agent.generate_turn(t, engine) for t in active))  # barrier
                    await asyncio.gather(*(self.agent.run_tool_calls(t, c) for t, c in zip(active, calls) if c))
                    newly = [t for t in active if t.done]
                    for t in newly:
                        engine.release(t.key)
                    if newly and progress:
                        counter["done"] += len(newly)
                        progress(counter["done"], len(trajs))
            finally:
                for t in share:
                    if not t.done:
                        engine.release(t.key)

        await asyncio.gather(*(run_share(e, s) for e, s in zip(self.engines, shares) if s))
