"""GRPO / GRPO-RoC on TRL's GRPOTrainer with our rollout layer (paper §2.2; spec §1; frameworks.md §1).

Division of work. TRL 1.16 owns the policy loss, the optimizer, the schedule, logging and checkpointing.
We own everything before the loss: the multi-turn rollouts (``rstar2.rollout``), the binary reward, the
GRPO-RoC filter and down-sampling (``roc``), the advantages, and the padded training batch. This is done by
overriding ``GRPOTrainer._prepare_inputs`` (one generation per optimizer step) instead of going through
TRL's ``rollout_func``, because TRL's own scoring path needs exactly ``len(prompts)`` rows: it cannot take
a batch from which whole groups were removed, and it computes ``(r - mean) / (std + 1e-4)`` in float32,
whereas the spec asks for ``std + 1e-6`` with equal-reward groups forced to exactly 0 (handed case R01).

What TRL does with our batch (read from trl/trainer/grpo_trainer.py 1.16.0, ``_compute_loss``):
  * ``loss_type="dapo"``: sum over tokens of the clipped surrogate times ``completion_mask * tool_mask``,
    divided by ``num_items_in_batch``: a token-level mean over all kept trajectories (paper Eq. 6).
  * ``epsilon``/``epsilon_high``: the ratio is clipped to [1 - 0.2, 1 + 0.28] (Clip-Higher).
  * ``beta=0``: no KL term and no reference model; ``entropy_coef=0``: no entropy bonus.
  * ``advantages`` of shape (B,) are broadcast over each row's tokens, so every model-generated token
    carries its trajectory's advantage; tool-response tokens and their wrappers have ``tool_mask`` 0 and
    carry zero weight; the prompt is outside ``logits_to_keep`` and never in the loss.
  * ``scale_rewards`` and ``mask_truncated_completions`` act only in TRL's scoring path, which we replace:
    advantages come from ``roc.group_advantages`` and truncated trajectories stay in as negatives (spec §1.8).
  * num_iterations = 1 and one generation per optimizer step, so ``old_per_token_logps`` is the detached
    current log-probability (ratio 1 at the start of the step), as in the released code's one update per step.

Only the kept G trajectories of each surviving group are ever padded into the batch: dropped rollouts get
no forward or backward pass (benchmarks/bench_roc_compute.py measures this). A step in which every group
was removed (all rewards equal everywhere) is skipped: no forward pass and no optimizer update, while the
step counter, learning-rate schedule and data position advance and the step is logged with
``update_skipped: true`` (the released code also skips such steps; spec §1.3).
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import time
from dataclasses import dataclass

import torch

from .. import rollout as rollout_lib
from ..memory import release_freed_memory
from ..io import append_jsonl, write_json
from . import roc

STATE_FILE = "rstar2_state.json"   # written last into each checkpoint: marks it complete (see stages/rl.py)
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


@dataclass
class PenaltyConfig:
    """Which p_err / p_format definitions to use (spec §1.5) and the eps of 1/(p_total + eps).

    error: ``"status"`` (paper) or ``"substring"`` (released code). format: ``"paper"`` or ``"released"``.
    """
    error: str = "status"
    format: str = "paper"
    eps: float = 1e-3

    def __post_init__(self):
        if self.error not in roc.ERROR_PENALTY_MODES:
            raise ValueError(f"rl.error_penalty must be one of {roc.ERROR_PENALTY_MODES}, got {self.error!r}")
        if self.format not in roc.FORMAT_PENALTY_MODES:
            raise ValueError(f"rl.format_penalty must be one of {roc.FORMAT_PENALTY_MODES}, got {self.format!r}")


def tool_response_texts(t: rollout_lib.Trajectory, tok) -> list[str]:
    """The ``<tool_response>`` blocks the model saw, decoded from the non-generated spans of the response
    (what the released code's regex runs over)."""
    spans, cur = [], []
    for tid, m in zip(t.response_ids, t.response_mask):
        if m:
            if cur:
                spans.append(cur)
                cur = []
        else:
            cur.append(tid)
    if cur:
        spans.append(cur)
    return [b for s in spans for b in _TOOL_RESPONSE.findall(tok.decode(s, skip_special_tokens=False))]


def trajectory_penalties(t: rollout_lib.Trajectory, tok, pcfg: PenaltyConfig) -> tuple[float, float]:
    """(p_err, p_format) of one trajectory (Eqs. 4-5); p_total is their sum."""
    if pcfg.error == "status":
        p_err = roc.tool_error_penalty([c["status"] for c in t.tool_calls])
    else:
        p_err = roc.tool_error_penalty_substring(tool_response_texts(t, tok))
    return p_err, roc.format_penalty([turn["text"] for turn in t.turns], pcfg.format)


def error_ratio(calls: list[dict]) -> float | None:
    """Share of tool calls whose structured status is not ``ok``; None (undefined, not 0) without calls."""
    return sum(c["status"] != roc.OK_STATUS for c in calls) / len(calls) if calls else None


def _mean(xs) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


@dataclass
class GroupResult:
    """One prompt's rollouts: all drawn trajectories, their penalties, the kept indices and advantages.

    kept is empty when the group was removed (all rewards equal, either mode); advantages[j] belongs to
    trajs[kept[j]]."""
    trajs: list
    penalties: list[tuple[float, float]]
    kept: list[int]
    advantages: list[float]
    dropped: bool


def select(groups: list[list[rollout_lib.Trajectory]], penalties: list[list[tuple[float, float]]], G: int,
           mode: str, positive_selection: str, eps: float, rng: random.Random) -> list[GroupResult]:
    """Step A (drop equal-reward groups) and Step B (RoC 2G -> G) per group, then advantages over the kept.

    Both modes drop equal-reward groups (``roc.kept_for_update``: the same loss normalisation, issue 23);
    ``mode="grpo"`` keeps every rollout of the other groups, ``mode="grpo_roc"`` down-samples them.
    """
    out = []
    for g, pens in zip(groups, penalties):
        rewards = [t.reward for t in g]
        # issue 23: one rule for both modes (was: grpo kept equal-reward groups, growing the loss's token count)
        kept = roc.kept_for_update(rewards, [a + b for a, b in pens], G, mode, rng, positive_selection, eps)
        dropped = roc.rewards_equal(rewards)
        adv = roc.group_advantages([rewards[i] for i in kept])
        out.append(GroupResult(g, pens, kept, adv, dropped))
    return out


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
    penalty_pos_mean, penalty_pos_kept_mean, loss_tokens. Ratios with an empty denominator are None.
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
    all_correct = sum(all(t.reward > 0 for t in r.trajs) for r in results)
    all_wrong = sum(all(t.reward <= 0 for t in r.trajs) for r in results)
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


def build_batch(trajs: list, advantages: list[float], pad_id: int, device="cpu") -> dict:
    """The padded training batch in TRL's ``_compute_loss`` format, from the kept trajectories only.

    Shapes (B = len(trajs), P = longest prompt, C = longest response): prompt_ids/prompt_mask (B, P), left
    padded; completion_ids/completion_mask (B, C), right padded, completion_mask 1 on every real response
    token (tool responses included: they are context and must be attended) and built from lengths, never
    from pad ids (pad == eos would otherwise drop the final EOS); tool_mask (B, C), the trajectory's
    response_mask (1 = generated by the policy, 0 = tool response and its chat wrapper), 0 on padding;
    advantages (B,) float32; num_items_in_batch = number of loss tokens.
    Raises:
        ValueError: a trajectory whose response_mask and response_ids differ in length (a mask shifted
            against its tokens would train on tool output; frameworks.md trl#5144).
    """
    for t in trajs:
        if len(t.response_mask) != len(t.response_ids):
            raise ValueError(f"trajectory {t.problem_id}: response_mask has {len(t.response_mask)} entries "
                             f"but response_ids {len(t.response_ids)}")
    P = max((len(t.prompt_ids) for t in trajs), default=0)
    C = max((len(t.response_ids) for t in trajs), default=0)
    prompt_ids = torch.full((len(trajs), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(trajs), P), dtype=torch.long)
    completion_ids = torch.full((len(trajs), C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(trajs), C), dtype=torch.long)
    tool_mask = torch.zeros((len(trajs), C), dtype=torch.long)
    for b, t in enumerate(trajs):
        p, c = len(t.prompt_ids), len(t.response_ids)
        if p:
            prompt_ids[b, P - p:] = torch.tensor(t.prompt_ids)
            prompt_mask[b, P - p:] = 1
        if c:
            completion_ids[b, :c] = torch.tensor(t.response_ids)
            completion_mask[b, :c] = 1
            tool_mask[b, :c] = torch.tensor(t.response_mask)
    return {
        "prompt_ids": prompt_ids.to(device), "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device), "completion_mask": completion_mask.to(device),
        "tool_mask": tool_mask.to(device),
        "advantages": torch.tensor(advantages, dtype=torch.float32, device=device),
        "num_items_in_batch": (completion_mask * tool_mask).sum().to(device),
    }


class RolloutFunc:
    """One RL step's data: roll out, grade, select, compute advantages, record; holds the step's metrics.

    Args:
        answers: problem text -> {"id", "answer"} (the dataset rows TRL hands over carry only the prompt).
        rcfg: rollout settings. group_size: G, rollouts kept per prompt. oversample: rollouts drawn per kept
            rollout in grpo_roc (2 in the paper). mode: "grpo_roc" or "grpo" (G drawn, all kept).
        positive_selection: "inverse_prob" or "topk". penalty: p_err/p_format definitions and eps.
        seed: seeds the selection's random source. out_dir: where rollouts.jsonl is appended.
    Raises:
        ValueError: unknown mode or positive_selection.
    """

    def __init__(self, answers: dict, rcfg: rollout_lib.RolloutConfig, group_size: int, oversample: int,
                 mode: str, positive_selection: str, seed: int, out_dir: str,
                 penalty: PenaltyConfig | None = None):
        if mode not in ("grpo", "grpo_roc"):
            raise ValueError(f"rl.mode must be 'grpo' or 'grpo_roc', got {mode!r}")
        if positive_selection not in roc.POSITIVE_SELECTIONS:
            raise ValueError(f"rl.positive_selection must be one of {roc.POSITIVE_SELECTIONS}, "
                             f"got {positive_selection!r}")
        self.answers, self.rcfg, self.G = answers, rcfg, group_size
        self.n_draw = group_size * oversample if mode == "grpo_roc" else group_size
        self.mode, self.positive_selection = mode, positive_selection
        self.penalty = penalty or PenaltyConfig()
        self.rng = random.Random(seed)
        self.out_dir = out_dir
        self.seed = seed
        self.pending: dict | None = None
        self.last_results: list[GroupResult] = []
        self.step = 0
        self.process_index, self.num_processes = 0, 1

    def state_dict(self) -> dict:
        """JSON-serialisable state restored on resume: the step counter and the selection RNG."""
        version, internal, gauss = self.rng.getstate()
        return {"step": self.step, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; in a multi-process run each process takes its own RNG (``rng_per_process``,
        written by RoCGRPOTrainer) when the checkpoint has one for it. Call after ``set_process``."""
        per = state.get("rng_per_process") or []
        version, internal, gauss = per[self.process_index] if self.process_index < len(per) else state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.step = state["step"]

    def set_process(self, index: int, count: int) -> None:
        """Tell the function which of ``count`` training processes it runs in: each process draws its own
        selection RNG stream (seed + index), so processes do not make the same RoC choices."""
        if (index, count) == (self.process_index, self.num_processes):
            return  # already set (rl.run sets it before restoring a checkpoint's RNG; the trainer again)
        self.process_index, self.num_processes = index, count
        self.rng = random.Random(self.seed + index)

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
            problems += [{"id": meta["id"], "problem": q, "answer": meta["answer"]}] * self.n_draw
        # server mode with several processes: the main process's scheduler runs every process's groups (issue 21)
        kw = {"engines": engines, "central": rollout_lib.central_for_trainer(trainer)} if engines is not None else {}
        # rl_data keeps integer-answer problems only (the paper's curation), so the reward is the integer grader's
        trajs = rollout_lib.run_rollouts(model, tok, problems, self.rcfg, answer_type="integer",
                                         progress=rollout_lib.Progress(f"rollout step {self.step}"), **kw)
        model.train()
        release_freed_memory()
        groups = [trajs[i:i + self.n_draw] for i in range(0, len(trajs), self.n_draw)]
        penalties = [[trajectory_penalties(t, tok, self.penalty) for t in g] for g in groups]
        results = select(groups, penalties, self.G, self.mode, self.positive_selection, self.penalty.eps, self.rng)
        self.last_results = results
        stats = [GroupStats.of(r) for r in results]
        records = self._records(results)
        if self.num_processes > 1:  # every process's groups, in process order
            from accelerate.utils import gather_object

            stats, records = gather_object(stats), gather_object(records)
        if self.process_index == 0:
            path = os.path.join(self.out_dir, "rollouts.jsonl")
            for gi, rows in enumerate(records):
                for row in rows:
                    append_jsonl(path, {"step": self.step, "group": gi, **row})
        self.pending = {**step_metrics(stats), "rollout_time_s": round(time.time() - t0, 2)}
        kept = [(r.trajs[i], a) for r in results for i, a in zip(r.kept, r.advantages)]
        return [t for t, _ in kept], [a for _, a in kept]

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


def make_trainer_class():
    """RoCGRPOTrainer, built lazily so that importing this module does not import TRL."""
    from trl import GRPOTrainer

    class RoCGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose training batch comes from ``RolloutFunc`` (see the module docstring).

        Extra args: rollout_fn, a ``RolloutFunc`` or anything with its interface: ``G``, ``rcfg``,
        ``last_results``, ``set_process(index, count)``, ``state_dict()`` and ``__call__(prompts, trainer, engines)``
        returning (kept trajectories, advantages); None only for loss-path tests. Requires num_iterations=1,
        steps_per_generation=1 and gradient_accumulation_steps=1 (checked): one generation, one update per step.

        Several processes (accelerate launch; DDP, DeepSpeed ZeRO-3 or FSDP): TRL's sampler hands each process a
        contiguous slice of ``per_device_train_batch_size`` rows; with that a multiple of G, every process gets
        whole groups, rolls them out and selects on its own, and ``num_items_in_batch`` (the dapo loss
        denominator) is summed over processes. The update is skipped only when no process kept anything. Every
        process trains on the same number of rows, padded with zero-weight trajectories (tool_mask 0), because
        every process must take part in the gradient (and, under ZeRO-3/FSDP, parameter) collectives and TRL
        gathers per-row metrics; a process that kept nothing while others did trains on padding only.

        vLLM (``use_vllm``): before each step's rollouts the policy weights are pushed to vLLM exactly as TRL's
        own generation path does (``vllm_generation.sync_weights()`` once per global step; trl 1.16
        ``GRPOTrainer._generate``), then ``engines_for_trainer`` drives TRL's colocated ``vllm.LLM`` or its
        ``trl vllm-serve`` server. Colocate mode needs vllm_tensor_parallel_size 1 (each process generates its
        own groups; a TP group would have to submit identical requests) and importance-sampling correction
        off (our engines return no sampling log-probabilities).
        """

        def __init__(self, *args, rollout_fn: RolloutFunc, **kwargs):
            super().__init__(*args, **kwargs)
            a = self.args
            if (a.num_iterations, a.steps_per_generation, a.gradient_accumulation_steps) != (1, 1, 1):
                raise ValueError("RoCGRPOTrainer needs num_iterations = steps_per_generation = "
                                 "gradient_accumulation_steps = 1")
            if rollout_fn is not None and a.per_device_train_batch_size % rollout_fn.G:
                raise ValueError(f"per_device_train_batch_size {a.per_device_train_batch_size} is not a multiple "
                                 f"of the group size {rollout_fn.G}: groups would be split across processes")
            if self.use_vllm:
                if a.vllm_importance_sampling_correction:
                    raise ValueError("RoCGRPOTrainer with vLLM needs vllm_importance_sampling_correction=False: "
                                     "the rollout engines return no sampling log-probabilities")
                if a.vllm_mode == "colocate" and a.vllm_tensor_parallel_size != 1:
                    raise ValueError("RoCGRPOTrainer with colocated vLLM needs vllm_tensor_parallel_size=1")
            self.rollout_fn = rollout_fn
            if rollout_fn is not None:  # None: only the loss path is used (tests)
                rollout_fn.set_process(self.accelerator.process_index, self.accelerator.num_processes)
            self._skip_update = False

        def _rollout_engines(self):
            """Sync the policy into vLLM once per global step (TRL's rule), then return engines on it."""
            if not self.use_vllm:
                return None
            from ..rollout import engines_for_trainer

            vg = self.vllm_generation
            if self.state.global_step != self._last_loaded_step or getattr(vg, "_llm_weights_sleeping", False):
                t0 = time.time()
                vg.sync_weights()
                self._last_loaded_step = self.state.global_step
                if self.accelerator.is_main_process:
                    print(f"[rl] vLLM weights synced at step {self.state.global_step} ({time.time() - t0:.1f}s)",
                          flush=True)
            if self.args.vllm_mode == "colocate" and self.args.vllm_enable_sleep_mode:
                self.vllm_generation.llm.wake_up(tags=["kv_cache"])
            # server mode: only the main process pushes weights; nobody may generate before it has finished
            self.accelerator.wait_for_everyone()
            rc = self.rollout_fn.rcfg
            return engines_for_trainer(self, self.processing_class, rc.temperature, rc.top_p, rc.batch_size,
                                       server_model=getattr(rc, "server_model", None))

        def _after_rollouts(self):
            if self.use_vllm and self.args.vllm_mode == "colocate" and self.args.vllm_enable_sleep_mode:
                self.vllm_generation.llm.sleep(level=2)   # level 2 drops the weights: the next step re-syncs
                self.vllm_generation._llm_weights_sleeping = True

        def _prepare_inputs(self, generation_batch):
            if not self.model.training:
                raise NotImplementedError("RoCGRPOTrainer has no evaluation loop; use rstar2.stages.evaluate")
            engines = self._rollout_engines()
            try:
                trajs, advantages = self.rollout_fn([x["prompt"] for x in generation_batch], self, engines)
            finally:
                self._after_rollouts()
            device, pad = self.accelerator.device, self.processing_class.pad_token_id
            rows = torch.tensor([len(trajs)], device=device)
            if self.accelerator.num_processes > 1:
                rows = self.accelerator.gather(rows)
            if int(rows.sum()) == 0:
                return {"skip": True}
            # TRL gathers per-row metrics across processes, which needs the same row count everywhere: pad with
            # drawn trajectories that weigh nothing (tool_mask 0: no loss tokens, NaN in TRL's nan-aware metrics)
            drawn = [t for r in self.rollout_fn.last_results for t in r.trajs]
            n_pad = int(rows.max()) - len(trajs)
            batch = build_batch(trajs + [drawn[i % len(drawn)] for i in range(n_pad)],
                                advantages + [0.0] * n_pad, pad, device)
            if n_pad:
                batch["tool_mask"][len(trajs):] = 0
                batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()
            batch["num_items_in_batch"] = self.accelerator.gather(batch["num_items_in_batch"].reshape(1)).sum()
            return batch

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self._skip_update = bool(inputs.get("skip"))
            if self._skip_update:  # no group survived anywhere: no forward pass; backward of a constant is a no-op
                return torch.zeros((), device=self.accelerator.device, requires_grad=True)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def create_optimizer(self, *args, **kwargs):
            opt = super().create_optimizer(*args, **kwargs)
            if not getattr(opt, "_rstar2_wrapped", False):
                inner_step = opt.step

                def step(closure=None):
                    # AdamW would still move the weights on a zero gradient (momentum, weight decay), so a step
                    # without data must not reach it at all.
                    return None if self._skip_update else inner_step(closure)

                opt.step, opt._rstar2_wrapped = step, True
            return opt

        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            state = self.rollout_fn.state_dict()
            if self.accelerator.num_processes > 1:  # each process's selection RNG, restored to the same process
                from accelerate.utils import gather_object

                state["rng_per_process"] = [s["rng"] for s in gather_object([state])]
            if self.accelerator.is_main_process:
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                write_json(os.path.join(folder, STATE_FILE), state)
            self.accelerator.wait_for_everyone()

    return RoCGRPOTrainer


def make_metrics_callback(rollout_fn: RolloutFunc, path: str, tensorboard_dir: str | None = None):
    """A TrainerCallback writing one metrics.jsonl row (and TensorBoard scalars) per optimizer step.

    Row = the step's rollout metrics (``step_metrics``) + rollout_time_s + loss, grad_norm, learning_rate,
    entropy, clip_ratio (TRL's clip_ratio/region_mean), step_time_s and update_skipped; loss, grad_norm,
    entropy and clip_ratio are None on a skipped step.
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
            skipped = rollout_fn.pending.get("kept_total", 1) == 0
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
                  f"loss {fmt(row['loss'], '.4f')}{' [update skipped]' if skipped else ''} "
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


def read_state(checkpoint_dir: str) -> dict:
    """The RolloutFunc state saved in a checkpoint (raises FileNotFoundError for an incomplete one)."""
    with open(os.path.join(checkpoint_dir, STATE_FILE), encoding="utf-8") as f:
        return json.load(f)
