"""Service mode for scale-out: an HTTP API in front of a Redis work queue shared by workers on any node.

The shape follows code-judge (spec §3.2), which rStar2-Agent's released client talks to, so existing
deployments interoperate:

- ``POST /run/long-batch`` takes ``{"type": "batch", "submissions": [{"type": "python", "solution": code,
  "input": stdin, "sub_id"?}]}`` and answers ``{"sub_id", "results": [{"sub_id", "success", "run_success",
  "cost", "stdout", "stderr", "reason"}]}`` with reason ``""`` | ``"worker_timeout"`` | ``"internal_error"``;
  each result also carries our ``status`` and ``exit_code``.
- Queue: a Redis sorted set scored by submit time (oldest first, ``ZADD`` / ``BZPOPMIN``); each result goes to
  its own Redis list (``RPUSH`` + ``EXPIRE``), which the API waits on with ``BLPOP``.
- Workers (``python -m rstar2.sandbox.service worker --redis URL``) pop jobs and run them in a local
  :class:`~rstar2.sandbox.pool.Pool`, so every execution has the pool's isolation.

Run: ``python -m rstar2.sandbox.service api --redis redis://127.0.0.1:6379/0 --port 8088`` and one or more
``... worker --redis ...`` processes (any nodes that reach the Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
import uuid

from .pool import Pool
from .results import ExecResult, SandboxLimits

log = logging.getLogger("rstar2.sandbox")
QUEUE_KEY = "rstar2:sandbox:queue"
RESULT_PREFIX = "rstar2:sandbox:result:"
RESULT_TTL_S = 3600


def judge_result(sub_id: str, res: ExecResult) -> dict:
    """An ExecResult in code-judge's SubmissionResult shape (plus status and exit_code)."""
    reason = {"timeout": "worker_timeout"}.get(res.status, "")
    return {"sub_id": sub_id, "success": res.status == "ok", "run_success": res.exit_code == 0,
            "cost": res.duration_s, "stdout": res.stdout, "stderr": res.stderr, "reason": reason,
            "status": res.status, "exit_code": res.exit_code}


def create_app(redis_url: str, limits: SandboxLimits | None = None):
    """The FastAPI app. Each job carries ``limits``; a job not answered within timeout + 60 s gets
    reason ``internal_error`` (no worker alive, or the queue is far behind)."""
    from fastapi import FastAPI, HTTPException
    from redis import asyncio as aredis

    lim = limits or SandboxLimits()
    app = FastAPI(title="rstar2 sandbox")
    r = aredis.from_url(redis_url)

    @app.get("/ping")
    async def ping():
        return {"ok": bool(await r.ping())}

    @app.post("/run/long-batch")
    async def long_batch(body: dict):
        subs = body.get("submissions")
        if not isinstance(subs, list) or not subs:
            raise HTTPException(422, "body.submissions must be a non-empty list")
        jobs = []
        for i, s in enumerate(subs):
            if not isinstance(s, dict) or s.get("type", "python") != "python" or not isinstance(s.get("solution"), str):
                raise HTTPException(422, f"submissions[{i}] must be {{type: 'python', solution: str, input?: str}}")
            jid = uuid.uuid4().hex
            jobs.append((s.get("sub_id") or jid, jid))
            payload = {"id": jid, "code": s["solution"], "stdin": s.get("input") or "", "limits": lim.__dict__}
            await r.zadd(QUEUE_KEY, {json.dumps(payload): time.time()})

        async def wait(sub_id, jid):
            got = await r.blpop([RESULT_PREFIX + jid], timeout=int(lim.timeout_s + 60))
            if got is None:
                return {"sub_id": sub_id, "success": False, "run_success": False, "cost": 0.0, "stdout": "",
                        "stderr": "no sandbox worker answered", "reason": "internal_error", "status": "error",
                        "exit_code": None}
            return {**json.loads(got[1]), "sub_id": sub_id}

        results = await asyncio.gather(*(wait(s, j) for s, j in jobs))
        return {"sub_id": body.get("sub_id") or uuid.uuid4().hex, "results": results}

    return app


def run_worker(redis_url: str, pool: Pool, stop: threading.Event | None = None, max_in_flight: int | None = None):
    """Pop jobs from the queue and run them in ``pool`` until ``stop`` is set; results go to Redis."""
    import redis

    r = redis.Redis.from_url(redis_url)
    cap = max_in_flight or len(pool.workers) * pool.slots
    slots = threading.Semaphore(cap)
    stop = stop or threading.Event()

    def done(jid, fut):
        try:
            res = fut.result()
        except Exception as e:  # the pool never fails a call, but never lose the answer either
            res = ExecResult("error", None, "", f"internal error: {e!r}", 0.0)
        key = RESULT_PREFIX + jid
        r.rpush(key, json.dumps(judge_result(jid, res)))
        r.expire(key, RESULT_TTL_S)
        slots.release()

    while not stop.is_set():
        if not slots.acquire(timeout=0.5):
            continue
        got = r.bzpopmin(QUEUE_KEY, timeout=1)
        if got is None:
            slots.release()
            continue
        job = json.loads(got[1])
        lim = SandboxLimits(**job.get("limits", {}))
        fut = pool.submit(job["code"], job.get("stdin", ""), lim)
        fut.add_done_callback(lambda f, jid=job["id"]: done(jid, f))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rstar2.sandbox.service", description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["api", "worker"])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8088)
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--workers", type=int, default=None, help="zygotes in this worker's pool (default: cores)")
    p.add_argument("--isolation", default="auto")
    p.add_argument("--allow-unsandboxed", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lim = SandboxLimits(timeout_s=a.timeout_s, memory_mb=a.memory_mb)
    if a.role == "api":
        import uvicorn
        uvicorn.run(create_app(a.redis, lim), host=a.host, port=a.port, log_level="warning")
    else:
        with Pool(lim, workers=a.workers, isolation=a.isolation, allow_unsandboxed=a.allow_unsandboxed) as pool:
            log.info("sandbox worker: %d zygotes x %d slots, queue %s", len(pool.workers), pool.slots, a.redis)
            run_worker(a.redis, pool)


if __name__ == "__main__":
    main()
