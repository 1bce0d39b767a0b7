"""The pool's start-up probe: one real call per zygote kind, so a sandbox that hides part of Python fails at
start with one line instead of failing every later call (paper §3.1: the environment service must be
reliable under load; a ``ModuleNotFoundError`` in every tool response would be read as the model's error).

The probe goes through the same path as any call (fork, private /tmp, per-call uid, limits) and checks, at
a few stat calls' cost: every host ``sys.path`` entry of the sandbox's Python exists inside the call, as
does ``sys.executable``; each module the kind preloads is importable and its file is still there (a
preloaded module needs no file until it imports a submodule lazily); every other kind's top-level modules
can be found (a call may import numpy in the stdlib zygote). A module the host's Python cannot find either
is not the sandbox's fault and is only warned about (as the zygote already does for its preloads).
"""

from __future__ import annotations

import importlib.machinery
import json
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from .python_layout import PythonLayout
from .results import SandboxLimits

PROBE_LIMITS = SandboxLimits(timeout_s=10.0)  # a few stat calls, with room for a loaded host

# Only modules every zygote has loaded before any call (a hidden stdlib must not stop the probe itself).
_CODE = """
import json, os, sys
paths, preloaded, others = {paths!r}, {preloaded!r}, {others!r}
gone = [p for p in paths + [sys.executable] if not os.path.exists(p)]
bad = {{}}
for name in preloaded:
    try:
        __import__(name)
        f = getattr(sys.modules[name], '__file__', None)
        if f and not os.path.exists(f):
            bad[name] = 'its file ' + f + ' is not there'
    except Exception as e:
        bad[name] = type(e).__name__ + ': ' + str(e)
for name in others:
    try:
        if not any(f.find_spec(name, None) for f in sys.meta_path if hasattr(f, 'find_spec')):
            bad[name] = 'ModuleNotFoundError'
    except Exception as e:
        bad[name] = type(e).__name__ + ': ' + str(e)
print(json.dumps({{'gone': gone, 'bad': bad}}))
"""


def probe_code(layout: PythonLayout, preloaded: list[str], others: list[str]) -> str:
    """The snippet for one kind: ``preloaded`` (that kind's module names, imported; free when preloaded) and
    ``others`` (top-level names of the other kinds' modules, only looked up). Prints one JSON line."""
    tops = sorted({m.split(".")[0] for m in others} - set(preloaded))
    return _CODE.format(paths=list(layout.path), preloaded=list(preloaded), others=tops)


def probe_failure(kind: str, layout: PythonLayout, stdout: str, status: str, stderr: str) -> str | None:
    """Read the probe's answer; return the one-line error for the pool's start, or None when all is well.

    A module counts only when the host's Python finds it on one of ``layout.path``; the error names the
    first such module and the sys.path entry that holds it on the host but does not exist inside a call.
    """
    try:
        ans = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = stderr.strip().splitlines()[-1] if stderr.strip() else status
        return f"sandbox start-up probe in the {kind} zygote did not run ({status}): {last}"
    gone = ans["gone"]
    for name, why in ans["bad"].items():
        top = name.split(".")[0]
        spec = importlib.machinery.PathFinder.find_spec(top, list(layout.path))
        if spec is None:
            continue  # not installed for this Python at all
        origin = spec.origin or next(iter(spec.submodule_search_locations or []), "?")  # "?": never seen
        holder = max((p for p in gone if origin.startswith(p.rstrip("/") + "/")), key=len, default=None)
        where = (f"sys.path entry {holder} does not exist inside the sandbox" if holder else
                 f"it is {origin} on the host ({why})")
        return f"sandbox start-up probe: the {kind} zygote's calls cannot import {name}: {where}"
    if gone:
        return (f"sandbox start-up probe: {gone[0]} (on the sandbox Python's sys.path) does not exist inside "
                f"the {kind} zygote's calls")
    return None


def probe_workers(workers, layout: PythonLayout, ids, grace_s: float, isolation: str) -> None:
    """Send the probe to the first ready zygote of each kind in ``workers`` (pool ``_Worker`` objects, with
    ``kind``, ``want`` and ``submit``), all at once (~20-40 ms on 2 loaded cores); ``ids`` yields call ids.
    Raises RuntimeError, one line ending in ``isolation`` (the isolation's description), when a kind fails
    or does not answer within the probe's timeout + ``grace_s`` (the pool's watchdog is not running yet)."""
    first: dict = {}
    for w in workers:
        first.setdefault(w.kind, w)
    every = {m for w in first.values() for m in w.want}
    futs = {}
    for kind, w in first.items():
        fut: Future = Future()
        w.submit(next(ids), probe_code(layout, w.want, sorted(every - set(w.want))), "", PROBE_LIMITS, fut)
        futs[kind] = fut
    for kind, fut in futs.items():
        try:
            res = fut.result(timeout=PROBE_LIMITS.timeout_s + grace_s)
        except FutureTimeout:
            raise RuntimeError(f"sandbox start-up probe: the {kind} zygote did not answer within "
                               f"{PROBE_LIMITS.timeout_s + grace_s:.0f} s (isolation: {isolation})") from None
        why = probe_failure(kind, layout, res.stdout, res.status, res.stderr)
        if why:
            raise RuntimeError(f"{why} (isolation: {isolation})")
