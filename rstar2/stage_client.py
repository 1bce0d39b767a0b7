"""The client side of the stage server (``rstar2/stages/server.py``): a stage job's process hands its command line,
folder, environment, umask, ignored signals and standard streams to the server, which forks the job from its
pre-imported process, then forwards the signals it gets to the job and exits with the job's status. Imports nothing
heavy: it runs first in every ``rstar2`` command. Both sides check that the other runs as the same user.

``python -m rstar2.stage_client SCRIPT ARGS`` runs a Python script the same way (the tests' stage runners), or in
this process, as ``python SCRIPT ARGS`` would, when no server takes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

ENV_VAR = "RSTAR2_STAGE_SERVER"
# Read when the server's libraries (or Python itself) start: thread pools (GNU OpenMP, MKL, OpenBLAS, numexpr), the
# Hugging Face and torch settings and cache folders, Python's own start-up, the dynamic loader, the locale. A job whose
# value differs from the server's runs unserved. Not here: the temporary folder (a served job finds its own: rstar2/stages/server.py)
# and Intel OpenMP's KMP_* (scikit-learn and joblib set two in any process that imports them; torch's Linux wheels
# run GNU OpenMP).
IMPORT_TIME = ("OMP_", "GOMP_", "MKL_", "OPENBLAS", "GOTO_", "VECLIB_", "NUMEXPR_", "ONEDNN", "DNNL", "ATEN_", "HF_",
               "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH", "CUDA", "NCCL_", "NVIDIA", "HIP_", "ROCM", "VLLM_",
               "TRITON", "TOKENIZERS_", "ACCELERATE_", "DATASETS_", "TRL_", "SAFETENSORS", "MPL", "PYTHON", "LD_",
               "XDG_", "HOME", "LANG", "LC_")
LAUNCHED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_JOB_ID")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGTSTP, signal.SIGCONT)
# limits a served job would otherwise take from the server: a client whose differ runs unserved
RLIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_RSS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
           "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_MEMLOCK")



# Read when used, not at import, and set by a library in whichever process used it first: torch.cuda.is_available
# reads the first (vLLM's import sets it), inductor's compile the second (torch sets it where it compiled)
RUNTIME = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that a library reads when it is imported (``IMPORT_TIME`` prefixes)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in RUNTIME}


def process_context() -> dict:
    """What a process runs with beyond its environment, which a served job would take from the server: the
    interpreter and its venv, the rstar2 package's folder (another checkout's code), Python's flags, warning and -X
    options, CPU affinity, niceness and resource limits. A client's must equal the server's (else it runs unserved)."""
    import resource

    return {"interpreter": [os.path.realpath(sys.executable), os.path.realpath(sys.prefix)],
            "package": os.path.dirname(os.path.realpath(__file__)), "flags": list(sys.flags),
            "warnoptions": list(sys.warnoptions), "xoptions": sorted(map(str, sys._xoptions.items())),
            "affinity": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "rlimits": {r: list(resource.getrlimit(getattr(resource, r))) for r in RLIMITS if hasattr(resource, r)}}


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def send(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    body = json.dumps(obj).encode()
    head = struct.pack("!I", len(body))
    if fds:
        socket.send_fds(sock, [head], fds)
    else:
        sock.sendall(head)
    sock.sendall(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data


def recv(sock: socket.socket, maxfds: int = 0) -> tuple[dict, list[int]]:
    if maxfds:
        head, fds, _, _ = socket.recv_fds(sock, 4, maxfds)
        if not head:
            raise EOFError("connection closed")
        head += _recv_exact(sock, 4 - len(head))
    else:
        head, fds = _recv_exact(sock, 4), []
    return json.loads(_recv_exact(sock, struct.unpack("!I", head)[0])), fds


def delegate(argv: list[str], script: bool = False) -> int | None:
    """Client side, called first by ``rstar2.cli.main`` for a command-line job: run ``argv`` (``sys.argv``) on the
    server named by ``$RSTAR2_STAGE_SERVER``; returns the job's exit status, or None when the job must run in this
    process (no server configured or answering, a launched or SLURM process, import-time environment differing).
    A job killed by a signal kills this process with the same signal. With ``script``, ``argv`` is a Python script
    and its arguments (``python -m rstar2.stage_client SCRIPT ARGS``: the tests' stage runners)."""
    path = os.environ.get(ENV_VAR)
    if not path or any(k in os.environ for k in LAUNCHED):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ignored = [s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]   # e.g. under nohup: stay ignored
    try:
        sock.connect(path)
        if peer_uid(sock) != os.geteuid():   # someone else's socket: it gets neither our environment nor streams
            raise OSError("the stage server runs as another user")
        mask = os.umask(0)
        os.umask(mask)
        sock.settimeout(600)   # its imports, on a busy machine; then this job runs here
        send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": mask, "script": script,
                    "ignored": [int(s) for s in ignored], "context": process_context()}, fds=[0, 1, 2])
        reply, _ = recv(sock)
        sock.settimeout(None)
    except (OSError, EOFError, ValueError):
        sock.close()
        return None
    pid = reply.get("pid") if isinstance(reply, dict) else None
    if not isinstance(pid, int) or pid <= 1:   # refused: runs here
        sock.close()
        return None

    def forward(signum, frame):
        try:
            sock.sendall(bytes([signum]))
        except OSError:
            pass
        if signum == signal.SIGTSTP:   # Ctrl-Z: the job stops, and so does this process, as without the server
            os.kill(os.getpid(), signal.SIGSTOP)

    for s in FORWARDED:
        if s not in ignored:
            signal.signal(s, forward)
    try:
        status = recv(sock)[0]["status"]
    except (OSError, EOFError, ValueError, KeyError, TypeError):   # the server died: its job must not run unwatched
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        print(f"rstar2: the stage server at {path} went away while running this job", file=sys.stderr)
        return 1
    finally:
        sock.close()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def run_script(argv: list[str]) -> int:
    """``python SCRIPT ARGS`` in this process: the script's folder first on ``sys.path``, run as ``__main__``."""
    import runpy

    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    served = delegate(sys.argv[1:], script=True)
    sys.exit(served if served is not None else run_script(sys.argv[1:]))
