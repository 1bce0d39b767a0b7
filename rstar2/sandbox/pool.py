"""Executor pool: warm fork-server workers ("zygotes") that run tool calls in forked, isolated children.

Paper §3.1 (execution workers on CPU nodes, isolated from the trainer); this project's sandbox measurements
chose this shape: one zygote per spare core, each inside one bubblewrap sandbox, one forked child per
call. The host side here only moves JSON lines: every process that touches model-written code lives in the
zygote's sandbox. A zygote that dies or stops answering (host deadline = call timeout + ``grace_s``) is
killed with its whole sandbox and replaced; its in-flight calls come back as ``error`` results.
"""

from __future__ import annotations

import itertools
import re
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from .. import faults
from . import isolation as iso_mod
from .probe import probe_workers
from .python_layout import per_call_mounts, python_layout
from .results import ExecResult, SandboxLimits
from .uids import lease as lease_uids

log = logging.getLogger("rstar2.sandbox")

# The math stack a model's code usually imports (paper §2.1: numpy, scipy, sympy); importing it once in the
# zygote is what makes a sympy+numpy call cost a fork instead of ~0.7 s of imports.
LEAN_PRELOAD = ("math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "heapq",
                "bisect", "statistics", "random", "re", "string", "json")
DEFAULT_PRELOAD = LEAN_PRELOAD + ("numpy", "sympy", "scipy", "scipy.special", "scipy.optimize", "scipy.integrate",
                                  "scipy.linalg", "matplotlib", "matplotlib.pyplot")
# A fork and the child's exit cost time in proportion to the pages the zygote maps (page tables copied, then
# unmapped), so zygotes come in three sizes and each call goes to the smallest that already holds what its
# code names (measured on 2 cores, fork + sympy snippet + exit:
# 6.9 ms from a numpy+sympy zygote of 64 MB, 10.0 ms from one that also holds scipy and matplotlib, 143 MB).
SCI_PRELOAD = LEAN_PRELOAD + ("numpy", "numpy.random", "sympy", "mpmath")  # numpy.random is lazy in numpy 2
_SCI = re.compile(r"\b(numpy|sympy|mpmath|gmpy2)\b")
_FULL = re.compile(r"\b(scipy|matplotlib|pylab|pandas|networkx|sklearn|statsmodels)\b")
KINDS = ("lean", "sci", "full")  # by size: a call may go to a bigger zygote than it needs, never a smaller one
# Run once in a scientific zygote before it forks anything: sympy imports many submodules lazily on first
# use (factor alone pulls in 16), which every child would otherwise redo.
WARMUP = """
import sympy, numpy as np
x, y = sympy.symbols('x y')
sympy.factor(x**2 - 1); sympy.expand((x + y)**3); sympy.solve(x**2 - 2, x)
sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2); sympy.integrate(x**2, x); sympy.diff(sympy.exp(x), x)
sympy.isprime(97); sympy.factorint(360); sympy.Rational(1, 3) + 1; sympy.Matrix([[1, 2], [3, 4]]).det()
sympy.nsimplify(0.5); sympy.binomial(10, 3); sympy.sqrt(8); sympy.N(sympy.pi, 20)
# Printing is the usual last step of a call: initialise sympy's and numpy's printers once here, not per child.
str(sympy.factor(x**2 - 1)); repr(sympy.sqrt(8) / 3); str(sympy.Matrix([[1, 2], [3, 4]])); repr(np.arange(3) / 2)
np.linalg.solve(np.eye(2), np.ones(2)); np.arange(10).sum()
"""
CHILD_ENV = {"MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/rstar2-mpl", "OPENBLAS_NUM_THREADS": "1",
             "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8",
             "PATH": "/usr/bin:/bin"}


def _sigkill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Worker:
    """One zygote process plus the thread that reads its answers."""

    def __init__(self, pool: "Pool", index: int, kind: str):
        self.pool, self.index, self.kind = pool, index, kind
        self.pending: dict[int, tuple[Future, float]] = {}  # id -> (future, host deadline)
        self.lock = threading.Lock()
        self.alive = False
        self.threads: list[threading.Thread] = []   # the pipe readers, started once the zygote is ready
        self.want = list({"lean": LEAN_PRELOAD, "sci": SCI_PRELOAD, "full": pool.preload}[kind])
        cfg = {"preload": self.want,
               "warmup": WARMUP if kind != "lean" else "", "slots": pool.slots, "env": CHILD_ENV,
               "sweep": pool.isolation.sweep, "private_tmp": pool.isolation.per_call_uid, **pool.per_call_mounts,
               "uid_base": (pool.uid_base + index * pool.slots) if pool.isolation.per_call_uid else None,
               "workdir": "/tmp/rstar2-sbx" if pool.isolation.mode == "bwrap" else pool.host_workdir(index)}
        cmd = iso_mod.zygote_command(pool.isolation, json.dumps(cfg), pool.layout, tmpfs_mb=pool.tmpfs_mb)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd="/", start_new_session=True, close_fds=True)

    def wait_ready(self) -> "_Worker":
        """Block until the zygote has imported its preloads; raise RuntimeError if it died instead."""
        cmd = self.cmd
        hello = self.proc.stdout.readline()
        if not hello:
            err = self.proc.stderr.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"sandbox zygote failed to start ({' '.join(cmd[:3])} ...): {err}")
        self.info = json.loads(hello)
        missing = [m for m in self.want if m not in self.info.get("preloaded", [])]
        if missing:  # the calls still run (importing on demand), only slower: say so
            log.warning("sandbox zygote %d (%s) could not import %s; calls that use them import them each time "
                        "(or fail if they are not installed in the sandbox's Python)", self.index, self.kind,
                        ", ".join(missing))
        self.alive = True
        self.threads = [threading.Thread(target=self._drain_stderr, daemon=True),
                        threading.Thread(target=self._read, daemon=True)]
        for t in self.threads:
            t.start()
        return self

    def _drain_stderr(self):
        for line in self.proc.stderr:
            log.debug("zygote %d: %s", self.index, line.decode(errors="replace").rstrip())

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.lock:
                fut, _ = self.pending.pop(msg.pop("id"), (None, None))
            if fut is not None and not fut.done():
                fut.set_result(ExecResult(**msg))
        self.pool._worker_died(self, "zygote exited")

    def submit(self, call_id: int, code: str, stdin: str, lim: SandboxLimits, fut: Future) -> None:
        req = {"id": call_id, "code": code, "stdin": stdin or "", "timeout_s": lim.timeout_s, "cpu_s": lim.cpu_s,
               "memory_mb": lim.memory_mb, "max_output_bytes": lim.max_output_bytes,
               "max_processes": lim.max_processes, "max_file_mb": lim.max_file_mb}
        line = (json.dumps(req) + "\n").encode()
        with self.lock:
            self.pending[call_id] = (fut, time.monotonic() + lim.timeout_s + self.pool.grace_s
                                     + self.pool.queue_allowance(len(self.pending)))
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the reader thread sees the exit and fails the pending calls

    def kill(self):
        self.alive = False
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap and the namespace's init: the whole sandbox goes
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return
        # close the pipes once their readers have seen EOF (closing under a blocked read could hang; left open,
        # they are reported as unclosed files at exit)
        others = [t for t in self.threads if t is not threading.current_thread()]
        for t in others:
            t.join(timeout=1)
        if not any(t.is_alive() for t in others):
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    f.close()
                except (OSError, ValueError):
                    pass


class Pool:
    """A pool of zygotes in three sizes, each with ``slots`` concurrent children: ``workers`` scientific ones
    (numpy, sympy, mpmath imported and warmed up), ``full_workers`` (default: as many) that hold all of
    ``preload`` (scipy, matplotlib, ...), and ``lean_workers`` (default: as many) stdlib-only ones. A call goes
    to the smallest kind that holds every library its code names (a smaller zygote forks faster); any kind runs
    any code, importing what it lacks.

    ``submit(code, stdin, limits) -> Future[ExecResult]``; ``run_many([(code, stdin), ...]) -> list[ExecResult]``
    in input order. isolation: ``auto`` | ``bwrap`` | ``uid`` | ``none`` (see :mod:`.isolation`); raises
    RuntimeError at construction when no acceptable isolation exists. uid_base: the per-call uid wanted first
    when started as root; the pool leases free blocks of 256 uids host-wide from the block holding it on
    (:mod:`.uids`; the default 61000 starts at block 60928-61183, below systemd's dynamic users). Thread-safe.
    """

    def __init__(self, limits: SandboxLimits | None = None, workers: int | None = None, slots: int = 32,
                 isolation: str = "auto", allow_unsandboxed: bool = False, preload=DEFAULT_PRELOAD,
                 grace_s: float = 2.0, uid_base: int = 61000, tmpfs_mb: int = 256, lean_workers: int | None = None,
                 full_workers: int | None = None):
        self.limits = limits or SandboxLimits()
        self.slots, self.preload, self.grace_s, self.uid_base, self.tmpfs_mb = slots, tuple(preload), grace_s, \
            uid_base, tmpfs_mb
        self.isolation = iso_mod.detect(isolation, allow_unsandboxed)
        self.layout = python_layout(sys.executable, os.getcwd())  # where the zygotes' Python lives
        self.per_call_mounts = per_call_mounts(self.layout, self.isolation.mode) if self.isolation.per_call_uid \
            else {}
        n = workers or max(1, min(4, os.cpu_count() or 1))
        self._ids = itertools.count()
        self.accepted = 0   # calls submitted (the count fault injection refers to)
        self._lock = threading.Lock()
        self._closed = False
        self._host_dirs: list[str] = []
        counts = {"sci": n, "full": n if full_workers is None else full_workers,
                  "lean": n if lean_workers is None else lean_workers}
        kinds = [k for k in ("sci", "full", "lean") for _ in range(counts[k])]
        # per-call uids are found (and swept) host-wide: lease a range no other pool on this host uses, and kill
        # what a dead earlier holder left running as its uids
        self._uid_lease = lease_uids(uid_base, len(kinds) * slots) if self.isolation.per_call_uid else None
        if self._uid_lease is not None:
            self.uid_base = self._uid_lease.base
            self._uid_lease.sweep()
        self._spawn_q: queue.Queue = queue.Queue()
        threading.Thread(target=self._spawner, daemon=True).start()
        starting: list[_Worker] = []
        try:
            for i, k in enumerate(kinds):  # started one by one, the zygotes import in parallel
                starting.append(self._spawn(i, k))
            self.workers = [w.wait_ready() for w in starting]
            self.restarts = 0
            self._probe()
        except BaseException:  # a KeyboardInterrupt too: nothing of a half-started pool may outlive it
            self._closed = True  # the zygotes' readers must not replace what is killed here
            self._spawn_q.put((None, None, None))
            for w in starting:
                w.kill()
            if self._uid_lease is not None:
                self._uid_lease.sweep()
                self._uid_lease.release()
            raise
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    def _probe(self) -> None:
        """The start-up probe, one real call per zygote kind (see :mod:`.probe`); RuntimeError on failure."""
        probe_workers(self.workers, self.layout, self._ids, self.grace_s, self.isolation.describe())

    def host_workdir(self, index: int) -> str:
        import tempfile
        d = tempfile.mkdtemp(prefix=f"rstar2-sbx{index}-")
        os.chmod(d, 0o711)  # per-call uids must traverse into their own 0700 job dirs
        self._host_dirs.append(d)
        return d

    def queue_allowance(self, in_flight: int) -> float:
        """Calls beyond the zygote's slots wait their turn: allow for that before calling the zygote hung."""
        return (in_flight // self.slots) * (self.limits.timeout_s + 0.5)

    def submit(self, code: str, stdin: str = "", limits: SandboxLimits | None = None) -> Future:
        """Queue one call; the Future resolves to an ExecResult (never raises for anything the code does)."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("sandbox pool is closed")
            worker = self._pick(code)
            call_id = next(self._ids)
            self.accepted += 1
            n = self.accepted
        worker.submit(call_id, code, stdin, limits or self.limits, fut)
        delay = faults.sandbox_kill_delay(n)
        if delay is not None:  # test-only fault injection: this zygote's whole sandbox dies as in a crash
            t = threading.Timer(delay, _sigkill_group, (worker.proc.pid,))
            t.daemon = True
            t.start()
        return fut

    def _pick(self, code: str) -> _Worker:
        """The zygote for ``code``: among those that hold every library it names (any, if none does), the
        smallest kind with a free slot, least busy first; when all are full, the least busy of them.
        A call queued behind full slots waits far longer than a bigger zygote's slower fork takes."""
        need = 2 if _FULL.search(code) else 1 if _SCI.search(code) else 0
        alive = [w for w in self.workers if w.alive]
        able = [w for w in alive if KINDS.index(w.kind) >= need] or alive
        if not able:
            return self._replace_dead()
        free = [w for w in able if len(w.pending) < self.slots]
        if free:
            return min(free, key=lambda w: (KINDS.index(w.kind), len(w.pending)))
        return min(able, key=lambda w: len(w.pending))

    def run_many(self, calls: list[tuple[str, str]], limits: SandboxLimits | None = None) -> list[ExecResult]:
        """Run ``(code, stdin)`` pairs concurrently; results in input order."""
        futs = [self.submit(c, s, limits) for c, s in calls]
        return [f.result() for f in futs]

    def _spawner(self):
        # bwrap --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that started it ends;
        # so every zygote is started from this thread, which lives as long as the pool.
        while True:
            index, kind, fut = self._spawn_q.get()
            if index is None:
                return
            try:
                fut.set_result(_Worker(self, index, kind))
            except BaseException as e:
                fut.set_exception(e)

    def _spawn(self, index: int, kind: str) -> _Worker:
        fut: Future = Future()
        self._spawn_q.put((index, kind, fut))
        return fut.result()

    def _replace_dead(self, kind: str | None = None) -> _Worker:
        for i, w in enumerate(self.workers):
            if not w.alive and kind in (None, w.kind):
                self.workers[i] = self._spawn(w.index, w.kind).wait_ready()
                self.restarts += 1
                return self.workers[i]
        raise RuntimeError("no sandbox worker")

    def _worker_died(self, worker: _Worker, why: str) -> None:
        worker.alive = False
        with worker.lock:
            pending, worker.pending = worker.pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_result(ExecResult("error", None, "", f"sandbox worker failed ({why}); the call was lost",
                                          0.0))
        with self._lock:
            if self._closed:
                return
            if not any(w is worker for w in self.workers):
                return  # a submit already replaced it
            log.warning("sandbox zygote %d %s; replacing it", worker.index, why)
            try:
                self._replace_dead(worker.kind)
            except Exception as e:  # the next submit retries
                log.error("could not restart sandbox zygote: %s", e)

    def _watch(self):
        while not self._closed:
            time.sleep(0.25)
            now = time.monotonic()
            for w in list(self.workers):
                if not w.alive:
                    continue
                with w.lock:
                    late = any(deadline < now for _, deadline in w.pending.values())
                if late or w.proc.poll() is not None:
                    w.kill()  # the reader thread then sees EOF, fails its calls and replaces it

    def close(self) -> None:
        """Stop every zygote (killing its sandbox); idempotent."""
        with self._lock:
            self._closed = True
        self._spawn_q.put((None, None, None))
        for w in self.workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        for w in self.workers:
            try:
                w.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        import shutil
        for d in self._host_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self._uid_lease is not None:  # after the zygotes' kills, what their calls left (setsid daemons) too
            self._uid_lease.sweep()
            self._uid_lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
