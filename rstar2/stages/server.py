"""A pre-imported fork server for stage jobs: ``rstar2 <stage>`` hands its job to it instead of importing torch,
transformers and TRL itself.

A stage job of a small run spends most of its time importing: a tiny workflow's RL stage job took 11.0 s, 4.4-4.5 s
served (2-core Xeon, one thread; ``docs/tests.md``). The server imports those libraries once; each job is a
``fork()`` of it that takes the client's command line, working directory, environment, umask, ignored signals and
standard streams, and runs ``rstar2.cli.main`` there (or the client's script). The client (the ``rstar2`` process
Snakemake started) stays in place as the job's process: it forwards the signals it gets (``FORWARDED``; Ctrl-Z stops
both) to the job and exits with its status (or dies of the same signal). If the client dies (e.g. SIGKILL to its
process group) the server SIGKILLs the job's process group within milliseconds, so a killed job leaves nothing
running, as it would without the server.

Opt-in, with ``RSTAR2_STAGE_SERVER=<socket path>`` in the environment of the jobs and a server started with
``rstar2 stage-server <socket path>`` (the test suite starts one per worker: tests/served.py); the
client side is ``rstar2/stage_client.py``. A job runs as it always did, importing for itself, when the variable is
unset, when no server answers, under a distributed launcher or SLURM (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``SLURM_JOB_ID``: its processes belong to the launcher or the job's allocation) and when an environment variable
read at import time (``stage_client.IMPORT_TIME``: thread counts, Hugging Face, torch, vLLM, Python's own) differs
from the server's. Resource limits are the server's.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Callable

from ..stage_client import ENV_VAR, FORWARDED, import_time_env, peer_uid, process_context, recv, run_script, send


def preimport() -> None:
    """What every model stage imports, imported once: torch, transformers (its generation module with
    scikit-learn hidden, as ``rstar2.cli._lighter_imports`` does), its Trainer and the Qwen/Llama model code,
    accelerate, datasets, safetensors, TRL's package and SFT trainer (not its GRPO trainer, which imports vLLM where
    it is installed: an RL job on the transformers engine hides vLLM first), and the stage modules. Nothing here
    runs a torch op; the one thread the imports start is pyarrow's jemalloc background thread, and jemalloc
    handles fork."""
    sys.modules["sklearn"] = None
    try:
        import transformers.generation.candidate_generator  # noqa: F401
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401
    import transformers.trainer  # noqa: F401
    import trl.import_utils  # noqa: F401
    from trl import SFTTrainer  # noqa: F401

    from .. import models  # noqa: F401
    from . import (base_model, evaluate, hard_problems, report, rl, rl_candidates, rl_data, sft,  # noqa: F401
                   sft_data)


def _child(req: dict, fds: list[int], run: Callable[[], int]) -> None:
    """In the forked job: become the client's job (own process group, its streams, directory, environment,
    umask and command line) and run ``run`` or the client's script; never returns."""
    code = 1
    try:
        os.setsid()   # the server kills this group if the client dies
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.umask(req["umask"])
        env = {k: v for k, v in req["env"].items() if k != ENV_VAR}   # its own subprocesses run unserved
        os.environ.clear()
        os.environ.update(env)
        import multiprocessing.process
        import tempfile
        tempfile.tempdir = None   # found again from this job's TMPDIR
        multiprocessing.process.ORIGINAL_DIR = req["cwd"]   # spawn/forkserver find a relative __main__ from it
        time.tzset()   # this job's TZ
        if not sys.stdout.write_through:   # line-buffered at a terminal, as Python's start-up makes it (not -u)
            sys.stdout.reconfigure(line_buffering=os.isatty(1))
        sys.argv = list(req["argv"])
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in req["ignored"]:   # what the client's parent ignored (nohup, a shell's background job)
            signal.signal(s, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        try:
            code = run_script(sys.argv) if req.get("script") else run()
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:   # as Python does: the traceback, then death by SIGINT
        import traceback
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        # as the interpreter's own exit does: wait for non-daemon threads, run atexit, flush (files a job left
        # open and unflushed are not flushed: nothing in rstar2 does that)
        try:
            import atexit
            import threading
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            if code == -signal.SIGINT:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
        finally:
            os._exit(code if code >= 0 else 1)


def serve(path: str, run: Callable[[], int]) -> None:
    """Server side: listen on the Unix socket ``path`` (bound before the imports, so clients that come early wait
    instead of importing for themselves), import (:func:`preimport`), then fork one job per client, which calls
    ``run`` (``rstar2.cli.main``: ``rstar2 stage-server``) or runs the client's script. Ends when its
    parent process ends (the test session that started it) or on SIGTERM/SIGINT, SIGKILLing the jobs still running.
    Refused (they run unserved): clients of another user, interpreter, rstar2 checkout, Python flags, CPU affinity,
    niceness or resource limits, with a different import-time environment, or arriving after a loaded rstar2 source
    file changed.

    Raises:
        SystemExit: ``path`` exists and is not a stale socket (a file, or a live server's socket)."""
    import gc
    import select

    for fd in map(int, os.listdir("/proc/self/fd")):   # what the launcher left open would reach every job
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    parent = os.getppid()
    own_env, own_context = import_time_env(dict(os.environ)), process_context()
    listener = _listen(path)
    bound = os.stat(path).st_ino
    stop = []
    for s in (signal.SIGTERM, signal.SIGINT):   # before the imports: a stop during them still removes the socket
        signal.signal(s, lambda *a: stop.append(1))
    jobs: dict[int, tuple[socket.socket | None, str, float]] = {}   # job pid -> its client's connection, name, start
    try:
        preimport()
        sources = _sources()
        gc.freeze()   # forked jobs then do not copy the pages of every imported object at their first collection
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        while not stop and os.getppid() == parent:
            conns = [j[0] for j in jobs.values() if j[0] is not None]
            ready, _, _ = select.select([listener, wake_r, *conns], [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(jobs)
            for pid, (conn, name, start) in list(jobs.items()):
                if conn is not None and conn in ready:
                    _from_client(pid, conn, name, start, jobs)
            if listener in ready:
                try:
                    _accept(listener, jobs, own_env, own_context, sources, run)
                except Exception as e:   # one bad request never ends the server and its jobs
                    _log(f"[stage-server] a request failed: {e!r}")
    finally:
        for pid in jobs:
            _kill_job(pid)
        listener.close()
        try:
            if os.stat(path).st_ino == bound:   # not another server's socket, bound there since
                os.unlink(path)
        except OSError:
            pass


def _listen(path: str) -> socket.socket:
    """A listening Unix socket at ``path``, only its owner may connect (a client runs commands as the server's
    user). A stale socket there is replaced; anything else stops the server."""
    import stat

    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SystemExit(f"rstar2 stage-server: {path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            raise SystemExit(f"rstar2 stage-server: a server already listens on {path}")
        except OSError:
            os.unlink(path)   # nobody listens: stale
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(mask)
    listener.listen(64)
    return listener


def _sources() -> dict[str, int]:
    """Modification times of the rstar2 source files loaded now (a job must not run code older than its files)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return {f: os.stat(f).st_mtime_ns for f in files if f and f.startswith(root + os.sep)}


def _log(line: str) -> None:
    try:   # a closed or full log never ends the server
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _reap(jobs: dict) -> None:
    """Finished jobs: a line in the log, then their status to their clients (a client that has its status finds
    its job's line in the log)."""
    while jobs:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        job = jobs.pop(pid, None)
        if job is None:
            continue
        conn, name, start = job
        _log(f"[stage-server] {name} (pid {pid}) exited {os.waitstatus_to_exitcode(status)} after "
             f"{time.monotonic() - start:.1f} s")
        if conn is not None:
            try:
                send(conn, {"status": status})
            except OSError:
                pass
            conn.close()


def _from_client(pid: int, conn: socket.socket, name: str, start: float, jobs: dict) -> None:
    """A client's bytes are signals for its job; its end of the connection closing means it died: so does the job,
    as a SIGKILL to its process group would do."""
    data = b""
    try:
        data = conn.recv(64)
    except OSError:
        pass
    if not data:
        _kill_job(pid)
        conn.close()
        jobs[pid] = (None, name, start)
    for signum in data:
        if signum in FORWARDED:
            try:
                os.kill(pid, signum)
            except OSError:
                pass


def _kill_job(pid: int) -> None:
    """SIGKILL a job's process group (the job itself if it has not made its group yet)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _refusal(req: dict, own_env: dict, own_context: dict, sources: dict) -> str | None:
    """Why a request must run unserved, or None."""
    context = req["context"]
    for key in own_context:
        if context.get(key) != own_context[key]:
            return f"its {key} differs from the server's"
    differs = sorted(set(own_env.items()) ^ set(import_time_env(req["env"]).items()))
    if differs:
        return f"${differs[0][0]} differs from the server's"
    for f, mtime in sources.items():
        try:
            changed = os.stat(f).st_mtime_ns != mtime
        except OSError:
            changed = True
        if changed:
            return f"{f} changed since the server imported it"
    return None


def _accept(listener: socket.socket, jobs: dict, own_env: dict, own_context: dict, sources: dict,
            run: Callable[[], int]) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(10)   # a client that connects and says nothing holds up no other job
        req, fds = recv(conn, maxfds=3)
        conn.settimeout(None)
        argv, env = req["argv"], req["env"]
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv) and isinstance(env, dict)
                and isinstance(req["cwd"], str) and isinstance(req["umask"], int) and len(fds) == 3):
            raise ValueError("malformed request")
        name = os.path.basename(argv[0]) if req.get("script") else " ".join(argv[1:2])
        why = "another user" if peer_uid(conn) != os.geteuid() else _refusal(req, own_env, own_context, sources)
        if why:
            _log(f"[stage-server] refused {name}: {why}; it runs unserved")
            send(conn, {"refused": why})
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            for other, _, _ in jobs.values():
                if other is not None:
                    other.close()
            _child(req, fds, run)
        try:
            send(conn, {"pid": pid})
        except OSError:   # the client is gone already: so is its job (reaped with the others)
            _kill_job(pid)
            conn.close()
            jobs[pid] = (None, name, time.monotonic())
            return
        jobs[pid] = (conn, name, time.monotonic())
    except BaseException:
        conn.close()
        raise
    finally:
        for fd in fds:
            os.close(fd)
