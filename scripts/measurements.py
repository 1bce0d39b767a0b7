"""Keep the source of a measured run and regenerate the numbers the docs quote from it.

    python scripts/measurements.py save NAME [--wall-s S] [--command CMD]   # after a run: results/, logs/ -> docs/measurements/NAME
    python scripts/measurements.py table NAME                             # the run's row and per-stage times, from the kept files

``save`` copies what the docs quote (each evaluated model's ``summary.json`` and held-out ``per_problem.jsonl``,
the RL stages' ``metrics.jsonl``, the stages' ``logs/benchmarks`` timings, the report's ``summary.md``, the run's
manifest) with the machine (CPU model and the flags that decide precision and speed), the commit and the command
into ``docs/measurements/NAME``; ``table`` reads only those files, so anyone can check a quoted number against its
source. ``scripts/measure_run.sh`` does both around a timed ``make run``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rstar2.report.lead import _ci, headline  # noqa: E402  (the report's own numbers, not a second computation)

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# set to lower PyTorch's kernels to what an AVX2-only CPU has (docs/measurements/bf16-cpu.md): part of the machine
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
MODEL_ORDER = ("base", "sft", "rl_stage1", "rl_stage2", "rl_stage3")   # the workflow's evaluated models, in order


def machine() -> dict:
    """CPU model, core count and the flags that decide precision (bf16) and speed on this machine."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    fam = re.search(r"^cpu family\s*:\s*(\d+)$", info, re.M)
    mod = re.search(r"^model\s*:\s*(\d+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    flags = set(flags.group(1).split()) if flags else set()

    return {"cpu": model.group(1) if model else platform.processor(), "family": fam and fam.group(1),
            "model": mod and mod.group(1), "cores": os.cpu_count(), "flags": [f for f in FLAGS if f in flags],
            "isa_env": {k: os.environ[k] for k in ISA_ENV if k in os.environ}}


def lead_benchmark(report_manifest: Path) -> str:
    """The benchmark the report leads with, from its manifest's params (the default run's when there is none)."""
    manifest = json.loads(report_manifest.read_text()) if report_manifest.exists() else {}
    return manifest.get("params", {}).get("lead_benchmark") or "arith_heldout"


def save(name: str, wall_s: float | None, command: str, results: Path, logs: Path) -> Path:
    dest = REPO / "docs" / "measurements" / name
    dest.mkdir(parents=True, exist_ok=True)
    for summary in sorted(results.glob("eval/*/summary.json")):
        (dest / "eval" / summary.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(summary, dest / "eval" / summary.parent.name / "summary.json")
    # the per-problem rows of the lead benchmark (per-kind breakdowns) and the RL stages' per-step metrics
    bench = lead_benchmark(results / "report" / "manifest.json")
    per_problem = sorted(results.glob(f"eval/*/{bench}/per_problem.jsonl"))
    for rows in per_problem + sorted(results.glob("rl/stage*/metrics.jsonl")):
        target = dest / rows.relative_to(results)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(rows, target)
    if (logs / "benchmarks").is_dir():
        shutil.copytree(logs / "benchmarks", dest / "benchmarks", dirs_exist_ok=True)
    # Snakemake's own log: each job's start and end, and its total (the set-up is the rest of the wall time)
    snakemake_logs = sorted((REPO / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    if snakemake_logs:
        shutil.copy2(snakemake_logs[-1], dest / "snakemake.log")
    for f in ("report/summary.md", "report/manifest.json"):
        if (results / f).exists():
            shutil.copy2(results / f, dest / Path(f).name)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    (dest / "run.json").write_text(json.dumps({"machine": machine(), "commit": commit, "command": command,
                                               "wall_s": wall_s}, indent=1) + "\n")
    return dest


def stage_seconds(dest: Path) -> dict[str, float]:
    """Wall seconds per job from Snakemake's benchmark files (``s`` column), by file name."""
    out = {}
    for tsv in sorted((dest / "benchmarks").rglob("*.tsv")):
        with open(tsv) as f:
            row = next(csv.DictReader(f, delimiter="\t"))
        out[str(tsv.relative_to(dest / "benchmarks").with_suffix(""))] = float(row["s"])
    return out


def table(name: str) -> str:
    dest = REPO / "docs" / "measurements" / name
    run = json.loads((dest / "run.json").read_text())
    found = {p.name for p in (dest / "eval").iterdir()}
    evals = {m: json.loads((dest / "eval" / m / "summary.json").read_text()) for m in MODEL_ORDER if m in found}
    bench = lead_benchmark(dest / "manifest.json")
    lines = [f"machine: {run['machine']['cpu']} (family {run['machine']['family']} model {run['machine']['model']}, "
             f"{run['machine']['cores']} cores, flags {', '.join(run['machine']['flags']) or 'none of ' + ', '.join(FLAGS)}"
             + "".join(f", {k}={v}" for k, v in run["machine"].get("isa_env", {}).items()) + "); "
             f"commit {run['commit'][:12]}; command `{run['command']}`"]
    head = headline(evals, bench)
    if head:
        m0, m1, gain, overlap = head

        def cell(m):
            e = evals[m]["benchmarks"][bench]
            lo, hi = _ci(e)
            return f"{100 * e['avg_at_k']:.1f}% [{lo:.1f}, {hi:.1f}]"
        wall = f"{run['wall_s'] / 60:.1f} min" if run.get("wall_s") else "–"
        lines.append(f"| {m0} {cell(m0)} | {m1} {cell(m1)} ({gain:+.0f} points, intervals "
                     f"{'overlap' if overlap else 'apart'}) | {wall} |")
    lines.append("per-stage wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in stage_seconds(dest).items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("name")
    s.add_argument("--wall-s", type=float)
    s.add_argument("--command", default="make run")
    s.add_argument("--results", type=Path, default=REPO / "results")
    s.add_argument("--logs", type=Path, default=REPO / "logs")
    t = sub.add_parser("table")
    t.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "save":
        print(save(a.name, a.wall_s, a.command, a.results, a.logs))
    else:
        print(table(a.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
