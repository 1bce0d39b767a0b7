"""Answer checking in killable worker processes (paper §3.1: "the Math-Verifier is also offloaded").

Math-Verify can run for seconds or hang on inputs such as ``2003^{2002^{2001}}``, and its signal-based
timeout only works in a process's main thread (reference/frameworks.md §6). Here every comparison runs in
the main thread of a worker process forked from a warm forkserver that has already imported
``rstar2.grading`` (and with it math_verify and sympy); a worker that overruns the per-item wall-clock
deadline is SIGKILLed and replaced, and that item scores 0 with status ``timeout``.

The grading code itself (:func:`rstar2.grading.grade`, :func:`rstar2.grading.score_trajectory`) is not
model-written code, so these workers are not namespace-sandboxed; only their time is bounded.

Workers start through multiprocessing's forkserver, which imports the calling script's ``__main__``: a script
that calls :func:`grade_many` / :func:`score_many` must do so under ``if __name__ == "__main__":`` (as any
multiprocessing program), otherwise every worker re-runs the script. Re-importing the script's top level
(torch, transformers: seconds) is start-up, not grading: a worker first reports that it is ready, and an
item's deadline starts only then; a worker that is not ready within ``START_TIMEOUT_S`` fails its item with
status ``error`` and a message saying so.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import time

START_TIMEOUT_S = 300.0   # worker start-up (re-importing the caller's __main__), not counted in item deadlines
_CTX = None
_POOL: "GradingPool | None" = None
_POOL_LOCK = threading.Lock()


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        # A no-op if the forkserver is already running; then workers just import on first use.
        _CTX.set_forkserver_preload(["rstar2.grading_warmup"])
    return _CTX


def _checker(kind: str):
    """The reference checker module of a checked benchmark kind (rstar2.grading.CHECKERS), imported on use."""
    import importlib

    return importlib.import_module(f"rstar2.grading.{kind}")


def _serve(conn) -> None:
    """Worker loop (main thread): receive (kind, args), answer ("ok", value) or ("error", message).

    Kinds: ``grade`` (grading.grade), ``score`` (grading.score_trajectory), ``load`` (import the checker of
    a kind in ``grading.CHECKERS`` and its library), and each checker kind (its ``check(final_turn, ref)``).
    """
    from rstar2 import grading
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        kind, args = msg
        try:
            if kind == "grade":
                out = ("ok", grading.grade(*args))
            elif kind == "score":
                final_turn, gold, *answer_type = args  # (final_turn, gold[, answer_type])
                out = ("ok", grading.score_trajectory(final_turn, gold, on_bad_gold="zero",
                                                      answer_type=answer_type[0] if answer_type else "math"))
            elif kind == "load":
                _checker(args).checker()
                out = ("ok", None)
            else:
                out = ("ok", _checker(kind).check(*args))
        except BaseException as e:  # math_verify's TimeoutException derives from BaseException
            out = ("error", f"{type(e).__name__}: {e}")
        conn.send(out)


class _Worker:
    def __init__(self):
        self.conn, child = _context().Pipe()
        self.proc = _context().Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.loaded: set[str] = set()   # checker kinds this worker has imported

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the worker has imported the grading code (waits up to ``timeout_s`` the first time)."""
        if not self.ready and self.conn.poll(timeout_s):
            self.ready = self.conn.recv() == ("ready", None)
        return self.ready

    def load(self, kind: str, timeout_s: float) -> None:
        """Import the checker of ``kind`` once (lm-eval takes seconds): not counted in item deadlines.

        Raises:
            OSError: the import failed or did not finish within ``timeout_s``.
        """
        if kind in self.loaded:
            return
        self.conn.send(("load", kind))
        if not self.conn.poll(timeout_s):
            raise OSError(f"checker {kind!r} not imported within {timeout_s:.0f}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise OSError(f"checker {kind!r} failed to import: {value}")
        self.loaded.add(kind)

    def kill(self):
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        except (OSError, ValueError):
            pass
        self.conn.close()


class GradingPool:
    """``workers`` grading processes; ``map(kind, items, timeout_s)`` runs items concurrently, each under a
    wall-clock deadline. Thread-safe for one ``map`` at a time per pool (calls are serialised)."""

    def __init__(self, workers: int | None = None):
        self.n = workers or max(1, os.cpu_count() or 1)
        self.workers = [_Worker() for _ in range(self.n)]
        self._lock = threading.Lock()
        self.killed = 0

    def map(self, kind: str, items: list[tuple], timeout_s: float) -> list[tuple[str, object, float]]:
        """[(status, value_or_message, seconds)] in input order; status ok | error | timeout."""
        out: list = [None] * len(items)
        nxt = iter(range(len(items)))
        take = threading.Lock()

        def drive(slot: int):
            while True:
                with take:
                    i = next(nxt, None)
                if i is None:
                    return
                w = self.workers[slot]
                t0 = time.monotonic()
                try:
                    if not w.wait_ready(START_TIMEOUT_S):
                        raise OSError(f"did not start within {START_TIMEOUT_S:.0f}s (a script calling the grading "
                                      "pool must do so under `if __name__ == '__main__':`)")
                    if kind not in ("grade", "score"):
                        w.load(kind, START_TIMEOUT_S)
                    t0 = time.monotonic()
                    w.conn.send((kind, items[i]))
                    ready = w.conn.poll(timeout_s)
                    if ready:
                        status, value = w.conn.recv()
                        out[i] = (status, value, time.monotonic() - t0)
                        continue
                    status = "timeout"
                except (EOFError, OSError, BrokenPipeError) as e:
                    status, ready = "error", False
                    out[i] = ("error", f"grading worker died: {e!r}", time.monotonic() - t0)
                w.kill()  # overran its deadline (or died): replace it, the next item gets a fresh worker
                self.killed += 1
                self.workers[slot] = _Worker()
                if status == "timeout":
                    out[i] = ("timeout", f"no answer within {timeout_s}s", time.monotonic() - t0)

        with self._lock:
            threads = [threading.Thread(target=drive, args=(s,), daemon=True) for s in range(self.n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return out

    def close(self):
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.kill()


def _pool() -> GradingPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = GradingPool()
            atexit.register(_POOL.close)
        return _POOL


def grade_many(pairs: list[tuple[str | None, str]], timeout_s: float = 5.0) -> list[dict]:
    """Grade ``(pred, gold)`` pairs with :func:`rstar2.grading.grade` in killable workers.

    Returns one dict per pair, in order: ``{"score": float, "status": "ok" | "timeout" | "error",
    "duration_s": float}`` (grading time) plus ``"error"`` (message) when status is not ok; timeouts and errors
    score 0.0.
    A bad gold (``ValueError`` from ``grade``) is reported as status ``error``, not raised.
    """
    res = []
    for status, value, secs in _pool().map("grade", [(p, g) for p, g in pairs], timeout_s):
        d = {"score": float(value) if status == "ok" else 0.0, "status": status, "duration_s": round(secs, 4)}
        if status != "ok":
            d["error"] = str(value)
        res.append(d)
    return res


def score_many(items: list[tuple], timeout_s: float = 5.0) -> list[dict]:
    """:func:`rstar2.grading.score_trajectory` for ``(final_turn, gold)`` or ``(final_turn, gold, answer_type)``
    items in killable workers (answer_type as in :data:`rstar2.grading.ANSWER_TYPES`, default ``"math"``).

    Returns its dicts (``pred``, ``reward``, and ``error`` for a bad gold) plus ``status`` and ``duration_s``;
    a timeout or crash gives ``{"pred": None, "reward": 0.0, "status": "timeout" | "error", "error": msg}``.
    """
    res = []
    for status, value, secs in _pool().map("score", [tuple(it) for it in items], timeout_s):
        if status == "ok":
            d = dict(value)
        else:
            d = {"pred": None, "reward": 0.0, "error": str(value)}
        d.update(status=status, duration_s=round(secs, 4))
        res.append(d)
    return res


def check_many(kind: str, items: list[tuple[str, dict]], timeout_s: float = 30.0) -> list[dict]:
    """Reference checks of a checked benchmark kind (``"ifeval"`` or ``"bfcl"``, rstar2.grading.CHECKERS) for
    ``(final_turn, reference)`` items, in killable workers with a per-item deadline of ``timeout_s`` seconds
    (the checker's import is done first and not counted).

    Returns:
        Per item, in order: the checker's result dict (``rstar2.grading.ifeval.check`` /
        ``rstar2.grading.bfcl.check``) plus ``status`` ("ok" | "timeout" | "error") and ``duration_s``; a timeout
        or crash gives ``{"status", "duration_s", "error": msg}`` only, which callers score as a failure.
    Raises:
        ValueError: an unknown ``kind``.
    """
    from rstar2.grading import CHECKERS

    if kind not in CHECKERS:
        raise ValueError(f"kind must be one of {CHECKERS}, not {kind!r}")
    res = []
    for status, value, secs in _pool().map(kind, [tuple(it) for it in items], timeout_s):
        d = dict(value) if status == "ok" else {"error": str(value)}
        d.update(status=status, duration_s=round(secs, 4))
        res.append(d)
    return res
