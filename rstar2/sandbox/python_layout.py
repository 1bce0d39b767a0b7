"""Where the sandbox's Python lives, and what must be mounted so every tool call sees it (paper §3.1).

A zygote runs ``python -I`` inside the sandbox, so it needs the interpreter, its standard library and the
environment's site-packages at the very paths the host sees them: Python finds ``pyvenv.cfg`` next to the
path it was started by, and ``sys.path`` names absolute paths. These trees can live anywhere: under ``/tmp``
(a checkout on a cluster node), under a 0700 home (pyenv, uv), behind a symlink, with spaces in the path.

Two places hide them, and both are handled from the list this module computes (``PythonLayout.roots``):

- bubblewrap shows only what it binds: each root is bound read-only at its own path (``isolation.py``);
- each call's private ``/tmp`` (and, in ``uid`` mode, an empty tmpfs over a directory the call's uid cannot
  traverse, such as ``/root``) is mounted over what the zygote sees, so the roots under those are bound
  again after it, per call (``per_call_mounts``; done in ``_zygote.py``).

Entries that ``.pth`` files add outside the Python trees are roots too, except editable installs (PEP 610
``direct_url.json``) and directories holding the host's working directory: the project's files stay hidden.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import urllib.parse
from dataclasses import dataclass

# What `python -I` reports about itself, run the way the zygote is started (same env, cwd "/").
_QUERY = ("import json, sys\n"
          "print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix, "
          "'base_prefix': sys.base_prefix, 'path': sys.path}))")
ZYGOTE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class PythonLayout:
    """executable, prefix, base_prefix: as ``python -I`` reports them (unresolved paths); path: its
    ``sys.path`` entries that exist on the host and must exist in a call (editable installs dropped);
    roots: ``(host_source, sandbox_path)`` pairs to bind so all of them resolve, none below another, sorted."""
    executable: str
    prefix: str
    base_prefix: str
    path: tuple[str, ...]
    roots: tuple[tuple[str, str], ...]


def under(path: str, dirs) -> bool:
    """True when ``path`` is one of ``dirs`` or lies below one of them (textually, no symlinks resolved)."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _editable_roots(site_dirs: list[str]) -> list[str]:
    """Project directories installed editable into ``site_dirs`` (PEP 610: dir_info.editable)."""
    import importlib.metadata
    found = []
    for dist in importlib.metadata.distributions(path=site_dirs):
        try:
            info = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        if isinstance(info, dict) and (info.get("dir_info") or {}).get("editable") and \
                str(info.get("url", "")).startswith("file://"):
            found.append(os.path.realpath(urllib.parse.unquote(urllib.parse.urlparse(info["url"]).path)))
    return found


@functools.lru_cache(maxsize=None)
def python_layout(python: str, cwd: str) -> PythonLayout:
    """Ask ``python`` (absolute path) where it lives and compute the roots to mount; ``cwd`` is the host
    process's working directory (a ``.pth`` entry that holds it is the project, never mounted).
    ~25 ms once per process and interpreter. Raises RuntimeError when ``python`` cannot be run."""
    try:
        out = subprocess.run([python, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=60,
                             env=ZYGOTE_ENV, cwd="/")
        q = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise RuntimeError(f"cannot ask the sandbox's Python {python!r} where it lives: {e}") from None
    trees = []
    for p in (q["prefix"], q["base_prefix"], q["executable"]):
        for v in (os.path.abspath(p), os.path.realpath(p)):
            if v not in trees:
                trees.append(v)
    entries = [e for e in q["path"] if os.path.exists(e)]
    extra = [e for e in entries if not under(e, trees + ["/usr"])]
    if extra:  # rare (a .pth naming a directory): only then is scanning the installed distributions worth it
        editable = _editable_roots([e for e in entries if e not in extra])
        keep = [e for e in extra if not under(os.path.realpath(e), editable)
                and not under(cwd, [e, os.path.realpath(e)])]
        entries = [e for e in entries if e not in extra or e in keep]
        extra = keep
    # Every path is wanted at its real path and at the path Python names; a path below another one is seen
    # through the outer bind, and its symlinks lead to real paths that are roots too (or under /usr).
    wanted = sorted({os.path.realpath(p) for p in trees + extra} | set(trees + extra))
    roots: list[tuple[str, str]] = []
    for dest in wanted:
        if dest != "/" and not under(dest, ["/usr"] + [r[1] for r in roots]):  # /usr is bound whole
            roots.append((os.path.realpath(dest), dest))
    return PythonLayout(q["executable"], q["prefix"], q["base_prefix"], tuple(entries), tuple(roots))


def _untraversable_ancestor(path: str) -> str | None:
    """The outermost ancestor of ``path`` that another uid cannot enter (no o+x), if any."""
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        try:
            if not os.stat(d).st_mode & 0o001:
                return d
        except OSError:
            return None
    return None


def per_call_mounts(layout: PythonLayout, mode: str) -> dict:
    """Zygote config for a call's own mount namespace (``mode``: the isolation mode): ``cover`` lists the
    directories a call gets an empty tmpfs over (only in ``uid`` mode, where host directories such as a 0700
    home would stop the call's uid; bubblewrap already makes every parent of a root 0755); ``keep`` the
    ``[path, is_dir]`` roots hidden by the private /tmp or a cover, which each call binds again at the same
    path; ``mkdirs`` the parents their mount points need there, in creation order."""
    cover: list[str] = []
    if mode == "uid":
        for _, dest in layout.roots:
            d = _untraversable_ancestor(dest)
            if d and d not in cover and not under(d, ["/tmp"]):
                cover.append(d)
    keep: list[list] = []
    mkdirs: list[str] = []
    for _, dest in layout.roots:  # sorted, none below another
        hider = next((h for h in ["/tmp"] + cover if dest.startswith(h + "/")), None)
        if hider is None:
            continue
        keep.append([dest, os.path.isdir(dest)])
        parents, d = [], os.path.dirname(dest)
        while d != hider:
            parents.insert(0, d)
            d = os.path.dirname(d)
        mkdirs += [d for d in parents if d not in mkdirs]
    return {"cover": cover, "keep": keep, "mkdirs": mkdirs}
