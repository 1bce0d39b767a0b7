"""The sandbox service's worker (``python -m rstar2.sandbox.service worker``): pops jobs from the Redis queue, runs
them in a local :class:`~rstar2.sandbox.pool.Pool` (so every execution has the pool's isolation) and pushes each
result to its caller's reply list. The API side and the module overview: ``service.py``; how a worker's death or a Redis
restart loses no call: ``recovery.py`` (heartbeat, in-flight registry)."""

from __future__ import annotations

import json
import logging
import queue
import threading
import uuid

from . import recovery
from .pool import Pool
from .results import ExecResult, SandboxLimits
from .wire import BACKOFF_S, BLOCK_S, QUEUE_KEY, RESULT_TTL_S, SOCKET_TIMEOUT_S, cap_limits, judge_result

log = logging.getLogger("rstar2.sandbox")


def _publish(r, out: queue.Queue, stop: threading.Event, wid: str) -> None:
    """Push finished results (``(reply_key, message, the job as queued)`` from ``out``) to Redis and take each job
    off worker ``wid``'s in-flight list, retrying through outages; runs until ``stop`` is set and ``out`` is empty."""
    from redis.exceptions import RedisError

    pause = BACKOFF_S[0]
    while not (stop.is_set() and out.empty()):
        try:
            key, msg, raw = out.get(timeout=0.5)
        except queue.Empty:
            continue
        while True:
            try:
                with r.pipeline(transaction=False) as p:
                    p.rpush(key, msg).expire(key, RESULT_TTL_S).lrem(recovery.INFLIGHT_PREFIX + wid, 1, raw).execute()
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
    Results still being published when ``stop`` is set are flushed by a background thread. A heartbeat and the
    in-flight registry let an API requeue this worker's calls if it dies (``recovery``).
    """
    import redis
    from redis.exceptions import RedisError

    r = redis.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT_S)
    maxima = maxima or pool.limits
    cap = max_in_flight or len(pool.workers) * pool.slots
    slots = threading.Semaphore(cap)
    stop = stop or threading.Event()
    out: queue.Queue = queue.Queue()
    wid = uuid.uuid4().hex
    threading.Thread(target=_publish, args=(r, out, stop, wid), daemon=True, name="sandbox-publish").start()
    threading.Thread(target=recovery.heartbeat, args=(r, wid, stop), daemon=True, name="sandbox-heartbeat").start()

    def answer(job, raw: str, res: ExecResult):
        out.put((job["reply"], json.dumps({"id": job["id"], "result": judge_result(job["id"], res)}), raw))
        slots.release()

    def drop(raw: str) -> None:
        try:
            r.lrem(recovery.INFLIGHT_PREFIX + wid, 1, raw)
        except RedisError:
            pass  # a reaper may requeue it once; the API answers each call once anyway
        slots.release()

    def done(job, raw, fut):
        try:
            res = fut.result()
        except Exception as e:  # the pool never fails a call, but never lose the answer either
            res = ExecResult("error", None, "", f"sandbox worker failed: {e!r}", 0.0)
        answer(job, raw, res)

    pause = BACKOFF_S[0]
    while not stop.is_set():
        if not slots.acquire(timeout=0.5):
            continue
        try:
            # Atomic pop into this worker's in-flight list (Redis's reliable-queue pattern): a worker killed at any
            # moment after the pop leaves the job where the API's reaper finds it.
            got = r.blmove(QUEUE_KEY, recovery.INFLIGHT_PREFIX + wid, BLOCK_S, "LEFT", "RIGHT")
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
        raw = got.decode() if isinstance(got, bytes) else got
        try:
            job = json.loads(raw)
            code, _, _ = job["code"], job["reply"], job["id"]  # without a reply list and id it cannot be answered
        except (ValueError, KeyError, TypeError) as e:
            drop(raw)
            log.error("sandbox worker: dropped a malformed job (%r): %.200s", e, raw)
            continue
        if job.get("expires") is not None and now_s + now_us / 1e6 > job["expires"]:
            drop(raw)
            log.info("sandbox worker: dropped job %s, its API stopped waiting", job.get("id"))
            continue
        try:
            lim = cap_limits(job.get("limits") or {}, maxima)
        except ValueError as e:  # a producer other than our API sent limits SandboxLimits refuses
            answer(job, raw, ExecResult("error", None, "", f"sandbox worker refused the job's limits: {e}", 0.0))
            continue
        try:
            fut = pool.submit(code, job.get("stdin") or "", lim)
        except RuntimeError as e:  # no zygote could be started (or the pool is closing): answer, keep going
            log.error("sandbox worker: pool refused a call (%s)", e)
            answer(job, raw, ExecResult("error", None, "", f"sandbox worker failed: {e}", 0.0))
            stop.wait(pause)
            continue
        fut.add_done_callback(lambda f, job=job, raw=raw: done(job, raw, f))
