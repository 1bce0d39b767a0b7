"""Service mode: FastAPI + uvicorn in front of a real Redis queue (redis-server from Debian, on loopback)."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from rstar2.sandbox import Pool, SandboxLimits, make_client
from rstar2.sandbox.service import run_worker


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def service():
    assert shutil.which("redis-server"), "redis-server missing: .ci/run installs the Debian package"
    rport, aport = _free_port(), _free_port()
    redis_proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(rport), "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{rport}/0"
    api = subprocess.Popen([sys.executable, "-m", "rstar2.sandbox.service", "api", "--redis", url, "--port", str(aport),
                            "--timeout-s", "2"])
    stop = threading.Event()
    pool = Pool(SandboxLimits(timeout_s=2), workers=1, lean_workers=1, slots=8)
    try:
        _wait_port(rport)
        worker = threading.Thread(target=run_worker, args=(url, pool, stop), daemon=True)
        worker.start()
        _wait_port(aport)
        yield f"http://127.0.0.1:{aport}"
    finally:
        stop.set()
        api.terminate()
        api.wait(timeout=10)
        pool.close()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)


def test_long_batch_speaks_code_judge_shape(service):
    body = {"type": "batch", "submissions": [
        {"type": "python", "solution": "print(int(input()) * 2)", "input": "21", "sub_id": "a"},
        {"type": "python", "solution": "1/0", "input": ""},
        {"type": "python", "solution": "while True: pass"}]}
    req = urllib.request.Request(service + "/run/long-batch", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    a, b, c = out["results"]
    assert (a["sub_id"], a["success"], a["run_success"], a["stdout"], a["reason"]) == ("a", True, True, "42\n", "")
    assert not b["success"] and "ZeroDivisionError" in b["stderr"] and b["reason"] == ""
    assert c["reason"] == "worker_timeout" and c["status"] == "timeout"
    assert all(set(r) >= {"sub_id", "success", "cost", "stdout", "stderr", "reason"} for r in out["results"])


def test_http_client_batches_through_the_queue(service):
    with make_client(limits=SandboxLimits(timeout_s=2), url=service, batch_timeout_s=0.02) as client:
        res = client.run_many([(f"print({i} ** 2)", "") for i in range(20)])
    assert [r.stdout for r in res] == [f"{i * i}\n" for i in range(20)]
    assert all(r.status == "ok" for r in res)


def test_bad_request_is_rejected_with_a_clear_message(service):
    req = urllib.request.Request(service + "/run/long-batch", data=json.dumps({"submissions": [{"x": 1}]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 422 and "submissions[0]" in e.value.read().decode()
