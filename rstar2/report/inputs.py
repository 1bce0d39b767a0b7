"""Reading the stage outputs for the report, leniently: a report must not fail because one input is missing,
empty or half-written. What cannot be read is shown as "no data" and explained in a note.

Schemas (fixed by the producing stages):

- ``<rl dir>/metrics.jsonl``: one row per RL step with ``step``, ``reward_mean``, ``accuracy``,
  ``response_length_mean``, ``response_length_max``, ``tool_calls_per_traj``, ``tool_error_ratio``,
  ``tool_error_ratio_pos``, ``truncation_ratio``, ``all_correct_frac``, ``all_wrong_frac``, ... (a missing key
  or a null value is treated as absent; newer keys such as ``tool_error_ratio_pos_kept`` are used when present).
- ``<rl dir>/rollouts.jsonl``: rollout records (``step``, ``kept``, ``turns``, ``pred``, ``gold``, ``reward`` ...).
- ``<eval dir>/summary.json``: ``{"model", "benchmarks": {bench: {"n_problems", "k", "avg_at_k", "avg_at_k_ci",
  "pass_at_k", "maj_at_k", "mean_response_tokens", "mean_tool_calls", "truncation_ratio", "paper"}}}``.
- ``<eval dir>/<bench>/per_problem.jsonl``: per-problem results, each with one full rollout record ``sample``.
- ``<rl_data dir>/funnel.json``: ``{"steps", "per_source": {source: {step: count}}, "drops": {reason: n},
  "decontamination": {bench: n}}``; optional ``funnel.png`` beside it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def num(x) -> float | None:
    """``x`` as a finite float, or None (missing, null, NaN, non-numeric, bool)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def iter_json_lines(path: Path, notes: list[str]) -> Iterator[dict]:
    """JSON objects of a .jsonl file; a line that is not a JSON object (e.g. half-written) is skipped with a
    note naming the file and line."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:  # bad bytes make their line invalid, not the file
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                notes.append(f"{path}: line {lineno} is not valid JSON, skipped")
                continue
            if isinstance(row, dict):
                yield row


def interval(row: dict | None, key: str = "avg_at_k_ci", percent: bool = True,
             min_problems: int = 1) -> tuple[float | None, float | None]:
    """The 95% bootstrap interval ``row[key]`` (``rstar2.metrics.bootstrap_ci``'s [lo, hi], fractions) as
    (lo, hi), in percent with ``percent``; (None, None) when it is not a pair, or the row's ``n_problems`` is
    below ``min_problems`` (a bootstrap over one problem is a point)."""
    ci, n = (row or {}).get(key), num((row or {}).get("n_problems"))
    if not isinstance(ci, (list, tuple)) or len(ci) < 2 or (n if n is not None else min_problems) < min_problems:
        return None, None
    lo, hi = num(ci[0]), num(ci[1])
    return (pct(lo), pct(hi)) if percent else (lo, hi)


def accuracy_interval(row: dict | None) -> tuple[float | None, float | None]:
    """(lo, hi) of a held-out row's ``accuracy_ci`` (fractions; ``rstar2.rl.heldout``), or (None, None)."""
    return interval(row, "accuracy_ci", percent=False)


def step_rows(path: Path, notes: list[str]) -> list[dict]:
    """Rows of a per-step log (``metrics.jsonl``, ``heldout.jsonl``), the last one per ``step``, in step order.

    A log can repeat a step (appended to by hand, or by two runs in one folder); plotting both rows would draw
    the curve back over itself, so the later row wins and a note says how many were replaced.
    """
    rows = list(iter_json_lines(path, notes))
    by_step = {}
    for r in rows:
        by_step[r.get("step")] = r
    if len(by_step) < len(rows):
        notes.append(f"{path}: {len(rows) - len(by_step)} row(s) repeat an earlier step; the last row per step is used")
    return sorted(by_step.values(), key=lambda r: (num(r.get("step")) is None, num(r.get("step")) or 0))


def read_json(path: Path | None, notes: list[str]) -> dict | None:
    """A JSON object file, or None when missing or unreadable (with a note)."""
    if path is None or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        notes.append(f"{path}: unreadable ({e}), shown as no data")
        return None
    return obj if isinstance(obj, dict) else None


def natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(s))]


@dataclass
class Inputs:
    """Everything the report reads. ``read`` lists the files actually read (for the manifest)."""
    stages: dict[str, list[dict]] = field(default_factory=dict)        # stage -> metrics rows
    stage_dirs: dict[str, Path] = field(default_factory=dict)
    manifests: dict[str, dict | None] = field(default_factory=dict)
    evals: dict[str, dict | None] = field(default_factory=dict)        # model -> summary.json
    eval_dirs: dict[str, Path] = field(default_factory=dict)
    funnel: dict | None = None
    heldout: dict[str, list[dict]] = field(default_factory=dict)       # stage -> heldout.jsonl rows
    ablation: list[dict] = field(default_factory=list)                 # {"mode", "seed", "metrics", "heldout"}
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)


def load(inputs: dict) -> Inputs:
    """Read ``{"rl_stages": {stage: dir}, "eval": {model: dir}, "rl_data": dir, "ablation": [{"mode", "seed",
    "dir"}]}`` (any key may be missing, any
    directory may lack its files)."""
    got = Inputs()
    for key, kind in (("rl_stages", dict), ("eval", dict), ("ablation", list)):
        if inputs.get(key) is not None and not isinstance(inputs[key], kind):
            raise ValueError(f"report inputs: {key!r} must be a JSON {'object' if kind is dict else 'list'}, "
                             f"got {type(inputs[key]).__name__}")
    stage_dirs = {k: v for k, v in (inputs.get("rl_stages") or {}).items() if v}
    for name in sorted(stage_dirs, key=natural_key):
        d = Path(stage_dirs[name])
        p = d / "metrics.jsonl"
        if p.is_file():
            got.read.append(str(p))
        else:
            got.notes.append(f"{p}: not found (RL stage {name} has not run yet?)")
        got.stages[name] = step_rows(p, got.notes)
        got.stage_dirs[name] = d
        got.manifests[name] = read_json(d / "manifest.json", got.notes)
        got.heldout[name] = step_rows(d / "heldout.jsonl", got.notes)
    for i, run in enumerate(inputs.get("ablation") or []):
        missing = [k for k in ("mode", "seed", "dir") if not isinstance(run, dict) or k not in run]
        if missing:
            raise ValueError(f"report inputs: ablation entry {i} lacks {missing} (each needs mode, seed and dir)")
        got.ablation.append({"mode": run["mode"], "seed": run["seed"], **load_run(Path(run["dir"]), got.notes)})
    for model, d in (inputs.get("eval") or {}).items():
        p = Path(d) / "summary.json" if d else None
        if p is not None and p.is_file():
            got.read.append(str(p))
        got.evals[model] = read_json(p, got.notes)
        if d:
            got.eval_dirs[model] = Path(d)
    if inputs.get("rl_data"):
        d = Path(inputs["rl_data"])
        if (d / "funnel.json").is_file():
            got.read.append(str(d / "funnel.json"))
        got.funnel = read_json(d / "funnel.json", got.notes)
    return got


def load_run(d: Path, notes: list[str]) -> dict:
    """``{"metrics": [...], "heldout": [...]}`` of one RL folder (missing files give empty lists)."""
    return {"metrics": step_rows(d / "metrics.jsonl", notes), "heldout": step_rows(d / "heldout.jsonl", notes)}


def pct(x) -> float | None:
    """A score as a percentage: fractions in [0, 1] are scaled by 100, larger values are taken as percent."""
    v = num(x)
    if v is None:
        return None
    return v * 100 if abs(v) <= 1.0 else v


def benchmarks_of(evals: dict[str, dict | None]) -> dict[str, str | None]:
    """``{bench: paper column or None}`` over every evaluated model, in first-seen order; the column is the one
    an eval summary declares (``paper``), else one recognised from the benchmark's name."""
    from .paper import paper_column

    out: dict[str, str | None] = {}
    for summ in evals.values():
        for b, e in ((summ or {}).get("benchmarks") or {}).items():
            declared = e.get("paper") if isinstance(e, dict) else None
            if b not in out or (declared and not out[b]):
                out[b] = paper_column(b, declared)
    return out
