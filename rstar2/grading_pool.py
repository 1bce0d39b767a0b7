"""Answer checking in killable worker processes (paper §3.1: "the Math-Verifier is also offloaded").

Math-Verify can run for seconds or hang on inputs such as ``2003^{2002^{2001}}``, and its signal-based
timeout only works in a process's main thread. Here every comparison runs in
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

A pool that stops answering altogether (every busy worker past its bound: ``stall_s`` waiting for a worker to be
ready, or ``stall_s`` beyond an item's own deadline, which the item's kill should have met; a start-up that hangs,
a worker the kill cannot end or replace) is restarted once: its workers
are killed, fresh ones answer the items still open. If the fresh pool does not answer either, ``map`` raises
``GradingPoolStalled``, a ``StageFault``: a stage stops rather than score every answer 0 (RL stages set
``stall_s`` from ``rl.faults.grading_stall_s``). ``stats()`` counts timeouts and restarts.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import sys
import threading
import time

from . import faults

START_TIMEOUT_S = 300.0   # worker start-up (re-importing the caller's __main__), not counted in item deadlines
STALL_S = 120.0           # no answer and no worker ready for this long: the pool has stopped answering
_CTX = None
_POOL: "GradingPool | None" = None
_POOL_LOCK = threading.Lock()
_stall_s = STALL_S


class GradingPoolStalled(faults.StageFault):
    """The grading pool stopped answering and a restart did not bring it back."""


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

    Kinds: ``grade`` (grading.grade), ``score`` (grading.score_trajectory), ``reward`` (grading.rewards.score:
    a built-in or user reward of ``rl.reward``), ``load`` (import the checker of
    a kind in ``grading.CHECKERS`` and its library), each checker kind (its ``check(final_turn, ref)``), and
    ``hang``, which never answers (sent only by the fault injection of ``rstar2.faults``).
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
        if kind == "hang":
            time.sleep(1e9)
        try:
            if kind == "grade":
                out = ("ok", grading.grade(*args))
            elif kind == "score":
                final_turn, gold, *answer_type = args  # (final_turn, gold[, answer_type])
                out = ("ok", grading.score_trajectory(final_turn, gold, on_bad_gold="zero",
                                                      answer_type=answer_type[0] if answer_type else "math"))
            elif kind == "reward":  # rl.reward: (spec, final_turn, gold, answer_type, caller's working directory)
                from rstar2.grading import rewards
                out = ("ok", rewards.score(*args))
            elif kind == "load":
                _checker(args).checker()
                out = ("ok", None)
            else:
                out = ("ok", _checker(kind).check(*args))
        except BaseException as e:  # math_verify's TimeoutException derives from BaseException
            out = ("error", f"{type(e).__name__}: {e}")
        conn.send(out)


def _never_ready(conn) -> None:
    """A worker that never reports ready (fault injection ``grading_stall``)."""
    time.sleep(1e9)


class _Worker:
    def __init__(self, stall: bool = False):
        self.conn, child = _context().Pipe()
        self.proc = _context().Process(target=_never_ready if stall else _serve, args=(child,), daemon=True)
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

    def end(self) -> None:
        """SIGKILL the process, leaving the connection open: a thread blocked on it sees EOF and can exit."""
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        except (OSError, ValueError):
            pass

    def kill(self):
        """End the process and close the connection. Only once no other thread reads it: a connection closed
        under a thread's poll frees its descriptor, which the next Pipe reuses, and that thread then reads (and
        corrupts) the new worker's messages."""
        self.end()
        self.conn.close()


class GradingPool:
    """``workers`` grading processes; ``map(kind, items, timeout_s)`` runs items concurrently, each under a
    wall-clock deadline, and restarts the pool once if it stops answering for ``stall_s`` (module docstring).
    Thread-safe for one ``map`` at a time per pool (calls are serialised). Counters: ``killed`` (workers replaced),
    ``timeouts`` (items past their deadline), ``restarts`` (whole-pool restarts)."""

    def __init__(self, workers: int | None = None, stall_s: float = STALL_S):
        self.n, self.stall_s = workers or max(1, os.cpu_count() or 1), stall_s
        self.generation = 0
        self.workers = [self._new_worker() for _ in range(self.n)]
        self._lock = threading.Lock()
        self.killed = self.timeouts = self.restarts = self.items = 0

    def _new_worker(self) -> _Worker:
        stall = faults.injected("grading_stall")
        return _Worker(stall=stall == "always" or (stall == "once" and self.generation == 0))

    def map(self, kind: str, items: list[tuple], timeout_s: float) -> list[tuple[str, object, float]]:
        """[(status, value_or_message, seconds)] in input order; status ok | error | timeout.

        Raises:
            GradingPoolStalled: no answer for ``stall_s`` seconds, and none again after a restart.
        """
        with self._lock:
            first = self.items
            self.items += len(items)
            out = self._map_once(kind, items, timeout_s, first)
            open_ = [i for i, o in enumerate(out) if o is None]
            if open_:
                print(f"[grading] every busy grading worker of {self.n} is {self.stall_s:.0f}s past its bound; "
                      f"restarting the pool ({len(open_)} of {len(items)} items open)", file=sys.stderr, flush=True)
                self.restart()
                again = self._map_once(kind, [items[i] for i in open_], timeout_s, None)
                if any(o is None for o in again):
                    raise GradingPoolStalled(
                        f"grading pool stopped answering: every busy one of its {self.n} workers was "
                        f"{self.stall_s:.0f}s past its bound, again after a restart (rl.faults.grading_stall_s)")
                for i, o in zip(open_, again):
                    out[i] = o
        return out

    def _map_once(self, kind: str, items: list[tuple], timeout_s: float, first: int | None) -> list:
        """One pass over ``items``; an item still open when the pool stalled is None. ``first``: how many items the
        pool was given before these (fault injection counts items from 1), None for a retry pass."""
        out: list = [None] * len(items)
        nxt = iter(range(len(items)))
        take = threading.Lock()
        # per worker slot: None (idle) or the moment past which it counts as stuck: stall_s after it started
        # waiting for a worker to be ready, stall_s past an item's own deadline (which the item's kill should meet)
        stuck_at: list = [None] * self.n
        state = {"abandoned": False}
        hang = set(faults.injected("grading_hang_items") or []) if first is not None else set()

        def mark(slot: int, bound: float | None) -> bool:
            with take:
                stuck_at[slot] = None if bound is None else time.monotonic() + bound
                return not state["abandoned"]

        def drive(slot: int):
            while True:
                with take:
                    i = None if state["abandoned"] else next(nxt, None)
                if i is None:
                    return
                w = self.workers[slot]
                t0 = time.monotonic()
                try:
                    mark(slot, self.stall_s)
                    if not w.wait_ready(START_TIMEOUT_S):
                        raise OSError(f"did not start within {START_TIMEOUT_S:.0f}s (a script calling the grading "
                                      "pool must do so under `if __name__ == '__main__':`)")
                    if kind not in ("grade", "score", "reward"):
                        w.load(kind, START_TIMEOUT_S)
                    if not mark(slot, timeout_s + self.stall_s):
                        return
                    t0 = time.monotonic()
                    w.conn.send(("hang", None) if first is not None and first + i + 1 in hang else (kind, items[i]))
                    if w.conn.poll(timeout_s):
                        status, value = w.conn.recv()
                        if mark(slot, None):
                            out[i] = (status, value, time.monotonic() - t0)
                            if status != "ok":
                                print(f"[grading] item {i} of {len(items)}: {status} ({value})", file=sys.stderr,
                                      flush=True)
                        continue
                    res = ("timeout", f"no answer within {timeout_s}s", time.monotonic() - t0)
                except (EOFError, OSError, BrokenPipeError) as e:
                    res = ("error", f"grading worker died: {e!r}", time.monotonic() - t0)
                with take:  # once the pool is abandoned its workers belong to the restart
                    if state["abandoned"]:
                        return
                w.kill()  # overran its deadline (or died): replace it, the next item gets a fresh worker
                self.killed += 1
                self.timeouts += res[0] == "timeout"
                self.workers[slot] = self._new_worker()
                if mark(slot, None):
                    out[i] = res
                    print(f"[grading] item {i} of {len(items)}: {res[0]} ({res[1]}); worker replaced", file=sys.stderr,
                          flush=True)

        threads = [threading.Thread(target=drive, args=(s,), name=f"grading-drive-{s}", daemon=True)
                   for s in range(self.n)]
        for t in threads:
            t.start()
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(timeout=0.2)
            with take:  # stalled: every busy worker is past its bound
                busy = [b for b in stuck_at if b is not None]
                if busy and all(b < time.monotonic() for b in busy):
                    state["abandoned"] = True
                    break
        if state["abandoned"]:
            self._release(threads)
        return out

    def _release(self, threads: list[threading.Thread]) -> None:
        """After a stall: end every worker process so the abandoned drive threads see EOF and exit, then wait for
        them. A worker whose thread still blocks on its connection (a process the kill cannot end) is left with its
        connection open and never reused, so no later worker's descriptor can be read by that thread."""
        for w in self.workers:
            w.end()
        deadline = time.monotonic() + 10.0
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for slot, t in enumerate(threads):
            if t.is_alive():
                self.workers[slot] = None   # its connection stays open with the thread that reads it

    def restart(self) -> None:
        """Kill every worker and start a fresh set (the next generation)."""
        for w in self.workers:
            if w is not None:
                w.kill()
        self.generation += 1
        self.restarts += 1
        self.workers = [self._new_worker() for _ in range(self.n)]

    def close(self):
        for w in filter(None, self.workers):
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.kill()


def configure(stall_s: float) -> None:
    """Set the bound after which the shared pool counts as stalled (seconds; RL stages: rl.faults.grading_stall_s)."""
    global _stall_s
    with _POOL_LOCK:
        _stall_s = stall_s
        if _POOL is not None:
            _POOL.stall_s = stall_s


def stats() -> dict:
    """The shared pool's counters so far: ``{"timeouts": items past their deadline, "restarts": pool restarts}``."""
    return {"timeouts": _POOL.timeouts if _POOL else 0, "restarts": _POOL.restarts if _POOL else 0}


def _pool() -> GradingPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = GradingPool(stall_s=_stall_s)
            atexit.register(_POOL.close)
        return _POOL


def grade_many(pairs: list[tuple], timeout_s: float = 5.0) -> list[dict]:
    """Grade ``(pred, gold)`` or ``(pred, gold, answer_type)`` items with :func:`rstar2.grading.grade` in
    killable workers (answer_type as in :data:`rstar2.grading.ANSWER_TYPES`, default ``"math"``).

    Returns one dict per pair, in order: ``{"score": float, "status": "ok" | "timeout" | "error",
    "duration_s": float}`` (grading time) plus ``"error"`` (message) when status is not ok; timeouts and errors
    score 0.0.
    A bad gold (``ValueError`` from ``grade``) is reported as status ``error``, not raised.
    """
    res = []
    for status, value, secs in _pool().map("grade", [tuple(it) for it in pairs], timeout_s):
        d = {"score": float(value) if status == "ok" else 0.0, "status": status, "duration_s": round(secs, 4)}
        if status != "ok":
            d["error"] = str(value)
        res.append(d)
    return res


def score_many(items: list[tuple], timeout_s: float = 5.0, reward: str = "answer") -> list[dict]:
    """:func:`rstar2.grading.score_trajectory` for ``(final_turn, gold)`` or ``(final_turn, gold, answer_type)``
    items in killable workers (answer_type as in :data:`rstar2.grading.ANSWER_TYPES`, default ``"math"``).
    ``reward``: ``"answer"`` (that built-in) or a user reward ``module:function`` (``rstar2.grading.rewards``),
    run in the same workers under the same deadline.

    Returns its dicts (``pred``, ``reward``, and ``error`` for a bad gold) plus ``status`` and ``duration_s``;
    a timeout or crash gives ``{"pred": None, "reward": 0.0, "status": "timeout" | "error", "error": msg}``.
    """
    res = []
    if reward == "answer":
        kind, args = "score", [tuple(it) for it in items]
    else:
        here = os.getcwd()  # a user module in the caller's folder (workers keep the cwd their pool started in)
        kind, args = "reward", [(reward, it[0], it[1], it[2] if len(it) > 2 else "math", here) for it in items]
    for status, value, secs in _pool().map(kind, args, timeout_s):
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
