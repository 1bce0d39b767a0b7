"""No silent drops (rstar2/data/drop_checks.py, loaders, curate): a user's own RL data with non-integer golds and
no ``answer_type`` stops before any job in one line; a small loss is a warning shown on every run; an empty gold
is an error in every format; every dropped row is listed with its reason, and decontaminated rows are named. All
in-process: the DAG-time check (``workflow_checks.check_rl_sources``) on the validated config, and the stage."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import stage_params, workflow_config

from rstar2.data.benchmarks import load_benchmark
from rstar2.data.loaders import load_source
from rstar2.io import read_json, read_jsonl
from rstar2.stages import rl_candidates
from rstar2.workflow_checks import check_rl_sources

# The user data: 30 problems, own column names; 9 integer golds, the rest fractions, radicals, decimals,
# multiples of pi.
NON_INTEGER = ["\\frac{2}{3}", "\\sqrt{3}", "2\\pi", "0.75", "\\frac{1}{2}", "3\\sqrt{2}", "\\frac{\\pi}{4}", "1.5",
               "\\frac{5}{6}", "2.25", "\\sqrt{5}", "\\frac{7}{8}", "4\\pi", "0.125", "\\frac{3}{4}", "\\sqrt{7}",
               "6.5", "\\frac{9}{10}", "\\pi", "0.2", "\\frac{11}{12}"]
GOLDS = NON_INTEGER + [str(n) for n in (4, 9, 16, 25, 36, 49, 64, 81, 100)]


def _own_data(folder: Path, golds=GOLDS) -> Path:
    path = folder / "mine.jsonl"
    with open(path, "w") as f:
        for i, g in enumerate(golds):
            f.write(json.dumps({"qid": f"q{i}", "question": f"Problem number {i}: compute the value asked for "
                                f"in the {i}-th exercise of this small set.", "gold": g}) + "\n")
    return path


def _config(tmp_path, source: dict, **rl_data):
    spec = {"name": "mine", "fields": {"problem": "question", "answer": "gold", "id": "qid"}, **source}
    return workflow_config({"rl_data": {"sources": [spec], **rl_data}}, files=())


def test_forgetting_answer_type_math_stops_before_any_job_in_one_line(tmp_path):
    cfg = _config(tmp_path, {"path": str(_own_data(tmp_path))})
    with pytest.raises(ValueError) as err:
        check_rl_sources(cfg, str(tmp_path / "stamps"))
    msg = str(err.value)
    print(msg)
    assert "\n" not in msg
    assert msg.startswith("config: rl_data.sources[0] (mine): the integer answer filter (answer_type 'integer') "
                          "drops 21 of 30 rows (70.0%): ")
    assert "not_a_number=" in msg and "non_integer_number=" in msg and '"\\frac{2}{3}"' in msg
    assert "above rl_data.max_filtered_share (0.05)" in msg and "set answer_type: math on this source" in msg
    assert not (tmp_path / "stamps").exists(), "a refused check is not cached"

    # the fix named in the line: answer_type math keeps every row, no warning
    ok = _config(tmp_path, {"path": str(_own_data(tmp_path)), "answer_type": "math"})
    check_rl_sources(ok, str(tmp_path / "stamps"))
    # or consenting to the loss: the source's share, by name
    consent = _config(tmp_path, {"path": str(_own_data(tmp_path))}, max_filtered_share={"default": 0.05, "mine": 1.0})
    check_rl_sources(consent, str(tmp_path / "stamps2"))


def test_a_loss_within_the_share_is_a_warning_on_every_run(tmp_path, capsys):
    golds = [str(n) for n in range(1, 30)] + ["\\frac{1}{3}"]     # 1 of 30: 3%
    cfg = _config(tmp_path, {"path": str(_own_data(tmp_path, golds))})
    for _ in range(2):   # the second run reads the cached check: the warning is shown again
        check_rl_sources(cfg, str(tmp_path / "stamps"))
        err = capsys.readouterr().err
        assert err.count("warning: config: rl_data.sources[0] (mine): the integer answer filter") == 1, err
        assert 'drops 1 of 30 rows (3.3%): non_integer_number=1 (e.g. "\\frac{1}{3}")' in err
        assert "within rl_data.max_filtered_share (0.05)" in err and "dropped.jsonl" in err
    assert len(list((tmp_path / "stamps").glob("rl-sources-*.ok"))) == 1


@pytest.mark.parametrize("fmt", ["jsonl_empty", "jsonl_blank", "jsonl_null", "jsonl_missing_key", "csv_empty"])
def test_an_empty_or_missing_gold_is_one_error_in_every_format(tmp_path, fmt):
    rows = [{"question": "What is one plus one here?", "gold": "2"}, {"question": "What is two plus two here?"}]
    if fmt != "jsonl_missing_key":
        rows[1]["gold"] = {"jsonl_empty": "", "jsonl_blank": "  ", "jsonl_null": None, "csv_empty": ""}[fmt]
    if fmt == "csv_empty":
        path = tmp_path / "mine.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path = tmp_path / "mine.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "mine", "path": str(path), "fields": {"problem": "question", "answer": "gold"}}
    with pytest.raises(ValueError) as err:
        load_source(spec)
    assert f"dataset 'mine' (file {path}): row 1: missing field 'gold' (absent, null or empty" in str(err.value)
    assert "on_missing: drop drops such rows, counted in the funnel" in str(err.value)
    # the same rule for a benchmark, whose hint names no on_missing (benchmarks.<name>.on_missing is refused)
    with pytest.raises(ValueError, match="row 1: missing field 'gold'") as err:
        load_benchmark("mine", {**spec, "answer_type": "math"})
    assert "on_missing: drop" not in str(err.value)
    assert "a benchmark takes no on_missing: fill the value in or remove the row" in str(err.value)
    # on_missing: drop is the explicit way to drop such rows: counted, and listed
    assert load_source({**spec, "on_missing": "drop"})[1]["answer_raw"] is None


def test_a_missing_field_hint_names_only_a_fix_that_applies(tmp_path):
    """on_missing: drop cannot help a field no row has, nor a mapped id (required in every row even with drop)."""
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "What is one plus one here?", "gold": "2", "qid": "a"}) + "\n"
                    + json.dumps({"question": "What is two plus two here?", "gold": "4"}) + "\n")
    spec = {"name": "mine", "path": str(path), "fields": {"problem": "question", "answer": "final"}}
    for load in (load_source, lambda s: load_benchmark("mine", {**s, "answer_type": "math"})):
        with pytest.raises(ValueError, match="no row has it: map fields.answer to one of the available columns") \
                as err:
            load(spec)
        assert "on_missing" not in str(err.value)
    with_id = {**spec, "fields": {"problem": "question", "answer": "gold", "id": "qid"}, "on_missing": "drop"}
    with pytest.raises(ValueError, match="a mapped fields.id must be in every row: fill it in, or leave fields.id "
                                         "out") as err:
        load_source(with_id)
    assert "on_missing" not in str(err.value)


def test_every_dropped_row_is_listed_with_its_reason_and_contaminated_ones_are_named(tmp_path):
    aime = load_benchmark("aime24")[0]
    golds = GOLDS[:1] + [str(n) for n in range(29)]
    path = _own_data(tmp_path, golds)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[5]["question"] = rows[4]["question"]      # a duplicate
    rows[6]["question"] = aime["problem"]           # a copy of a benchmark problem
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "mine", "path": str(path), "fields": {"problem": "question", "answer": "gold", "id": "qid"}}
    params = stage_params("rl_data", overrides={"rl_data": {"sources": [spec], "decontaminate_against": ["aime24"],
                                                            "near_dedupe": {"enabled": False}}}, files=())
    out = tmp_path / "out"
    rl_candidates.run(params, str(out))    # 1 of 30 (3%) to the integer filter: within the default share
    dropped = {r["id"]: r for r in read_jsonl(out / "dropped.jsonl")}
    assert {i: (r["step"], r["reason"]) for i, r in dropped.items()} == {
        "mine-q0": ("integer_answer", "non_integer_number"), "mine-q5": ("dedupe", "duplicate"),
        "mine-q6": ("decontaminate", "contaminated")}
    assert dropped["mine-q0"]["answer_raw"] == "\\frac{2}{3}" and dropped["mine-q5"]["kept"] == "mine-q4"
    assert dropped["mine-q6"]["benchmarks"] == ["aime24"]
    funnel = read_json(out / "funnel.json")
    assert funnel["contaminated"] == [{"id": "mine-q6", "source": "mine", "benchmarks": ["aime24"],
                                       "problem": aime["problem"][:160]}]
    assert len(read_jsonl(out / "train.jsonl")) == 27

    # the stage refuses too (a run that skipped the DAG-time check, e.g. `rstar2 rl-candidates` by hand)
    strict = {**params, "max_filtered_share": 0.01}
    with pytest.raises(ValueError, match=r"rl_data: rl_data.sources\[0\] \(mine\): the integer answer filter .* "
                                         r"drops 1 of 30 rows"):
        rl_candidates.run(strict, str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists(), "refused before anything is written"
