"""Configs the workflow must refuse before any job runs, each with its one line: checked in-process through the
functions the Snakefile calls when it builds the DAG (``rstar2.config_schema.validate_config``, then
``rstar2.workflow_checks.check_before_jobs``; ``workflow/rules/common.smk``), on config.yaml, a config of the
repository and an overlay merged as Snakemake merges ``--configfile`` files. tests/test_workflow.py keeps the same
path end to end through ``snakemake -n`` (lint, the plans, one refused value)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from rstar2.config_schema import validate_config
from rstar2.stages.params import merge_config
from rstar2.workflow_checks import check_before_jobs

TINY, LEARNING = "configs/tiny.yaml", "configs/cpu-learning.yaml"
# one cache of passed checks for the module, as .snakemake/rstar2_checks is for a workflow folder: loading the tiny
# config's RL sources (a 17K-row parquet among them) is paid once, not per refused config
CACHE: dict = {}


@pytest.fixture(autouse=True, scope="module")
def _module_cache(tmp_path_factory):
    CACHE["dir"] = tmp_path_factory.mktemp("rstar2_checks")
    yield
    CACHE.clear()


def checked(tmp_path: Path, overlay: str, base: str = TINY, root: Path = REPO_ROOT, cache: Path | None = None) -> str:
    """Run the workflow's checks on config.yaml + ``base`` + ``overlay`` (YAML text) in ``root``; returns the
    refusal's message ('' when the config passes). ``cache``: the checks' cache folder (default: the module's)."""
    over = tmp_path / "overlay.yaml"
    over.write_text(overlay)
    files = [root / "config.yaml", root / base, over]
    config: dict = {}
    for f in files:
        config = merge_config(config, yaml.safe_load(f.read_text()) or {})
    with contextlib.chdir(root):
        try:
            validate_config(config, str(root / "workflow/schemas/config.schema.yaml"), [str(f) for f in files])
            check_before_jobs(config, str(cache or CACHE["dir"]))
        except ValueError as e:
            return str(e)
    return ""


def refused(tmp_path: Path, overlay: str, base: str = TINY, root: Path = REPO_ROOT) -> str:
    """The one line a refused config gets; fails the test when the config passes or the message has several
    lines."""
    message = checked(tmp_path, overlay, base, root)
    assert message, f"the config was accepted: {overlay!r}"
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_the_tiny_and_learning_configs_pass(tmp_path):
    assert checked(tmp_path, "") == ""
    assert checked(tmp_path, "", LEARNING) == ""


def test_an_ablation_without_seeds_or_modes_is_an_error(tmp_path):
    assert "ablation needs both modes and seeds" in refused(tmp_path, "ablation: {modes: [grpo], seeds: []}\n",
                                                            LEARNING)


def test_rl_stages_must_be_enabled_in_order_and_evaluated_models_trained(tmp_path):
    assert "rl.stages must enable stage1, stage1-2 or stage1-3" in refused(tmp_path, "rl: {stages: {stage2: null}}\n")
    # evaluate.models still names rl_stage3
    assert "evaluate.models names 'rl_stage3'" in refused(tmp_path, "rl: {stages: {stage3: null}}\n")


def test_a_bad_heldout_benchmark_fails_before_any_job_runs(tmp_path):
    bad = tmp_path / "heldout.jsonl"
    bad.write_text('{"id": "h1", "problem": "1 + 1", "answer": "2"}\n{"id": "h2", "problem": "2 + 2"}\n')
    out = refused(tmp_path, f"benchmarks: {{arith_heldout: {{path: {bad}, answer_type: integer}}}}\n", LEARNING)
    assert "rl.heldout.benchmark 'arith_heldout' cannot be loaded" in out
    assert str(bad) in out and "row 1: missing field 'answer'" in out
    # the training problems as the held-out set (no decontamination configured)
    out = refused(tmp_path, "benchmarks: {arith_heldout: {path: data/learning/train.jsonl, answer_type: integer}}\n",
                  LEARNING)
    assert "2000 problem(s) of rl.heldout.benchmark 'arith_heldout' are also in rl_data source 'arith_train'" in out


def test_an_evaluated_benchmark_with_a_wrong_field_mapping_fails_before_any_job_runs(tmp_path):
    out = refused(tmp_path, "benchmarks: {mine: {path: data/eval/aime24/test.jsonl, fields: {problem: statement, "
                            "answer: answer}, answer_type: integer}}\nevaluate: {benchmarks: [mine]}\n")
    assert "config: benchmarks.mine cannot be loaded" in out and "statement" in out


def test_an_rl_data_source_with_a_wrong_field_mapping_fails_before_any_job_runs_and_a_good_one_is_cached(tmp_path):
    out = refused(tmp_path, "rl_data: {sources: [{name: mine, path: data/learning/train.jsonl, fields: {problem: "
                            "question, answer: answer}}]}\n")
    assert "config: rl_data.sources[0] (mine) cannot be loaded" in out
    assert "'question'" in out and "data/learning/train.jsonl" in out
    stamps = tmp_path / "checks"   # the learning config's one source: the good check, remembered
    assert checked(tmp_path, "", LEARNING, cache=stamps) == ""
    assert len(list(stamps.glob("rl-sources-*.ok"))) == 1
    # the same config again: its stamp is found, not written again
    assert checked(tmp_path, "", LEARNING, cache=stamps) == "" and len(list(stamps.glob("rl-sources-*.ok"))) == 1


@pytest.mark.parametrize("spec, says", [
    ("{name: glaive, path: data/sft/glaive_toolcall_en_demo.json, format: sharegpt, limit: 2, "
     "fields: {conversations: convs}}", "missing field 'convs'"),
    ("{name: alpaca, path: data/sft/alpaca_en_demo.json, format: sharegpt, limit: 2}",
     "missing field 'conversations'")])
def test_an_sft_source_with_a_wrong_field_mapping_or_format_fails_before_any_job_runs(tmp_path, spec, says):
    out = refused(tmp_path, f"sft_data: {{sources: [{spec}]}}\n")
    name = spec.split(",")[0].split()[-1]
    assert f"config: sft_data.sources[0] ({name}) cannot be loaded" in out and says in out


def test_a_heldout_benchmark_graded_unlike_the_reward_warns_and_ids_may_be_row_indices(tmp_path, capsys):
    # a user's own held-out set: no answer_type (math), fields.id null
    own = ("benchmarks: {my_ho: {path: data/learning/heldout.jsonl, fields: {problem: problem, answer: answer, "
           "id: null}}}\nrl: {heldout: {benchmark: my_ho}}\n")
    assert checked(tmp_path, own, LEARNING) == ""
    assert ("rl.heldout.benchmark 'my_ho' is graded with answer_type 'math', the answer reward of the RL stages "
            "with 'integer'") in capsys.readouterr().err
    assert checked(tmp_path, "", LEARNING) == ""
    assert "is graded with answer_type" not in capsys.readouterr().err


OWN_HELDOUT = ("benchmarks: {my_ho: {path: data/learning/heldout.jsonl, fields: {problem: problem, answer: answer, "
               "id: id}}}\nrl: {heldout: {benchmark: my_ho}}\n")   # no answer_type: graded as math


def test_no_answer_type_warning_stands_before_a_refused_rl_source(tmp_path, capsys):
    """A source of non-integer golds left at the integer default is refused for what the filter drops; the fix is
    answer_type math on the source, so no warning may tell the user to change the benchmark first."""
    nonint = ("rl_data: {sources: [{name: mine, path: data/rl/math_nonint/math_nonint.jsonl, "
              "fields: {problem: problem, answer: answer, id: id}}]}\n")
    out = refused(tmp_path, OWN_HELDOUT + nonint, LEARNING)
    assert "config: rl_data.sources[0] (mine)" in out and "integer" in out
    assert "is graded with answer_type" not in capsys.readouterr().err
    # the same source with answer_type math passes, and the held-out set (math) is graded like its reward: no warning
    assert checked(tmp_path, OWN_HELDOUT + nonint.replace("id: id}", "id: id}, answer_type: math"), LEARNING) == ""
    assert "is graded with answer_type" not in capsys.readouterr().err


def test_the_answer_type_warning_needs_the_answer_reward_and_counts_only_trained_sources(tmp_path, capsys):
    # tiny.yaml's smoke reward (any reward but 'answer') grades no answer type: no claim about one
    assert checked(tmp_path, OWN_HELDOUT) == ""
    assert "is graded with answer_type" not in capsys.readouterr().err
    # with the answer reward, the integer sources the stages train on are named
    answer = OWN_HELDOUT.replace("rl: {", "rl: {reward: answer, ")
    assert checked(tmp_path, answer) == ""
    assert "rl.heldout.benchmark 'my_ho' is graded with answer_type 'math', the answer reward of the RL stages " \
        "with 'integer'" in capsys.readouterr().err
    # an integer source curated but trained by no stage (stages: []) is not what RL trains for
    both = ("rl_data: {sources: [{name: ints, path: data/learning/train.jsonl, fields: {problem: problem, answer: "
            "answer, id: id}, stages: []}, {name: frac, path: data/rl/math_nonint/math_nonint.jsonl, fields: "
            "{problem: problem, answer: answer, id: id}, answer_type: math}]}\n")
    assert checked(tmp_path, answer + both, LEARNING) == ""
    assert "is graded with answer_type" not in capsys.readouterr().err


def test_two_rl_data_sources_of_one_name_fail_before_any_job_runs(tmp_path):
    src = "{name: mine, path: data/learning/train.jsonl, fields: {problem: problem, answer: answer}}"
    assert "config: rl_data.sources names ['mine'] more than once" in refused(
        tmp_path, f"rl_data: {{sources: [{src}, {src}]}}\n")


def test_hard_problem_mining_that_could_keep_nothing_fails_before_any_job_runs(tmp_path):
    assert "config: hard_problems.min_passes (2) must be below hard_problems.k (2)" in refused(
        tmp_path, "hard_problems: {k: 2, min_passes: 2}\n")


def test_a_local_model_whose_folder_does_not_exist_fails_before_any_job_runs(tmp_path):
    out = refused(tmp_path, f"model: {{source: local, path: {tmp_path / 'no_model'}}}\n")
    assert f"config: model.source is local, but model.path '{tmp_path / 'no_model'}' is not a folder" in out
    assert "config: model.source is hub, but model.hub_id is not set" in refused(tmp_path, "model: {source: hub}\n")


def test_an_rl_source_whose_answer_marker_matches_no_row_fails_before_any_job_runs(tmp_path):
    out = refused(tmp_path, "rl_data: {sources: [{name: mine, path: data/learning/train.jsonl, fields: {problem: "
                            "problem, answer: answer}, answer_after: '####'}]}\n")
    assert "config: rl_data.sources[0] (mine): none of its 2000 rows has a gold answer in field 'answer' " \
        "(answer_after '####' occurs in none of them)" in out


def test_a_schema_refusal_names_the_key_and_the_file(tmp_path):
    assert refused(tmp_path, "hard_problems: {k: 0}\n").startswith(
        "config: hard_problems.k: 0 is less than the minimum of 1")
    out = refused(tmp_path, "rll: {steps: 3}\n")
    assert out.startswith("config: (top level): Additional properties are not allowed ('rll' was unexpected) "
                          f"(set in {tmp_path / 'overlay.yaml'})"), out


def test_the_own_data_example_with_a_wrong_column_fails_before_any_job_runs(tmp_path):
    """docs/own-data.md's example (tests/test_workflow.py runs it) with its answer column misnamed."""
    example = (REPO_ROOT / "configs/custom_data.example.yaml").read_text()
    assert "answer: final" in example
    out = refused(tmp_path, example.replace("answer: final", "answer: gold"))
    assert "config: rl_data.sources[0] (my_problems) cannot be loaded" in out
    assert "dataset 'my_problems'" in out and "missing field 'gold'" in out and "row 0" in out


def test_the_own_benchmark_example_of_the_docs_passes_the_checks(tmp_path):
    """docs/own-data.md's benchmark entry (path, fields, answer_type, evaluate.benchmarks and evaluate.limit per
    benchmark, report.lead_benchmark) is a config the workflow accepts, over tiny.yaml as over config.yaml."""
    page = (REPO_ROOT / "docs/own-data.md").read_text()
    section = page[page.index("## Your own benchmark"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    block = block[:block.index("```")]
    parsed = yaml.safe_load(block)
    assert parsed["report"]["lead_benchmark"] == "my_bench" and "my_bench" in parsed["evaluate"]["limit"]
    assert checked(tmp_path, block) == ""
    assert checked(tmp_path, block, LEARNING) == ""
    # and its file loads as that benchmark: every row, graded as math
    from rstar2.data.benchmarks import load_benchmark

    with contextlib.chdir(REPO_ROOT):
        rows = load_benchmark("my_bench", parsed["benchmarks"]["my_bench"])
    assert rows and {r["answer_type"] for r in rows} == {"math"}
