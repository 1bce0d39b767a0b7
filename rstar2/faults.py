"""Faults that stop a stage, and the test-only fault injection that drives the real failure paths.

``StageFault`` is what a stage raises when its infrastructure fails in a way it must not train through: the
sandbox failing too large a share of a step's tool calls (``rl/fault_accounting.py``), a grading pool that stops
answering and cannot be restarted (``grading_pool.py``), too many non-finite steps in a row
(``rl/finite_guard.py``). Its message is one line naming what failed; ``rstar2 <stage>`` prints it and exits with
status 3 (``cli.py``). Nothing already written is touched, so the stage's last checkpoint stays and a rerun resumes.

Fault injection (tests only; off unless set): ``RSTAR2_INJECT_FAULTS`` holds a JSON object in the environment of
the process that runs the stage. It is read only on the trainer's side (the sandbox pool, the grading pool, the
trainer); model-written code runs in the sandbox, whose children get a fixed scrubbed environment
(``sandbox.pool.CHILD_ENV``) and never run this code, so it can neither set nor trigger an injection. Each
injected fault takes the same path a real one takes (a zygote really SIGKILLed, a grading worker that really
hangs, a loss that really is NaN before backward). Keys:

- ``sandbox_kill_calls``: ``[n, ...]``: the n-th call a sandbox ``Pool`` accepts (1-based, per pool) has its
  zygote's whole sandbox SIGKILLed ``sandbox_kill_delay_s`` (default 0.05) after the call went to it, so every
  call in flight there is lost; ``sandbox_kill_from``: ``n``: the same for every call from the n-th on.
- ``grading_hang_items``: ``[n, ...]``: the n-th item a grading pool is given (1-based, per process) is replaced
  by a request that makes its worker sleep forever (the per-item time bound must end it).
- ``grading_stall``: ``"once"`` | ``"always"``: the grading pool's workers never report ready, in its first
  generation of workers only or in every one (the pool must notice, restart, or stop the stage).
- ``nan_loss_steps``: ``[s, ...]``: the loss of RL optimizer step s (1-based) is multiplied by NaN before
  backward, so the loss and every gradient are NaN.
"""

from __future__ import annotations

import json
import os

ENV = "RSTAR2_INJECT_FAULTS"
_cache: tuple[str, dict] = ("", {})


class StageFault(RuntimeError):
    """A fault that stops a stage; the message is one line naming the failing part and the measure that tripped."""


def injected(key: str, default=None):
    """The injected fault ``key`` of ``RSTAR2_INJECT_FAULTS`` (see the module docstring), or ``default``.

    Raises:
        ValueError: the variable is set but is not a JSON object.
    """
    global _cache
    raw = os.environ.get(ENV, "")
    if not raw:
        return default
    if raw != _cache[0]:
        spec = json.loads(raw)
        if not isinstance(spec, dict):
            raise ValueError(f"{ENV} must be a JSON object, got {raw[:80]!r}")
        _cache = (raw, spec)
    return _cache[1].get(key, default)


def sandbox_kill_delay(n: int) -> float | None:
    """Seconds after which the zygote that took the n-th call of a pool is to be SIGKILLed, or None (no injection)."""
    start = injected("sandbox_kill_from")
    if n in (injected("sandbox_kill_calls") or []) or (start is not None and n >= start):
        return float(injected("sandbox_kill_delay_s", 0.05))
    return None
