"""The wire of the sandbox service (``service.py``) shared by its API and its workers (``worker.py``): the Redis
keys and timings, code-judge's result shape, and the per-call limits a submission may carry and a worker caps."""

from __future__ import annotations

import dataclasses
import math

from .results import ExecResult, SandboxLimits, is_infra_failure

QUEUE_KEY = "rstar2:sandbox:queue"
REPLY_PREFIX = "rstar2:sandbox:reply:"
RESULT_TTL_S = 3600
DEFAULT_GRACE_S = 60.0
# redis-py (>= 6) gives every read a 5 s socket timeout by default; a blocking command that waits longer
# fails with TimeoutError. So every blocking read here waits at most BLOCK_S, well inside SOCKET_TIMEOUT_S.
BLOCK_S = 1
SOCKET_TIMEOUT_S = 10.0
BACKOFF_S = (0.5, 10.0)  # first and largest pause before reconnecting to Redis
LIMIT_TYPES = {f.name: type(f.default) for f in dataclasses.fields(SandboxLimits)}


def judge_result(sub_id: str, res: ExecResult) -> dict:
    """An ExecResult in code-judge's SubmissionResult shape (plus ``status`` and ``exit_code``).

    reason: ``worker_timeout`` for a timeout; ``internal_error`` for a failure that is not the code's own
    (``results.is_infra_failure``: the pool lost the call, e.g. its zygote crashed); otherwise ``""``.
    """
    if res.status == "timeout":
        reason = "worker_timeout"
    elif is_infra_failure(res):
        reason = "internal_error"
    else:
        reason = ""
    return {"sub_id": sub_id, "success": res.status == "ok", "run_success": res.exit_code == 0,
            "cost": res.duration_s, "stdout": res.stdout, "stderr": res.stderr, "reason": reason,
            "status": res.status, "exit_code": res.exit_code}


def failure_result(sub_id: str, why: str) -> dict:
    """The result of a call the service could not run or answer (reason ``internal_error``)."""
    return judge_result(sub_id, ExecResult("error", None, "", why, 0.0))


def parse_limits(raw, where: str) -> dict:
    """Check a submission's optional ``limits`` object; returns it as a dict (``{}`` for None).

    Fields are those of :class:`SandboxLimits`, each a positive number (an integer for the integer fields).
    Raises ValueError naming ``where`` and the field for anything else.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object with fields of SandboxLimits ({', '.join(LIMIT_TYPES)})")
    for k, v in raw.items():
        typ = LIMIT_TYPES.get(k)
        if typ is None:
            raise ValueError(f"{where}.{k}: unknown limit; expected one of {', '.join(LIMIT_TYPES)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf or \
                (typ is int and not float(v).is_integer()):
            raise ValueError(f"{where}.{k} must be a positive {typ.__name__}, got {v!r}")
    return dict(raw)


def cap_limits(requested: dict, maxima: SandboxLimits) -> SandboxLimits:
    """The limits a worker applies: each field of ``requested`` capped at ``maxima`` (a field left out, or
    one that is not a number, gets the maximum; unknown fields are ignored)."""
    out = {}
    for name, typ in LIMIT_TYPES.items():
        top = getattr(maxima, name)
        v = requested.get(name)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
        out[name] = typ(min(v, top)) if ok else top
    return SandboxLimits(**out)
