"""Fault accounting of one RL step: tool calls the sandbox could not serve are kept apart from the model's errors.

A tool call fails for the model's reasons (its code raised, timed out or hit a limit, or did not parse: the
statuses GRPO-RoC's p_err counts, paper §2.2.3) or for the infrastructure's (the sandbox worker crashed, the
service was unreachable, restarting or refused the call for capacity). The sandbox client retries the latter
(``sandbox.retries``); a call still unserved has status ``sandbox.INFRA_STATUS`` and ends its trajectory
(``Trajectory.unserved``). Such a trajectory says nothing about the policy, so it is taken out of its group before
GRPO-RoC selection: it is never kept, never graded, never counted as a tool error, only counted here. Above
``rl.faults.max_infra_share`` of a step's tool calls unserved, the stage stops before that step's update
(``InfraFaultShare``, a ``StageFault``) with one line naming the sandbox and the share; the checkpoints stay, so a
rerun resumes from the last one. Every step's row in metrics.jsonl carries the counts (``metrics``).

The reward's own failures (a user ``rl.reward`` that raised or returned no number, or the built-in meeting a gold
it cannot parse) score 0 like a wrong answer; they are counted (``reward_errors``), logged each step, kept in the
rollout record (``grading_error``), and a user reward failing on every answer of a step stops the stage
(``RewardFailed``): training on all-zero rewards would teach nothing and hide the bug.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..faults import StageFault
from ..sandbox import INFRA_STATUS


class InfraFaultShare(StageFault):
    """More of a step's tool calls went unserved than ``rl.faults.max_infra_share`` allows."""


class RewardFailed(StageFault):
    """A user reward function failed on every graded answer of a step."""


@dataclass(frozen=True)
class FaultPolicy:
    """``rl.faults``: when an RL stage stops instead of training through failing infrastructure.

    max_infra_share: stop when more than this share (0-1) of a step's tool calls was not served after the
    sandbox client's retries. max_nonfinite_steps: stop after this many optimizer steps in a row whose loss or
    gradient norm was not finite (``finite_guard``). grading_stall_s: seconds without an answer from any grading
    worker after which the grading pool is restarted, and the stage stopped if the restart does not answer.
    """
    max_infra_share: float
    max_nonfinite_steps: int
    grading_stall_s: float


@dataclass
class StepFaults:
    """One process's fault counts of one step (summed over processes with ``+``).

    tool_calls: every call of the step's trajectories; unserved: calls with ``INFRA_STATUS``; retried: calls
    served after at least one retry; excluded: trajectories left out of the update; grading_timeouts: answers
    whose grading ran past its time bound (scored 0); grading_restarts: grading-pool restarts; last_error: the
    last line of one unserved call's message; reward_errors: graded answers whose reward raised, returned a bad
    value or met a bad gold (scored 0), graded: answers graded at all, last_reward_error: one such message."""
    tool_calls: int = 0
    unserved: int = 0
    retried: int = 0
    excluded: int = 0
    grading_timeouts: int = 0
    grading_restarts: int = 0
    last_error: str = ""
    reward_errors: int = 0
    graded: int = 0
    last_reward_error: str = ""

    def __add__(self, other: "StepFaults") -> "StepFaults":
        return StepFaults(*(getattr(self, k) + getattr(other, k) for k in
                            ("tool_calls", "unserved", "retried", "excluded", "grading_timeouts", "grading_restarts")),
                          last_error=other.last_error or self.last_error,
                          reward_errors=self.reward_errors + other.reward_errors, graded=self.graded + other.graded,
                          last_reward_error=other.last_reward_error or self.last_reward_error)

    @property
    def share(self) -> float | None:
        """Unserved calls / all calls (None for a step without tool calls)."""
        return self.unserved / self.tool_calls if self.tool_calls else None


def split_step(groups: list[list], grading_restarts: int = 0) -> tuple[list[list], list[list], StepFaults]:
    """Take the unserved trajectories out of each group.

    Args:
        groups: one list of drawn trajectories (``rollout.Trajectory``) per prompt. grading_restarts: how often the
            grading pool was restarted during the step.
    Returns:
        (served trajectories per group, excluded trajectories per group, the step's counts), groups in order.
    """
    served, excluded, f = [], [], StepFaults(excluded=0, grading_restarts=grading_restarts)
    for g in groups:
        served.append([t for t in g if not t.unserved])
        excluded.append([t for t in g if t.unserved])
        for t in g:
            calls = t.tool_calls
            f.tool_calls += len(calls)
            f.retried += sum(c["status"] != INFRA_STATUS and c.get("attempts", 1) > 1 for c in calls)
            f.grading_timeouts += t.grading_status == "timeout"
            f.graded += t.grading_status is not None
            if t.grading_error and t.grading_status == "ok":   # the reward's own failure, not the pool's
                f.reward_errors += 1
                f.last_reward_error = t.grading_error.strip().splitlines()[0][:200] if t.grading_error.strip() else ""
            bad = [c for c in calls if c["status"] == INFRA_STATUS]
            f.unserved += len(bad)
            if bad:
                f.last_error = (bad[-1]["output"].strip().splitlines() or [""])[-1][:200]
        f.excluded += len(excluded[-1])
    return served, excluded, f


def excluded_records(excluded: list) -> list[dict]:
    """rollouts.jsonl rows of one group's excluded trajectories (``excluded``: the reason, never kept)."""
    return [{"kept": False, "excluded": INFRA_STATUS, "group_dropped": None, "advantage": None, "p_err": None,
             "p_format": None, "penalty": None, **t.record()} for t in excluded]


def metrics(f: StepFaults) -> dict:
    """The step's fault keys of metrics.jsonl: tool_infra_failure_ratio (unserved / all tool calls; None without
    calls), tool_calls_unserved, tool_calls_retried, trajectories_excluded, grading_timeouts,
    grading_pool_restarts, reward_errors."""
    return {"tool_infra_failure_ratio": f.share, "tool_calls_unserved": f.unserved, "tool_calls_retried": f.retried,
            "trajectories_excluded": f.excluded, "grading_timeouts": f.grading_timeouts,
            "grading_pool_restarts": f.grading_restarts, "reward_errors": f.reward_errors}


def reward_warning(f: StepFaults, reward: str, step: int) -> str | None:
    """A log line when some answers of the step could not be rewarded (they score 0), else None."""
    if not f.reward_errors:
        return None
    return (f"[rl] step {step}: rl.reward {reward!r} failed on {f.reward_errors} of {f.graded} graded answers "
            f"(scored 0): {f.last_reward_error}")


def reward_failed(f: StepFaults, reward: str, step: int, where: str) -> str | None:
    """The one-line reason to stop when a user reward (``module:function``) failed on every graded answer of the
    step: every reward would be 0, so nothing would be learned from a bug. None otherwise (the built-in's bad
    golds are counted and warned about, not stopped for: a bad row must not end a run)."""
    if reward == "answer" or not f.graded or f.reward_errors < f.graded:
        return None
    return (f"{where}: step {step}: rl.reward {reward!r} failed on all {f.graded} graded answers of the step "
            f"(last: {f.last_reward_error}). Stopped before this step's update; fix the function and rerun to resume")


def over_share(f: StepFaults, policy: FaultPolicy, step: int, sandbox_name: str, where: str) -> str | None:
    """The one-line reason to stop when more than ``policy.max_infra_share`` of the step's calls went unserved,
    else None. ``where`` names the stage's output folder."""
    if f.share is None or f.share <= policy.max_infra_share:
        return None
    return (f"{where}: step {step}: the sandbox ({sandbox_name}) did not serve {f.share:.0%} of the step's tool calls "
            f"({f.unserved} of {f.tool_calls}, after its retries), above rl.faults.max_infra_share "
            f"{policy.max_infra_share:.0%}; last error: {f.last_error or 'n/a'}. Stopped before this step's update; "
            "the last checkpoint is kept: fix the sandbox and rerun to resume")
