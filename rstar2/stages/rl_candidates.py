"""Stage ``rl_candidates`` (rule and CLI ``rstar2 rl-candidates``): curate the RL training problems (paper §4.2)
and record the funnel. Stage ``rl_data`` (stages/rl_data.py: prompt length, label verification) runs on its
output.

Outputs in ``out_dir``:
    train.jsonl    one row per problem: {"id", "source", "problem", "answer" (int as str for integer sources),
                   "answer_raw", "answer_type" (the source's: integer, math or choice)}
                   (+ "origin", "language" when the source maps them)
    funnel.json    the curation funnel (see rstar2.data.curate.curate), plus the optional "limit" step
    dropped.jsonl  every row the funnel dropped: {"id", "source", "step", "reason", "answer_raw"} (+ "kept" for a
                   duplicate, "benchmarks" for a contaminated row); rstar2.data.drop_checks refuses a source that
                   loses more than rl_data.max_filtered_share of its rows to its answer-type filter
    funnel.csv     source x step table of row counts (last row: total), then one column per drop reason
    funnel.png     the funnel as a figure (rstar2.report.plots.plot_funnel, the report's own)
    manifest.json  written last (rstar2.io.write_manifest)
"""

from __future__ import annotations

import csv
import io
import random
import time
from pathlib import Path

from ..data.benchmarks import load_benchmark
from ..data.curate import curate, format_funnel, funnel_table
from ..data.drop_checks import check_answer_filter
from ..data.loaders import WORKING_DIR, resolve_path
from ..io import atomic_write_text, write_json, write_jsonl, write_manifest
from ..params import to_dict
from .params import RLDataParams, parse


def run(params: dict, out_dir: str) -> None:
    """Build ``train.jsonl`` from the configured sources, decontaminated against the configured benchmarks.

    params: ``rstar2.stages.params.RLDataParams`` or its JSON dict: sources (load_source specs, non-empty),
        benchmarks ({name: spec}, the ones decontaminated against), decontaminate_against, ngram,
        boilerplate_min_problems, near_dedupe, max_abs_answer, limit (0 = all; else a seeded random sample), seed.
        Relative paths start at the working directory (the folder snakemake runs in).

    Raises:
        ValueError: no sources, no max_abs_answer, an unknown benchmark name, or an empty result; a source that
            loses more than max_filtered_share of its rows to its answer-type filter (drop_checks); anything
            load_source raises (missing files/fields), before anything is written.
    """
    t0 = time.time()
    p = parse(RLDataParams, params, "rl_data params")
    sources = p.sources
    if not sources:
        raise ValueError("rl_data: params['sources'] is empty; nothing to curate")
    base_dir = WORKING_DIR
    bench_specs = _benchmark_specs(p)

    t = time.time()
    benchmarks = {name: load_benchmark(name, spec, base_dir) for name, spec in bench_specs.items()}
    _log(f"benchmarks {', '.join(f'{n}={len(r)}' for n, r in benchmarks.items())}", t)

    dropped: list[dict] = []
    rows, funnel = curate(sources, benchmarks, ngram=p.ngram, max_abs_answer=p.max_abs_answer,
                          near_dedupe=to_dict(p.near_dedupe), boilerplate_min_problems=p.boilerplate_min_problems,
                          base_dir=base_dir, dropped=dropped,
                          progress=lambda step, n, seconds: print(
                              f"[rl_data] {step:<15} {n:>7} rows  {seconds:6.2f}s", flush=True))
    for line in check_answer_filter(funnel, sources, p.max_filtered_share):  # refuses a source above its share
        print(line, flush=True)
    if p.limit:  # 0 = keep every curated problem
        rows = _sample(rows, p.limit, p.seed, funnel, dropped)
    if not rows:
        raise ValueError(f"rl_data: no rows survived curation; funnel: {funnel['total']}")

    out = Path(out_dir)
    t = time.time()
    write_jsonl(out / "train.jsonl", rows)
    write_jsonl(out / "dropped.jsonl", dropped)
    write_funnel(out, funnel)
    _log(f"wrote {len(rows)} rows to {out / 'train.jsonl'}", t)

    inputs = [resolve_path(s, base_dir) for s in sources] + \
             [resolve_path({"name": n, **s}, base_dir) for n, s in bench_specs.items()]
    write_manifest(out, stage="rl_data", params=to_dict(p), inputs=inputs, started=t0, counts={
        "rows": len(rows),
        "loaded": funnel["total"]["loaded"],
        "per_source": {src: steps[funnel["steps"][-1]] for src, steps in funnel["per_source"].items()},
        "drops": funnel["drops"],
        "decontamination": funnel["decontamination"],
    })


def write_funnel(out: Path, funnel: dict) -> None:
    """Write ``funnel.json``, ``funnel.csv`` (counts per step, then drops per reason) and ``funnel.png``, and
    print the funnel table to the log."""
    from ..report.plots import plot_funnel

    write_json(out / "funnel.json", funnel)
    atomic_write_text(out / "funnel.csv", _csv(funnel_table(funnel, with_drops=True)))
    plot_funnel(funnel, out / "funnel.png", dpi=120)
    print(format_funnel(funnel), flush=True)


def _benchmark_specs(p: RLDataParams) -> dict[str, dict]:
    """The benchmarks to decontaminate against: ``decontaminate_against`` picked from ``benchmarks``."""
    available, names = p.benchmarks, list(p.decontaminate_against)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"rl_data: decontaminate_against names unknown benchmarks {unknown}; "
                         f"known: {sorted(available)}")
    return {n: available[n] for n in names}


def _sample(rows: list[dict], limit: int, seed: int, funnel: dict, dropped: list[dict]) -> list[dict]:
    """Seeded shuffle, then keep the first ``limit`` rows; recorded as a "limit" step in the funnel, the others
    listed in ``dropped`` (reason over_limit)."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    kept = rows[:limit]
    dropped += [{"id": r["id"], "source": r["source"], "step": "limit", "reason": "over_limit",
                 "answer_raw": r.get("answer_raw")} for r in rows[limit:]]
    funnel["steps"].append("limit")
    funnel.setdefault("step_status", {})["limit"] = "done"
    for src, per_step in funnel["per_source"].items():
        per_step["limit"] = sum(r["source"] == src for r in kept)
    funnel["total"]["limit"] = len(kept)
    if len(rows) > len(kept):
        funnel["drops"]["over_limit"] = len(rows) - len(kept)
    return kept


def _csv(table: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(table)
    return buf.getvalue()


def _log(message: str, started: float) -> None:
    print(f"[rl_data] {message}  {time.time() - started:6.2f}s", flush=True)
