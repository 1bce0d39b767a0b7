"""The requirements that a folder of wheels lacks for another Python than the one that made it.

`pip wheel` on the host resolves environment markers for the host's Python, and cannot be told another: on 3.11.7 it
leaves out what a dependency needs only below 3.11.3 (redis: ``async-timeout; python_full_version < "3.11.3"``), which
Debian bookworm's 3.11.2 in the image then cannot find. This reads each wheel's Requires-Dist and prints, one per
line, those whose marker holds for ``--python`` and whose project has no wheel in the folder
(scripts/container_wheels.sh makes wheels of them and asks again until none is left). The wheels named by
``--no-deps`` are installed without their dependencies (scripts/install_python.sh): theirs are not asked for.

Usage: python scripts/wheel_closure.py WHEEL_DIR --python 3.11.2 [--no-deps PROJECT ...]
"""

from __future__ import annotations

import argparse
import re
import zipfile
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ImportError:   # a venv without packaging still has pip's copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing(wheel_dir: Path, python: str, no_deps: tuple[str, ...] = ()) -> list[str]:
    """Requirement strings (no markers) needed under Python ``python`` (e.g. "3.11.2") by the wheels in ``wheel_dir``
    (but those of projects ``no_deps``) whose projects have no wheel there, sorted. Raises ValueError for a version that
    is not X.Y.Z."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", python):
        raise ValueError(f"--python must be X.Y.Z, got {python!r}")
    env = {**default_environment(), "python_full_version": python,
           "python_version": ".".join(python.split(".")[:2]), "implementation_version": python, "extra": ""}
    wheels = sorted(wheel_dir.glob("*.whl"))
    have = {_canonical(w.name.split("-")[0]) for w in wheels}
    skip = {_canonical(n) for n in no_deps}
    need: set[str] = set()
    for w in wheels:
        if _canonical(w.name.split("-")[0]) in skip:
            continue
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode("utf-8", "replace").splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if _canonical(req.name) in have or (req.marker is not None and not req.marker.evaluate(env)):
                continue
            req.marker = None
            need.add(str(req))
    return sorted(need)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel_dir", type=Path)
    p.add_argument("--python", required=True)
    p.add_argument("--no-deps", nargs="*", default=[])
    a = p.parse_args()
    for req in missing(a.wheel_dir, a.python, tuple(a.no_deps)):
        print(req)


if __name__ == "__main__":
    main()
