"""Simulated engines, tools and clock for driving the real scheduler and agent loop without a model.

Used by ``benchmarks/bench_scheduler_sim.py`` and the scheduler tests. Time is virtual: ``run_virtual``
runs a coroutine on an asyncio loop whose clock jumps to the next timer instead of sleeping, so hours of
simulated rollout take seconds. Nothing here models the scheduler: ``Scheduler`` and ``AgentLoop`` run as
they do in training; only generation and tool execution are replaced by timed stand-ins.
"""

from __future__ import annotations

import asyncio
import re
import selectors
from collections import deque
from dataclasses import dataclass, field

from .. import chat, sandbox
from .engines import Generation


class _VirtualSelector(selectors.SelectSelector):
    """A selector that never waits: a timeout advances the virtual clock instead."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("simulation deadlock: every task waits and no timer is pending")
        self.now += max(timeout, 0.0)
        return []


def run_virtual(coro):
    """Run ``coro`` on a virtual-clock event loop; returns ``(result, simulated_seconds)``.

    The coroutine must not use threads or real I/O (they would never wake the loop).
    """
    sel = _VirtualSelector()
    loop = asyncio.SelectorEventLoop(sel)
    loop.time = lambda: sel.now
    try:
        return loop.run_until_complete(coro), sel.now
    finally:
        loop.close()


@dataclass
class _Req:
    key: str
    ctx: int                       # context tokens (prompt + earlier turns)
    out: list[int]                 # the whole turn the policy will emit
    fut: asyncio.Future
    pos: int = 0                   # tokens decoded so far
    cached: int = 0                # context tokens already in this engine's KV (prefix cache)


@dataclass
class SimEngine:
    """An inference engine with modelled decode speed and KV capacity (vLLM-like continuous batching).

    Each decode step advances every running request by one token and takes
    ``step_s + step_per_seq_s * running + step_per_kv_token_s * kv_in_use`` seconds (memory-bound decode).
    New context is prefilled at ``prefill_tok_s``; a trajectory's earlier context stays cached between
    its turns. When running requests outgrow ``kv_tokens`` the newest is preempted and later recomputed
    (its whole context prefilled again), as vLLM does.

    ``batch_barrier=True`` models the former in-process vLLM engine, one blocking ``llm.generate`` call per
    batch: waiting requests (up to ``max_batch``) start only when the running batch has finished entirely, and a
    batch's turns are all handed back when its longest one ends; so a short turn waits for the long ones of its
    batch, and a turn that arrives meanwhile waits for the whole batch.

    Args:
        policy: ``policy(key, context_ids, max_new) -> turn_ids``: what the model says (SimPolicy).
        chunk: tokens decoded between scheduling decisions (simulation granularity).
    """
    policy: object
    kv_tokens: int = 250_000
    step_s: float = 0.020
    step_per_seq_s: float = 0.0001
    step_per_kv_token_s: float = 2e-8
    prefill_tok_s: float = 20_000.0
    chunk: int = 16
    batch_barrier: bool = False
    max_batch: int = 256
    busy_s: float = 0.0
    tokens_out: int = 0
    preemptions: int = 0
    peak_kv_used: int = 0
    _waiting: deque = field(default_factory=deque)
    _running: list = field(default_factory=list)
    _cache: dict = field(default_factory=dict)
    _wake: asyncio.Event | None = None
    _task: asyncio.Task | None = None

    def kv_capacity_tokens(self) -> int:
        return self.kv_tokens

    def release(self, key: str) -> None:
        self._cache.pop(key, None)  # the trajectory has ended: its cached context may be evicted

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        ids = self.policy(key, context_ids, max_new_tokens)
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(_Req(key, len(context_ids), ids[:max_new_tokens], fut))
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._serve())
        self._wake.set()
        stop = len(ids) <= max_new_tokens  # otherwise the budget cuts the turn
        out = await fut
        return Generation(out, "stop" if stop else "length")

    def _used(self) -> int:
        return sum(r.ctx + r.pos for r in self._running)

    async def _serve(self) -> None:
        call = deque() if self.batch_barrier else self._waiting  # admitted from: all waiting, or the current call
        returned: list[_Req] = []  # finished, not yet handed back (batch_barrier: until the call ends)
        while True:
            if not self._running and not self._waiting and not call:
                self._wake.clear()
                await self._wake.wait()
            if self.batch_barrier and not self._running and not call:  # the previous call has returned
                call = deque(self._waiting.popleft() for _ in range(min(self.max_batch, len(self._waiting))))
            prefill = 0
            while call and (not self._running or self._used() + call[0].ctx + call[0].pos < self.kv_tokens):
                r = call.popleft()
                r.cached = min(self._cache.get(r.key, 0), r.ctx)
                prefill += r.ctx + r.pos - r.cached
                self._running.append(r)
            n = min(self.chunk, min(len(r.out) - r.pos for r in self._running))
            dt = prefill / self.prefill_tok_s + n * (self.step_s + self.step_per_seq_s * len(self._running)
                                                     + self.step_per_kv_token_s * self._used())
            await asyncio.sleep(dt)
            self.busy_s += dt
            for r in self._running:
                r.pos += n
            self.tokens_out += n * len(self._running)
            self.peak_kv_used = max(self.peak_kv_used, self._used())
            while self._used() > self.kv_tokens and len(self._running) > 1:
                victim = self._running.pop()  # newest first, as vLLM's recompute preemption
                self._cache.pop(victim.key, None)
                self.preemptions += 1
                call.appendleft(victim)
            for r in [r for r in self._running if r.pos >= len(r.out)]:
                self._running.remove(r)
                self._cache[r.key] = r.ctx + len(r.out)
                returned.append(r)
            if not self.batch_barrier or not (self._running or call):  # a blocking call returns all at its end
                for r in returned:
                    r.fut.set_result(r.out)
                returned = []

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


@dataclass
class SimTurn:
    tokens: int                    # tokens the model writes in this turn (EOS included)
    tool_latency_s: float | None   # None: the answer turn


class SimPolicy:
    """Scripted model: a trajectory writes its script turn by turn. ``scripts`` is a list, indexed by the ``i``
    of ``sim-<i>`` in the trajectory's prompt, or a dict by trajectory key (for trajectories sharing a prompt).

    A tool turn is filler tokens followed by a real ``<tool_call>`` whose code carries its latency; the
    final turn ends in ``<answer>``. The filler makes each turn exactly ``SimTurn.tokens`` long.
    """

    def __init__(self, tok, scripts: list[list[SimTurn]] | dict[str, list[SimTurn]],
                 tool_name: str = chat.DEFAULT_TOOL_NAME):
        self.tok, self.scripts, self.tool_name = tok, scripts, tool_name
        self.filler = tok.encode(" x", add_special_tokens=False)[0]
        self.turn_no: dict[str, int] = {}
        self._script: dict[str, list[SimTurn]] = {}

    def __call__(self, key: str, context_ids: list[int], max_new: int) -> list[int]:
        i = self.turn_no.get(key, 0)
        self.turn_no[key] = i + 1
        if key not in self._script:
            self._script[key] = self.scripts[key] if isinstance(self.scripts, dict) else \
                self.scripts[int(re.search(r"sim-(\d+)", self.tok.decode(context_ids[:1024])).group(1))]
        turn = self._script[key][i]
        if turn.tool_latency_s is None:
            tail = "</reason>\n<answer>\\boxed{1}</answer>"
        else:
            tail = "</reason>\n" + chat.tool_call_text(f"latency = {turn.tool_latency_s!r}", tool_name=self.tool_name)
        tail_ids = self.tok.encode(tail, add_special_tokens=False) + [self.tok.eos_token_id]
        return [self.filler] * max(turn.tokens - len(tail_ids), 0) + tail_ids


class SimToolRunner:
    """ToolRunner whose calls take the latency written in their code (virtual seconds)."""

    async def run(self, code: str, stdin: str = "") -> sandbox.ExecResult:
        latency = float(re.search(r"latency = ([0-9.e+-]+)", code).group(1))
        await asyncio.sleep(latency)
        return sandbox.ExecResult("ok", 0, "ok\n", "", latency)
