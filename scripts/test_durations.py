"""Keep the durations of a reference run of the test suite, with the machine it ran on.

    python scripts/test_durations.py save JUNIT_XML [--name NAME] [--wall-s S] [--note TEXT]
    python scripts/test_durations.py table RUN [--top N]

``save`` copies pytest's JUnit XML (``pytest --junitxml``) into ``docs/measurements/tests/NAME/`` (NAME: the
commit's short hash by default) with ``run.json`` (CPU model, cores, the flags that decide precision and speed,
commit, wall time) and ``durations.md`` (the total, the time per module and the slowest tests), so the docs'
numbers about the suite have a kept source; the ISA caps in ``run.json`` (``ATEN_CPU_CAPABILITY`` and the like)
are read from the environment ``save`` runs in, so give it the run's. ``table`` prints ``durations.md``'s content
again from the kept XML (RUN: a folder, or a kept run's name such as ``63aad35-amx``).
Each test's time is the sum of its set-up, call and tear-down (a module fixture's cost lands on the test that
first used it), as pytest's ``--durations`` counts it. With several pytest-xdist workers (``make test`` runs two)
the tests overlap, so their total exceeds the session's time, which the table gives as well (the XML's
``testsuite`` time: pytest's start to its end, set-up of the environment not included).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from measurements import machine  # noqa: E402  (one definition of "the machine" for every kept measurement)


def cases(junit: Path) -> list[dict]:
    """Every test case of the XML: ``{"module", "name", "seconds", "outcome"}`` (outcome passed, failed, error,
    skipped)."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
        module = case.get("classname", "").split(".")[-1] or case.get("file", "?")
        out.append({"module": module, "name": case.get("name"), "seconds": float(case.get("time") or 0),
                    "outcome": outcome})
    return out


TOP = 30   # slowest tests listed


def table(junit: Path, run: dict | None = None, top: int = TOP) -> str:
    """Markdown: the machine, the counts by outcome, the total, the time per module and the ``top`` slowest."""
    rows = cases(junit)
    session_s = float(next(ET.parse(junit).getroot().iter("testsuite")).get("time") or 0)
    total = sum(r["seconds"] for r in rows)
    counts = defaultdict(int)
    per_module = defaultdict(float)
    for r in rows:
        counts[r["outcome"]] += 1
        per_module[r["module"]] += r["seconds"]
    lines = []
    if run:
        m = run["machine"]
        lines += [f"machine: {m['cpu']} (family {m['family']} model {m['model']}, {m['cores']} cores, flags "
                  f"{', '.join(m['flags']) or 'none of ' + 'avx2/avx512f/avx512_bf16/amx_bf16'}); "
                  f"commit {run['commit'][:12]}" + (f"; wall {run['wall_s'] / 60:.1f} min" if run.get("wall_s")
                                                     else "") + (f"; {run['note']}" if run.get("note") else ""), ""]
    lines += [f"{len(rows)} items: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
              + f"; pytest session {session_s:.0f} s (**{session_s / 60:.1f} min**); total of test times {total:.0f} s "
              f"({total / 60:.1f} min)", "",
              "| module | s | share |", "|---|---:|---:|"]
    for mod, s in sorted(per_module.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {mod} | {s:.1f} | {100 * s / total:.1f}% |")
    lines += ["", f"slowest {top}:", "", "| test | s |", "|---|---:|"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:top]:
        lines.append(f"| {r['module']}::{r['name']} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def save(junit: Path, name: str | None, wall_s: float | None, note: str) -> Path:
    """Keep ``junit`` with the machine and the commit of the checkout that ran it (the git repository holding the
    junit file, e.g. a clean clone's build/; this repository's HEAD if it is in none)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(junit).resolve().parent, capture_output=True,
                            text=True).stdout.strip() or \
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dest = REPO / "docs" / "measurements" / "tests" / (name or commit[:7])
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(junit, dest / "junit.xml")
    run = {"machine": machine(), "commit": commit, "wall_s": wall_s, "note": note}
    (dest / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    (dest / "durations.md").write_text(table(dest / "junit.xml", run))
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("junit", type=Path)
    s.add_argument("--name")
    s.add_argument("--wall-s", type=float)
    s.add_argument("--note", default="")
    t = sub.add_parser("table")
    t.add_argument("run", type=Path)
    t.add_argument("--top", type=int, default=TOP)
    a = ap.parse_args(argv)
    if a.cmd == "save":
        print(save(a.junit, a.name, a.wall_s, a.note))
    else:
        folder = a.run if a.run.is_dir() else REPO / "docs" / "measurements" / "tests" / a.run
        run_json = folder / "run.json"
        sys.stdout.write(table(folder / "junit.xml", json.loads(run_json.read_text()) if run_json.exists() else None,
                               a.top))


if __name__ == "__main__":
    main()
