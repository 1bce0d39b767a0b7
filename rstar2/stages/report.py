"""Report stage: evaluation table beside the paper's numbers, data funnel, training summary and curves.

Reads (schemas fixed by the producing stages; any file may be missing or empty and is then shown as
"no data"):

- ``<rl dir>/metrics.jsonl``: one row per RL step with ``step``, ``reward_mean``, ``accuracy``,
  ``response_length_mean``, ``response_length_max``, ``tool_calls_per_traj``, ``tool_error_ratio``,
  ``tool_error_ratio_pos``, ``truncation_ratio``, ``all_correct_frac``, ``all_wrong_frac``, ``kept_pos``,
  ``kept_neg``, ``loss``, ``step_time_s`` (a missing key is treated as absent).
- ``<eval dir>/summary.json``: ``{"model", "benchmarks": {bench: {"n_problems", "k", "avg_at_k",
  "avg_at_k_ci", "pass_at_k", "mean_response_tokens", "mean_tool_calls"}}}``.
- ``<rl_data dir>/funnel.json``: ``{"steps", "per_source": {source: {step: count}}, "drops": {reason: n},
  "decontamination": {bench: n}}``.

Writes ``summary.md``, ``training_curves.png``, ``funnel.png``, ``eval.png`` and, last, ``manifest.json``.
Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot state, no display).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from ..io import atomic_path, atomic_write_text, write_manifest

#: Paper Table 3, rStar2-Agent-14B, avg@16 pass@1 in percent (spec §6.2).
PAPER_TABLE3 = {"MATH-500": 97.8, "AIME24": 80.6, "AIME25": 69.8, "HMMT Feb25": 52.7}

# normalised benchmark name -> paper column
_BENCH_ALIASES = {
    "math500": "MATH-500", "math": "MATH-500",
    "aime24": "AIME24", "aime2024": "AIME24",
    "aime25": "AIME25", "aime2025": "AIME25",
    "hmmt25": "HMMT Feb25", "hmmtfeb25": "HMMT Feb25", "hmmtfeb2025": "HMMT Feb25", "hmmt2025": "HMMT Feb25",
}

#: Panels of training_curves.png: (title, [(metrics key, label, line style)]).
CURVE_PANELS = [
    ("reward / accuracy", [("reward_mean", "reward mean", "-"), ("accuracy", "accuracy", "--")]),
    ("response length (tokens)", [("response_length_mean", "mean", "-"), ("response_length_max", "max", ":")]),
    ("tool calls per trajectory", [("tool_calls_per_traj", "tool calls", "-")]),
    ("tool error ratio", [("tool_error_ratio", "all trajectories", "-"),
                          ("tool_error_ratio_pos", "positive trajectories", "--")]),
    ("truncation ratio", [("truncation_ratio", "truncated", "-")]),
    ("all-correct / all-wrong groups", [("all_correct_frac", "all correct", "-"),
                                        ("all_wrong_frac", "all wrong", "--")]),
]
NO_DATA = "no data"


# ---------------------------------------------------------------------------------------------------------
# Reading (lenient: a report must not fail because one input is missing, empty or half-written)
# ---------------------------------------------------------------------------------------------------------

def _num(x) -> float | None:
    """``x`` as a finite float, or None (missing, null, NaN, non-numeric, bool)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _read_metrics(path: Path, notes: list[str]) -> list[dict]:
    """Rows of a metrics.jsonl; a line that is not a JSON object (e.g. half-written) is skipped with a note."""
    if not path.is_file():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                notes.append(f"{path}: line {lineno} is not valid JSON, skipped")
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _read_json(path: Path | None, notes: list[str]) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        notes.append(f"{path}: unreadable ({e}), shown as no data")
        return None
    return obj if isinstance(obj, dict) else None


def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(s))]


def _paper_column(bench: str) -> str | None:
    return _BENCH_ALIASES.get(re.sub(r"[^a-z0-9]", "", bench.lower()))


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------

def _pct(x) -> float | None:
    """A score as a percentage: fractions in [0, 1] are scaled by 100, larger values are taken as percent."""
    v = _num(x)
    if v is None:
        return None
    return v * 100 if abs(v) <= 1.0 else v


def _fmt(x, digits: int = 1) -> str:
    v = _num(x)
    return "–" if v is None else f"{v:.{digits}f}"


def _fmt_int(x) -> str:
    v = _num(x)
    return "–" if v is None else f"{int(round(v)):,}"


def _cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def _fmt_seconds(s) -> str:
    v = _num(s)
    if v is None:
        return "–"
    if v < 120:
        return f"{v:.1f} s"
    if v < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.2f} h"


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------

def _eval_section(evals: dict[str, dict | None]) -> tuple[list[str], list[str]]:
    """Markdown lines for the evaluation tables; also returns the benchmark columns in order."""
    lines = ["## Evaluation", ""]
    benches: list[str] = []
    for summ in evals.values():
        for b in ((summ or {}).get("benchmarks") or {}):
            if b not in benches:
                benches.append(b)
    models = {m: s for m, s in evals.items() if s and (s.get("benchmarks") or {})}
    if not models:
        lines += [f"Evaluation: {NO_DATA}.", ""]
    else:
        lines += ["avg@k pass@1 in percent with its 95% bootstrap confidence interval over problems "
                  "(k samples per problem; paper protocol: avg@16, temperature 0.6).", ""]
        rows = []
        for m, s in models.items():
            row = [m]
            for b in benches:
                e = (s.get("benchmarks") or {}).get(b)
                if not isinstance(e, dict) or _num(e.get("avg_at_k")) is None:
                    row.append("–")
                    continue
                ci = e.get("avg_at_k_ci") or []
                lo, hi = (_pct(ci[0]), _pct(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
                txt = _fmt(_pct(e["avg_at_k"]))
                if lo is not None and hi is not None:
                    txt += f" [{lo:.1f}, {hi:.1f}]"
                row.append(txt)
            rows.append(row)
        ref = ["rStar2-Agent-14B (paper Table 3, avg@16)"]
        for b in benches:
            col = _paper_column(b)
            ref.append(_fmt(PAPER_TABLE3[col]) if col else "–")
        rows.append(ref)
        lines += _table(["model"] + benches, rows) + [""]

        lines += ["### Details", ""]
        rows = []
        for m, s in models.items():
            for b, e in (s.get("benchmarks") or {}).items():
                if not isinstance(e, dict):
                    continue
                ci = e.get("avg_at_k_ci") or []
                ci_txt = (f"[{_fmt(_pct(ci[0]))}, {_fmt(_pct(ci[1]))}]"
                          if isinstance(ci, (list, tuple)) and len(ci) == 2 else "–")
                col = _paper_column(b)
                rows.append([m, b, _fmt_int(e.get("n_problems")), _fmt_int(e.get("k")), _fmt(_pct(e.get("avg_at_k"))),
                             ci_txt, _fmt(_pct(e.get("pass_at_k"))), _fmt(e.get("mean_response_tokens")),
                             _fmt(e.get("mean_tool_calls"), 2), _fmt(PAPER_TABLE3[col]) if col else "–"])
        lines += _table(["model", "benchmark", "problems", "k", "avg@k (%)", "95% CI", "pass@k (%)",
                         "mean response tokens", "mean tool calls", "paper (%)"], rows) + [""]
    lines += ["Paper reference, rStar2-Agent-14B (Table 3, avg@16 pass@1): "
              + ", ".join(f"{k} {v:.1f}" for k, v in PAPER_TABLE3.items()) + ".", ""]
    return lines, benches


def _funnel_section(funnel: dict | None) -> list[str]:
    lines = ["## RL data funnel", ""]
    if not funnel or not (funnel.get("per_source") or funnel.get("drops") or funnel.get("decontamination")):
        return lines + [f"Data funnel: {NO_DATA}.", ""]
    per_source = funnel.get("per_source") or {}
    steps = list(funnel.get("steps") or [])
    for counts in per_source.values():
        for st in (counts or {}):
            if st not in steps:
                steps.append(st)
    if per_source and steps:
        sources = list(per_source)
        rows = []
        for st in steps:
            vals = [_num((per_source[s] or {}).get(st)) for s in sources]
            total = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
            rows.append([st] + [_fmt_int(v) for v in vals] + [_fmt_int(total)])
        lines += _table(["step"] + sources + ["total"], rows) + [""]
    drops = funnel.get("drops") or {}
    if drops:
        lines += ["### Drops by reason", ""]
        lines += _table(["reason", "count"], [[r, _fmt_int(n)] for r, n in
                                              sorted(drops.items(), key=lambda kv: -(_num(kv[1]) or 0))]) + [""]
    decon = funnel.get("decontamination") or {}
    if decon:
        lines += ["### Decontamination (problems removed per benchmark)", ""]
        lines += _table(["benchmark", "removed"], [[b, _fmt_int(n)] for b, n in decon.items()]) + [""]
    return lines


def _stage_stats(rows: list[dict], manifest: dict | None) -> dict:
    def series(key):
        return [v for v in (_num(r.get(key)) for r in rows) if v is not None]
    rewards, acc = series("reward_mean"), series("accuracy")
    times = series("step_time_s")
    steps = series("step")
    return {
        "steps": len(rows),
        "last_step": int(steps[-1]) if steps else (len(rows) or None),
        "first_reward": rewards[0] if rewards else None,
        "last_reward": rewards[-1] if rewards else None,
        "first_acc": acc[0] if acc else None,
        "last_acc": acc[-1] if acc else None,
        "last_len": (series("response_length_mean") or [None])[-1],
        "step_time_sum": sum(times) if times else None,
        "manifest_wall": _num((manifest or {}).get("wall_time_s")),
    }


def _training_section(stages: dict[str, list[dict]], manifests: dict[str, dict | None]) -> list[str]:
    lines = ["## RL training", ""]
    if not stages:
        return lines + [f"RL training: {NO_DATA}.", ""]
    rows = []
    for name, rows_ in stages.items():
        st = _stage_stats(rows_, manifests.get(name))
        if st["steps"] == 0:
            rows.append([name, "0", NO_DATA, NO_DATA, "–", "–", "–", _fmt_seconds(st["manifest_wall"])])
            continue
        rows.append([name, str(st["steps"]), _fmt(st["first_reward"], 3), _fmt(st["last_reward"], 3),
                     _fmt(st["first_acc"], 3), _fmt(st["last_acc"], 3), _fmt(st["last_len"], 0),
                     _fmt_seconds(st["step_time_sum"] if st["step_time_sum"] is not None else st["manifest_wall"])])
    lines += _table(["stage", "steps", "first reward", "last reward", "first accuracy", "last accuracy",
                     "last mean response length", "wall time"], rows) + [""]
    lines += ["Wall time is the sum of per-step times (the stage manifest's wall time when steps carry none).", ""]
    lines += _no_signal_warnings(stages)
    return lines


def _no_signal_warnings(stages: dict[str, list[dict]]) -> list[str]:
    """Say plainly when a stage had no learning signal: every group's rewards were equal in every step,
    so every advantage was 0 and the update left the weights unchanged."""
    out = []
    for name, rows in stages.items():
        flat = [r for r in rows if r.get("all_correct_frac") is not None and r.get("all_wrong_frac") is not None]
        if flat and len(flat) == len(rows) and all(r["all_correct_frac"] + r["all_wrong_frac"] >= 1 for r in flat):
            wrong = sum(r["all_wrong_frac"] >= 1 for r in flat)
            out.append(f"**Warning ({name}): no learning signal.** In all {len(flat)} steps every group had equal "
                       f"rewards ({wrong} steps all wrong, {len(flat) - wrong} all correct), so every advantage "
                       "was 0 and this stage did not change the model. Use easier problems, more rollouts per "
                       "group or a stronger base model.")
    return out + [""] if out else []


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------

def _new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path, dpi: int) -> None:
    """Save a PNG atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight")


def _no_data(ax, what: str = NO_DATA) -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _cumulative_x(stages: dict[str, list[dict]]) -> tuple[dict[str, list[float]], list[tuple[str, float, float]]]:
    """x positions per stage (cumulative step across stages) and each stage's (name, start, end)."""
    xs, spans, offset = {}, [], 0.0
    for name, rows in stages.items():
        x = []
        for i, r in enumerate(rows):
            s = _num(r.get("step"))
            x.append(offset + (s if s is not None else i + 1))
        xs[name] = x
        end = max(x) if x else offset
        spans.append((name, offset, end))
        offset = end
    return xs, spans


def _plot_training(stages: dict[str, list[dict]], path: Path, dpi: int) -> None:
    import matplotlib

    fig = _new_figure(15, 8.5)
    axes = fig.subplots(2, 3).ravel()
    xs, spans = _cumulative_x(stages)
    colors = matplotlib.colormaps["tab10"].colors
    for ax, (title, series) in zip(axes, CURVE_PANELS):
        ax.set_title(title)
        drawn = False
        for si, (name, rows) in enumerate(stages.items()):
            for ki, (key, label, style) in enumerate(series):
                pts = [(x, _num(r.get(key))) for x, r in zip(xs[name], rows)]
                pts = [(x, y) for x, y in pts if y is not None]
                if not pts:
                    continue
                # a different marker per quantity: curves that coincide (reward mean and accuracy are equal
                # for a binary reward) stay distinguishable
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colors[si % len(colors)],
                        marker=".x^"[ki % 3] if len(pts) < 30 else None, label=f"{name}: {label}")
                drawn = True
        if not drawn:
            _no_data(ax)
            continue
        for name, start, end in spans[1:]:
            ax.axvline(start, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("RL step (cumulative across stages)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("RL training curves" + ("" if stages else f" ({NO_DATA})"))
    _save(fig, path, dpi)


def _plot_funnel(funnel: dict | None, path: Path, dpi: int) -> None:
    import matplotlib

    fig = _new_figure(14, 5.5)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    per_source = (funnel or {}).get("per_source") or {}
    steps = list((funnel or {}).get("steps") or [])
    for counts in per_source.values():
        for st in (counts or {}):
            if st not in steps:
                steps.append(st)
    if per_source and steps:
        colors = matplotlib.colormaps["tab20"].colors
        y = list(range(len(steps)))
        left = [0.0] * len(steps)
        for i, (src, counts) in enumerate(per_source.items()):
            vals = [_num((counts or {}).get(st)) or 0.0 for st in steps]
            ax1.barh(y, vals, left=left, color=colors[i % len(colors)], label=src)
            left = [a + b for a, b in zip(left, vals)]
        for yi, tot in zip(y, left):
            ax1.text(tot, yi, f" {int(tot):,}", va="center", fontsize=8)
        ax1.margins(x=0.15)
        ax1.set_yticks(y, steps)
        ax1.invert_yaxis()
        ax1.set_xlabel("problems")
        ax1.legend(fontsize=7, loc="lower right")
        ax1.grid(axis="x", alpha=0.3)
    else:
        _no_data(ax1)
    ax1.set_title("problems remaining after each step, by source")
    drops = {k: _num(v) for k, v in ((funnel or {}).get("drops") or {}).items()}
    drops = {k: v for k, v in drops.items() if v is not None}
    if drops:
        items = sorted(drops.items(), key=lambda kv: kv[1])
        ax2.barh(range(len(items)), [v for _, v in items], color="tab:red")
        for yi, (_, v) in enumerate(items):
            ax2.text(v, yi, f" {int(v):,}", va="center", fontsize=8)
        ax2.margins(x=0.15)
        ax2.set_yticks(range(len(items)), [k for k, _ in items])
        ax2.set_xlabel("problems dropped")
        ax2.grid(axis="x", alpha=0.3)
    else:
        _no_data(ax2)
    ax2.set_title("drops by reason")
    fig.suptitle("RL data funnel")
    _save(fig, path, dpi)


def _plot_eval(evals: dict[str, dict | None], benches: list[str], path: Path, dpi: int) -> None:
    import matplotlib

    fig = _new_figure(max(7, 2.2 * max(1, len(benches)) + 3), 5)
    ax = fig.subplots()
    models = {m: s for m, s in evals.items() if s and (s.get("benchmarks") or {})}
    if not models or not benches:
        _no_data(ax)
        ax.set_title("evaluation")
        _save(fig, path, dpi)
        return
    colors = matplotlib.colormaps["tab10"].colors
    n = len(models) + 1
    width = 0.8 / n
    for mi, (m, s) in enumerate(models.items()):
        xs, ys, errs = [], [], [[], []]
        for bi, b in enumerate(benches):
            e = (s.get("benchmarks") or {}).get(b)
            y = _pct(e.get("avg_at_k")) if isinstance(e, dict) else None
            if y is None:
                continue
            ci = e.get("avg_at_k_ci") or []
            lo, hi = (_pct(ci[0]), _pct(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
            xs.append(bi - 0.4 + width * (mi + 0.5))
            ys.append(y)
            errs[0].append(max(0.0, y - lo) if lo is not None else 0.0)
            errs[1].append(max(0.0, hi - y) if hi is not None else 0.0)
        if xs:
            ax.bar(xs, ys, width, yerr=errs, capsize=3, color=colors[mi % len(colors)], label=m)
            for x, y in zip(xs, ys):
                ax.text(x, y + 1, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
    ref_x, ref_y = [], []
    for bi, b in enumerate(benches):
        col = _paper_column(b)
        if col:
            ref_x.append(bi - 0.4 + width * (n - 0.5))
            ref_y.append(PAPER_TABLE3[col])
    if ref_x:
        ax.bar(ref_x, ref_y, width, color="white", edgecolor="black", hatch="//",
               label="rStar2-Agent-14B (paper Table 3)")
        for x, y in zip(ref_x, ref_y):
            ax.text(x, y + 1, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(benches)), benches)
    ax.set_ylabel("avg@k pass@1 (%)")
    ax.set_ylim(0, 110)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("evaluation: avg@k with 95% bootstrap CI")
    _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------

def run(params: dict, inputs: dict, out_dir: str) -> None:
    """Build the report.

    Args:
        params: the report config section; optional ``dpi`` (default 120) and ``title``.
        inputs: ``{"rl_stages": {"stage1": dir, ...} (any subset), "eval": {model_name: dir},
            "rl_data": dir}``; any key may be missing, any directory may lack its file.
        out_dir: e.g. ``results/report``; gets ``summary.md``, ``training_curves.png``, ``funnel.png``,
            ``eval.png`` and then ``manifest.json``.
    """
    t0 = time.time()
    params = dict(params or {})
    inputs = dict(inputs or {})
    dpi = int(params.get("dpi", 120))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    read: list[str] = []

    stage_dirs = {k: v for k, v in (inputs.get("rl_stages") or {}).items() if v}
    stages: dict[str, list[dict]] = {}
    manifests: dict[str, dict | None] = {}
    for name in sorted(stage_dirs, key=_natural_key):
        d = Path(stage_dirs[name])
        p = d / "metrics.jsonl"
        if p.is_file():
            read.append(str(p))
        stages[name] = _read_metrics(p, notes)
        manifests[name] = _read_json(d / "manifest.json", notes)

    evals: dict[str, dict | None] = {}
    for model, d in (inputs.get("eval") or {}).items():
        p = Path(d) / "summary.json" if d else None
        if p is not None and p.is_file():
            read.append(str(p))
        evals[model] = _read_json(p, notes)

    funnel = None
    if inputs.get("rl_data"):
        p = Path(inputs["rl_data"]) / "funnel.json"
        if p.is_file():
            read.append(str(p))
        funnel = _read_json(p, notes)

    lines = [f"# {params.get('title', 'rStar2-Agent reproduction report')}", ""]
    eval_lines, benches = _eval_section(evals)
    lines += eval_lines
    lines += _funnel_section(funnel)
    lines += _training_section(stages, manifests)
    lines += ["## Figures", "",
              "- `training_curves.png`: RL training curves, x = step cumulative across stages",
              "- `funnel.png`: RL data funnel and drop reasons",
              "- `eval.png`: avg@k per benchmark with bootstrap CI, beside the paper's numbers", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    atomic_write_text(out / "summary.md", "\n".join(lines))

    _plot_training(stages, out / "training_curves.png", dpi)
    _plot_funnel(funnel, out / "funnel.png", dpi)
    _plot_eval(evals, benches, out / "eval.png", dpi)

    write_manifest(out, stage="report", params=params, inputs=read, counts={
        "rl_stages": len(stages),
        "rl_steps": {k: len(v) for k, v in stages.items()},
        "models": sum(1 for s in evals.values() if s),
        "benchmarks": len(benches),
        "funnel": funnel is not None,
        "notes": len(notes),
    }, started=t0)
