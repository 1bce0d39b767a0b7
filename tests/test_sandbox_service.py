"""Service mode: FastAPI + uvicorn in front of a real Redis queue (redis-server from Debian, on loopback)."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from rstar2.sandbox import ExecResult, Pool, SandboxLimits, make_client
from rstar2.sandbox.service import QUEUE_KEY, cap_limits, judge_result, parse_limits, run_worker

API_TIMEOUT_S = 2  # the API's default per-call timeout
WORKER_MAX_S = 4  # the worker's cap on what a call may ask for


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port}")


def _redis(port):
    assert shutil.which("redis-server"), "redis-server missing: .ci/run installs the Debian package"
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port)
    return proc


def _api(url, port, *args):
    return subprocess.Popen([sys.executable, "-m", "rstar2.sandbox.service", "api", "--redis", url, "--port", str(port),
                             "--timeout-s", str(API_TIMEOUT_S), *args])


def _stop(*procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)


def _post(base, body, timeout=120):
    req = urllib.request.Request(base + "/run/long-batch", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _batch(codes, **extra):
    return {"type": "batch", "submissions": [{"type": "python", "solution": c, "input": "", **extra} for c in codes]}


@pytest.fixture(scope="module")
def pool():
    p = Pool(SandboxLimits(timeout_s=WORKER_MAX_S), workers=1, lean_workers=1, slots=8)
    yield p
    p.close()


@pytest.fixture(scope="module")
def service(pool):
    rport, aport = _free_port(), _free_port()
    redis_proc = _redis(rport)
    url = f"redis://127.0.0.1:{rport}/0"
    api = _api(url, aport)
    stop = threading.Event()
    try:
        threading.Thread(target=run_worker, args=(url, pool, stop), daemon=True).start()
        _wait_port(aport)
        yield {"base": f"http://127.0.0.1:{aport}", "redis_port": rport}
    finally:
        stop.set()
        _stop(api, redis_proc)


def test_long_batch_speaks_code_judge_shape(service):
    body = {"type": "batch", "submissions": [
        {"type": "python", "solution": "print(int(input()) * 2)", "input": "21", "sub_id": "a"},
        {"type": "python", "solution": "1/0", "input": ""},
        {"type": "python", "solution": "while True: pass"}]}
    out = _post(service["base"], body)
    a, b, c = out["results"]
    assert (a["sub_id"], a["success"], a["run_success"], a["stdout"], a["reason"]) == ("a", True, True, "42\n", "")
    assert not b["success"] and "ZeroDivisionError" in b["stderr"] and b["reason"] == ""
    assert c["reason"] == "worker_timeout" and c["status"] == "timeout"
    assert c["cost"] < WORKER_MAX_S  # no limits sent: the API's default (2 s), not the worker's maximum
    assert all(set(r) >= {"sub_id", "success", "cost", "stdout", "stderr", "reason"} for r in out["results"])


def test_http_client_batches_through_the_queue(service):
    with make_client(limits=SandboxLimits(timeout_s=2), url=service["base"], batch_timeout_s=0.02) as client:
        res = client.run_many([(f"print({i} ** 2)", "") for i in range(20)])
    assert [r.stdout for r in res] == [f"{i * i}\n" for i in range(20)]
    assert all(r.status == "ok" for r in res)


def test_bad_request_is_rejected_with_a_clear_message(service):
    for body, where in [({"submissions": [{"x": 1}]}, "submissions[0]"),
                        (_batch(["1"], limits={"timeout_s": "ten"}), "submissions[0].limits.timeout_s"),
                        (_batch(["1"], limits={"wall": 3}), "submissions[0].limits.wall")]:
        with pytest.raises(urllib.error.HTTPError) as e:
            _post(service["base"], body, timeout=10)
        assert e.value.code == 422 and where in e.value.read().decode()


def test_waits_longer_than_the_redis_socket_timeout(service):
    # 40 sleeps of 1.5 s on one 8-slot zygote take ~7.5 s, past redis-py's 5 s read timeout; through the
    # client, as the trial did, with an infinite loop that must come back as a timeout, not an HTTP error.
    calls = [("import time; time.sleep(1.5); print('done')", "")] * 40 + [("while True: pass", "")]
    t0 = time.monotonic()
    with make_client(url=service["base"]) as client:
        res = client.run_many(calls)
    waited = time.monotonic() - t0
    assert [r.status for r in res[:-1]] == ["ok"] * 40 and all(r.stdout == "done\n" for r in res[:-1]), res[0]
    assert res[-1].status == "timeout", res[-1]
    assert waited > 5.5, waited  # the case under test: longer than the socket timeout


def test_limits_per_submission_capped_by_the_worker(service):
    body = {"type": "batch", "submissions": [
        {"solution": "import time; time.sleep(1.5); print('late')", "limits": {"timeout_s": 1}},
        {"solution": "import time; time.sleep(2.5); print('ok')", "limits": {"timeout_s": 3.5}},
        {"solution": "while True: pass", "limits": {"timeout_s": 60}}]}
    tight, loose, capped = _post(service["base"], body)["results"]
    assert tight["status"] == "timeout", tight  # the API default (2 s) would have let it finish
    assert loose["status"] == "ok" and loose["stdout"] == "ok\n", loose  # the API default would have killed it
    # asked for 60 s: the worker's maximum (4 s) applies, not the request's and not the API default
    assert capped["reason"] == "worker_timeout" and WORKER_MAX_S - 0.5 <= capped["cost"] < WORKER_MAX_S + 3, capped


def test_large_batches_use_a_bounded_number_of_redis_connections(service):
    r = redis.Redis(port=service["redis_port"])
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], r.info("clients")["connected_clients"])
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out = _post(service["base"], _batch([f"print({i})" for i in range(1000)]), timeout=600)
        assert [x["stdout"] for x in out["results"]] == [f"{i}\n" for i in range(1000)]
        with ThreadPoolExecutor(4) as ex:
            outs = list(ex.map(lambda k: _post(service["base"], _batch([f"print({k} * 100 + {i})" for i in range(64)])),
                               range(4)))
        for k, o in enumerate(outs):
            assert [x["stdout"] for x in o["results"]] == [f"{k * 100 + i}\n" for i in range(64)]
    finally:
        done.set()
        sampler.join()
    # API (a reply loop plus short commands), worker (pop + publish), this sampler: far below one per call
    assert peak[0] <= 16, peak[0]


def test_no_worker_answers_internal_error_and_unqueues_the_job(service):
    url = f"redis://127.0.0.1:{service['redis_port']}/1"  # a database no worker serves
    aport = _free_port()
    api = _api(url, aport, "--grace-s", "2")
    try:
        _wait_port(aport)
        t0 = time.monotonic()
        (res,) = _post(f"http://127.0.0.1:{aport}", _batch(["print(1)"]))["results"]
        waited = time.monotonic() - t0
    finally:
        _stop(api)
    assert res["reason"] == "internal_error" and res["status"] == "error" and not res["success"], res
    assert API_TIMEOUT_S + 2 - 0.5 <= waited < API_TIMEOUT_S + 2 + 5, waited
    assert redis.Redis(port=service["redis_port"], db=1).llen(QUEUE_KEY) == 0  # it will not run for nobody


def test_worker_and_api_survive_a_redis_restart(pool):
    rport, aport = _free_port(), _free_port()
    url = f"redis://127.0.0.1:{rport}/0"
    redis_proc = _redis(rport)
    api = _api(url, aport)
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(url, pool, stop), daemon=True)
    worker.start()
    base = f"http://127.0.0.1:{aport}"
    try:
        _wait_port(aport)
        assert _post(base, _batch(["print('before')"]))["results"][0]["stdout"] == "before\n"
        _stop(redis_proc)
        time.sleep(1.5)  # both sides see the connection drop and start backing off
        redis_proc = _redis(rport)
        (after,) = _post(base, _batch(["print('after')"]))["results"]
        assert after["status"] == "ok" and after["stdout"] == "after\n", after
        assert worker.is_alive()
    finally:
        stop.set()
        _stop(api, redis_proc)


def test_a_lost_call_is_an_internal_error():
    lost = ExecResult("error", None, "", "sandbox worker failed (exited); the call was lost", 0.0)
    assert judge_result("x", lost)["reason"] == "internal_error"
    assert judge_result("x", ExecResult("error", 1, "", "ZeroDivisionError", 0.1))["reason"] == ""
    assert judge_result("x", ExecResult("memory", 1, "", "MemoryError", 0.1))["reason"] == ""


def test_limits_are_validated_and_capped_field_by_field():
    with pytest.raises(ValueError, match=r"subs\[3\]\.limits\.cpu_s"):
        parse_limits({"cpu_s": 1.5}, "subs[3].limits")
    with pytest.raises(ValueError, match=r"subs\[0\]\.limits\.timeout_s"):
        parse_limits({"timeout_s": float("nan")}, "subs[0].limits")
    with pytest.raises(ValueError, match="must be an object"):
        parse_limits([1], "subs[0].limits")
    assert parse_limits(None, "x") == {}
    got = cap_limits({"timeout_s": 30, "memory_mb": 64, "bogus": 1}, SandboxLimits(timeout_s=4, memory_mb=512))
    assert (got.timeout_s, got.memory_mb, got.cpu_s) == (4, 64, SandboxLimits().cpu_s)
