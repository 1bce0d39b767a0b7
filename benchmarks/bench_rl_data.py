"""Time the rl_data curation funnel on the bundled data and print the funnel table.

Usage: .venv/bin/python benchmarks/bench_rl_data.py [--repeats 3] [--max-abs-answer 1000000000]

Times load (benchmarks + all bundled sources) plus curation end to end, as the rl_data stage runs it,
without writing any output.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rstar2.data import BUNDLED_SOURCES, DEFAULT_BENCHMARKS, curate, format_funnel, load_benchmark


def run_once(max_abs_answer: int, ngram: int) -> tuple[float, dict, int]:
    t0 = time.perf_counter()
    benchmarks = {name: load_benchmark(name) for name in DEFAULT_BENCHMARKS}
    rows, funnel = curate(BUNDLED_SOURCES, benchmarks, ngram=ngram, max_abs_answer=max_abs_answer)
    return time.perf_counter() - t0, funnel, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-abs-answer", type=int, default=10**9)
    parser.add_argument("--ngram", type=int, default=8)
    args = parser.parse_args()

    times = []
    for _ in range(args.repeats):
        seconds, funnel, n_rows = run_once(args.max_abs_answer, args.ngram)
        times.append(seconds)
    print(format_funnel(funnel))
    print(f"duplicate_answer_conflicts: {funnel['duplicate_answer_conflicts']}")
    print(f"\n{funnel['total']['loaded']} candidates -> {n_rows} rows; wall time over {args.repeats} runs: "
          f"min {min(times):.2f}s, median {statistics.median(times):.2f}s, max {max(times):.2f}s")


if __name__ == "__main__":
    main()
