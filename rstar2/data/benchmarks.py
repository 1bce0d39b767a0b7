"""Evaluation benchmarks bundled under data/eval/ (AIME24, AIME25, AMC23, MATH-500), loaded through load_source.

They serve two stages: evaluation (problem + gold) and rl_data's decontamination (problem text only).
"""

from __future__ import annotations

from pathlib import Path

from rstar2.data.answers import normalize_integer_answer
from rstar2.data.loaders import REPO_ROOT, load_source

# name -> load_source spec. AIME answers are zero-padded strings ("025"), AMC23 answers are JSON floats (27.0);
# load_benchmark canonicalises integer golds to "25" / "27" so graders compare like with like.
DEFAULT_BENCHMARKS: dict[str, dict] = {
    "aime24": {"name": "aime24", "path": "data/eval/aime24/test.jsonl",
               "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "aime25": {"name": "aime25", "path": "data/eval/aime25/aime_2025.jsonl",
               "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "amc23": {"name": "amc23", "path": "data/eval/amc23/test.jsonl",
              "fields": {"problem": "problem", "answer": "answer", "id": "id"}},
    "math500": {"name": "math500", "path": "data/eval/math500/test.jsonl",
                "fields": {"problem": "problem", "answer": "answer", "id": "unique_id"}},
}


def load_benchmark(name: str, spec: dict | None = None, base_dir: Path | str = REPO_ROOT) -> list[dict]:
    """Load one benchmark as rows ``{"id", "problem", "answer", "answer_raw"}`` (answers are strings).

    ``answer`` is the canonical integer ("025" -> "25", "27.0" -> "27") when the gold is an integer, else the
    raw gold text unchanged (MATH-500 has LaTeX answers such as "\\frac{14}{3}").

    Args:
        name: benchmark name; also the spec's default ``name``.
        spec: a load_source spec; defaults to ``DEFAULT_BENCHMARKS[name]``.

    Raises:
        KeyError: no spec given and ``name`` is not a default benchmark.
        FileNotFoundError / ValueError: as load_source; also ValueError if the benchmark is empty or a row has
            no gold answer (every eval row must be gradable).
    """
    if spec is None:
        if name not in DEFAULT_BENCHMARKS:
            raise KeyError(f"unknown benchmark '{name}'; defaults are {sorted(DEFAULT_BENCHMARKS)}")
        spec = DEFAULT_BENCHMARKS[name]
    spec = {"name": name, **spec}
    rows = load_source(spec, base_dir)
    if not rows:
        raise ValueError(f"benchmark '{name}' ({spec.get('path')}): no rows")
    return [_benchmark_row(name, row) for row in rows]


def _benchmark_row(name: str, row: dict) -> dict:
    raw = row["answer_raw"]
    if raw is None or not raw.strip() or not row["problem"]:
        raise ValueError(f"benchmark '{name}': row {row['id']} has no problem or no gold answer")
    value = normalize_integer_answer(raw)
    return {"id": row["id"], "problem": row["problem"],
            "answer": str(value) if value is not None else raw.strip(), "answer_raw": raw}
