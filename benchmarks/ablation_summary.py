"""Summarise GRPO / GRPO-RoC runs (issue 23): the report's ablation numbers for any set of run folders, e.g. the
penalty_eps sweep, whose runs are ablation runs of one mode under different settings.

    python benchmarks/ablation_summary.py LABEL=results/ablation/grpo_roc-seed0 LABEL=... [--json out.json]

A LABEL names a group of runs (a mode, or a mode and a penalty_eps); seeds are read from the folder name
(``-seedN``). Prints per run and per label, with the report's definitions (``rstar2.report.ablation``): held-out
accuracy at step 0 and at the last step, training reward, tool-error ratio of positive trajectories and response
length over the last third of the steps, the per-step wall time (median and range), and per label the mean with
a 95% t-interval over seeds. Also each run's per-step tool-error ratio of positives (the Fig. 4 series), its mean over
all steps, and from ``rollouts.jsonl`` how many positive trajectories entered the loss and how many of them hold a
failed tool call (what RoC's selection acts on). ``--markdown`` / ``--plot`` write the report's own ablation section
and figure (``rstar2.report.ablation``; labels are then the modes, grpo_roc and grpo) from the same folders.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def kept_positives(path: Path) -> tuple[int, int]:
    """(positive trajectories kept for the loss, those of them with a tool call whose status is not ok) in a
    ``rollouts.jsonl`` (records: rstar2.rollout.Trajectory.record)."""
    kept = failed = 0
    if not path.exists():
        return 0, 0
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            if not r.get("kept") or not r.get("reward"):
                continue
            kept += 1
            failed += any(c.get("status") != "ok" for t in r.get("turns", []) for c in t.get("tool_calls", []))
    return kept, failed


def main(argv=None) -> dict:
    from rstar2.report.ablation import mean_interval, run_stats

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=FOLDER")
    ap.add_argument("--json")
    ap.add_argument("--markdown", help="write the report's ablation section here (labels = modes)")
    ap.add_argument("--plot", help="write the report's ablation figure here (labels = modes)")
    a = ap.parse_args(argv)
    by_label: dict[str, list[dict]] = {}
    runs = []
    for spec in a.runs:
        label, folder = spec.split("=", 1)
        d = Path(folder)
        m = re.search(r"seed(\d+)", d.name)
        run = {"seed": int(m.group(1)) if m else d.name, "dir": str(d), "metrics": _read(d / "metrics.jsonl"),
               "heldout": _read(d / "heldout.jsonl")}
        runs.append({"mode": label, **run})
        s = run_stats(run)
        if s is None:
            print(f"{label} {d}: no steps logged")
            continue
        times = [r["step_time_s"] for r in run["metrics"] if r.get("step_time_s") is not None]
        s = {k: v for k, v in s.items() if k not in ("start", "end")}
        s.update(seed=run["seed"], step_time_median_s=statistics.median(times), step_time_range_s=[min(times), max(times)],
                 err_pos_per_step=[r.get("tool_error_ratio_pos") for r in run["metrics"]],
                 length_per_step=[r.get("response_length_mean") for r in run["metrics"]],
                 skipped_updates=sum(bool(r.get("update_skipped")) for r in run["metrics"]))
        errs = [v for v in s["err_pos_per_step"] if v is not None]
        s["err_all_steps"] = statistics.fmean(errs) if errs else None
        s["kept_positives"], s["kept_positives_failed_call"] = kept_positives(d / "rollouts.jsonl")
        by_label.setdefault(label, []).append(s)
    fmt = lambda x, p=1: "–" if x is None else f"{x:.{p}f}"  # noqa: E731
    print(f"{'label':22} {'seed':>4} {'acc0':>6} {'accN':>6} {'reward':>7} {'errpos':>7} {'len':>6} "
          f"{'step s (median)':>16} {'skipped':>7}")
    out = {}
    for label, ss in by_label.items():
        for s in sorted(ss, key=lambda s: str(s["seed"])):
            pct = lambda k: None if s[k] is None else 100 * s[k]  # noqa: E731
            print(f"{label:22} {s['seed']:>4} {fmt(pct('first')):>6} {fmt(pct('last')):>6} {fmt(pct('reward')):>7} "
                  f"{fmt(pct('err')):>7} {fmt(s['len'], 0):>6} {fmt(s['step_time_median_s']):>16} "
                  f"{s['skipped_updates']:>7}")
            print(f"{'':27} err_pos per step: {[None if v is None else round(v, 2) for v in s['err_pos_per_step']]}"
                  f"; all steps {fmt(pct('err_all_steps'))}; kept positives {s['kept_positives']}, "
                  f"{s['kept_positives_failed_call']} with a failed call")
        means = {k: mean_interval([s[k] for s in ss])
                 for k in ("first", "last", "reward", "err", "len", "err_all_steps")}
        out[label] = {"runs": ss, "means": means}
        show = lambda k, scale=100, p=1: "–" if means[k] is None else (  # noqa: E731
            f"{means[k][0] * scale:.{p}f} [{means[k][1] * scale:.{p}f}, {means[k][2] * scale:.{p}f}]")
        print(f"{label:22} mean of {len(ss)}: acc0 {show('first')}  accN {show('last')}  reward {show('reward')}  "
              f"err_pos {show('err')}  len {show('len', 1, 0)}  err_pos all steps {show('err_all_steps')}  "
              f"kept positives {sum(s['kept_positives'] for s in ss)}, with a failed call "
              f"{sum(s['kept_positives_failed_call'] for s in ss)}  skipped updates "
              f"{sum(s['skipped_updates'] for s in ss)} of {sum(s['steps'] for s in ss)}")
    if a.markdown:
        from rstar2.report.document import Doc, to_markdown
        from rstar2.report.learning import ablation_section

        Path(a.markdown).write_text(to_markdown(Doc("Ablation", ablation_section(runs))))
    if a.plot:
        from rstar2.report.learning import plot_ablation

        plot_ablation(runs, Path(a.plot), 120)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
