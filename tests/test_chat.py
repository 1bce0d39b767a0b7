import json

from rstar2 import chat


def test_prompt_layout_ends_in_generation_prompt():
    text = chat.prompt_text("What is 1+1?", [chat.python_tool_schema()])
    assert text.startswith("<|im_start|>system\nA conversation between User and Assistant.")
    assert "<tools>\n" + json.dumps(chat.python_tool_schema()) + "\n</tools>" in text
    assert text.endswith("This is the problem:\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n<reason>")


def test_parse_accepts_raw_newlines_and_string_arguments():
    raw = '<tool_call>\n{"name": "%s", "arguments": {"code": "x = 2\nprint(x**10)"}}\n</tool_call>' % chat.DEFAULT_TOOL_NAME
    (call,) = chat.parse_tool_calls(raw)
    assert call.error is None and call.code == "x = 2\nprint(x**10)" and call.stdin == ""
    as_str = '<tool_call>{"name":"%s","arguments":"{\\"code\\": \\"print(1)\\", \\"input\\": \\"5\\"}"}</tool_call>' % chat.DEFAULT_TOOL_NAME
    (call,) = chat.parse_tool_calls(as_str)
    assert call.code == "print(1)" and call.stdin == "5"


def test_parse_failures_become_errors_never_partial_code():
    bad = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "other_tool", "arguments": {"code": "print(1)"}}</tool_call>',
        '<tool_call>{"name": "%s"}</tool_call>' % chat.DEFAULT_TOOL_NAME,
        '<tool_call>{"name": "%s", "arguments": {"code": 5}}</tool_call>' % chat.DEFAULT_TOOL_NAME,
    ]
    for text in bad:
        (call,) = chat.parse_tool_calls(text)
        assert call.code is None and call.error.startswith("Failed to decode tool call")


def test_several_calls_in_order_and_no_call():
    text = chat.tool_call_text("a = 21") + "\n" + chat.tool_call_text("print(a * 2)")
    assert [c.code for c in chat.parse_tool_calls(text)] == ["a = 21", "print(a * 2)"]
    assert chat.parse_tool_calls("<answer>\\boxed{3}</answer>") == []


def test_encode_conversation_masks_everything_but_assistant_tokens(qwen_tokenizer):
    tok = qwen_tokenizer
    messages = [
        {"role": "system", "content": chat.system_message([chat.python_tool_schema()])},
        {"role": "user", "content": "Reverse 'abc'."},
        {"role": "assistant", "content": "<reason>Use Python.</reason>\n" + chat.tool_call_text("'abc'[::-1]")},
        {"role": "tool", "content": "'cba'"},
        {"role": "assistant", "content": "<reason>Done.</reason>\n<answer>cba</answer>"},
    ]
    ids, mask = chat.encode_conversation(tok, messages)
    assert len(ids) == len(mask)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == ("Use Python.</reason>\n" + chat.tool_call_text("'abc'[::-1]") + "<|im_end|>"
                       + "Done.</reason>\n<answer>cba</answer><|im_end|>")
    # the same tokens as a rollout would produce: prompt segments + generated + masked tool turn
    rollout_prefix = tok.encode(chat.turn("system", messages[0]["content"]) + chat.turn("user", "Reverse 'abc'.")
                                + chat.ASSISTANT_PREFIX)
    assert ids[: len(rollout_prefix)] == rollout_prefix
    tool_turn = tok.encode(chat.tool_response_text(["'cba'"]))
    start = mask.index(0, len(rollout_prefix))
    assert ids[start:start + len(tool_turn)] == tool_turn


# --- handed cases "tool-call parsing" (cases/handed.jsonl T01-T03); T04 is in test_rollout.py ---
CASE_T01 = [  # (response, expected stdout when run); the cases name the tool "python"
    ('<tool_call>\n{"name": "python", "arguments": {"code": "x = 2\nprint(x**10)"}}\n</tool_call>', "1024"),
    ('<tool_call>{"name":"python","arguments":{"code":"s = \'</tool_call>\'\\nprint(len(s))"}}</tool_call>', "12"),
    ('<tool_call>{"name":"python","arguments":{"code":"```python\\nprint(3)\\n```"}}</tool_call>', "3"),
    ('<tool_call>{"name":"python","arguments":"{\\"code\\": \\"print(1)\\"}"}</tool_call>', "1"),
]


def test_t01_code_content_does_not_break_the_envelope():
    from rstar2 import sandbox

    for response, stdout in CASE_T01:
        (call,) = chat.parse_tool_calls(response, "python")
        assert call.error is None, (response, call.error)
        assert sandbox.execute(call.code, call.stdin).stdout.strip() == stdout


def test_t01_closing_tag_inside_code_keeps_the_whole_code():
    (call,) = chat.parse_tool_calls(CASE_T01[1][0], "python")
    assert call.code == "s = '</tool_call>'\nprint(len(s))"


def test_t02_call_mentioned_inside_reasoning_is_not_executed():
    response = ('<think>Maybe I should run <tool_call>{"name":"python","arguments":{"code":"print(0)"}}</tool_call>'
                ' later.</think>\n<tool_call>{"name":"python","arguments":{"code":"print(1)"}}</tool_call>')
    assert [c.code for c in chat.parse_tool_calls(response, "python")] == ["print(1)"]
    # our turns start inside the <reason> the generation prompt opened: a call before </reason> is a mention
    ours = 'I could <tool_call>{"name":"python","arguments":{"code":"print(0)"}}</tool_call>.</reason>\n' + \
        '<tool_call>{"name":"python","arguments":{"code":"print(1)"}}</tool_call>'
    assert [c.code for c in chat.parse_tool_calls(ours, "python")] == ["print(1)"]
    # an unclosed reasoning block is not a closed mention: the call still counts
    assert [c.code for c in chat.parse_tool_calls(ours.split("</reason>")[1], "python")] == ["print(1)"]


def test_t03_several_calls_and_duplicated_objects():
    two = ('<tool_call>{"name":"python","arguments":{"code":"a = 21"}}</tool_call>\n'
           '<tool_call>{"name":"python","arguments":{"code":"print(a * 2)"}}</tool_call>')
    assert [c.code for c in chat.parse_tool_calls(two, "python")] == ["a = 21", "print(a * 2)"]
    dup = ('<tool_call>{"name":"python","arguments":{"code":"print(7)"}}'
           '{"name":"python","arguments":{"code":"print(7)"}}</tool_call>')
    (call,) = chat.parse_tool_calls(dup, "python")
    assert call.code is None and call.error.startswith("Failed to decode tool call")
    ten = "".join(chat.tool_call_text(f"print({i})", tool_name="python") for i in range(10))
    assert [c.code for c in chat.parse_tool_calls(ten, "python")] == [f"print({i})" for i in range(10)]


def test_unterminated_or_empty_calls_are_errors():
    for text in ['<tool_call>{"name":"python","arguments":{"code":"print(1)"}}',       # no closing tag
                 '<tool_call>{"name":"python","arguments":{"code":"  "}}</tool_call>',  # empty code
                 '<tool_call>{"name":"python","arguments":{"code":"print(1)"}']:         # cut JSON
        (call,) = chat.parse_tool_calls(text, "python")
        assert call.code is None and call.error.startswith("Failed to decode tool call"), text
