"""A small virtual environment made on the spot for sandbox tests and benchmarks: a venv placed
wherever the caller says (under /tmp, behind a symlink, under a path with a space) holding only the named
packages, hard-linked from this environment (copied when the link crosses file systems)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def make_venv(where, packages=("numpy",)) -> str:
    """``python -m venv --without-pip`` at ``where`` plus ``packages`` (top-level import names, with their
    vendored ``NAME.libs`` shared libraries); returns the venv's python. ~0.1 s for numpy on one file system.
    Raises CalledProcessError when the venv cannot be made, ValueError for a package not installed here."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = os.path.join(str(where), "bin", "python")
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"make_venv: {name!r} is not an installed package here")
        src = list(spec.submodule_search_locations)[0]
        for tree in (src, src + ".libs"):
            if os.path.isdir(tree):
                shutil.copytree(tree, os.path.join(site, os.path.basename(tree)), copy_function=_link_or_copy,
                                symlinks=True)
    return python
