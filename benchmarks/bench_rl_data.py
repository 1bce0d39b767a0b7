"""Time the rl_data curation funnel on the bundled data and print the funnel table.

Usage: .venv/bin/python benchmarks/bench_rl_data.py [--repeats 3] [--max-abs-answer 1000000000]
                                                    [--near-threshold 0.9] [--boilerplate-min-problems 0]

Times load (benchmarks + all bundled sources) plus curation end to end (integer answers, exact and near
dedupe, 8-gram decontamination), as the rl_candidates rule runs it, without writing any output. Label
verification is not included: it is model-bound and off on CPU. With --compare-boilerplate it also runs the
funnel once with boilerplate_min_problems = 20 and prints how much historical AIME the exemption keeps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rstar2.data import BUNDLED_SOURCES, DEFAULT_BENCHMARKS, format_funnel, load_benchmark
from rstar2.data.curate import curate


def run_once(args, boilerplate_min_problems: int) -> tuple[float, dict, int]:
    t0 = time.perf_counter()
    benchmarks = {name: load_benchmark(name) for name in DEFAULT_BENCHMARKS}
    rows, funnel = curate(BUNDLED_SOURCES, benchmarks, ngram=args.ngram, max_abs_answer=args.max_abs_answer,
                          near_dedupe={"threshold": args.near_threshold},
                          boilerplate_min_problems=boilerplate_min_problems)
    return time.perf_counter() - t0, funnel, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-abs-answer", type=int, default=10**9)
    parser.add_argument("--ngram", type=int, default=8)
    parser.add_argument("--near-threshold", type=float, default=0.9)
    parser.add_argument("--boilerplate-min-problems", type=int, default=0)
    parser.add_argument("--compare-boilerplate", type=int, default=20, metavar="N",
                        help="also run once with boilerplate_min_problems=N (0 = skip)")
    args = parser.parse_args()

    load = os.getloadavg()
    times = []
    for _ in range(args.repeats):
        seconds, funnel, n_rows = run_once(args, args.boilerplate_min_problems)
        times.append(seconds)
    print(format_funnel(funnel))
    print(f"\n{funnel['total']['loaded']} candidates -> {n_rows} rows; wall time over {args.repeats} runs: "
          f"min {min(times):.2f}s, median {statistics.median(times):.2f}s, max {max(times):.2f}s "
          f"(cpu count {os.cpu_count()}, load average before {load[0]:.1f} / after {os.getloadavg()[0]:.1f})")
    if args.compare_boilerplate:
        _, other, n_other = run_once(args, args.compare_boilerplate)
        aime = "aime_1983_2023"
        loaded = funnel["per_source"][aime]["loaded"]
        print(f"\nboilerplate_min_problems={args.compare_boilerplate}: {n_other} rows; historical AIME kept "
              f"{other['per_source'][aime]['decontaminate']}/{loaded} (paper rule: "
              f"{funnel['per_source'][aime]['decontaminate']}/{loaded}); decontamination per benchmark "
              f"{other['decontamination']}; exemption {other['boilerplate_exemption']}")


if __name__ == "__main__":
    main()
