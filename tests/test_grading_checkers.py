"""IFEval (lm-eval's checks) and BFCL (bfcl-eval's AST checker) on known good and bad responses, in process and
through the killable grading workers (grading_pool.check_many) that evaluation uses; the bundled data loads."""

import json

import pytest

from rstar2.data import bfcl as bfcl_data
from rstar2.data import ifeval as ifeval_data
from rstar2.grading import bfcl, ifeval
from rstar2.grading_pool import check_many


def _ref(ids, kwargs, prompt="Write something."):
    return {"key": 1, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


IFEVAL_CASES = [
    # (name, reference, response, prompt strict, inst strict, prompt loose)
    ("no_comma ok", _ref(["punctuation:no_comma"], [{}]), "one two three. four five.", True, [True], True),
    ("no_comma bad", _ref(["punctuation:no_comma"], [{}]), "one, two, three.", False, [False], False),
    # loose drops the first line: a chatty preamble with a comma fails strict, passes loose
    ("loose preamble", _ref(["punctuation:no_comma"], [{}]), "Sure, here it is:\nno commas in this part",
     False, [False], True),
    ("lowercase ok", _ref(["change_case:english_lowercase"], [{}]),
     "this is an answer written entirely in lowercase english words for the checker.", True, [True], True),
    ("lowercase bad", _ref(["change_case:english_lowercase"], [{}]),
     "This Answer Has Capital Letters In It for the checker.", False, [False], False),
    # punkt (NLTK's sentence tokenizer, offline) decides the sentence count
    ("sentences ok", _ref(["length_constraints:number_sentences"], [{"relation": "less than", "num_sentences": 3}]),
     "Dr. Smith arrived at 5 p.m. on Monday. He left early.", True, [True], True),
    ("sentences bad", _ref(["length_constraints:number_sentences"], [{"relation": "less than", "num_sentences": 3}]),
     "One. Two. Three. Four.", False, [False], False),
    # langdetect (seeded) decides the language
    ("language ok", _ref(["language:response_language"], [{"language": "de"}]),
     "Das ist eine kurze Antwort auf Deutsch, die der Prüfer als deutsche Sprache erkennen sollte.",
     True, [True], True),
    ("two instructions, one kept", _ref(["punctuation:no_comma", "detectable_format:title"], [{}, {}]),
     "<<A Title>> and then text, with a comma.", False, [False, True], False),
]


@pytest.mark.parametrize("case", IFEVAL_CASES, ids=[c[0] for c in IFEVAL_CASES])
def test_ifeval_checker_on_known_responses(case):
    _, ref, response, strict, inst, loose = case
    out = ifeval.check(f"<reason>fine</reason>\n<answer>{response}</answer>", ref)
    assert out["response"] == response
    assert out["prompt_level_strict_acc"] is strict and out["inst_level_strict_acc"] == inst
    assert out["prompt_level_loose_acc"] is loose


def test_ifeval_response_is_the_answer_without_reasoning():
    assert ifeval.response_text("thinking, with commas</reason>\n<answer>no commas</answer>") == "no commas"
    assert ifeval.response_text("<think>a, b</think>plain text") == "plain text"
    assert ifeval.response_text("no tags at all") == "no tags at all"


def test_ifeval_summary_uses_lm_evals_aggregation():
    results = [ifeval.check(resp, ref) for _, ref, resp, *_ in IFEVAL_CASES]
    s = ifeval.summarise(results)
    assert s["prompt_level_strict_acc"] == pytest.approx(4 / 9)     # cases 1, 4, 6, 8
    assert s["inst_level_strict_acc"] == pytest.approx(5 / 10)       # + the title of the last case
    assert s["prompt_level_loose_acc"] == pytest.approx(5 / 9)
    assert ifeval.summarise([]) == {k: None for k in ifeval.METRICS}
    with pytest.raises(ValueError, match="unknown IFEval"):
        ifeval.check_reference(_ref(["punctuation:no_semicolons"], [{}]))


def _bfcl_ref(category, qid):
    rows = {r["id"]: r for r in bfcl_data.load("bfcl", bfcl_data_dir(), [category])}
    return json.loads(rows[qid]["answer"])


def bfcl_data_dir():
    from pathlib import Path

    return Path("data/eval/bfcl")


def _call(name, args, as_string=False):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": json.dumps(args) if as_string else args}) \
        + "\n</tool_call>"


BFCL_CASES = [
    # (name, category, id, response, valid)
    ("simple ok", "simple_python", "simple_python_1", "<reason>factorial</reason>\n"
     + _call("math.factorial", {"number": 5}), True),
    ("simple ok, args as a JSON string", "simple_python", "simple_python_1",
     "</reason>" + _call("math.factorial", {"number": 5}, as_string=True), True),
    ("simple wrong value", "simple_python", "simple_python_1", "</reason>" + _call("math.factorial", {"number": 6}),
     False),
    ("simple wrong type", "simple_python", "simple_python_1", "</reason>" + _call("math.factorial", {"number": "5"}),
     False),
    ("simple no call", "simple_python", "simple_python_1", "The factorial of 5 is 120.", False),
    ("simple call only in reasoning", "simple_python", "simple_python_1",
     "I could write " + _call("math.factorial", {"number": 5}) + "</reason> The answer is 120.", False),
    ("simple bad JSON", "simple_python", "simple_python_1", "</reason><tool_call>{\"name\": math}</tool_call>", False),
    ("multiple ok", "multiple", "multiple_0",
     "</reason>" + _call("triangle_properties.get", {"side1": 5, "side2": 4, "side3": 3}), True),
    ("parallel ok, any order", "parallel", "parallel_0", "</reason>"
     + _call("spotify.play", {"artist": "Maroon 5", "duration": 15})
     + _call("spotify.play", {"artist": "Taylor Swift", "duration": 20}), True),
    ("parallel one call missing", "parallel", "parallel_0", "</reason>"
     + _call("spotify.play", {"artist": "Taylor Swift", "duration": 20}), False),
    ("parallel multiple ok", "parallel_multiple", "parallel_multiple_0", "</reason>"
     + _call("math_toolkit.sum_of_multiples", {"lower_limit": 1, "upper_limit": 1000, "multiples": [3, 5]})
     + _call("math_toolkit.product_of_primes", {"count": 5}), True),
    ("irrelevance no call", "irrelevance", "irrelevance_0", "None of the functions computes a triangle's area.", True),
    ("irrelevance undecodable", "irrelevance", "irrelevance_0", "</reason><tool_call>not json</tool_call>", True),
    ("irrelevance call", "irrelevance", "irrelevance_0", "</reason>"
     + _call("determine_body_mass_index", {"weight": 10.0, "height": 5.0}), False),
]


@pytest.mark.parametrize("case", BFCL_CASES, ids=[c[0] for c in BFCL_CASES])
def test_bfcl_checker_on_known_responses(case):
    _, category, qid, response, valid = case
    out = bfcl.check(response, _bfcl_ref(category, qid))
    assert out["valid"] is valid, out


def test_bfcl_summary_is_the_mean_over_categories():
    res = [{"category": "simple_python", "valid": v} for v in (True, True, True, False)] + \
          [{"category": "irrelevance", "valid": False}]
    s = bfcl.summarise(res, ["simple_python", "irrelevance", "multiple"])
    assert s["by_category"]["simple_python"] == {"n": 4, "accuracy": 0.75}
    assert s["by_category"]["multiple"] == {"n": 0, "accuracy": None}
    assert s["accuracy"] == pytest.approx((0.75 + 0.0) / 2)


def test_checkers_run_in_the_grading_workers():
    ifeval_items = [(f"<answer>{resp}</answer>", ref) for _, ref, resp, *_ in IFEVAL_CASES]
    got = check_many("ifeval", ifeval_items, timeout_s=30)
    assert [r["status"] for r in got] == ["ok"] * len(ifeval_items)
    assert [r["prompt_level_strict_acc"] for r in got] == [c[3] for c in IFEVAL_CASES]
    bfcl_items = [(resp, _bfcl_ref(cat, qid)) for _, cat, qid, resp, _ in BFCL_CASES]
    got = check_many("bfcl", bfcl_items, timeout_s=30)
    assert [(r["status"], r["valid"]) for r in got] == [("ok", c[4]) for c in BFCL_CASES]
    with pytest.raises(ValueError, match="kind"):
        check_many("arena_hard", [])


def test_bundled_data_loads_with_our_prompts():
    rows = ifeval_data.load("ifeval", "data/eval/ifeval/input_data.jsonl")
    assert len(rows) == 541 and len({r["id"] for r in rows}) == 541
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n<reason>") and rows[0]["problem"] in rows[0]["prompt"]
    for r in rows:
        ifeval.check_reference(json.loads(r["answer"]))
    cats = list(bfcl.CATEGORIES)
    rows = bfcl_data.load("bfcl", bfcl_data_dir(), cats)
    counts = {c: sum(r["group"] == c for r in rows) for c in cats}
    assert counts == {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
                      "irrelevance": 240}
    r = next(r for r in rows if r["id"] == "simple_python_1")
    # the functions are listed as tools in our system prompt, BFCL types mapped to JSON schema, names kept
    tool = json.loads(r["prompt"].split("<tools>\n")[1].split("\n</tools>")[0])
    assert tool["function"]["name"] == "math.factorial" and tool["function"]["parameters"]["type"] == "object"
    assert tool["function"]["description"].endswith(bfcl_data.PYTHON_HINT)
    assert "<tool_call>" in r["prompt"] and r["prompt"].endswith("<|im_start|>assistant\n<reason>")
    with pytest.raises(ValueError, match="not checked"):
        bfcl.check_reference({"category": "multi_turn_base", "functions": [], "ground_truth": []})


def test_ifeval_checker_never_downloads(tmp_path):
    """lm-eval fetches punkt_tab at import when NLTK cannot find it; ours is installed, so nothing is fetched."""
    import os
    import subprocess
    import sys

    code = ("import nltk\n"
            "def no(*a, **k):\n    raise SystemExit('an NLTK download was attempted')\n"
            "nltk.download = no\n"
            "from rstar2.grading import ifeval\n"
            "ref = {'key': 1, 'prompt': 'p', 'instruction_id_list': ['length_constraints:number_sentences'],\n"
            "       'kwargs': [{'relation': 'at least', 'num_sentences': 2}]}\n"
            "ifeval.check_reference(ref)\n"
            "print(ifeval.check('<answer>One sentence. Two sentences.</answer>', ref)['prompt_level_strict_acc'])\n")
    env = {**os.environ, "NLTK_DATA": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
