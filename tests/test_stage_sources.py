"""Per-stage data: each rl_data source lists the RL stages that train on it (a curriculum); an enabled
stage no source trains fails when the workflow parses the config, and stage 3 mines its hard problems from its own
sources. The curriculum lives on the sources, so a --configfile that replaces rl_data.sources replaces it too."""

import pytest
from conftest import stage_params, workflow_config

from rstar2.stages.rl import select_sources
from rstar2.workflow_checks import check_config

ROWS = [{"id": "a-0", "source": "easy"}, {"id": "b-0", "source": "hard"}, {"id": "a-1", "source": "easy"}]
STAGES = ["stage1", "stage2", "stage3"]
MODELS = {"base": "", "sft": "", "rl_stage1": "", "rl_stage2": "", "rl_stage3": ""}


def two(easy_stages=None, hard_stages=None):
    """rl_data with two sources of the bundled task; None leaves a source's ``stages`` to the schema default."""
    def src(name, kind, stages):
        s = {"name": name, "path": "data/learning/train.jsonl", "fields": {"problem": "problem", "answer": "answer"},
             "filters": {"kind": kind}}
        return s if stages is None else {**s, "stages": stages}
    return {"rl_data": {"sources": [src("easy", "bare", easy_stages), src("hard", "word", hard_stages)]}}


def test_a_stage_trains_on_its_sources_only():
    assert select_sources(ROWS, None, "s") == ROWS
    assert [r["id"] for r in select_sources(ROWS, ["easy"], "s")] == ["a-0", "a-1"]
    with pytest.raises(ValueError, match=r"rl_stage2 \(x.jsonl\): no problem of sources \['gsm8k'\].*\['easy', 'hard'\]"):
        select_sources(ROWS, ["gsm8k"], "rl_stage2 (x.jsonl)")


def test_stage_sources_reach_the_rl_and_mining_params():
    over = two(["stage1", "stage2"], ["stage2", "stage3"])
    assert stage_params("rl", "stage1", overrides=over)["sources"] == ["easy"]
    assert stage_params("rl", "stage2", overrides=over)["sources"] is None          # every source = every row
    assert stage_params("rl", "stage3", overrides=over)["sources"] == ["hard"]
    assert stage_params("hard_problems", overrides=over)["sources"] == ["hard"]   # stage 3 mines its own
    # unlisted: every stage trains on the source (a user's own sources need no curriculum)
    assert stage_params("rl", "stage1", overrides=two())["sources"] is None


def test_the_curriculum_does_not_re_curate():
    a = stage_params("rl_data", overrides=two(["stage1"], ["stage2", "stage3"]))
    b = stage_params("rl_data", overrides=two())
    assert a == b and all("stages" not in s for s in a["sources"])


def test_replacing_the_sources_replaces_the_curriculum():
    """The default config trains stage 1 on arith_easy only; a configfile with other sources must still plan."""
    cfg = workflow_config({"rl_data": {"sources": [
        {"name": "mine", "path": "data/learning/train.jsonl", "fields": {"problem": "problem", "answer": "answer"}}]}})
    assert check_config(cfg, STAGES, MODELS) == []


def test_a_stage_no_source_trains_fails_at_dag_time():
    cfg = workflow_config(two(["stage1"], ["stage1", "stage3"]))
    with pytest.raises(ValueError, match=r"rl stage stage2 is enabled but no rl_data source lists it.*'easy': \['stage1'\]"):
        check_config(cfg, STAGES, MODELS)
    assert check_config(cfg, ["stage1"], MODELS) == []
    with pytest.raises(Exception, match="stage4"):
        workflow_config(two(["stage4"]))
