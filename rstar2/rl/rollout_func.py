"""One RL step's data (paper §2.2, §3): roll out 2G per prompt, grade, select G with GRPO-RoC, compute the
advantages, record every rollout (rollouts.jsonl) and the step's metrics. Called by ``RoCGRPOTrainer`` once
per optimizer step with the prompts of this process, the trainer and the inference engines."""

from __future__ import annotations

import os
import random
import time

from .. import grading_pool, sandbox, seeds
from .. import rollout as rollout_lib
from ..io import append_jsonl
from ..memory import release_freed_memory
from . import fault_accounting, roc
from .selection import GroupResult, PenaltyConfig, select, trajectory_penalties
from .step_metrics import GroupStats, step_metrics


class RolloutFunc:
    """One RL step's data: roll out, grade, select, compute advantages, record; holds the step's metrics.

    Args:
        answers: problem text -> {"id", "answer", optional "answer_type"} (the dataset rows TRL hands over carry
            only the prompt); answer_type (``grading.ANSWER_TYPES``, default integer) picks the row's grader.
        rcfg: rollout settings. group_size: G, rollouts kept per prompt. oversample: rollouts drawn per kept
            rollout in grpo_roc (2 in the paper). mode: "grpo_roc" or "grpo" (G drawn, all kept).
        positive_selection: "inverse_prob" or "topk". penalty: p_err/p_format definitions and eps.
        seed: the stage's seed; step s samples its rollouts from ``seeds.derive(seed, "rollout", s)`` and makes its
            RoC choices with ``random.Random(seeds.derive(seed, "select", s, process index))``, so a resumed
            stage needs no RNG state but the step counter. out_dir: where rollouts.jsonl is appended.
        faults: when to stop for failing infrastructure (``fault_accounting.FaultPolicy``; None: never). Trajectories
            whose tool call the sandbox could not serve are left out of selection and counted (fault_accounting).
        reward: ``rl.reward``, the reward of the registry every rollout is graded with (rstar2.grading.rewards:
            ``"answer"``, the paper's binary answer reward, or ``module:function``); RoC selection and the
            advantages use that value.
    Raises:
        ValueError: unknown mode or positive_selection.
    """

    def __init__(self, answers: dict, rcfg: rollout_lib.RolloutConfig, group_size: int, oversample: int,
                 mode: str, positive_selection: str, seed: int, out_dir: str,
                 penalty: PenaltyConfig | None = None, faults: fault_accounting.FaultPolicy | None = None,
                 reward: str = "answer"):
        if mode not in ("grpo", "grpo_roc"):
            raise ValueError(f"rl.mode must be 'grpo' or 'grpo_roc', got {mode!r}")
        if positive_selection not in roc.POSITIVE_SELECTIONS:
            raise ValueError(f"rl.positive_selection must be one of {roc.POSITIVE_SELECTIONS}, "
                             f"got {positive_selection!r}")
        self.answers, self.rcfg, self.G = answers, rcfg, group_size
        self.n_draw = group_size * oversample if mode == "grpo_roc" else group_size
        self.mode, self.positive_selection = mode, positive_selection
        self.penalty = penalty or PenaltyConfig()
        self.faults = faults
        self.reward = reward
        self.out_dir = out_dir
        self.seed = seed
        self.pending: dict | None = None
        self.last_results: list[GroupResult] = []
        self.step = 0
        self.process_index, self.num_processes = 0, 1

    def state_dict(self) -> dict:
        """JSON-serialisable state restored on resume: the step counter (every random stream derives from it)."""
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``."""
        self.step = state["step"]

    def set_process(self, index: int, count: int) -> None:
        """Tell the function which of ``count`` training processes it runs in: each process draws its own
        selection stream, so processes do not make the same RoC choices."""
        self.process_index, self.num_processes = index, count

    def __call__(self, prompts: list, trainer, engines: list | None = None) -> tuple[list, list[float]]:
        """Roll out ``n_draw`` trajectories per distinct prompt (TRL repeats each prompt G times in a row).

        In a multi-process run each process receives whole groups (``prompts`` holds G copies of each of its
        prompts) and rolls out, selects and trains on only those; the step's metrics and rollout records are
        gathered from every process, and only the main process writes them.
        engines: inference engines for ``run_rollouts`` (vLLM through TRL); None = its defaults (transformers).
        Returns:
            (kept trajectories, their advantages), possibly both empty when every group here was removed.
        Raises:
            ValueError: ``prompts`` is not a whole number of groups of G identical prompts.
            fault_accounting.InfraFaultShare: too many of the step's tool calls were not served (the step's
                metrics row is written first, with ``stopped``); grading_pool.GradingPoolStalled.
        """
        t0 = time.time()
        self.step += 1
        model = trainer.accelerator.unwrap_model(trainer.model)
        tok = trainer.processing_class
        if len(prompts) % self.G or any(prompts[i] != prompts[i - i % self.G] for i in range(len(prompts))):
            raise ValueError(f"RolloutFunc got {len(prompts)} prompts that are not whole groups of {self.G} "
                             "identical prompts: the per-process batch must be a multiple of rl.group_size")
        uniq = [prompts[i] for i in range(0, len(prompts), self.G)]
        problems = []
        for q in uniq:
            meta = self.answers[q]
            problems += [{"id": meta["id"], "problem": q, "answer": meta["answer"],
                          "answer_type": meta.get("answer_type") or "integer"}] * self.n_draw
        # server mode with several processes: the main process's scheduler runs every process's groups
        kw = {"engines": engines, "central": rollout_lib.central_for_trainer(trainer)} if engines is not None else {}
        restarts = grading_pool.stats()["restarts"]
        # each problem is graded with its rl_data source's answer_type; integer (the paper's curation) by default
        trajs = rollout_lib.run_rollouts(model, tok, problems, self.rcfg, answer_type="integer",
                                         progress=rollout_lib.Progress(f"rollout step {self.step}"),
                                         seed=seeds.derive(self.seed, "rollout", self.step), reward=self.reward,
                                         **kw)
        model.train()
        release_freed_memory()
        groups = [trajs[i:i + self.n_draw] for i in range(0, len(trajs), self.n_draw)]
        groups, excluded, counts = fault_accounting.split_step(groups, grading_pool.stats()["restarts"] - restarts)
        penalties = [[trajectory_penalties(t, tok, self.penalty) for t in g] for g in groups]
        rng = random.Random(seeds.derive(self.seed, "select", self.step, self.process_index))
        results = select(groups, penalties, self.G, self.mode, self.positive_selection, self.penalty.eps, rng)
        self.last_results = results
        stats = [GroupStats.of(r) for r in results]
        records = [[{**row, "answer_type": self.answers[row["question"]].get("answer_type") or "integer"}
                    for row in rows + fault_accounting.excluded_records(ex)]
                   for rows, ex in zip(self._records(results), excluded)]
        counts = [counts]
        if self.num_processes > 1:  # every process's groups, in process order
            from accelerate.utils import gather_object

            stats, records, counts = gather_object(stats), gather_object(records), gather_object(counts)
        if self.process_index == 0:
            path = os.path.join(self.out_dir, "rollouts.jsonl")
            for gi, rows in enumerate(records):
                for row in rows:
                    append_jsonl(path, {"step": self.step, "group": gi, **row})
        counts = sum(counts, fault_accounting.StepFaults())
        self.pending = {**step_metrics(stats), **fault_accounting.metrics(counts),
                        "rollout_time_s": round(time.time() - t0, 2)}
        self._stop_on_faults(counts)
        kept = [(r.trajs[i], a) for r in results for i, a in zip(r.kept, r.advantages)]
        return [t for t, _ in kept], [a for _, a in kept]

    def _stop_on_faults(self, counts: fault_accounting.StepFaults) -> None:
        """Stop before the update when the sandbox failed too many of the step's calls, or a user reward failed on
        every answer; the step's row is logged first. Some failed rewards: a warning line."""
        warning = fault_accounting.reward_warning(counts, self.reward, self.step)
        if warning and self.process_index == 0:
            print(warning, flush=True)
        why, fault = fault_accounting.reward_failed(counts, self.reward, self.step, self.out_dir), \
            fault_accounting.RewardFailed
        if not why:
            why, fault = self.faults and fault_accounting.over_share(counts, self.faults, self.step,
                                                                     sandbox.describe(), self.out_dir), \
                fault_accounting.InfraFaultShare
        if not why:
            return
        if self.process_index == 0:
            append_jsonl(os.path.join(self.out_dir, "metrics.jsonl"), {"step": self.step, **self.pending,
                                                                       "update_skipped": True, "stopped": why})
        raise fault(why)

    @staticmethod
    def _records(results: list[GroupResult]) -> list[list[dict]]:
        out = []
        for r in results:
            adv = dict(zip(r.kept, r.advantages))
            out.append([{"kept": i in adv, "group_dropped": r.dropped, "advantage": adv.get(i), "p_err": p_err,
                         "p_format": p_fmt, "penalty": p_err + p_fmt, **t.record()}
                        for i, (t, (p_err, p_fmt)) in enumerate(zip(r.trajs, r.penalties))])
        return out


def rollout_reward(completions, **kwargs):
    """Registered with GRPOTrainer only because it requires a reward function; never called, since
    ``RoCGRPOTrainer`` replaces TRL's scoring path (the reward is the rollout layer's binary answer reward)."""
    raise RuntimeError("rollout_reward must not be called: RoCGRPOTrainer scores rollouts itself")
