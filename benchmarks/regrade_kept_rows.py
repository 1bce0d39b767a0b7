"""Regrade a kept run's per-problem evaluation rows with the current grader and compare with what was recorded.

For every ``eval/<model>/<benchmark>/per_problem.jsonl`` under each measurement folder given (default: the
default run, docs/measurements/zen3_seed0_r3): each sample's recorded answer is graded again against the row's
gold under its answer type, in the killable grading workers evaluation uses (rstar2.grading_pool), and the
kept sample's answer is extracted again from its final turn. A truncated sample scores 0 ungraded (as
rollouts do). Prints, per file, the samples whose reward or extracted answer changed and the benchmark's avg@k
as recorded in ``summary.json`` and as regraded: the held-out numbers are unchanged when nothing changed.

Usage: python benchmarks/regrade_kept_rows.py [measurement folder ...]
"""

from __future__ import annotations

import glob
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from rstar2.grading import extract_final_answer  # noqa: E402
from rstar2.grading_pool import grade_many  # noqa: E402


def regrade(path: str) -> tuple[int, int, float, float]:
    """(samples, changed, recorded avg@k, regraded avg@k) of one per_problem.jsonl; prints each change."""
    rows = [json.loads(line) for line in open(path)]
    items, recorded, skipped = [], [], []
    for r in rows:
        for pred, reward, truncated in zip(r["preds"], r["rewards"], r["truncated"]):
            skipped.append(bool(truncated))
            recorded.append(reward)
            items.append((pred, r["answer"], r.get("answer_type") or "math"))
    graded = iter(grade_many([it for it, s in zip(items, skipped) if not s], timeout_s=20.0))
    now = [0.0 if s else next(graded)["score"] for s in skipped]
    changed = 0
    for (pred, gold, kind), old, new in zip(items, recorded, now):
        if old != new:
            changed += 1
            print(f"    reward changed: {pred!r} vs gold {gold!r} ({kind}): {old} -> {new}")
    for r in rows:
        sample = r.get("sample") or {}
        if sample.get("turns") and not sample.get("truncated"):
            again = extract_final_answer(sample["turns"][-1]["text"])
            if again != sample.get("pred"):
                changed += 1
                print(f"    extraction changed: {r['id']}: {sample.get('pred')!r} -> {again!r}")
    per_row = [len(r["rewards"]) for r in rows]
    avg_old = sum(recorded) / max(len(recorded), 1)
    avg_new = sum(now) / max(len(now), 1)
    assert sum(per_row) == len(now)
    return len(now), changed, avg_old, avg_new


def main() -> None:
    folders = sys.argv[1:] or [os.path.join(ROOT, "docs", "measurements", "zen3_seed0_r3")]
    total_changed = 0
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "eval", "*", "*", "per_problem.jsonl"))):
            model, bench = path.split(os.sep)[-3:-1]
            summary = json.load(open(os.path.join(folder, "eval", model, "summary.json")))
            reported = summary["benchmarks"][bench]["avg_at_k"]
            n, changed, avg_old, avg_new = regrade(path)
            total_changed += changed
            print(f"{os.path.relpath(path, ROOT)}: {n} samples, {changed} changed; avg@k in summary.json "
                  f"{reported:.4f}, recorded rows {avg_old:.4f}, regraded {avg_new:.4f}")
    print(f"total changed: {total_changed}")
    sys.exit(1 if total_changed else 0)


if __name__ == "__main__":
    main()
