"""The sandbox fleet in containers, built and run with podman (docs/containers.md): the sandbox image built from
Debian's packages (scripts/container_build.sh), Redis and two workers on an internal network and the API on a
published loopback port (scripts/sandbox_fleet.sh). The product's client reaches it through ``sandbox.url``; real
probes show that neither model-written code nor a worker container reaches the host or resolves a name; a worker
container killed mid-call loses no call. Images, containers, networks and firewall rules are removed afterwards.
Where containers cannot run, every test here fails with one line naming what is missing.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_sandbox_service import _free_port
from test_sandbox_service_faults import SLEEP, _until

from rstar2 import sandbox

pytestmark = pytest.mark.slow   # image builds and container runs: `make test-fast` leaves them out
REPO = Path(__file__).resolve().parents[1]
CTR = str(REPO / "scripts" / "container.sh")
FLEET = str(REPO / "scripts" / "sandbox_fleet.sh")
PORT = 47013   # the probes' listener port on the host's bridge addresses

# Run inside a worker (by model-written code or by the container itself): for each target (address, port), connect
# within 1 s; an IPv6 link-local address is tried through each interface there is; then resolve each name.
PROBE = r"""
import json, socket
targets, names = json.loads(%r)
out = {}
for addr, port in targets:
    scopes = [i for _, i in socket.if_nameindex() if i != "lo"] if addr.startswith("fe80:") else [None]
    got = []
    for scope in scopes or ["no interface"]:
        try:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            where = (addr, port, 0, socket.if_nametoindex(scope)) if scope else (addr, port)
            with socket.socket(fam) as s:
                s.settimeout(1.0)
                s.connect(where)
            got.append("CONNECTED")
        except OSError as e:
            got.append(f"{type(e).__name__}: {e}")
    out[f"{addr}:{port}"] = "CONNECTED" if "CONNECTED" in got else "; ".join(got)
for name in names:
    try:
        out[name] = "RESOLVED " + socket.getaddrinfo(name, 443)[0][4][0]
    except OSError as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _run(*cmd, timeout=900, env=None, stderr=False) -> str:
    """Run a command from the repository: its stdout (and stderr after it, with ``stderr``); a failure fails the
    test with the command's last line of stderr."""
    r = subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if r.returncode:
        last = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}").splitlines()[-1]
        pytest.fail(f"{Path(str(cmd[0])).name} {cmd[1]}: {last}", pytrace=False)
    return r.stdout + (r.stderr if stderr else "")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line.split("#")[0]:
            name, version = line.split("#")[0].strip().split("==")
            pins[name.lower()] = version
    return pins


def _sandbox_packages() -> list[str]:
    return [ln.strip() for ln in (REPO / "docker" / "requirements-sandbox.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]


@pytest.fixture(scope="module")
def fleet(request):
    """The sandbox image (on a base image of its own) and a fleet of it: {name, url, image, redis_ip}."""
    r = subprocess.run([CTR, "--check"], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(r.stderr.strip().splitlines()[-1], pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("containers: the sandbox fleet needs root (its network's firewall rules)", pytrace=False)
    run = f"t{os.getpid()}"
    image, base, name = f"localhost/rstar2-sandbox:{run}", f"localhost/rstar2-base:{run}", f"rstar2-{run}"

    def remove():
        subprocess.run([FLEET, "down", "--name", name], capture_output=True, timeout=300)
        subprocess.run([CTR, "rmi", "-f", image, base], capture_output=True, timeout=300)

    request.addfinalizer(remove)
    _run(REPO / "scripts" / "container_build.sh", "sandbox", image,
         env={"RSTAR2_BASE_TAG": base, "PIP": str(Path(sys.executable).parent / "pip")})   # the wheels: this venv's pip
    port = _free_port()
    url = _run(FLEET, "up", "--name", name, "--image", image, "--port", port, "--workers", 2, "--",
               "--workers", 1, "--lean-workers", 1, "--full-workers", 1, "--timeout-s", 10, timeout=300).strip()
    assert url == f"http://127.0.0.1:{port}"
    redis_ip = _run(CTR, "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{name}-int").IPAddress}}}}',
                    f"{name}-redis").strip()
    return {"name": name, "url": url, "image": image, "redis_ip": redis_ip}


@pytest.fixture
def client(fleet):
    """The product's client as a stage gets it: the config's sandbox section (url set) through configure()."""
    sandbox.configure(url=fleet["url"], retries=0, batch_size=8, batch_timeout_s=0.02)
    c = sandbox.shared_client()
    yield c
    c.close()
    sandbox.configure()   # back to the default (a local pool)


def test_container_check_names_what_is_missing_in_one_line(tmp_path):
    """Without runc on PATH (podman there), the check fails with one line naming runc, the way every test of this
    module then fails; with neither engine, one line naming that."""
    for tool in ("podman", "cat", "id", "dirname"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (tmp_path / tool).symlink_to(found)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    r = subprocess.run(["/bin/bash", CTR, "--check"], capture_output=True, text=True, env=env)
    want = "runc missing" if (tmp_path / "podman").exists() else "no container engine"
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("containers cannot run here: ") and want in r.stderr, r.stderr
    (tmp_path / "podman").unlink(missing_ok=True)
    r = subprocess.run(["/bin/bash", CTR, "--check"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and r.stderr.strip().endswith("no container engine: install podman "
                                                           "(scripts/system_deps.sh test) or start docker"), r.stderr


def test_every_package_of_the_sandbox_image_is_pinned_in_requirements_txt():
    """The image installs docker/requirements-sandbox.txt under `pip -c requirements.txt`: a name pinned nowhere
    would install whatever is newest."""
    pins, names = _pins(), _sandbox_packages()
    assert len(names) >= 8 and [n for n in names if n.lower() not in pins] == []


def test_wheel_closure_adds_what_only_the_images_python_needs(tmp_path):
    """scripts/wheel_closure.py: a requirement whose marker holds on the image's 3.11.2 but not on the host's 3.11.7
    is asked for; one for an extra, one already there and those of a --no-deps wheel are not."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("wheel_closure", REPO / "scripts" / "wheel_closure.py")
    closure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(closure)
    for wheel, requires in [("redis-8.1.0", ['async-timeout>=4.0.3; python_full_version < "3.11.3"',
                                             'cryptography>=36; extra == "ocsp"', "packaging"]),
                            ("packaging-26.4", []), ("bfcl_eval-2026.3.23", ["anthropic>=0.75"])]:
        with zipfile.ZipFile(tmp_path / f"{wheel}-py3-none-any.whl", "w") as z:
            z.writestr(f"{wheel}.dist-info/METADATA", "Metadata-Version: 2.1\n" +
                       "".join(f"Requires-Dist: {r}\n" for r in requires))
    assert closure.missing(tmp_path, "3.11.2", ("bfcl-eval",)) == ["async-timeout>=4.0.3"]
    assert closure.missing(tmp_path, "3.11.7", ("bfcl-eval",)) == []
    assert closure.missing(tmp_path, "3.11.7") == ["anthropic>=0.75"]
    with pytest.raises(ValueError, match="X.Y.Z"):
        closure.missing(tmp_path, "3.11")


def test_sandbox_image_holds_the_pinned_service_and_no_trainer(fleet):
    """Every package of docker/requirements-sandbox.txt at requirements.txt's pin; no torch, no pip; the service's
    code outside site-packages; an unprivileged user."""
    pins = _pins()
    names = _sandbox_packages()
    script = ("import importlib.metadata as m, importlib.util as u, json, os; print(json.dumps({'uid': os.getuid(), "
              f"'versions': {{n: m.version(n) for n in {names!r}}}, 'torch': bool(u.find_spec('torch')), "
              "'pip': bool(u.find_spec('pip')), 'rstar2': u.find_spec('rstar2').origin}))")
    got = json.loads(_run(CTR, "run", "--rm", "--network", "none", fleet["image"], "python", "-c", script))
    assert got["versions"] == {n: pins[n.lower()] for n in names}
    assert got["uid"] != 0 and not got["torch"] and not got["pip"]
    assert got["rstar2"] == "/app/rstar2/__init__.py"


def test_the_product_client_runs_numpy_and_sympy_calls_through_the_fleet(fleet, client):
    calls = [("import numpy as np; print(int(np.arange(10).sum()), np.linalg.matrix_rank(np.eye(3)))", ""),
             ("import sympy as sp; x = sp.symbols('x'); print(sp.integrate(x**2, (x, 0, 3)), sp.factor(x**2 - 1))", ""),
             ("from scipy.special import comb; print(int(comb(10, 3)))", ""),
             ("print(int(input()) * 2)", "21"),
             ("1/0", "")]
    res = client.run_many(calls)
    assert [r.stdout for r in res[:4]] == ["45 3\n", "9 (x - 1)*(x + 1)\n", "120\n", "42\n"], res
    assert [r.status for r in res] == ["ok"] * 4 + ["error"] and "ZeroDivisionError" in res[4].stderr
    for i in (1, 2):   # each call ran in bubblewrap's namespaces inside the worker container
        log = _run(CTR, "logs", f"{fleet['name']}-worker-{i}", stderr=True)
        assert "sandbox isolation: bwrap, netns, private fs" in log, log[-2000:]


@pytest.fixture(scope="module")
def host_listener(fleet):
    """A TCP listener on each address the host has on the fleet's two bridges (the host side of its networks;
    nothing outside this host): {"targets": [(address, port)], "pub": pub bridge's IPv4, "accepted": [peer]}."""
    addrs = {}
    for net in ("int", "pub"):
        bridge = _run(CTR, "network", "inspect", "-f", "{{.NetworkInterface}}", f"{fleet['name']}-{net}").strip()
        out = subprocess.run(["ip", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True).stdout
        addrs[net] = [(a, bridge) for a in re.findall(r"inet6? ([0-9a-f.:]+)/", out)]
    assert addrs["int"] and addrs["pub"], addrs   # at least a link-local address on each
    accepted, socks = [], []

    def serve(s):
        try:
            while True:
                accepted.append(s.accept()[1][0])
        except OSError:   # closed at teardown
            pass

    for addr, bridge in addrs["int"] + addrs["pub"]:
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = socket.socket(fam)
        s.bind((addr, PORT, 0, socket.if_nametoindex(bridge)) if fam == socket.AF_INET6 else (addr, PORT))
        s.listen()
        socks.append(s)
        threading.Thread(target=serve, args=(s,), daemon=True).start()
    pub4 = [a for a, _ in addrs["pub"] if ":" not in a]
    yield {"targets": [(a, PORT) for a, _ in addrs["int"] + addrs["pub"]], "pub": pub4[0], "accepted": accepted}
    for s in socks:
        s.close()


def _probe(result: str) -> dict:
    return json.loads(result.strip().splitlines()[-1])


def test_model_written_code_cannot_reach_the_host_redis_nor_resolve_a_name(fleet, client, host_listener):
    targets = host_listener["targets"] + [(fleet["redis_ip"], 6379)]
    (res,) = client.run_many([(PROBE % json.dumps([targets, ["pypi.org", "redis"]]), "")])
    assert res.status == "ok", res.stderr
    got = _probe(res.stdout)
    assert len(got) == len(targets) + 2, got
    assert not [k for k, v in got.items() if v.startswith(("CONNECTED", "RESOLVED"))], got
    assert host_listener["accepted"] == []


def test_a_worker_container_reaches_redis_but_not_the_host_nor_a_name(fleet, host_listener):
    """From the worker container's own processes (outside bubblewrap): the internal network holds Redis and nothing
    else. The API container, also on the published network, does reach the host's listener there: the probe and the
    listener work, the internal network is what stops the worker."""
    probe = PROBE % json.dumps([host_listener["targets"] + [("redis", 6379)], ["pypi.org"]])
    got = _probe(_run(CTR, "exec", f"{fleet['name']}-worker-1", "python", "-c", probe))
    assert got.pop("redis:6379") == "CONNECTED"
    assert not [k for k, v in got.items() if v.startswith(("CONNECTED", "RESOLVED"))], got
    assert host_listener["accepted"] == []
    control = _probe(_run(CTR, "exec", f"{fleet['name']}-api", "python", "-c",
                          PROBE % json.dumps([[(host_listener["pub"], PORT)], []])))
    assert control == {f"{host_listener['pub']}:{PORT}": "CONNECTED"}
    _until(lambda: len(host_listener["accepted"]) == 1, 5)


def _in_flight(fleet) -> list[int]:
    """How many calls each worker holds (its in-flight list in Redis, read inside the Redis container)."""
    out = _run(CTR, "exec", f"{fleet['name']}-redis", "sh", "-c",
               "for k in $(redis-cli --scan --pattern 'rstar2:sandbox:inflight:*'); do redis-cli llen $k; done")
    return sorted(int(n) for n in out.split())


def test_a_worker_container_killed_mid_call_loses_no_call(fleet, client):
    """24 calls out with both workers holding some; worker 1's container is SIGKILLed. Its calls are queued again
    (the API says how many) and the other worker answers them: every call comes back ok with its own output at the
    first attempt (the client may not retry here)."""
    futs = [client.submit(SLEEP.format(s=3.0, i=i)) for i in range(24)]
    _until(lambda: (n := _in_flight(fleet)) and len([x for x in n if x]) == 2 and sum(n) == 24, 30)
    _run(CTR, "kill", "--signal", "KILL", f"{fleet['name']}-worker-1")
    res = [f.result(timeout=120) for f in futs]
    assert [r.stdout for r in res] == [f"{i}\n" for i in range(24)], [r.stderr for r in res if r.status != "ok"]
    assert all(r.status == "ok" and r.attempts == 1 for r in res)
    state = _run(CTR, "inspect", "-f", "{{.State.Status}}", f"{fleet['name']}-worker-1").strip()
    assert state == "exited"
    recovered = re.findall(r"stopped answering; (\d+) of its calls recovered", _run(CTR, "logs", f"{fleet['name']}-api",
                                                                                    stderr=True))
    assert len(recovered) == 1 and int(recovered[0]) > 0, recovered
