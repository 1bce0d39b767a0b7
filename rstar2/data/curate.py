"""RL data curation funnel (paper §4.2, §5.1): integer answers, exact and near dedupe, 8-gram decontamination.

Steps, in order, each counted per source:

    loaded          rows returned by load_source (after the spec's filters/limit)
    integer_answer  the gold normalises to an integer (answers.classify_integer_answer), and there is a problem.
                    The paper's rule, for sources of ``answer_type: integer`` (the default); a ``math`` or
                    ``choice`` source skips it and keeps each row whose gold its grader can read
                    (grading.gold_is_valid), listed in funnel["integer_filter_skipped"] with its type
    dedupe          first occurrence of each whitespace/case-normalised problem text wins (across sources,
                    in the order the sources are given)
    near_dedupe     first of each group of near-duplicates wins: MinHash LSH over word shingles, confirmed by
                    the exact Jaccard similarity (near_dedupe.py); "skipped" in funnel["step_status"] when off
    decontaminate   no word 8-gram shared with any benchmark problem (the paper's rule, §5.1)

Every dropped row is counted under a reason: no_problem, no_answer, tuple_or_list, non_integer_number,
not_a_number, too_large, unusable_gold (a math/choice gold its grader cannot read), duplicate, near_duplicate,
contaminated.

Boilerplate exemption (off by default = the paper's rule): competition problems share stock phrasing such as
"where m and n are relatively prime positive integers find m n" (8 words). With the plain rule such an 8-gram
in any benchmark problem removes every candidate that uses it: 37% of historical AIME on the bundled data. With
``boilerplate_min_problems = N > 0`` an n-gram that occurs in at least N distinct candidate problems (after
dedupe) counts as stock phrasing and is ignored; a copied benchmark problem is still caught by its other,
specific n-grams. The funnel records how many rows the exemption kept.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

from rstar2.grading.answers import OK, classify_integer_answer
from rstar2.data.loaders import WORKING_DIR, load_source
from rstar2.data.near_dedupe import near_duplicates

STEPS = ["loaded", "integer_answer", "dedupe", "near_dedupe", "decontaminate"]
# Defaults of the near-dedupe settings (config rl_data.near_dedupe); threshold is the exact Jaccard similarity.
NEAR_DEDUPE_DEFAULTS = {"enabled": True, "threshold": 0.9, "num_perm": 128, "shingle_words": 5}
# Row keys written to train.jsonl; "origin" and "language" only when the source maps them.
OUTPUT_KEYS = ("id", "source", "problem", "answer", "answer_raw", "answer_type", "origin", "language")
#: rl_data.sources[].answer_type values (the grading package's types); integer is the paper's curation.
RL_ANSWER_TYPES = ("integer", "math", "choice")
# Anything that is not a letter or digit separates tokens; "_" too (it is in \w).
_NON_ALNUM = re.compile(r"[\W_]+")

Progress = Callable[[str, int, float], None]


def curate(sources: list[dict], benchmarks: dict[str, list[dict]], *, ngram: int = 8,
           max_abs_answer: int, near_dedupe: dict | None = None, boilerplate_min_problems: int = 0,
           base_dir: Path | str = WORKING_DIR, progress: Progress | None = None,
           dropped: list | None = None) -> tuple[list[dict], dict]:
    """Run the funnel over ``sources`` (load_source specs) against ``benchmarks`` (name -> rows with "problem").

    Args:
        ngram: decontamination n-gram length in words (paper: 8).
        max_abs_answer: golds with a larger magnitude are dropped ("too_large"; paper §4.2, Project Euler).
        near_dedupe: ``{"enabled", "threshold", "num_perm", "shingle_words"}``, missing keys from
            NEAR_DEDUPE_DEFAULTS.
        boilerplate_min_problems: 0 (paper) or N: n-grams found in >= N candidate problems never count as
            contamination (see the module docstring).
        progress: optional callback ``(step, rows_after_step, seconds_for_step)``.
        dropped: optional list; every dropped row is appended to it as ``{"id", "source", "step", "reason",
            "answer_raw"}`` (+ ``"kept"``, the id of the copy kept, for a duplicate; ``"benchmarks"`` for a
            contaminated row).

    A source's ``answer_type`` (:data:`RL_ANSWER_TYPES`, default ``integer``) is carried on each of its rows and
    decides whether the integer filter applies (module docstring).

    Returns:
        (rows, funnel). rows: ``{"id", "source", "problem", "answer" (normalised int as str for integer sources,
        the stripped gold otherwise), "answer_raw", "answer_type"}``
        (+ ``origin``/``language`` when mapped) in source order. funnel: ``{"steps", "step_status": {step:
        "done"|"skipped"}, "per_source": {src: {step: n}}, "total": {step: n}, "drops": {reason: n},
        "drops_per_source": {src: {reason: n}}, "decontamination": {bench: n}, "duplicate_answer_conflicts": n,
        "near_duplicate_answer_conflicts": n, "near_dedupe": {settings}, "ngram": n,
        "boilerplate_exemption": {"min_problems", "exempt_ngrams", "rows_kept"}, "benchmark_sizes": {bench: n},
        "drop_examples": {src: {reason: [up to 3 golds as read]}}, "contaminated": [{"id", "source",
        "benchmarks", "problem" (its first 160 characters)}]}``.
        A contaminated row is counted once in "drops" but under every benchmark it overlaps in
        "decontamination".

    Raises:
        ValueError: two sources share a name; an unknown answer_type (names the source); bad near-dedupe
            settings; anything load_source raises.
    """
    names = [spec.get("name") for spec in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"source names must be unique, got {names}")
    near = {**NEAR_DEDUPE_DEFAULTS, **(near_dedupe or {})}
    unknown = set(near) - set(NEAR_DEDUPE_DEFAULTS)
    if unknown:
        raise ValueError(f"near_dedupe: unknown settings {sorted(unknown)}; known: {sorted(NEAR_DEDUPE_DEFAULTS)}")
    types = {spec.get("name"): spec.get("answer_type", "integer") for spec in sources}
    for i, (name, kind) in enumerate(types.items()):
        if kind not in RL_ANSWER_TYPES:
            raise ValueError(f"rl_data.sources[{i}] ({name}): answer_type must be one of {RL_ANSWER_TYPES}, "
                             f"got {kind!r}")
    funnel = _empty_funnel(names, benchmarks, ngram)
    funnel["_dropped_rows"] = dropped
    funnel["integer_filter_skipped"] = {n: k for n, k in types.items() if k != "integer"}
    funnel["near_dedupe"] = near
    funnel["boilerplate_exemption"] = {"min_problems": int(boilerplate_min_problems), "exempt_ngrams": 0,
                                       "rows_kept": 0}
    notify = progress or (lambda step, n, seconds: None)

    t = time.time()
    rows = [{**row, "answer_type": types[spec.get("name")]} for spec in sources for row in load_source(spec, base_dir)]
    _record(funnel, "loaded", rows)
    notify("loaded", len(rows), time.time() - t)

    stages = [
        ("integer_answer", lambda rs: keep_integer_answers(rs, max_abs_answer, funnel)),
        ("dedupe", lambda rs: dedupe(rs, funnel)),
        ("near_dedupe", lambda rs: near_dedupe_rows(rs, near, funnel) if near["enabled"] else rs),
        ("decontaminate", lambda rs: decontaminate(rs, benchmarks, ngram, funnel,
                                                   boilerplate_min_problems=boilerplate_min_problems)),
    ]
    funnel["step_status"]["loaded"] = "done"
    for step, apply in stages:
        t = time.time()
        rows = apply(rows)
        _record(funnel, step, rows)
        skipped = (step == "near_dedupe" and not near["enabled"]) or \
            (step == "integer_answer" and "integer" not in types.values())
        funnel["step_status"][step] = "skipped" if skipped else "done"
        notify(step, len(rows), time.time() - t)

    funnel["drops"] = dict(funnel["drops"])
    funnel["drops_per_source"] = {s: dict(c) for s, c in funnel["drops_per_source"].items()}
    del funnel["_dropped_rows"]
    out = [{k: r[k] for k in OUTPUT_KEYS if k in r} for r in rows]
    return out, funnel


def keep_integer_answers(rows: list[dict], max_abs: int, funnel: dict) -> list[dict]:
    """Keep rows with a problem and an integer gold; add ``answer`` (str of the int) to kept rows.

    A row whose ``answer_type`` is not ``integer`` skips the integer rule: kept with its stripped gold as
    ``answer`` when ``grading.gold_is_valid`` accepts it for that type, else dropped as ``unusable_gold``.
    """
    from rstar2.grading import gold_is_valid

    kept = []
    for row in rows:
        if not row["problem"]:
            _drop(funnel, row, "no_problem")
            continue
        kind = row.get("answer_type", "integer")
        if kind != "integer":
            gold = "" if row["answer_raw"] is None else str(row["answer_raw"]).strip()
            if not gold:
                _drop(funnel, row, "no_answer")
            elif not gold_is_valid(gold, kind):
                _drop(funnel, row, "unusable_gold")
            else:
                kept.append({**row, "answer": gold})
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
    first: dict[str, dict] = {}
    kept = []
    for row in rows:
        key = problem_key(row["problem"])
        if key in first:
            _drop(funnel, row, "duplicate", kept=first[key]["id"])
            if first[key]["answer"] != row["answer"]:
                funnel["duplicate_answer_conflicts"] += 1
            continue
        first[key] = row
        kept.append(row)
    return kept


def near_dedupe_rows(rows: list[dict], settings: dict, funnel: dict) -> list[dict]:
    """Drop near-duplicates (near_dedupe.near_duplicates); the earlier row wins, as in :func:`dedupe`.

    A near-duplicate whose gold differs from the kept one is counted in ``near_duplicate_answer_conflicts``:
    reworded copies agree, while same-template problems with other numbers (not duplicates) usually do not.
    """
    match = near_duplicates([tokens(r["problem"]) for r in rows], threshold=float(settings["threshold"]),
                            num_perm=int(settings["num_perm"]), shingle_words=int(settings["shingle_words"]))
    kept = []
    for row, j in zip(rows, match):
        if j is None:
            kept.append(row)
            continue
        _drop(funnel, row, "near_duplicate", kept=rows[j]["id"])
        if rows[j]["answer"] != row["answer"]:
            funnel["near_duplicate_answer_conflicts"] += 1
    return kept


def decontaminate(rows: list[dict], benchmarks: dict[str, list[dict]], n: int, funnel: dict,
                  boilerplate_min_problems: int = 0) -> list[dict]:
    """Drop rows sharing any word n-gram with any benchmark problem; count drops per benchmark.

    With ``boilerplate_min_problems = N > 0``, n-grams found in >= N of ``rows`` are exempt (module docstring);
    ``funnel["boilerplate_exemption"]`` then records how many benchmark n-grams were exempt and how many rows
    the exemption kept that the plain rule would have dropped.
    """
    index = benchmark_ngram_index(benchmarks, n)
    grams_per_row = [ngram_hashes(row["problem"], n) for row in rows]
    exempt: set[int] = set()
    if boilerplate_min_problems > 0:
        doc_freq = Counter(g for grams in grams_per_row for g in grams if g in index)
        exempt = {g for g, c in doc_freq.items() if c >= boilerplate_min_problems}
        funnel["boilerplate_exemption"]["exempt_ngrams"] = len(exempt)
    bench_names = list(benchmarks)
    kept = []
    for row, grams in zip(rows, grams_per_row):
        hits = 0  # bitmask over bench_names
        exempt_hits = 0
        for gram in grams:
            bits = index.get(gram, 0)
            if bits and gram in exempt:
                exempt_hits |= bits
            else:
                hits |= bits
        if not hits:
            if exempt_hits:
                funnel["boilerplate_exemption"]["rows_kept"] += 1
            kept.append(row)
            continue
        overlaps = [bench for bit, bench in enumerate(bench_names) if hits >> bit & 1]
        _drop(funnel, row, "contaminated", benchmarks=overlaps)
        funnel["contaminated"].append({"id": row["id"], "source": row["source"], "benchmarks": overlaps,
                                       "problem": row["problem"][:160]})
        for bench in overlaps:
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
        "step_status": {},
        "per_source": {s: {} for s in sources},
        "total": {},
        "drops": Counter(),
        "drops_per_source": {s: Counter() for s in sources},
        "decontamination": {b: 0 for b in benchmarks},
        "duplicate_answer_conflicts": 0,
        "near_duplicate_answer_conflicts": 0,
        "ngram": ngram,
        "benchmark_sizes": {b: len(rows) for b, rows in benchmarks.items()},
        "drop_examples": {s: {} for s in sources},
        "contaminated": [],
    }


def _record(funnel: dict, step: str, rows: list[dict]) -> None:
    counts = Counter(r["source"] for r in rows)
    for source, per_step in funnel["per_source"].items():
        per_step[step] = counts.get(source, 0)
    funnel["total"][step] = len(rows)


#: The funnel step each drop reason belongs to (reasons not listed: the answer-type filter, integer_answer).
REASON_STEPS = {"duplicate": "dedupe", "near_duplicate": "near_dedupe", "contaminated": "decontaminate",
                "over_limit": "limit"}


def _drop(funnel: dict, row: dict, reason: str, **extra) -> None:
    """Count one dropped row under ``reason``, keep its gold as an example (3 per source and reason), and list it
    where ``curate`` was given a ``dropped`` list."""
    funnel["drops"][reason] += 1
    funnel["drops_per_source"][row["source"]][reason] += 1
    examples = funnel["drop_examples"][row["source"]].setdefault(reason, [])
    if len(examples) < 3:
        examples.append(row.get("answer_raw"))
    if funnel.get("_dropped_rows") is not None:
        funnel["_dropped_rows"].append({"id": row["id"], "source": row["source"],
                                        "step": REASON_STEPS.get(reason, "integer_answer"), "reason": reason,
                                        "answer_raw": row.get("answer_raw"), **extra})


def append_step(funnel: dict, step: str, kept: list[dict], dropped: list[dict], reason: str, status: str) -> None:
    """Record one more funnel step after curation (rule ``rl_data``: ``prompt_length``, ``label_verification``):
    rows left per source and in total, ``dropped`` counted under ``reason``; ``status`` "done" or "skipped"."""
    funnel["steps"].append(step)
    funnel.setdefault("step_status", {})[step] = status
    counts = Counter(r["source"] for r in kept)
    for source, per_step in funnel["per_source"].items():
        per_step[step] = counts.get(source, 0)
    funnel["total"][step] = len(kept)
    for r in dropped:
        funnel["drops"][reason] = funnel["drops"].get(reason, 0) + 1
        per_source = funnel.setdefault("drops_per_source", {}).setdefault(r["source"], {})
        per_source[reason] = per_source.get(reason, 0) + 1


def funnel_table(funnel: dict, with_drops: bool = False) -> list[list]:
    """The funnel as a table: header ``["source", *steps]``, one row per source, then ``total``.

    With ``with_drops``, one more column per drop reason (``"dropped:<reason>"``), so every row that entered a
    step and did not leave it is accounted for in the same table (funnel.csv).
    """
    steps = funnel["steps"]
    reasons = sorted(funnel["drops"]) if with_drops else []
    per_source_drops = funnel.get("drops_per_source") or {}
    table = [["source", *steps, *(f"dropped:{r}" for r in reasons)]]
    for source, per_step in funnel["per_source"].items():
        drops = per_source_drops.get(source, {})
        table.append([source, *(per_step.get(s, 0) for s in steps), *(drops.get(r, 0) for r in reasons)])
    table.append(["total", *(funnel["total"].get(s, 0) for s in steps), *(funnel["drops"][r] for r in reasons)])
    return table


def format_funnel(funnel: dict) -> str:
    """A fixed-width text rendering of :func:`funnel_table` plus the drop reasons, for logs and reports."""
    table = funnel_table(funnel)
    widths = [max(len(str(row[c])) for row in table) for c in range(len(table[0]))]
    lines = ["  ".join(str(v).rjust(w) if c else str(v).ljust(w) for c, (v, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.append("drops: " + ", ".join(f"{k}={v}" for k, v in sorted(funnel["drops"].items())))
    lines.append("decontamination: " + ", ".join(f"{k}={v}" for k, v in funnel["decontamination"].items()))
    skipped = [s for s, st in (funnel.get("step_status") or {}).items() if st == "skipped"]
    if skipped:
        lines.append("skipped steps: " + ", ".join(skipped))
    if funnel.get("integer_filter_skipped"):
        lines.append("integer filter skipped for: " + ", ".join(f"{s} ({k})" for s, k in
                                                                  funnel["integer_filter_skipped"].items()))
    extra = [f"{k}={funnel[k]}" for k in ("duplicate_answer_conflicts", "near_duplicate_answer_conflicts")
             if k in funnel]
    if funnel.get("prompt_length"):
        pl = funnel["prompt_length"]
        lines.append(f"prompt length (tokens, tool schema included): longest {pl['longest']}, limit "
                     f"{pl['max_tokens']}, {pl['dropped']} dropped")
    exemption = funnel.get("boilerplate_exemption") or {}
    if exemption.get("min_problems"):
        extra.append(f"boilerplate exemption (n-grams in >= {exemption['min_problems']} problems): "
                     f"{exemption['exempt_ngrams']} n-grams exempt, {exemption['rows_kept']} rows kept")
    if extra:
        lines.append("; ".join(extra))
    return "\n".join(lines)
