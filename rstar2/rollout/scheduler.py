"""Rollout scheduling over several inference engines (paper §3.2, Fig. 7).

``balanced`` (the paper's design): admission is KV-aware. A trajectory may grow to prompt + L tokens (L, the
response budget, counts tool-response tokens too), so admitting it **reserves** that many tokens of its
engine's KV cache until it ends. Engine i may take K_i = floor(free_i / (prompt + L)) more trajectories, with
free_i = its KV capacity (from the engine's own metrics, or ``kv_cache_tokens``) minus what its trajectories
reserve; the reservations together never exceed the capacity, so the engine never has to preempt. (Subtracting
the context the trajectories hold *now* over-commits: they keep growing after admission.)

One queue serves all engines: a new trajectory goes to the engine with the most room (least outstanding work,
as verl's router), where engines within one trajectory of the most prefer the one already holding the same
prompt (its group's prefix); it then stays there for all its turns (sticky: the engine keeps its prefix). Its
tool calls go out the moment a turn ends, with no per-turn barrier; when it ends, its reservation is returned,
the engine is told (``release``) and the queue refills the room at once. An idle engine therefore takes the
next queued trajectory while a full one works. Engines without a fixed KV size are limited by
``max_inflight`` trajectories only.

``reproducible``: the same trajectories always meet in the same batches. Trajectory j goes to engine
j mod n (no placement by load, which depends on timing), each engine's queue is FIFO, a trajectory is announced
to its engine (``expect``) when admitted, and a finished trajectory's room is refilled synchronously, inside its
release, so an engine never sees a gap between one trajectory ending and the next arriving. An engine with
``reproducible`` batching (``engines.BatchingEngine``) then batches each turn only when all its trajectories
wait. Engines without ``expect`` (vLLM, servers) are driven the same way but batch as they like.

``static`` (the baseline the paper replaces, VERL v0.2): trajectories are split evenly across engines up
front, all start at once, and each engine advances its share turn by turn: every turn ends at a barrier
(the round lasts as long as its longest generation), then the round's tool calls run, and the next
turn waits for the slowest of them.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from typing import Callable

from .agent_loop import SCHEDULERS, AgentLoop, Trajectory


def policy_name(mode: str, reproducible: bool) -> str:
    """The scheduling policy that ``Scheduler(mode=mode, reproducible=reproducible)`` runs, as recorded in each
    stage's manifest: ``kv-aware/least-loaded`` (balanced: one queue over all engines, the paper's §3.2 design),
    ``kv-aware/round-robin`` (balanced and reproducible: trajectory j on engine j mod n, one FIFO queue per
    engine) or ``static`` (even split, per-turn barrier)."""
    if mode == "static":
        return "static"
    return "kv-aware/round-robin" if reproducible else "kv-aware/least-loaded"


class Scheduler:
    """Runs trajectories to completion on ``engines`` through ``agent``.

    Args:
        engines: ``engines.Engine`` objects (``async generate(key, context_ids, max_new_tokens)``,
            ``release(key)``, ``kv_capacity_tokens()``).
        agent: the per-trajectory steps (AgentLoop).
        mode: "balanced" or "static".
        max_response_tokens: L, the response budget of one trajectory (tokens).
        kv_cache_tokens: overrides every engine's reported KV capacity (tokens); None = ask the engine.
        max_inflight: cap on trajectories per engine (always applies; the only cap without a KV size); None = none.
        reproducible: deterministic placement and admission (see the module docstring).
    Attributes (balanced mode, for tests and benchmarks):
        admissions: (engine index, trajectories admitted) per admission wave.
        reserved: KV tokens each engine's live trajectories reserve now; peak_reserved: the most ever.
        placements: trajectory key -> engine index.
        policy: ``policy_name`` of this mode.
    Raises:
        ValueError: no engines or an unknown mode.
    """

    def __init__(self, engines: list, agent: AgentLoop, mode: str, max_response_tokens: int,
                 kv_cache_tokens: int | None = None, max_inflight: int | None = None, reproducible: bool = False):
        if not engines:
            raise ValueError("the scheduler needs at least one engine")
        if mode not in SCHEDULERS:
            raise ValueError(f"scheduler mode must be 'balanced' or 'static', got {mode!r}")
        self.engines, self.agent, self.mode = list(engines), agent, mode
        self.L, self.kv_override, self.max_inflight = max_response_tokens, kv_cache_tokens, max_inflight
        self.reproducible = reproducible
        n = len(self.engines)
        self.admissions: list[tuple[int, int]] = []
        self.reserved, self.peak_reserved = [0] * n, [0] * n
        self.placements: dict[str, int] = {}
        self.policy = policy_name(mode, reproducible)
        self._live: list[int] = [0] * n                       # trajectories on each engine now
        self._prompts: list[Counter] = [Counter() for _ in range(n)]  # prompt -> live trajectories with it

    async def run(self, trajs: list[Trajectory], progress: Callable[[int, int], None] | None = None) -> list[Trajectory]:
        """Drive every trajectory to its end; returns them in input order. Errors in any trajectory propagate."""
        if self.mode == "static":
            await self._run_static(trajs, progress)
        else:
            await self._run_balanced(trajs, progress)
        return trajs

    def capacity(self, i: int) -> int | None:
        """Engine ``i``'s KV capacity in tokens (the override, else the engine's report; None = no fixed size)."""
        return self.kv_override if self.kv_override is not None else self.engines[i].kv_capacity_tokens()

    def need(self, t: Trajectory) -> int:
        """KV tokens one trajectory may come to hold: prompt + L (tool-response tokens are inside L)."""
        return len(t.prompt_ids) + self.L

    def room(self, i: int, need: int) -> int:
        """How many more trajectories of ``need`` tokens engine ``i`` takes now: K = unreserved KV // need,
        capped by ``max_inflight``. An engine holding nothing takes one even when it is smaller than ``need``
        (it would preempt rather than never make progress)."""
        k = self.max_inflight - self._live[i] if self.max_inflight is not None else 1 << 30
        cap = self.capacity(i)
        if cap is not None:
            fit = (cap - self.reserved[i]) // need
            k = min(k, fit if self._live[i] else max(fit, 1))
        return max(k, 0)

    def place(self, t: Trajectory) -> int | None:
        """The engine a new trajectory goes to, or None while none has room (see the module docstring)."""
        need = self.need(t)
        rooms = [self.room(i, need) for i in range(len(self.engines))]
        best = max(rooms)
        if best < 1:
            return None
        near = [i for i, r in enumerate(rooms) if r >= max(best - 1, 1)]
        prompt = tuple(t.prompt_ids)
        near = [i for i in near if self._prompts[i][prompt]] or near
        return max(near, key=lambda i: (rooms[i], -self._live[i], -i))

    def _hold(self, i: int, t: Trajectory) -> None:
        self.reserved[i] += self.need(t)
        self.peak_reserved[i] = max(self.peak_reserved[i], self.reserved[i])
        self._live[i] += 1
        self._prompts[i][tuple(t.prompt_ids)] += 1
        self.placements[t.key] = i
        if hasattr(self.engines[i], "expect"):
            self.engines[i].expect(t.key)

    def _free(self, i: int, t: Trajectory) -> None:
        self.reserved[i] -= self.need(t)
        self._live[i] -= 1
        self._prompts[i][tuple(t.prompt_ids)] -= 1

    async def _drive(self, t: Trajectory, i: int, ended: Callable[[int, Trajectory], None]) -> None:
        """One trajectory to its end on engine ``i``, which is told when it has ended (also on failure); then
        ``ended`` (synchronous: it frees the trajectory's room and admits the next ones before anything else runs)."""
        try:
            await self.agent.run(t, self.engines[i])
        finally:
            self.engines[i].release(t.key)
            ended(i, t)

    async def _run_balanced(self, trajs, progress) -> None:
        n = len(self.engines)
        queues = [deque(trajs[i::n]) for i in range(n)] if self.reproducible else [deque(trajs)]
        tasks: set[asyncio.Task] = set()
        wake = asyncio.Event()
        state = {"done": 0, "reported": 0, "stopping": False}
        failures: list[BaseException] = []

        def start(i: int, t: Trajectory) -> None:
            self._hold(i, t)
            task = asyncio.create_task(self._drive(t, i, ended))
            task.add_done_callback(on_done)
            tasks.add(task)
            admitted[i] += 1

        def admit() -> None:
            admitted.clear()
            wave()
            self.admissions += sorted(admitted.items())

        def wave() -> None:
            if self.reproducible:  # engine i serves its own FIFO share
                for i, q in enumerate(queues):
                    while q and self.room(i, self.need(q[0])) >= 1:
                        start(i, q.popleft())
            else:                  # FIFO: the queue's head goes first, to the engine with the most room
                while queues[0] and (i := self.place(queues[0][0])) is not None:
                    start(i, queues[0].popleft())

        def ended(i: int, t: Trajectory) -> None:
            self._free(i, t)
            state["done"] += 1
            if not state["stopping"]:
                admit()
            wake.set()

        def on_done(task: asyncio.Task) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())
            wake.set()

        admitted = Counter()
        try:
            admit()
            while any(queues) or tasks:
                if not tasks:
                    raise RuntimeError("no engine can take a trajectory")  # unreachable: an idle engine takes one
                await wake.wait()
                wake.clear()
                if failures:
                    raise failures[0]
                if progress and state["done"] > state["reported"]:
                    state["reported"] = state["done"]
                    progress(state["done"], len(trajs))
        finally:
            state["stopping"] = True
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_static(self, trajs, progress) -> None:
        shares = [trajs[i::len(self.engines)] for i in range(len(self.engines))]
        for engine, share in zip(self.engines, shares):
            for t in share:
                if hasattr(engine, "expect"):
                    engine.expect(t.key)
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
