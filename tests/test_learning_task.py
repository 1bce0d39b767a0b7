"""The bundled learning task: the arithmetic generator and its bundled files, the string tool-use SFT
source, and the held-out summary used during RL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2 import chat
from rstar2.data import arith_task, string_tools
from rstar2.rl.heldout import heldout_summary
from rstar2.rollout import Trajectory

REPO = Path(__file__).resolve().parents[1]
# the tool settings the workflow passes the sft_data stage (common.smk sft_data_params)
SFT_TOOL = {"tool": {"name": chat.DEFAULT_TOOL_NAME, "timeout_s": 5.0, "memory_mb": 1024, "max_output_chars": 256}}


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bundled_files_equal_a_fresh_generation():
    train, heldout = arith_task.generate()
    assert _read(REPO / "data/learning/train.jsonl") == train
    assert _read(REPO / "data/learning/heldout.jsonl") == heldout


def test_split_is_disjoint_balanced_and_answers_are_right():
    train, heldout = arith_task.generate(400, 100, seed=3)
    assert len(train) == 400 and len(heldout) == 100
    assert not {r["problem"] for r in train} & {r["problem"] for r in heldout}
    assert {k: sum(r["kind"] == k for r in heldout) for k in arith_task.KINDS} == dict.fromkeys(arith_task.KINDS, 25)
    for r in train + heldout:
        if r["kind"] == "bare":  # a bare expression is its own check
            assert str(eval(r["problem"])) == r["answer"]
        assert int(r["answer"]) == int(r["answer"])
    # the held-out set does not depend on the train size
    assert arith_task.generate(10, 100, seed=3)[1] == heldout
    with pytest.raises(ValueError, match="counts must be >= 0"):
        arith_task.generate(-1, 5)


def test_word_problem_answers():
    probs = [r for r in arith_task.generate(200, 0, seed=1)[0] if r["kind"] == "word"]
    for r in probs:
        nums = [int(x) for x in __import__("re").findall(r"\d+", r["problem"])]
        if r["problem"].startswith("Each"):
            assert int(r["answer"]) == nums[0] * nums[1]
        elif "gives away" in r["problem"]:
            assert int(r["answer"]) == nums[0] - nums[1]
        elif "train" in r["problem"]:
            assert int(r["answer"]) == nums[0] * nums[1]
        else:  # count, price, paid
            assert int(r["answer"]) == nums[2] - nums[0] * nums[1]


def test_string_tasks_use_no_arithmetic_and_are_deterministic():
    tasks = string_tools.generate(300, seed=0)
    assert tasks == string_tools.generate(300, seed=0) and tasks != string_tools.generate(300, seed=1)
    assert len({t["question"] for t in tasks}) == 300
    assert any(t["stdin"] for t in tasks) and any(not t["stdin"] for t in tasks)
    assert any(" + " in t["code"] for t in tasks) and any(" * " in t["code"] for t in tasks)
    for t in tasks:
        # operators only join or repeat string literals: never between two numbers
        assert not re.search(r"[\d)]\s*(?:[-+/%]|\*\*?|//)\s*[\d(]", t["code"]), t["code"]
        assert not any(op in t["code"] for op in (" - ", " / ", "**", "//", "%")), t["code"]
        assert not any(ch.isdigit() for ch in t["question"]), t["question"]


def test_string_tools_source_runs_the_code_and_boxes_the_output(tmp_path):
    from rstar2.stages import sft_data

    sft_data.run({"sources": [{"name": "string_tools", "generate": "string_tools", "n": 12}], **SFT_TOOL, "seed": 0},
                 str(tmp_path))
    rows = _read(tmp_path / "train.jsonl")
    stats = json.loads((tmp_path / "stats.json").read_text())["sources"]["string_tools"]
    assert len(rows) == 12 and stats["rows_out"] == 12 and stats["sandbox"]["status"] == {"ok": 12}
    expected = {t["id"]: t for t in string_tools.generate(12, 0)}
    for r in rows:
        system, user, call, tool, answer = r["messages"]
        t = expected[r["id"]]
        assert user["content"] == chat.user_message(t["question"])          # the RL prompt, not a bare request
        assert chat.tool_call_text(t["code"], t["stdin"]) in call["content"]
        assert tool["content"] == t["expected"]                             # what the sandbox printed
        assert answer["content"].endswith(f"<answer>\\boxed{{{t['expected']}}}</answer>")


def _traj(reward, calls=(), resp=10, finish="answer"):
    t = Trajectory(problem_id="p", question="q", gold="1", prompt_ids=[1], response_ids=[2] * resp,
                   response_mask=[1] * resp, finish_reason=finish,
                   turns=[{"text": "", "tool_calls": [{"status": s} for s in calls]}])
    t.reward = reward
    return t


def test_heldout_summary():
    trajs = [_traj(1.0, ["ok"]), _traj(0.0, ["error", "ok"]), _traj(1.0), _traj(0.0, ["timeout"], finish="budget")]
    s = heldout_summary(trajs, k=2)   # problems: [1, 0] and [1, 0]
    assert s["n_problems"] == 2 and s["accuracy"] == 0.5 and s["pass_at_k"] == 1.0
    assert s["tool_ok_ratio"] == 0.5 and s["tool_use_ratio"] == 0.75 and s["tool_calls_per_traj"] == 1.0
    assert s["truncation_ratio"] == 0.25
    with pytest.raises(ValueError, match="multiple of k=3"):
        heldout_summary(trajs, k=3)


def test_arith_task_cli_takes_options(tmp_path):
    arith_task.main([str(tmp_path / "t"), "--train", "8", "--heldout", "4", "--seed", "2"])
    assert _read(tmp_path / "t" / "heldout.jsonl") == arith_task.generate(8, 4, 2)[1]
    with pytest.raises(SystemExit):
        arith_task.main(["--help"])
    assert not (Path.cwd() / "--help").exists()


def test_sft_data_with_no_rows_says_so(tmp_path):
    from rstar2.stages import sft_data

    with pytest.raises(ValueError, match="no conversations"):
        sft_data.run({"sources": [{"name": "string_tools", "generate": "string_tools", "n": 0}], **SFT_TOOL,
                      "seed": 0}, str(tmp_path))


def test_rl_refuses_a_heldout_benchmark_that_shares_training_problems():
    from rstar2.rl.heldout import check_disjoint

    rows = [{"id": "t1", "problem": "What is  2 + 2?"}, {"id": "t2", "problem": "3 * 3"}]
    check_disjoint([{"id": "h1", "problem": "5 - 1"}], rows, "arith_heldout", "train.jsonl")
    with pytest.raises(ValueError, match=r"1 problem\(s\) of rl.heldout.benchmark 'arith_heldout'.*train.jsonl.*'h2'.*'t1'"):
        check_disjoint([{"id": "h1", "problem": "5 - 1"}, {"id": "h2", "problem": "what is 2 + 2?"}],
                       rows, "arith_heldout", "train.jsonl")


def test_heldout_by_kind_joins_logged_ids_to_the_data_files_kinds(tmp_path):
    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"{i} + 1", "answer": str(i + 1), "kind": k}) + "\n"
                            for i, k in enumerate(["bare", "bare", "word"])))
    logged = tmp_path / "heldout_problems.jsonl"
    rows = [(0, "h0", [0.0]), (0, "h1", [1.0]), (0, "h2", [0.0]), (5, "h0", [1.0]), (5, "h1", [1.0]), (5, "h2", [0.0])]
    logged.write_text("".join(json.dumps({"step": s, "id": f"my_ho-{i}", "rewards": r}) + "\n" for s, i, r in rows))
    script = [sys.executable, str(REPO / "scripts/heldout_by_kind.py"), str(logged), str(data)]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert re.search(r"\| bare\s*\| 1 / 2\s*\| 2 / 2\s*\|", out) and re.search(r"\| word\s*\| 0 / 1\s*\| 0 / 1\s*\|", out)
    logged.write_text(json.dumps({"step": 0, "id": "my_ho-h9", "rewards": [1.0]}) + "\n")
    proc = subprocess.run(script, capture_output=True, text=True)
    assert proc.returncode != 0 and "row 1: id 'my_ho-h9' is no problem of" in proc.stderr
    # an evaluation's per_problem.jsonl (no step column): one column
    logged.write_text("".join(json.dumps({"id": f"arith_heldout-{i}", "rewards": r}) + "\n"
                              for i, r in (("h0", [1.0]), ("h1", [0.0]), ("h2", [1.0]))))
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert re.search(r"\| bare\s*\| 1 / 2\s*\|", out) and re.search(r"\| word\s*\| 1 / 1\s*\|", out), out
    logged.write_text("")   # an RL stage without rl.heldout: one line, no traceback
    proc = subprocess.run(script, capture_output=True, text=True)
    assert proc.returncode != 0 and "no rows" in proc.stderr and "Traceback" not in proc.stderr


def test_recovery_rows_show_the_real_sandbox_output_of_a_failed_then_a_fixed_call(tmp_path):
    """Every recovery demonstration's tool responses are what the RL loop shows when the calls are run
    again here (the sandbox's output, or the rollout parser's error for a call that is not valid JSON), the first
    is a real failure of the intended kind, the reason sentence names the exception the model saw, and the
    corrected call is self-contained (no standard input) and prints the boxed answer."""
    from rstar2 import sandbox
    from rstar2.data.sft import recovery
    from rstar2.stages import sft_data

    sft_data.run({"sources": [{"name": "recovery", "generate": "recovery", "n": 24}], **SFT_TOOL, "seed": 0},
                 str(tmp_path))
    rows = _read(tmp_path / "train.jsonl")
    stats = json.loads((tmp_path / "stats.json").read_text())["sources"]["recovery"]
    undecodable = sum(stats.get(f"mistake_{k}", 0) for k in recovery.UNDECODABLE)
    assert len(rows) == 24 and stats["sandbox"]["status"] == {"error": 24 - undecodable, "ok": 24}
    assert {k for k in stats if k.startswith("mistake_")} == {f"mistake_{k}" for k in recovery.MISTAKES}
    runs, parsed = [], 0
    for r in rows:
        system, user, call1, tool1, call2, tool2, final = r["messages"]
        (c1,), (c2,) = (chat.parse_tool_calls(c["content"].removeprefix("<reason>")) for c in (call1, call2))
        assert c2.error is None and c2.stdin == "" and "input()" not in c2.code
        if c1.error is not None:  # the rollout's parser answered; nothing ran
            parsed += 1
            assert tool1["content"] == c1.error and c1.error.startswith("Failed to decode tool call")
            assert "JSON" in call2["content"].split("</reason>")[0]
        else:
            assert c1.code != c2.code or c1.stdin != c2.stdin
            runs.append((r, c1))
    assert parsed == undecodable > 0
    again = sandbox.execute_many([(c.code, c.stdin) for r, c1 in runs for c in (c1, _call(r, 4))])
    for (r, c1), failed, fixed in zip(runs, again[::2], again[1::2]):
        _, user, _, tool1, call2, tool2, final = r["messages"]
        assert failed.status == "error" and fixed.status == "ok"
        assert tool1["content"] == sandbox.render_result(failed, 256)   # the real traceback, as the RL loop shows it
        assert tool2["content"] == sandbox.render_result(fixed, 256)
        exc = recovery.exception_name(failed.stderr)
        assert exc in tool1["content"] and exc in call2["content"].split("</reason>")[0]
        assert final["content"].endswith(f"<answer>\\boxed{{{fixed.stdout.strip()}}}</answer>")


def _call(row: dict, i: int):
    (c,) = chat.parse_tool_calls(row["messages"][i]["content"])
    return c


@pytest.mark.parametrize("kind,code,stdin,expected", [
    ("name_error", "s = 'pencil'\nprint(s.count('s'))", "", ("s = 'pencil'\nprint({}.count('s'))", "")),
    ("name_error", "print('planet' + 'river')", "", ("print(planet + 'river')", "")),
    ("syntax_error", "s = input()\nprint(len(s))", "ab", ("s = input()\nprint(len(s)", "ab")),
    ("attribute_error", "print('planet' + '-' + 'river')", "", ("print('planet'.concat('-', 'river'))", "")),
    ("attribute_error", "s = 'ab'\nprint(s[::-1])", "", ("s = 'ab'\nprint(s.reverse())", "")),
    ("eof_error", "s = input()\nprint(s.upper())", "ab", ("s = input()\nprint(s.upper())", "")),
    ("eof_error", "s = 'ab'\nprint(s.upper())", "", None),
    ("type_error", "print('planet' * 3)", "", ("n = input()\nprint('planet' * n)", "3")),
    ("type_error", "s = input()\nprint(s.count('a'))", "ab", ("s = input()\nprint({!r} + s.count('a'))", "ab")),
    ("type_error", "s = 'ab'\nprint(s.upper())", "", None),
    ("json_error", "s = 'ab'\nprint(s.upper())", "", ('s = "ab"\nprint(s.upper())', "")),
    ("json_error", 'print("a")', "", None),
])
def test_recovery_mistakes(kind, code, stdin, expected):
    import random

    from rstar2.data.sft import recovery

    got = recovery.MISTAKES[kind]({"code": code, "stdin": stdin}, random.Random(0))
    if expected and "{}" in expected[0]:  # the undefined name is drawn: any of the listed ones, never inside quotes
        assert got is not None and any(got[0] == expected[0].format(n) for n in recovery._OTHER_NAMES)
    elif expected and "{!r}" in expected[0]:  # the label is drawn
        assert got is not None and any(got == (expected[0].format(n), expected[1]) for n in recovery._LABELS)
    else:
        assert got == expected


def test_heldout_evaluation_decodes_the_live_policy_whatever_the_rollout_engine(monkeypatch, tmp_path):
    """An in-process vLLM would load the stage's starting folder (an older policy): the held-out callback asks for
    the transformers engine on the model it is handed."""
    import dataclasses

    from rstar2 import rollout
    from rstar2.rl.heldout import make_heldout_callback
    from rstar2.rollout import RolloutConfig

    seen = []

    def fake_sample_groups(model, tok, problems, k, rcfg, **kw):
        seen.append((model, rcfg.engine))
        return [[_traj(1.0) for _ in range(k)] for _ in problems]
    monkeypatch.setattr(rollout, "sample_groups", fake_sample_groups)
    monkeypatch.setattr(rollout, "grade_all", lambda *a, **kw: None)
    rcfg = dataclasses.replace(RolloutConfig(max_response_tokens=8, max_turns=1), engine="vllm")
    cb = make_heldout_callback([{"id": "h1", "problem": "2 + 2", "answer": "4"}], "integer", rcfg, every=1, k=2,
                               seed=0, out_dir=str(tmp_path), max_steps=1, is_main=True)

    class Policy:
        training = False

        def train(self, mode):
            self.training = mode
    policy = Policy()
    cb.on_train_begin(None, type("S", (), {"global_step": 0})(), None, model=policy, processing_class=None)
    assert seen == [(policy, "hf")]
