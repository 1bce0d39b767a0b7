"""The environment service: run model-written Python fast, isolated and many at once (paper §3.1; code-judge).

Pieces (each its own module):

- :mod:`.results` — ``ExecResult`` (status, exit_code, stdout, stderr, duration_s), ``SandboxLimits``,
  ``STATUSES`` (ok, error, timeout, memory, output-limit, parse-error), and ``render_result`` /
  ``truncate_middle``: the text the model sees, with a configurable middle truncation (released code: 256
  characters).
- :mod:`.isolation` — detects and logs the isolation in force (bubblewrap namespaces with a per-call uid;
  a per-call uid alone; or none, refused unless explicitly allowed).
- :mod:`.pool` — ``Pool``: warm fork-server workers that have imported numpy/sympy/scipy and fork one
  limited, isolated child per call; a damaged worker is replaced.
- :mod:`.client` — ``SandboxClient``: the async batching client the rollout loop uses.
- :mod:`.service` — the HTTP service (FastAPI + uvicorn) over a Redis queue for multi-node scale-out,
  speaking code-judge's ``/run/long-batch`` shape.

Client interface (what the rollout loop calls)::

    client = sandbox.make_client(limits=SandboxLimits(timeout_s=5), workers=2, isolation="auto")
    res = await client.run(code, stdin="")          # ExecResult, awaitable per call
    results = client.run_many([(code, stdin), ...])  # sync, input order
    client.close()                                   # or: with sandbox.make_client(...) as client: ...

Calls are batched (up to 64, dispatched when full or 5 ms after the first), so the tool calls of all
in-flight trajectories run concurrently; a call that fails for the sandbox's own reasons is retried
(``retries``), and one never served has status ``INFRA_STATUS`` (``is_infra_failure`` tells both apart from the
code's own errors). ``execute`` / ``execute_many`` are the simple synchronous entry
points, backed by one shared pool per process (created on first use, closed at exit).
"""

from __future__ import annotations

import atexit
import threading

from .client import SandboxClient
from .isolation import MODES as ISOLATION_MODES
from .isolation import Isolation, detect
from .pool import DEFAULT_PRELOAD, Pool
from .results import (INFRA_STATUS, STATUSES, ExecResult, SandboxLimits, is_infra_failure, render_result,
                      truncate_middle)

__all__ = ["INFRA_STATUS", "STATUSES", "ExecResult", "SandboxLimits", "is_infra_failure", "render_result",
           "truncate_middle", "execute", "execute_many", "Pool", "SandboxClient", "make_client", "configure",
           "describe", "Isolation", "detect", "ISOLATION_MODES", "DEFAULT_PRELOAD", "shared_pool", "shared_client"]

_CLIENT_KEYS = ("batch_size", "batch_timeout_s", "url", "retries", "retry_backoff_s")
_shared: Pool | None = None
_shared_kwargs: dict = {}
_client_kwargs: dict = {}
_shared_lock = threading.Lock()


def configure(**cfg) -> None:
    """Apply the config's ``sandbox`` section to this process: pool options (workers, slots, isolation,
    allow_unsandboxed, preload) for the shared pool behind ``execute`` / ``execute_many`` /
    :func:`shared_client`, and client options (batch_size, batch_timeout_s, url, retries, retry_backoff_s) for
    :func:`shared_client`.
    Closes the current shared pool so the next call starts with them. Unknown keys raise TypeError later,
    when the pool is built."""
    global _shared, _shared_kwargs, _client_kwargs
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None
        _client_kwargs = {k: cfg[k] for k in _CLIENT_KEYS if cfg.get(k) is not None}
        _shared_kwargs = {k: v for k, v in cfg.items() if k not in _CLIENT_KEYS}


def shared_client(limits: SandboxLimits | None = None) -> SandboxClient:
    """A batching client with ``limits`` over the configured service (``url``) or the shared local pool; the
    rollout loop's default tool runner. Closing it leaves the shared pool running for the next caller."""
    if _client_kwargs.get("url"):
        return SandboxClient(limits=limits, **_client_kwargs)
    return SandboxClient(limits=limits, pool=shared_pool(), **_client_kwargs)


def describe() -> str:
    """The configured sandbox as a stage's errors name it: the service URL, or the local pool and its isolation."""
    if _client_kwargs.get("url"):
        return _client_kwargs["url"]
    return f"local pool ({_shared.isolation.mode})" if _shared is not None else "local pool"


def shared_pool() -> Pool:
    """The process-wide pool behind ``execute`` (created on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Pool(**_shared_kwargs)
            atexit.register(_shared.close)
        return _shared


def execute(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> ExecResult:
    """Run ``code`` with ``stdin`` in the sandbox and return its structured result (blocking).

    Never raises for anything the code does. Raises RuntimeError when no acceptable isolation exists.
    """
    return shared_pool().submit(code, stdin, limits).result()


def execute_many(calls: list[tuple[str, str]], limits: SandboxLimits | None = None,
                 max_workers: int | None = None) -> list[ExecResult]:
    """Run ``(code, stdin)`` pairs concurrently in the shared pool; results in input order.

    ``max_workers`` is accepted for compatibility; concurrency is the pool's (workers × slots).
    """
    return shared_pool().run_many(calls, limits) if calls else []


def make_client(limits: SandboxLimits | None = None, **cfg) -> SandboxClient:
    """A :class:`SandboxClient` from ``limits`` plus options: batch_size, batch_timeout_s, send_workers, url,
    and pool options (workers, slots, isolation, allow_unsandboxed, preload). Unknown keys raise TypeError."""
    return SandboxClient(limits=limits, **cfg)
