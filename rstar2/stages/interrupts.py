"""Interrupts: how a training job stops on a signal, and how a finished stage survives an interrupted workflow.

Job side (``stop_on_signal``, around ``rstar2 sft`` and ``rstar2 rl``). SIGINT and SIGTERM, whoever sends them (a
Ctrl-C to the terminal's process group, ``kill``, a SLURM cancel, or Snakemake passing its own on: below), stop the
job at once: the exception unwinds through the trainer, the sandbox and grading pools close, and the process exits
with 128 + the signal's number after one line saying where a rerun resumes. Nothing half-written is taken for done:
a checkpoint counts only once its completeness marker is written (``rstar2.rl.checkpoints``), a stage's outputs only
once its manifest is. A signal that comes after the last step, while the stage writes its outputs (a few seconds:
the time to save the model), lets it finish them and exit 0. The same signal seen twice within ``REPEAT_S`` (the
terminal's and Snakemake's copy) counts once; one sent later stops the process where it is.

Finished stage (``keep_finished`` / ``restore_finished``). A stage that wrote its manifest is done, but Snakemake
counts its outputs complete only once it has recorded them; interrupted in between, it deletes them and runs the job
again. So the stage keeps a second name (hard links: no second copy on disk) of every output in
``finished_root(out)`` with its inputs' fingerprint; a rerun with the same fingerprint links them back and exits
in seconds instead of training the stage again.

Workflow side (``forward_signals`` and ``drop_recorded``, from ``workflow/rules/common.smk``'s ``onstart`` and
``onsuccess``). Snakemake handles SIGINT by waiting for its running jobs, and SIGTERM by finishing them, so a signal
sent to the ``snakemake`` process alone (a script, a scheduler) would let an RL stage train on for hours:
``forward_signals`` sends the signal on to the processes each running job's shell runs, and makes SIGTERM act as
SIGINT. ``drop_recorded`` deletes a training run's kept outputs and checkpoints once Snakemake has recorded it
complete (or when the user forces a rerun of a recorded one).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from ..io import read_json, restore_links, save_links, write_json

#: Seconds within which a second copy of the same signal is the same stop (a Ctrl-C reaches the job from the
#: terminal and again from Snakemake).
REPEAT_S = 3.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)
FINISHED_FILE = "finished.json"   # written last into finished_root(out): the kept outputs are complete


def _say(line: str) -> None:
    """Print to stderr, ignoring a closed pipe (the log's ``tee`` may have been stopped by the same signal)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def stop_on_signal(tag: str, where: Callable[[], str]) -> Iterator[Callable[[], None]]:
    """Within the block, SIGINT and SIGTERM stop the process (``SystemExit(128 + signal)``) after printing
    ``[tag] SIGTERM: stopped; <where()>`` to stderr. Yields ``finishing()``: call it once the last step is done;
    a signal after that is noted and the block runs to its end (the stage's outputs). Handlers are restored on
    exit. Only the main thread can install them: elsewhere (a test calling ``run`` in a thread) nothing changes."""
    state = {"first": None, "finishing": False}

    def handler(signum, frame):
        name = signal.Signals(signum).name
        now = time.monotonic()
        if state["first"] is not None:
            if now - state["first"] < REPEAT_S:
                return
            _say(f"[{tag}] {name} again: stopping without cleaning up")
            os._exit(128 + signum)
        state["first"] = now
        if state["finishing"]:
            _say(f"[{tag}] {name}: the last step is done; writing the stage's outputs, then exiting")
            return
        _say(f"[{tag}] {name}: stopped; {where()}")
        raise SystemExit(128 + signum)

    try:
        previous = {s: signal.signal(s, handler) for s in SIGNALS}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield lambda: state.__setitem__("finishing", True)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def finished_root(out_dir: str | os.PathLike) -> Path:
    """``results/rl/stage1`` -> ``results/rl/finished/stage1`` (``results/sft`` -> ``results/finished/sft``)."""
    out = Path(out_dir)
    return out.parent / "finished" / out.name


def keep_finished(out_dir: str | os.PathLike, fingerprint: str) -> bool:
    """Give every file under the finished stage's ``out_dir`` (manifest included) a second name under
    ``finished_root``, then write its marker with ``fingerprint`` last. False (nothing kept) where hard links are
    impossible (another file system)."""
    out, root = Path(out_dir), finished_root(out_dir)
    shutil.rmtree(root, ignore_errors=True)
    if not save_links(out, root / "outputs"):
        shutil.rmtree(root, ignore_errors=True)
        return False
    write_json(root / FINISHED_FILE, {"fingerprint": fingerprint, "stage_dir": str(out)})
    return True


def restore_finished(out_dir: str | os.PathLike, fingerprint: str, write: bool = True) -> bool:
    """If the stage finished before with inputs of this ``fingerprint``, put its kept outputs back where they are
    missing (the manifest last) and return True; kept outputs of other inputs are deleted (False). ``write`` False
    (the other processes of a distributed run) only answers."""
    out, root = Path(out_dir), finished_root(out_dir)
    try:
        same = read_json(root / FINISHED_FILE)["fingerprint"] == fingerprint
    except (OSError, ValueError, KeyError):
        same = False
    if write and not same:
        shutil.rmtree(root, ignore_errors=True)
    elif write:
        restore_links(root / "outputs", out, last="manifest.json")
    return same


# ---- the Snakemake process ----

def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc; none elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()   # after "pid (comm) "; comm may hold spaces
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def job_processes(snakemake_pid: int | None = None) -> list[int]:
    """The processes the running jobs' shells run: the children of Snakemake's children (each local job is a
    shell, a child of Snakemake, running e.g. ``rstar2 rl ... | tee log``)."""
    return [p for shell in _children(snakemake_pid or os.getpid()) for p in _children(shell)]


def forward_signals() -> None:
    """Install, in the Snakemake process (its ``onstart``, after its scheduler set its own SIGTERM handler), a
    handler for SIGINT and SIGTERM that sends the signal to every ``job_processes`` process and then raises
    KeyboardInterrupt, as a Ctrl-C does: Snakemake's scheduler then cancels, and waits for the jobs, which stop
    within seconds (``stop_on_signal``). On the SLURM executor there are no local job processes; its cancel
    (``scancel``) sends the jobs SIGTERM."""
    def handler(signum, frame):
        for pid in job_processes():
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        raise KeyboardInterrupt

    for s in SIGNALS:
        signal.signal(s, handler)


def _drop(out: Path, checkpoints: Path) -> None:
    for folder in (finished_root(out), checkpoints):
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):   # the parent folder too, once no run has any left
            folder.parent.rmdir()


def drop_recorded(workflow, rules: tuple[str, ...], checkpoint_root: Callable[[Path], Path],
                  all_done: bool = False) -> None:
    """Delete the kept outputs and checkpoints of the training runs (jobs of ``rules``) whose outputs Snakemake
    has recorded complete: every run of the DAG with ``all_done`` (``onsuccess``); otherwise (``onstart``) each
    run that does not need to run, and each one forced to rerun whose outputs are complete and not marked
    incomplete (the user asked to train it again). A run that was interrupted keeps them, to resume. Never fails
    a run: a Snakemake API it cannot read leaves the folders in place, with a warning."""
    try:
        dag = workflow.dag
        for job in dag.jobs:
            if job.rule.name not in rules:
                continue
            manifest = next(Path(str(f)) for f in job.output if str(f).endswith("manifest.json"))
            out = manifest.parent
            if all_done or not dag.needrun(job):
                drop = manifest.exists()
            else:
                drop = all(os.path.exists(str(f)) for f in job.output) and \
                    not workflow.async_run(workflow.persistence.incomplete(job))
            if drop:
                _drop(out, checkpoint_root(out))
    except Exception as e:  # noqa: BLE001 - cleanup must never stop the workflow
        _say(f"warning: could not clean up finished training runs' checkpoints ({type(e).__name__}: {e}); "
             "they stay under results/**/finished and results/**/checkpoints")
