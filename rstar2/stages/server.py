"""A pre-imported fork server for stage jobs: ``rstar2 <stage>`` hands its job to it instead of importing torch,
transformers and TRL itself.

A stage job of a small run spends most of its time importing (a tiny workflow's RL stage: about 10 of its 17 s on a
2-core Xeon, measured with cProfile; ``docs/tests.md``). The server imports those libraries once; each job is a
``fork()`` of it that takes the client's command line, working directory, environment, umask and standard streams,
and runs ``rstar2.cli.main`` there. The client (the ``rstar2`` process Snakemake started) stays in place as the job's
process: it forwards the signals it gets (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) to the job and exits
with its status (or dies of the same signal). If the client dies (e.g. SIGKILL to its process group) the server
SIGKILLs the job's process group, so a killed job leaves nothing running, as it would without the server.

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

from ..stage_client import ENV_VAR, FORWARDED, interpreter, recv, run_script, send, import_time_env


def preimport() -> None:
    """What every model stage imports, imported once: torch, transformers (its generation module with
    scikit-learn hidden, as ``rstar2.cli._lighter_imports`` does), its Trainer and the Qwen/Llama model code,
    accelerate, datasets, safetensors, TRL's package and SFT trainer (not its GRPO trainer, which imports vLLM where
    it is installed: an RL job on the transformers engine hides vLLM first), and the stage modules. Nothing here
    runs a torch op or starts a thread that a fork could leave holding a lock."""
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
        import tempfile
        tempfile.tempdir = None   # found again from this job's TMPDIR
        sys.argv = list(req["argv"])
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        # as the interpreter's own exit does: wait for non-daemon threads, run atexit, flush
        try:
            import atexit
            import threading
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str, run: Callable[[], int]) -> None:
    """Server side: listen on the Unix socket ``path`` (bound before the imports, so clients that come early wait
    instead of importing for themselves), import (:func:`preimport`), then fork one job per client, which calls
    ``run`` (``rstar2.cli.main``: ``rstar2 stage-server``) or runs the client's script. Ends when its
    parent process ends (the test session that started it) or on SIGTERM/SIGINT, SIGKILLing the jobs still running.
    Clients of another interpreter or with a different import-time environment are refused (they run unserved)."""
    import gc
    import select

    parent = os.getppid()
    own_env = import_time_env(dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    mask = os.umask(0o177)   # only its owner may connect: a client runs commands as the server's user
    try:
        listener.bind(path)
    finally:
        os.umask(mask)
    listener.listen(64)
    stop = []
    for s in (signal.SIGTERM, signal.SIGINT):   # before the imports: a stop during them still removes the socket
        signal.signal(s, lambda *a: stop.append(1))
    jobs: dict[int, tuple[socket.socket, str, float]] = {}   # job pid -> its client's connection, stage, start
    try:
        preimport()
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
            while jobs:   # finished jobs: their status to their clients
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                job = jobs.pop(pid, None)
                if job is not None:
                    conn, stage, start = job
                    print(f"[stage-server] {stage} (pid {pid}) exited {os.waitstatus_to_exitcode(status)} after "
                          f"{time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
                    if conn is not None:
                        try:
                            send(conn, {"status": status})
                        except OSError:
                            pass
                        conn.close()
            for pid, (conn, stage, start) in list(jobs.items()):
                if conn is None or conn not in ready:
                    continue
                data = b""
                try:
                    data = conn.recv(64)
                except OSError:
                    pass
                try:
                    if not data:   # the client is gone: so is its job, as a SIGKILL to its group would do
                        _kill_job(pid)
                        conn.close()
                        jobs[pid] = (None, stage, start)
                    for signum in data:
                        os.kill(pid, signum)
                except OSError:
                    pass
            if listener in ready:
                _accept(listener, jobs, own_env, run)
    finally:
        for pid in jobs:
            _kill_job(pid)
        listener.close()
        try:
            os.unlink(path)
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


def _accept(listener: socket.socket, jobs: dict, own_env: dict, run: Callable[[], int]) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        req, fds = recv(conn, maxfds=3)
        name = os.path.basename(req["argv"][0]) if req.get("script") else " ".join(req["argv"][1:2])
        differs = sorted(set(own_env.items()) ^ set(import_time_env(req["env"]).items()))
        if len(fds) != 3 or req.get("interpreter") != interpreter() or differs:
            why = f"${differs[0][0]} differs from the server's" if differs else "another interpreter"
            print(f"[stage-server] refused {name}: {why}; it runs unserved", file=sys.stderr, flush=True)
            send(conn, {"refused": why})
            raise OSError("refused")
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
        except OSError:   # the client is gone already
            _kill_job(pid)
            raise
        jobs[pid] = (conn, name, time.monotonic())
    except (OSError, EOFError, ValueError, KeyError):
        conn.close()
    finally:
        for fd in fds:
            os.close(fd)

