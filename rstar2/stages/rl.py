"""RL stage entry point (rl_stage1/2/3): start from the previous stage's model, train, save (paper §4.3, Table 2)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from pathlib import Path

from ..io import read_jsonl, write_manifest
from ..params import merge_overrides, to_dict
from ..rollout.scheduler import policy_name
from ..rollout.vllm_reproducible import enable_batch_invariance
from ..rollout.vllm_settings import colocated_llm_args, set_env
from .interrupts import finished_root, keep_finished, restore_finished, stop_on_signal
from .params import RLParams, parse


# GRPOConfig fields RoCGRPOTrainer's one-generation-one-update step depends on (checked there too): not overridable.
PROTECTED_GRPO_FIELDS = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                                   "num_iterations", "num_generations", "max_steps", "output_dir", "remove_unused_columns",
                                   "use_vllm", "vllm_mode", "vllm_importance_sampling_correction"})


def grpo_config(p: RLParams, output_dir: str, seed: int, num_processes: int = 1):
    """TRL ``GRPOConfig`` of an RL stage (paper §4.3, §5.1): AdamW (Trainer default), constant LR
    after ``warmup_steps`` linear warm-up steps, clip [1 - clip_low, 1 + clip_high], no KL, no entropy bonus,
    token-level (dapo) loss, one update per step, weight decay 0.01 and gradient clipping 1.0 (released code).
    gradient_accumulation_steps stays 1: RoCGRPOTrainer accumulates over its own micro-batches
    (``p.micro_batch_tokens``), whose number varies per step (rstar2/rl/trainer.py).

    Each of ``num_processes`` processes gets ``prompts_per_step / num_processes`` whole groups of G rows.
    Device, precision and vLLM come from ``p.trainer`` (rstar2.distributed); ``p.trainer_overrides`` sets further
    GRPOConfig fields (``rl.trainer_overrides``).
    Raises:
        ValueError: an override names no GRPOConfig field, or one of ``PROTECTED_GRPO_FIELDS``.
    """
    from trl import GRPOConfig

    p = parse(RLParams, p, "rl params")

    from .. import distributed

    G, every, dist = p.group_size, p.checkpoint_every, to_dict(p.trainer)
    ours = dict(
        output_dir=output_dir, seed=seed, **distributed.trainer_kwargs(dist),
        # the loss's log-probs use the distribution the rollouts were sampled from (logits / T)
        temperature=p.rollout.temperature or 1.0,
        **distributed.vllm_kwargs(to_dict(p.rollout), dist),
        # TRL's sampler gives each process a contiguous slice of this many rows: whole groups, P / N of them
        per_device_train_batch_size=p.prompts_per_step // num_processes * G, gradient_accumulation_steps=1,
        num_generations=G, max_steps=p.steps, learning_rate=p.learning_rate,
        lr_scheduler_type="constant_with_warmup", warmup_steps=p.warmup_steps,
        beta=0.0, entropy_coef=0.0, epsilon=p.clip_low, epsilon_high=p.clip_high,
        loss_type="dapo", num_iterations=1, max_completion_length=p.rollout.max_response_tokens,
        logging_steps=1, save_strategy="steps" if every > 0 else "no", save_steps=max(every, 1),
        save_total_limit=2, save_only_model=False, report_to=[], disable_tqdm=False,
        remove_unused_columns=False, weight_decay=0.01, max_grad_norm=1.0,
    )
    return GRPOConfig(**merge_overrides(GRPOConfig, ours, p.trainer_overrides, PROTECTED_GRPO_FIELDS,
                                        "rl.trainer_overrides"))


def select_sources(rows: list[dict], sources: list | None, where: str) -> list[dict]:
    """The rows of the rl_data ``sources`` a stage trains on (those whose ``stages`` list the stage; None = all rows).

    Raises:
        ValueError: no row comes from those sources (names ``where`` and the sources found in the data).
    """
    if sources is None:
        return rows
    picked = [r for r in rows if r.get("source") in sources]
    if not picked:
        found = sorted({str(r.get("source")) for r in rows})
        raise ValueError(f"{where}: no problem of sources {sources} (the data has sources {found})")
    return picked


def _heldout_problems(p: RLParams) -> list[dict] | None:
    """The held-out benchmark's problems when ``p.heldout`` names one (data errors name file and row)."""
    if p.heldout is None:
        return None
    from ..data.benchmarks import load_benchmark

    return load_benchmark(p.heldout.benchmark, p.heldout.spec)[: p.heldout.limit or None]


def _heldout_callbacks(p: RLParams, problems: list[dict] | None, out: Path, is_main: bool) -> list:
    """The held-out evaluation callback when a held-out benchmark is configured, else none."""
    if problems is None:
        return []
    from ..data.benchmarks import answer_type
    from ..rl.heldout import make_heldout_callback

    ho = p.heldout
    return [make_heldout_callback(problems, answer_type(ho.spec).name, ho.rollout, ho.every, ho.k, p.data_seed,
                                  str(out), p.steps, is_main)]


def _resume_hint(out: Path) -> str:
    """Where a rerun of the stage in ``out`` resumes, for the line printed when a signal stops it."""
    from ..rl import checkpoints

    root = checkpoints.checkpoint_root(out)
    last = checkpoints.latest_complete(root) if root.is_dir() else None
    if last is None:
        return "no checkpoint yet: a rerun starts the stage again"
    return f"a rerun resumes from {last} (step {checkpoints.read_state(last)['step']})"


def run(params: dict, model_dir: str, data_path: str, out_dir: str, optimizer_from: str | None = None) -> None:
    """Train one RL stage with TRL's GRPOTrainer and our rollout layer, resuming from its last checkpoint.

    Args:
        params: the stage's parameters (``rstar2.stages.params.RLParams`` or its JSON dict; every field given):
            among them micro_batch_tokens (padded tokens per forward/backward micro-batch and process),
            continue_optimizer (start from ``optimizer_from``'s AdamW state and LR schedule), save_optimizer
            (leave this stage's in ``out_dir/optimizer`` for the next stage). A ``heldout`` evaluates the policy
            on a held-out benchmark at step 0 and every ``every`` steps
            (``rstar2.rl.heldout``: ``heldout.jsonl``).
        model_dir: folder of the starting model (previous stage's ``model/``).
        data_path: JSON Lines with ``id``, ``problem``, ``answer`` and optional ``answer_type`` (default integer; the
            row's grader) (rl_data's train.jsonl or hard_problems' hard.jsonl).
        out_dir: ``results/rl/stageN``; writes ``model/``, ``metrics.jsonl``, ``rollouts.jsonl``, ``heldout.jsonl``
            and ``heldout_problems.jsonl`` (empty without a held-out benchmark), ``tensorboard/``, ``optimizer/``
            (with save_optimizer), then ``manifest.json``. Checkpoints go to
            ``results/rl/checkpoints/stageN`` (``rstar2.rl.checkpoints``): a killed stage resumes from the last
            one, with optimizer, LR schedule, RNG, data position, step counter and logs as they were at that step.
            ``params.faults`` (rl.faults): a stage stops with a ``StageFault`` when the sandbox fails too many of a
            step's tool calls, the grading pool stops answering, or too many non-finite steps come in a row; its
            checkpoints stay, so a rerun resumes (rl/fault_accounting.py, grading_pool.py, rl/finite_guard.py).
        optimizer_from: the previous stage's ``optimizer/`` folder; required with continue_optimizer (paper
            §4.3: stage 2 continues stage 1's optimizer; stage 3 resets it).
    Raises:
        ValueError: the training set is empty (e.g. hard-problem mining kept nothing); a missing or unknown
            parameter; continue_optimizer without optimizer_from.
        FileNotFoundError: optimizer_from holds no complete optimizer state.
        rstar2.faults.StageFault: the stage stopped for a fault (one line naming it).
        SystemExit: SIGINT or SIGTERM stopped it (``interrupts.stop_on_signal``: exit status 130 or 143; its
            checkpoints stay). A stage that had finished keeps its outputs in ``interrupts.finished_root`` until the
            workflow records them; a rerun with the same inputs puts them back instead of training again.
    """
    with stop_on_signal("rl", lambda: _resume_hint(Path(out_dir))) as finishing:
        _run(params, model_dir, data_path, out_dir, optimizer_from, finishing)


def _run(params: dict, model_dir: str, data_path: str, out_dir: str, optimizer_from: str | None,
         finishing) -> None:
    from ..rl import checkpoints

    t0 = time.time()
    p = parse(RLParams, params, "rl params")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no training problems; nothing to train on")
    rows = select_sources(rows, p.sources, f"{p.name} ({data_path})")
    from ..grading import rewards
    rewards.check(p.reward, rows[0])  # a wrong rl.reward fails here too, before any checkpoint or log is touched
    heldout = _heldout_problems(p)  # a bad held-out file fails here, before any checkpoint or log is touched
    if heldout:
        from ..rl.heldout import check_disjoint

        check_disjoint(heldout, rows, p.heldout.benchmark, f"the training data {data_path}")
    if p.continue_optimizer and not optimizer_from:
        raise ValueError("continue_optimizer is set but no optimizer folder of the previous stage was given "
                         "(rstar2 rl --optimizer-from results/rl/stageN/optimizer)")
    carried = checkpoints.read_carried(optimizer_from) if p.continue_optimizer else None
    ckpt_root = checkpoints.checkpoint_root(out)
    # held-out settings are measurement, checkpoint_every and faults bookkeeping, not training: changing them resumes
    # (a stage stopped by a fault resumes after its limit was raised)
    fp = checkpoints.fingerprint({k: v for k, v in to_dict(p).items()
                                  if k not in ("heldout", "checkpoint_every", "faults")}, model_dir, data_path, carried)
    # before the heavy imports and the process group: a finished stage is back in seconds (the first process
    # writes; accelerate and torchrun set RANK)
    if restore_finished(out, fp, write=os.environ.get("RANK", "0") == "0"):
        print(f"[rl] {p.name} had finished with these inputs; its outputs are back from {finished_root(out)}: no "
              "step trained again", flush=True)
        return

    from datasets import Dataset

    from .. import distributed, grading_pool, models, precision
    from ..rl.finite_guard import FiniteGuard
    from ..rl.trainer import PenaltyConfig, RolloutFunc, make_metrics_callback, make_trainer_class, rollout_reward

    ps = distributed.process_state(to_dict(p.trainer))
    P, G = p.prompts_per_step, p.group_size
    if P % ps.num_processes:
        raise ValueError(f"rl.prompts_per_step={P} must be a multiple of the number of training processes "
                         f"({ps.num_processes}): each process rolls out whole groups")
    with ps.main_process_first():  # the main process clears a stale folder; the others then find it ready
        resume = checkpoints.prepare(ckpt_root, fp)
    resume_step = checkpoints.read_state(resume)["step"] if resume else 0
    if ps.is_main_process:  # exactly the steps the checkpoint contains, or none on a fresh start
        checkpoints.keep_logs(out, ckpt_root, resume_step if resume else None)
        shutil.rmtree(out / "tensorboard", ignore_errors=True)  # rewritten from metrics.jsonl below on resume
    ps.wait_for_everyone()

    # Each stage draws its own prompt order: with one seed for all, stage 2 would replay stage 1's prompts.
    seed = p.data_seed
    random.Random(seed).shuffle(rows)
    answers = {r["problem"]: {"id": r["id"], "answer": r["answer"], "answer_type": r.get("answer_type") or "integer"}
               for r in rows}
    dataset = Dataset.from_list([{"prompt": q} for q in answers])

    # Trainer arguments before the model: under accelerate's DeepSpeed ZeRO-3 they make from_pretrained load
    # the weights already sharded, instead of one full copy per process.
    args = grpo_config(p, str(ckpt_root), seed, ps.num_processes)
    model, tok = models.load(model_dir)
    checkpoints.mark_tied_weights(model)  # a resume re-ties lm_head instead of warning that it is "missing"
    penalty = PenaltyConfig(p.error_penalty, p.format_penalty, p.penalty_eps)
    rollout_fn = RolloutFunc(answers, p.rollout, G, p.oversample, p.mode, p.positive_selection, seed, str(out),
                             penalty, faults=p.faults, reward=p.reward)
    rollout_fn.set_process(ps.process_index, ps.num_processes)
    grading_pool.configure(stall_s=p.faults.grading_stall_s)
    guard = FiniteGuard(p.faults.max_nonfinite_steps)
    if resume:
        rollout_fn.load_state_dict(checkpoints.read_state(resume))
        guard.load_state_dict(checkpoints.read_state(resume).get("finite_guard", {}))
        print(f"[rl] resuming {p.name} from {resume} (step {resume_step})", flush=True)
    callback = make_metrics_callback(rollout_fn, str(out / "metrics.jsonl"), str(out / "tensorboard"))
    if resume and ps.is_main_process:
        callback.replay(read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else [])
    callbacks = [callback] + _heldout_callbacks(p, heldout, out, ps.is_main_process)
    # TRL builds its colocated vLLM in the trainer: its environment (distributed.vllm.env) and batch-invariant
    # kernels (on CUDA) must be set before
    if p.rollout.engine == "vllm":
        set_env(p.rollout.vllm)
    batch_invariant = enable_batch_invariance(p.rollout.reproducible, p.rollout.engine)
    with colocated_llm_args(p.rollout.vllm if p.rollout.engine == "vllm" else None):
        trainer = make_trainer_class()(model=model, reward_funcs=[rollout_reward], args=args, train_dataset=dataset,
                                       processing_class=tok, rollout_fn=rollout_fn, callbacks=callbacks,
                                       micro_batch_tokens=p.micro_batch_tokens, finite_guard=guard, where=str(out),
                                       tis=p.tis, optimizer_from=str(optimizer_from) if carried else None)
    distributed.check_engine(trainer.accelerator)  # an FSDP launch that would train unsharded stops here
    colocated = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if colocated is not None:  # the stage's own line: vLLM's INFO log is hidden where TRL set VLLM_LOGGING_LEVEL
        print(f"[vllm] colocated engine: enforce_eager={colocated.llm_engine.vllm_config.model_config.enforce_eager}",
              flush=True)
    if p.trainer.shared_prefix and ps.num_processes == 1:  # a DDP/FSDP/ZeRO-3 wrapper must see every forward
        from ..rl import shared_prefix

        shared_prefix.install(trainer.model)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    finishing()  # the last step is done: a signal from here on lets the outputs below be written
    trainer.save_model(str(out / "model"))  # every process: gathers ZeRO-3 / FSDP shards; the main one writes
    if p.save_optimizer:  # before the manifest: a stage without one is not finished
        checkpoints.save_optimizer(trainer, out / "optimizer", {"stage": p.name, "fingerprint": fp})
    ps.wait_for_everyone()
    if not ps.is_main_process:
        return
    tok.save_pretrained(out / "model")
    (out / "model" / "training_args.bin").unlink(missing_ok=True)  # Trainer's pickle; not part of the model
    metrics = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    write_manifest(out, stage=p.name, params=to_dict(p), inputs=[model_dir, data_path],
                   counts={"steps": len(metrics), "updates_skipped": sum(bool(m.get("update_skipped")) for m in metrics),
                           "train_problems": len(rows), "resumed_from_step": resume_step,
                           "shared_prefix_forwards": getattr(trainer.model, "shared_prefix_calls", 0),
                           "rollouts": sum(1 for _ in open(out / "rollouts.jsonl")) if (out / "rollouts.jsonl").exists() else 0},
                   started=t0, extra={"precision": precision.summary(to_dict(p)),
                          "scheduler": policy_name(p.rollout.scheduler, p.rollout.reproducible),
                          "vllm_batch_invariant": batch_invariant,
                          "optimizer_continued_from": carried})
    # Until the workflow records the outputs complete (interrupts.drop_recorded), a rerun takes them from these
    # links; where links are impossible the checkpoints stay instead (a rerun resumes after the last step).
    if keep_finished(out, fp):
        shutil.rmtree(ckpt_root, ignore_errors=True)
        with contextlib.suppress(OSError):  # results/rl/checkpoints itself, once no stage has any left
            ckpt_root.parent.rmdir()
