"""Per-stage data (issue 19): an RL stage names the rl_data sources it trains on; a name that does not exist fails
when the workflow parses the config, and stage 3 mines its hard problems from its own sources."""

import pytest
from conftest import stage_params, workflow_config

from rstar2.stages.rl import select_sources
from rstar2.workflow_checks import check_config

ROWS = [{"id": "a-0", "source": "easy"}, {"id": "b-0", "source": "hard"}, {"id": "a-1", "source": "easy"}]
TWO = {"rl_data": {"sources": [
    {"name": "easy", "path": "data/learning/train.jsonl", "fields": {"problem": "problem", "answer": "answer"},
     "filters": {"kind": "bare"}},
    {"name": "hard", "path": "data/learning/train.jsonl", "fields": {"problem": "problem", "answer": "answer"},
     "filters": {"kind": "word"}}]}}


def test_a_stage_trains_on_its_sources_only():
    assert select_sources(ROWS, None, "s") == ROWS
    assert [r["id"] for r in select_sources(ROWS, ["easy"], "s")] == ["a-0", "a-1"]
    with pytest.raises(ValueError, match=r"rl_stage2 \(x.jsonl\): no problem of sources \['gsm8k'\].*\['easy', 'hard'\]"):
        select_sources(ROWS, ["gsm8k"], "rl_stage2 (x.jsonl)")


def test_stage_sources_reach_the_rl_and_mining_params():
    over = {**TWO, "rl": {"stages": {"stage1": {"sources": ["easy"]}, "stage3": {"sources": ["hard"]}}}}
    assert stage_params("rl", "stage1", overrides=over)["sources"] == ["easy"]
    assert stage_params("rl", "stage2", overrides=over)["sources"] is None          # null = every source
    assert stage_params("hard_problems", overrides=over)["sources"] == ["hard"]   # stage 3 mines its own


def test_an_unknown_source_name_fails_at_dag_time():
    cfg = workflow_config({**TWO, "rl": {"stages": {"stage2": {"sources": ["easy", "gsm8k_easy"]}}}})
    stages = ["stage1", "stage2", "stage3"]
    models = {"base": "", "sft": "", "rl_stage1": "", "rl_stage2": "", "rl_stage3": ""}
    with pytest.raises(ValueError, match=r"rl.stages.stage2.sources names 'gsm8k_easy'.*\['easy', 'hard'\]"):
        check_config(cfg, stages, models)
    ok = workflow_config({**TWO, "rl": {"stages": {"stage2": {"sources": ["hard"]}}}})
    assert check_config(ok, stages, models) == []
