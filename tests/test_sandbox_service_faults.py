"""The HTTP sandbox service under load and faults: a worker killed mid-call, Redis restarted mid-batch, the
API restarted mid-request, a full queue. Every call comes back once, with its own result; what the service cannot
serve comes back as an infrastructure failure the client retries. One redis-server and one API for the module, on
free loopback ports; workers are real `python -m rstar2.sandbox.service worker` processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.error

import pytest
import redis
from test_sandbox_service import _batch, _free_port, _post, _redis, _stop, _wait_port

from rstar2.sandbox import INFRA_STATUS, make_client
from rstar2.sandbox.recovery import ALIVE_PREFIX, INFLIGHT_PREFIX

SLEEP = "import time; time.sleep({s}); print({i})"


def _worker(url):
    return subprocess.Popen([sys.executable, "-m", "rstar2.sandbox.service", "worker", "--redis", url, "--workers", "1",
                             "--lean-workers", "1", "--full-workers", "0", "--timeout-s", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _api(url, port, *args):
    p = subprocess.Popen([sys.executable, "-m", "rstar2.sandbox.service", "api", "--redis", url, "--port", str(port),
                          *args])
    _wait_port(port)
    return p


def _until(what, timeout=60.0):
    t0 = time.time()
    while not what():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def _alive(r) -> int:
    return len(r.keys(ALIVE_PREFIX + "*"))


def _in_flight(r) -> int:
    return sum(r.llen(k) for k in r.keys(INFLIGHT_PREFIX + "*"))


@pytest.fixture(scope="module")
def svc():
    rport, aport = _free_port(), _free_port()
    url = f"redis://127.0.0.1:{rport}/0"
    state = {"redis": _redis(rport), "port": rport, "url": url, "base": f"http://127.0.0.1:{aport}",
             "workers": []}
    api = _api(url, aport)
    try:
        yield state
    finally:
        for w in state["workers"]:
            w.kill()
            w.wait()
        _stop(api, state["redis"])


def _results(futs, timeout=90):
    return [f.result(timeout=timeout) for f in futs]


def test_a_worker_killed_mid_call_loses_no_call_and_answers_each_once(svc):
    """24 calls in flight on one worker when it is SIGKILLed; a second worker starts. The API queues the dead
    worker's calls again, so every call comes back ok with its own output at the first attempt (the client may
    not retry here), none twice."""
    r = redis.Redis(port=svc["port"])
    first = _worker(svc["url"])
    svc["workers"].append(first)
    _until(lambda: _alive(r) == 1)
    with make_client(url=svc["base"], retries=0, batch_size=8, batch_timeout_s=0.02) as client:
        futs = [client.submit(SLEEP.format(s=1.5, i=i)) for i in range(24)]
        _until(lambda: _in_flight(r) >= 16)
        first.send_signal(signal.SIGKILL)
        first.wait()
        svc["workers"].append(_worker(svc["url"]))
        res = _results(futs)
    assert [x.stdout for x in res] == [f"{i}\n" for i in range(24)], [x.stderr for x in res if x.status != "ok"]
    assert all(x.status == "ok" and x.attempts == 1 for x in res)
    _until(lambda: _in_flight(r) == 0, 10)   # nothing left registered as in flight


def test_redis_restarted_mid_batch_loses_no_call(svc):
    """Redis (no persistence) is restarted while 80 calls are out: the worker holds 64 (its zygotes x slots), 16
    wait in the queue, which the restart loses. The worker reconnects and publishes what it ran; the API sees the
    new Redis and queues its open calls again. Every call is answered once, at its first attempt."""
    r = redis.Redis(port=svc["port"])
    if not _alive(r):   # run on its own (-k): no worker left by the test before
        svc["workers"].append(_worker(svc["url"]))
    _until(lambda: _alive(r) >= 1)
    n = 80
    with make_client(url=svc["base"], retries=0, batch_size=16, batch_timeout_s=0.02) as client:
        futs = [client.submit(SLEEP.format(s=1.5, i=100 + i)) for i in range(n)]
        _until(lambda: _in_flight(r) == 64 and r.llen("rstar2:sandbox:queue") == n - 64)
        _stop(svc["redis"])
        time.sleep(0.5)
        svc["redis"] = _redis(svc["port"])
        res = _results(futs)
    assert [x.stdout for x in res] == [f"{100 + i}\n" for i in range(n)], [x.stderr for x in res if x.status != "ok"]
    assert all(x.status == "ok" and x.attempts == 1 for x in res)


def test_an_api_restarted_mid_request_is_an_error_the_client_retries(svc):
    """The API process is SIGKILLed with a batch in flight and started again on the same port: the client sees the
    dropped connection as an infrastructure failure, retries, and gets every result."""
    port = _free_port()
    api = _api(svc["url"], port)
    if not _alive(redis.Redis(port=svc["port"])):
        svc["workers"].append(_worker(svc["url"]))
    restarted = []
    try:
        with make_client(url=f"http://127.0.0.1:{port}", retries=5, retry_backoff_s=0.5, batch_size=8) as client:
            futs = [client.submit(SLEEP.format(s=1.0, i=200 + i)) for i in range(8)]
            time.sleep(0.5)
            api.send_signal(signal.SIGKILL)
            api.wait()
            restarted.append(_api(svc["url"], port))
            res = _results(futs)
    finally:
        _stop(*(p for p in [api, *restarted] if p.poll() is None))
    assert [x.stdout for x in res] == [f"{200 + i}\n" for i in range(8)] and all(x.status == "ok" for x in res)
    assert all(x.attempts >= 2 for x in res)   # the first attempt died with the API


def test_a_full_queue_is_refused_for_capacity_and_retried(svc):
    """With --max-queued, a request that would grow a non-empty queue past it gets HTTP 503 with Retry-After; the
    client counts that as an infrastructure failure, retries it, and reports it unserved after its budget."""
    port = _free_port()
    url = svc["url"].rsplit("/", 1)[0] + "/3"   # a database no worker serves: the queue only grows
    api = _api(url, port, "--max-queued", "2", "--grace-s", "2", "--timeout-s", "1")
    base = f"http://127.0.0.1:{port}"
    try:
        waiting = threading.Thread(target=_post, args=(base, _batch(["print(1)", "print(2)"])))
        waiting.start()
        _until(lambda: redis.Redis(port=svc["port"], db=3).llen("rstar2:sandbox:queue") == 2, 10)
        with pytest.raises(urllib.error.HTTPError) as e:
            _post(base, _batch(["print(3)"]), timeout=10)
        assert e.value.code == 503 and e.value.headers["Retry-After"] == "1" and "queue full" in e.value.read().decode()
        with make_client(url=base, retries=1, retry_backoff_s=0.1) as client:
            (res,) = client.run_many([("print(3)", "")])
        assert res.status == INFRA_STATUS and res.attempts == 2 and "503" in res.stderr, res
        waiting.join()
    finally:
        _stop(api)
