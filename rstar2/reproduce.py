"""Reproducibility check: run one config twice into two scratch copies of the workflow and list the
artifacts that differ, the first one first, with where (file, row, field).

Two runs of one config and seed (``reproducible: true``, the default) must give the same results folder except
for the fields below, which record wall-clock time or how the run went rather than what it computed. They are
named here and only here; the comparison ignores them at any depth of a JSON / JSONL record.

Compared: every ``.json`` / ``.jsonl`` file (record by record, field by field), every ``.csv`` / ``.txt`` file
(line by line), weights (``.safetensors``, ``.pt``, ``.bin``: byte for byte; a safetensors difference names its
first differing tensor). Not compared: logs, TensorBoard event files, figures and rendered reports
(``SKIPPED_SUFFIXES``), whose bytes carry timestamps or renderer state; what they show comes from the JSON
files that are compared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .io import file_sha256

# Fields that record wall-clock time: tool-call and evaluation durations, step and stage times, timestamps.
TIMING_FIELDS = frozenset({"duration_s", "rollout_time_s", "step_time_s", "wall_s", "wall_time_s", "finished_at"})
# Fields that record the run's history, not its results: the step a killed stage was resumed from, and how many
# update forwards took the shared-prefix path in the process that finished the stage (a resumed one counts its own).
HISTORY_FIELDS = frozenset({"resumed_from_step", "shared_prefix_forwards"})
IGNORED_FIELDS = TIMING_FIELDS | HISTORY_FIELDS
SKIPPED_SUFFIXES = (".log", ".png", ".svg", ".pdf", ".html", ".md")
SKIPPED_PARTS = ("tensorboard", "logs", ".snakemake")
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".bin")
TEXT_SUFFIXES = (".csv", ".txt", ".tsv")


@dataclass(frozen=True)
class Difference:
    """One artifact that differs: ``path`` relative to the results folder, ``where`` (e.g. "row 12, field
    turns[1].text: 'a' != 'b'", or "only in A")."""
    path: str
    where: str

    def __str__(self) -> str:
        return f"{self.path}: {self.where}"


def first_difference(a, b, where: str = "") -> str | None:
    """Where two JSON values first differ, ignoring IGNORED_FIELDS at any depth (e.g. "field turns[1].text:
    "a" != "b""), or None when they are equal. ``where`` prefixes the field path."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k in IGNORED_FIELDS:
                continue
            name = f"{where}.{k}" if where else str(k)
            if k not in a or k not in b:
                return f"field {name} only in {'B' if k not in a else 'A'}"
            d = first_difference(a[k], b[k], name)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{where}[{i}]")
            if d:
                return d
        return None if len(a) == len(b) else f"field {where or 'value'}: {len(a)} != {len(b)} items"
    if a != b or type(a) is not type(b):
        return f"field {where or 'value'}: {_short(a)} != {_short(b)}"
    return None


def _short(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _lines(path: Path) -> list[str]:
    text = path.read_text()
    return text.removesuffix("\n").split("\n") if text else []


def _compare_jsonl(pa: Path, pb: Path) -> str | None:
    # split on "\n" only: str.splitlines also splits inside a record on U+2028 and friends
    ra, rb = _lines(pa), _lines(pb)
    for i, (x, y) in enumerate(zip(ra, rb), 1):
        d = first_difference(json.loads(x), json.loads(y))
        if d:
            return f"line {i}, {d}"
    return None if len(ra) == len(rb) else f"{len(ra)} != {len(rb)} lines"


def _compare_text(pa: Path, pb: Path) -> str | None:
    la, lb = _lines(pa), _lines(pb)
    for i, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            return f"line {i}: {_short(x)} != {_short(y)}"
    return None if len(la) == len(lb) else f"{len(la)} != {len(lb)} lines"


def _compare_weights(pa: Path, pb: Path) -> str | None:
    if file_sha256(pa) == file_sha256(pb):
        return None
    if pa.suffix != ".safetensors":
        return "bytes differ"
    from safetensors import safe_open

    with safe_open(str(pa), "pt") as fa, safe_open(str(pb), "pt") as fb:
        for name in sorted(set(fa.keys()) | set(fb.keys())):
            if name not in fa.keys() or name not in fb.keys():
                return f"tensor {name} only in {'B' if name not in fa.keys() else 'A'}"
            x, y = fa.get_tensor(name), fb.get_tensor(name)
            if x.shape != y.shape or not bool((x == y).all()):
                diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else None
                return f"tensor {name} differs" + (f" (max abs difference {diff:.3g})" if diff is not None else "")
    return "bytes differ (tensors equal: metadata differs)"


def compared(path: Path) -> bool:
    """Whether ``compare_runs`` looks at this file (see the module docstring)."""
    return not (path.suffix in SKIPPED_SUFFIXES or any(p in SKIPPED_PARTS for p in path.parts))


def compare_file(pa: Path, pb: Path) -> str | None:
    """Where two versions of one artifact differ, or None when they are equal up to IGNORED_FIELDS."""
    if pa.suffix == ".jsonl":
        return _compare_jsonl(pa, pb)
    if pa.suffix == ".json":
        return first_difference(json.loads(pa.read_text()), json.loads(pb.read_text()))
    if pa.suffix in WEIGHT_SUFFIXES:
        return _compare_weights(pa, pb)
    if pa.suffix in TEXT_SUFFIXES:
        return _compare_text(pa, pb)
    return None if file_sha256(pa) == file_sha256(pb) else "bytes differ"


def _stage_order(root: Path, rel: Path) -> tuple:
    """Sort key: files of the stage that finished first (its manifest's ``finished_at``) come first."""
    for parent in [rel.parent, *rel.parents]:
        manifest = root / parent / "manifest.json"
        if parent != Path(".") and manifest.exists():
            try:
                return (json.loads(manifest.read_text()).get("finished_at") or "~", str(rel))
            except json.JSONDecodeError:
                break
    return ("~", str(rel))


def results_folder(path: str | Path) -> Path:
    """``path`` itself, or ``path/results`` when ``path`` is a workflow folder (it has a Snakefile).

    Raises:
        FileNotFoundError: no such folder.
    """
    path = Path(path)
    if (path / "Snakefile").exists() and (path / "results").is_dir():
        return path / "results"
    if not path.is_dir():
        raise FileNotFoundError(f"no results folder at {path}")
    return path


def compared_files(a: str | Path, b: str | Path) -> int:
    """How many files ``compare_runs(a, b)`` compares (those of either folder that it does not skip)."""
    a, b = results_folder(a), results_folder(b)
    return len({p.relative_to(root) for root in (a, b) for p in root.rglob("*")
                if p.is_file() and compared(p.relative_to(root))})


def compare_runs(a: str | Path, b: str | Path) -> list[Difference]:
    """Every compared artifact of results folder ``a`` that differs from ``b``'s, in the order run ``a``
    produced them (the first entry is the first artifact that differs); [] = the runs are equal. A workflow
    folder (with a Snakefile) stands for its ``results/``. Lines of JSONL and text files count from 1.

    Raises:
        FileNotFoundError: ``a`` or ``b`` is not a folder, or neither holds a file to compare.
    """
    a, b = results_folder(a), results_folder(b)
    files = {p.relative_to(root) for root in (a, b) for p in root.rglob("*")
             if p.is_file() and compared(p.relative_to(root))}
    if not files:
        raise FileNotFoundError(f"nothing to compare: no result files in {a} or {b}")
    out = []
    for rel in sorted(files, key=lambda r: _stage_order(a if (a / r).exists() else b, r)):
        if not (a / rel).exists() or not (b / rel).exists():
            out.append(Difference(str(rel), f"only in {'A' if (a / rel).exists() else 'B'}"))
            continue
        where = compare_file(a / rel, b / rel)
        if where:
            out.append(Difference(str(rel), where))
    return out


def scratch_copy(repo: Path, dest: Path) -> Path:
    """A copy of the workflow in ``dest`` (Snakefile, config.yaml, workflow/, configs/, profiles/ copied; data/
    and envs/ linked), where Snakemake can run without touching ``repo``'s own results/."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy2(repo / name, dest / name)
    for name in ("workflow", "configs", "profiles"):
        shutil.copytree(repo / name, dest / name, dirs_exist_ok=True)
    for name in ("data", "envs"):
        if not (dest / name).exists():
            (dest / name).symlink_to((repo / name).resolve())
    return dest


def run_twice(repo: Path, workdir: Path, configfiles: list[str], targets: list[str], cores: int,
              extra: list[str] = ()) -> list[Difference]:
    """Run ``snakemake --cores cores --configfile ... targets`` in two scratch copies (``workdir/a``,
    ``workdir/b``) one after the other, then ``compare_runs`` of their results folders.

    Data paths in the configs are relative to the workflow folder: the copies link ``data/`` (and ``envs/``)
    only, so a config's own data must live under ``data/`` or be given by absolute path.

    Raises:
        RuntimeError: ``workdir/a`` or ``workdir/b`` already holds a run (snakemake would run nothing), or a run
            failed (names the copy; its output went to the terminal).
    """
    for name in ("a", "b"):
        if (workdir / name / "results").exists():  # snakemake would find it up to date and run nothing
            raise RuntimeError(f"{workdir / name} already holds a run: give a new or empty --workdir")
    for name in ("a", "b"):
        copy = scratch_copy(repo, workdir / name)
        # targets first: snakemake's --configfile takes every word after it
        cmd = [sys.executable, "-m", "snakemake", *targets, "--cores", str(cores), *extra]
        if configfiles:
            cmd += ["--configfile", *[str(Path(c).resolve()) if Path(c).exists() else c for c in configfiles]]
        print(f"[reproduce] run {name.upper()} in {copy}: {' '.join(cmd[2:])}", flush=True)
        if subprocess.run(cmd, cwd=copy).returncode != 0:
            raise RuntimeError(f"run {name.upper()} in {copy} failed")
    return compare_runs(workdir / "a" / "results", workdir / "b" / "results")


def code_version(repo: str | Path) -> str | None:
    """The git commit of the checkout at ``repo`` (short hash), with ``-dirty`` when tracked files have uncommitted
    changes; None when ``repo`` is not a git checkout or git is missing. Named in the report (``made_from``)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")
