"""Learning curves in the report, and the entry points of the GRPO vs GRPO-RoC ablation's figure and
tables, which live in :mod:`.ablation` (paper §5.3, Figs. 4 and 9).

Inputs are the RL stage folders' ``heldout.jsonl`` (held-out accuracy with its 95% interval at fixed steps,
``rstar2.rl.heldout``).

- ``learning_curve.png``: held-out accuracy against RL step with 95% intervals, one line per stage.
"""

from __future__ import annotations

from pathlib import Path

from .ablation import ablation_section, plot_ablation  # noqa: F401  (the report stage's ablation entry points)
from .canvas import integer_steps, new_figure, no_data, save
from .document import Figure, Heading, Para, Table
from .inputs import accuracy_interval as _ci, num

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
        integer_steps(ax)
        ax.set_xlabel("RL step (step 0 = the SFT model; dotted: joins evaluations, not measured between them)")
        ax.set_ylabel("held-out accuracy, % (95% CI)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Held-out accuracy during RL")
    save(fig, path, dpi)


def _fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _ci_text(row: dict | None) -> str:
    if not row or num(row.get("accuracy")) is None:
        return "–"
    lo, hi = _ci(row)
    ci = f" [{_fmt_pct(num(lo))}, {_fmt_pct(num(hi))}]" if num(lo) is not None and num(hi) is not None else ""
    return f"{_fmt_pct(num(row['accuracy']))}{ci}"


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
