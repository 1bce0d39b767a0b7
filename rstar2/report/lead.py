"""The report's first section: did RL teach the model?

Held-out accuracy of every evaluated model on the lead benchmark (by default the RL stages' held-out benchmark)
with 95% bootstrap intervals, as a table and a figure (``learning_result.png``: accuracy per model with error
bars beside the training reward across the RL stages), the share of tool calls that ran cleanly, the gain of the
final model over the SFT model in points and whether the intervals overlap, and one held-out problem answered by
the SFT model and by the final model side by side.

Inputs: each model's ``summary.json`` (``rstar2.metrics.summarise`` entries) and ``<bench>/per_problem.jsonl``
(first sample's full rollout record), and the RL stages' ``metrics.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

from .canvas import new_figure, no_data, save
from .document import Figure, Heading, Para, Table
from .inputs import interval as _ci, iter_json_lines, num, pct
from .plots import cumulative_x
from .trajectories import render

FIGURE = "learning_result.png"


def _entry(summary: dict | None, bench: str) -> dict | None:
    e = ((summary or {}).get("benchmarks") or {}).get(bench)
    return e if isinstance(e, dict) and num(e.get("avg_at_k")) is not None else None


def _fmt(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def headline(evals: dict[str, dict | None], bench: str) -> tuple[str, str, float, bool] | None:
    """(first model, last model, gain in points, intervals overlap) over the models evaluated on ``bench``, in
    the configured order (first = the SFT model in the default run, last = the final RL model); None with fewer
    than two."""
    scored = [(m, e) for m, s in evals.items() if (e := _entry(s, bench))]
    if len(scored) < 2:
        return None
    (m0, e0), (m1, e1) = scored[0], scored[-1]
    lo0, hi0 = _ci(e0)
    lo1, hi1 = _ci(e1)
    overlap = None in (lo0, hi0, lo1, hi1) or not (hi0 < lo1 or hi1 < lo0)
    return m0, m1, pct(e1["avg_at_k"]) - pct(e0["avg_at_k"]), overlap


def _pair(eval_dirs: dict[str, Path], first: str, last: str, bench: str, notes: list[str]):
    """One problem's first-sample records of the two models, preferring one the first model got wrong and the
    last got right (what RL changed), else any problem both answered."""
    rows = {}
    for m in (first, last):
        d = eval_dirs.get(m)
        path = Path(d) / bench / "per_problem.jsonl" if d else None
        rows[m] = {r.get("id"): r for r in iter_json_lines(path, notes)} if path and path.is_file() else {}
    common = [i for i in rows[first] if i in rows[last] and isinstance(rows[first][i].get("sample"), dict)
              and isinstance(rows[last][i].get("sample"), dict)]
    if not common:
        return None

    def reward(m, i):
        return num(rows[m][i]["sample"].get("reward")) or 0
    best = next((i for i in common if reward(first, i) <= 0 < reward(last, i)), common[0])
    return rows[first][best]["sample"], rows[last][best]["sample"]


def lead_section(evals: dict[str, dict | None], eval_dirs: dict[str, Path], stages: dict[str, list[dict]],
                 bench: str | None, notes: list[str]) -> list:
    """Blocks of the report's first section (empty without a lead benchmark; a one-line note when it was not
    evaluated in this run, so its absence is not silent)."""
    if not bench:
        return []
    if not any(_entry(s, bench) for s in evals.values()):
        return [Para(f"No learning result: the lead benchmark {bench!r} (report.lead_benchmark, else "
                     "rl.heldout.benchmark) was not evaluated in this run; add it to evaluate.benchmarks.")]
    blocks: list = [Heading(f"Learning result: held-out accuracy on {bench}")]
    head = headline(evals, bench)
    if head:
        m0, m1, gain, overlap = head
        blocks.append(Para(f"{m1} vs {m0}: {gain:+.1f} points; the 95% intervals "
                           f"{'overlap' if overlap else 'do not overlap'}.", strong=True))
    rows = []
    for m, s in evals.items():
        e = _entry(s, bench)
        if not e:
            continue
        lo, hi = _ci(e)
        rows.append([m, f"{_fmt(pct(e['avg_at_k']))} [{_fmt(lo)}, {_fmt(hi)}]", str(e.get("n_problems", "–")),
                     str(e.get("k", "–")), _fmt(pct(e.get("tool_ok_ratio"))), _fmt(num(e.get("mean_tool_calls")), 2),
                     _fmt(pct(e.get("truncation_ratio")))])
    blocks.append(Table(["model", "accuracy % [95% CI]", "problems", "samples", "clean tool calls %",
                         "tool calls / trajectory", "truncated %"], rows,
                        caption="avg@k on held-out problems no RL stage trained on; 95% bootstrap interval over problems"))
    blocks.append(Figure(FIGURE, "held-out accuracy per model (95% CI) and the training reward across the RL stages"))
    if head:
        pair = _pair(eval_dirs, head[0], head[1], bench, notes)
        if pair:
            blocks.append(Heading(f"One held-out problem, {head[0]} and {head[1]}", 3))
            blocks += render(f"{head[0]} · {pair[0].get('problem_id')}", pair[0])
            blocks += render(f"{head[1]} · {pair[1].get('problem_id')}", pair[1])
    return blocks


def plot_lead(evals: dict[str, dict | None], stages: dict[str, list[dict]], bench: str | None, path: Path,
              dpi: int) -> None:
    """``learning_result.png``: left, accuracy per evaluated model with 95% error bars; right, the training
    reward per RL step across all stages (cumulative steps, stage boundaries marked)."""
    fig = new_figure(12, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    scored = [(m, e) for m, s in evals.items() if bench and (e := _entry(s, bench))]
    if scored:
        ys = [pct(e["avg_at_k"]) for _, e in scored]
        cis = [_ci(e) for _, e in scored]
        err = [[y - (lo if lo is not None else y) for y, (lo, _) in zip(ys, cis)],
               [(hi if hi is not None else y) - y for y, (_, hi) in zip(ys, cis)]]
        ax1.bar(range(len(scored)), ys, yerr=err, capsize=6, color="tab:blue", alpha=0.8)
        ax1.set_xticks(range(len(scored)), [m for m, _ in scored])
        ax1.set_ylabel("held-out accuracy, %")
        ax1.set_ylim(0, 100)
        for x, y in enumerate(ys):
            ax1.text(x, y + 2, f"{y:.0f}", ha="center")
        ax1.set_title(f"{bench}: accuracy per model (95% CI)")
    else:
        no_data(ax1)
    xs, spans = cumulative_x(stages)
    drawn = False
    for name, rows in stages.items():
        pts = [(x, num(r.get("reward_mean"))) for x, r in zip(xs[name], rows) if num(r.get("reward_mean")) is not None]
        if pts:
            ax2.plot([x for x, _ in pts], [y for _, y in pts], "-o", ms=3, label=name)
            drawn = True
    for name, start, end in spans[1:]:
        ax2.axvline(start, color="0.7", ls=":")
    if drawn:
        ax2.set_xlabel("RL step (cumulative over stages)")
        ax2.set_ylabel("training reward (mean of drawn rollouts)")
        ax2.set_ylim(-0.02, 1.02)
        ax2.legend()
        ax2.set_title("training reward across RL stages")
    else:
        no_data(ax2)
    save(fig, path, dpi)
