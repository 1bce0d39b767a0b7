"""Structured results, limits and the text the model sees (paper §2.1; code-judge; released code
rstar2_agent/tools/code_judge_utils.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# A call the sandbox could not serve, after the client's retries (sandbox worker crashed, service unreachable,
# call rejected for capacity): a failure of the infrastructure, not of the model's code (rl/fault_accounting.py).
INFRA_STATUS = "infra-error"
STATUSES = ("ok", "error", "timeout", "memory", "output-limit", "parse-error", INFRA_STATUS)


@dataclass
class ExecResult:
    """Structured outcome of one tool call.

    status: one of ``STATUSES``; exit_code: the process exit status (negative = killed by that signal);
    stdout/stderr: captured text, each capped at ``max_output_bytes``; duration_s: wall seconds; attempts: how
    often the client sent the call (infrastructure failures are retried, ``SandboxClient``).
    """
    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    attempts: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def is_infra_failure(res: ExecResult) -> bool:
    """True for a failure of the sandbox rather than of the code: ``INFRA_STATUS``, or status ``error`` with no exit
    code (the code never ran to an exit: its zygote died and the call was lost, the service was unreachable or
    refused it, no worker answered; ``wire.judge_result`` calls these ``internal_error``). The code's own failures
    (an exception, a timeout, a limit) always have an exit code, so model-written code cannot produce one."""
    return res.status == INFRA_STATUS or (res.status == "error" and res.exit_code is None)


@dataclass
class SandboxLimits:
    """Per-call limits.

    timeout_s: wall clock (the whole process group is SIGKILLed); cpu_s: RLIMIT_CPU seconds; memory_mb:
    address space the call may add on top of the warm interpreter it is forked from (RLIMIT_AS = that
    interpreter's size + memory_mb); max_output_bytes: per stream, the call is killed past it (status
    ``output-limit``); max_processes: RLIMIT_NPROC of the call's uid; max_file_mb: RLIMIT_FSIZE.
    """
    timeout_s: float = 5.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_output_bytes: int = 65536
    max_processes: int = 64
    max_file_mb: int = 16

    def __post_init__(self):
        """Raises ValueError for a limit that cannot work (zero or negative; memory below 16 MB)."""
        bad = {k: v for k, v in self.__dict__.items() if not isinstance(v, (int, float)) or v <= 0}
        if bad:
            raise ValueError(f"SandboxLimits: every limit must be a positive number, got {bad}")
        if self.memory_mb < 16:
            raise ValueError(f"SandboxLimits: memory_mb={self.memory_mb} leaves a call no room to run (min 16)")


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the first and last ``max_chars // 2`` characters, joined by a marker (verl's middle truncation)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}...(truncated {len(text) - 2 * half} chars)...{text[-half:]}"


def render_result(res: ExecResult, max_chars: int = 256) -> str:
    """The text the model sees in ``<tool_response>``, rendered from the structured result (paper §2.1)."""
    if res.status == "ok":
        text = res.stdout if res.stdout.strip() else "(no output)"
    elif res.status == "timeout":
        text = f"Tool call failure\nreason: timeout after {res.duration_s:.1f}s\n{res.stdout}".rstrip()
    else:
        tail = "\n".join(res.stderr.strip().splitlines()[-3:])
        text = f"Tool call failure\nreason: {res.status}\n{res.stdout}{tail}".rstrip()
    return truncate_middle(text.rstrip("\n"), max_chars)
