"""Run model-written Python outside the trainer's process (paper §2.1, §3.1; spec §2.4, §3.2).

This is the simple executor: one fresh interpreter per call (the released code-judge's design), in its own
session and process group, with resource limits, a private empty working directory, a scrubbed
environment, stdin from the call's ``input``, a wall-clock timeout that kills the whole process group,
capped output, and IPython-style display of the last expression when nothing was printed. The fast,
namespace-isolated executor is a separate piece of work (issue 3) behind the same ``execute`` signature.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

# Runs inside the child: execute the snippet; if it printed nothing, show the repr of the last expression.
_RUNNER = r"""
import ast, io, sys, traceback
src = open("snippet.py", encoding="utf-8").read()
try:
    tree = ast.parse(src, "<code>")
except SyntaxError:
    traceback.print_exc(limit=0); sys.exit(1)
last = None
if tree.body and isinstance(tree.body[-1], ast.Expr):
    last = ast.Expression(tree.body.pop().value)
g = {"__name__": "__main__"}
try:
    exec(compile(tree, "<code>", "exec"), g)
    if last is not None:
        value = eval(compile(last, "<code>", "eval"), g)
        if value is not None and sys.stdout.tell() == 0:
            print(repr(value))
except SystemExit:
    raise
except BaseException:
    etype, evalue, tb = sys.exc_info()
    traceback.print_exception(etype, evalue, tb.tb_next)
    sys.exit(1)
"""

STATUSES = ("ok", "error", "timeout", "memory", "output-limit", "parse-error")


@dataclass
class ExecResult:
    """Structured outcome of one tool call.

    status: one of ``STATUSES``; exit_code: the process exit status (negative = killed by that signal);
    stdout/stderr: captured text, each capped at ``max_output_bytes``; duration_s: wall seconds.
    """
    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SandboxLimits:
    """Per-call limits. timeout_s: wall clock; cpu_s: CPU seconds; memory_mb: address space; output bytes per stream."""
    timeout_s: float = 5.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_output_bytes: int = 65536
    max_processes: int = 64
    max_file_mb: int = 16


def _child_limits(lim: SandboxLimits):
    def apply():
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb * mb, lim.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.max_file_mb * mb, lim.max_file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (lim.max_processes, lim.max_processes))
    return apply


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def execute(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> ExecResult:
    """Run ``code`` with ``stdin`` in a fresh, limited child interpreter and return its structured result.

    Never raises for anything the code does; the child cannot see the caller's environment variables or
    working directory. Output goes to files in the private directory (bounded by RLIMIT_FSIZE), so huge
    output cannot exhaust the caller's memory.
    """
    lim = limits or SandboxLimits()
    work = tempfile.mkdtemp(prefix="rstar2-sbx-")
    start = time.monotonic()
    try:
        with open(os.path.join(work, "snippet.py"), "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.path.join(work, "stdin.txt"), "w", encoding="utf-8") as f:
            f.write(stdin or "")
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "MPLBACKEND": "Agg",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
        out_path, err_path = os.path.join(work, ".stdout"), os.path.join(work, ".stderr")
        with open(os.path.join(work, "stdin.txt"), "rb") as fin, open(out_path, "wb") as fout, \
                open(err_path, "wb") as ferr:
            proc = subprocess.Popen([sys.executable, "-I", "-c", _RUNNER], stdin=fin, stdout=fout, stderr=ferr,
                                    cwd=work, env=env, start_new_session=True, preexec_fn=_child_limits(lim))
            timed_out = False
            try:
                proc.wait(timeout=lim.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # kill the whole group: grandchildren must not outlive the call
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        stdout, out_over = _read_capped(out_path, lim.max_output_bytes)
        stderr, err_over = _read_capped(err_path, lim.max_output_bytes)
        rc = proc.returncode
        last_err = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        if timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL):
            status = "timeout"
        elif rc == -signal.SIGXFSZ or out_over or err_over:
            status = "output-limit"
        elif last_err.startswith("MemoryError"):
            status = "memory"
        else:
            status = "ok" if rc == 0 else "error"
        return ExecResult(status, rc, stdout, stderr, round(time.monotonic() - start, 4))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def execute_many(calls: list[tuple[str, str]], limits: SandboxLimits | None = None,
                 max_workers: int = 8) -> list[ExecResult]:
    """Run ``(code, stdin)`` pairs concurrently (threads only wait on child processes); results in input order."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(lambda c: execute(c[0], c[1], limits), calls))


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the first and last ``max_chars // 2`` characters, joined by a marker (verl's middle truncation)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}...(truncated {len(text) - 2 * half} chars)...{text[-half:]}"


def render_result(res: ExecResult, max_chars: int = 256) -> str:
    """The text the model sees in ``<tool_response>``, rendered from the structured result (spec §2.4)."""
    if res.status == "ok":
        text = res.stdout if res.stdout.strip() else "(no output)"
    elif res.status == "timeout":
        text = f"Tool call failure\nreason: timeout after {res.duration_s:.1f}s\n{res.stdout}".rstrip()
    else:
        tail = "\n".join(res.stderr.strip().splitlines()[-3:])
        text = f"Tool call failure\nreason: {res.status}\n{res.stdout}{tail}".rstrip()
    return truncate_middle(text.rstrip("\n"), max_chars)
