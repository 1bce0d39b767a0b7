"""Evaluation benchmarks: where each one is read from, what kind of answer it has and how it is graded.

Every benchmark is one spec dict (config ``benchmarks:``; the bundled defaults are :data:`DEFAULT_BENCHMARKS`):
a :func:`rstar2.data.loaders.load_source` spec (``path``, ``fields``, ...) plus

- ``answer_type``: ``integer`` (AIME, AMC), ``math`` (MATH-500, HMMT: LaTeX answers) or ``choice`` (GPQA);
  it selects the gold check and the grader in :data:`ANSWER_TYPE_RULES` (one entry per
  ``grading.ANSWER_TYPES`` name), the one table that says how each kind
  of answer is loaded and graded (default ``math``, which also grades integers exactly);
- ``choices``: for ``choice`` only, the columns that hold the wrong options. ``fields.answer`` names the
  column of the correct option's text. The options are shuffled per problem (seeded by the benchmark name
  and problem id, so every run and every model sees the same order), appended to the problem as
  ``(A) ... (B) ...``, and the gold becomes the correct option's letter;
- ``paper``: optional, the column of the paper's Table 3 or 5 this benchmark is reported beside.

Two answer types are not answers: ``ifeval`` and ``bfcl`` benchmarks are checked on the whole response by the
field's reference checkers (rstar2.grading.ifeval: lm-eval's IFEval checks; rstar2.grading.bfcl: the Berkeley
AST checker). Their rows carry a ready ``prompt`` (rstar2.data.ifeval / rstar2.data.bfcl), their ``answer`` is
the checker's reference as JSON, and ``path`` is IFEval's ``input_data.jsonl`` or the BFCL data folder, whose
``categories`` are evaluated (each category a ``group``, so that ``evaluate.limit`` applies per category).

Bundled under data/eval/ (see each folder's SOURCE.md): AIME24, AIME25, AMC23, MATH-500. Not bundled, loadable
from a path or ``hub:<id>`` the user gives: HMMT Feb 2025 (e.g. ``hub:MathArena/hmmt_feb_2025``, answer_type
``math``) and GPQA-Diamond (its authors ask that it not be republished in plain text, so it is never committed;
e.g. ``hub:Idavidrein/gpqa`` config ``gpqa_diamond``, or the CSV of its release, answer_type ``choice``). See
``configs/eval_extra.example.yaml``.

They serve two stages: evaluation (problem + gold) and rl_data's decontamination (problem text only).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rstar2 import grading
from rstar2.grading.answers import normalize_integer_answer
from rstar2.data.loaders import WORKING_DIR, load_source


@dataclass(frozen=True)
class AnswerType:
    """How one kind of benchmark answer is read and graded.

    ``gold(raw) -> str`` makes the canonical gold from the file's text. ``name`` is what
    :func:`rstar2.grading.score_trajectory` / :func:`rstar2.grading.grade` take as ``answer_type``: it picks
    the gold check and the comparison there (pure functions, so the killable grading workers can run them).
    """
    name: str
    gold: Callable[[str], str]
    grader: str


def _integer_gold(raw: str) -> str:
    value = normalize_integer_answer(raw)
    return str(value) if value is not None else raw.strip()


ANSWER_TYPE_RULES: dict[str, AnswerType] = {
    # "025" -> "25", "27.0" -> "27": graders then compare like with like
    "integer": AnswerType("integer", _integer_gold, "exact integer, then the general rules (grading.grade)"),
    "math": AnswerType("math", _integer_gold, "integers, exact rationals, then Math-Verify (grading.grade)"),
    "choice": AnswerType("choice", str.strip, "the option letter only (grading.grade_choice)"),
    "ifeval": AnswerType("ifeval", str, "lm-eval's IFEval instruction checks (grading.ifeval)"),
    "bfcl": AnswerType("bfcl", str, "the Berkeley AST checker of bfcl-eval (grading.bfcl)"),
}

#: spec keys that are this module's, not load_source's
_BENCH_KEYS = ("answer_type", "choices", "paper", "categories")

# name -> spec. AIME answers are zero-padded strings ("025"), AMC23 answers are JSON floats (27.0).
DEFAULT_BENCHMARKS: dict[str, dict] = {
    "aime24": {"name": "aime24", "path": "data/eval/aime24/test.jsonl", "answer_type": "integer", "paper": "AIME24",
               "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "aime25": {"name": "aime25", "path": "data/eval/aime25/aime_2025.jsonl", "answer_type": "integer",
               "paper": "AIME25", "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "amc23": {"name": "amc23", "path": "data/eval/amc23/test.jsonl", "answer_type": "integer",
              "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "math500": {"name": "math500", "path": "data/eval/math500/test.jsonl", "answer_type": "math", "paper": "MATH-500",
                "fields": {"problem": "problem", "answer": "answer", "id": "unique_id"}},
}

#: Option letters of a multiple-choice problem, in order.
LETTERS = "ABCDEFGHIJ"


def answer_type(spec: dict | None) -> AnswerType:
    """The declared :class:`AnswerType` of a benchmark spec (``math`` when none is declared).

    Raises:
        ValueError: an unknown ``answer_type``.
    """
    name = (spec or {}).get("answer_type") or "math"
    if name not in ANSWER_TYPE_RULES:
        raise ValueError(f"benchmark answer_type must be one of {sorted(ANSWER_TYPE_RULES)}, not {name!r}")
    return ANSWER_TYPE_RULES[name]


def load_benchmark(name: str, spec: dict | None = None, base_dir: Path | str = WORKING_DIR) -> list[dict]:
    """Load one benchmark as rows ``{"id", "problem", "answer", "answer_raw", "answer_type"}`` (strings).

    ``answer`` is the canonical gold of the benchmark's answer type: the integer ("025" -> "25", "27.0" -> "27")
    when the gold is an integer, else the raw gold text stripped (MATH-500 has LaTeX answers such as
    "\\frac{14}{3}"); for ``choice`` the correct option's letter, with the options appended to the problem.

    Args:
        name: benchmark name; also the spec's default ``name``.
        spec: a benchmark spec (module docstring); defaults to ``DEFAULT_BENCHMARKS[name]``.

    Raises:
        KeyError: no spec given and ``name`` is not a default benchmark.
        FileNotFoundError / ValueError: as load_source (names the file, row and field); also ValueError if the
            benchmark is empty, a row has no problem or no gold, a gold is not valid for the declared answer
            type (an integer benchmark with a non-integer gold), or ``choice`` is declared without ``choices``.
    """
    if spec is None:
        if name not in DEFAULT_BENCHMARKS:
            raise KeyError(f"unknown benchmark '{name}'; defaults are {sorted(DEFAULT_BENCHMARKS)}")
        spec = DEFAULT_BENCHMARKS[name]
    spec = {"name": name, **spec}
    kind = answer_type(spec)
    if kind.name in grading.CHECKERS:
        return _checked_rows(name, spec, kind, base_dir)
    source_spec = {k: v for k, v in spec.items() if k not in _BENCH_KEYS}
    rows = load_source(source_spec, base_dir, on_missing_allowed=False)   # benchmarks take no on_missing
    if not rows:
        raise ValueError(f"benchmark '{name}' ({spec.get('path')}): no rows")
    if kind.name == "choice":
        rows = _with_options(name, spec, source_spec, rows, base_dir)
    return [_benchmark_row(name, spec, kind, row) for row in rows]


def benchmark_files(spec: dict) -> list[str]:
    """The local files a benchmark reads (Snakemake inputs): its ``path``, or for ``bfcl`` the question and
    answer files of its ``categories``; none for a ``hub:`` dataset."""
    path = spec["path"]
    if path.startswith("hub:"):
        return []
    if answer_type(spec).name == "bfcl":
        from rstar2.data.bfcl import files

        return [str(f) for f in files(Path(path), spec["categories"])]
    return [path]


def _checked_rows(name: str, spec: dict, kind: AnswerType, base_dir) -> list[dict]:
    """IFEval / BFCL rows (rstar2.data.ifeval, rstar2.data.bfcl) in the shape of :func:`load_benchmark`."""
    path = Path(base_dir) / spec["path"]
    if kind.name == "bfcl":
        from rstar2.data.bfcl import load

        rows = load(name, path, spec["categories"])
    else:
        from rstar2.data.ifeval import load

        rows = load(name, path)
    if not rows:
        raise ValueError(f"benchmark '{name}' ({spec['path']}): no rows")
    return [{**r, "answer_raw": r["answer"], "answer_type": kind.name} for r in rows]


def _with_options(name: str, spec: dict, source_spec: dict, rows: list[dict], base_dir) -> list[dict]:
    """Multiple choice: read each wrong-option column (same file, filters and limit, so rows line up), shuffle
    the options per problem, append them to the problem and make the gold the correct option's letter."""
    columns = spec.get("choices") or []
    if not columns or isinstance(columns, str):
        raise ValueError(f"benchmark '{name}' ({spec.get('path')}): answer_type 'choice' needs 'choices', "
                         "the list of columns holding the wrong options")
    if len(columns) + 1 > len(LETTERS):
        raise ValueError(f"benchmark '{name}': at most {len(LETTERS) - 1} wrong options, got {len(columns)}")
    wrong = []
    for col in columns:
        other = load_source({**source_spec, "fields": {**source_spec["fields"], "answer": col}}, base_dir,
                            on_missing_allowed=False)
        wrong.append([r["answer_raw"] for r in other])
    out = []
    for i, row in enumerate(rows):
        options = [row["answer_raw"]] + [w[i] for w in wrong]
        for col, text in zip(["answer"] + list(columns), options):
            if text is None or not str(text).strip():
                raise ValueError(f"benchmark '{name}' ({spec.get('path')}): row {i} ({row['id']}): "
                                 f"option column {col!r} is empty")
        order = list(range(len(options)))
        random.Random(f"{name}:{row['id']}").shuffle(order)   # str seeds are stable across processes
        lines = [f"({LETTERS[j]}) {str(options[k]).strip()}" for j, k in enumerate(order)]
        gold = LETTERS[order.index(0)]
        problem = (row["problem"] + "\n\n" + "\n".join(lines)
                   + "\n\nAnswer with the letter of the correct option, e.g. \\boxed{A}.")
        out.append({**row, "problem": problem, "answer_raw": gold, "options": lines})
    return out


def _benchmark_row(name: str, spec: dict, kind: AnswerType, row: dict) -> dict:
    raw = row["answer_raw"]
    if raw is None or not str(raw).strip() or not row["problem"]:
        raise ValueError(f"benchmark '{name}' ({spec.get('path')}): row {row['id']} has no problem or no gold answer")
    gold = kind.gold(raw)
    if kind.name != "math" and not grading.gold_is_valid(gold, kind.name):
        raise ValueError(f"benchmark '{name}' ({spec.get('path')}): row {row['id']}: gold {raw!r} is not a valid "
                         f"{kind.name} answer (answer_type {kind.name!r})")
    out = {"id": row["id"], "problem": row["problem"], "answer": gold, "answer_raw": raw, "answer_type": kind.name}
    if "options" in row:
        out["options"] = row["options"]
    return out
