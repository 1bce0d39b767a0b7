"""Held-out evaluation during RL: accuracy of the current policy at fixed step intervals.

A learning curve needs the policy's accuracy on problems it never trains on, measured before the first update
and every ``every`` steps after. This callback runs the same agent loop and grader as the ``evaluate`` stage
(``rstar2.stages.evaluate``: ``rollout.sample_groups``, ``rollout.grade_all``, ``metrics.summarise``) on the configured held-out benchmark, inside the RL stage, with the weights of
that moment. Each evaluation samples from its own streams, ``seeds.derive(seed, "heldout", step)`` and the
problem and sample index, so adding or removing evaluations does not change the training run's samples, and two
evaluations of the same model with the same seed give the same trajectories (with ``rollout.reproducible``; the
earlier measurement, 10% and 12% of 50 problems at step 0 of two same-seed runs, came from trajectories
rejoining the decoding batch in the order their tool calls finished).

Writes, in the stage folder (main process only):

* ``heldout.jsonl`` - one row per evaluation: ``step``, ``n_problems``, ``k``, ``accuracy`` (avg@k, a fraction),
  ``accuracy_ci`` ([lo, hi], 95% bootstrap over problems), ``pass_at_k``, ``tool_calls_per_traj``,
  ``tool_ok_ratio`` (share of tool calls that ran with status ok), ``tool_use_ratio`` (share of trajectories with
  at least one call), ``response_length_mean`` (tokens), ``truncation_ratio``, ``wall_s``;
* ``heldout_problems.jsonl`` - ``step``, ``id``, ``rewards`` per problem (for per-kind breakdowns).

Both are cut back to the resumed checkpoint's step like the other logs (``rstar2.rl.checkpoints.truncate_log``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from .. import seeds
from ..io import append_jsonl
from ..memory import release_freed_memory


def shared_problems(heldout: list[dict], train: list[dict]) -> list[tuple[str, str]]:
    """``[(held-out id, train id)]`` for held-out problems whose text (whitespace and case folded) is also a
    training problem: an exact-match check, for runs that skip n-gram decontamination."""
    def fold(text) -> str:
        return " ".join(str(text).split()).lower()
    ids = {fold(r.get("problem", "")): r.get("id") for r in train}
    return [(p["id"], ids[fold(p["problem"])]) for p in heldout if fold(p["problem"]) in ids]


def check_disjoint(heldout: list[dict], train: list[dict], benchmark: str, where: str) -> None:
    """Refuse a held-out benchmark that shares problems with training data: its curve would measure memorisation.

    ``where`` names the training data in the message (a file, or an rl_data source).
    Raises:
        ValueError: a held-out problem's text (whitespace and case folded) is also a training problem; names
            ``where`` and the first shared pair of ids.
    """
    shared = shared_problems(heldout, train)
    if shared:
        raise ValueError(f"{len(shared)} problem(s) of rl.heldout.benchmark {benchmark!r} are also in {where} "
                         f"(first: held-out id {shared[0][0]!r} = train id {shared[0][1]!r}); list {benchmark!r} in "
                         "rl_data.decontaminate_against or hold out other problems")


def heldout_summary(trajs: list, k: int) -> dict:
    """Summarise graded trajectories (``k`` consecutive samples per problem) into one ``heldout.jsonl`` row.

    Raises:
        ValueError: ``len(trajs)`` is not a multiple of ``k``, or there are none.
    """
    from ..metrics import summarise

    if not trajs or len(trajs) % k:
        raise ValueError(f"need a positive multiple of k={k} trajectories, got {len(trajs)}")
    rows = [{"rewards": [t.reward for t in trajs[i:i + k]], "preds": [t.pred for t in trajs[i:i + k]],
             "response_tokens": [len(t.response_ids) for t in trajs[i:i + k]],
             "tool_calls": [len(t.tool_calls) for t in trajs[i:i + k]],
             "truncated": [t.truncated for t in trajs[i:i + k]]} for i in range(0, len(trajs), k)]
    s = summarise(rows, k)
    calls = [c for t in trajs for c in t.tool_calls]
    return {"n_problems": s["n_problems"], "k": k, "accuracy": s["avg_at_k"], "accuracy_ci": s["avg_at_k_ci"],
            "pass_at_k": s["pass_at_k"], "tool_calls_per_traj": s["mean_tool_calls"],
            "tool_ok_ratio": (sum(c.get("status") == "ok" for c in calls) / len(calls)) if calls else None,
            "tool_use_ratio": statistics.fmean(bool(t.tool_calls) for t in trajs),
            "response_length_mean": s["mean_response_tokens"], "truncation_ratio": s["truncation_ratio"]}


def make_heldout_callback(problems: list[dict], answer_type: str, rcfg, every: int, k: int, seed: int,
                          out_dir: str, max_steps: int, is_main: bool):
    """A ``transformers.TrainerCallback`` that evaluates the policy at step 0 and every ``every`` steps.

    Args:
        problems: held-out rows ``{"id", "problem", "answer"}`` (a benchmark loaded by
            ``rstar2.data.benchmarks.load_benchmark``); golds are used only for grading, after the rollouts.
        answer_type: the benchmark's grader (``integer`` | ``math`` | ``choice``).
        rcfg: ``RolloutConfig`` for the evaluation rollouts (sampling temperature, turn and token limits).
        every: evaluate after every ``every``-th optimizer step, and after the last step.
        k: samples per problem.
        max_steps: the stage's number of steps.
        is_main: only the main process evaluates and writes (the others wait at the next collective).

    The evaluation decodes with the transformers engine on the live policy whatever ``rcfg.engine`` says: an
    in-process vLLM built here would load the stage's starting folder, and a server holds the weights of the
    last sync (before this step's update), so either would evaluate an older policy.
    """
    from transformers import TrainerCallback

    out = Path(out_dir)
    rcfg = dataclasses.replace(rcfg, engine="hf")

    class HeldoutEval(TrainerCallback):
        def _evaluate(self, model, tok, step: int) -> None:
            from .. import rollout

            t0 = time.time()
            was_training = model.training
            # its own stream (seed, "heldout", step): evaluating or not does not change the training run's samples
            groups = rollout.sample_groups(
                model, tok, [{"id": p["id"], "problem": p["problem"]} for p in problems], k, rcfg,
                progress=rollout.Progress(f"held-out eval at step {step}", unit="trajectories"),
                seed=seeds.derive(seed, "heldout", step))
            model.train(was_training)
            release_freed_memory()
            trajs = [t for g in groups for t in g]
            rollout.grade_all(trajs, answer_types=[answer_type] * len(trajs),
                              golds=[p["answer"] for p in problems for _ in range(k)])
            row = {"step": step, **heldout_summary(trajs, k), "wall_s": round(time.time() - t0, 1)}
            append_jsonl(out / "heldout.jsonl", row)
            for i, p in enumerate(problems):
                append_jsonl(out / "heldout_problems.jsonl",
                             {"step": step, "id": str(p["id"]), "rewards": [t.reward for t in trajs[i * k:(i + 1) * k]]})
            lo, hi = row["accuracy_ci"]
            print(f"[rl] held-out accuracy at step {step}: {row['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
                  f"(n={row['n_problems']}, k={k}, tool calls ok {row['tool_ok_ratio']}, {row['wall_s']} s)",
                  flush=True)

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
            if is_main and state.global_step == 0:  # a resumed run already has its step-0 row
                self._evaluate(model, processing_class, 0)

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            step = state.global_step
            if is_main and (step % every == 0 or step == max_steps):
                self._evaluate(model, processing_class, step)

    return HeldoutEval()
