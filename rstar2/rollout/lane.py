"""The caller's thread as the rollout's compute lane: model calls run on the thread that started the rollouts.

``run_async`` drives a rollout's event loop (agent loop, scheduler, tool calls). The engines' blocking model calls
(``BatchingEngine._generate_batch``) must not hold up that loop, so they run elsewhere. Where they run matters on
a CPU: PyTorch's intra-op threads come from GNU OpenMP (libgomp), which counts every thread pool it manages and,
once they outnumber the CPUs, stops spinning between parallel regions. The main thread already has a pool (model
loading, training); a worker thread that decodes gets a second one, so on a 2-core machine every small operator
of a decode step waits for a sleeping thread to wake. Measured on a 2-core Xeon (Sapphire Rapids), SmolLM2-135M,
16 rows, bf16: 82 ms per decode step on the main thread (CPU use 1.99 cores), 113 ms on a worker thread (1.30).

So when ``run_async`` is called on the main thread it runs the event loop on a helper thread and serves the
model calls itself (``Lane.serve``); ``run_blocking`` sends a call to the lane of the running loop, or to a worker
thread (``asyncio.to_thread``) where there is none. Calls are served one at a time in submission order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any, Callable

_LANES: dict[int, "Lane"] = {}   # id(event loop) -> the lane serving its model calls
_LOCK = threading.Lock()


class Lane:
    """A queue of calls served by one thread (``serve``), until ``stop``."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fut, fn, args))
        return fut

    def stop(self) -> None:
        self._calls.put(None)

    def serve(self) -> None:
        """Run submitted calls on this thread until ``stop``; each call's result or exception goes to its future."""
        while (item := self._calls.get()) is not None:
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 (handed to the awaiting coroutine)
                fut.set_exception(e)


async def run_blocking(fn: Callable, *args) -> Any:
    """``fn(*args)`` on the running loop's lane (the thread that called ``run_async``), else on a worker thread."""
    lane = _LANES.get(id(asyncio.get_running_loop()))
    if lane is None:
        return await asyncio.to_thread(fn, *args)
    return await asyncio.wrap_future(lane.submit(fn, *args))


def run_async(coro):
    """Run a coroutine to completion from synchronous code and return its result (its exception is raised here).

    On the main thread without a running loop: the loop runs on a helper thread while this thread serves the
    model calls that ``run_blocking`` sends (see the module docstring). Elsewhere, or when the caller's thread
    already runs a loop: the coroutine runs on its own loop and ``run_blocking`` uses worker threads.
    """
    try:
        asyncio.get_running_loop()
        nested = True
    except RuntimeError:
        nested = False
    if not nested and threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    lane = None if nested else Lane()
    box: dict = {}

    async def registered():
        key = id(asyncio.get_running_loop())
        if lane is not None:
            with _LOCK:
                _LANES[key] = lane
        try:
            return await coro
        finally:
            with _LOCK:
                _LANES.pop(key, None)

    def target():
        try:
            box["value"] = asyncio.run(registered())
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            box["error"] = e
        finally:
            if lane is not None:
                lane.stop()

    th = threading.Thread(target=target, name="rollout-loop", daemon=True)
    th.start()
    if lane is not None:
        lane.serve()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
