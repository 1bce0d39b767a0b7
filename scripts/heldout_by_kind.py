"""Held-out accuracy per problem kind, from an RL stage's ``heldout_problems.jsonl`` (per evaluation step) or an
evaluation's ``per_problem.jsonl`` (one column, ``final``).

The bundled learning task (``data/learning/heldout.jsonl``) tags each problem with a ``kind`` (bare, one_step,
two_step, word); the RL stage and the evaluate rule log one row per problem (and step) with the problem's rewards
and its id as the loader made it (``<benchmark>-<id in the file>``). This joins the two and prints a markdown
table of avg@k per kind (solved / problems) at every evaluated step.

Usage: python scripts/heldout_by_kind.py results/eval/rl_stage3/arith_heldout/per_problem.jsonl
       python scripts/heldout_by_kind.py results/rl/stage1/heldout_problems.jsonl [data/learning/heldout.jsonl]
Raises SystemExit naming the file (and row) when it holds no rows, or a logged id matches no problem of the data
file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def kinds_by_logged_id(logged_ids: set[str], data_path: Path) -> dict[str, str]:
    """Map each logged id to its problem's kind: the data file's id, possibly behind a ``<benchmark>-`` prefix."""
    rows = [json.loads(line) for line in data_path.open() if line.strip()]
    kind = {str(r["id"]): r.get("kind", "(none)") for r in rows}
    out = {}
    for lid in logged_ids:
        match = kind.get(lid) or next((k for i, k in kind.items() if lid.endswith("-" + i)), None)
        if match is not None:
            out[lid] = match
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problems", type=Path, help="an RL stage's heldout_problems.jsonl or an evaluation's "
                    "per_problem.jsonl")
    ap.add_argument("data", type=Path, nargs="?", default=Path("data/learning/heldout.jsonl"),
                    help="the held-out file with a kind column")
    a = ap.parse_args()
    if not a.problems.is_file() or not a.problems.read_text().strip():
        raise SystemExit(f"{a.problems}: no rows (an RL stage logs held-out rows only with rl.heldout set; the "
                         "evaluation's results/eval/MODEL/BENCHMARK/per_problem.jsonl always has them)")
    logged = pd.read_json(a.problems, lines=True)
    if "step" not in logged:
        logged["step"] = "final"   # an evaluation: one model, one pass
    kinds = kinds_by_logged_id(set(logged["id"].astype(str)), a.data)
    unknown = [(i, r) for i, r in enumerate(logged["id"].astype(str), 1) if r not in kinds]
    if unknown:
        raise SystemExit(f"{a.problems}: row {unknown[0][0]}: id {unknown[0][1]!r} is no problem of {a.data} "
                         f"({len(unknown)} row(s) unmatched)")
    logged["kind"] = logged["id"].astype(str).map(kinds)
    logged["avg"] = logged["rewards"].map(lambda rs: sum(rs) / len(rs))
    table = logged.groupby(["step", "kind"])["avg"].agg(["sum", "count"]).reset_index()
    table["solved / problems"] = [f"{s:g} / {n}" for s, n in zip(table["sum"].round(2), table["count"])]
    wide = table.pivot(index="kind", columns="step", values="solved / problems")
    wide.columns = [f"step {c}" for c in wide.columns]
    print(wide.to_markdown())


if __name__ == "__main__":
    main()
