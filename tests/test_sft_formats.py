"""The sft_data stage on small hand-made files in every format, run through the source specs alone (the config's
``sft_data.sources``): tool calls, observations, multi-turn, renamed fields, Python calls re-run in the sandbox,
a dataset loaded through the hub code path from a local folder (no network), and the one-line errors that name
source, file, row and field for each broken case."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rstar2 import chat
from rstar2.data.sft import sharegpt
from rstar2.io import read_json, read_jsonl
from rstar2.stages import sft_data

TOOL = chat.DEFAULT_TOOL_NAME
WEATHER = {"name": "get_weather", "description": "Current weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PYTHON = {"name": "python", "description": "Run Python.",
          "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}


def _run(out: Path, sources: list[dict]) -> tuple[dict, dict]:
    sft_data.run({"sources": sources, "tool": {"name": TOOL, "timeout_s": 5.0, "memory_mb": 1024, "max_output_chars": 256}, "seed": 0}, str(out))
    return {r["id"]: r for r in read_jsonl(out / "train.jsonl")}, read_json(out / "stats.json")["sources"]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _calls(message: dict) -> list[dict]:
    return [json.loads(b) for b in chat.TOOL_CALL_RE.findall(message["content"])]


def _assert_trains_on_assistant_turns_only(rows: dict, tokenizer) -> None:
    for row in rows.values():
        ids, mask = chat.encode_conversation(tokenizer, row["messages"])
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
        assistant = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert trained == "".join(c[len("<reason>"):] + chat.IM_END for c in assistant), row["id"]
        assert "<tool_response>" not in trained and "<|im_start|>user" not in trained


def _call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


MESSAGES = [
    # 0: system text, two parallel calls whose results come back in the other order, a second user turn
    {"dialog": [{"role": "system", "content": "You are a travel agent."},
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "Let me check.",
                 "tool_calls": [_call("a", "get_weather", '{"city": "Paris"}'),
                                _call("b", "get_weather", {"city": "Rome"})]},
                {"role": "tool", "tool_call_id": "b", "content": '{"temp": 25}'},
                {"role": "tool", "tool_call_id": "a", "content": '{"temp": 18}'},
                {"role": "assistant", "content": "Paris is 18 degrees and Rome 25."},
                {"role": "user", "content": "Thanks! Any tip?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Pack an umbrella."}]}],
     "tools": [{"type": "function", "function": WEATHER}]},
    {"dialog": [{"role": "user", "content": "Write a haiku about autumn."},                      # 1 no tools;
                {"role": "assistant", "content": "Leaves drift down slowly."},                    # trailing user
                {"role": "user", "content": "Another?"}]},                                        # turn is cut
    {"dialog": [{"role": "user", "content": "What is 12 + 30?"},                                 # 2 math
                {"role": "assistant", "content": "42"}]},
    {"dialog": [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi"}]},  # 3 malformed
    {"dialog": [{"role": "user", "content": "Weather in Oslo?"},                                 # 4 bad arguments
                {"role": "assistant", "content": None, "tool_calls": [_call("c", "get_weather", "{oops")]},
                {"role": "tool", "tool_call_id": "c", "content": "{}"},
                {"role": "assistant", "content": "Sorry."}],
     "tools": json.dumps([WEATHER])},
    {"dialog": [{"role": "user", "content": "Book a flight."},                                   # 5 unknown function
                {"role": "assistant", "content": None, "tool_calls": [_call("d", "book_flight", "{}")]},
                {"role": "tool", "tool_call_id": "d", "content": "{}"},
                {"role": "assistant", "content": "Booked."}],
     "tools": [WEATHER]},
]


def test_openai_messages_with_parallel_tool_calls_renamed_field_and_drops(tmp_path, qwen_tokenizer):
    path = _jsonl(tmp_path / "chat.jsonl", MESSAGES)
    rows, stats = _run(tmp_path / "out", [{"name": "chat", "path": str(path), "format": "messages",
                                           "fields": {"messages": "dialog"}}])
    st = stats["chat"]
    assert set(rows) == {"chat-0", "chat-1"} and st["rows_in"] == 6 and st["rows_out"] == 2
    assert st["dropped"] == {"bad_function_call": 1, "malformed": 1, "math_expression": 1, "unknown_function": 1}
    m = rows["chat-0"]["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                      "user", "assistant"]
    assert m[0]["content"].startswith(chat.SYSTEM_PROMPT + "\n\nYou are a travel agent.\n\n# Tools")
    assert json.dumps({"type": "function", "function": WEATHER}) in m[0]["content"]
    # one call per turn, each followed by its own result (paired by tool_call_id)
    assert _calls(m[2]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert m[3]["content"] == '{"temp": 18}'
    assert _calls(m[4]) == [{"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert m[5]["content"] == '{"temp": 25}'
    assert m[6]["content"].endswith("<answer>Paris is 18 degrees and Rome 25.</answer>")
    assert m[8]["content"].endswith("<answer>Pack an umbrella.</answer>") and "Let me check" not in json.dumps(m)
    h = rows["chat-1"]["messages"]
    assert [x["role"] for x in h] == ["system", "user", "assistant"] and h[0]["content"] == chat.SYSTEM_PROMPT
    _assert_trains_on_assistant_turns_only(rows, qwen_tokenizer)


GLAIVE = [
    {"conv": [{"from": "human", "value": "How is the weather in Lima?"},
              {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": '{"city": "Lima"}'})},
              {"from": "observation", "value": '{"temp": 20, "sky": "clear"}'},
              {"from": "gpt", "value": "It is 20 degrees and clear in Lima."},
              {"from": "human", "value": "And tomorrow?"},
              {"from": "gpt", "value": "I can only see the current weather."}],
     "tools": json.dumps([WEATHER]), "system": "Answer in one sentence."},
    {"conv": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello! <functioncall> {}"}],  # inline call
     "tools": ""},
    {"conv": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}], "tools": "[not json"},
]
TOOLACE = [
    {"system": "You are an expert in composing functions. Here is a list of functions in JSON format that you can "
               "invoke:\n" + json.dumps([{"name": "Get Stock Price", "parameters": {"type": "object"}}])
               + "\nIf you call a function, write [func_name(params_name=params_value)].",
     "conversations": [{"from": "user", "value": "Price of AAPL?"},
                       {"from": "assistant", "value": '[Get Stock Price(symbol="AAPL", exchange="NASDAQ")]'},
                       {"from": "tool", "value": '[{"name": "Get Stock Price", "results": {"price": 190}}]'},
                       {"from": "assistant", "value": "AAPL trades at 190 dollars."}]},
    {"system": "Functions: " + json.dumps([{"name": "A"}, {"name": "B"}]),
     "conversations": [{"from": "user", "value": "Both please."},
                       {"from": "assistant", "value": "[A(x=1), B(y=2)]"},
                       {"from": "tool", "value": "[1, 2]"}, {"from": "assistant", "value": "Done."}]},
]


def test_sharegpt_glaive_and_toolace_layouts(tmp_path, qwen_tokenizer):
    glaive = tmp_path / "glaive.json"
    glaive.write_text(json.dumps(GLAIVE), encoding="utf-8")
    toolace = _jsonl(tmp_path / "toolace.jsonl", TOOLACE)
    rows, stats = _run(tmp_path / "out", [
        {"name": "fc", "path": str(glaive), "format": "sharegpt", "fields": {"conversations": "conv"}},
        {"name": "ace", "path": str(toolace), "format": "sharegpt", "calls": "python", "tools_from_system": True}])
    assert set(rows) == {"fc-0", "ace-0"}
    assert stats["fc"]["dropped"] == {"bad_tools": 1, "inline_call_text": 1}
    assert stats["ace"]["dropped"] == {"parallel_calls": 1} and stats["fc"]["tool_calls"] == 1
    m = rows["fc-0"]["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert "Answer in one sentence." in m[0]["content"] and '"name": "get_weather"' in m[0]["content"]
    assert _calls(m[2]) == [{"name": "get_weather", "arguments": {"city": "Lima"}}]
    assert m[3] == {"role": "tool", "content": '{"temp": 20, "sky": "clear"}'}
    a = rows["ace-0"]["messages"]
    assert "write [func_name" not in a[0]["content"] and '"name": "Get Stock Price"' in a[0]["content"]
    assert _calls(a[2]) == [{"name": "Get Stock Price", "arguments": {"symbol": "AAPL", "exchange": "NASDAQ"}}]
    assert a[4]["content"].endswith("<answer>AAPL trades at 190 dollars.</answer>")
    _assert_trains_on_assistant_turns_only(rows, qwen_tokenizer)


def test_alpaca_csv_and_parquet_with_renamed_columns_and_chat_valued_fields(tmp_path):
    csv = tmp_path / "inst.csv"
    pd.DataFrame({"prompt": ["Name three colours.", "Translate 'cat' to French.", "Say nothing."],
                  "context": ["", "", ""], "reply": ["Red, green, blue.", "Chat.", "  "]}).to_csv(csv, index=False)
    parquet = tmp_path / "chat.parquet"   # Llama-Nemotron keeps the request as chat messages in its input column
    pd.DataFrame({"input": [[{"role": "system", "content": "x"}, {"role": "user", "content": "Tell a joke."}]],
                  "output": ["Why did the chicken cross the road?"], "reasoning": ["off"]}).to_parquet(parquet)
    rows, stats = _run(tmp_path / "out", [
        {"name": "inst", "path": str(csv), "format": "alpaca",
         "fields": {"instruction": "prompt", "input": "context", "output": "reply"}},
        {"name": "nemo", "path": str(parquet), "format": "alpaca", "filters": {"reasoning": "off"},
         "fields": {"instruction": "input", "input": None}}])
    assert set(rows) == {"inst-0", "inst-1", "nemo-0"} and stats["inst"]["dropped"] == {"empty_output": 1}
    sys_msg, user, reply = rows["inst-1"]["messages"]
    assert TOOL in sys_msg["content"] and user["content"] == "Translate 'cat' to French."
    assert reply["content"].endswith("<answer>Chat.</answer>")
    assert rows["nemo-0"]["messages"][1]["content"] == "Tell a joke."


def _py_row(code: str, recorded: str) -> dict:
    return {"messages": [{"role": "user", "content": "Count the letters of hello."},
                         {"role": "assistant", "content": None,
                          "tool_calls": [_call("p", "python", json.dumps({"code": code}))]},
                         {"role": "tool", "tool_call_id": "p", "content": recorded},
                         {"role": "assistant", "content": f"The tool says {recorded}."}],
            "tools": [{"type": "function", "function": PYTHON}]}


def test_python_tool_calls_become_the_code_tool_and_are_rerun_when_execute_is_on(tmp_path):
    path = _jsonl(tmp_path / "py.jsonl", [_py_row("print(len('hello'))", "5"), _py_row("print(len('hello'))", "6"),
                                          _py_row("print(1/0)", "inf"),
                                          _py_row("import random\nprint(random.random())", "0.5")])
    spec = {"name": "py", "path": str(path), "format": "messages", "python_tool": "python"}
    rows, stats = _run(tmp_path / "run", [{**spec, "execute": True}])
    assert set(rows) == {"py-0"}
    assert stats["py"]["dropped"] == {"exec_error": 1, "nondeterministic_code": 1, "output_mismatch": 1}
    assert stats["py"]["sandbox"]["calls"] == 3     # the nondeterministic code never ran
    system, user, call, tool, reply = rows["py-0"]["messages"]
    assert json.dumps(chat.python_tool_schema(TOOL)) in system["content"]
    assert '"name": "python"' not in system["content"]
    assert chat.tool_call_text("print(len('hello'))", "", TOOL) in call["content"]
    (parsed,) = chat.parse_tool_calls(call["content"], TOOL)
    assert parsed.error is None and tool["content"] == "5"
    # without execute the recorded results are kept as they are
    rows, stats = _run(tmp_path / "recorded", [spec])
    assert len(rows) == 4 and rows["py-1"]["messages"][3]["content"] == "6" and "sandbox" not in stats["py"]


def test_hub_code_path_reads_a_saved_dataset_and_a_local_folder_without_network(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")   # any attempt to reach the hub fails instead of downloading
    rows = [{"messages": MESSAGES[0]["dialog"][1:6], "tools": json.dumps([WEATHER])},
            {"messages": [{"role": "user", "content": "Write a haiku about snow."},
                          {"role": "assistant", "content": "White and quiet."}], "tools": ""}]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{**r, "messages": json.dumps(r["messages"])}
                                                               for r in rows])}).save_to_disk(str(saved))
    folder = tmp_path / "folder"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", rows)   # nested lists of structs: numpy arrays after to_pandas
    out, stats = _run(tmp_path / "out", [{"name": "saved", "path": f"hub:{saved}", "format": "messages"},
                                         {"name": "folder", "path": f"hub:{folder}", "format": "messages"}])
    assert set(out) == {"saved-0", "saved-1", "folder-0", "folder-1"}
    assert stats["saved"]["path"] == f"hub:{saved}"
    def unreasoned(row):   # the reason sentence is drawn per row id
        return [re.sub(r"<reason>.*?</reason>", "", m["content"]) for m in row["messages"]]
    assert unreasoned(out["saved-0"]) == unreasoned(out["folder-0"])
    assert _calls(out["folder-0"]["messages"][2]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    with pytest.raises(ValueError, match=r"dataset 'saved' \(file hub:.*saved\): no split 'test'"):
        _run(tmp_path / "bad", [{"name": "saved", "path": f"hub:{saved}", "format": "messages", "split": "test"}])


def test_limit_samples_the_filtered_rows_and_ids_come_from_a_mapped_column(tmp_path):
    rows = [{"key": f"k{i}", "lang": "en" if i % 2 else "de", "instruction": f"Describe colour number {i}.",
             "output": "A colour."} for i in range(10)]
    path = _jsonl(tmp_path / "a.jsonl", rows)
    spec = {"name": "a", "path": str(path), "format": "alpaca", "filters": {"lang": "en"}, "limit": 3}
    first, stats = _run(tmp_path / "one", [spec])
    again, _ = _run(tmp_path / "two", [spec])
    assert first == again and len(first) == 3 and stats["a"]["rows_available"] == 10
    assert all(int(i.split("-")[1]) % 2 == 1 for i in first)      # ids are 0-based file rows of en rows
    keyed, _ = _run(tmp_path / "keyed", [{**spec, "fields": {"id": "key"}, "limit": None}])
    assert set(keyed) == {f"a-k{i}" for i in range(1, 10, 2)}


# (file name, file content, spec, what the one-line error must name besides source and file)
BROKEN = {
    "missing field": ("m.jsonl", [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
                                  {"tools": ""}],
                      {"format": "sharegpt"}, ["row 1: missing field 'conversations'", "fields.conversations"]),
    "unknown role": ("r.jsonl", [{"conversations": [{"from": "human", "value": "Hi"},
                                                    {"from": "narrator", "value": "x"}]}],
                     {"format": "sharegpt"}, ["row 0: field 'conversations.1.from'", "unknown role 'narrator'"]),
    "renamed field absent": ("n.jsonl", [{"instruction": "Hi", "reply": "Yo"}],
                             {"format": "alpaca", "fields": {"output": "answer_text"}},
                             ["row 0: missing field 'answer_text'", "fields.output", "available columns"]),
    "message without role": ("w.jsonl", [{"messages": [{"content": "x"}]}], {"format": "messages"},
                             ["row 0: field 'messages.0'", "'role'"]),
    "messages not json": ("j.jsonl", [{"messages": []}, {"messages": []}, {"messages": "hello"}],
                          {"format": "messages"}, ["row 2: field 'messages'", "not valid JSON"]),
    "object where text belongs": ("o.jsonl", [{"instruction": {"a": 1}, "output": "x"}], {"format": "alpaca"},
                                  ["row 0: field 'instruction'", "expected text"]),
    "broken json line": ("b.jsonl", None, {"format": "alpaca"}, ["line 2 (1-based) is not valid JSON"]),
    "duplicate id": ("d.jsonl", [{"instruction": "a", "output": "b", "k": 1},
                                 {"instruction": "c", "output": "d", "k": 1}],
                     {"format": "alpaca", "fields": {"id": "k"}}, ["row 1: duplicate id 'bad-1'", "fields.id"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_case_fails_with_one_line_naming_source_file_row_and_field(tmp_path, case):
    fname, content, spec, expected = BROKEN[case]
    path = tmp_path / fname
    if content is None:
        path.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output"\n', encoding="utf-8")
    else:
        _jsonl(path, content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.jsonl").write_text("earlier run\n")
    with pytest.raises(ValueError) as e:
        _run(out, [{"name": "bad", "path": str(path), **spec}])
    message = str(e.value)
    assert "\n" not in message and "'bad'" in message and str(path) in message, message
    for part in expected:
        assert part in message, message
    assert (out / "train.jsonl").read_text() == "earlier run\n" and not (out / "manifest.json").exists()


@pytest.mark.parametrize("spec,expected", [
    ({"path": "x.json", "format": "toolformer"}, "set execute: true"),
    ({"path": "x.json", "format": "alpaca", "fields": {"prompt": "q"}}, "unknown keys in fields for format alpaca"),
    ({"path": "x.json", "format": "messages", "execute": True}, "execute needs python_tool"),
    ({"path": "x.json", "format": "alpaca", "calls": "python"}, "apply to format sharegpt only"),
    ({"path": "x.json", "generate": "string_tools", "n": 1}, "either 'path'"),
    ({"path": "x.json", "format": "markdown"}, "'format' must be one of"),
])
def test_spec_errors_name_the_source_before_reading_anything(tmp_path, spec, expected):
    with pytest.raises(ValueError, match=rf"sft_data source 'bad': .*{expected}"):
        _run(tmp_path / "out", [{"name": "bad", **spec}])
    with pytest.raises(ValueError, match="source names must be unique"):
        _run(tmp_path / "out", [{"name": "a", "generate": "string_tools", "n": 1}] * 2)


def test_cli_prints_the_error_as_one_line_and_exits_2(tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", BROKEN["unknown role"][1])
    params = {"sources": [{"name": "mine", "path": str(path), "format": "sharegpt"}], "tool": {"name": TOOL, "timeout_s": 5.0, "memory_mb": 1024, "max_output_chars": 256},
              "seed": 0}
    env = {k: v for k, v in os.environ.items() if k not in ("RSTAR2_SANDBOX", "RSTAR2_TRACEBACK")}
    proc = subprocess.run([sys.executable, "-m", "rstar2.cli", "sft-data", "--params", json.dumps(params),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"rstar2 sft-data: error: sft_data source 'mine' (file {path}): row 0: field 'conversations.1.from' "
        f"(fields.conversations): unknown role 'narrator'; expected one of {sorted(sharegpt.ROLES)}"]


def test_the_custom_sft_example_config_runs_as_is(tmp_path):
    import yaml

    repo = Path(__file__).resolve().parents[1]
    sources = yaml.safe_load((repo / "configs/custom_sft.example.yaml").read_text())["sft_data"]["sources"]
    rows, stats = _run(tmp_path / "out", [{**s, "path": str(repo / s["path"])} for s in sources])
    assert stats["my_chats"]["rows_out"] == 3 and stats["my_chats"]["sandbox"]["status"] == {"ok": 1}
    assert stats["glaive"]["rows_out"] == 12
    call = rows["my_chats-2"]["messages"][2]["content"]
    assert chat.tool_call_text("print('orange'[::-1])", "", TOOL) in call
