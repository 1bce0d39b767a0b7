"""Service mode for scale-out: an HTTP API in front of a Redis work queue shared by workers on any node.

The shape follows code-judge, which rStar2-Agent's released client talks to, so existing
deployments interoperate:

- ``POST /run/long-batch`` takes ``{"type": "batch", "submissions": [{"type": "python", "solution": code,
  "input": stdin, "sub_id"?, "limits"?}]}`` and answers ``{"sub_id", "results": [{"sub_id", "success",
  "run_success", "cost", "stdout", "stderr", "reason"}]}`` in submission order, with reason ``""`` |
  ``"worker_timeout"`` | ``"internal_error"``; each result also carries our ``status`` and ``exit_code``.
  ``internal_error`` means the failure is not the code's own: its sandbox worker died (the call was lost), no
  worker answered in time, or Redis was unreachable.
- Limits: a submission may carry ``"limits"``, any fields of :class:`~rstar2.sandbox.results.SandboxLimits`
  (``timeout_s``, ``cpu_s``, ``memory_mb``, ...); fields it leaves out take the API's defaults (its
  ``--timeout-s`` / ``--memory-mb``). The worker that runs it caps every field at its own maxima (the
  worker's ``--timeout-s`` / ``--memory-mb``, i.e. its pool's limits), so an operator bounds what any client
  may ask for.
- Waiting: the API answers within the largest ``timeout_s`` of the batch plus ``--grace-s`` (default 60 s) for
  queueing; calls still unanswered then get ``internal_error``, and those still queued are removed from the
  queue, so nothing runs for a caller that has gone.
- Queue: a Redis list, oldest first (``RPUSH`` by the API, ``BLMOVE`` into a worker's in-flight list). Results do not get
  one Redis list per call: each API process has one reply list (``RPUSH`` + ``EXPIRE`` by workers), read by one
  ``BLPOP`` loop that hands each result to the request waiting for it. So the Redis connections an API
  holds are bounded (``--max-connections``) whatever the batch sizes and the number of requests in flight.
- Workers (``python -m rstar2.sandbox.service worker --redis URL``) pop jobs and run them in a local
  :class:`~rstar2.sandbox.pool.Pool`, so every execution has the pool's isolation. A worker and an API
  outlive a Redis restart: they log, back off and reconnect (the worker keeps its warm pool).
- Faults (``recovery.py``): the calls of a worker that dies mid-call are queued again for another worker; after a
  Redis restart that lost the queue, the API queues the calls it still waits for again; a call is answered once
  (the first result wins). With ``--max-queued N`` a request that would grow the queue past N waiting calls gets
  HTTP 503 (capacity), which the client retries like any infrastructure failure.

Run: ``python -m rstar2.sandbox.service api --redis redis://127.0.0.1:6379/0 --port 8088`` and one or more
``... worker --redis ...`` processes (any nodes that reach the Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid

from . import recovery
from .pool import Pool
from .results import SandboxLimits
# cap_limits and judge_result: re-exported, the service's wire as callers of this module know it
from .wire import (BACKOFF_S, BLOCK_S, DEFAULT_GRACE_S, QUEUE_KEY, REPLY_PREFIX, SOCKET_TIMEOUT_S,  # noqa: F401
                   cap_limits, failure_result, judge_result, parse_limits)
from .worker import run_worker  # noqa: F401  (the worker role of main; re-exported for callers of this module)

log = logging.getLogger("rstar2.sandbox")
class _Replies:
    """The API process's result channel: one Redis list read by one ``BLPOP`` loop, which resolves the
    asyncio Future of each awaited job id. Results for ids nobody awaits (a request that gave up) are
    dropped. Survives Redis restarts (logs, backs off, reconnects)."""

    def __init__(self, r):
        self.r = r
        self.key = REPLY_PREFIX + uuid.uuid4().hex
        self.waiters: dict[str, asyncio.Future] = {}
        self.task: asyncio.Task | None = None
        self.reaper: asyncio.Task | None = None
        self.outages = 0   # Redis errors seen; a request waiting through one checks whether Redis restarted

    def ensure_listening(self) -> None:
        """Start the reading loop (and the reaper of dead workers' calls) in the running event loop unless running."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.listen())
        if self.reaper is None or self.reaper.done():
            self.reaper = asyncio.create_task(recovery.reaper(self.r))

    async def close(self) -> None:
        for task in (self.task, self.reaper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def expect(self, jids: list[str]) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in jids]
        self.waiters.update(zip(jids, futs))
        return futs

    def forget(self, jids: list[str]) -> None:
        for j in jids:
            self.waiters.pop(j, None)

    async def listen(self) -> None:
        from redis.exceptions import RedisError

        pause = BACKOFF_S[0]
        while True:
            try:
                got = await self.r.blpop([self.key], timeout=BLOCK_S)
                if got is None:
                    continue
                msgs = [got[1]] + (await self.r.lpop(self.key, 1000) or [])  # drain what else arrived
                pause = BACKOFF_S[0]
            except RedisError as e:
                self.outages += 1
                log.warning("sandbox API: Redis unavailable (%s: %s); retrying in %.1f s", type(e).__name__, e,
                            pause)
                await self.r.connection_pool.disconnect(inuse_connections=False)  # idle ones are stale too
                await asyncio.sleep(pause)
                pause = min(2 * pause, BACKOFF_S[1])
                continue
            for m in msgs:
                try:
                    msg = json.loads(m)
                    fut, result = self.waiters.pop(msg["id"], None), msg["result"]
                except (ValueError, KeyError, TypeError) as e:  # one bad message must not stop every answer
                    log.error("sandbox API: dropped a malformed result (%r): %.200s", e, m)
                    continue
                if fut is not None and not fut.done():
                    fut.set_result(result)


def create_app(redis_url: str, limits: SandboxLimits | None = None, grace_s: float = DEFAULT_GRACE_S,
               max_connections: int = 32, max_queued: int = 0):
    """The FastAPI app (routes ``GET /ping``, ``POST /run/long-batch``; see the module docstring).

    limits: defaults for fields a submission's ``limits`` leaves out; grace_s: seconds beyond the batch's
    largest ``timeout_s`` to wait before answering ``internal_error`` (no worker alive, or the queue far
    behind); max_connections: Redis connections this process may open (requests wait for a free one);
    max_queued: calls that may wait in the queue before a request is refused with HTTP 503 (0: no limit; a request
    finding the queue empty is always taken). Malformed requests get HTTP 422 naming the submission and field.
    """
    from fastapi import FastAPI, HTTPException
    from redis import asyncio as aredis
    from redis.exceptions import RedisError

    lim = dataclasses.asdict(limits or SandboxLimits())
    pool = aredis.BlockingConnectionPool.from_url(redis_url, max_connections=max_connections, timeout=60,
                                                  socket_timeout=SOCKET_TIMEOUT_S)
    r = aredis.Redis(connection_pool=pool)
    replies = _Replies(r)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        replies.ensure_listening()
        try:
            yield
        finally:
            await replies.close()
            await r.aclose()
            await pool.disconnect()

    app = FastAPI(title="rstar2 sandbox", lifespan=lifespan)

    async def _wait(queued: list[str], futs: list, wait_s: float, ids: dict) -> None:
        """Wait up to ``wait_s`` for ``futs``; after a Redis outage, queue the open calls again if Redis restarted
        (``ids``: the Redis run_id when they were queued, and the outage count seen then)."""
        loop = asyncio.get_running_loop()
        deadline, pending = loop.time() + wait_s, set(futs)
        while pending and (left := deadline - loop.time()) > 0:
            _, pending = await asyncio.wait(pending, timeout=min(left, 1.0))
            if pending and replies.outages != ids["seen"]:
                await _requeue_open(queued, futs, ids)

    async def _requeue_open(queued: list[str], futs: list, ids: dict) -> None:
        try:
            now = await recovery.run_id(r)
            if now != ids["rid"]:
                again = [q for q, f in zip(queued, futs) if not f.done()]
                await r.rpush(QUEUE_KEY, *again)
                log.warning("sandbox API: Redis restarted and lost its queue; %d calls queued again", len(again))
            ids["rid"], ids["seen"] = now, replies.outages
        except RedisError:
            pass  # still down: try again on the next round

    @app.get("/ping")
    async def ping():
        return {"ok": bool(await r.ping())}

    @app.post("/run/long-batch")
    async def long_batch(body: dict):
        subs = body.get("submissions")
        if not isinstance(subs, list) or not subs:
            raise HTTPException(422, "body.submissions must be a non-empty list")
        sub_ids, jids, payloads, timeouts = [], [], [], []
        for i, s in enumerate(subs):
            if not isinstance(s, dict) or s.get("type", "python") != "python" or not isinstance(s.get("solution"), str):
                raise HTTPException(422, f"submissions[{i}] must be {{type: 'python', solution: str, input?: str, "
                                         "limits?: object}}")
            try:
                want = {**lim, **parse_limits(s.get("limits"), f"submissions[{i}].limits")}
            except ValueError as e:
                raise HTTPException(422, str(e)) from None
            try:
                SandboxLimits(**want)  # whatever else SandboxLimits itself refuses
            except ValueError as e:
                raise HTTPException(422, f"submissions[{i}].limits: {e}") from None
            jid = uuid.uuid4().hex
            sub_ids.append(s.get("sub_id") or jid)
            jids.append(jid)
            timeouts.append(want["timeout_s"])
            payloads.append({"id": jid, "reply": replies.key, "code": s["solution"], "stdin": s.get("input") or "",
                             "limits": want})
        wait_s = max(timeouts) + grace_s
        replies.ensure_listening()
        if max_queued:
            try:
                waiting = await r.llen(QUEUE_KEY)
            except RedisError:
                waiting = 0  # queueing below answers the failure
            if waiting and waiting + len(payloads) > max_queued:
                raise HTTPException(503, f"sandbox queue full: {waiting} calls waiting (--max-queued {max_queued})",
                                    headers={"Retry-After": "1"})
        futs = replies.expect(jids)  # before queueing, so no result can arrive unawaited
        queued: list[str] = []
        try:
            try:
                now_s, now_us = await r.time()
                expires = now_s + now_us / 1e6 + wait_s  # Redis's clock, so workers on other nodes agree
                queued = [json.dumps({**p, "expires": expires}) for p in payloads]
                ids = {"rid": await recovery.run_id(r), "seen": replies.outages}
                await r.rpush(QUEUE_KEY, *queued)
            except RedisError as e:
                return {"sub_id": body.get("sub_id") or uuid.uuid4().hex,
                        "results": [failure_result(s, f"sandbox queue unavailable: {e!r}") for s in sub_ids]}
            await _wait(queued, futs, wait_s, ids)
            results = [{**f.result(), "sub_id": s} if f.done() else
                       failure_result(s, f"no sandbox worker answered within {wait_s:.0f} s")
                       for s, f in zip(sub_ids, futs)]
            return {"sub_id": body.get("sub_id") or uuid.uuid4().hex, "results": results}
        finally:
            replies.forget(jids)
            late = [q for q, f in zip(queued, futs) if not f.done()]
            if late:  # those a worker has not popped yet must not run for nobody
                try:
                    async with r.pipeline(transaction=False) as p:
                        for q in late:
                            p.lrem(QUEUE_KEY, 1, q)
                        await p.execute()
                except RedisError as e:
                    log.warning("sandbox API: could not remove %d abandoned jobs (%r); they expire", len(late), e)

    return app


def main(argv=None):
    """Command line: ``api`` or ``worker`` (see the module docstring and ``--help``)."""
    p = argparse.ArgumentParser(prog="python -m rstar2.sandbox.service", description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["api", "worker"])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8088)
    p.add_argument("--timeout-s", type=float, default=5.0,
                   help="api: default per-call wall clock; worker: the most any call may ask for")
    p.add_argument("--memory-mb", type=int, default=1024,
                   help="api: default per-call memory; worker: the most any call may ask for")
    p.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S,
                   help="api: seconds beyond a batch's largest timeout before unanswered calls get internal_error")
    p.add_argument("--max-connections", type=int, default=32, help="api: Redis connections per API process")
    p.add_argument("--max-queued", type=int, default=0,
                   help="api: calls that may wait in the queue before a request gets HTTP 503 (0: no limit)")
    p.add_argument("--workers", type=int, default=None, help="numpy/sympy zygotes in this worker's pool (default: cores)")
    p.add_argument("--lean-workers", type=int, default=None, help="stdlib-only zygotes (default: as --workers)")
    p.add_argument("--full-workers", type=int, default=None, help="scipy/matplotlib zygotes (default: as --workers)")
    p.add_argument("--isolation", default="auto")
    p.add_argument("--allow-unsandboxed", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lim = SandboxLimits(timeout_s=a.timeout_s, memory_mb=a.memory_mb)
    if a.role == "api":
        import uvicorn
        uvicorn.run(create_app(a.redis, lim, grace_s=a.grace_s, max_connections=a.max_connections,
                               max_queued=a.max_queued), host=a.host, port=a.port, log_level="warning")
    else:
        with Pool(lim, workers=a.workers, lean_workers=a.lean_workers, full_workers=a.full_workers,
                  isolation=a.isolation, allow_unsandboxed=a.allow_unsandboxed) as pool:
            log.info("sandbox worker: %d zygotes x %d slots, limits at most %s, queue %s", len(pool.workers),
                     pool.slots, lim, a.redis)
            run_worker(a.redis, pool)


if __name__ == "__main__":
    main()
