"""Async client with batching: the trainer-side "send workers" of the environment service (paper §3.1, Fig.5b).

Every tool call is awaited on its own, but calls are grouped: a send worker takes up to ``batch_size``
(paper: 64) queued calls, dispatching when the batch is full or ``batch_timeout_s`` after its first call,
and waits for that batch's results before taking the next (released: rstar2_agent/tools/request_processor.py). On
a local pool each call's result is handed back as soon as it is ready; over HTTP, with the whole batch.
Batches go to a local :class:`~rstar2.sandbox.pool.Pool` or, with ``url``, to the HTTP service
(:mod:`rstar2.sandbox.service`, code-judge's ``/run/long-batch`` shape).

The batching runs on the client's own threads, so ``run`` works from any asyncio loop, and the
synchronous ``run_many`` works from plain code (e.g. a TRL reward function).

Infrastructure failures (``results.is_infra_failure``: a zygote that died with the call, a service that is
unreachable, restarting or refusing the call for capacity, no worker answering) are retried up to ``retries``
times, ``retry_backoff_s`` doubling between tries; each call is answered once, with ``attempts`` set. A call still
unserved then comes back with status ``INFRA_STATUS``, which the RL step keeps apart from the model's own errors
(``rl/fault_accounting.py``). The code's own failures (exceptions, timeouts, limits) are never retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import threading
import time
import urllib.request
from concurrent.futures import Future

from .pool import Pool
from .results import INFRA_STATUS, ExecResult, SandboxLimits, is_infra_failure

_STOP = object()


def _tool_error(e: BaseException) -> ExecResult:
    """A failure outside the code (transport, closed pool) as the call's result, as in rStar's _call_tool."""
    return ExecResult("error", None, "", f"Error when executing tool: {e!r}", 0.0)


class SandboxClient:
    """Batched access to the sandbox.

    limits: per-call limits; batch_size / batch_timeout_s: send-worker batching (64 calls, 5 ms);
    send_workers: batches in flight at once; url: base URL of the HTTP service (None = a local pool built
    from ``pool_kwargs``: workers, slots, isolation, allow_unsandboxed, preload; see :class:`Pool`);
    retries / retry_backoff_s: tries after an infrastructure failure and the first pause (seconds, doubling).

    ``await run(code, stdin) -> ExecResult``; ``run_many([(code, stdin), ...]) -> list[ExecResult]`` (sync,
    input order); ``close()``; usable as a (sync) context manager. Raises RuntimeError from the constructor
    when no acceptable isolation exists (local pool), and from calls once closed.
    """

    def __init__(self, limits: SandboxLimits | None = None, batch_size: int = 64, batch_timeout_s: float = 0.005,
                 send_workers: int = 8, url: str | None = None, http_timeout_s: float = 3600.0,
                 pool: Pool | None = None, retries: int = 2, retry_backoff_s: float = 0.5,
                 **pool_kwargs):
        if retries < 0 or retry_backoff_s < 0:
            raise ValueError(f"SandboxClient: retries ({retries}) and retry_backoff_s ({retry_backoff_s}) must be >= 0")
        self.limits = limits or SandboxLimits()
        self.retries, self.retry_backoff_s = retries, retry_backoff_s
        self.infra_failures = 0   # attempts that failed for infrastructure reasons (each retried one counts)
        self._count = threading.Lock()
        self.batch_size, self.batch_timeout_s, self.url, self.http_timeout_s = batch_size, batch_timeout_s, url, \
            http_timeout_s
        self._own_pool = pool is None and url is None
        self.pool = pool if pool is not None or url is not None else Pool(self.limits, **pool_kwargs)
        self._q: queue.Queue = queue.Queue()
        self._closed = False
        self.batches_sent = 0
        self._senders = [threading.Thread(target=self._send_loop, daemon=True) for _ in range(send_workers)]
        for t in self._senders:
            t.start()

    # -- public API ---------------------------------------------------------------------------------------
    def submit(self, code: str, stdin: str = "") -> Future:
        """Queue one call; returns a concurrent Future of its ExecResult (retried as the module docstring says)."""
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        fut: Future = Future()
        self._attempt(code, stdin or "", fut, 1)
        return fut

    def describe(self) -> str:
        """The sandbox this client sends to, as errors name it: the service URL or the local pool's isolation."""
        return self.url or f"local pool ({self.pool.isolation.mode})"

    def _attempt(self, code: str, stdin: str, outer: Future, n: int) -> None:
        if self._closed:
            self._settle(code, stdin, outer, n, _tool_error(RuntimeError("SandboxClient is closed")))
            return
        inner: Future = Future()
        inner.add_done_callback(lambda f: self._settle(code, stdin, outer, n, f.result()))
        self._q.put((code, stdin, inner))

    def _settle(self, code: str, stdin: str, outer: Future, n: int, res: ExecResult) -> None:
        """Answer ``outer`` with attempt ``n``'s result, or try again after an infrastructure failure."""
        if is_infra_failure(res):
            with self._count:
                self.infra_failures += 1
            if n <= self.retries and not self._closed:
                t = threading.Timer(self.retry_backoff_s * 2 ** (n - 1), self._attempt, (code, stdin, outer, n + 1))
                t.daemon = True
                t.start()
                return
            res = ExecResult(INFRA_STATUS, None, res.stdout, f"{res.stderr.strip()} (sandbox {self.describe()}: "
                             f"not served after {n} attempts)", res.duration_s, attempts=n)
        elif n > 1:
            res = dataclasses.replace(res, attempts=n)
        if not outer.done():
            outer.set_result(res)

    async def run(self, code: str, stdin: str = "") -> ExecResult:
        """Run one call; awaitable from any event loop. Never raises for anything the code does."""
        return await asyncio.wrap_future(self.submit(code, stdin))

    def run_many(self, calls: list[tuple[str, str]]) -> list[ExecResult]:
        """Run ``(code, stdin)`` pairs concurrently; results in input order."""
        futs = [self.submit(c, s) for c, s in calls]
        return [f.result() for f in futs]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._senders:
            self._q.put(_STOP)
        for t in self._senders:
            t.join(timeout=5)
        while True:  # calls queued behind the stop (a retry, a late submit) must not wait forever
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and not item[2].done():
                item[2].set_result(_tool_error(RuntimeError("SandboxClient is closed")))
        if self._own_pool:
            self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- send workers -------------------------------------------------------------------------------------
    def _take_batch(self):
        first = self._q.get()
        if first is _STOP:
            return None
        batch = [first]
        deadline = time.monotonic() + self.batch_timeout_s
        while len(batch) < self.batch_size:
            left = deadline - time.monotonic()
            try:
                item = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._q.put(_STOP)  # let the other senders see it too
                break
            batch.append(item)
        return batch

    def _send_loop(self):
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            self.batches_sent += 1
            if self.url is None:
                self._run_local(batch)
                continue
            try:
                results = self._dispatch([(c, s) for c, s, _ in batch])
            except Exception as e:  # a transport failure becomes the calls' result, as in rStar's _call_tool
                results = [_tool_error(e)] * len(batch)
            for (_, _, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)

    def _run_local(self, batch) -> None:
        """Each call's future resolves when its own result arrives (a slow call does not hold back the fast
        ones of its batch); the send worker takes its next batch once this one is done."""
        def relay(src, fut):
            if not fut.done():
                try:
                    fut.set_result(src.result())
                except Exception as e:  # the pool never fails a call; keep the caller from hanging if it did
                    fut.set_result(_tool_error(e))
        try:
            sent = [(self.pool.submit(c, s, self.limits), fut) for c, s, fut in batch]
        except Exception as e:  # e.g. the pool was closed
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_result(_tool_error(e))
            return
        for src, fut in sent:
            src.add_done_callback(lambda f, fut=fut: relay(f, fut))
        for src, _ in sent:
            src.exception()  # wait (never raises) for the whole batch: one batch in flight per send worker

    def _dispatch(self, calls: list[tuple[str, str]]) -> list[ExecResult]:
        """One HTTP request for the batch (code-judge's /run/long-batch); results in input order."""
        lim = self.limits.__dict__
        body = {"type": "batch", "submissions": [{"type": "python", "solution": c, "input": s, "limits": lim}
                                                 for c, s in calls]}
        req = urllib.request.Request(self.url.rstrip("/") + "/run/long-batch", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.http_timeout_s) as resp:
            data = json.loads(resp.read())
        return [result_from_judge(r) for r in data["results"]]


def result_from_judge(r: dict) -> ExecResult:
    """Map one code-judge result ``{sub_id, success, run_success, cost, stdout, stderr, reason}`` (plus our own
    ``status``/``exit_code`` when the server is ours) to an ExecResult."""
    status, reason = r.get("status"), r.get("reason") or ""
    if status is None:
        status = "timeout" if reason == "worker_timeout" else ("ok" if r.get("run_success") else "error")
    # internal_error: the code did not run to an exit (an infrastructure failure, retried by the client)
    default_exit = None if reason == "internal_error" else (0 if r.get("run_success") else 1)
    return ExecResult(status, r.get("exit_code", default_exit), r.get("stdout") or "",
                      r.get("stderr") or "", float(r.get("cost") or 0.0))
