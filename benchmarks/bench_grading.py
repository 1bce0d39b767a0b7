"""Answer checking at scale in killable workers (paper §3.1: the verifier is offloaded to the environment).

Grades N (answer, gold) pairs with :func:`rstar2.grading_pool.grade_many`, adversarial ones included
(``9^{9^{9}}``, ``2003^{2002^{2001}}``, ``2^{2^{30}}``: Math-Verify can spend its whole timeout or hang on
them), and reports the total time, the rate and the max per-item time (which must stay ≤ timeout + ~1 s).

Usage: python benchmarks/bench_grading.py [--n 10000] [--timeout-s 5]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--chunk", type=int, default=1000)
    a = ap.parse_args()
    pairs = make_pairs(a.n)
    t0 = time.perf_counter()
    res: list[dict] = []
    for k in range(0, len(pairs), a.chunk):
        res += grade_many(pairs[k:k + a.chunk], timeout_s=a.timeout_s)
        done, el = len(res), time.perf_counter() - t0
        print(f"  {done}/{len(pairs)} graded, {done / el:.0f}/s, ETA {(len(pairs) - done) / (done / el):.0f}s",
              flush=True)
    wall = time.perf_counter() - t0
    slowest = sorted(zip(res, pairs), key=lambda rp: -rp[0]["seconds"])[:5]
    print(f"\npairs: {len(pairs)} (adversarial: {len(ADVERSARIAL) * 3}); workers: {os.cpu_count()}; "
          f"per-item timeout {a.timeout_s}s")
    print(f"total {wall:.1f}s, {len(pairs) / wall:.0f} pairs/s, max per-item {max(r['seconds'] for r in res):.2f}s")
    print("status:", dict(Counter(r["status"] for r in res)), " score=1:", sum(r["score"] == 1.0 for r in res))
    for r, (p, g) in slowest:
        print(f"  slowest: {p!r} vs {g!r}: {r['status']} in {r['seconds']:.2f}s")


if __name__ == "__main__":
    main()
