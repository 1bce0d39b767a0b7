"""Per-step metrics of an RL stage (metrics.jsonl, TensorBoard): rollout statistics over all drawn and all kept
trajectories of every process, and the callback that writes one row per optimizer step (paper §5.2 curves)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..io import append_jsonl
from ..memory import release_freed_memory
from . import roc
from .selection import GroupResult


def _mean(xs) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


@dataclass
class TrajStats:
    """What ``step_metrics`` needs of one trajectory: small enough to gather from every process each step.

    response_tokens: len(response_ids); loss_tokens: sum(response_mask); tool_statuses: each call's status."""
    reward: float
    response_tokens: int
    loss_tokens: int
    tool_statuses: list[str]
    truncated: bool

    @classmethod
    def of(cls, t) -> "TrajStats":
        return cls(t.reward, len(t.response_ids), sum(t.response_mask), [c["status"] for c in t.tool_calls],
                   bool(t.truncated))


@dataclass
class GroupStats:
    """A GroupResult reduced to TrajStats (``trajs``), with the same penalties and kept indices."""
    trajs: list
    penalties: list[tuple[float, float]]
    kept: list[int]
    dropped: bool

    @classmethod
    def of(cls, r: GroupResult) -> "GroupStats":
        return cls([TrajStats.of(t) for t in r.trajs], list(r.penalties), list(r.kept), r.dropped)


def _ratio_not_ok(statuses: list[str]) -> float | None:
    return sum(s != roc.OK_STATUS for s in statuses) / len(statuses) if statuses else None


def step_metrics(results: list) -> dict:
    """Per-step rollout metrics (metrics.jsonl / TensorBoard) over all drawn rollouts and the kept subset.

    ``results``: GroupResult or GroupStats (the latter gathered from every process in a multi-process run).
    Keys kept stable for the report: reward_mean, accuracy, response_length_mean, response_length_max,
    tool_calls_per_traj, tool_error_ratio, tool_error_ratio_pos, format_penalty_mean, truncation_ratio,
    all_correct_frac, all_wrong_frac, kept_pos, kept_neg. Added: tool_error_ratio_pos_kept, groups,
    groups_all_correct, groups_all_wrong, groups_dropped, kept_total, tool_error_penalty_mean,
    penalty_pos_mean, penalty_pos_kept_mean, loss_tokens. Ratios with an empty denominator are None. The trainer
    adds micro_batches (forward/backward passes of the step, the same on every process; 0 = update skipped).
    Fault keys, from ``fault_accounting.metrics`` (rollout_func): tool_infra_failure_ratio (tool calls the sandbox
    did not serve / all calls), tool_calls_unserved, tool_calls_retried, trajectories_excluded (left out of the
    update, not in any key above), grading_timeouts, grading_pool_restarts, reward_errors (answers the reward
    failed on, scored 0); from ``finite_guard.FiniteGuard.row``
    (trainer): nonfinite_skipped (this step's loss or gradient norm was not finite: no update) and skipped_steps
    (such steps so far in the stage); from ``logprob_gap.LogprobGap.row`` (trainer):
    train_rollout_logprob_abs_diff and train_rollout_logprob_abs_diff_max (sampler/learner mismatch over the
    step's loss tokens; None when an engine reported no log-probabilities); from ``tis.TISStats.row`` (trainer):
    tis_enabled, tis_clipped_share (loss tokens whose importance ratio exceeded rl.tis.cap / corrected tokens) and
    tis_uncorrected_tokens (without a sampler log-prob; both None when off). A group whose every trajectory was
    excluded counts in groups and groups_dropped only.
    """
    results = [r if isinstance(r, GroupStats) else GroupStats.of(r) for r in results]
    flat = [t for r in results for t in r.trajs]
    pens = [p for r in results for p in r.penalties]
    kept = [r.trajs[i] for r in results for i in r.kept]
    pos_pen = [a + b for r in results for t, (a, b) in zip(r.trajs, r.penalties) if t.reward > 0]
    pos_kept_pen = [sum(r.penalties[i]) for r in results for i in r.kept if r.trajs[i].reward > 0]
    statuses = [s for t in flat for s in t.tool_statuses]
    lengths = [t.response_tokens for t in flat]
    n_groups = len(results)
    all_correct = sum(bool(r.trajs) and all(t.reward > 0 for t in r.trajs) for r in results)
    all_wrong = sum(bool(r.trajs) and all(t.reward <= 0 for t in r.trajs) for r in results)
    return {
        "reward_mean": _mean(t.reward for t in flat),
        "accuracy": _mean(float(t.reward > 0) for t in flat),
        "response_length_mean": _mean(lengths),
        "response_length_max": max(lengths, default=0),
        "tool_calls_per_traj": len(statuses) / len(flat) if flat else None,
        "tool_error_ratio": _ratio_not_ok(statuses),
        "tool_error_ratio_pos": _ratio_not_ok([s for t in flat if t.reward > 0 for s in t.tool_statuses]),
        "tool_error_ratio_pos_kept": _ratio_not_ok([s for t in kept if t.reward > 0 for s in t.tool_statuses]),
        "tool_error_penalty_mean": _mean(p[0] for p in pens),
        "format_penalty_mean": _mean(p[1] for p in pens),
        "penalty_pos_mean": _mean(pos_pen),
        "penalty_pos_kept_mean": _mean(pos_kept_pen),
        "truncation_ratio": _mean(float(t.truncated) for t in flat),
        "groups": n_groups,
        "groups_all_correct": all_correct,
        "groups_all_wrong": all_wrong,
        "groups_dropped": sum(r.dropped for r in results),
        "all_correct_frac": all_correct / n_groups if n_groups else None,
        "all_wrong_frac": all_wrong / n_groups if n_groups else None,
        "kept_pos": sum(t.reward > 0 for t in kept),
        "kept_neg": sum(t.reward <= 0 for t in kept),
        "kept_total": len(kept),
        "loss_tokens": sum(t.loss_tokens for t in kept),
    }


def make_metrics_callback(rollout_fn: RolloutFunc, path: str, tensorboard_dir: str | None = None):
    """A TrainerCallback writing one metrics.jsonl row (and TensorBoard scalars) per optimizer step.

    Row = the step's rollout metrics (``step_metrics``) + rollout_time_s + loss, grad_norm, learning_rate,
    entropy, clip_ratio (TRL's clip_ratio/region_mean), step_time_s and update_skipped; loss, grad_norm,
    entropy and clip_ratio are None on a skipped step (no group kept, or ``nonfinite_skipped``).
    """
    from transformers import TrainerCallback

    class _MetricsCallback(TrainerCallback):
        def __init__(self):
            self.t0 = time.time()
            self.writer = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or rollout_fn.pending is None:
                return
            if not state.is_world_process_zero:  # every process holds the same gathered metrics
                rollout_fn.pending = None
                return
            skipped = rollout_fn.pending.get("kept_total", 1) == 0 or bool(rollout_fn.pending.get("nonfinite_skipped"))
            row = {"step": state.global_step, **rollout_fn.pending,
                   "loss": None if skipped else logs["loss"],
                   "grad_norm": None if skipped else logs.get("grad_norm"),
                   "learning_rate": logs.get("learning_rate"),
                   "entropy": None if skipped else logs.get("entropy"),
                   "clip_ratio": None if skipped else logs.get("clip_ratio/region_mean"),
                   "step_time_s": round(time.time() - self.t0, 2), "update_skipped": skipped}
            self.t0 = time.time()
            rollout_fn.pending = None
            append_jsonl(path, row)
            self._tensorboard(row)
            fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
            print(f"\n[rl] step {row['step']}: reward {fmt(row['reward_mean'], '.3f')} kept {row['kept_total']} "
                  f"(dropped groups {row['groups_dropped']}/{row['groups']}) tool calls/traj "
                  f"{fmt(row['tool_calls_per_traj'], '.2f')} length {fmt(row['response_length_mean'], '.0f')} "
                  f"loss {fmt(row['loss'], '.4f')}{' [update skipped]' if skipped else ''}"
                  f"{' [non-finite loss or gradient]' if row.get('nonfinite_skipped') else ''} "
                  f"({row['step_time_s']}s)", flush=True)

        def on_step_end(self, args, state, control, **kwargs):
            release_freed_memory()  # the step's activations and gradients, freed in the trainer's arena

        def replay(self, rows: list[dict]) -> None:
            """Re-emit earlier rows to TensorBoard (a resumed stage rewrites its event files)."""
            for row in rows:
                self._tensorboard(row)

        def _tensorboard(self, row: dict) -> None:
            if not tensorboard_dir:
                return
            if self.writer is None:
                from tensorboardX import SummaryWriter
                self.writer = SummaryWriter(tensorboard_dir)
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):  # None (undefined) is left out; bool -> 0/1
                    self.writer.add_scalar(f"rl/{k}", float(v), row["step"])
            self.writer.flush()

        def on_train_end(self, args, state, control, **kwargs):
            if self.writer is not None:
                self.writer.close()

    return _MetricsCallback()
