"""The report's first section: did RL teach the model?

Accuracy of every evaluated model on the lead benchmark (``choose_lead``: report.lead_benchmark, else the RL stages'
held-out benchmark if evaluated, else the first benchmark evaluated; the section says which and why) with 95%
bootstrap intervals, as a table and a figure (``learning_result.png``: accuracy per model with error bars beside
the training reward across the RL stages), the share of tool calls that ran cleanly, the gain of the final model
over the SFT model in points and whether the intervals overlap, one problem answered by the SFT model and by the
final model side by side, and the benchmark problem by problem (``lead_per_problem.csv``).

Inputs: each model's ``summary.json`` (``rstar2.metrics.summarise`` entries) and ``<bench>/per_problem.jsonl``
(first sample's full rollout record), and the RL stages' ``metrics.jsonl``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..io import atomic_write_text
from .canvas import integer_steps, new_figure, no_data, save
from .document import Figure, Heading, Para, Table
from .inputs import interval as _ci, iter_json_lines, num, pct
from .plots import cumulative_x
from .trajectories import render, written

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


#: Benchmarks checked on whole responses (not graded answers): a lead only when nothing else was evaluated.
_CHECKED = ("ifeval", "bfcl")
#: Per-problem rows of the lead benchmark shown in the summary; all of them go to PER_PROBLEM.
SHOWN_PROBLEMS = 30
PER_PROBLEM = "lead_per_problem.csv"


def evaluated(evals: dict[str, dict | None]) -> list[str]:
    """The benchmarks some model was evaluated on, in the order of the evaluations (evaluate.benchmarks)."""
    return list(dict.fromkeys(b for s in evals.values() for b in ((s or {}).get("benchmarks") or {})
                              if _entry(s, b)))


def choose_lead(evals: dict[str, dict | None], preferred: str | None) -> tuple[str | None, str]:
    """The benchmark the report leads with, and one sentence saying which and why: ``preferred``
    (report.lead_benchmark, else rl.heldout.benchmark: ``ReportParams.lead_benchmark``) if this run evaluated it,
    else the first evaluated benchmark graded on answers (IFEval and BFCL only when nothing else was). A preferred
    one that was not evaluated is named, with the keys that change the choice."""
    done = evaluated(evals)
    if not done:
        return None, ("No learning result: this run evaluated no model on any benchmark (evaluate.models, "
                      "evaluate.benchmarks).")
    keys = "report.lead_benchmark (else rl.heldout.benchmark)"
    if preferred in done:
        return preferred, f"Lead benchmark {preferred}: {keys}."
    kinds = {b: e.get("answer_type") for s in evals.values() for b, e in ((s or {}).get("benchmarks") or {}).items()}
    first = next((b for b in done if kinds.get(b) not in _CHECKED), done[0])
    if preferred:
        return first, (f"Lead benchmark {first}: the first benchmark this run evaluated; {keys} names "
                       f"{preferred!r}, which this run did not evaluate (it evaluated {', '.join(done)}): set "
                       f"report.lead_benchmark to one of those, or add {preferred!r} to evaluate.benchmarks.")
    return first, (f"Lead benchmark {first}: the first benchmark this run evaluated (report.lead_benchmark chooses "
                   f"another: {', '.join(done)}).")


def _problems(e: dict) -> str:
    """``n`` or ``n of N`` problems: a run that evaluated fewer than the benchmark has says so."""
    n, total = num(e.get("n_problems")), num(e.get("n_available"))
    if n is None:
        return "–"
    return f"{int(n)} of {int(total)}" if total is not None and total > n else str(int(n))


def per_problem(eval_dirs: dict[str, Path], models: list[str], bench: str, notes: list[str]) -> tuple[list, list]:
    """(header, rows) of the lead benchmark's problems: id, gold as written, then per model its first answer and
    how many of its samples were correct."""
    by_model = {m: {r.get("id"): r for r in iter_json_lines(Path(eval_dirs[m]) / bench / "per_problem.jsonl", notes)}
                for m in models if m in eval_dirs}
    ids = list(dict.fromkeys(i for rows in by_model.values() for i in rows))
    header = ["problem", "gold"] + [f"{m}: {what}" for m in by_model for what in ("answer", "correct")]
    rows = []
    for i in ids:
        found = [r for r in (rows_.get(i) for rows_ in by_model.values()) if r]
        gold = next((g for r in found if (g := r.get("answer", (r.get("sample") or {}).get("gold"))) is not None), None)
        row = [str(i), written(gold) if gold is not None else "–"]
        for m, rows_ in by_model.items():
            r = rows_.get(i) or {}
            sample = r.get("sample") if isinstance(r.get("sample"), dict) else {}
            preds = r.get("preds") or ([sample["pred"]] if "pred" in sample else [])
            rewards = [num(x) or 0 for x in r.get("rewards") or ([sample["reward"]] if "reward" in sample else [])]
            row += [written(preds[0]) if preds else "–",
                    f"{sum(x > 0 for x in rewards)}/{len(rewards)}" if rewards else "–"]
        rows.append(row)
    return header, rows


def lead_section(evals: dict[str, dict | None], eval_dirs: dict[str, Path], stages: dict[str, list[dict]],
                 bench: str | None, notes: list[str], why: str | None = None, out: Path | None = None) -> list:
    """Blocks of the report's first section (empty without a lead benchmark; a one-line note when it was not
    evaluated in this run, so its absence is not silent). ``why``: ``choose_lead``'s sentence, shown first.
    ``out``: where the lead benchmark's per-problem table is written whole (``PER_PROBLEM``)."""
    if not bench:
        return [Para(why)] if why else []
    if not any(_entry(s, bench) for s in evals.values()):
        done = evaluated(evals)
        return [Para(f"No learning result: the lead benchmark {bench!r} was not evaluated in this run"
                     + (f" (it evaluated {', '.join(done)}): set report.lead_benchmark to one of those, or add "
                        f"{bench!r} to evaluate.benchmarks." if done else "; add it to evaluate.benchmarks."))]
    blocks: list = [Heading(f"Learning result: accuracy on {bench}")]
    if why:
        blocks.append(Para(why))
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
        rows.append([m, f"{_fmt(pct(e['avg_at_k']))} [{_fmt(lo)}, {_fmt(hi)}]", _problems(e),
                     str(e.get("k", "–")), _fmt(pct(e.get("tool_ok_ratio"))), _fmt(num(e.get("mean_tool_calls")), 2),
                     _fmt(pct(e.get("truncation_ratio")))])
    blocks.append(Table(["model", "accuracy % [95% CI]", "problems", "samples", "clean tool calls %",
                         "tool calls / trajectory", "truncated %"], rows,
                        caption=f"avg@k on {bench}; 95% bootstrap interval over problems; problems: evaluated "
                                "(of the benchmark's, where evaluate.limit took fewer)"))
    blocks.append(Figure(FIGURE, f"{bench}: accuracy per model (95% CI) and the training reward across the RL stages"))
    header, table = per_problem(eval_dirs, [m for m, s in evals.items() if _entry(s, bench)], bench, notes)
    if table:
        if out is not None:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows([header] + table)
            atomic_write_text(Path(out) / PER_PROBLEM, buf.getvalue())
        more = f"; all {len(table)} in {PER_PROBLEM}" if len(table) > SHOWN_PROBLEMS else ""
        blocks.append(Table(header, table[:SHOWN_PROBLEMS],
                            caption=f"{bench}, problem by problem: the gold as written, each model's first answer "
                                    f"and its correct samples{more}"))
    if head:
        pair = _pair(eval_dirs, head[0], head[1], bench, notes)
        if pair:
            blocks.append(Heading(f"One problem of {bench}, {head[0]} and {head[1]}", 3))
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
        ax1.set_ylabel(f"{bench} accuracy, %")
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
        integer_steps(ax2)
        ax2.set_xlabel("RL step (cumulative over stages)")
        ax2.set_ylabel("training reward (mean of drawn rollouts)")
        ax2.set_ylim(-0.02, 1.02)
        ax2.legend()
        ax2.set_title("training reward across RL stages")
    else:
        no_data(ax2)
    save(fig, path, dpi)
