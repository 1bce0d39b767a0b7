"""The in-process vLLM engines against fakes with vllm==0.31.0's call signatures (vLLM itself is never imported),
and the central dispatch of several training processes' rollouts to one scheduler.

Signatures as read in the vllm 0.31.0 wheel: ``AsyncLLM.generate(prompt, sampling_params, request_id, *, ...)``
(vllm/v1/engine/async_llm.py), ``LLMEngine.add_request(request_id, prompt, params, ...)``, ``step()``,
``has_unfinished_requests()``, ``abort_request(request_ids, internal=False)`` (vllm/v1/engine/llm_engine.py),
``RequestOutput(request_id, prompt, prompt_token_ids, prompt_logprobs, outputs, finished)`` and
``CompletionOutput(index, text, token_ids, cumulative_logprob, logprobs, finish_reason)`` (vllm/outputs.py),
``Logprob(logprob, rank, decoded_token)`` (vllm/logprobs.py), the ``SamplingParams`` fields below
(vllm/sampling_params.py)."""

import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from rstar2.rollout import CentralDispatch, RolloutConfig, run_rollouts
from rstar2.rollout.vllm_engines import AsyncVLLMEngine, StepVLLMEngine, shutdown_async_llm, start_async_llm

from test_rollout_engines import _turns

FINAL_ONLY = "FINAL_ONLY"


@pytest.fixture(autouse=True)
def _without_real_vllm(monkeypatch):
    """Hide a vLLM that an earlier test of the session imported for real (tests/test_vllm_*.py): these paths must
    not import it, which each test checks with ``"vllm" not in sys.modules``; teardown puts it back."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)



@dataclass(kw_only=True)
class FakeSamplingParams:
    """Only fields vllm 0.31.0's SamplingParams has (a misspelt keyword fails here as it would there)."""
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    logprobs: int | None = None
    output_kind: str = "CUMULATIVE"
    seed: int | None = None


CLASSES = (FakeSamplingParams, FINAL_ONLY)


def _output(request_id, ids, finish, logprobs):
    completion = SimpleNamespace(index=0, text="", token_ids=ids, cumulative_logprob=None, logprobs=logprobs,
                                 finish_reason=finish)
    return SimpleNamespace(request_id=request_id, prompt=None, prompt_token_ids=None, prompt_logprobs=None,
                           outputs=[completion], finished=True)


def _logprobs(ids, sp):
    """``logprobs=0``: one {sampled id: Logprob} per position; the values encode the position for the check."""
    assert sp.logprobs == 0
    return [{tid: SimpleNamespace(logprob=-0.01 * (j + 1), rank=1, decoded_token=None)} for j, tid in enumerate(ids)]


def _cut(script, prompt_ids, sp):
    ids = script(prompt_ids)
    finish = "stop" if len(ids) <= sp.max_tokens else "length"
    return ids[: sp.max_tokens], finish


class FakeAsyncLLM:
    """AsyncLLM: ``generate`` is an async generator; it decodes ``per_token_s`` per token and, with FINAL_ONLY,
    yields one finished RequestOutput. Like AsyncLLM it is bound to the event loop of its first request."""

    def __init__(self, script, per_token_s=0.0):
        self.script, self.per_token_s, self.requests, self.loop = script, per_token_s, [], None
        try:  # built inside a running loop, AsyncLLM starts its output handler on it
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        cache = SimpleNamespace(kv_cache_size_tokens=48_000, num_gpu_blocks=100, block_size=16)
        self.vllm_config = SimpleNamespace(cache_config=cache)

    async def generate(self, prompt, sampling_params, request_id, *, prompt_text=None, lora_request=None,
                       tokenization_kwargs=None, trace_headers=None, priority=0, data_parallel_rank=None,
                       session_id=None, kv_hints=None, reasoning_ended=None, reasoning_parser_kwargs=None):
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        assert asyncio.get_running_loop() is self.loop, "AsyncLLM used from a second event loop"
        assert sampling_params.output_kind == FINAL_ONLY and sampling_params.detokenize is False
        self.requests.append((request_id, list(prompt["prompt_token_ids"])))
        ids, finish = _cut(self.script, prompt["prompt_token_ids"], sampling_params)
        await asyncio.sleep(self.per_token_s * len(ids))
        yield _output(request_id, ids, finish, _logprobs(ids, sampling_params))

    def shutdown(self):
        pass


def test_async_vllm_engine_rollouts_logprobs_and_one_event_loop(qwen_tokenizer):
    tok = qwen_tokenizer
    llm = FakeAsyncLLM(_turns(tok))
    eng = AsyncVLLMEngine(llm, [tok.eos_token_id], 0.6, 0.95, classes=CLASSES)
    assert eng.kv_capacity_tokens() == 48_000
    problems = [{"id": f"p{i}", "problem": "What is 6 times 7?", "answer": "42"} for i in range(3)]
    for _ in range(2):  # two rollout phases = two asyncio.run loops; the AsyncLLM keeps its own
        trajs = run_rollouts(None, tok, problems, RolloutConfig(max_response_tokens=400), engines=[eng])
        assert [t.reward for t in trajs] == [1.0] * 3
    t = trajs[0]
    assert len(t.response_logprobs) == len(t.response_ids)
    gen = [lp for lp, m in zip(t.response_logprobs, t.response_mask) if m]
    assert gen[0] == -0.01 and all(lp == 0.0 for lp, m in zip(t.response_logprobs, t.response_mask) if not m)
    # token ids in: the second turn's prompt is exactly the first context + first turn + tool response
    first, second = [ids for rid, ids in llm.requests if rid.startswith(t.key + "/")][-2:]  # the second phase's
    assert first == t.prompt_ids and second == t.prompt_ids + t.response_ids[: len(second) - len(t.prompt_ids)]
    assert "vllm" not in sys.modules


def test_start_async_llm_builds_it_on_the_loop_it_runs_on(qwen_tokenizer):
    tok = qwen_tokenizer

    class Built(FakeAsyncLLM):
        @classmethod
        def from_engine_args(cls, engine_args, start_engine_loop=True, usage_context=None, stat_loggers=None):
            assert engine_args == {"model": "m"}
            return cls(_turns(tok))
    llm = start_async_llm({"model": "m"}, Built)
    assert llm.loop is not None  # it was built inside a running loop
    eng = AsyncVLLMEngine(llm, [tok.eos_token_id], 1.0, 1.0, classes=CLASSES)
    (t,) = run_rollouts(None, tok, [{"id": "p", "problem": "What is 6 times 7?", "answer": "42"}],
                        RolloutConfig(max_response_tokens=400), engines=[eng])
    assert t.reward == 1.0 and len(llm.requests) == 2  # generate's own assert: the loop it was built on


def test_shutdown_cancels_the_output_handler_before_the_engine_stops_and_only_once():
    """vLLM's AsyncLLM.shutdown stops the engine before it cancels its output handler, which then logs an
    EngineDeadError traceback; and its __del__ shuts down again at interpreter exit."""
    class Handled:
        def __init__(self):
            self.output_handler = asyncio.get_running_loop().create_task(asyncio.sleep(1e9))
            self.shutdowns = []

        @classmethod
        def from_engine_args(cls, engine_args):
            return cls()

        def shutdown(self):
            self.shutdowns.append(self.output_handler.done())
    llm = start_async_llm(None, Handled)
    shutdown_async_llm(llm)
    llm.shutdown()   # what __del__ does at exit: nothing more
    assert llm.shutdowns == [True] and llm.output_handler.cancelled()


def test_async_vllm_engine_returns_a_short_turn_without_waiting_for_a_long_one(qwen_tokenizer):
    """Probe (a) on the engine itself: 1 ms per token; a 20-token and a 400-token turn sent together."""
    llm = FakeAsyncLLM(lambda ids: [7] * (ids[0] + 1), per_token_s=0.001)  # cut by max_tokens
    eng = AsyncVLLMEngine(llm, [0], 1.0, 1.0, classes=CLASSES)
    done = {}

    async def one(n):
        t0 = time.perf_counter()
        out = await eng.generate(f"k{n}", [n], n)
        done[n] = time.perf_counter() - t0
        return out

    async def main():
        return await asyncio.gather(one(400), one(20))
    outs = asyncio.run(main())
    assert [len(o.token_ids) for o in outs] == [400, 20] and outs[1].finish_reason == "length"
    assert done[20] < 0.25 * done[400], done


class FakeLLMEngine:
    """LLMEngine: requests join between steps (continuous batching); each ``step()`` decodes one token of every
    running request and returns the RequestOutputs of those that finished (FINAL_ONLY)."""

    def __init__(self, script, step_s=0.0):
        self.script, self.step_s, self.running, self.threads, self.added = script, step_s, {}, set(), []
        self.aborted = []
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(kv_cache_size_tokens=None, num_gpu_blocks=50,
                                                                        block_size=16))

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, tokenization_kwargs=None,
                    trace_headers=None, priority=0, session_id=None, prompt_text=None, kv_hints=None):
        self.threads.add(threading.get_ident())
        assert isinstance(request_id, str) and params.output_kind == FINAL_ONLY
        ids, finish = _cut(self.script, prompt["prompt_token_ids"], params)
        self.running[request_id] = [ids, finish, 0, params]
        self.added.append((request_id, len(self.running)))

    def has_unfinished_requests(self):
        self.threads.add(threading.get_ident())
        return bool(self.running)

    def abort_request(self, request_ids, internal=False):
        self.threads.add(threading.get_ident())
        for rid in request_ids:
            if self.running.pop(rid, None) is not None:
                self.aborted.append(rid)

    def step(self):
        self.threads.add(threading.get_ident())
        time.sleep(self.step_s)
        outs = []
        for rid, r in list(self.running.items()):
            r[2] += 1
            if r[2] >= len(r[0]):
                del self.running[rid]
                outs.append(_output(rid, r[0], r[1], _logprobs(r[0], r[3])))
        return outs


def test_step_vllm_engine_rollouts_on_one_thread(qwen_tokenizer):
    tok = qwen_tokenizer
    llm = SimpleNamespace(llm_engine=FakeLLMEngine(_turns(tok)))
    eng = StepVLLMEngine(llm, [tok.eos_token_id], 1.0, 1.0, classes=CLASSES)
    assert eng.kv_capacity_tokens() == 800
    problems = [{"id": f"p{i}", "problem": "What is 6 times 7?", "answer": "42"} for i in range(4)]
    trajs = run_rollouts(None, tok, problems, RolloutConfig(max_response_tokens=400), engines=[eng])
    assert [t.reward for t in trajs] == [1.0] * 4
    assert all(len(t.response_logprobs) == len(t.response_ids) for t in trajs)
    assert len(llm.llm_engine.threads) == 1 and threading.get_ident() not in llm.llm_engine.threads
    assert eng._thread is None and not llm.llm_engine.running  # aclose stopped the worker; the LLM is idle


def test_step_vllm_engine_continuous_batching_and_close():
    """A 30-token turn sent while a 300-token turn decodes joins the running batch and returns after its own
    30 steps; the long one's turn is aborted by aclose and its caller told."""
    engine = FakeLLMEngine(lambda ids: [5] * (ids[0] + 1), step_s=0.001)  # cut by max_tokens
    eng = StepVLLMEngine(SimpleNamespace(llm_engine=engine), [0], 1.0, 1.0, classes=CLASSES)

    async def main():
        long = asyncio.ensure_future(eng.generate("long", [300], 300))
        await asyncio.sleep(0.02)
        before = eng.steps
        short = await eng.generate("short", [30], 30)
        took = eng.steps - before
        await eng.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await long
        return short, took
    short, took = asyncio.run(main())
    assert len(short.token_ids) == 30 and short.logprobs[:2] == [-0.01, -0.02]
    assert 30 <= took < 60 and engine.added[1][1] == 2  # the short turn joined the running long one
    assert engine.aborted and engine.aborted[0].startswith("long/")


def test_central_dispatch_runs_every_process_on_one_scheduler(qwen_tokenizer):
    """Two 'processes' (threads) with a barrier-backed gather/broadcast: process 0's scheduler runs all six
    trajectories on both engines, each process gets its own back in its order; a failure reaches both."""
    tok = qwen_tokenizer
    llm = FakeAsyncLLM(_turns(tok))
    engines = [AsyncVLLMEngine(llm, [tok.eos_token_id], 1.0, 1.0, classes=CLASSES),
               AsyncVLLMEngine(FakeAsyncLLM(_turns(tok)), [tok.eos_token_id], 1.0, 1.0, classes=CLASSES)]
    barrier, board = threading.Barrier(2), {}

    def dispatch(index):
        def gather(obj):
            board[index] = obj
            barrier.wait()
            out = [board[0], board[1]]
            barrier.wait()
            return out

        def broadcast(obj):
            if index == 0:
                board["b"] = obj
            barrier.wait()
            out = board["b"]
            barrier.wait()
            return out
        return CentralDispatch(index, 2, gather, broadcast)

    results, errors = {}, {}

    def process(index, problems, engs):
        try:
            results[index] = run_rollouts(None, tok, problems, RolloutConfig(max_response_tokens=400), engines=engs,
                                          central=dispatch(index))
        except Exception as e:
            errors[index] = e
    mine = {i: [{"id": f"p{i}-{j}", "problem": "What is 6 times 7?", "answer": "42"} for j in range(3)]
            for i in range(2)}
    threads = [threading.Thread(target=process, args=(i, mine[i], engines if i == 0 else [])) for i in range(2)]
    [th.start() for th in threads]
    [th.join(60) for th in threads]
    assert not errors and [t.problem_id for t in results[1]] == ["p1-0", "p1-1", "p1-2"]
    assert [t.reward for i in range(2) for t in results[i]] == [1.0] * 6
    assert len(llm.requests) > 0 and len(engines[1].llm.requests) > 0  # both engines served the step

    class Broken:
        def kv_capacity_tokens(self):
            return None

        def release(self, key):
            pass

        async def generate(self, key, context_ids, max_new_tokens):
            raise ValueError("engine down")
    results.clear()
    threads = [threading.Thread(target=process, args=(i, mine[i], [Broken()] if i == 0 else [])) for i in range(2)]
    [th.start() for th in threads]
    [th.join(60) for th in threads]
    assert isinstance(errors[0], ValueError) and "engine down" in str(errors[1])


def test_trainer_engines_colocate_drive_trls_llm_step_by_step(qwen_tokenizer, monkeypatch):
    """TRL colocate mode: the engine is a StepVLLMEngine on TRL's own vllm.LLM (TRL keeps its weights in sync)."""
    from rstar2.rollout import engines_for_trainer
    from rstar2.rollout import vllm_engines

    monkeypatch.setattr(vllm_engines, "vllm_classes", lambda: CLASSES)
    llm = SimpleNamespace(llm_engine=FakeLLMEngine(_turns(qwen_tokenizer)))
    trainer = SimpleNamespace(use_vllm=True, args=SimpleNamespace(vllm_mode="colocate"),
                              vllm_generation=SimpleNamespace(llm=llm))
    (eng,) = engines_for_trainer(trainer, qwen_tokenizer, 0.7, 0.9)
    assert isinstance(eng, StepVLLMEngine) and eng.llm is llm and eng.params(8).temperature == 0.7
    (t,) = run_rollouts(None, qwen_tokenizer, [{"id": "p", "problem": "What is 6 times 7?", "answer": "42"}],
                        RolloutConfig(max_response_tokens=400), engines=[eng])
    assert t.reward == 1.0 and "vllm" not in sys.modules


def test_central_dispatch_only_for_several_processes_on_servers():
    from rstar2.rollout import central_for_trainer

    def trainer(mode, n):
        acc = SimpleNamespace(num_processes=n, process_index=n - 1)
        return SimpleNamespace(use_vllm=True, args=SimpleNamespace(vllm_mode=mode), accelerator=acc)
    assert central_for_trainer(trainer("server", 1)) is None
    assert central_for_trainer(trainer("colocate", 4)) is None  # each process's LLM lives in that process
    assert central_for_trainer(SimpleNamespace(use_vllm=False, accelerator=None)) is None
    c = central_for_trainer(trainer("server", 4))
    assert (c.index, c.count) == (3, 4)
