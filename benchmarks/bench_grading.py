"""Answer checking at scale in killable workers (paper §3.1: the verifier is offloaded to the environment).

Two sets, both graded with :func:`rstar2.grading_pool.grade_many`:

* ``integers`` (default): N (answer, gold) pairs of the integer kinds RL rewards see, adversarial ones included
  (``9^{9^{9}}``, ``2003^{2002^{2001}}``, ``2^{2^{30}}``: Math-Verify can spend its whole timeout or hang on
  them); reports the total time, the rate, the max per-item time (which must stay ≤ timeout + ~1 s) and the
  per-item time in the workers (mean, median);
* ``notations``: the table of tests/test_grading_notations.py (base-n numerals, units, scientific notation,
  repeating decimals, float64 prints, choice phrases; equal and not equal) repeated ``--repeat`` times; reports
  the same times and how many verdicts differ from the table's.

``--in-process`` grades the same items in this process's main thread instead (the adversarial items left out:
they are the workers' job) and reports CPU time per item (``time.process_time``), which other jobs on the
machine disturb less than the workers' wall time.

Usage: python benchmarks/bench_grading.py [--set integers|notations] [--n 10000] [--timeout-s 5] [--in-process]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from rstar2.grading_pool import grade_many  # noqa: E402

ADVERSARIAL = ["9^{9^{9}}", "2003^{2002^{2001}}", "2^{2^{30}}", "10^{10^{10^{10}}}"]


def make_pairs(n: int, seed: int = 0) -> list[tuple[str | None, str]]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        g = rng.randint(0, 999)
        kind = i % 10
        if kind < 4:
            pairs.append((str(g), str(g)))
        elif kind == 4:
            pairs.append((f"\\frac{{{2 * g}}}{{2}}", str(g)))
        elif kind == 5:
            pairs.append((f"{g}.0", str(g)))
        elif kind == 6:
            pairs.append((str(g + 1), str(g)))
        elif kind == 7:
            pairs.append((f"\\sqrt{{{g * g}}}", str(g)))
        elif kind == 8:
            pairs.append((None, str(g)))
        else:
            pairs.append((f"x = {g}", str(g)))
    for j, a in enumerate(ADVERSARIAL * 3):  # a dozen hard items spread through the set
        pairs[(j * 797) % n] = (a, "5")
    return pairs


def notation_items(repeat: int) -> tuple[list[tuple], list[float]]:
    """(pred, gold, answer_type) items of the notation table, ``repeat`` times, and the expected scores."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_grading_notations import TABLE

    rows = TABLE * repeat
    return [(p, g, t) for _, g, p, _, t in rows], [w for _, _, _, w, _ in rows]


def in_process(pairs: list[tuple], want: list[float] | None, name: str) -> None:
    """Grade ``pairs`` (adversarial ones left out) in this process; print CPU time per item."""
    from rstar2.grading import grade

    items = [it for it in pairs if it[0] not in ADVERSARIAL]
    grade("1", "1")                                   # first-use costs (parser, caches) are not per-item time
    cpu, scores = [], []
    for it in items:
        t0 = time.process_time()
        scores.append(grade(*it))
        cpu.append(time.process_time() - t0)
    print(f"set {name}: {len(items)} items in process (adversarial left out); CPU time per item: "
          f"mean {1000 * statistics.mean(cpu):.3f} ms, median {1000 * statistics.median(cpu):.3f} ms, "
          f"total {sum(cpu):.2f} s; score=1: {sum(x == 1.0 for x in scores)}")
    if want is not None:
        print(f"verdicts differing from the table: {sum(x != w for x, w in zip(scores, want))} of {len(want)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=["integers", "notations"], default="integers")
    ap.add_argument("--n", type=int, default=10000, help="pairs of the integers set")
    ap.add_argument("--repeat", type=int, default=20, help="copies of the notation table")
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--in-process", action="store_true", help="CPU time per item in this process instead")
    a = ap.parse_args()
    want = None
    if a.set == "integers":
        pairs = make_pairs(a.n)
    else:
        pairs, want = notation_items(a.repeat)
    if a.in_process:
        in_process(pairs, want, a.set)
        return
    t0 = time.perf_counter()
    res: list[dict] = []
    for k in range(0, len(pairs), a.chunk):
        res += grade_many(pairs[k:k + a.chunk], timeout_s=a.timeout_s)
        done, el = len(res), time.perf_counter() - t0
        print(f"  {done}/{len(pairs)} graded, {done / el:.0f}/s, ETA {(len(pairs) - done) / (done / el):.0f}s",
              flush=True)
    wall = time.perf_counter() - t0
    secs = [r["duration_s"] for r in res]
    slowest = sorted(zip(res, pairs), key=lambda rp: -rp[0]["duration_s"])[:5]
    hard = f" (adversarial: {len(ADVERSARIAL) * 3})" if a.set == "integers" else ""
    print(f"\nset {a.set}: pairs {len(pairs)}{hard}; workers: {os.cpu_count()}; per-item timeout {a.timeout_s}s")
    print(f"total {wall:.1f}s, {len(pairs) / wall:.0f} pairs/s, max per-item {max(secs):.2f}s")
    print(f"per item in the workers: mean {1000 * statistics.mean(secs):.2f} ms, "
          f"median {1000 * statistics.median(secs):.2f} ms")
    print("status:", dict(Counter(r["status"] for r in res)), " score=1:", sum(r["score"] == 1.0 for r in res))
    if want is not None:
        print(f"verdicts differing from the table: {sum(r['score'] != w for r, w in zip(res, want))} of {len(want)}")
    for r, item in slowest:
        print(f"  slowest: {item[0]!r} vs {item[1]!r}: {r['status']} in {r['duration_s']:.2f}s")


if __name__ == "__main__":
    main()
