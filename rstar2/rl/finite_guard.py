"""The non-finite guard of an RL stage: a step whose loss or gradient norm is not finite is never applied.

One NaN or infinity in an applied update ruins the weights for good (AdamW's moments carry it into every later
step). ``RoCGRPOTrainer`` asks ``FiniteGuard.check`` at its optimizer step, after the gradients were reduced and
clipped: a step whose loss (on any process) or global gradient norm is not finite gets no optimizer update, the
way a step without surviving groups gets none (rl/trainer.py): the gradients are zeroed, while the step counter,
the learning-rate schedule and the data position advance as on every step, so a run resumed from a checkpoint
after such a step continues exactly as the uninterrupted one. The guard's counts travel in the checkpoint
(``state_dict``, rl/checkpoints.py's ``rstar2_state.json``). Every metrics.jsonl row carries ``nonfinite_skipped``
and ``skipped_steps`` (``row``); ``max_nonfinite_steps`` such steps in a row stop the stage (``NonFiniteSteps``, a
``StageFault``) once that step's row is written and before its checkpoint, so the last checkpoint stays.
"""

from __future__ import annotations

import math

from ..faults import StageFault, injected


class NonFiniteSteps(StageFault):
    """Too many optimizer steps in a row had a non-finite loss or gradient norm."""


def _value(x) -> float | None:
    if x is None:
        return None
    return float(x.detach().float().item()) if hasattr(x, "detach") else float(x)


class FiniteGuard:
    """Counts non-finite steps and decides whether a step's update is applied.

    Args:
        max_consecutive: non-finite steps in a row that stop the stage (``rl.faults.max_nonfinite_steps``).
    Attributes:
        streak: non-finite steps in a row now; skipped: such steps in the stage so far; last: this step's
        ``(loss, grad_norm)`` as floats, or None before any check.
    """

    def __init__(self, max_consecutive: int):
        if max_consecutive < 1:
            raise ValueError(f"rl.faults.max_nonfinite_steps must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.streak = self.skipped = 0
        self.step_skipped = False
        self.last: tuple[float | None, float | None] | None = None

    def check(self, loss, grad_norm, update: bool) -> bool:
        """Whether this step's optimizer update may be applied.

        Args:
            loss: the step's loss (a tensor or number; the caller has already combined every process's verdict
                into a non-finite value if any process's loss was not finite). grad_norm: the global gradient
                norm before clipping (None when not computed). update: False for a step without an update anyway
                (no surviving group), which leaves the counts as they are.
        Returns:
            False when the loss or gradient norm is not finite (the update must be skipped), else True.
        """
        self.step_skipped = False
        if not update:
            self.last = None
            return True
        self.last = (_value(loss), _value(grad_norm))
        finite = all(v is None or math.isfinite(v) for v in self.last)
        if finite:
            self.streak = 0
            return True
        self.streak += 1
        self.skipped += 1
        self.step_skipped = True
        return False

    def row(self) -> dict:
        """This step's keys of metrics.jsonl: nonfinite_skipped, skipped_steps."""
        return {"nonfinite_skipped": self.step_skipped, "skipped_steps": self.skipped}

    def stop_reason(self, step: int) -> str | None:
        """The one-line reason to stop after ``step``, when ``max_consecutive`` non-finite steps ran in a row."""
        if self.streak < self.max_consecutive:
            return None
        loss, norm = self.last or (None, None)
        return (f"step {step}: {self.streak} optimizer steps in a row had a non-finite loss or gradient norm (this "
                f"one: loss {loss}, gradient norm {norm}), rl.faults.max_nonfinite_steps {self.max_consecutive}; none "
                "was applied and the last checkpoint is kept: lower the learning rate or check the data, then rerun")

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the streak and the stage's count of skipped steps."""
        return {"streak": self.streak, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` (a checkpoint written before this guard existed has none: counts stay 0)."""
        self.streak, self.skipped = int(state.get("streak", 0)), int(state.get("skipped", 0))


def inject_nan(loss, step: int):
    """Test-only fault injection (``rstar2.faults``: ``nan_loss_steps``): ``loss * NaN`` on the listed RL steps, so
    the backward pass carries it into every gradient as a real NaN would (``+ NaN`` would leave the gradients
    finite); otherwise ``loss`` itself."""
    steps = injected("nan_loss_steps")
    if steps and step in steps:
        return loss * float("nan")
    return loss


def make_stop_callback(guard: FiniteGuard, where: str):
    """A TrainerCallback raising ``NonFiniteSteps`` on the log of the step that completes the streak; registered
    after the metrics callback, so that step's row is written first, and raised before the step's checkpoint.
    ``where`` (the stage) starts the message."""
    from transformers import TrainerCallback

    class _Stop(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            why = guard.stop_reason(state.global_step)
            if why and logs and "loss" in logs:
                raise NonFiniteSteps(f"{where}: {why}")

    return _Stop()
