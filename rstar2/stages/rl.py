"""RL stage entry point (rl_stage1/2/3): start from the previous stage's model, train, save (paper §4.3, Table 2)."""

from __future__ import annotations

import contextlib
import random
import shutil
import time
import zlib
from pathlib import Path

from ..io import read_jsonl, write_manifest
from ..rollout import RolloutConfig


def rollout_config(p: dict) -> RolloutConfig:
    """Build a RolloutConfig from a stage's ``rollout`` + ``tool`` params (unknown keys are a config error)."""
    tool = p.get("tool", {})
    return RolloutConfig(**p["rollout"], tool_name=tool.get("name", RolloutConfig.tool_name),
                         tool_max_chars=tool.get("max_output_chars", RolloutConfig.tool_max_chars),
                         tool_timeout_s=tool.get("timeout_s", RolloutConfig.tool_timeout_s),
                         tool_memory_mb=tool.get("memory_mb", RolloutConfig.tool_memory_mb))


def grpo_config(params: dict, output_dir: str, seed: int, num_processes: int = 1):
    """TRL ``GRPOConfig`` of an RL stage (paper §4.3, §5.1; spec §5.5): AdamW (Trainer default), constant LR
    after ``warmup_steps`` linear warm-up steps, clip [1 - clip_low, 1 + clip_high], no KL, no entropy bonus,
    token-level (dapo) loss, one update per step, weight decay 0.01 and gradient clipping 1.0 (released code).
    gradient_accumulation_steps stays 1: RoCGRPOTrainer accumulates over its own micro-batches
    (``params["micro_batch_tokens"]``), whose number varies per step (rstar2/rl/trainer.py).

    Each of ``num_processes`` processes gets ``prompts_per_step / num_processes`` whole groups of G rows.
    Device, precision and vLLM come from ``params["trainer"]`` (rstar2.distributed).
    """
    from trl import GRPOConfig

    from .. import distributed

    G, every, dist = params["group_size"], params.get("checkpoint_every", 1), params.get("trainer")
    return GRPOConfig(
        output_dir=output_dir, seed=seed, **distributed.trainer_kwargs(dist),
        # the loss's log-probs use the distribution the rollouts were sampled from (logits / T)
        temperature=params["rollout"].get("temperature") or 1.0,
        **distributed.vllm_kwargs(params["rollout"], dist),
        # TRL's sampler gives each process a contiguous slice of this many rows: whole groups, P / N of them
        per_device_train_batch_size=params["prompts_per_step"] // num_processes * G, gradient_accumulation_steps=1,
        num_generations=G, max_steps=params["steps"], learning_rate=params["learning_rate"],
        lr_scheduler_type="constant_with_warmup", warmup_steps=params.get("warmup_steps", 0),
        beta=0.0, entropy_coef=0.0, epsilon=params["clip_low"], epsilon_high=params["clip_high"],
        loss_type="dapo", num_iterations=1, max_completion_length=params["rollout"]["max_response_tokens"],
        logging_steps=1, save_strategy="steps" if every > 0 else "no", save_steps=max(every, 1),
        save_total_limit=2, save_only_model=False, report_to=[], disable_tqdm=False,
        remove_unused_columns=False, weight_decay=0.01, max_grad_norm=1.0,
    )


def _heldout_problems(params: dict) -> list[dict] | None:
    """The held-out benchmark's problems when ``params["heldout"]`` names one (data errors name file and row)."""
    ho = params.get("heldout") or {}
    if not ho.get("benchmark"):
        return None
    from ..data.benchmarks import load_benchmark

    return load_benchmark(ho["benchmark"], ho["spec"])[: ho.get("limit") or None]


def _heldout_callbacks(params: dict, problems: list[dict] | None, seed: int, out: Path, is_main: bool) -> list:
    """The held-out evaluation callback when a held-out benchmark is configured, else none."""
    if problems is None:
        return []
    from ..data.benchmarks import answer_type
    from ..rl.heldout import make_heldout_callback

    ho = params["heldout"]
    spec = ho["spec"]
    rcfg = rollout_config({**params, "rollout": {**params["rollout"], "temperature": ho["temperature"],
                                                 "top_p": ho["top_p"], "batch_size": ho.get("batch_size", 32)}})
    return [make_heldout_callback(problems, answer_type(spec).name, rcfg, ho["every"], ho["k"], seed, str(out),
                                  params["steps"], is_main)]


def run(params: dict, model_dir: str, data_path: str, out_dir: str, optimizer_from: str | None = None) -> None:
    """Train one RL stage with TRL's GRPOTrainer and our rollout layer, resuming from its last checkpoint.

    Args:
        params: the stage's resolved config: steps, prompts_per_step, group_size, oversample, mode,
            positive_selection, error_penalty, format_penalty, penalty_eps, checkpoint_every, learning_rate,
            warmup_steps, clip_low, clip_high, micro_batch_tokens (padded tokens per forward/backward
            micro-batch and process), continue_optimizer (start from ``optimizer_from``'s AdamW state and LR
            schedule), save_optimizer (leave this stage's in ``out_dir/optimizer`` for the next stage),
            rollout{...}, tool{...}, seed; optional ``heldout`` {benchmark, spec, every, limit, k, temperature,
            top_p} evaluates the policy on a held-out benchmark at step 0 and every ``every`` steps
            (``rstar2.rl.heldout``: ``heldout.jsonl``).
        model_dir: folder of the starting model (previous stage's ``model/``).
        data_path: JSON Lines with ``id``, ``problem``, ``answer`` (rl_data's train.jsonl or hard_problems' hard.jsonl).
        out_dir: ``results/rl/stageN``; writes ``model/``, ``metrics.jsonl``, ``rollouts.jsonl``,
            ``tensorboard/``, ``optimizer/`` (with save_optimizer), then ``manifest.json``. Checkpoints go to
            ``results/rl/checkpoints/stageN`` (``rstar2.rl.checkpoints``): a killed stage resumes from the last
            one, with optimizer, LR schedule, RNG, data position, step counter and logs as they were at that step.
        optimizer_from: the previous stage's ``optimizer/`` folder; required with continue_optimizer (paper
            §4.3: stage 2 continues stage 1's optimizer; stage 3 resets it).
    Raises:
        ValueError: the training set is empty (e.g. hard-problem mining kept nothing), or continue_optimizer
            without optimizer_from.
        FileNotFoundError: optimizer_from holds no complete optimizer state.
    """
    from datasets import Dataset

    from .. import distributed, models
    from ..rl import checkpoints
    from ..rl.trainer import PenaltyConfig, RolloutFunc, make_metrics_callback, make_trainer_class, rollout_reward

    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(data_path)
    if not rows:
        raise ValueError(f"{data_path}: no training problems; nothing to train on")
    ps = distributed.process_state(params.get("trainer"))
    P, G = params["prompts_per_step"], params["group_size"]
    if P % ps.num_processes:
        raise ValueError(f"rl.prompts_per_step={P} must be a multiple of the number of training processes "
                         f"({ps.num_processes}): each process rolls out whole groups")
    heldout = _heldout_problems(params)  # a bad held-out file fails here, before any checkpoint or log is touched
    if heldout:
        from ..rl.heldout import check_disjoint

        check_disjoint(heldout, rows, params["heldout"]["benchmark"], f"the training data {data_path}")
    if params["continue_optimizer"] and not optimizer_from:
        raise ValueError("continue_optimizer is set but no optimizer folder of the previous stage was given "
                         "(rstar2 rl --optimizer-from results/rl/stageN/optimizer)")
    carried = checkpoints.read_carried(optimizer_from) if params["continue_optimizer"] else None
    ckpt_root = checkpoints.checkpoint_root(out)
    # held-out settings are measurement, not training: changing them resumes from the checkpoints
    fp = checkpoints.fingerprint({k: v for k, v in params.items() if k != "heldout"}, model_dir, data_path, carried)
    with ps.main_process_first():  # the main process clears a stale folder; the others then find it ready
        resume = checkpoints.prepare(ckpt_root, fp)
    resume_step = checkpoints.read_state(resume)["step"] if resume else 0
    if ps.is_main_process:
        for log in ("metrics.jsonl", "rollouts.jsonl", "heldout.jsonl", "heldout_problems.jsonl"):
            if resume:  # keep exactly the steps the checkpoint contains
                checkpoints.truncate_log(out / log, resume_step)
            else:       # a fresh start (held-out rows of step 0 would otherwise survive from an earlier run)
                (out / log).unlink(missing_ok=True)
        shutil.rmtree(out / "tensorboard", ignore_errors=True)  # rewritten from metrics.jsonl below on resume
    ps.wait_for_everyone()

    # Each stage draws its own prompt order: with one seed for all, stage 2 would replay stage 1's prompts.
    seed = params["seed"] + zlib.crc32(params.get("name", "rl").encode()) % 10_000
    random.Random(seed).shuffle(rows)
    answers = {r["problem"]: {"id": r["id"], "answer": r["answer"]} for r in rows}
    dataset = Dataset.from_list([{"prompt": q} for q in answers])

    # Trainer arguments before the model: under accelerate's DeepSpeed ZeRO-3 they make from_pretrained load
    # the weights already sharded, instead of one full copy per process.
    args = grpo_config(params, str(ckpt_root), seed, ps.num_processes)
    model, tok = models.load(model_dir)
    penalty = PenaltyConfig(params.get("error_penalty", "status"), params.get("format_penalty", "paper"),
                            params.get("penalty_eps", 1e-3))
    rollout_fn = RolloutFunc(answers, rollout_config(params), G, params.get("oversample", 2), params["mode"],
                             params.get("positive_selection", "inverse_prob"), seed, str(out), penalty)
    rollout_fn.set_process(ps.process_index, ps.num_processes)
    if resume:
        rollout_fn.load_state_dict(checkpoints.read_state(resume))
        print(f"[rl] resuming {params.get('name', 'rl')} from {resume} (step {resume_step})", flush=True)
    callback = make_metrics_callback(rollout_fn, str(out / "metrics.jsonl"), str(out / "tensorboard"))
    if resume and ps.is_main_process:
        callback.replay(read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else [])
    callbacks = [callback] + _heldout_callbacks(params, heldout, seed, out, ps.is_main_process)
    trainer = make_trainer_class()(model=model, reward_funcs=[rollout_reward], args=args, train_dataset=dataset,
                                   processing_class=tok, rollout_fn=rollout_fn, callbacks=callbacks,
                                   micro_batch_tokens=params["micro_batch_tokens"],
                                   optimizer_from=str(optimizer_from) if carried else None)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    trainer.save_model(str(out / "model"))  # every process: gathers ZeRO-3 / FSDP shards; the main one writes
    if params["save_optimizer"]:  # before the manifest: a stage without one is not finished
        checkpoints.save_optimizer(trainer, out / "optimizer", {"stage": params.get("name", "rl"), "fingerprint": fp})
    ps.wait_for_everyone()
    if not ps.is_main_process:
        return
    tok.save_pretrained(out / "model")
    (out / "model" / "training_args.bin").unlink(missing_ok=True)  # Trainer's pickle; not part of the model
    metrics = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    write_manifest(out, stage=params.get("name", "rl"), params=params, inputs=[model_dir, data_path],
                   counts={"steps": len(metrics), "updates_skipped": sum(bool(m.get("update_skipped")) for m in metrics),
                           "train_problems": len(rows), "resumed_from_step": resume_step,
                           "rollouts": sum(1 for _ in open(out / "rollouts.jsonl")) if (out / "rollouts.jsonl").exists() else 0},
                   started=t0, extra={"optimizer_continued_from": carried})
    shutil.rmtree(ckpt_root, ignore_errors=True)  # after the manifest: a finished stage needs no checkpoints
    with contextlib.suppress(OSError):  # results/rl/checkpoints itself, once no stage has any left
        ckpt_root.parent.rmdir()
