"""The pre-imported stage server (rstar2/stages/server.py) that the suite's Snakemake jobs fork from: a served job
gets the client's directory, environment and streams and its exit status comes back; signals to the client reach
the job, a job killed by one kills the client with it, and a client SIGKILLed takes its job with it; a client whose
import-time environment differs, or one under a launcher, runs unserved with the same result. The jobs are real
``rstar2`` commands; one that must stay running has a FIFO nobody reads as its ``--log``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import served
from conftest import stage_params

from rstar2.stage_client import ENV_VAR, LAUNCHED

RSTAR2 = [sys.executable, "-m", "rstar2.cli"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stage_server")
    sock, log = folder / "socket", folder / "server.log"
    # the session's own environment (tests/served.py): a test before this one may have left e.g. WORLD_SIZE in this
    # process's, with which a client rightly runs unserved
    env = {k: v for k, v in served.env().items() if k != ENV_VAR and k not in LAUNCHED}
    proc = subprocess.Popen([sys.executable, "-m", "rstar2.cli", "stage-server", str(sock)], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while not sock.exists():
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.05)
    yield {"env": {**env, ENV_VAR: str(sock)}, "log": log}
    proc.terminate()
    proc.wait(timeout=30)
    assert not sock.exists(), "the server left its socket behind"


def _served(log: Path, stage: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith(f"[stage-server] {stage} ")]


def _sft_data_params(path: str) -> str:
    return json.dumps(stage_params("sft_data", overrides={"sft_data": {"sources": [
        {"name": "mine", "path": path, "format": "alpaca"}]}}))


def _job_processes(cwd: Path, exclude: int) -> list[int]:
    """Processes whose working directory is ``cwd`` (the served job runs there), other than ``exclude``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") == str(cwd) and int(proc.name) != exclude:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_served_job_runs_in_the_clients_folder_and_returns_its_status(server, tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps([{"instruction": "Say hi.", "input": "", "output": "hi"}]))
    done = subprocess.run([*RSTAR2, "sft-data", "--params", _sft_data_params("rows.json"), "--out", "out",
                           "--log", "job.log"], cwd=tmp_path, env={**server["env"], "RSTAR2_MARK": "x"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # its stdout and stderr are the client's
    assert done.stdout.startswith("[sft-data] params sha256:") and "[sft_data] mine: 1 in -> 1 out" in done.stderr
    assert (tmp_path / "out/train.jsonl").exists() and (tmp_path / "job.log").exists()   # its folder too
    assert len(_served(server["log"], "sft-data")) == 1, server["log"].read_text()
    # a failing job: its one-line error on the client's stderr, its status the client's
    bad = subprocess.run([*RSTAR2, "sft-data", "--params", _sft_data_params("missing.json"), "--out", "out2"],
                         cwd=tmp_path, env=server["env"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("rstar2 sft-data: error: "), bad.stderr
    assert "missing.json" in bad.stderr and len(_served(server["log"], "sft-data")) == 2


def test_a_script_runs_served_as_python_would_run_it(server, tmp_path):
    """``python -m rstar2.stage_client SCRIPT ARGS`` (the tests' stage runners): ``__main__``, its arguments, its
    folder first on ``sys.path``."""
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "job.py").write_text("import sys, helper\nprint(__name__, sys.argv[1:], helper.VALUE)\nsys.exit(5)\n")
    done = subprocess.run([sys.executable, "-m", "rstar2.stage_client", str(tmp_path / "job.py"), "a", "b"],
                          cwd=tmp_path.parent, env=server["env"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (5, "__main__ ['a', 'b'] 42\n"), done.stdout + done.stderr
    assert len(_served(server["log"], "job.py")) == 1, server["log"].read_text()


def test_signals_reach_the_job_and_a_killed_client_takes_its_job_with_it(server, tmp_path):
    os.mkfifo(tmp_path / "job.log")   # the job blocks opening it, before it reads anything
    for sig in (signal.SIGTERM, signal.SIGKILL):
        client = subprocess.Popen([*RSTAR2, "sft-data", "--params", _sft_data_params("rows.json"), "--out", "out",
                                   "--log", "job.log"],
                                  cwd=tmp_path, env=server["env"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not _job_processes(tmp_path, client.pid):
            assert client.poll() is None and time.time() < deadline, server["log"].read_text()
            time.sleep(0.05)
        (job,) = _job_processes(tmp_path, client.pid)
        time.sleep(1)
        assert client.poll() is None and Path(f"/proc/{job}/status").exists()   # blocked, as it should be
        client.send_signal(sig)
        assert client.wait(timeout=30) == -sig   # SIGTERM: the job died of it, so did the client
        deadline = time.time() + 10
        while _job_processes(tmp_path, client.pid) and time.time() < deadline:
            time.sleep(0.05)
        assert not _job_processes(tmp_path, client.pid), f"the job outlived its client ({sig!r})"
        # the job itself died of SIGTERM (forwarded), or of the SIGKILL the server sends when the client is gone
        assert f"(pid {job}) exited {-sig} after " in _served(server["log"], "sft-data")[-1], server["log"].read_text()


def _blocked_job(server, tmp_path: Path, **popen):
    """A served sft-data job blocked opening its FIFO ``--log``, its client and the job's pid."""
    if not (tmp_path / "job.log").exists():
        os.mkfifo(tmp_path / "job.log")
    client = subprocess.Popen([*RSTAR2, "sft-data", "--params", _sft_data_params("rows.json"), "--out", "out",
                               "--log", "job.log"], cwd=tmp_path, env=server["env"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, **popen)
    deadline = time.time() + 60
    while not _job_processes(tmp_path, client.pid):
        assert client.poll() is None and time.time() < deadline, server["log"].read_text()
        time.sleep(0.05)
    return client, _job_processes(tmp_path, client.pid)[0]


def test_ignored_signals_stay_ignored_and_sigint_kills_as_python_does(server, tmp_path):
    """Under ``nohup`` (SIGHUP ignored) a served job ignores SIGHUP too; an uncaught SIGINT ends the job and its
    client by SIGINT, as Python's own KeyboardInterrupt exit does."""
    def nohup():   # SIGINT as a shell gives it: an xdist worker ignores it, and its children would inherit that
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    client, job = _blocked_job(server, tmp_path, preexec_fn=nohup)
    client.send_signal(signal.SIGHUP)
    time.sleep(1)
    assert client.poll() is None and Path(f"/proc/{job}/status").exists(), "SIGHUP was not ignored"
    client.send_signal(signal.SIGINT)
    assert client.wait(timeout=30) == -signal.SIGINT
    assert f"(pid {job}) exited {-signal.SIGINT} after " in _served(server["log"], "sft-data")[-1]


def test_a_malformed_request_ends_neither_the_server_nor_its_jobs(server, tmp_path):
    import socket

    from rstar2.stage_client import send
    (tmp_path / "rows.json").write_text("[]")
    client, job = _blocked_job(server, tmp_path)
    for request in ({"argv": []}, {"argv": "x"}, {}):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(server["env"][ENV_VAR])
            send(sock, request, fds=[0, 1, 2])
            assert sock.recv(10) == b""   # closed, no reply
    assert client.poll() is None and Path(f"/proc/{job}/status").exists(), server["log"].read_text()
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM
    assert server["log"].read_text().count("a request failed: ") == 3, server["log"].read_text()


def test_a_different_import_time_environment_or_a_launcher_runs_unserved(server, tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps([{"instruction": "Say hi.", "input": "", "output": "hi"}]))
    before = len(_served(server["log"], "sft-data"))
    threads = server["env"].get("OMP_NUM_THREADS", "")
    for i, extra in enumerate(({"OMP_NUM_THREADS": threads + "7"}, {"WORLD_SIZE": "1", "RANK": "0"})):
        done = subprocess.run([*RSTAR2, "sft-data", "--params", _sft_data_params("rows.json"), "--out", f"out{i}"],
                              cwd=tmp_path, env={**server["env"], **extra}, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and (tmp_path / f"out{i}/train.jsonl").exists(), done.stdout + done.stderr
    assert len(_served(server["log"], "sft-data")) == before   # neither was served
    refused = [line for line in server["log"].read_text().splitlines() if "refused" in line]
    assert refused == ["[stage-server] refused sft-data: $OMP_NUM_THREADS differs from the server's; it runs "
                       "unserved"], refused
