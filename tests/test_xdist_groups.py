"""The suite's pytest-xdist scheduling (tests/conftest.py) runs every test and ends, a worker crash included."""

import shutil
import subprocess
import sys
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


def test_a_worker_crash_fails_its_test_and_the_session_still_ends(tmp_path):
    """Seven modules (three of 3 tests, one with a test that kills its worker once, three of 1 test) on two workers:
    xdist replaces the crashed worker and queues again every module that worker had, finished ones included; the
    run must report the crash as a failure and run everything else, not wait forever for a worker whose queued
    module has nothing left to run (the override once did: measured as a hang until killed)."""
    for name in ("conftest.py", "served.py"):
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    for name in "abc":
        (tmp_path / f"test_sched_{name}.py").write_text("def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n")
    (tmp_path / "test_sched_d.py").write_text(CRASH_ONCE)
    for name in "efg":
        (tmp_path / f"test_sched_{name}.py").write_text("def test_1(): pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rf", "."],
                       cwd=tmp_path, capture_output=True, text=True, timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "FAILED test_sched_d.py::test_2 - worker" in out and "crashed" in out, out[-3000:]
    for name in "abcefg":
        assert f"test_sched_{name}.py" not in out.split("short test summary")[-1], out[-3000:]
    assert "passed" in out.splitlines()[-1], out[-2000:]
