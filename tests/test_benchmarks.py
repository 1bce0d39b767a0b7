"""Benchmark specs: bundled sets, HMMT/GPQA from a user path (synthetic files written here: GPQA-Diamond is
never committed), answer types, and the example config that declares them."""

import csv
import json
from collections import Counter

import pytest
import yaml

from rstar2.data.benchmarks import ANSWER_TYPE_RULES, DEFAULT_BENCHMARKS, LETTERS, answer_type, load_benchmark
from rstar2.grading import score_trajectory

GPQA_COLUMNS = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                "Incorrect Answer 3", "Subdomain"]
GPQA_SPEC = {"fields": {"problem": "Question", "answer": "Correct Answer", "id": "Record ID"},
             "choices": ["Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"], "answer_type": "choice"}


def _gpqa_csv(path, n=12, blank=None):
    """A synthetic file in GPQA's release format (its column names; invented questions)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GPQA_COLUMNS)
        for i in range(n):
            row = [f"rec{i:03d}", f"Synthetic question {i}: which value is right?", f"right {i}",
                   f"wrong a{i}", f"wrong b{i}", "" if blank == i else f"wrong c{i}", "Physics"]
            w.writerow(row)
    return path


def test_bundled_benchmarks_declare_their_answer_types():
    assert {n: s["answer_type"] for n, s in DEFAULT_BENCHMARKS.items()} == {
        "aime24": "integer", "aime25": "integer", "amc23": "integer", "math500": "math"}
    rows = load_benchmark("aime25")
    assert len(rows) == 30 and {r["answer_type"] for r in rows} == {"integer"}
    assert set(ANSWER_TYPE_RULES) == {"integer", "math", "choice", "ifeval", "bfcl"}
    with pytest.raises(ValueError, match="answer_type"):
        answer_type({"answer_type": "free text"})


def test_gpqa_format_from_a_user_path(tmp_path):
    path = _gpqa_csv(tmp_path / "gpqa_diamond.csv")
    rows = load_benchmark("gpqa_diamond", {**GPQA_SPEC, "path": str(path)})
    assert len(rows) == 12
    for i, r in enumerate(rows):
        assert r["id"] == f"gpqa_diamond-rec{i:03d}" and r["answer_type"] == "choice"
        assert r["answer"] in LETTERS[:4]
        # the gold letter labels the correct option's text in the problem shown to the model
        assert f"({r['answer']}) right {i}" in r["problem"]
        assert sorted(line[:3] for line in r["options"]) == ["(A)", "(B)", "(C)", "(D)"]
        assert r["problem"].startswith(f"Synthetic question {i}")
    # shuffled: the correct option is not always in the same place; stable: the same order on every load
    assert len(Counter(r["answer"] for r in rows)) > 1
    assert load_benchmark("gpqa_diamond", {**GPQA_SPEC, "path": str(path)}) == rows
    # graded on the letter
    r = rows[0]
    wrong = next(x for x in LETTERS[:4] if x != r["answer"])
    assert score_trajectory(f"\\boxed{{{r['answer']}}}", r["answer"], answer_type="choice")["reward"] == 1.0
    assert score_trajectory(f"\\boxed{{({r['answer']})}}", r["answer"], answer_type="choice")["reward"] == 1.0
    assert score_trajectory(f"\\boxed{{{wrong}}}", r["answer"], answer_type="choice")["reward"] == 0.0
    assert score_trajectory("\\boxed{right 0}", r["answer"], answer_type="choice")["reward"] == 0.0


def test_gpqa_errors_name_the_file_row_and_column(tmp_path):
    path = _gpqa_csv(tmp_path / "g.csv", n=3, blank=1)
    with pytest.raises(ValueError, match=r"g.csv.*row 1: missing field 'Incorrect Answer 3'"):
        load_benchmark("gpqa", {**GPQA_SPEC, "path": str(path)})
    with pytest.raises(ValueError, match="needs 'choices'"):
        load_benchmark("gpqa", {**GPQA_SPEC, "path": str(path), "choices": []})
    with pytest.raises(ValueError, match="missing field 'Wrong 9'"):
        load_benchmark("gpqa", {**GPQA_SPEC, "path": str(_gpqa_csv(tmp_path / "ok.csv", n=2)),
                                "choices": ["Incorrect Answer 1", "Wrong 9"]})


def test_hmmt_format_from_a_user_path(tmp_path):
    """MathArena's HMMT Feb 2025 layout (problem_idx, problem, answer with LaTeX golds)."""
    path = tmp_path / "hmmt.jsonl"
    rows = [{"problem_idx": 1, "problem": "Compute $x$.", "answer": "\\frac{9}{7}"},
            {"problem_idx": 2, "problem": "How many?", "answer": "2^{25}"},
            {"problem_idx": 3, "problem": "Find it.", "answer": "026"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"path": str(path), "fields": {"problem": "problem", "answer": "answer", "id": "problem_idx"},
            "answer_type": "math", "paper": "HMMT Feb25"}
    got = load_benchmark("hmmt25", spec)
    assert [r["answer"] for r in got] == ["\\frac{9}{7}", "2^{25}", "26"]
    assert score_trajectory("\\boxed{\\dfrac{9}{7}}", got[0]["answer"])["reward"] == 1.0
    assert score_trajectory("\\boxed{33554432}", got[1]["answer"])["reward"] == 1.0
    with pytest.raises(ValueError, match=r"hmmt25.*not a valid integer"):
        load_benchmark("hmmt25", {**spec, "answer_type": "integer"})


def test_example_config_validates_against_the_schema():
    from snakemake.utils import validate

    with open("config.yaml") as f:
        config = yaml.safe_load(f)
    with open("configs/eval_extra.example.yaml") as f:
        extra = yaml.safe_load(f)
    config["benchmarks"].update(extra["benchmarks"])
    config["evaluate"].update(extra["evaluate"])
    validate(config, "workflow/schemas/config.schema.yaml")
    assert config["benchmarks"]["gpqa_diamond"]["answer_type"] == "choice"
    config["benchmarks"]["gpqa_diamond"]["answer_type"] = "letters"
    with pytest.raises(Exception, match="letters"):
        validate(config, "workflow/schemas/config.schema.yaml")
