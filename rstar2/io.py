"""Small I/O helpers shared by every stage: JSON Lines, atomic writes and the stage manifest.

The stage contract (docs/pipeline.md): a stage writes everything into ``results/<stage>/``
and writes ``manifest.json`` last, atomically, so a half-written stage never looks finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path`` with ``os.replace``.

    A reader sees either the old file or the complete new one, never a partial one, even if the writer
    is killed with SIGKILL half-way. On an exception the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results should read like any other file
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_path``), fsynced before the rename."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write ``rows`` as JSON Lines, atomically. Returns the number of rows written."""
    lines = [json.dumps(r, ensure_ascii=False, default=str) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON Lines file.

    Raises:
        ValueError: a line is not valid JSON; the message names the file and the 1-based line.
    """
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one row (used for per-step metrics logs that grow during a stage)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def keep_resumable(path: Path, link: Path, fresh: bool, cut=None) -> None:
    """Give a growing log ``path`` (a rule's declared output) a second name ``link`` outside the rule's outputs.

    Snakemake deletes a rule's declared outputs before rerunning it; a killed job's log that a resumed run continues
    must survive that. The hard link does, at no cost (one file, appended in place). ``fresh``: start empty (both names
    removed). Otherwise the log is taken back from ``link`` if ``path`` is gone, and ``cut(path)``, if given, may
    rewrite it (e.g. to a checkpoint's steps). ``path`` exists afterwards (empty if new). Where hard links are
    impossible (another file system) the log lives under ``path`` only.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    if fresh:
        path.unlink(missing_ok=True)
    elif not path.exists() and link.exists():
        os.link(link, path)
    if path.exists() and not fresh and cut is not None:
        cut(path)   # may write a new file: linked again below
    path.touch()
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except OSError:
        pass


def save_links(src: Path, dst: Path) -> bool:
    """Hard-link every file under folder ``src`` to the same relative path under ``dst`` (a second name, no copy).
    False, with ``dst`` left partial, where a link is impossible (another file system)."""
    for f in sorted(p for p in Path(src).rglob("*") if p.is_file()):
        target = Path(dst) / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, target)
        except OSError:
            return False
    return True


def restore_links(src: Path, dst: Path, last: str | None = None) -> list[Path]:
    """Link every file under ``src`` back to its relative path under ``dst`` where that is missing, the file named
    ``last`` (e.g. a stage's manifest) after all others. Returns the files linked back."""
    files = sorted((p for p in Path(src).rglob("*") if p.is_file()), key=lambda p: (p.name == last, str(p)))
    restored = []
    for f in files:
        target = Path(dst) / f.relative_to(src)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, target)
            restored.append(target)
    return restored


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ParamsJSON(str):
    """A stage's params JSON as a workflow rule hands it over: the text itself wherever it is formatted (the command
    line), but a short digest as its ``repr``, which is what Snakemake records, compares and prints in a job's
    ``reason:`` line (``params sha256:1f2e3d4c5b6a``) instead of the whole JSON. ``rstar2 <stage>`` prints the
    digest beside the JSON into the job's log. Snakemake keeps a param's value as it is only when a function
    returns it (it rebuilds a plain string param as a plain string), so the rules take it from a function."""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"params sha256:{self.digest}"


def digest(obj: Any) -> str:
    """A short, stable sha256 digest of a JSON-serialisable object (config digests in manifests)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_manifest(out_dir: str | os.PathLike, *, stage: str, params: Any, inputs: list[str],
                   counts: dict, started: float, extra: dict | None = None) -> Path:
    """Write ``<out_dir>/manifest.json`` last, atomically: what went in, config digest, counts, wall time.

    Args:
        out_dir: the stage folder, e.g. ``results/rl/stage1``.
        stage: stage name.
        params: the stage's resolved config section (its digest is recorded).
        inputs: paths of the upstream manifests or files this stage read.
        counts: stage-specific counts (rows, steps, ...).
        started: ``time.time()`` at the start of the stage; wall time is measured from it.
    """
    path = Path(out_dir) / "manifest.json"
    write_json(path, {
        "stage": stage,
        "config_digest": digest(params),
        "params": params,
        "inputs": inputs,
        "counts": counts,
        "wall_time_s": round(time.time() - started, 2),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **(extra or {}),
    })
    return path
