"""Sandbox throughput and latency: our fork-server pool (isolation on) vs a fresh ``python3`` per call.

Issue 3 / paper §3.1. For each executor, snippet and concurrency c in (1, 16, 64), c client threads each run
calls back to back (closed loop); we report calls/s over the whole run and p50/p99 of per-call latency
(submit to result). Snippets: (a) trivial; (b) imports sympy and numpy and computes something small.

Usage: python benchmarks/bench_sandbox.py [--calls 400] [--baseline-calls 48] [--workers 2]
Targets (2 cores): trivial ≥400 calls/s at c=16 with p99 ≤80 ms, p50 ≤10 ms at c=1; sympy+numpy p50 ≤15 ms
at c=1 and ≥50× the baseline's throughput at c=16.

``--layout-ab [--before-zygote FILE]`` (issue 26) instead compares, in one run and interleaved over
``--rounds``: the zygote given (e.g. ``git show main:rstar2/sandbox/_zygote.py > /tmp/old.py``) and this one,
with Python where it is, and this one with a venv under /tmp whose trees each call binds again; per-call
latency at c=1 and c=16, the pool's start-up time with the share of its start-up probe, and the per-call
mount setup timed inside the sandbox with and without re-binding that venv.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rstar2.sandbox import Pool, SandboxLimits  # noqa: E402

SNIPPETS = {
    "trivial": "print(sum(range(1000)))",
    "sympy+numpy": ("import sympy, numpy as np\nx = sympy.symbols('x')\n"
                    "print(sympy.factor(x**2 - 1), int(np.arange(10).sum()))"),
}
LIMITS = SandboxLimits(timeout_s=10)


def baseline_call(code: str) -> bool:
    """code-judge's design: a fresh interpreter per call, own session, scrubbed env, timeout."""
    env = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"}
    try:  # a generous timeout: at c=64 the fresh interpreters' imports queue up on 2 cores
        r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, env=env, timeout=300,
                           start_new_session=True, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def drive(call, n: int, conc: int) -> dict:
    """Run ``n`` calls with ``conc`` closed-loop threads; return rate and latency percentiles (ms)."""
    lat: list[float] = []
    fails = [0]
    lock = threading.Lock()
    left = [n]

    def loop():
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            t0 = time.perf_counter()
            try:
                ok = call()
            except Exception:
                ok = False
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                fails[0] += not ok
    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    pct = lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    return {"rate": n / wall, "p50": pct(0.50), "p99": pct(0.99), "fails": fails[0], "n": n}


_MOUNT_MICRO = """
if __name__ == "__main__":
    import statistics
    for _ in range(2):
        for name, keep, mkdirs in (("private /tmp only", [], []),
                                   ("private /tmp + Python re-bound", KEEP, MKDIRS)):
            ts = []
            for i in range(CALLS):
                jd = os.path.join(WORKDIR, "jobx")
                _rmtree(jd)
                os.makedirs(jd, exist_ok=True)
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    KEEP, MKDIRS = keep, mkdirs
                    t0 = time.perf_counter()
                    _private_tmp(jd)
                    os.write(w, str(time.perf_counter() - t0).encode())
                    os._exit(0)
                os.close(w)
                ts.append(float(os.read(r, 100)))
                os.close(r)
                os.waitpid(pid, 0)
            ts.sort()
            print(f"| {name} | {1e6 * statistics.median(ts):.0f} | {1e6 * ts[int(0.9 * len(ts))]:.0f} |")
"""


def mount_setup_us(venv_python: str, calls: int) -> str:
    """The zygote's per-call mount setup timed inside a real sandbox (a copy of _zygote.py whose main forks
    children that only run ``_private_tmp``), with and without re-binding a venv that lives under /tmp."""
    import json
    import tempfile

    from rstar2.sandbox import isolation as iso_mod
    from rstar2.sandbox.python_layout import per_call_mounts, python_layout

    iso = iso_mod.detect("auto")
    if not iso.per_call_uid:
        return f"(no private /tmp per call under {iso.describe()}: nothing to re-bind)"
    src = open(iso_mod.ZYGOTE_SRC).read()
    guard = 'if __name__ == "__main__":\n    main()'
    assert guard in src, "the zygote's main guard moved: update _MOUNT_MICRO"
    layout = python_layout(venv_python, os.getcwd())
    cfg = {"private_tmp": True, "workdir": "/tmp/rstar2-sbx", **per_call_mounts(layout, iso.mode)}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src.replace(guard, f"CALLS = {calls}\n" + _MOUNT_MICRO))
    saved, iso_mod.ZYGOTE_SRC = iso_mod.ZYGOTE_SRC, f.name
    try:
        cmd = iso_mod.zygote_command(iso, json.dumps(cfg), layout)
        out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    finally:
        iso_mod.ZYGOTE_SRC = saved
        os.unlink(f.name)
    return (f"re-bound per call: {[k for k, _ in cfg['keep']]}\n| per-call mount setup | median us | p90 us |\n"
            f"|---|---|---|\n{out.stdout}{out.stderr[-2000:]}")


def layout_ab(a) -> None:
    """Issue 26: what keeping Python visible in every call costs, per call and at pool start-up."""
    import tempfile

    from rstar2.sandbox import isolation as iso_mod
    from rstar2.sandbox import pool as pool_mod
    from rstar2.sandbox.python_layout import python_layout

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from sandbox_venv import make_venv

    tmp = tempfile.mkdtemp(prefix="bench-sandbox-layout-")
    venv_python = make_venv(os.path.join(tmp, "proj", ".venv"), ("numpy", "sympy", "mpmath"))
    variants = [("after, Python in place", iso_mod.ZYGOTE_SRC, sys.executable),
                ("after, venv under /tmp", iso_mod.ZYGOTE_SRC, venv_python)]
    if a.before_zygote:
        variants.insert(0, ("before, Python in place", os.path.abspath(a.before_zygote), sys.executable))
    real_layout, real_probe = pool_mod.python_layout, pool_mod.Pool._probe
    probe_s: list[float] = []

    def timed_probe(self):
        t0 = time.perf_counter()
        real_probe(self)
        probe_s.append(time.perf_counter() - t0)
    pool_mod.Pool._probe = timed_probe
    cells: dict = {}
    try:
        for _ in range(a.rounds):
            for name, zygote, python in variants:
                iso_mod.ZYGOTE_SRC = zygote
                pool_mod.python_layout = lambda _python, cwd, _p=python: real_layout(_p, cwd)
                t0 = time.perf_counter()
                with Pool(LIMITS, workers=a.workers or 1, lean_workers=1, full_workers=0) as pool:
                    start = time.perf_counter() - t0
                    pool.run_many([(s, "") for s in SNIPPETS.values()] * 8)
                    cells.setdefault((name, "start-up"), []).append({"s": start, "probe": probe_s[-1]})
                    # fork to reaped exit as the zygote clocks it: the per-call setup without the client's noise
                    durs = sorted(pool.submit("pass").result().duration_s for _ in range(a.calls))
                    cells.setdefault((name, "fork"), []).append(1000 * durs[len(durs) // 2])
                    for snip, code in SNIPPETS.items():
                        for conc in (1, 16):
                            m = drive(lambda: pool.submit(code, "").result().status == "ok", a.calls, conc)
                            cells.setdefault((name, snip, conc), []).append(m)
        micro = mount_setup_us(venv_python, a.calls)
    finally:
        iso_mod.ZYGOTE_SRC, pool_mod.python_layout, pool_mod.Pool._probe = variants[-1][1], real_layout, real_probe
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# isolation: {iso_mod.detect(a.isolation).describe()}; cores={os.cpu_count()}; "
          f"load={os.getloadavg()[0]:.2f}; {a.rounds} rounds interleaved, medians of the rounds")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print("| variant | snippet | concurrency | calls/s | p50 ms | p99 ms | failed |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _ in variants:
        for snip in SNIPPETS:
            for conc in (1, 16):
                ms = cells[(name, snip, conc)]
                print(f"| {name} | {snip} | {conc} | {med([m['rate'] for m in ms]):.1f} | "
                      f"{med([m['p50'] for m in ms]):.2f} | {med([m['p99'] for m in ms]):.2f} | "
                      f"{sum(m['fails'] for m in ms)} |")
    print("\n| variant | `pass` call, zygote-side p50 ms | pool start-up s | of which start-up probe ms |\n"
          "|---|---|---|---|")
    for name, _, _ in variants:
        st = cells[(name, "start-up")]
        print(f"| {name} | {med(cells[(name, 'fork')]):.2f} | {med([x['s'] for x in st]):.3f} | "
              f"{1000 * med([x['probe'] for x in st]):.1f} |")
    print("\n" + micro)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="calls per cell for our executor")
    ap.add_argument("--baseline-calls", type=int, default=48, help="calls per cell for the fresh-interpreter baseline")
    ap.add_argument("--workers", type=int, default=None, help="zygotes (default: cores)")
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--layout-ab", action="store_true", help="issue 26: per-call cost of re-binding Python")
    ap.add_argument("--before-zygote", default=None, help="with --layout-ab: an older _zygote.py to compare")
    ap.add_argument("--rounds", type=int, default=3, help="with --layout-ab: interleaved rounds")
    a = ap.parse_args()
    if a.layout_ab:
        return layout_ab(a)
    rows = []
    with Pool(LIMITS, workers=a.workers, isolation=a.isolation) as pool:
        print(f"# isolation: {pool.isolation.describe()}; {len(pool.workers)} zygotes x {pool.slots} slots; "
              f"cores={os.cpu_count()}; load={os.getloadavg()[0]:.2f}", flush=True)
        pool.run_many([(s, "") for s in SNIPPETS.values()] * 8)  # warm-up
        for name, code in SNIPPETS.items():
            for conc in (1, 16, 64):
                ours = drive(lambda: pool.submit(code, "").result().status == "ok", a.calls, conc)
                rows.append(("pool", name, conc, ours))
                print(f"  pool      {name:12s} c={conc:<3d} {ours['rate']:8.1f}/s", flush=True)
    for name, code in SNIPPETS.items():
        for conc in (1, 16, 64):
            n = max(a.baseline_calls, conc) if conc > 1 else max(8, a.baseline_calls // 4)
            base = drive(lambda: baseline_call(code), n, conc)
            rows.append(("fresh", name, conc, base))
            print(f"  fresh     {name:12s} c={conc:<3d} {base['rate']:8.1f}/s", flush=True)
    print()
    print(f"| executor | snippet | concurrency | calls | calls/s | p50 ms | p99 ms | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for ex, name, conc, m in rows:
        print(f"| {ex} | {name} | {conc} | {m['n']} | {m['rate']:.1f} | {m['p50']:.1f} | {m['p99']:.1f} "
              f"| {m['fails']} |")
    by = {(ex, name, conc): m for ex, name, conc, m in rows}
    print()
    for name in SNIPPETS:
        ratio = by[("pool", name, 16)]["rate"] / by[("fresh", name, 16)]["rate"]
        print(f"{name}: pool/fresh throughput at c=16 = {ratio:.1f}x")


if __name__ == "__main__":
    main()
