"""Exact symbolic grading against Math-Verify's tolerance, on the table of tests/test_grading_symbolic.py.

Grades every (gold, prediction) pair of the table twice through the killable grading workers: with the
project's grader (:func:`rstar2.grading.grade`: exact wherever both sides are exact) and with Math-Verify's
``verify(gold, pred)`` alone (what decided every non-rational ``math`` pair before: rstar2.grading.symbolic.math_verify_equal). Prints, per grader, how many near-misses scored 1 and how many equal pairs scored 0,
the pairs concerned, and the per-item time (median and max).

Usage: python benchmarks/bench_symbolic_grading.py [--timeout-s 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from rstar2 import grading_pool  # noqa: E402
from test_grading_symbolic import EQUAL, NEAR_MISSES  # noqa: E402


def _math_verify_only(pred: str, gold: str) -> float:
    from rstar2.grading import symbolic

    try:
        return float(symbolic.math_verify_equal(pred, gold))
    except BaseException:       # Math-Verify's TimeoutException is a BaseException
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=20.0)
    args = ap.parse_args()
    table = [(g, p, 0.0) for g, p in NEAR_MISSES] + [(g, p, 1.0) for g, p in EQUAL]
    ours = grading_pool.grade_many([(p, g) for g, p, _ in table], timeout_s=args.timeout_s)
    # Math-Verify alone, in worker processes' main threads, so its own 5 s signal timeouts apply
    with cf.ProcessPoolExecutor(2) as ex:
        mv = list(ex.map(_math_verify_only, [p for _, p, _ in table], [g for g, _, _ in table]))
    for name, scores, secs in (("exact (rstar2.grading.grade)", [r["score"] for r in ours],
                                [r["seconds"] for r in ours]),
                               ("Math-Verify verify only", mv, None)):
        wrong_1 = [(g, p) for (g, p, want), s in zip(table, scores) if want == 0.0 and s == 1.0]
        wrong_0 = [(g, p) for (g, p, want), s in zip(table, scores) if want == 1.0 and s == 0.0]
        print(f"{name}: near-misses scored 1: {len(wrong_1)}/{len(NEAR_MISSES)}; "
              f"equal pairs scored 0: {len(wrong_0)}/{len(EQUAL)}")
        for g, p in wrong_1 + wrong_0:
            print(f"    {g}  vs  {p}")
        if secs:
            print(f"    per-item seconds in the grading workers: median {statistics.median(secs):.3f}, "
                  f"max {max(secs):.3f} (deadline {args.timeout_s:.0f} s); statuses "
                  f"{sorted({r['status'] for r in ours})}")


if __name__ == "__main__":
    main()
