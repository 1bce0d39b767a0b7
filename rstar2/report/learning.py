"""Learning curves and the GRPO vs GRPO-RoC ablation in the report (issue 9; paper §5.3, Figs. 4 and 9).

Inputs are the RL stage folders' ``heldout.jsonl`` (held-out accuracy with its 95% interval at fixed steps,
``rstar2.rl.heldout``) and ``metrics.jsonl`` (per-step reward, tool-error ratio of positive trajectories,
response length), for the pipeline's own stages and for every ablation run ``{"mode", "seed", "dir"}``.

- ``learning_curve.png``: held-out accuracy against RL step with 95% intervals, one line per stage;
- ``ablation.png``: four panels (training reward, held-out accuracy, tool-error ratio among positive
  trajectories, mean response length), one thin line per run and a thick line for each mode's mean over seeds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .canvas import new_figure, no_data, save
from .document import Figure, Heading, Para, Table
from .inputs import num

ABLATION_PANELS = [  # (title, metrics source, key)
    ("training reward (mean per step, 5-step moving average)", "metrics", "reward_mean"),
    ("held-out accuracy, %", "heldout", "accuracy"),
    ("tool-error ratio, positive trajectories (paper Fig. 4)", "metrics", "tool_error_ratio_pos"),
    ("mean response length, tokens (paper Fig. 9)", "metrics", "response_length_mean"),
]


def _moving_average(ys: list[float], w: int = 5) -> list[float]:
    return [statistics.fmean(ys[max(0, i - w + 1):i + 1]) for i in range(len(ys))]


def _series(run: dict, source: str, key: str) -> list[tuple[float, float]]:
    pts = [(num(r.get("step")), num(r.get(key))) for r in run[source]]
    pts = [(x, y) for x, y in pts if x is not None and y is not None]
    if source == "metrics" and key == "reward_mean" and pts:
        pts = list(zip([x for x, _ in pts], _moving_average([y for _, y in pts])))
    if source == "heldout":  # percent, as in learning_curve.png and the tables
        pts = [(x, 100 * y) for x, y in pts]
    return pts


def plot_learning(heldout: dict[str, list[dict]], path: Path, dpi: int) -> None:
    """Held-out accuracy per evaluation step with its 95% interval as error bars, one series per RL stage."""
    fig = new_figure(7, 4.5)
    ax = fig.subplots()
    drawn = False
    for name, rows in heldout.items():
        pts = [(num(r.get("step")), num(r.get("accuracy")), _ci(r)) for r in rows]
        pts = [(x, y, ci) for x, y, ci in pts if x is not None and y is not None]
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [100 * p[1] for p in pts]
        lo = [100 * (num(p[2][0]) if num(p[2][0]) is not None else p[1]) for p in pts]
        hi = [100 * (num(p[2][1]) if num(p[2][1]) is not None else p[1]) for p in pts]
        # error bars at the evaluated steps only, joined by dotted lines: nothing was measured in between
        line = ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]], fmt="o",
                           capsize=4, label=name)
        ax.plot(xs, ys, ":", color=line[0].get_color())
        drawn = True
    if not drawn:
        no_data(ax, "no held-out evaluation during RL")
    else:
        ax.set_xlabel("RL step (step 0 = the SFT model; dotted: joins evaluations, not measured between them)")
        ax.set_ylabel("held-out accuracy, % (95% CI)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Held-out accuracy during RL")
    save(fig, path, dpi)


def plot_ablation(runs: list[dict], path: Path, dpi: int) -> None:
    """Four panels (:data:`ABLATION_PANELS`): each run thin, each mode's mean over its seeds thick."""
    import matplotlib

    fig = new_figure(13, 8)
    axes = fig.subplots(2, 2).ravel()
    modes = sorted({r["mode"] for r in runs})
    colors = dict(zip(modes, matplotlib.colormaps["tab10"].colors))
    for ax, (title, source, key) in zip(axes, ABLATION_PANELS):
        ax.set_title(title, fontsize=10)
        drawn = False
        for mode in modes:
            curves = [dict(_series(r, source, key)) for r in runs if r["mode"] == mode]
            curves = [c for c in curves if c]
            for r in (r for r in runs if r["mode"] == mode):
                pts = _series(r, source, key)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[mode], lw=0.8, alpha=0.45,
                            marker="." if source == "heldout" else None)
            common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if common:
                ax.plot(common, [statistics.fmean(c[x] for c in curves) for x in common], color=colors[mode],
                        lw=2.2, marker="o" if source == "heldout" else None,
                        label=f"{mode} (mean of {len(curves)} seed{'s' if len(curves) > 1 else ''})")
                drawn = True
        if not drawn:
            no_data(ax)
            continue
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("GRPO vs GRPO-RoC, same budget (thin: one seed; thick: mean over seeds)"
                 + ("" if runs else " (no ablation runs)"))
    save(fig, path, dpi)


def _fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _ci(row: dict) -> tuple:
    """(lo, hi) of a held-out row's ``accuracy_ci`` as given, or (None, None) when it is not a pair."""
    ci = row.get("accuracy_ci")
    return tuple(ci[:2]) if isinstance(ci, list) and len(ci) >= 2 else (None, None)


def _ci_text(row: dict | None) -> str:
    if not row or num(row.get("accuracy")) is None:
        return "–"
    lo, hi = _ci(row)
    ci = f" [{_fmt_pct(num(lo))}, {_fmt_pct(num(hi))}]" if num(lo) is not None and num(hi) is not None else ""
    return f"{_fmt_pct(num(row['accuracy']))}{ci}"


TAIL = 10  # steps averaged for the ablation table's end-of-run columns


def _heldout_at(rows: list[dict], step) -> dict | None:
    """The held-out row logged at ``step`` (the last one if logged twice), or None."""
    found = [r for r in rows if step is not None and num(r.get("step")) == step]
    return found[-1] if found else None


def _tail_mean(rows: list[dict], key: str, n: int = TAIL):
    vals = [v for v in (num(r.get(key)) for r in rows[-n:]) if v is not None]
    return statistics.fmean(vals) if vals else None


def learning_section(heldout: dict[str, list[dict]]) -> list:
    """A table of every held-out evaluation (step, n, accuracy with CI, tool use) per stage, and the figure."""
    blocks: list = [Heading("Held-out accuracy during RL")]
    rows = []
    for name, hs in heldout.items():
        for r in hs:
            length = num(r.get("response_length_mean"))
            rows.append([name, str(r.get("step", "–")), str(r.get("n_problems") or "–"), _ci_text(r),
                         _fmt_pct(num(r.get("tool_use_ratio"))), _fmt_pct(num(r.get("tool_ok_ratio"))),
                         "–" if length is None else f"{length:.0f}"])
    if not rows:
        return blocks + [Para("No held-out evaluation during RL was found (no heldout.jsonl in the RL stage folders; "
                              "set rl.heldout.benchmark to run one).")]
    blocks.append(Table(["stage", "step", "problems", "accuracy % [95% CI]", "trajectories calling the tool %",
                         "tool calls that ran cleanly %", "mean response tokens"], rows,
                        caption="Step 0 is the model the stage starts from. CIs are 95% bootstrap intervals over "
                                "problems."))
    return blocks + [Figure("learning_curve.png", "Held-out accuracy during RL, 95% CI")]


def ablation_section(runs: list[dict]) -> list:
    """One row per ablation run and one per mode (means over seeds), and the ablation figure."""
    blocks: list = [Heading("Ablation: GRPO vs GRPO-RoC (same budget)")]
    if not runs:
        return blocks + [Para("No ablation runs configured (see configs/cpu-ablation.yaml).")]
    window = min(TAIL, max((len(r["metrics"]) for r in runs), default=0)) or TAIL
    rows, by_mode, no_data = [], {}, []
    for r in sorted(runs, key=lambda r: (str(r["mode"]), str(r["seed"]))):
        h, m = r["heldout"], r["metrics"]
        if not m:  # a run that has not logged a step yet is listed but not averaged in
            rows.append([r["mode"], str(r["seed"]), "0", "no data", "–", "–", "–", "–", "–"])
            no_data.append(f"{r['mode']}-seed{r['seed']}")
            continue
        # start = the evaluation at step 0, end = the one at the run's last logged step: a run whose last
        # evaluation is missing shows "–" there instead of an earlier step's accuracy
        last_step = max((num(x.get("step")) for x in m if num(x.get("step")) is not None), default=None)
        start, end = _heldout_at(h, 0), _heldout_at(h, last_step)
        stats = {"first": num(start.get("accuracy")) if start else None,
                 "last": num(end.get("accuracy")) if end else None,
                 "reward": _tail_mean(m, "reward_mean", window), "err": _tail_mean(m, "tool_error_ratio_pos", window),
                 "len": _tail_mean(m, "response_length_mean", window),
                 "wall": sum(v for v in (num(x.get("step_time_s")) for x in m) if v is not None) or None}
        by_mode.setdefault(r["mode"], []).append(stats)
        rows.append([r["mode"], str(r["seed"]), str(len(m)), _ci_text(start), _ci_text(end), _fmt_pct(stats["reward"]),
                     _fmt_pct(stats["err"]), "–" if stats["len"] is None else f"{stats['len']:.0f}",
                     "–" if stats["wall"] is None else f"{stats['wall'] / 60:.1f}"])

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None
    for mode, ss in sorted(by_mode.items()):
        rows.append([f"**{mode} mean**", f"{len(ss)} seeds", "", _fmt_pct(mean(s["first"] for s in ss)),
                     _fmt_pct(mean(s["last"] for s in ss)), _fmt_pct(mean(s["reward"] for s in ss)),
                     _fmt_pct(mean(s["err"] for s in ss)),
                     "–" if mean(s["len"] for s in ss) is None else f"{mean(s['len'] for s in ss):.0f}",
                     "–" if mean(s["wall"] for s in ss) is None else f"{mean(s['wall'] for s in ss) / 60:.1f}"])
    blocks.append(Table(["mode", "seed", "steps", "held-out acc. % at step 0", "held-out acc. % at the last step",
                         f"reward % (last {window} steps)", f"tool-error ratio of positives % (last {window})",
                         f"response tokens (last {window})", "RL wall time (min)"], rows,
                        caption="Same SFT model, data order, steps, prompts per step and kept group size G for every "
                                "run; grpo_roc draws 2G rollouts per prompt and keeps G, grpo draws G. Reported as "
                                "measured, with no tuning per mode."))
    pairs = [(str(r["mode"]), str(r["seed"])) for r in runs]
    steps = {len(r["metrics"]) for r in runs if r["metrics"]}
    if len(set(pairs)) < len(pairs):
        blocks.append(Para("Warning: some (mode, seed) pairs appear more than once; their means count each run."))
    if no_data:
        blocks.append(Para(f"Warning: no steps logged yet by {', '.join(no_data)}: the mode means leave them out."))
    if len(steps) > 1:
        blocks.append(Para(f"Warning: the runs logged different numbers of steps ({sorted(steps)}): they did not "
                           "all finish, or were not run on the same budget."))
    return blocks + [Figure("ablation.png", "GRPO vs GRPO-RoC: reward, held-out accuracy, tool errors of "
                                            "positives, response length")]
