"""Service mode for scale-out: an HTTP API in front of a Redis work queue shared by workers on any node.

The shape follows code-judge (spec §3.2), which rStar2-Agent's released client talks to, so existing
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
- Queue: a Redis sorted set scored by submit time (oldest first, ``ZADD`` / ``BZPOPMIN``). Results do not get
  one Redis list per call: each API process has one reply list (``RPUSH`` + ``EXPIRE`` by workers), read by one
  ``BLPOP`` loop that hands each result to the request waiting for it. So the Redis connections an API
  holds are bounded (``--max-connections``) whatever the batch sizes and the number of requests in flight.
- Workers (``python -m rstar2.sandbox.service worker --redis URL``) pop jobs and run them in a local
  :class:`~rstar2.sandbox.pool.Pool`, so every execution has the pool's isolation. A worker and an API
  outlive a Redis restart: they log, back off and reconnect (the worker keeps its warm pool); calls queued
  or answered in the lost Redis come back as ``internal_error`` when their wait runs out.

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
import math
import queue
import threading
import time
import uuid

from .pool import Pool
from .results import ExecResult, SandboxLimits

log = logging.getLogger("rstar2.sandbox")
QUEUE_KEY = "rstar2:sandbox:queue"
REPLY_PREFIX = "rstar2:sandbox:reply:"
RESULT_TTL_S = 3600
DEFAULT_GRACE_S = 60.0
# redis-py (>= 6) gives every read a 5 s socket timeout by default; a blocking command that waits longer
# fails with TimeoutError. So every blocking read here waits at most BLOCK_S, well inside SOCKET_TIMEOUT_S.
BLOCK_S = 1
SOCKET_TIMEOUT_S = 10.0
BACKOFF_S = (0.5, 10.0)  # first and largest pause before reconnecting to Redis
LIMIT_TYPES = {f.name: type(f.default) for f in dataclasses.fields(SandboxLimits)}


def judge_result(sub_id: str, res: ExecResult) -> dict:
    """An ExecResult in code-judge's SubmissionResult shape (plus ``status`` and ``exit_code``).

    reason: ``worker_timeout`` for a timeout; ``internal_error`` for a failure that is not the code's own
    (status ``error`` with no exit code: the pool lost the call, e.g. its zygote crashed); otherwise ``""``.
    """
    if res.status == "timeout":
        reason = "worker_timeout"
    elif res.status == "error" and res.exit_code is None:
        reason = "internal_error"
    else:
        reason = ""
    return {"sub_id": sub_id, "success": res.status == "ok", "run_success": res.exit_code == 0,
            "cost": res.duration_s, "stdout": res.stdout, "stderr": res.stderr, "reason": reason,
            "status": res.status, "exit_code": res.exit_code}


def failure_result(sub_id: str, why: str) -> dict:
    """The result of a call the service could not run or answer (reason ``internal_error``)."""
    return judge_result(sub_id, ExecResult("error", None, "", why, 0.0))


def parse_limits(raw, where: str) -> dict:
    """Check a submission's optional ``limits`` object; returns it as a dict (``{}`` for None).

    Fields are those of :class:`SandboxLimits`, each a positive number (an integer for the integer fields).
    Raises ValueError naming ``where`` and the field for anything else.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object with fields of SandboxLimits ({', '.join(LIMIT_TYPES)})")
    for k, v in raw.items():
        typ = LIMIT_TYPES.get(k)
        if typ is None:
            raise ValueError(f"{where}.{k}: unknown limit; expected one of {', '.join(LIMIT_TYPES)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf or \
                (typ is int and not float(v).is_integer()):
            raise ValueError(f"{where}.{k} must be a positive {typ.__name__}, got {v!r}")
    return dict(raw)


def cap_limits(requested: dict, maxima: SandboxLimits) -> SandboxLimits:
    """The limits a worker applies: each field of ``requested`` capped at ``maxima`` (a field left out, or
    one that is not a number, gets the maximum; unknown fields are ignored)."""
    out = {}
    for name, typ in LIMIT_TYPES.items():
        top = getattr(maxima, name)
        v = requested.get(name)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
        out[name] = typ(min(v, top)) if ok else top
    return SandboxLimits(**out)


class _Replies:
    """The API process's result channel: one Redis list read by one ``BLPOP`` loop, which resolves the
    asyncio Future of each awaited job id. Results for ids nobody awaits (a request that gave up) are
    dropped. Survives Redis restarts (logs, backs off, reconnects)."""

    def __init__(self, r):
        self.r = r
        self.key = REPLY_PREFIX + uuid.uuid4().hex
        self.waiters: dict[str, asyncio.Future] = {}
        self.task: asyncio.Task | None = None

    def ensure_listening(self) -> None:
        """Start the reading loop in the running event loop unless it is running already."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.listen())

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

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
               max_connections: int = 32):
    """The FastAPI app (routes ``GET /ping``, ``POST /run/long-batch``; see the module docstring).

    limits: defaults for fields a submission's ``limits`` leaves out; grace_s: seconds beyond the batch's
    largest ``timeout_s`` to wait before answering ``internal_error`` (no worker alive, or the queue far
    behind); max_connections: Redis connections this process may open (requests wait for a free one).
    Malformed requests get HTTP 422 naming the submission and field.
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
        futs = replies.expect(jids)  # before queueing, so no result can arrive unawaited
        queued: list[str] = []
        try:
            try:
                now_s, now_us = await r.time()
                expires = now_s + now_us / 1e6 + wait_s  # Redis's clock, so workers on other nodes agree
                queued = [json.dumps({**p, "expires": expires}) for p in payloads]
                await r.zadd(QUEUE_KEY, {q: time.time() for q in queued})
            except RedisError as e:
                return {"sub_id": body.get("sub_id") or uuid.uuid4().hex,
                        "results": [failure_result(s, f"sandbox queue unavailable: {e!r}") for s in sub_ids]}
            await asyncio.wait(futs, timeout=wait_s)
            results = [{**f.result(), "sub_id": s} if f.done() else
                       failure_result(s, f"no sandbox worker answered within {wait_s:.0f} s")
                       for s, f in zip(sub_ids, futs)]
            return {"sub_id": body.get("sub_id") or uuid.uuid4().hex, "results": results}
        finally:
            replies.forget(jids)
            late = [q for q, f in zip(queued, futs) if not f.done()]
            if late:  # those a worker has not popped yet must not run for nobody
                try:
                    await r.zrem(QUEUE_KEY, *late)
                except RedisError as e:
                    log.warning("sandbox API: could not remove %d abandoned jobs (%r); they expire", len(late), e)

    return app


def _publish(r, out: queue.Queue, stop: threading.Event) -> None:
    """Push finished results (``(reply_key, message)`` from ``out``) to Redis, retrying through outages;
    runs until ``stop`` is set and ``out`` is empty."""
    from redis.exceptions import RedisError

    pause = BACKOFF_S[0]
    while not (stop.is_set() and out.empty()):
        try:
            key, msg = out.get(timeout=0.5)
        except queue.Empty:
            continue
        while True:
            try:
                with r.pipeline(transaction=False) as p:
                    p.rpush(key, msg).expire(key, RESULT_TTL_S).execute()
                pause = BACKOFF_S[0]
                break
            except RedisError as e:
                if stop.is_set():
                    log.warning("sandbox worker: result dropped at shutdown, Redis unavailable (%s)", e)
                    break
                log.warning("sandbox worker: cannot publish a result, Redis unavailable (%s: %s); retrying in "
                            "%.1f s", type(e).__name__, e, pause)
                stop.wait(pause)
                pause = min(2 * pause, BACKOFF_S[1])


def run_worker(redis_url: str, pool: Pool, stop: threading.Event | None = None, max_in_flight: int | None = None,
               maxima: SandboxLimits | None = None) -> None:
    """Pop jobs from the queue and run them in ``pool`` until ``stop`` is set; results go to each job's
    reply list. Blocks the calling thread.

    max_in_flight: jobs taken at once (default: the pool's zygotes × slots); maxima: per-field caps on the
    limits a job asks for (default: ``pool.limits``, i.e. the worker's ``--timeout-s`` / ``--memory-mb``).
    A job whose API has given up (past its ``expires``, by Redis's clock) is dropped unrun. Redis errors
    never end the loop: it logs, backs off (0.5 s doubling to 10 s) and reconnects, keeping ``pool``.
    Results still being published when ``stop`` is set are flushed by a background thread.
    """
    import redis
    from redis.exceptions import RedisError

    r = redis.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT_S)
    maxima = maxima or pool.limits
    cap = max_in_flight or len(pool.workers) * pool.slots
    slots = threading.Semaphore(cap)
    stop = stop or threading.Event()
    out: queue.Queue = queue.Queue()
    threading.Thread(target=_publish, args=(r, out, stop), daemon=True, name="sandbox-publish").start()

    def answer(job, res: ExecResult):
        out.put((job["reply"], json.dumps({"id": job["id"], "result": judge_result(job["id"], res)})))
        slots.release()

    def done(job, fut):
        try:
            res = fut.result()
        except Exception as e:  # the pool never fails a call, but never lose the answer either
            res = ExecResult("error", None, "", f"sandbox worker failed: {e!r}", 0.0)
        answer(job, res)

    pause = BACKOFF_S[0]
    while not stop.is_set():
        if not slots.acquire(timeout=0.5):
            continue
        try:
            got = r.bzpopmin(QUEUE_KEY, timeout=BLOCK_S)
            if got is not None:
                now_s, now_us = r.time()
            pause = BACKOFF_S[0]
        except RedisError as e:
            slots.release()
            log.warning("sandbox worker: Redis unavailable (%s: %s); retrying in %.1f s", type(e).__name__, e,
                        pause)
            r.connection_pool.disconnect(inuse_connections=False)  # idle ones are stale too
            stop.wait(pause)
            pause = min(2 * pause, BACKOFF_S[1])
            continue
        if got is None:
            slots.release()
            continue
        try:
            job = json.loads(got[1])
            code, _, _ = job["code"], job["reply"], job["id"]  # without a reply list and id it cannot be answered
        except (ValueError, KeyError, TypeError) as e:
            slots.release()
            log.error("sandbox worker: dropped a malformed job (%r): %.200s", e, got[1])
            continue
        if job.get("expires") is not None and now_s + now_us / 1e6 > job["expires"]:
            slots.release()
            log.info("sandbox worker: dropped job %s, its API stopped waiting", job.get("id"))
            continue
        try:
            lim = cap_limits(job.get("limits") or {}, maxima)
        except ValueError as e:  # a producer other than our API sent limits SandboxLimits refuses
            answer(job, ExecResult("error", None, "", f"sandbox worker refused the job's limits: {e}", 0.0))
            continue
        try:
            fut = pool.submit(code, job.get("stdin") or "", lim)
        except RuntimeError as e:  # no zygote could be started (or the pool is closing): answer, keep going
            log.error("sandbox worker: pool refused a call (%s)", e)
            answer(job, ExecResult("error", None, "", f"sandbox worker failed: {e}", 0.0))
            stop.wait(pause)
            continue
        fut.add_done_callback(lambda f, job=job: done(job, f))


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
    p.add_argument("--workers", type=int, default=None, help="zygotes in this worker's pool (default: cores)")
    p.add_argument("--isolation", default="auto")
    p.add_argument("--allow-unsandboxed", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lim = SandboxLimits(timeout_s=a.timeout_s, memory_mb=a.memory_mb)
    if a.role == "api":
        import uvicorn
        uvicorn.run(create_app(a.redis, lim, grace_s=a.grace_s, max_connections=a.max_connections),
                    host=a.host, port=a.port, log_level="warning")
    else:
        with Pool(lim, workers=a.workers, isolation=a.isolation, allow_unsandboxed=a.allow_unsandboxed) as pool:
            log.info("sandbox worker: %d zygotes x %d slots, limits at most %s, queue %s", len(pool.workers),
                     pool.slots, lim, a.redis)
            run_worker(a.redis, pool)


if __name__ == "__main__":
    main()
