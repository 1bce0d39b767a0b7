"""Figures of the report, drawn on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot state, no display).

- ``training_curves.png``: the RL curves of paper Figs. 4, 8, 9 over all stages (x = step, cumulative);
- ``funnel.png``: the RL data funnel (``plot_funnel``, also what the curation stages write);
- ``eval.png``: avg@k per benchmark with bootstrap CIs beside the paper's rStar2-Agent-14B numbers.
"""

from __future__ import annotations

from pathlib import Path

from . import paper
from .canvas import NO_DATA, integer_steps, new_figure, no_data, save
from .inputs import num as _num, pct as _pct

#: Panels of training_curves.png: (title, [(metrics key, label, line style)]). A key no stage logged is skipped;
#: a panel with no key logged says "no data".
CURVE_PANELS = [
    # "accuracy" in metrics.jsonl is the share of rewards > 0: solved problems only under the answer reward
    ("reward", [("reward_mean", "reward mean", "-"), ("accuracy", "share with reward > 0", "--")]),
    ("response length (tokens)", [("response_length_mean", "mean", "-"), ("response_length_max", "max", ":")]),
    ("tool calls per trajectory", [("tool_calls_per_traj", "tool calls", "-")]),
    ("tool error ratio", [("tool_error_ratio", "all trajectories", "-"),
                          ("tool_error_ratio_pos", "positive trajectories", "--"),
                          ("tool_error_ratio_pos_kept", "kept positives (after RoC)", "-.")]),
    ("truncation ratio", [("truncation_ratio", "truncated", "-")]),
    ("all-correct / all-wrong groups", [("all_correct_frac", "all correct", "-"),
                                        ("all_wrong_frac", "all wrong", "--")]),
]


def cumulative_x(stages: dict[str, list[dict]]) -> tuple[dict[str, list[float]], list[tuple[str, float, float]]]:
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


def plot_training(stages: dict[str, list[dict]], path: Path, dpi: int):
    """One panel per entry of :data:`CURVE_PANELS`, a colour per stage, x = step cumulative across stages.
    Saves the PNG and returns the matplotlib Figure."""
    import matplotlib

    fig = new_figure(15, 8.5)
    axes = fig.subplots(2, 3).ravel()
    xs, spans = cumulative_x(stages)
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
            no_data(ax)
            continue
        for name, start, end in spans[1:]:
            ax.axvline(start, color="0.6", lw=0.8, ls=":")
        integer_steps(ax)
        ax.set_xlabel("RL step (cumulative across stages)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("RL training curves" + ("" if stages else f" ({NO_DATA})"))
    save(fig, path, dpi)
    return fig


def _stacked(ax, labels: list[str], per_source: dict[str, list[float]]) -> None:
    """Horizontal bars, one per label, stacked by source, with each bar's total at its end."""
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    left = [0.0] * len(labels)
    for i, (src, vals) in enumerate(per_source.items()):
        ax.barh(range(len(labels)), vals, left=left, color=colors[i % len(colors)], label=src)
        left = [a + b for a, b in zip(left, vals)]
    for yi, tot in enumerate(left):
        ax.text(tot, yi, f" {int(tot):,}", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.margins(x=0.15)
    ax.grid(axis="x", alpha=0.3)


def plot_funnel(funnel: dict | None, path: Path, dpi: int) -> None:
    """The RL data funnel (paper §4.2), written by the curation stages and drawn again by the report. Left: problems
    left after each step (``funnel["steps"]``; skipped steps labelled so), stacked by source, total at the end of
    each bar. Right: problems dropped per reason, stacked by source (``drops_per_source``; the totals ``drops``
    alone where a funnel has no per-source split). Missing or malformed parts give "no data" panels."""
    funnel = funnel or {}
    per_source = funnel.get("per_source") or {}
    status = funnel.get("step_status") or {}
    steps = list(funnel.get("steps") or [])
    for counts in per_source.values():
        steps += [st for st in (counts or {}) if st not in steps]
    fig = new_figure(13, 0.45 * max(len(steps), 6) + 2)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    if per_source and steps:
        _stacked(ax1, [f"{st} (skipped)" if status.get(st) == "skipped" else st for st in steps],
                 {src: [_num((c or {}).get(st)) or 0.0 for st in steps] for src, c in per_source.items()})
        ax1.set_xlabel("problems")
        ax1.legend(fontsize=7, loc="lower right")
    else:
        no_data(ax1)
    ax1.set_title("problems left after each step, by source")
    by_source = funnel.get("drops_per_source") or {"all sources": funnel.get("drops") or {}}
    totals: dict[str, float] = {}
    for d in by_source.values():
        for reason, v in (d or {}).items():
            if _num(v) is not None:
                totals[reason] = totals.get(reason, 0.0) + _num(v)
    if totals:
        reasons = sorted(totals, key=lambda r: -totals[r])
        _stacked(ax2, reasons, {src: [_num((d or {}).get(r)) or 0.0 for r in reasons] for src, d in by_source.items()})
        ax2.set_xlabel("problems dropped")
    else:
        no_data(ax2, "no rows dropped" if funnel else NO_DATA)
    ax2.set_title("drops by reason (colours: sources)")
    fig.suptitle("RL data funnel (paper §4.2)")
    save(fig, path, dpi)


def plot_eval(evals: dict[str, dict | None], benches: dict[str, str | None], path: Path, dpi: int) -> None:
    """Grouped bars of avg@k (percent) per benchmark and model with 95% CI error bars, and a hatched bar for
    the paper's rStar2-Agent-14B value where the benchmark has a paper column (``benches``: bench -> column)."""
    import matplotlib

    fig = new_figure(max(7, 2.2 * max(1, len(benches)) + 3), 5)
    ax = fig.subplots()
    models = {m: s for m, s in evals.items() if s and (s.get("benchmarks") or {})}
    if not models or not benches:
        no_data(ax)
        ax.set_title("evaluation")
        save(fig, path, dpi)
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
        ref = paper.reference(paper.OURS, benches[b]) if benches[b] else None
        if ref is not None:
            ref_x.append(bi - 0.4 + width * (n - 0.5))
            ref_y.append(ref)
    if ref_x:
        ax.bar(ref_x, ref_y, width, color="white", edgecolor="black", hatch="//",
               label="rStar2-Agent-14B (paper)")
        for x, y in zip(ref_x, ref_y):
            ax.text(x, y + 1, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(benches)), list(benches))
    ax.set_ylabel("avg@k pass@1 (%)")
    ax.set_ylim(0, 110)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("evaluation: avg@k with 95% bootstrap CI")
    save(fig, path, dpi)
