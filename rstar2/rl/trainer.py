"""GRPO / GRPO-RoC on TRL's GRPOTrainer with our rollout layer (paper §2.2).

Division of work. TRL 1.16 owns the policy loss, the optimizer, the schedule, logging and checkpointing.
We own everything before the loss: the multi-turn rollouts (``rollout_func``), the binary reward, the
GRPO-RoC selection (``selection``), the advantages, and the padded micro-batches (``batch``). TRL's
``rollout_func`` is not used because its scoring path needs exactly ``len(prompts)`` rows: it cannot take a
batch from which whole groups were removed, and it computes ``(r - mean) / (std + 1e-4)`` in float32, whereas
verl's GRPO advantage (released code) uses ``std + 1e-6``; equal-reward groups are forced to exactly 0 (case R01).

What TRL does with each micro-batch (trl/trainer/grpo_trainer.py 1.16.0, ``_compute_loss``):
  * ``loss_type="dapo"``: sum over tokens of the clipped surrogate times ``completion_mask * tool_mask``,
    divided by ``num_items_in_batch / num_processes``; we pass the whole step's loss-token count over all
    processes, so the micro-batch gradients add up to a token mean over the step (paper Eq. 6).
  * ``epsilon``/``epsilon_high``: the ratio is clipped to [1 - 0.2, 1 + 0.28] (Clip-Higher).
  * ``beta=0``: no KL term and no reference model; ``entropy_coef=0``: no entropy bonus.
  * ``advantages`` (B,) are broadcast over each row's tokens; tool-response tokens (``tool_mask`` 0) and the
    prompt (outside ``logits_to_keep``) carry zero weight. Truncated trajectories stay in as negatives.
  * num_iterations = 1, so ``old_per_token_logps`` is the detached current log-probability (ratio 1): one
    update per step from the rollouts of that step, as in the released code.

Micro-batches. One RL step = one optimizer step: the step's rollouts are generated once, then the
kept trajectories are forwarded and back-propagated in micro-batches of at most ``rl.micro_batch_tokens``
padded tokens per process (``batch.plan_micro_batches``), gradients accumulating, then one optimizer step.
TRL's own accumulation (``steps_per_generation`` with ``_buffered_inputs`` split into equal slices, and
Trainer's ``gradient_accumulation_steps``) needs the number of micro-batches fixed in the arguments before
training, but here it depends on how many groups survived RoC and how long their trajectories are, and every
process must run the same number of backward passes (DDP all-reduce, FSDP all-gather/reduce-scatter, ZeRO-3
partitions). So both stay 1 and ``training_step`` loops over the micro-batches itself, calling Trainer's
``training_step`` (autocast, ``accelerator.backward``) once per micro-batch and doing what Trainer's loop does
between accumulation steps: ``no_sync`` except on the last (DDP only; FSDP and ZeRO-3 reduce-scatter every
micro-batch so that gradients stay sharded) and ``sync_gradients`` False until the last (DeepSpeed steps
its engine then). TRL's ``num_items_in_batch`` normalisation and its loss are used as they are.

A step in which every group was removed (all rewards equal everywhere) makes no forward pass and no optimizer
update, while the step counter, learning-rate schedule and data position advance and the step is logged with
``update_skipped: true`` (as released rstar2_agent/rstar2_agent_ray_trainer.py does). So does a step whose loss or
gradient norm is not finite (``finite_guard``: also ``nonfinite_skipped: true``; several in a row stop the stage).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from ..distributed import unsharded
from ..io import write_json
from .batch import build_batch, micro_batches, plan_micro_batches
from .checkpoints import STATE_FILE, read_state
from .finite_guard import FiniteGuard, inject_nan, make_stop_callback
from .logprob_gap import LogprobGap
from .rollout_func import RolloutFunc, rollout_reward
from .selection import GroupResult, PenaltyConfig, select, tool_response_texts, trajectory_penalties
from .step_metrics import GroupStats, TrajStats, make_metrics_callback, step_metrics
from .tis import TISStats

# Public names of the RL step, importable from here as before the split (stages/rl.py, tests, benchmarks).
__all__ = ["STATE_FILE", "GroupResult", "GroupStats", "PenaltyConfig", "RolloutFunc", "TrajStats", "build_batch",
           "make_metrics_callback", "make_trainer_class", "read_state", "rollout_reward", "select", "step_metrics",
           "tool_response_texts", "trajectory_penalties"]


def make_trainer_class():
    """RoCGRPOTrainer, built lazily so that importing this module does not import TRL."""
    from accelerate.utils import DistributedType, gather_object
    from trl import GRPOTrainer

    class RoCGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose training data comes from ``RolloutFunc``, in micro-batches (see the module docstring).

        Extra args: rollout_fn, a ``RolloutFunc`` or anything with its interface: ``G``, ``rcfg``,
        ``last_results``, ``pending``, ``set_process(index, count)``, ``state_dict()`` and
        ``__call__(prompts, trainer, engines)`` returning (kept trajectories, advantages); None only for
        loss-path tests. micro_batch_tokens: padded tokens per micro-batch and process (``rl.micro_batch_tokens``),
        required with a rollout_fn. optimizer_from: a folder written by ``checkpoints.save_optimizer`` whose
        AdamW state and LR schedule a fresh (not resumed) run starts from (stage 2 after stage 1, paper §4.3).
        finite_guard: skips the update of a step whose loss (any process) or gradient norm is not finite and stops
        the stage after several in a row (``finite_guard``; None: no check, for loss-path tests). Under DeepSpeed,
        whose engine steps before Trainer computes the norm, only the loss is checked. where: names the stage in
        the guard's stop message (its output folder).
        Requires num_iterations = steps_per_generation = gradient_accumulation_steps = 1 (checked).

        Several processes (accelerate launch; DDP, DeepSpeed ZeRO-3 or FSDP): TRL's sampler hands each process a
        contiguous slice of ``per_device_train_batch_size`` rows; with that a multiple of G, every process gets
        whole groups, rolls them out and selects on its own. The update is skipped only when no process kept
        anything. Micro-batch k has the same number of rows on every process (padding rows of zero weight), since
        TRL gathers per-row metrics in each loss call, and a process that kept nothing trains on padding only.

        vLLM (``use_vllm``): before each step's rollouts the policy weights are pushed to vLLM exactly as TRL's
        own generation path does (``vllm_generation.sync_weights()`` once per global step; trl 1.16
        ``GRPOTrainer._generate``), then ``engines_for_trainer`` drives TRL's colocated ``vllm.LLM`` or its
        ``trl vllm-serve`` server. Colocate mode needs vllm_tensor_parallel_size 1 (each process generates its
        own groups; a TP group would have to submit identical requests) and TRL's importance-sampling correction
        off (it reads sampling log-probabilities from TRL's own generation path, which is not used; ``tis`` is ours).

        Every step records the sampler/learner mismatch over its loss tokens (``logprob_gap``: mean and max
        |engine log-prob - trainer log-prob| as ``train_rollout_logprob_abs_diff[_max]``), from the engines'
        ``Trajectory.response_logprobs`` and the log-probabilities of the training forward pass itself. tis: a
        ``tis.TISConfig`` (``rl.tis``): truncated importance sampling from the same two (rl/tis.py; metrics
        ``tis_enabled``, ``tis_clipped_share``).
        """

        def __init__(self, *args, rollout_fn: RolloutFunc | None, micro_batch_tokens: int | None = None,
                     optimizer_from: str | None = None, finite_guard: FiniteGuard | None = None,
                     where: str = "rl", tis=None, **kwargs):
            super().__init__(*args, **kwargs)
            a = self.args
            if (a.num_iterations, a.steps_per_generation, a.gradient_accumulation_steps) != (1, 1, 1):
                raise ValueError("RoCGRPOTrainer needs num_iterations = steps_per_generation = "
                                 "gradient_accumulation_steps = 1 (it accumulates over its own micro-batches)")
            if rollout_fn is not None and a.per_device_train_batch_size % rollout_fn.G:
                raise ValueError(f"per_device_train_batch_size {a.per_device_train_batch_size} is not a multiple "
                                 f"of the group size {rollout_fn.G}: groups would be split across processes")
            if rollout_fn is not None and not (micro_batch_tokens and micro_batch_tokens >= 2):
                raise ValueError(f"rl.micro_batch_tokens must be at least 2, got {micro_batch_tokens!r}")
            if self.use_vllm:
                if a.vllm_importance_sampling_correction:
                    raise ValueError("RoCGRPOTrainer with vLLM needs vllm_importance_sampling_correction=False: "
                                     "TRL's correction needs TRL's own generation path, which RoCGRPOTrainer "
                                     "replaces; use rl.tis (rstar2/rl/tis.py)")
                if a.vllm_mode == "colocate" and a.vllm_tensor_parallel_size != 1:
                    raise ValueError("RoCGRPOTrainer with colocated vLLM needs vllm_tensor_parallel_size=1")
            self.rollout_fn, self.micro_batch_tokens, self.optimizer_from = rollout_fn, micro_batch_tokens, optimizer_from
            if rollout_fn is not None:  # None: only the loss path is used (tests)
                rollout_fn.set_process(self.accelerator.process_index, self.accelerator.num_processes)
            self._skip_update = False
            self._logprob_gap, self._gap_inputs, self._tis = LogprobGap(), None, TISStats(tis)
            self.finite_guard, self._step_loss, self._grad_norm = finite_guard, None, None
            if finite_guard is not None:  # after the metrics callback: the stopping step's row is written first
                self.add_callback(make_stop_callback(finite_guard, where))

        def _rollout_engines(self):
            """Sync the policy into vLLM once per global step (TRL's rule), then return engines on it."""
            if not self.use_vllm:
                return None
            from ..rollout import engines_for_trainer

            vg = self.vllm_generation
            if self.state.global_step != self._last_loaded_step or getattr(vg, "_llm_weights_sleeping", False):
                t0 = time.time()
                if self.args.vllm_mode == "colocate":
                    from ..rollout.vllm_sync import sync_colocated

                    sync_colocated(vg)  # TRL's sync_weights, or the CPU backend's reload
                else:
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

        def _rollout_weights(self, engines):
            """The transformers engine (``engines`` None) generates with the policy itself: under FSDP its full
            weights are gathered once for the rollouts (``distributed.unsharded``)."""
            if engines is not None or self.accelerator.distributed_type != DistributedType.FSDP:
                return contextlib.nullcontext()
            return unsharded(self.model, self.accelerator.state.fsdp_plugin.reshard_after_forward)

        def _rollout_micro_batches(self, generation_batch) -> list:
            """Roll out this process's groups, then plan the step's micro-batches: one builder per micro-batch
            (``batch.micro_batches``; [] = no update).

            Every process gets the same number of micro-batches with the same row counts (``plan_micro_batches``
            over the row shapes gathered from all processes); ``num_items_in_batch`` of each is the step's total
            loss-token count over all processes."""
            engines = self._rollout_engines()
            try:
                with self._rollout_weights(engines):
                    trajs, advantages = self.rollout_fn([x["prompt"] for x in generation_batch], self, engines)
            finally:
                self._after_rollouts()
            rows = [(len(t.prompt_ids), len(t.response_ids), sum(t.response_mask)) for t in trajs]
            every = gather_object([rows]) if self.accelerator.num_processes > 1 else [rows]
            plan, oversize = plan_micro_batches([[r[:2] for r in p] for p in every], self.micro_batch_tokens)
            if isinstance(self.rollout_fn.pending, dict):
                self.rollout_fn.pending["micro_batches"] = len(plan)
            if oversize and self.accelerator.is_main_process:
                print(f"[rl] {oversize} trajectories exceed rl.micro_batch_tokens={self.micro_batch_tokens} "
                      "padded tokens on their own; each runs alone in its micro-batch", flush=True)
            n_items = sum(r[2] for p in every for r in p)
            me = self.accelerator.process_index
            return micro_batches(trajs, advantages, [mb[me] for mb in plan], self.processing_class.pad_token_id,
                                 n_items, self.accelerator.device)

        def training_step(self, model, inputs, num_items_in_batch=None):
            """One RL step's forward and backward passes: rollouts once, then one Trainer ``training_step`` per
            micro-batch, gradients accumulating (synchronised on the last one under DDP). Returns the step's
            loss (the sum of the micro-batch losses, each already divided by the whole step's token count)."""
            model.train()  # as Trainer.training_step does first; the rollouts switch to eval and back
            self._step_loss, self._grad_norm = torch.zeros((), device=self.accelerator.device), None
            self._logprob_gap.reset()
            self._tis.reset()
            batches = self._rollout_micro_batches(inputs)
            self._skip_update = not batches
            if self._skip_update:  # no group survived anywhere: no forward pass, no optimizer step
                self._record_logprob_gap()
                return torch.zeros((), device=self.accelerator.device)
            # FSDP and ZeRO-3 reduce-scatter after every micro-batch: their no_sync would keep whole unsharded
            # gradients on each GPU until the last one (accelerate's sync_each_batch exists for that reason)
            sharded = self.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
            total = torch.zeros((), device=self.accelerator.device)
            for i, make_batch in enumerate(batches):
                last = i == len(batches) - 1
                self.accelerator.gradient_state._set_sync_gradients(last)
                ctx = contextlib.nullcontext() if last or sharded else self.accelerator.no_sync(model)
                with ctx:
                    total = total + super().training_step(model, make_batch(), num_items_in_batch)
            self._record_logprob_gap()
            return total

        def _record_logprob_gap(self):
            """Put the step's sampler/learner mismatch and TIS figures (over every process) into its metrics row."""
            many = self.accelerator.num_processes > 1
            gather = (lambda x: self.accelerator.gather(x.to(self.accelerator.device)).cpu()) if many else None
            row = {**self._logprob_gap.row(gather), **self._tis.row(gather)}
            if isinstance(getattr(self.rollout_fn, "pending", None), dict):
                self.rollout_fn.pending.update(row)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            inputs, self._gap_inputs = self._gap_inputs, None  # only the loss's own forward pass is compared
            if inputs is not None:
                self._logprob_gap.add(out[0], inputs.get("rollout_logps"),
                                      inputs["completion_mask"] * inputs["tool_mask"])
                self._tis.apply(inputs, out[0])  # before _compute_loss reads inputs["advantages"]
            return out

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self._gap_inputs = inputs
            loss = inject_nan(super().compute_loss(model, inputs, return_outputs, num_items_in_batch),
                              self.state.global_step + 1)  # test-only fault injection (rstar2.faults)
            if self._step_loss is not None:  # before backward: known when DeepSpeed steps
                self._step_loss = self._step_loss + loss.detach()
            return loss

        def _get_grad_norm(self, model, grad_norm=None):
            self._grad_norm = super()._get_grad_norm(model, grad_norm)  # global, before the optimizer step
            return self._grad_norm

        def _finite_update(self) -> bool:
            """Ask the guard whether this step's update may be applied (the same answer on every process) and put
            its counts into the step's metrics."""
            if self.finite_guard is None:
                return not self._skip_update
            loss = self._step_loss
            if not self._skip_update and self.accelerator.num_processes > 1:  # any process's NaN skips them all
                loss = self.accelerator.gather(loss.reshape(1)).sum()
            ok = self.finite_guard.check(loss, self._grad_norm, update=not self._skip_update)
            if isinstance(getattr(self.rollout_fn, "pending", None), dict):
                self.rollout_fn.pending.update(self.finite_guard.row())
            if self.finite_guard.step_skipped and self.accelerator.is_main_process:
                print(f"[rl] step {self.state.global_step + 1}: non-finite loss or gradient norm "
                      f"{self.finite_guard.last}: update skipped ({self.finite_guard.streak} in a row)", flush=True)
            return ok and not self._skip_update

        def _prepare_inputs(self, inputs):
            if not self.model.training:  # GRPOTrainer.prediction_step would come here with prompts
                raise NotImplementedError("RoCGRPOTrainer has no evaluation loop; use rstar2.stages.evaluate")
            return inputs  # a micro-batch built by batch.micro_batches, already on the device

        def create_optimizer(self, *args, **kwargs):
            opt = super().create_optimizer(*args, **kwargs)
            if not getattr(opt, "_rstar2_wrapped", False):
                inner_step = opt.step

                def step(closure=None):
                    # AdamW would still move the weights on a zero gradient (momentum, weight decay), so a step
                    # without data, or with a non-finite loss or gradient, must not reach it at all. A step before
                    # any training step is PyTorch's distributed state-dict loader creating AdamW's state (zero
                    # gradients, learning rate 0: torch/distributed/checkpoint/state_dict.py, _init_optim_state),
                    # which FSDP's optimizer resume and carry-over need: it goes through.
                    if self._step_loss is None:
                        return inner_step(closure)
                    return inner_step(closure) if self._finite_update() else None

                opt.step, opt._rstar2_wrapped = step, True
            return opt

        def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
            out = super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
            if resume_from_checkpoint is None and self.optimizer_from:
                # the previous stage's AdamW state and LR schedule (a resumed run has its own in the checkpoint);
                # Trainer's loader handles FSDP and DeepSpeed as it does for resume_from_checkpoint
                if self.is_deepspeed_enabled:
                    from transformers.integrations.deepspeed import deepspeed_load_checkpoint

                    deepspeed_load_checkpoint(self.model_wrapped, self.optimizer_from)
                self._load_optimizer_and_scheduler(self.optimizer_from)
                if self.accelerator.is_main_process:
                    print(f"[rl] optimizer state and LR schedule continued from {self.optimizer_from}", flush=True)
            return out

        def _run_epoch(self, *args, **kwargs):
            # Resumed from the last step's checkpoint, transformers 5.17 would still run one more step (its
            # resume fast-forwards the data but only checks max_steps after a step): there is nothing left to do.
            if self.state.global_step >= self.state.max_steps > 0:
                self.control.should_training_stop = True
                return None
            return super()._run_epoch(*args, **kwargs)

        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            state = self.rollout_fn.state_dict()  # the step counter: every RL stream derives from it (rstar2.seeds)
            if self.finite_guard is not None:
                state["finite_guard"] = self.finite_guard.state_dict()
            if self.accelerator.is_main_process:
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                write_json(os.path.join(folder, STATE_FILE), state)
            self.accelerator.wait_for_everyone()

    return RoCGRPOTrainer
