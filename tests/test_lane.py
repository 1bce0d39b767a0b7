"""The rollout's compute lane (rstar2/rollout/lane.py): model calls run on the thread that started the rollouts."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rstar2.rollout.lane import run_async, run_blocking


def _where():
    return threading.current_thread()


def test_model_calls_run_on_the_main_thread_while_the_loop_runs_elsewhere():
    async def main():
        loop_thread = threading.current_thread()
        # two calls submitted together are served one after the other, in order, on the caller's thread
        a, b = await asyncio.gather(run_blocking(_where), run_blocking(_where))
        return loop_thread, a, b

    loop_thread, a, b = run_async(main())
    assert a is b is threading.main_thread()
    assert loop_thread is not threading.main_thread()


def test_tool_work_on_the_loop_goes_on_while_a_model_call_blocks():
    """A blocking call on the lane must not stop the event loop (tool calls keep running meanwhile)."""
    started, ticks = threading.Event(), []

    def slow():
        started.set()
        for _ in range(200):  # at most 2 s; the loop's ticks end it sooner
            if len(ticks) >= 3:
                return len(ticks)
            threading.Event().wait(0.01)
        return len(ticks)

    async def ticker():
        while not started.is_set():
            await asyncio.sleep(0.001)
        for _ in range(3):
            ticks.append(1)
            await asyncio.sleep(0.001)

    async def main():
        seen, _ = await asyncio.gather(run_blocking(slow), ticker())
        return seen

    assert run_async(main()) == 3


def test_an_exception_of_a_model_call_reaches_its_caller_and_the_lane_goes_on():
    def boom():
        raise RuntimeError("decode failed")

    async def main():
        with pytest.raises(RuntimeError, match="decode failed"):
            await run_blocking(boom)
        return await run_blocking(lambda: 7)

    assert run_async(main()) == 7
    with pytest.raises(ValueError, match="from the coroutine"):
        run_async(_raise())


async def _raise():
    raise ValueError("from the coroutine")


def test_off_the_main_thread_or_inside_a_running_loop_calls_go_to_worker_threads():
    box = {}

    def in_thread():
        async def main():
            return await run_blocking(_where)
        box["where"] = run_async(main())
        box["me"] = threading.current_thread()

    th = threading.Thread(target=in_thread)
    th.start()
    th.join()
    assert box["where"] is not box["me"] and box["where"] is not threading.main_thread()

    async def outer():  # a caller that already runs a loop (e.g. a notebook): the inner loop gets its own thread
        async def inner():
            return await run_blocking(_where)
        return run_async(inner())

    assert asyncio.run(outer()) is not threading.main_thread()
