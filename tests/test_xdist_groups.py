"""The suite's pytest-xdist scheduling (tests/xdist_workers.py) runs every test and ends, a worker crash included."""

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


# a test that forks a long-lived child (as vLLM's engine core or multiprocessing's fork start) and then kills its
# own worker, every time it runs (as a native abort would); the child keeps none of the test run's output streams,
# as a daemon with its own log
KILLED_BESIDE_A_CHILD = '''
import os, signal, time
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
    os.kill(os.getpid(), signal.SIGKILL)

def test_3(): pass
'''


# the inner sessions start no stage server (a killed worker's would leave its folder behind)
NO_SERVER = {**os.environ, "RSTAR2_TEST_STAGE_SERVER": "0"}


def _suite(tmp_path, modules: dict[str, str]) -> None:
    for name in ("conftest.py", "served.py", "xdist_workers.py"):
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    for name, text in modules.items():
        (tmp_path / f"test_sched_{name}.py").write_text(text)


def test_a_worker_killed_beside_a_forked_child_is_reported_once_and_the_session_ends(tmp_path):
    """The worker is killed while a child it forked lives on: the session must report that test as failed once and
    run the rest of its module on a replacement worker, within seconds. Without the fork hook (tests/xdist_workers.py)
    the controller waited for the child's copy of the worker's pipe (the child's lifetime; for one that never exits,
    forever); without its remove_node the crashing test ran again on every replacement worker, up to the restart
    limit (9 failures; both measured)."""
    _suite(tmp_path, {"a": "def test_1(): pass\ndef test_2(): pass\n", "b": KILLED_BESIDE_A_CHILD,
                      "c": "def test_1(): pass\n"})
    start = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rf", "."],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60, env=NO_SERVER)
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
    xdist replaces the crashed worker; the run must report the crash as one failure and run everything else, the
    rest of the crashed module included, and end (the scheduler once waited forever for a worker given a module
    with nothing left to run: measured as a hang until killed)."""
    three, one = "def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n", "def test_1(): pass\n"
    _suite(tmp_path, {"a": three, "b": three, "c": three, "d": CRASH_ONCE, "e": one, "f": one, "g": one})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rf", "."],
                       cwd=tmp_path, capture_output=True, text=True, timeout=90, env=NO_SERVER)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "FAILED test_sched_d.py::test_2 - worker" in out and "crashed" in out, out[-3000:]
    for name in "abcefg":
        assert f"test_sched_{name}.py" not in out.split("short test summary")[-1], out[-3000:]
    assert "passed" in out.splitlines()[-1], out[-2000:]


def test_a_crash_fails_a_started_test_once_and_an_unstarted_one_still_runs():
    """The scheduler's ``remove_node`` (``requeue_after_crash``): the test a worker crashed in is done if it had
    started (reported once, not run again), pending if the worker held it unstarted; a finished group is not queued
    again, and the other worker, on its last test, gets the crashed group's rest."""
    from collections import OrderedDict

    import xdist_workers

    class Node:   # what the scheduler uses of a worker
        def __init__(self):
            self.sent, self.shutting_down = [], False

        def send_runtest_some(self, indices):
            self.sent += indices

        def shutdown(self):
            self.shutting_down = True

    cls = xdist_workers.module_groups_class()
    for started in (True, False):
        xdist_workers.STARTED.clear()
        if started:
            xdist_workers.STARTED.update({"test_m.py::t1", "test_m.py::t2"})
        crashed, other = Node(), Node()
        sched = cls.__new__(cls)   # the scheduler's state alone: no config, no workers
        sched.workqueue = OrderedDict()
        sched.assigned_work = {crashed: {"test_done": {"test_done.py::t1": True},
                                         "test_m": {"test_m.py::t1": True, "test_m.py::t2": False,
                                                    "test_m.py::t3": False}},
                               other: {"test_x": {"test_x.py::t1": True, "test_x.py::t2": False}}}
        sched.registered_collections = {other: ["test_m.py::t1", "test_m.py::t2", "test_m.py::t3", "test_x.py::t1",
                                                "test_x.py::t2"]}
        assert sched.remove_node(crashed) == "test_m.py::t2"
        assert crashed not in sched.assigned_work and not sched.workqueue
        assert sched.assigned_work[other]["test_m"] == {"test_m.py::t1": True, "test_m.py::t2": started,
                                                        "test_m.py::t3": False}
        assert other.sent == ([2] if started else [1, 2]) and other.shutting_down
    xdist_workers.STARTED.clear()
    sched = cls.__new__(cls)
    sched.workqueue, sched.assigned_work = OrderedDict(), {crashed: {"test_done": {"test_done.py::t1": True}}}
    assert sched.remove_node(crashed) is None and not sched.workqueue
