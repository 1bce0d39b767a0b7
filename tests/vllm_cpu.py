"""What the real-vLLM tests (tests/test_vllm_*.py) share: vLLM's CPU-backend settings for a shared 2-core
machine and the tiny model its CPU attention can run."""

# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (the machine is shared); VLLM_CPU_OMP_THREADS_BIND: no pinning to cores
# other jobs also use.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def tiny_model(dest):
    """A tiny random Qwen3 (real Qwen3 tokenizer) in ``dest`` with head_dim 32: vLLM's CPU attention has no kernel
    for the CI model's head_dim 8."""
    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2}}, dest)
    return dest


def literal_regex(text: str) -> str:
    """A regex matching exactly ``text`` in xgrammar's dialect (``re.escape`` escapes spaces, which it warns on):
    the structured-output constraint that steers a random model's turn to a fixed text."""
    return "".join("\\" + c if c in r".^$*+?{}[]\|()" else c for c in text).replace("\n", "\\n")


# the steered first turn of the real-vLLM rollout tests (EOS follows it: the regex then ends), and its call's code
CODE = "print(6 * 7)"


def first_turn() -> str:
    from rstar2 import chat

    return "</reason>" + chat.tool_call_text(CODE)


def check_trajectory(t, turns, tok) -> None:
    """One real-engine trajectory against the engine's record of its turns (``turns``: (context ids, Generation,
    ...) per turn): the steered first turn ran the tool; each turn's request carried the trajectory's token ids so far
    (nothing re-tokenised); the tool response between turns is masked with log-probability 0; every generated token
    has a finite log-prob, and the free turns' are a random model's (improbable)."""
    import math

    import pytest

    from rstar2 import chat

    assert len(turns) >= 2 and len(t.turns) == len(turns), (t.finish_reason, t.turns)
    assert t.turns[0]["text"] == first_turn(), t.turns[0]["text"]
    (call,) = t.turns[0]["tool_calls"]
    assert call["code"] == CODE and call["status"] == "ok" and call["output"].strip() == "42", call
    ids, mask, lps = [], [], []
    for j, (context, gen, *_) in enumerate(turns):
        assert context == t.prompt_ids + ids, (t.key, j)
        assert gen.logprobs is not None and len(gen.logprobs) == len(gen.token_ids)
        ids += gen.token_ids
        mask += [1] * len(gen.token_ids)
        lps += gen.logprobs
        if j + 1 < len(turns):  # the tool response between this turn and the next one's context
            tool = turns[j + 1][0][len(t.prompt_ids) + len(ids):]
            rendered = [c["output"] for c in t.turns[j]["tool_calls"]]
            assert tool == tok.encode(chat.tool_response_text(rendered), add_special_tokens=False)
            ids += tool
            mask += [0] * len(tool)
            lps += [0.0] * len(tool)
    assert t.response_ids == ids and t.response_mask == mask, t.key
    assert t.response_logprobs == pytest.approx(lps)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp, m in zip(t.response_logprobs, t.response_mask) if m)
    free = [lp for lp in lps[len(turns[0][1].token_ids):] if lp != 0.0]
    assert free and sum(free) / len(free) < -1.0  # free turns: a random model's samples are improbable


def recorded_scheduler(monkeypatch) -> list:
    """Patch ``rstar2.rollout.Scheduler`` so every scheduler ``run_rollouts`` builds is appended to the returned
    list (the tests read its admissions and peak reservation)."""
    from rstar2 import rollout

    made = []

    class Recorded(rollout.Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(rollout, "Scheduler", Recorded)
    return made
