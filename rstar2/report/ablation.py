"""The GRPO vs GRPO-RoC ablation in the report (paper §5.3, Figs. 4 and 9).

Inputs: one entry per run ``{"mode", "seed", "metrics", "heldout"}`` (``report.inputs``; the rows of the run's
``metrics.jsonl`` and ``heldout.jsonl``).

- ``ablation.png``: four panels (training reward, held-out accuracy, tool-error ratio of positive trajectories as
  in paper Fig. 4, mean response length as in Fig. 9); per mode the mean over seeds (thick), each seed (thin) and
  the seed spread (band from the lowest to the highest seed at each step); training curves are 3-step moving
  averages.
- Tables: per run and per mode (mean over seeds, 95% t-interval over seeds) the held-out accuracy at step 0 and
  at the last step, and the training reward, tool-error ratio of positives and response length averaged over the
  last third of the steps; then per seed the difference GRPO-RoC minus GRPO, with its mean and 95% interval.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .canvas import integer_steps, new_figure, no_data, save
from .document import Figure, Heading, Para, Table
from .inputs import accuracy_interval as _ci, num

PANELS = [  # (title, source, key)
    ("training reward (3-step moving average)", "metrics", "reward_mean"),
    ("held-out accuracy, %", "heldout", "accuracy"),
    ("tool-error ratio of positive trajectories (paper Fig. 4; 3-step m.a.)", "metrics", "tool_error_ratio_pos"),
    ("mean response length, tokens (paper Fig. 9; 3-step m.a.)", "metrics", "response_length_mean"),
]
SMOOTH = 3          # steps in the training curves' moving average
UNIT = (0.0, 1.0)   # accuracies, rewards and ratios: their intervals over seeds are clipped to this range
TAIL_FRACTION = 3   # end-of-run columns average the last 1/3 of the logged steps


def tail_steps(n_steps: int) -> int:
    """How many of ``n_steps`` logged steps the end-of-run columns average: ceil(n / 3), at least 1."""
    return max(1, math.ceil(n_steps / TAIL_FRACTION))


def mean_interval(values: list[float | None]) -> tuple[float, float, float] | None:
    """(mean, low, high) of the non-None ``values``: a 95% Student-t interval over seeds (low = high = mean for one
    value); None without values."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, m, m
    from scipy import stats

    half = stats.t.ppf(0.975, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half


def _smoothed(pts: list[tuple[float, float]], w: int = SMOOTH) -> list[tuple[float, float]]:
    """Each point's value replaced by the mean of the values logged at the ``w`` steps up to it (gaps allowed)."""
    return [(x, statistics.fmean(y for s, y in pts if x - w < s <= x)) for x, _ in pts]


def series(run: dict, source: str, key: str) -> list[tuple[float, float]]:
    """(step, value) points of one run and panel; None values (e.g. no positive with a call) are left out."""
    pts = [(num(r.get("step")), num(r.get(key))) for r in run[source]]
    pts = [(x, y) for x, y in pts if x is not None and y is not None]
    if source == "heldout":  # percent, as in the tables
        return [(x, 100 * y) for x, y in pts]
    return _smoothed(pts)


def plot_ablation(runs: list[dict], path: Path, dpi: int) -> None:
    """The four panels of :data:`PANELS` (module docstring)."""
    import matplotlib

    fig = new_figure(13, 8)
    axes = fig.subplots(2, 2).ravel()
    modes = sorted({str(r["mode"]) for r in runs})
    colors = dict(zip(modes, matplotlib.colormaps["tab10"].colors))
    for ax, (title, source, key) in zip(axes, PANELS):
        ax.set_title(title, fontsize=10)
        drawn = False
        for mode in modes:
            curves = [dict(c) for r in runs if str(r["mode"]) == mode if (c := series(r, source, key))]
            marker = "o" if source == "heldout" else None
            for c in curves:
                ax.plot(list(c), list(c.values()), color=colors[mode], lw=0.7, alpha=0.4, marker=marker, ms=3)
            steps = sorted({x for c in curves for x in c})
            at = [[c[x] for c in curves if x in c] for x in steps]
            if not steps:
                continue
            ax.fill_between(steps, [min(v) for v in at], [max(v) for v in at], color=colors[mode], alpha=0.15, lw=0)
            # held-out: evaluated at a few steps only, so the mean is dotted between them (nothing measured there)
            ax.plot(steps, [statistics.fmean(v) for v in at], color=colors[mode], lw=2.2, marker=marker,
                    ls=":" if source == "heldout" else "-",
                    label=f"{mode}: mean of {len(curves)} seed{'s' if len(curves) != 1 else ''}, band = seed range")
            drawn = True
        if not drawn:
            no_data(ax)
            continue
        integer_steps(ax)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("GRPO vs GRPO-RoC, same budget (thick: mean over seeds; band: lowest to highest seed; thin: one "
                 "seed)" + ("" if runs else " (no ablation runs)"))
    save(fig, path, dpi)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _tok(x) -> str:
    return "–" if x is None else f"{x:.0f}"


def _with_interval(mi, fmt, bounds: tuple[float, float] | None = None) -> str:
    """``mean [low, high]``; ``bounds`` clip the interval of a bounded quantity (a fraction: (0, 1))."""
    if mi is None:
        return "–"
    m, lo, hi = mi
    if bounds:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return fmt(m) if lo == hi else f"{fmt(m)} [{fmt(lo)}, {fmt(hi)}]"


def _signed(fmt):
    return lambda x: ("+" if x > 0 else "") + fmt(x)


def _acc_text(row: dict | None) -> str:
    if not row or num(row.get("accuracy")) is None:
        return "–"
    lo, hi = (num(v) for v in _ci(row))
    return _pct(num(row["accuracy"])) + (f" [{_pct(lo)}, {_pct(hi)}]" if lo is not None and hi is not None else "")


def _heldout_at(rows: list[dict], step) -> dict | None:
    """The held-out row logged at ``step`` (the last one if logged twice), or None."""
    found = [r for r in rows if step is not None and num(r.get("step")) == step]
    return found[-1] if found else None


def _tail_mean(rows: list[dict], key: str, n: int):
    vals = [v for v in (num(r.get(key)) for r in rows[-n:]) if v is not None]
    return statistics.fmean(vals) if vals else None


def run_stats(run: dict) -> dict | None:
    """One run's table values (fractions, tokens, seconds), or None when it logged no step. ``start`` / ``end``:
    the held-out rows at step 0 and at the last logged step (None when that evaluation is missing)."""
    m, h = run["metrics"], run["heldout"]
    if not m:
        return None
    n = tail_steps(len(m))
    last_step = max((num(x.get("step")) for x in m if num(x.get("step")) is not None), default=None)
    start, end = _heldout_at(h, 0), _heldout_at(h, last_step)
    return {"steps": len(m), "tail": n, "start": start, "end": end,
            "first": num(start.get("accuracy")) if start else None, "last": num(end.get("accuracy")) if end else None,
            "reward": _tail_mean(m, "reward_mean", n), "err": _tail_mean(m, "tool_error_ratio_pos", n),
            "len": _tail_mean(m, "response_length_mean", n),
            "wall": sum(v for v in (num(x.get("step_time_s")) for x in m) if v is not None) or None}


def ablation_section(runs: list[dict]) -> list:
    """The per-run / per-mode table, the paired GRPO-RoC minus GRPO table, warnings and the figure."""
    blocks: list = [Heading("Ablation: GRPO vs GRPO-RoC (same budget)")]
    if not runs:
        return blocks + [Para("No ablation runs configured (see configs/cpu-ablation.yaml).")]
    rows, by_mode, no_data_runs = [], {}, []
    for r in sorted(runs, key=lambda r: (str(r["mode"]), str(r["seed"]))):
        s = run_stats(r)
        if s is None:  # a run that has not logged a step yet is listed but not averaged in
            rows.append([r["mode"], str(r["seed"]), "0", "no data", "–", "–", "–", "–", "–"])
            no_data_runs.append(f"{r['mode']}-seed{r['seed']}")
            continue
        by_mode.setdefault(str(r["mode"]), {})[str(r["seed"])] = s
        rows.append([r["mode"], str(r["seed"]), f"{s['steps']} (last {s['tail']})", _acc_text(s["start"]),
                     _acc_text(s["end"]), _pct(s["reward"]), _pct(s["err"]), _tok(s["len"]),
                     "–" if s["wall"] is None else f"{s['wall'] / 60:.1f}"])
    for mode, ss in sorted(by_mode.items()):
        col = lambda k: mean_interval([s[k] for s in ss.values()])  # noqa: E731
        wall = col("wall")
        rows.append([f"**{mode} mean**", f"{len(ss)} seeds", "", _with_interval(col("first"), _pct, UNIT),
                     _with_interval(col("last"), _pct, UNIT), _with_interval(col("reward"), _pct, UNIT),
                     _with_interval(col("err"), _pct, UNIT), _with_interval(col("len"), _tok),
                     "–" if wall is None else f"{wall[0] / 60:.1f}"])
    blocks.append(Table(["mode", "seed", "steps (averaged)", "held-out acc. % at step 0 [95% CI]",
                         "held-out acc. % at the last step [95% CI]", "training reward % (last third)",
                         "tool-error ratio of positives % (last third)", "response tokens (last third)",
                         "RL wall time (min)"], rows,
                        caption="Same SFT model, data order, steps, prompts per step, kept group size G and loss "
                                "normalisation for every run; grpo_roc draws 2G rollouts per prompt and keeps G, grpo "
                                "draws and keeps G; both drop groups whose rewards are all equal. Per run the held-out "
                                "CI is a bootstrap over problems; per mode, [..] is a 95% t-interval over seeds."))
    blocks += _paired_section(by_mode)
    pairs = [(str(r["mode"]), str(r["seed"])) for r in runs]
    steps = {len(r["metrics"]) for r in runs if r["metrics"]}
    if len(set(pairs)) < len(pairs):
        blocks.append(Para("Warning: some (mode, seed) pairs appear more than once; their means count each run."))
    if no_data_runs:
        blocks.append(Para(f"Warning: no steps logged yet by {', '.join(no_data_runs)}: the mode means leave them "
                           "out."))
    if len(steps) > 1:
        blocks.append(Para(f"Warning: the runs logged different numbers of steps ({sorted(steps)}): they did not "
                           "all finish, or were not run on the same budget."))
    return blocks + [Figure("ablation.png", "GRPO vs GRPO-RoC: reward, held-out accuracy, tool errors of "
                                            "positives (Fig. 4), response length (Fig. 9); mean and seed range")]


PAIRED = [("err", "tool-error ratio of positives, points", _pct), ("len", "response tokens", _tok),
          ("last", "held-out acc. at the last step, points", _pct), ("reward", "training reward, points", _pct)]


def _paired_section(by_mode: dict[str, dict[str, dict]]) -> list:
    """GRPO-RoC minus GRPO per seed both modes ran, the mean difference with its 95% t-interval, and how many seeds
    have RoC's tool-error ratio of positives below GRPO's (in the last third of training)."""
    roc, grpo = by_mode.get("grpo_roc", {}), by_mode.get("grpo", {})
    seeds = sorted(set(roc) & set(grpo), key=lambda s: (len(s), s))
    if not seeds:
        return []
    diff = {k: [None if roc[s][k] is None or grpo[s][k] is None else roc[s][k] - grpo[s][k] for s in seeds]
            for k, _, _ in PAIRED}
    rows = [[s, *(_signed(fmt)(d[i]) if d[i] is not None else "–" for (k, _, fmt), d in
                  ((p, diff[p[0]]) for p in PAIRED))] for i, s in enumerate(seeds)]
    rows.append(["**mean [95% CI]**", *(_with_interval(mean_interval(diff[k]), _signed(fmt)) for k, _, fmt in PAIRED)])
    known = [d for d in diff["err"] if d is not None]
    mi = mean_interval(known)
    verdict = (f"GRPO-RoC's tool-error ratio of positives is lower than GRPO's in {sum(d < 0 for d in known)} of "
               f"{len(known)} seed pairs" + (f"; the 95% interval of the mean difference "
                                             f"{'excludes' if mi[2] < 0 or mi[1] > 0 else 'includes'} 0"
                                             if mi and len(known) > 1 else "") + ".")
    return [Table(["seed", *(f"Δ {name} (RoC − GRPO)" for _, name, _ in PAIRED)], rows,
                  caption="Per seed: the same data order and SFT model in both modes. Last third of the steps for "
                          "the training columns; negative Δ in the first two columns is what paper Figs. 4 and 9 "
                          "show for GRPO-RoC."), Para(verdict)]
