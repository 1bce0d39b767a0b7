"""Render the documentation site's pictures into docs/img/ (committed, so building the site needs no workflow run).

    .venv/bin/python scripts/docs_screenshots.py            # both
    .venv/bin/python scripts/docs_screenshots.py rulegraph  # or: report

- ``rulegraph.svg``: ``snakemake --rulegraph`` on config.yaml, in a scratch copy of the workflow
  (``rstar2.reproduce.scratch_copy``), drawn by Graphviz ``dot`` (Debian package ``graphviz``).
- ``report_summary.png``, ``learning_result.png``, ``training_curves.png``: the report re-rendered with
  ``rstar2 report`` from the kept files of the default run (``docs/measurements/zen3_seed0_r3``: its RL stages'
  metrics, its evaluations and the report's own params), then ``summary.html`` photographed by headless Chromium
  (Debian package ``chromium``). The funnel and the sample trajectories were not kept, so the report shows "no
  data" there; the figures are the run's own numbers.

Raises SystemExit with one line when ``dot`` or ``chromium`` is missing or a command fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
RUN = REPO / "docs" / "measurements" / "zen3_seed0_r3"
BIN = Path(sys.executable).parent
MODEL_ORDER = ("base", "sft", "rl_stage1", "rl_stage2", "rl_stage3")   # the report compares the last with the first


def _need(cmd: str, package: str) -> str:
    path = shutil.which(cmd)
    if not path:
        raise SystemExit(f"docs_screenshots: '{cmd}' not found: install the Debian package '{package}'")
    return path


def rulegraph() -> Path:
    """``docs/img/rulegraph.svg`` from ``snakemake --rulegraph`` on the default config."""
    from rstar2.reproduce import scratch_copy

    dot = _need("dot", "graphviz")
    with tempfile.TemporaryDirectory() as tmp:
        wd = scratch_copy(REPO, Path(tmp) / "wf")
        graph = subprocess.run([str(BIN / "snakemake"), "--rulegraph", "--quiet", "all"], cwd=wd, check=True,
                               capture_output=True, text=True).stdout
        graph = graph[graph.index("digraph"):]   # Snakemake may print notes before the graph
    svg = subprocess.run([dot, "-Tsvg"], input=graph, check=True, capture_output=True, text=True).stdout
    out = OUT / "rulegraph.svg"
    out.write_text(svg)
    return out


def report() -> list[Path]:
    """The default run's report re-rendered from its kept files, and a screenshot of its HTML summary."""
    chromium = _need("chromium", "chromium")
    params = json.loads((RUN / "manifest.json").read_text())["params"]
    inputs = {"rl_stages": {s.name: str(s) for s in sorted((RUN / "rl").iterdir())},
              "eval": {m: str(RUN / "eval" / m) for m in MODEL_ORDER if (RUN / "eval" / m).is_dir()}}
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "report"
        subprocess.run([str(BIN / "rstar2"), "report", "--params", json.dumps(params), "--out", str(rep),
                        "--inputs", json.dumps(inputs)], check=True, capture_output=True)
        shot = OUT / "report_summary.png"
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={Path(tmp) / 'profile'}", "--window-size=1100,1400",
                        f"--screenshot={shot}", (rep / "summary.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
        written = [shot]
        for name in ("learning_result.png", "training_curves.png"):
            shutil.copy2(rep / name, OUT / name)
            written.append(OUT / name)
    return written


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    which = argv or ["rulegraph", "report"]
    for name in which:
        paths = {"rulegraph": lambda: [rulegraph()], "report": report}[name]()
        for p in paths:
            print(f"{p.relative_to(REPO)}  {p.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
