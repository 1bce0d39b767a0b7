"""Per-message loss weights in SFT: the OpenAI fine-tuning format's ``"weight": 0`` on an assistant
message (and a ShareGPT turn's) keeps it in the context and gives mask 0 on exactly that message's tokens; the
recovery demonstrations' ``mistake_weight: 0`` does the same for their mistaken first call."""

from __future__ import annotations

import json

import pytest
from rstar2 import chat
from rstar2.data.sft import sources as sft_sources

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _row(first_weight=None) -> dict:
    first = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Pariss"})}}]}
    if first_weight is not None:
        first["weight"] = first_weight
    return {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris?"}, first,
        {"role": "tool", "tool_call_id": "c1", "content": "unknown city"},
        {"role": "assistant", "tool_calls": [{"id": "c2", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny and 21 C in Paris."}]}


def _convert(tmp_path, rows: list[dict], fmt: str = "messages") -> list[list[dict]]:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx, items, _ = sft_sources.read({"name": "mine", "path": str(path), "format": fmt}, 0, chat.DEFAULT_TOOL_NAME,
                                     256, tmp_path)
    return [p.finish([]) for _, p in items]


def _spans(tok, messages) -> list[tuple[int, int]]:
    """Token span of each assistant message's trained segment (text after <reason>, then <|im_end|>)."""
    spans = []
    for i in range(len(messages)):
        before, _ = chat.encode_conversation(tok, messages[:i])
        if messages[i]["role"] == "assistant":
            upto, _ = chat.encode_conversation(tok, messages[:i + 1])
            prefix = len(before) + len(tok.encode(chat.ASSISTANT_PREFIX, add_special_tokens=False))
            spans.append((prefix, len(upto) - 1))   # the trailing "\n" is never trained
    return spans


def test_weight_zero_masks_exactly_that_message(tmp_path, qwen_tokenizer):
    tok = qwen_tokenizer
    # each as row 0 of its own file: the same id draws the same reason sentences
    (plain,), (weighted,) = _convert(tmp_path, [_row()]), _convert(tmp_path, [_row(first_weight=0)])
    assert [m.get("weight") for m in weighted if m["role"] == "assistant"] == [0, None, None]
    assert [{k: v for k, v in m.items() if k != "weight"} for m in weighted] == plain   # same context
    ids0, mask0 = chat.encode_conversation(tok, plain)
    ids1, mask1 = chat.encode_conversation(tok, weighted)
    assert ids0 == ids1
    (a, b), *rest = _spans(tok, weighted)
    assert all(mask0[a:b]) and not any(mask1[a:b]) and b - a > 10
    assert mask1[:a] == mask0[:a] and mask1[b:] == mask0[b:]          # nothing else changed
    assert all(all(mask1[s:e]) for s, e in rest)


def test_sharegpt_turn_weight_and_bad_weights(tmp_path, qwen_tokenizer):
    conv = [{"from": "human", "value": "Say hi twice."}, {"from": "gpt", "value": "hi", "weight": 0},
            {"from": "human", "value": "Again."}, {"from": "gpt", "value": "hi hi"}]
    (msgs,) = _convert(tmp_path, [{"conversations": conv}], fmt="sharegpt")
    assert [m.get("weight") for m in msgs if m["role"] == "assistant"] == [0, None]
    _, mask = chat.encode_conversation(qwen_tokenizer, msgs)
    (a, b), (c, d) = _spans(qwen_tokenizer, msgs)
    assert not any(mask[a:b]) and all(mask[c:d])
    bad = _row(first_weight=0.5)
    with pytest.raises(ValueError, match=r"row 0.*messages.1.weight.*must be 0 or 1, got 0.5"):
        _convert(tmp_path, [bad])


def test_recovery_mistake_weight(tmp_path):
    from rstar2.stages import sft_data

    tool = {"tool": {"name": chat.DEFAULT_TOOL_NAME, "timeout_s": 5.0, "memory_mb": 1024, "max_output_chars": 256}}
    for w in (1, 0):
        sft_data.run({"sources": [{"name": "recovery", "generate": "recovery", "n": 4, "mistake_weight": w}],
                      **tool, "seed": 0}, str(tmp_path / str(w)))
    rows = {w: [json.loads(x) for x in open(tmp_path / str(w) / "train.jsonl")] for w in (1, 0)}
    assert len(rows[0]) == len(rows[1]) == 4
    for trained, masked in zip(rows[1], rows[0]):
        calls = [m for m in masked["messages"] if m["role"] == "assistant"]
        assert [m.get("weight") for m in calls] == [0, None, None]      # the mistaken call only
        assert [{k: v for k, v in m.items() if k != "weight"} for m in masked["messages"]] == trained["messages"]
    with pytest.raises(ValueError, match="mistake_weight .* applies to generate: recovery only"):
        sft_sources.check_spec({"name": "s", "generate": "string_tools", "n": 2, "mistake_weight": 0})
