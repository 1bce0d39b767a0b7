"""Engines: transformers batching, and the OpenAI-compatible client (one engine per data-parallel rank) against a
fake vLLM server on loopback. The in-process vLLM engines are in test_rollout_vllm.py."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rstar2 import chat
from rstar2.rollout import RolloutConfig, run_rollouts
from rstar2.rollout.engines import HFEngine
from rstar2.rollout.servers import OpenAIEngine, kv_tokens_from_metrics, server_engines, server_kv_from_metrics


class BatchScriptedModel:
    """generate() for a batch: row r emits ``script(row_context)`` (left padding respected)."""

    def __init__(self, script):
        self.script, self.batch_sizes = script, []

    def eval(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kw):
        self.batch_sizes.append(len(input_ids))
        rows = [self.script([i for i, m in zip(ids, mask) if m])[:max_new_tokens]
                for ids, mask in zip(input_ids.tolist(), attention_mask.tolist())]
        width = max(len(r) for r in rows)
        new = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def _turns(tok):
    call = tok.encode("Run.</reason>\n" + chat.tool_call_text("print(6*7)") + "<|im_end|>", add_special_tokens=False)
    answer = tok.encode("Done.</reason>\n<answer>\\boxed{42}</answer><|im_end|>", add_special_tokens=False)
    resp = tok.encode("<tool_response>", add_special_tokens=False)

    def script(ctx):  # answer once the context holds a tool response
        has_resp = any(ctx[i:i + len(resp)] == resp for i in range(len(ctx) - len(resp) + 1))
        return answer if has_resp else call
    return script


def test_hf_engine_batches_concurrent_requests_and_cuts_rows(qwen_tokenizer):
    tok = qwen_tokenizer
    model = BatchScriptedModel(_turns(tok))
    eng = HFEngine(model, tok, temperature=0, max_batch=3)
    prompt = tok.encode("hello", add_special_tokens=False)

    async def main():
        outs = await asyncio.gather(*(eng.generate(f"t{i}", prompt, n) for i, n in enumerate((200, 200, 200, 200, 5))))
        await eng.aclose()
        return outs
    outs = asyncio.run(main())
    assert model.batch_sizes == [3, 2]
    assert all(o.finish_reason == "stop" and o.token_ids[-1] == tok.eos_token_id for o in outs[:4])
    assert outs[4].finish_reason == "length" and len(outs[4].token_ids) == 5


@pytest.mark.parametrize("max_linger_s, expected", [(0.5, [4]), (0.0, [1, 1, 1, 1])])
def test_hf_engine_lingers_while_requests_keep_arriving(qwen_tokenizer, max_linger_s, expected):
    """Requests that arrive a few ms apart (the next turns coming back from their tool calls) share one batch
    when the engine keeps lingering while they arrive; without it the first one starts a batch alone."""
    tok = qwen_tokenizer
    model = BatchScriptedModel(_turns(tok))
    eng = HFEngine(model, tok, temperature=0, max_batch=8, linger_s=0.02, max_linger_s=max_linger_s)
    prompt = tok.encode("hello", add_special_tokens=False)

    async def staggered(i):
        await asyncio.sleep(0.01 * i)
        return await eng.generate(f"t{i}", prompt, 50)

    async def main():
        outs = await asyncio.gather(*(staggered(i) for i in range(4)))
        await eng.aclose()
        return outs
    outs = asyncio.run(main())
    assert model.batch_sizes == expected and len(outs) == 4


def test_hf_engine_rollouts_balanced_and_static_agree(qwen_tokenizer):
    tok = qwen_tokenizer
    problems = [{"id": f"p{i}", "problem": "What is 6 times 7?", "answer": "42"} for i in range(5)]
    for mode in ("balanced", "static"):
        model = BatchScriptedModel(_turns(tok))
        trajs = run_rollouts(model, tok, problems, RolloutConfig(scheduler=mode, batch_size=4, num_engines=2))
        assert [t.reward for t in trajs] == [1.0] * 5, mode
        assert all(t.tool_calls[0]["output"] == "42" for t in trajs)


class _FakeVLLM(BaseHTTPRequestHandler):
    """A loopback stand-in for ``vllm serve``: /v1/completions with token ids in and out (and the sampled tokens'
    log-probabilities when asked), /metrics with one cache_config_info line per data-parallel engine."""
    script = None
    requests: list = []
    omit_eos = False
    dp_engines = 1

    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            if type(self).dp_engines == 1:  # a server without the per-engine labels
                text = 'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="1000"} 1.0\n'
            else:  # vllm 0.31.0 with --data-parallel-size: the frontend's summed blocks, per-engine tokens
                n = type(self).dp_engines
                text = "".join(f'vllm:cache_config_info{{block_size="16",engine="{r}",kv_cache_size_tokens="9000",'
                               f'num_gpu_blocks="{1000 * n}"}} 1.0\n' for r in range(n))
            self._send(200, "# HELP x\n" + text + "vllm:num_requests_running 0.0\n", "text/plain")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["_rank"] = self.headers.get("X-data-parallel-rank")
        type(self).requests.append(body)
        if self.path != "/v1/completions" or not all(isinstance(i, int) for i in body["prompt"]):
            return self._send(400, {"error": "bad request"})
        ids = type(self).script(body["prompt"])
        finish = "stop" if len(ids) <= body["max_tokens"] else "length"
        ids = ids[: body["max_tokens"]]
        if finish == "stop" and type(self).omit_eos:
            ids = ids[:-1]
        lps = None if body.get("logprobs") is None else {"token_logprobs": [-0.5] * len(ids),
                                                          "tokens": [f"token_id:{i}" for i in ids]}
        self._send(200, {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
                                      "logprobs": lps}]})


@pytest.fixture
def fake_server(qwen_tokenizer):
    _FakeVLLM.script, _FakeVLLM.requests, _FakeVLLM.omit_eos, _FakeVLLM.dp_engines = _turns(qwen_tokenizer), [], False, 1
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("omit_eos", [False, True])
def test_openai_engine_rollouts_against_fake_vllm_server(qwen_tokenizer, fake_server, omit_eos):
    tok = qwen_tokenizer
    _FakeVLLM.omit_eos = omit_eos
    eng = OpenAIEngine(fake_server, "policy", [tok.eos_token_id], temperature=0.6, top_p=1.0)
    assert eng.kv_capacity_tokens() == 16_000
    problems = [{"id": f"p{i}", "problem": "What is 6 times 7?", "answer": "42"} for i in range(3)]
    trajs = run_rollouts(None, tok, problems, RolloutConfig(max_response_tokens=400), engines=[eng])
    assert [t.reward for t in trajs] == [1.0] * 3
    t = trajs[0]
    assert t.response_ids[-1] == tok.eos_token_id and len(t.response_ids) == len(t.response_mask)
    first = _FakeVLLM.requests[0]
    assert first["prompt"] == t.prompt_ids and first["return_token_ids"] is True
    assert first["temperature"] == 0.6 and first["stop_token_ids"] == [tok.eos_token_id]
    assert first["logprobs"] == 0 and first["_rank"] is None
    # the server's log-probs are kept only where they cover every returned id (not when we appended the EOS)
    assert (t.response_logprobs is None) == omit_eos
    # the second turn's context is exactly prompt + first turn + masked tool turn: ids appended, not re-tokenised
    second = [r for r in _FakeVLLM.requests if len(r["prompt"]) > len(t.prompt_ids)][0]
    assert second["prompt"] == t.prompt_ids + t.response_ids[: len(second["prompt"]) - len(t.prompt_ids)]


def test_openai_engine_budget_cut_and_server_errors(qwen_tokenizer, fake_server):
    tok = qwen_tokenizer
    eng = OpenAIEngine(fake_server, "policy", [tok.eos_token_id], 1.0, 1.0)
    (t,) = run_rollouts(None, tok, [{"id": "p", "problem": "q", "answer": "42"}], RolloutConfig(max_response_tokens=10),
                        engines=[eng])
    assert t.finish_reason == "budget" and t.tool_calls == [] and t.reward == 0.0
    bad = OpenAIEngine(fake_server + "/nowhere", "policy", [tok.eos_token_id], 1.0, 1.0, kv_tokens=1000)
    with pytest.raises(RuntimeError, match=r"nowhere/v1/completions: HTTP 400"):
        run_rollouts(None, tok, [{"id": "p", "problem": "q"}], RolloutConfig(), engines=[bad])


def test_kv_tokens_from_metrics():
    assert kv_tokens_from_metrics('vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0') == 160
    assert kv_tokens_from_metrics("vllm:num_requests_running 0.0") is None
    two = ('vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="None",num_gpu_blocks="20"} 1\n'
           'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="None",num_gpu_blocks="20"} 1\n')
    assert server_kv_from_metrics(two) == (160, ["0", "1"])  # summed blocks split over the engines


def test_server_engines_one_per_data_parallel_rank_and_sticky(qwen_tokenizer, fake_server):
    """A server with 3 data-parallel engines: 3 engines with the per-engine KV of /metrics; every turn of a
    trajectory goes to the same rank (X-data-parallel-rank), and the scheduler uses all ranks."""
    tok = qwen_tokenizer
    _FakeVLLM.dp_engines = 3
    engines = server_engines(fake_server, "policy", [tok.eos_token_id], 1.0, 1.0)
    assert [(e.dp_rank, e.kv_capacity_tokens()) for e in engines] == [(0, 9000), (1, 9000), (2, 9000)]
    problems = [{"id": f"p{i}", "problem": f"Problem {i}: what is 6 times 7?", "answer": "42"} for i in range(6)]
    trajs = run_rollouts(None, tok, problems, RolloutConfig(max_response_tokens=400), engines=engines)
    assert [t.reward for t in trajs] == [1.0] * 6
    for t in trajs:  # both turns of each trajectory went to one rank
        turns = [r for r in _FakeVLLM.requests if r["prompt"][:len(t.prompt_ids)] == t.prompt_ids]
        assert len(turns) == 2 and turns[0]["_rank"] == turns[1]["_rank"] is not None
    assert {r["_rank"] for r in _FakeVLLM.requests} == {"0", "1", "2"}
    assert server_engines("http://127.0.0.1:9", "policy", [0], 1.0, 1.0)[0].dp_rank is None  # no server: one


def test_server_turns_carry_their_own_seed_only_when_reproducible(qwen_tokenizer, fake_server):
    """``engine: server`` with ``reproducible``: every turn's request carries the seed of its trajectory and context
    length (vllm_reproducible.turn_seed, as the in-process vLLM engines), so a group's samples get different seeds
    and a rerun the same ones; unseeded otherwise."""
    from rstar2.rollout.vllm_reproducible import turn_seed

    tok = qwen_tokenizer
    problems = [{"id": "p", "problem": "What is 6 times 7?", "answer": "42"}] * 2   # one group of 2
    for reproducible in (True, False):
        _FakeVLLM.requests = []
        cfg = RolloutConfig(max_response_tokens=400, engine="server", server_urls=(fake_server,),
                            server_model="policy", reproducible=reproducible)
        trajs = run_rollouts(None, tok, problems, cfg, seed=7)
        if not reproducible:
            assert len(_FakeVLLM.requests) == 4 and all("seed" not in r for r in _FakeVLLM.requests)
            continue
        # the fake server answers both samples alike: the same two context lengths, told apart by the key alone
        lengths = {len(r["prompt"]) for r in _FakeVLLM.requests}
        seeds = [r["seed"] for r in _FakeVLLM.requests]
        assert len(lengths) == 2 and len(seeds) == 4 and len(set(seeds)) == 4   # 2 samples x 2 turns, each its own
        assert set(seeds) == {turn_seed(7, t.key, n) for t in trajs for n in lengths}


def test_run_rollouts_grades_with_the_given_answer_type(qwen_tokenizer):
    """RL data is integer-answer: a boxed unevaluated expression earns nothing there (it does under "math")."""
    tok = qwen_tokenizer
    copy = tok.encode("Done.</reason>\n<answer>\\boxed{6 * 7}</answer><|im_end|>", add_special_tokens=False)
    problems = [{"id": "p", "problem": "6 * 7", "answer": "42"}]
    rewards = {kind: run_rollouts(BatchScriptedModel(lambda ctx: copy), tok, problems, RolloutConfig(),
                                  answer_type=kind)[0].reward for kind in ("math", "integer")}
    assert rewards == {"math": 1.0, "integer": 0.0}


def test_hf_engine_reports_its_kv_budget_and_admission_holds_trajectories_back_when_it_is_full(qwen_tokenizer):
    """A real (tiny, random) transformers model: the HF engine reports its KV budget in the policy's tokens
    (2 x layers x KV heads x head dim x 4 bytes per float32 token), and the balanced scheduler admits only as many
    trajectories as that holds, the rest once one ends, never reserving more than the capacity."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rstar2.rollout import AgentLoop, Scheduler
    from rstar2.rollout.engines import kv_bytes_per_token
    from rstar2.rollout.sim import SimToolRunner

    tok = qwen_tokenizer
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=16, max_position_embeddings=2048)).eval()
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 16 * 4
    eng = HFEngine(model, tok, temperature=1.0, max_batch=8, kv_budget_mb=1, seed=0)
    capacity = 2**20 // 512
    assert eng.kv_capacity_tokens() == capacity
    assert HFEngine(model, tok, kv_tokens=99, kv_budget_mb=1).kv_capacity_tokens() == 99   # an override wins
    cfg = RolloutConfig(max_response_tokens=8, max_turns=1, scheduler="balanced")
    agent = AgentLoop(tok, cfg, SimToolRunner())
    trajs = [agent.new_trajectory({"id": i, "problem": f"Problem {i}."}) for i in range(6)]
    need = max(len(t.prompt_ids) for t in trajs) + cfg.max_response_tokens
    fits = capacity // need
    assert 1 <= fits < len(trajs), (capacity, need)   # the budget is full before every trajectory is admitted
    sched = Scheduler([eng], agent, "balanced", cfg.max_response_tokens, max_inflight=256)
    assert sched.policy == "kv-aware/least-loaded"

    async def main():
        try:
            await sched.run(trajs)
        finally:
            await eng.aclose()
    asyncio.run(main())
    assert sched.admissions[0] == (0, fits) and sum(k for _, k in sched.admissions) == len(trajs)
    assert len(sched.admissions) > 1 and sched.peak_reserved[0] <= capacity
    assert all(t.finish_reason for t in trajs)
