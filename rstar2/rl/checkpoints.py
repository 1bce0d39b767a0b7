"""Step-level resume of an RL stage: where checkpoints live, which one is valid, and log truncation.

A stage's checkpoints live in ``results/rl/checkpoints/<stage>/`` (``checkpoint_root``), outside the rule's
declared output (``results/rl/<stage>/manifest.json``): Snakemake deletes a rule's declared outputs before
rerunning it and would otherwise take the checkpoints with them. Each checkpoint is TRL/transformers'
``checkpoint-<step>/`` (model, optimizer, LR scheduler, RNG states, trainer state with the step counter,
from which the data position follows) plus our ``rstar2_state.json`` (the rollout step, from which every RL
random stream derives), written last as the completeness marker. ``fingerprint.json`` ties the folder to one set of inputs: params,
the training data, the starting model and the reward code; any change discards the old checkpoints. Once its manifest
is written the stage deletes the folder, keeping hard links of its outputs in ``results/rl/finished/<stage>`` until
the workflow records them (``rstar2.stages.interrupts``). To force a fresh start, delete both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..io import atomic_write_text, digest, file_sha256, keep_resumable, write_json

STATE_FILE = "rstar2_state.json"   # written last into each checkpoint: marks it complete (see stages/rl.py)


def checkpoint_root(out_dir: str | os.PathLike) -> Path:
    """``results/rl/stageN`` -> ``results/rl/checkpoints/stageN``."""
    out = Path(out_dir)
    return out.parent / "checkpoints" / out.name


# The code that defines a rollout's reward and advantage: a checkpoint trained under other rules (a grading
# fix, a different tool-call parser) is another experiment, not one to resume.
REWARD_MODULES = ("grading/__init__.py", "grading/extraction.py", "grading/normalize.py", "grading/integer.py",
                  "grading/symbolic.py", "grading/choice.py", "grading/answers.py", "grading/rewards.py", "chat.py",
                  "rl/roc.py")
PACKAGE = Path(__file__).resolve().parents[1]


def fingerprint(params: dict, model_dir: str | os.PathLike, data_path: str | os.PathLike,
                carried: dict | None = None) -> str:
    """Digest of what determines a stage's training run: params, data file contents, model folder contents
    (names, sizes and contents of every file), the source of the reward code (``REWARD_MODULES``) and the
    marker of the optimizer state it continues from (``carried``, ``read_carried``), if any."""
    model_files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file())
    return digest({"params": params, "data": file_sha256(Path(data_path)), "carried_optimizer": carried,
                   "model": [(str(p.relative_to(model_dir)), p.stat().st_size, file_sha256(p)) for p in model_files],
                   "reward_code": {m: file_sha256(PACKAGE / m) for m in REWARD_MODULES}})


def latest_complete(root: Path) -> Path | None:
    """The highest-step ``checkpoint-<n>`` under ``root`` that holds the completeness marker, or None."""
    found = []
    for p in root.glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / STATE_FILE).exists():
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def prepare(root: Path, fp: str) -> Path | None:
    """Make ``root`` ready for a run with fingerprint ``fp``; return the checkpoint to resume from, if any.

    A folder written for other inputs (or without a fingerprint) is removed first.
    """
    fp_file = root / "fingerprint.json"
    if root.exists():
        try:
            same = json.loads(fp_file.read_text())["fingerprint"] == fp
        except (OSError, ValueError, KeyError):
            same = False
        if not same:
            shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    if not fp_file.exists():
        write_json(fp_file, {"fingerprint": fp})
    return latest_complete(root)


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only the rows of a JSON Lines log whose ``step`` <= ``last_step`` (atomic rewrite): the steps
    after the resumed checkpoint are redone and would otherwise appear twice."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # a write cut off by the kill: the step it belonged to is redone
                break
            raise ValueError(f"{path}: line {i + 1}: invalid JSON") from None
        if row.get("step", 0) <= last_step:
            rows.append(line + "\n")
    atomic_write_text(path, "".join(rows))


#: The per-step logs of an RL stage, declared outputs of its rule (the report and the tests read them).
STAGE_LOGS = ("metrics.jsonl", "rollouts.jsonl", "heldout.jsonl", "heldout_problems.jsonl")


def keep_logs(out: Path, root: Path, resume_step: int | None) -> None:
    """Open a stage's per-step logs (``STAGE_LOGS`` in ``out``, declared outputs) so that a resumed run finds them
    again although Snakemake deleted them: each keeps a second name in ``root/logs/`` (``io.keep_resumable``).
    ``resume_step`` None: a fresh start, every log emptied; otherwise cut to the checkpoint's steps
    (``truncate_log``). Every log exists afterwards (empty if nothing is logged, e.g. no held-out benchmark)."""
    for name in STAGE_LOGS:
        keep_resumable(out / name, root / "logs" / name, resume_step is None,
                       None if resume_step is None else (lambda path: truncate_log(path, resume_step)))


def read_state(checkpoint_dir: str | os.PathLike) -> dict:
    """The RolloutFunc state saved in a checkpoint (raises FileNotFoundError for an incomplete one)."""
    with open(os.path.join(checkpoint_dir, STATE_FILE), encoding="utf-8") as f:
        return json.load(f)


CARRY_FILE = "carried_optimizer.json"  # written last into an optimizer folder: marks it complete


def save_optimizer(trainer, folder: str | os.PathLike, info: dict) -> None:
    """Leave a finished stage's AdamW state and LR schedule for the next stage (paper §4.3: stages 1
    and 2 are one continuing run, the optimizer is reset only for stage 3).

    ``folder`` is inside the stage's output folder (``results/rl/stage1/optimizer``), not under
    ``checkpoint_root``, which the stage deletes when it finishes. Trainer's own ``_save_optimizer_and_scheduler``
    writes it (optimizer.pt and scheduler.pt; FSDP gathers, DeepSpeed writes its engine checkpoint), so that
    ``_load_optimizer_and_scheduler`` reads it back as it reads a checkpoint. Every process must call this.
    ``info`` (e.g. stage name and fingerprint) goes into the marker with the global step; the marker is written
    last, so a folder without one is incomplete.
    """
    folder = Path(folder)
    acc = trainer.accelerator
    if acc.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    acc.wait_for_everyone()
    trainer._save_optimizer_and_scheduler(str(folder))
    acc.wait_for_everyone()
    if acc.is_main_process:
        write_json(folder / CARRY_FILE, {**info, "global_step": trainer.state.global_step})


def read_carried(folder: str | os.PathLike) -> dict:
    """The marker of an optimizer folder written by ``save_optimizer``.

    Raises:
        FileNotFoundError: no complete folder there (the previous stage ran without saving its optimizer,
            e.g. with ``continue_optimizer`` false for this stage at the time, or was interrupted).
    """
    path = Path(folder) / CARRY_FILE
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no optimizer state of the previous stage ({CARRY_FILE} missing); rerun "
                                "the previous stage with this stage's continue_optimizer set, or set it to false")
    return json.loads(path.read_text(encoding="utf-8"))


def mark_tied_weights(model) -> list[str]:
    """Add the model's tied copies of its input embedding (``lm_head.weight`` where ``tie_word_embeddings``: SmolLM2,
    the tiny test model) to the keys it does not save, and return their names.

    transformers writes a tied weight once (as ``model.embed_tokens.weight``), so a checkpoint has no
    ``lm_head.weight``; Trainer, resuming, loads the state dict non-strictly and warns "There were missing keys in
    the checkpoint model loaded: ['lm_head.weight']" unless the missing keys are exactly the model's
    ``_keys_to_ignore_on_save``, in which case it re-ties them. The weight was never missing (it is the embedding,
    loaded), so naming it there removes a false warning; what is saved is unchanged (a tied copy is not written
    either way). An untied model is left as it is.
    """
    inp, outp = model.get_input_embeddings(), model.get_output_embeddings()
    if inp is None or outp is None or outp.weight is not inp.weight:
        return []
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is inp.weight]
    copies = names[1:]  # named_parameters() keeps the first name of a shared tensor: the one saved
    model._keys_to_ignore_on_save = set(model._keys_to_ignore_on_save or ()) | set(copies)
    return copies
