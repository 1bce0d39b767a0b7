"""RL data curation funnel (spec §5.3): integer answers, exact dedupe, 8-gram decontamination.

Steps, in order, each counted per source:

    loaded          rows returned by load_source (after the spec's filters/limit)
    integer_answer  the gold normalises to an integer (answers.classify_integer_answer), and there is a problem
    dedupe          first occurrence of each whitespace/case-normalised problem text wins (across sources,
                    in the order the sources are given)
    decontaminate   no word 8-gram shared with any benchmark problem (the paper's rule, P§5.1)

Every dropped row is counted under a reason: no_problem, no_answer, tuple_or_list, non_integer_number,
not_a_number, too_large, duplicate, contaminated.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

from rstar2.data.answers import OK, classify_integer_answer
from rstar2.data.loaders import REPO_ROOT, load_source

STEPS = ["loaded", "integer_answer", "dedupe", "decontaminate"]
# Anything that is not a letter or digit separates tokens; "_" too (it is in \w).
_NON_ALNUM = re.compile(r"[\W_]+")

Progress = Callable[[str, int, float], None]


def curate(sources: list[dict], benchmarks: dict[str, list[dict]], *, ngram: int = 8,
           max_abs_answer: int, base_dir: Path | str = REPO_ROOT,
           progress: Progress | None = None) -> tuple[list[dict], dict]:
    """Run the funnel over ``sources`` (load_source specs) against ``benchmarks`` (name -> rows with "problem").

    Args:
        ngram: decontamination n-gram length in words.
        max_abs_answer: golds with a larger magnitude are dropped ("too_large").
        progress: optional callback ``(step, rows_after_step, seconds_for_step)``.

    Returns:
        (rows, funnel). rows: ``{"id", "source", "problem", "answer" (normalised int as str), "answer_raw"}``
        in source order. funnel: ``{"steps", "per_source": {src: {step: n}}, "total": {step: n},
        "drops": {reason: n}, "drops_per_source": {src: {reason: n}}, "decontamination": {bench: n},
        "duplicate_answer_conflicts": n, "ngram": n, "benchmark_sizes": {bench: n}}``.
        A contaminated row is counted once in "drops" but under every benchmark it overlaps in
        "decontamination".

    Raises:
        ValueError: two sources share a name; anything load_source raises.
    """
    names = [spec.get("name") for spec in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"source names must be unique, got {names}")
    funnel = _empty_funnel(names, benchmarks, ngram)
    notify = progress or (lambda step, n, seconds: None)

    t = time.time()
    rows = [row for spec in sources for row in load_source(spec, base_dir)]
    _record(funnel, "loaded", rows)
    notify("loaded", len(rows), time.time() - t)

    stages = [
        ("integer_answer", lambda rs: keep_integer_answers(rs, max_abs_answer, funnel)),
        ("dedupe", lambda rs: dedupe(rs, funnel)),
        ("decontaminate", lambda rs: decontaminate(rs, benchmarks, ngram, funnel)),
    ]
    for step, apply in stages:
        t = time.time()
        rows = apply(rows)
        _record(funnel, step, rows)
        notify(step, len(rows), time.time() - t)

    funnel["drops"] = dict(funnel["drops"])
    funnel["drops_per_source"] = {s: dict(c) for s, c in funnel["drops_per_source"].items()}
    out = [{"id": r["id"], "source": r["source"], "problem": r["problem"], "answer": r["answer"],
            "answer_raw": r["answer_raw"]} for r in rows]
    return out, funnel


def keep_integer_answers(rows: list[dict], max_abs: int, funnel: dict) -> list[dict]:
    """Keep rows with a problem and an integer gold; add ``answer`` (str of the int) to kept rows."""
    kept = []
    for row in rows:
        if not row["problem"]:
            _drop(funnel, row, "no_problem")
            continue
        value, reason = classify_integer_answer(row["answer_raw"], max_abs)
        if reason != OK:
            _drop(funnel, row, reason)
            continue
        kept.append({**row, "answer": str(value)})
    return kept


def dedupe(rows: list[dict], funnel: dict) -> list[dict]:
    """Drop exact duplicates of the normalised problem text; the first occurrence wins.

    A duplicate whose gold differs from the kept one is also counted in ``duplicate_answer_conflicts``
    (a sign of label noise; the kept label is the first source's).
    """
    first_answer: dict[str, str] = {}
    kept = []
    for row in rows:
        key = problem_key(row["problem"])
        if key in first_answer:
            _drop(funnel, row, "duplicate")
            if first_answer[key] != row["answer"]:
                funnel["duplicate_answer_conflicts"] += 1
            continue
        first_answer[key] = row["answer"]
        kept.append(row)
    return kept


def decontaminate(rows: list[dict], benchmarks: dict[str, list[dict]], n: int, funnel: dict) -> list[dict]:
    """Drop rows sharing any word n-gram with any benchmark problem; count drops per benchmark."""
    index = benchmark_ngram_index(benchmarks, n)
    bench_names = list(benchmarks)
    kept = []
    for row in rows:
        hits = 0  # bitmask over bench_names
        for gram in ngram_hashes(row["problem"], n):
            hits |= index.get(gram, 0)
        if not hits:
            kept.append(row)
            continue
        _drop(funnel, row, "contaminated")
        for bit, bench in enumerate(bench_names):
            if hits >> bit & 1:
                funnel["decontamination"][bench] += 1
    return kept


def benchmark_ngram_index(benchmarks: dict[str, list[dict]], n: int) -> dict[int, int]:
    """Map every n-gram hash of every benchmark problem to a bitmask of the benchmarks containing it.

    ~60k entries for the four bundled benchmarks: small, and one dict lookup per training n-gram.
    """
    index: dict[int, int] = {}
    for bit, rows in enumerate(benchmarks.values()):
        for row in rows:
            for gram in ngram_hashes(row["problem"], n):
                index[gram] = index.get(gram, 0) | (1 << bit)
    return index


def tokens(text: str) -> list[str]:
    """Lowercase word tokens with punctuation stripped: "Find $x+y$." -> ["find", "x", "y"]."""
    return [t for t in _NON_ALNUM.split(text.lower()) if t]


def ngram_hashes(text: str, n: int) -> set[int]:
    """Hashes of the word n-grams of ``text``.

    Hashing keeps the benchmark index small; Python's 64-bit tuple hash makes an accidental collision
    (~1e-8 expected over the whole bundled pool) irrelevant. A text shorter than n words contributes its
    whole token sequence as one gram, so a short exact copy of a short benchmark problem is still caught.
    """
    toks = tokens(text)
    if len(toks) < n:
        return {hash(tuple(toks))} if toks else set()
    return {hash(g) for g in zip(*(toks[i:] for i in range(n)))}


def problem_key(text: str) -> str:
    """Dedupe key: lowercase with all whitespace runs collapsed to one space."""
    return " ".join(text.lower().split())


def _empty_funnel(sources: Iterable[str], benchmarks: dict[str, list[dict]], ngram: int) -> dict:
    sources = list(sources)
    return {
        "steps": list(STEPS),
        "per_source": {s: {} for s in sources},
        "total": {},
        "drops": Counter(),
        "drops_per_source": {s: Counter() for s in sources},
        "decontamination": {b: 0 for b in benchmarks},
        "duplicate_answer_conflicts": 0,
        "ngram": ngram,
        "benchmark_sizes": {b: len(rows) for b, rows in benchmarks.items()},
    }


def _record(funnel: dict, step: str, rows: list[dict]) -> None:
    counts = Counter(r["source"] for r in rows)
    for source, per_step in funnel["per_source"].items():
        per_step[step] = counts.get(source, 0)
    funnel["total"][step] = len(rows)


def _drop(funnel: dict, row: dict, reason: str) -> None:
    funnel["drops"][reason] += 1
    funnel["drops_per_source"][row["source"]][reason] += 1


def funnel_table(funnel: dict) -> list[list]:
    """The funnel as a table: header ``["source", *steps]``, one row per source, then ``total``."""
    steps = funnel["steps"]
    table = [["source", *steps]]
    for source, per_step in funnel["per_source"].items():
        table.append([source, *(per_step.get(s, 0) for s in steps)])
    table.append(["total", *(funnel["total"].get(s, 0) for s in steps)])
    return table


def format_funnel(funnel: dict) -> str:
    """A fixed-width text rendering of :func:`funnel_table` plus the drop reasons, for logs and reports."""
    table = funnel_table(funnel)
    widths = [max(len(str(row[c])) for row in table) for c in range(len(table[0]))]
    lines = ["  ".join(str(v).rjust(w) if c else str(v).ljust(w) for c, (v, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.append("drops: " + ", ".join(f"{k}={v}" for k, v in sorted(funnel["drops"].items())))
    lines.append("decontamination: " + ", ".join(f"{k}={v}" for k, v in funnel["decontamination"].items()))
    return "\n".join(lines)
