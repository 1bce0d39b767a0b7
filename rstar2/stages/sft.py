"""Non-reasoning SFT cold start (paper §4.1, §5.1) with TRL's SFTTrainer.

Conversations are tokenised by ``chat.encode_conversation`` (the same segments as RL rollouts), so the
loss covers assistant tokens only, each turn's ``<|im_end|>`` included, and tool responses are masked.
Examples longer than ``max_length`` are dropped explicitly and counted (never silently truncated).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ..io import append_jsonl, digest, file_sha256, read_jsonl, write_json, write_manifest
from ..params import merge_overrides, to_dict
from .interrupts import finished_root, keep_finished, restore_finished, stop_on_signal
from .params import SFTParams, parse

# SFTConfig fields the stage's own batching and saving depend on: not overridable through sft.trainer_overrides.
PROTECTED_SFT_FIELDS = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "output_dir",
                                  "max_length", "packing", "save_strategy"})


def tokenize_rows(tok, rows: list[dict], max_length: int) -> tuple[list[dict], list[str]]:
    """Encode rows to ``{"input_ids", "assistant_masks"}``; returns (kept examples, ids of dropped over-long rows)."""
    from ..chat import encode_conversation

    kept, dropped = [], []
    for i, r in enumerate(rows):
        try:
            ids, mask = encode_conversation(tok, r["messages"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"sft data row {i} (id {r.get('id')!r}): {e}") from None
        if len(ids) > max_length:
            dropped.append(str(r.get("id", i)))
            continue
        kept.append({"input_ids": ids, "assistant_masks": mask})
    return kept, dropped


def sft_config(p: SFTParams, output_dir: str, num_processes: int = 1):
    """TRL ``SFTConfig`` of the cold start (paper §5.1: 3 epochs, lr 5e-6, batch 128, cosine decay, 4% warm-up;
    AdamW, the Trainer's default optimizer). ``batch_size`` is the batch of one optimizer step:
    per-device rows x ``grad_accum`` x ``num_processes``. Device and precision come from ``p.trainer``;
    ``p.trainer_overrides`` sets further SFTConfig fields.
    Raises:
        ValueError: batch_size is not a positive multiple of grad_accum x num_processes; a bad override.
    """
    from trl import SFTConfig

    p = parse(SFTParams, p, "sft params")

    from .. import distributed

    accum = p.grad_accum
    per_device, rest = divmod(p.batch_size, accum * num_processes)
    if rest or not per_device:
        raise ValueError(f"sft.batch_size={p.batch_size} must be a multiple of sft.grad_accum ({accum}) "
                         f"x training processes ({num_processes})")
    ours = dict(
        output_dir=output_dir, seed=p.seed, **distributed.trainer_kwargs(to_dict(p.trainer)),
        num_train_epochs=p.epochs, learning_rate=p.learning_rate,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accum,
        # transformers 5 reads a warmup_steps below 1 as a fraction of the training steps
        lr_scheduler_type="cosine", warmup_steps=float(p.warmup_ratio), max_length=None,
        logging_steps=1, save_strategy="no", report_to=[], packing=False,
    )
    return SFTConfig(**merge_overrides(SFTConfig, ours, p.trainer_overrides, PROTECTED_SFT_FIELDS,
                                       "sft.trainer_overrides"))


def run(params: dict, model_dir: str, data_path: str, out_dir: str) -> None:
    """Fine-tune the base model on the SFT conversations; writes ``model/``, ``metrics.jsonl``, ``manifest.json``.

    params: ``rstar2.stages.params.SFTParams`` or its JSON dict (batch_size is per optimizer step, over all
        processes and accumulation steps). Runs as one process, or as several under ``accelerate launch``.
    Raises:
        ValueError: no example fits in ``max_length`` (the message says how many were too long), or batch_size
            is not a multiple of grad_accum x processes.
        SystemExit: SIGINT or SIGTERM stopped it (``interrupts.stop_on_signal``, exit status 130 or 143); the
            cold start keeps no step checkpoints, so a rerun starts it again. Once finished, its outputs are kept
            in ``interrupts.finished_root`` until the workflow records them: a rerun with the same inputs puts
            them back instead of training again.
    """
    with stop_on_signal("sft", lambda: "the cold start keeps no step checkpoints: a rerun starts it again") as done:
        _run(params, model_dir, data_path, out_dir, done)


def fingerprint(params: dict, model_dir: str | Path, data_path: str | Path) -> str:
    """Digest of what determines the cold start's result: params, the data file and the starting model's files."""
    model_files = sorted(f for f in Path(model_dir).rglob("*") if f.is_file())
    return digest({"params": params, "data": file_sha256(data_path),
                   "model": [(str(f.relative_to(model_dir)), file_sha256(f)) for f in model_files]})


def _run(params: dict, model_dir: str, data_path: str, out_dir: str, finishing) -> None:
    t0 = time.time()
    p = parse(SFTParams, params, "sft params")
    out = Path(out_dir)
    fp = fingerprint(to_dict(p), model_dir, data_path)
    # before the heavy imports and the process group (the first process writes; accelerate and torchrun set RANK)
    if restore_finished(out, fp, write=os.environ.get("RANK", "0") == "0"):
        print(f"[sft] the cold start had finished with these inputs; its outputs are back from "
              f"{finished_root(out)}: nothing trained again", flush=True)
        return

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from .. import distributed, models, precision
    from ..rl import checkpoints

    ps = distributed.process_state(to_dict(p.trainer))
    out.mkdir(parents=True, exist_ok=True)
    if ps.is_main_process:
        (out / "metrics.jsonl").unlink(missing_ok=True)
    ps.wait_for_everyone()
    # Trainer arguments before the model: under accelerate's DeepSpeed ZeRO-3 they make from_pretrained load
    # the weights already sharded, instead of one full copy per process.
    args = sft_config(p, str(out / "trainer_scratch"), ps.num_processes)
    model, tok = models.load(model_dir)
    # a tied LM head is written once, as save_pretrained does; FSDP's gathered state dict holds it twice otherwise
    checkpoints.mark_tied_weights(model)
    tok.padding_side = "right"
    rows = read_jsonl(data_path)
    if p.limit:
        rows = rows[: p.limit]
    examples, dropped = tokenize_rows(tok, rows, p.max_length)
    if dropped and ps.is_main_process:
        print(f"[sft] dropped {len(dropped)} of {len(rows)} examples longer than max_length="
              f"{p.max_length}: {dropped[:10]}", flush=True)
    if not examples:
        raise ValueError(f"{data_path}: all {len(rows)} examples exceed sft.max_length={p.max_length}")

    class _Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and state.is_world_process_zero:
                append_jsonl(out / "metrics.jsonl", {"step": state.global_step, **{k: logs[k] for k in logs}})

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tok, callbacks=[_Log()])
    distributed.check_engine(trainer.accelerator)  # an FSDP launch that would train unsharded stops here
    if p.trainer.shared_prefix and ps.num_processes == 1:  # a DDP/FSDP/ZeRO-3 wrapper must see every forward
        from ..rl import shared_prefix

        shared_prefix.install(trainer.model)
    trainer.train()
    finishing()  # the last step is done: a signal from here on lets the outputs below be written
    tok.padding_side = "left"
    trainer.save_model(str(out / "model"))  # every process: gathers ZeRO-3 / FSDP shards; the main one writes
    ps.wait_for_everyone()
    if not ps.is_main_process:
        return
    tok.save_pretrained(out / "model")
    (out / "model" / "training_args.bin").unlink(missing_ok=True)  # Trainer's pickle; not part of the model
    shutil.rmtree(out / "trainer_scratch", ignore_errors=True)
    lengths = [len(e["input_ids"]) for e in examples]
    counts = {"examples": len(examples), "dropped_too_long": len(dropped), "max_tokens": max(lengths),
              "trained_tokens": sum(sum(e["assistant_masks"]) for e in examples),
              "optimizer_steps": trainer.state.global_step,
              "shared_prefix_forwards": getattr(trainer.model, "shared_prefix_calls", 0)}
    write_json(out / "dropped.json", dropped)
    write_manifest(out, stage="sft", params=to_dict(p), inputs=[model_dir, data_path], counts=counts, started=t0,
                   extra={"precision": precision.summary(to_dict(p))})
    keep_finished(out, fp)  # until the workflow records the outputs complete (interrupts.drop_recorded)
