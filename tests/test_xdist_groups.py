"""The suite's pytest-xdist scheduling (tests/conftest.py) runs every test and ends, a worker crash included."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

CRASH_ONCE = '''
import os
from pathlib import Path

def test_1(): pass

def test_2():
    marker = Path(__file__).with_name("crashed")
    if not marker.exists():
        marker.write_text("")
        os._exit(1)   # the worker dies as if killed for memory

def test_3(): pass
'''


# a test that forks a long-lived child (as vLLM's engine core or multiprocessing's fork start) and then aborts the
# worker, every time it runs; the child keeps none of the test run's output streams, as a daemon with its own log
ABORT_WITH_A_CHILD = '''
import os, time
from pathlib import Path

def test_1(): pass

def test_2():
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(300)
        os._exit(0)
    with open(Path(__file__).with_name("children"), "a") as f:
        f.write(f"{pid}\\n")
    os.abort()

def test_3(): pass
'''


def _suite(tmp_path, modules: dict[str, str]) -> None:
    for name in ("conftest.py", "served.py"):
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    for name, text in modules.items():
        (tmp_path / f"test_sched_{name}.py").write_text(text)


def test_a_worker_that_aborts_beside_a_forked_child_is_reported_once_and_the_session_ends(tmp_path):
    """The worker aborts while a child it forked lives on: the session must report that test as failed once and
    run the rest of its module on a replacement worker, within seconds. Without the conftest's fork hook the
    controller waited for the child's copy of the worker's pipe (the child's lifetime; for one that never exits,
    forever); without its remove_node the aborting test ran again on every replacement worker, up to the restart
    limit (9 failures; both measured)."""
    _suite(tmp_path, {"a": "def test_1(): pass\ndef test_2(): pass\n", "b": ABORT_WITH_A_CHILD,
                      "c": "def test_1(): pass\n"})
    start = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rf", "."],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        children = (tmp_path / "children").read_text().split() if (tmp_path / "children").exists() else []
        for pid in children:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    took, out = time.monotonic() - start, r.stdout + r.stderr
    assert len(children) == 1, (children, out[-3000:])
    assert took < 30, (took, out[-3000:])
    assert r.returncode == 1 and out.count("FAILED test_sched_b.py::test_2 - worker") == 1, out[-3000:]
    assert "1 failed, 5 passed" in r.stdout.splitlines()[-1], out[-2000:]


def test_a_worker_crash_fails_its_test_and_the_session_still_ends(tmp_path):
    """Seven modules (three of 3 tests, one with a test that kills its worker once, three of 1 test) on two workers:
    xdist replaces the crashed worker and queues again every module that worker had, finished ones included; the
    run must report the crash as a failure and run everything else, not wait forever for a worker whose queued
    module has nothing left to run (the override once did: measured as a hang until killed)."""
    three, one = "def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n", "def test_1(): pass\n"
    _suite(tmp_path, {"a": three, "b": three, "c": three, "d": CRASH_ONCE, "e": one, "f": one, "g": one})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rf", "."],
                       cwd=tmp_path, capture_output=True, text=True, timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "FAILED test_sched_d.py::test_2 - worker" in out and "crashed" in out, out[-3000:]
    for name in "abcefg":
        assert f"test_sched_{name}.py" not in out.split("short test summary")[-1], out[-3000:]
    assert "passed" in out.splitlines()[-1], out[-2000:]
