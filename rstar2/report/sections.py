"""The report's sections as document blocks: evaluation beside the paper, data funnel (the RL training summary:
``training``)."""

from __future__ import annotations

from . import paper
from .canvas import NO_DATA
from .document import Figure, Heading, Para, Table
from .inputs import benchmarks_of, interval, num, pct


#: Decontaminated problems named in the funnel section (all of them are in rl_candidates/dropped.jsonl).
SHOWN_CONTAMINATED = 20


def fmt(x, digits: int = 1) -> str:
    v = num(x)
    return "–" if v is None else f"{v:.{digits}f}"


def fmt_int(x) -> str:
    v = num(x)
    return "–" if v is None else f"{int(round(v)):,}"


def fmt_seconds(s) -> str:
    v = num(s)
    if v is None:
        return "–"
    if v < 120:
        return f"{v:.1f} s"
    if v < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.2f} h"


def _ci(e: dict) -> tuple[float | None, float | None]:
    """The 95% interval in percent; none for fewer than 2 problems, where a bootstrap over problems is a point."""
    return interval(e, min_problems=2)


def _subset(e: dict) -> str:
    """`` (n of N problems)`` when the run evaluated fewer problems than the benchmark has (evaluate.limit)."""
    n, total = num(e.get("n_problems")), num(e.get("n_available"))
    return f" ({int(n)} of {int(total)} problems)" if n is not None and total is not None and total > n else ""


def _with_ci(e: dict | None) -> str:
    if not isinstance(e, dict) or num(e.get("avg_at_k")) is None:
        return "–"
    lo, hi = _ci(e)
    txt = fmt(pct(e["avg_at_k"]))
    if lo is None and num(e.get("n_problems")) == 1:
        return txt + (_subset(e) or " (n=1)")
    return txt + (f" [{lo:.1f}, {hi:.1f}]" if lo is not None and hi is not None else "") + _subset(e)


def _problems(e: dict) -> str:
    n, total = num(e.get("n_problems")), num(e.get("n_available"))
    return fmt_int(n) + (f" of {fmt_int(total)}" if n is not None and total is not None and total > n else "")


def evaluation(evals: dict[str, dict | None]) -> list:
    """The evaluation tables: math beside the paper's Table 3 (our models, then the paper's rows in the
    columns we evaluated), generalisation beside Table 5 in the columns we evaluated (GPQA-Diamond, BFCL, IFEval),
    the per-benchmark details, the IFEval and BFCL checker metrics, and one line naming the paper's columns this
    run did not evaluate."""
    blocks: list = [Heading("Evaluation")]
    benches = benchmarks_of(evals)
    math = {b: c for b, c in benches.items() if c not in paper.TABLE5_COLUMNS}
    models = {m: s for m, s in evals.items() if s and (s.get("benchmarks") or {})}
    if not models:
        blocks.append(Para(f"Evaluation: {NO_DATA}."))
    else:
        if math:
            rows = [[m, "this run"] + [_with_ci((s.get("benchmarks") or {}).get(b)) for b in math]
                    for m, s in models.items()]
            for name, _, _ in paper.TABLE3:
                vals = [paper.reference(name, col) if col else None for col in math.values()]
                if any(v is not None for v in vals):
                    rows.append([name, "paper Table 3" if name != paper.OURS else "paper Table 3 (avg@16)"]
                                + [fmt(v) for v in vals])
            cited = len(rows) > len(models)   # a benchmark of the user's own has no paper column
            blocks.append(Table(["model", "source"] + list(math), rows,
                                caption="avg@k pass@1 in percent, with its 95% bootstrap confidence interval over "
                                        "problems for this run (k samples per problem; paper protocol: avg@16 at "
                                        "temperature 0.6, 30K tokens, 30 turns)."
                                        + (" Paper rows as reported in Table 3." if cited else "")))
        blocks += generalisation(models, benches)
        blocks += _details(models, benches)
        blocks += checker_details(models)
    done = set(benches.values()) if models else set()
    rest = [f"{', '.join(c for c in cols if c not in done)} (Table {t})"
            for t, cols in (("3", paper.TABLE3_COLUMNS), ("5", paper.TABLE5_COLUMNS)) if set(cols) - done]
    if rest:
        blocks.append(Para("Paper columns this run did not evaluate: " + "; ".join(rest) + ". The paper's numbers "
                           "for every column are in rstar2/report/paper.py."))
    return blocks


def generalisation(models: dict[str, dict], benches: dict[str, str | None]) -> list:
    """Our models beside paper Table 5, one column per Table 5 benchmark (``–``: not evaluated in this run)."""
    by_col = {c: b for b, c in benches.items() if c in paper.TABLE5_COLUMNS}
    cols = [c for c in paper.TABLE5_COLUMNS if c in by_col]
    if not cols:
        return []
    rows = [[m, "this run"] + [_with_ci((s.get("benchmarks") or {}).get(by_col[c])) for c in cols]
            for m, s in models.items()]
    rows += [[name, "paper Table 5"] + [fmt(v.get(c)) for c in cols] for name, v in paper.TABLE5]
    return [Heading("Generalisation beside paper Table 5 (%)", 3),
            Table(["model", "source"] + cols, rows,
                  caption="GPQA-Diamond: avg@k pass@1 on the option letter; BFCL: bfcl-eval's AST checker on the "
                          "single-turn Python categories evaluated here, unweighted mean over categories (the "
                          "paper's BFCL v3 overall also averages live and multi-turn categories); IFEval: lm-eval's "
                          "strict prompt-level accuracy; both greedy, one sample (paper: temperature 0). "
                          "Arena-Hard needs a GPT-4 judge and is not evaluated here.")]


def _details(models: dict[str, dict], benches: dict[str, str | None]) -> list:
    rows = []
    for m, s in models.items():
        for b, e in (s.get("benchmarks") or {}).items():
            if not isinstance(e, dict):
                continue
            lo, hi = _ci(e)
            col = benches.get(b)
            ref = paper.reference(paper.OURS, col) if col else None
            ref_len = paper.TABLE4_LENGTH[paper.OURS].get(col) if col else None
            rows.append([m, b, e.get("answer_type", "–"), _problems(e), fmt_int(e.get("k")),
                         fmt(pct(e.get("avg_at_k"))),
                         f"[{fmt(lo)}, {fmt(hi)}]" if lo is not None else
                         ("– (n=1)" if num(e.get("n_problems")) == 1 else "–"),
                         fmt(pct(e.get("pass_at_k"))), fmt(pct(e.get("maj_at_k"))),
                         fmt(e.get("mean_response_tokens")), fmt(e.get("mean_tool_calls"), 2),
                         fmt(pct(e.get("truncation_ratio"))), fmt(ref), fmt(ref_len)])
    return [Heading("Details", 3),
            Table(["model", "benchmark", "answer type", "problems", "k", "avg@k (%)", "95% CI",
                   "pass@k (%)", "maj@k (%)", "mean response tokens", "mean tool calls", "truncated (%)",
                   "paper (%)", "paper mean length"], rows,
                  caption="pass@k is the unbiased estimator over the k samples; maj@k is majority voting; for "
                          "IFEval and BFCL avg@k is the checker's headline score; paper columns: rStar2-Agent-14B "
                          "(Tables 3-5).")]


def checker_details(models: dict[str, dict]) -> list:
    """IFEval's four accuracies and BFCL's per-category accuracies, as the checkers report them."""
    blocks: list = []
    ife = [(m, b, e) for m, s in models.items() for b, e in (s.get("benchmarks") or {}).items()
           if isinstance(e, dict) and isinstance(e.get("ifeval"), dict)]
    if ife:
        blocks.append(Table(["model", "benchmark", "prompts", "prompt strict", "instruction strict",
                             "prompt loose", "instruction loose"],
                            [[m, b, fmt_int(e.get("n_problems"))] + [fmt(pct(e["ifeval"].get(k))) for k in (
                                "prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc",
                                "inst_level_loose_acc")] for m, b, e in ife],
                            caption="IFEval accuracies in percent (lm-eval's instruction checks and aggregation)."))
    bf = [(m, b, e) for m, s in models.items() for b, e in (s.get("benchmarks") or {}).items()
          if isinstance(e, dict) and isinstance(e.get("bfcl"), dict)]
    if bf:
        cats = list(dict.fromkeys(c for _, _, e in bf for c in e["bfcl"].get("by_category", {})))
        blocks.append(Table(["model", "benchmark"] + cats + ["mean"],
                            [[m, b] + [f"{fmt(pct((e['bfcl']['by_category'].get(c) or {}).get('accuracy')))} "
                                       f"(n={fmt_int((e['bfcl']['by_category'].get(c) or {}).get('n'))})"
                                       for c in cats] + [fmt(pct(e["bfcl"].get("accuracy")))] for m, b, e in bf],
                            caption="BFCL accuracy in percent per category (bfcl-eval's AST checker; irrelevance: "
                                    "no call made); mean = unweighted over categories."))
    return blocks


def funnel(funnel_: dict | None, figure: str | None) -> list:
    """The RL data funnel table (problems per source after each step), drops by reason, decontamination."""
    blocks: list = [Heading("RL data funnel")]
    if not funnel_ or not (funnel_.get("per_source") or funnel_.get("drops") or funnel_.get("decontamination")):
        return blocks + [Para(f"Data funnel: {NO_DATA}.")]
    per_source = funnel_.get("per_source") or {}
    steps = list(funnel_.get("steps") or [])
    for counts in per_source.values():
        steps += [st for st in (counts or {}) if st not in steps]
    if per_source and steps:
        sources = list(per_source)
        status = funnel_.get("step_status") or {}
        rows = []
        for st in steps:
            vals = [num((per_source[s] or {}).get(st)) for s in sources]
            total = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
            label = f"{st} (skipped: not enabled)" if status.get(st) == "skipped" else st
            rows.append([label] + [fmt_int(v) for v in vals] + [fmt_int(total)])
        blocks.append(Table(["step"] + sources + ["total"], rows))
    drops = funnel_.get("drops") or {}
    if drops:
        blocks += [Heading("Drops by reason", 3),
                   Table(["reason", "count"], [[r, fmt_int(n)] for r, n in
                                               sorted(drops.items(), key=lambda kv: -(num(kv[1]) or 0))])]
    decon = funnel_.get("decontamination") or {}
    if decon:
        blocks += [Heading("Decontamination (problems removed per benchmark)", 3),
                   Table(["benchmark", "removed"], [[b, fmt_int(n)] for b, n in decon.items()])]
    named = [r for r in funnel_.get("contaminated") or [] if isinstance(r, dict)]
    if named:
        more = f" (the first {SHOWN_CONTAMINATED} of {len(named)})" if len(named) > SHOWN_CONTAMINATED else ""
        blocks.append(Table(["problem id", "source", "shares an n-gram with", "problem (start)"],
                            [[r.get("id"), r.get("source"), ", ".join(r.get("benchmarks") or []), r.get("problem")]
                             for r in named[:SHOWN_CONTAMINATED]],
                            caption=f"The problems decontamination removed{more}."))
    if drops:
        blocks.append(Para("Every dropped row, with its step and reason: results/rl_candidates/dropped.jsonl "
                           "(curation) and results/rl_data/dropped.jsonl (prompt length, label verification)."))
    if figure:
        blocks.append(Figure(figure, "RL data funnel"))
    return blocks
