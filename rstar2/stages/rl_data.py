"""Stage ``rl_candidates`` (CLI ``rstar2 rl-data``): curate the RL training problems (spec §5.3) and record
the funnel. Label verification (stages/label_verification.py, rule ``rl_data``) runs on its output.

Outputs in ``out_dir``:
    train.jsonl    one row per problem: {"id", "source", "problem", "answer" (int as str), "answer_raw"}
                   (+ "origin", "language" when the source maps them)
    funnel.json    the curation funnel (see rstar2.data.curate.curate), plus the optional "limit" step
    funnel.csv     source x step table of row counts (last row: total), then one column per drop reason
    funnel.png     the funnel as a figure (rstar2.data.funnel_plot)
    manifest.json  written last (rstar2.io.write_manifest)
"""

from __future__ import annotations

import csv
import io
import random
import time
from pathlib import Path

from ..data.benchmarks import DEFAULT_BENCHMARKS, load_benchmark
from ..data.curate import curate, format_funnel, funnel_table
from ..data.loaders import REPO_ROOT, resolve_path
from ..io import atomic_path, atomic_write_text, write_json, write_jsonl, write_manifest


def run(params: dict, out_dir: str) -> None:
    """Build ``train.jsonl`` from the configured sources, decontaminated against the configured benchmarks.

    params::

        sources                list of load_source specs (required, non-empty)
        benchmarks             {name: load_source spec}; default rstar2.data.benchmarks.DEFAULT_BENCHMARKS
        decontaminate_against  benchmark names to decontaminate against; default: all of ``benchmarks``
        ngram                  n-gram length for decontamination (default 8, the paper's)
        boilerplate_min_problems  0 (default, the paper's rule) or N: n-grams in >= N candidates are not
                               contamination (rstar2.data.curate)
        near_dedupe            {"enabled", "threshold", "num_perm", "shingle_words"} (curate.NEAR_DEDUPE_DEFAULTS)
        max_abs_answer         int, required: larger golds are dropped
        limit                  optional int: keep at most this many rows, a seeded random sample
        seed                   int (default 0): seeds the sample
        base_dir               optional: where relative paths start (default: the repository root)

    Raises:
        ValueError: no sources, no max_abs_answer, an unknown benchmark name, or an empty result; anything
            load_source raises (missing files/fields), before anything is written.
    """
    t0 = time.time()
    sources = params.get("sources") or []
    if not sources:
        raise ValueError("rl_data: params['sources'] is empty; nothing to curate")
    if params.get("max_abs_answer") is None:
        raise ValueError("rl_data: params['max_abs_answer'] is required")
    base_dir = Path(params.get("base_dir") or REPO_ROOT)
    bench_specs = _benchmark_specs(params)

    t = time.time()
    benchmarks = {name: load_benchmark(name, spec, base_dir) for name, spec in bench_specs.items()}
    _log(f"benchmarks {', '.join(f'{n}={len(r)}' for n, r in benchmarks.items())}", t)

    rows, funnel = curate(sources, benchmarks, ngram=int(params.get("ngram", 8)),
                          max_abs_answer=int(params["max_abs_answer"]), near_dedupe=params.get("near_dedupe"),
                          boilerplate_min_problems=int(params.get("boilerplate_min_problems") or 0),
                          base_dir=base_dir,
                          progress=lambda step, n, seconds: print(
                              f"[rl_data] {step:<15} {n:>7} rows  {seconds:6.2f}s", flush=True))
    if params.get("limit"):  # 0 or null = keep every curated problem
        rows = _sample(rows, int(params["limit"]), int(params.get("seed", 0)), funnel)
    if not rows:
        raise ValueError(f"rl_data: no rows survived curation; funnel: {funnel['total']}")

    out = Path(out_dir)
    t = time.time()
    write_jsonl(out / "train.jsonl", rows)
    write_funnel(out, funnel)
    _log(f"wrote {len(rows)} rows to {out / 'train.jsonl'}", t)

    inputs = [resolve_path(s, base_dir) for s in sources] + \
             [resolve_path({"name": n, **s}, base_dir) for n, s in bench_specs.items()]
    write_manifest(out, stage="rl_data", params=params, inputs=inputs, started=t0, counts={
        "rows": len(rows),
        "loaded": funnel["total"]["loaded"],
        "per_source": {src: steps[funnel["steps"][-1]] for src, steps in funnel["per_source"].items()},
        "drops": funnel["drops"],
        "decontamination": funnel["decontamination"],
    })


def write_funnel(out: Path, funnel: dict) -> None:
    """Write ``funnel.json``, ``funnel.csv`` (counts per step, then drops per reason) and ``funnel.png``, and
    print the funnel table to the log."""
    from ..data.funnel_plot import plot_funnel

    write_json(out / "funnel.json", funnel)
    atomic_write_text(out / "funnel.csv", _csv(funnel_table(funnel, with_drops=True)))
    with atomic_path(out / "funnel.png") as tmp:
        plot_funnel(funnel, tmp)
    print(format_funnel(funnel), flush=True)


def _benchmark_specs(params: dict) -> dict[str, dict]:
    """The benchmarks to decontaminate against: ``decontaminate_against`` picked from ``benchmarks``."""
    available = params.get("benchmarks") or DEFAULT_BENCHMARKS
    names = params.get("decontaminate_against")
    names = list(available) if names is None else list(names)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"rl_data: decontaminate_against names unknown benchmarks {unknown}; "
                         f"known: {sorted(available)}")
    return {n: available[n] for n in names}


def _sample(rows: list[dict], limit: int, seed: int, funnel: dict) -> list[dict]:
    """Seeded shuffle, then keep the first ``limit`` rows; recorded as a "limit" step in the funnel."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    kept = rows[:limit]
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
