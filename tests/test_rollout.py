import torch

from rstar2 import chat
from rstar2.rollout import RolloutConfig, run_rollouts


class ScriptedModel:
    """Stands in for a causal LM: each generate() call emits the next scripted turn (up to max_new_tokens)."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, list(turns), 0

    def eval(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        new = self.tok.encode(self.turns[self.calls], add_special_tokens=False)[:max_new_tokens]
        self.calls += 1
        return torch.cat([input_ids, torch.tensor([new])], dim=1)


def _problem():
    return [{"id": "p1", "problem": "What is 6 times 7?", "answer": "42"}]


def test_tool_turn_is_masked_and_answer_graded(qwen_tokenizer):
    tok = qwen_tokenizer
    turns = ["Compute it.</reason>\n" + chat.tool_call_text("print(6*7)") + "<|im_end|>",
             "The tool says 42.</reason>\n<answer>\\boxed{42}</answer><|im_end|>"]
    (t,) = run_rollouts(ScriptedModel(tok, turns), tok, _problem(), RolloutConfig(max_response_tokens=400))
    assert t.finish_reason == "answer" and t.reward == 1.0 and t.pred == "42"
    assert [c["status"] for c in t.tool_calls] == ["ok"] and t.tool_calls[0]["output"] == "42"
    wrapper = tok.encode(chat.tool_response_text(["42"]))
    first = tok.encode(turns[0])
    assert t.response_ids == first + wrapper + tok.encode(turns[1])
    assert t.response_mask == [1] * len(first) + [0] * len(wrapper) + [1] * len(tok.encode(turns[1]))


def test_call_cut_by_length_limit_is_never_run(qwen_tokenizer):
    tok = qwen_tokenizer
    turn = "Check.</reason>\n<tool_call>{\"name\": \"%s\", \"arguments\": {\"code\": \"total = 0\\nfor i in range(10**6):" % chat.DEFAULT_TOOL_NAME
    (t,) = run_rollouts(ScriptedModel(tok, [turn]), tok, _problem(), RolloutConfig(max_response_tokens=20))
    assert t.finish_reason == "budget" and t.truncated and t.tool_calls == [] and t.reward == 0.0
    assert len(t.response_ids) == 20 and all(t.response_mask)


def test_turn_limit_and_parse_error_feedback(qwen_tokenizer):
    tok = qwen_tokenizer
    turns = ["Try.</reason>\n<tool_call>{oops}</tool_call><|im_end|>"] * 2
    (t,) = run_rollouts(ScriptedModel(tok, turns), tok, _problem(), RolloutConfig(max_turns=2))
    assert t.finish_reason == "max_turns" and len(t.turns) == 2
    assert t.turns[0]["tool_calls"][0]["status"] == "parse-error"
    assert "Failed to decode tool call" in tok.decode(t.response_ids)


def test_t03_dependent_calls_in_one_turn_see_earlier_names(qwen_tokenizer):
    tok = qwen_tokenizer
    turns = ["Two steps.</reason>\n" + chat.tool_call_text("a = 21") + chat.tool_call_text("print(a * 2)") + "<|im_end|>",
             "Done.</reason>\n<answer>\\boxed{42}</answer><|im_end|>"]
    (t,) = run_rollouts(ScriptedModel(tok, turns), tok, _problem(), RolloutConfig(max_calls_per_turn=2))
    assert [c["code"] for c in t.tool_calls] == ["a = 21", "print(a * 2)"]
    assert [c["output"] for c in t.tool_calls] == ["(no output)", "42"] and t.reward == 1.0


def test_t03_calls_over_the_limit_run_in_order_and_the_model_is_told(qwen_tokenizer):
    tok = qwen_tokenizer
    turns = ["Many.</reason>\n" + "".join(chat.tool_call_text(f"print({i})") for i in range(10)) + "<|im_end|>",
             "Done.</reason>\n<answer>\\boxed{42}</answer><|im_end|>"]
    (t,) = run_rollouts(ScriptedModel(tok, turns), tok, _problem(), RolloutConfig(max_calls_per_turn=4))
    assert [c["output"] for c in t.tool_calls] == ["0", "1", "2", "3"]
    assert t.turns[0]["dropped_calls"] == 6
    tool_text = tok.decode([i for i, m in zip(t.response_ids, t.response_mask) if not m])
    assert "6 further tool call(s) in this turn were not executed" in tool_text


def test_injected_tools_and_reward_hook(qwen_tokenizer):
    from rstar2 import sandbox

    class Echo:
        def __init__(self):
            self.codes = []

        async def run(self, code, stdin=""):
            self.codes.append(code)
            return sandbox.ExecResult("ok", 0, "7\n", "", 0.0)

    tok = qwen_tokenizer
    turns = ["Go.</reason>\n" + chat.tool_call_text("print(6*7)") + "<|im_end|>",
             "Done.</reason>\n<answer>\\boxed{7}</answer><|im_end|>"]
    tools = Echo()
    (t,) = run_rollouts(ScriptedModel(tok, turns), tok, _problem(), RolloutConfig(), tools=tools,
                        reward_fn=lambda final, gold: {"pred": "x", "reward": 0.5})
    assert tools.codes == ["print(6*7)"] and t.tool_calls[0]["output"] == "7"
    assert (t.pred, t.reward) == ("x", 0.5)


def test_config_errors_and_trainer_engines(qwen_tokenizer):
    import types

    import pytest

    from rstar2.rollout import engines_for_trainer
    from rstar2.rollout.engines import HFEngine
    from rstar2.rollout.servers import OpenAIEngine

    with pytest.raises(ValueError, match="rollout.scheduler"):
        RolloutConfig(scheduler="fifo")
    with pytest.raises(ValueError, match="server_urls"):
        RolloutConfig(engine="server")
    rollout = {"max_response_tokens": 64, "max_turns": 2, "temperature": 1.0, "top_p": 1.0, "batch_size": 4,
               "engine": "server", "server_urls": ["http://127.0.0.1:1"], "server_model": None, "scheduler": "static",
               "kv_cache_tokens": None, "hf_kv_cache_mb": None, "num_engines": 1, "max_calls_per_turn": 1,
               "max_inflight_per_engine": 8,
               "precision": "fp32", "kv_reuse": True, "reproducible": True, "vllm": None}
    tool = {"name": "python", "timeout_s": 3, "memory_mb": 256, "max_output_chars": 100}
    cfg = RolloutConfig.from_params(rollout, tool)
    assert cfg.tool.limits().timeout_s == 3 and cfg.tool.name == "python"
    with pytest.raises(ValueError, match=r"missing \['precision'\]"):
        RolloutConfig.from_params({k: v for k, v in rollout.items() if k != "precision"}, tool)
    with pytest.raises(ValueError, match=r"unknown \['tool_name'\]"):
        RolloutConfig.from_params({**rollout, "tool_name": "x"}, tool)
    assert cfg.server_urls == ("http://127.0.0.1:1",) and cfg.scheduler == "static"
    model = types.SimpleNamespace(config=types.SimpleNamespace(_name_or_path="m"))
    plain = types.SimpleNamespace(use_vllm=False, model=model, accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))
    assert [type(e) for e in engines_for_trainer(plain, qwen_tokenizer, 1.0, 1.0, num_engines=2)] == [HFEngine] * 2
    args = types.SimpleNamespace(vllm_mode="server", vllm_server_base_url=None, vllm_server_host="10.0.0.1",
                                 vllm_server_port=8000)
    served = types.SimpleNamespace(use_vllm=True, args=args, model=model)
    (e,) = engines_for_trainer(served, qwen_tokenizer, 1.0, 1.0)
    assert isinstance(e, OpenAIEngine) and e.base_url == "http://10.0.0.1:8000" and e.model == "m"
