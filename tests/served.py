"""The test session's stage server (rstar2/stages/server.py): stage jobs that Snakemake starts in the tests
(``rstar2 <stage>``) fork from one process per test worker that has torch, transformers and TRL imported, instead of
importing them again (a tiny RL job: 11.0 s unserved, 4.4-4.5 s served on a 2-core Xeon; docs/tests.md), and so do
the stage runner scripts of tests/test_rl_resume.py and tests/test_rl_faults.py (``python -m rstar2.stage_client``).
``configure`` (from conftest's ``pytest_configure``) names the socket in ``$RSTAR2_STAGE_SERVER`` before any test
module builds its environment; the first workflow copy (conftest ``copy_workflow``) starts the server; ``stop`` ends
it. Until it answers, or where a job's import-time environment differs from the session's, jobs import for
themselves, so no result depends on it. ``RSTAR2_TEST_STAGE_SERVER=0`` runs the suite without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# what the tests add to the environment of the stages they start (:func:`env`); the server imports under it too
SESSION = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
# what Snakemake sets to a job's threads (snakemake/shell.py)
SNAKEMAKE_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

_state: dict = {}


def configure() -> None:
    """Name this process's server socket in ``$RSTAR2_STAGE_SERVER`` (inherited by every job the tests start) and
    fix the threads of the tests' local Snakemake jobs (:func:`snakemake_args`): the worker's OMP_NUM_THREADS (conftest
    gives each of N workers cores // N), else every core."""
    from rstar2.stage_client import ENV_VAR

    threads = os.environ.get("OMP_NUM_THREADS", "")
    _state["threads"] = threads if threads.isdigit() and int(threads) > 0 else str(len(os.sched_getaffinity(0)))
    if os.environ.get("RSTAR2_TEST_STAGE_SERVER") == "0":
        os.environ.pop(ENV_VAR, None)
    else:
        _state["folder"] = Path(tempfile.mkdtemp(prefix="rstar2-stage-server-"))
        os.environ[ENV_VAR] = str(_state["folder"] / "socket")
    # frozen here: tests change this process's environment as they go (vLLM's import sets a variable, a torch
    # compile two more), and a job must see what the server saw
    _state["base"] = dict(os.environ)


def snakemake_args() -> list[str]:
    """Arguments of every local Snakemake run of the tests: ``--max-threads`` the worker's threads. Snakemake sets a
    job's OMP_NUM_THREADS and the like to its rule's ``threads`` (2 for training), which under two test workers on two
    cores oversubscribes them (benchmarks/bench_threads_per_worker.py); with every job at the worker's count, the
    jobs also match the stage server's environment and are served."""
    return ["--max-threads", _state["threads"]]


def env() -> dict[str, str]:
    """The environment of a stage process the tests start (a Snakemake run, a stage runner script): this process's
    as it was when the session started (:func:`configure`), offline, unbuffered, and with every thread variable
    Snakemake sets at the worker's count. The server's is the same, so these processes are served."""
    return {**_state["base"], **SESSION, **dict.fromkeys(SNAKEMAKE_THREAD_VARS, _state["threads"])}


def start() -> None:
    """Start the server once per process (a no-op when disabled or started)."""
    if "folder" not in _state or "proc" in _state:
        return
    log = open(_state["folder"] / "server.log", "w")
    socket = str(_state["folder"] / "socket")   # configure() named it in $RSTAR2_STAGE_SERVER
    _state["proc"] = subprocess.Popen([sys.executable, "-m", "rstar2.cli", "stage-server", socket],
                                      env=env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True)


def stop() -> None:
    proc = _state.pop("proc", None)
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if "folder" in _state:
        shutil.rmtree(_state.pop("folder"), ignore_errors=True)
