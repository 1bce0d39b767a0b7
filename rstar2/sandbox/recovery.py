"""How the sandbox service recovers calls lost to a fault, so that every call is answered once and none is lost.

- A worker that dies mid-call (killed, OOM, its node gone): each worker refreshes a heartbeat key
  (``ALIVE_PREFIX<worker id>``, ``ALIVE_TTL_MS``) every ``HEARTBEAT_S`` and pops each job atomically into its
  in-flight list (``INFLIGHT_PREFIX<worker id>``: the jobs as queued; ``BLMOVE``, Redis's reliable-queue pattern),
  where it stays until its result is published. The
  API's reaper (``reaper``, every ``REAP_EVERY_S``) takes over the in-flight list of a worker whose heartbeat has
  expired (``RENAME``, so one API wins) and puts its jobs back at the head of the queue, at most ``MAX_REQUEUES``
  times each (then the caller gets ``internal_error``, which the client retries); another worker runs them.
- Redis restarted without its data: the queue, the in-flight hashes and the replies in it are gone. The API notices
  the new ``run_id`` (``run_id``) and queues the jobs it still waits for again.
- Answered once: the API resolves a job id's waiter with the first result that arrives and drops any later one (a
  job run twice, by a worker thought dead and by the one that took it over, is still answered once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from .wire import QUEUE_KEY, RESULT_TTL_S, failure_result

log = logging.getLogger("rstar2.sandbox")

ALIVE_PREFIX = "rstar2:sandbox:alive:"
INFLIGHT_PREFIX = "rstar2:sandbox:inflight:"
HEARTBEAT_S = 1.0
ALIVE_TTL_MS = 3000      # a worker silent this long is taken for dead
REAP_EVERY_S = 1.0
MAX_REQUEUES = 2         # a job whose worker died this often is answered internal_error instead


def heartbeat(r, wid: str, stop: threading.Event) -> None:
    """Worker side (a thread): keep ``wid``'s heartbeat key alive until ``stop``; Redis outages are ridden out."""
    from redis.exceptions import RedisError

    while not stop.is_set():
        try:
            r.set(ALIVE_PREFIX + wid, "1", px=ALIVE_TTL_MS)
        except RedisError:
            pass  # the job loop logs the outage; the key comes back with Redis
        stop.wait(HEARTBEAT_S)


def requeued(raw: str) -> str | None:
    """The job ``raw`` to queue again (its ``requeued`` count raised), or None once ``MAX_REQUEUES`` is reached."""
    job = json.loads(raw)
    n = int(job.get("requeued", 0))
    return None if n >= MAX_REQUEUES else json.dumps({**job, "requeued": n + 1})


async def reap(r) -> int:
    """API side: one pass over the in-flight lists; the jobs of workers without a heartbeat go back to the head of
    the queue (or are answered ``internal_error`` after ``MAX_REQUEUES``). Returns how many jobs it recovered."""
    from redis.exceptions import ResponseError

    recovered = 0
    async for key in r.scan_iter(match=INFLIGHT_PREFIX + "*"):
        key = key.decode() if isinstance(key, bytes) else key
        wid = key[len(INFLIGHT_PREFIX):]
        if await r.exists(ALIVE_PREFIX + wid):
            continue
        claimed = f"{key}:reaped"
        try:
            await r.rename(key, claimed)   # another API may have taken it first
        except ResponseError:
            continue
        jobs = await r.lrange(claimed, 0, -1)
        await r.delete(claimed)
        for raw in jobs:
            again = requeued(raw)
            if again is not None:
                await r.lpush(QUEUE_KEY, again)   # the head: it has waited longest
            else:
                job = json.loads(raw)
                msg = json.dumps({"id": job["id"], "result": failure_result(
                    job["id"], f"the sandbox workers running this call died {MAX_REQUEUES + 1} times")})
                await r.rpush(job["reply"], msg)
                await r.expire(job["reply"], RESULT_TTL_S)
            recovered += 1
        log.warning("sandbox API: worker %s stopped answering; %d of its calls recovered", wid, len(jobs))
    return recovered


async def reaper(r) -> None:
    """API side (a task): ``reap`` every ``REAP_EVERY_S`` for as long as the API runs."""
    from redis.exceptions import RedisError

    while True:
        try:
            await reap(r)
        except RedisError:
            pass  # the reply loop logs the outage
        await asyncio.sleep(REAP_EVERY_S)


async def run_id(r) -> str:
    """The Redis server's ``run_id``: a new one means it restarted and lost what it held."""
    return str((await r.info("server"))["run_id"])
