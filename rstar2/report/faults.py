"""The report's fault table: what failing infrastructure did to each RL stage, shown only where it did something.

Reads the fault keys of metrics.jsonl (``rl/step_metrics.py`` lists them; ``rl/fault_accounting.py`` and
``rl/finite_guard.py`` write them). A stage whose every count is zero gets no row; no such stage, no table.
"""

from __future__ import annotations

from .document import Heading, Table
from .inputs import num

COUNTS = ("tool_calls_retried", "tool_calls_unserved", "trajectories_excluded", "grading_timeouts",
          "grading_pool_restarts", "reward_errors")


def _sum(rows: list[dict], key: str) -> int:
    return int(sum(num(r.get(key)) or 0 for r in rows))


def fault_rows(stages: dict[str, list[dict]]) -> list[list[str]]:
    """One row per stage with any non-zero fault count: stage, tool calls retried and served, tool calls unserved,
    the highest unserved share of a step (with its step), trajectories left out, grading timeouts, grading-pool
    restarts, answers the reward failed on and steps skipped as non-finite. (A stage stopped by a fault has no finished folder for the report; its
    rerun resumes from the last checkpoint and drops the rows after it.)"""
    out = []
    for name, rows in stages.items():
        counts = {k: _sum(rows, k) for k in COUNTS}
        skipped = max((int(num(r.get("skipped_steps")) or 0) for r in rows), default=0)
        if not any(counts.values()) and not skipped:
            continue
        shares = [(num(r.get("tool_infra_failure_ratio")) or 0.0, r.get("step")) for r in rows]
        worst, at = max(shares, key=lambda x: x[0], default=(0.0, None))
        out.append([name, str(counts["tool_calls_retried"]), str(counts["tool_calls_unserved"]),
                    f"{100 * worst:.0f}% (step {at})" if worst > 0 else "0%", str(counts["trajectories_excluded"]),
                    str(counts["grading_timeouts"]), str(counts["grading_pool_restarts"]),
                    str(counts["reward_errors"]), str(skipped)])
    return out


def faults(stages: dict[str, list[dict]]) -> list:
    """The fault table's blocks (none when no stage had a fault)."""
    rows = fault_rows(stages)
    if not rows:
        return []
    return [Heading("Faults during RL", 3),
            Table(["stage", "tool calls retried (served)", "tool calls unserved", "highest unserved share",
                   "trajectories left out", "grading timeouts", "grading pool restarts", "reward failures",
                   "non-finite steps skipped"],
                  rows,
                  caption="Infrastructure failures kept apart from the model's own errors: a tool call the sandbox "
                          "failed (worker crashed, service unreachable or full) is retried; one still unserved "
                          "ends its trajectory, which is left out of the update and of every other training "
                          "metric; above rl.faults.max_infra_share of a step's calls the stage stops. A grading "
                          "call past its time bound scores 0, as does an answer the reward failed on (rl.reward "
                          "raised or met a bad gold). A step with a non-finite loss or gradient norm makes no update (rl.faults.max_nonfinite_steps in a row stop the stage).")]
