"""How the suite's pytest-xdist workers (`make test` runs two) share the tests and survive a crash; the hooks in
tests/conftest.py call these.

A module's tests stay on one worker (its module fixtures are built once), modules that share a machine-wide resource
share a group (one SLURM cluster's fixed ports and state directory at a time; the torch.distributed rendezvous port),
and the groups are handed out longest first, so that the last group to start is a short one. A worker that crashes
(e.g. a native abort in an engine) fails the test it was running, once, and the session goes on."""

from __future__ import annotations

import functools
import os
import stat

SHARED_GROUPS = {"test_cluster": "slurm", "test_slurm_live": "slurm", "test_two_nodes": "slurm"}
# seconds per group in the kept reference run (docs/measurements/tests/e1d1394-amx, 2-core Xeon, two workers);
# a group not listed counts as short
GROUP_SECONDS = {"test_learning_signal": 642, "slurm": 356, "test_workflow": 346, "test_vllm_dag": 224,
                 "test_fsdp": 195, "test_rl_resume": 182, "test_vllm_server": 104, "test_containers": 96,
                 "test_rl_faults": 86, "test_interrupts": 73, "test_vllm_rollout": 60, "test_report": 52,
                 "test_vllm_rl": 51, "test_distributed": 44, "test_sandbox_adversarial": 40,
                 "test_interrupts_workflow": 40, "test_sandbox_service": 33}
# in the controller: the tests a worker has started (pytest_runtest_logstart, which xdist relays from the workers)
STARTED: set[str] = set()


def group(nodeid: str) -> str:
    """The scheduling group of a test: its module's name, or the group the module shares (``SHARED_GROUPS``)."""
    module = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED_GROUPS.get(module, module)


def module_groups(config, log):
    """xdist's scope scheduling with this suite's groups as scopes, handed out in collection order."""
    config.option.loadscopereorder = False   # keep the longest-first order of pytest_collection_modifyitems
    return module_groups_class()(config, log)


@functools.cache
def module_groups_class():
    """The scheduler class (built on first use: xdist is imported only where it schedules)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

        def _reschedule(self, node) -> None:
            # the next group goes to a worker only when it is on its last test (xdist's own rule queues two groups
            # ahead, so a long group could wait behind another on a busy worker while the other worker idles)
            if node.shutting_down:
                return
            if self.workqueue and self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

        def remove_node(self, node) -> str | None:
            return requeue_after_crash(self, node)

    return ModuleGroups


def requeue_after_crash(sched, node) -> str | None:
    """``remove_node`` of the scheduler ``sched`` for a worker ``node`` that left: None if it had nothing left to
    run; else the test it crashed in, whose groups with tests left go back in the queue. xdist's own queues that test
    again too, so a test that crashes its worker every time (a native abort on this CPU) ran on each replacement
    worker up to the restart limit, its module's fixtures rebuilt each time (9 failures; measured): a test that had
    started is reported failed once and not run again. A test that had not started (a worker holds its next test
    before it runs the current one, so an idle worker killed from outside holds one) is reported and still runs, as
    xdist does."""
    workload = sched.assigned_work.pop(node)
    left = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
    if not left:
        return None
    if left[0] in STARTED:
        for unit in workload.values():
            if left[0] in unit:
                unit[left[0]] = True
    sched.workqueue.update((scope, unit) for scope, unit in workload.items() if not all(unit.values()))
    for other in sched.assigned_work:
        sched._reschedule(other)
    return left[0]


def release_pipes_in_forked_children(config) -> None:
    """In an xdist worker, a child forked without exec (multiprocessing's fork, vLLM's engine core, ``os.fork``) has
    its own copies of the pipes to the controller: the two the controller reads and writes the worker through, and
    (where the session's stderr is a pipe) pytest's and faulthandler's copies of the worker's stderr. When the worker
    crashes, the controller waits for the end of the first until every such child has exited, and whoever reads the
    run's output waits for the end of the last: a forked child that outlives its crashed worker hangs the session
    (one sleeping 120 s held a 16 s session's end for 120 s; measured). In each forked child, every descriptor above 2
    on a pipe the worker held when pytest configured it (only those, to the controller, exist then: execnet's,
    then pytest's capture, then the conftest) is pointed at /dev/null: not closed, so that nothing the child opens
    later gets its number, which the worker's file objects would close at exit. The child's own 0-2 are its output,
    left as they are, and faulthandler, where enabled, writes a fatal error's traceback to its fd 2."""
    if not hasattr(config, "workerinput"):
        return   # not an xdist worker

    def pipes() -> dict[int, tuple[int, int]]:
        found = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                st = os.fstat(int(name))
            except OSError:   # the listing's own descriptor
                continue
            if stat.S_ISFIFO(st.st_mode) and int(name) > 2:
                found[int(name)] = (st.st_dev, st.st_ino)
        return found

    controller = set(pipes().values())

    def release() -> None:
        import faulthandler

        null = os.open(os.devnull, os.O_RDWR)
        for fd, key in pipes().items():
            if key in controller:
                os.dup2(null, fd, inheritable=False)
        os.close(null)
        if faulthandler.is_enabled():
            faulthandler.enable(file=2, all_threads=True)

    os.register_at_fork(after_in_child=release)
