"""The RL data funnel as a figure (results/rl_data/funnel.png): rows left after each step by source, and the
rows dropped by reason and source. Reads only the funnel dict that curate() and the label-verification stage
write, so the report can include the PNG as is."""

from __future__ import annotations

from pathlib import Path


def plot_funnel(funnel: dict, path: str | Path, dpi: int = 120) -> None:
    """Write a two-panel PNG of ``funnel`` to ``path``.

    Left: horizontal stacked bars, one per step in ``funnel["steps"]`` (skipped steps are labelled so),
    stacked by source, with the total at the end of each bar. Right: rows dropped per reason, stacked by source.

    Args:
        funnel: ``{"steps", "per_source": {src: {step: n}}, "drops_per_source": {src: {reason: n}},
            "step_status"?: {step: "done"|"skipped"}}`` as written by rstar2.data.curate.curate.
        path: output PNG path (parent folders must exist).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or cluster nodes
    import matplotlib.pyplot as plt

    steps = list(funnel["steps"])
    status = funnel.get("step_status") or {}
    sources = list(funnel["per_source"])
    colors = matplotlib.colormaps["tab10"].colors
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.45 * max(len(steps), 6) + 2),
                                      gridspec_kw={"width_ratios": [3, 2]})

    labels = [f"{s} (skipped)" if status.get(s) == "skipped" else s for s in steps]
    offset = [0] * len(steps)
    for i, src in enumerate(sources):
        values = [funnel["per_source"][src].get(s, 0) for s in steps]
        left.barh(labels, values, left=offset, color=colors[i % len(colors)], label=src)
        offset = [a + b for a, b in zip(offset, values)]
    for y, total in enumerate(offset):
        left.text(total, y, f" {total:,}", va="center", fontsize=8)
    left.invert_yaxis()
    left.margins(x=0.15)
    left.set_xlabel("problems")
    left.set_title("problems left after each step, by source")
    left.legend(fontsize=8, loc="lower right")
    left.grid(axis="x", alpha=0.3)

    per_source_drops = funnel.get("drops_per_source") or {}
    reasons = sorted({r for d in per_source_drops.values() for r in d},
                     key=lambda r: -sum(d.get(r, 0) for d in per_source_drops.values()))
    if reasons:
        offset = [0] * len(reasons)
        for i, src in enumerate(sources):
            values = [per_source_drops.get(src, {}).get(r, 0) for r in reasons]
            right.barh(reasons, values, left=offset, color=colors[i % len(colors)])
            offset = [a + b for a, b in zip(offset, values)]
        for y, total in enumerate(offset):
            right.text(total, y, f" {total:,}", va="center", fontsize=8)
        right.invert_yaxis()
        right.margins(x=0.15)
        right.grid(axis="x", alpha=0.3)
    else:
        right.text(0.5, 0.5, "no rows dropped", ha="center", va="center", transform=right.transAxes)
    right.set_xlabel("problems dropped")
    right.set_title("drops by reason (colours: sources)")
    fig.suptitle("RL data funnel (paper §4.2)")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, format="png")  # explicit: the path may be a temporary name
    plt.close(fig)
