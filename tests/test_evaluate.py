"""The evaluate stage with a scripted policy in place of the model: grading by declared answer type, the
summary metrics, and resumption that recomputes nothing."""

import json

import pytest
from conftest import stage_params

from rstar2 import metrics, models, rollout
from rstar2.rollout import Trajectory
from rstar2.stages import evaluate

# what the scripted policy answers per problem id: a list cycled over the samples; "CUT" = truncated response
SCRIPT = {"ints-1": ["\\boxed{025}", "\\boxed{7}", "\\boxed{25}"],       # 2 of 3 right
          "ints-2": ["\\boxed{3}", "\\boxed{4}", "\\boxed{4}"],          # none right, majority 4
          "ints-3": ["\\boxed{9}", "CUT", "\\boxed{9}"],                 # 2 of 3, one truncated
          "mc-q1": ["\\boxed{A}", "\\boxed{B}", "\\boxed{C}"]}


@pytest.fixture
def bench_files(tmp_path):
    ints = tmp_path / "ints.jsonl"
    ints.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": 1, "problem": "p1", "answer": "25"}, {"id": 2, "problem": "p2", "answer": "5"},
        {"id": 3, "problem": "p3", "answer": "9"}]))
    mc = tmp_path / "mc.csv"
    mc.write_text("id,q,right,w1\nq1,Which?,yes,no\n")
    return {"ints": {"path": str(ints), "fields": {"problem": "problem", "answer": "answer", "id": "id"},
                     "answer_type": "integer", "paper": "AIME24"},
            "mc": {"path": str(mc), "fields": {"problem": "q", "answer": "right", "id": "id"},
                   "choices": ["w1"], "answer_type": "choice"}}


@pytest.fixture
def scripted(monkeypatch):
    calls = []

    def fake_run_rollouts(model, tok, problems, cfg, progress=None, seed=None):
        calls.append(problems)
        out, seen = [], {}
        for p in problems:
            i = seen[p["id"]] = seen.get(p["id"], -1) + 1
            text = SCRIPT[p["id"]][i % 3]
            t = Trajectory(problem_id=p["id"], question=p["problem"], gold=p.get("answer"), prompt_ids=[1],
                           response_ids=[5] * (10 + i), response_mask=[1] * (10 + i),
                           turns=[{"text": "<tool_call>{}</tool_call>", "tool_calls": [{"code": "print(1)",
                                   "status": "ok", "output": "\\boxed{25}"}]},
                                  {"text": text.replace("CUT", "so \\boxed{"), "tool_calls": []}],
                           finish_reason="budget" if text == "CUT" else "answer")
            out.append(t)
        return out

    monkeypatch.setattr(models, "load", lambda d: (object(), object()))
    monkeypatch.setattr(rollout, "run_rollouts", fake_run_rollouts)
    return calls


def _params(benchmarks, seed=0, limit=0):
    return stage_params("evaluate", overrides={
        "seed": seed, "benchmarks": benchmarks,
        "evaluate": {"benchmarks": list(benchmarks), "limit": limit, "k": 3, "max_response_tokens": 64, "max_turns": 2,
                     "temperature": 0.6, "top_p": 0.95, "batch_size": 6}})


def test_evaluate_grades_summarises_and_resumes(tmp_path, bench_files, scripted):
    out = tmp_path / "eval" / "m"
    params = _params(bench_files)
    evaluate.run(params, "m", "unused", str(out))
    # the gold never goes into the rollout
    assert all("answer" not in p for batch in scripted for p in batch)
    assert sum(len(b) for b in scripted) == 4 * 3
    rows = {r["id"]: r for line in (out / "ints" / "per_problem.jsonl").read_text().splitlines()
            for r in [json.loads(line)]}
    assert rows["ints-1"]["rewards"] == [1.0, 0.0, 1.0]       # "025" is 25; tool output's \boxed{25} never counts
    assert rows["ints-2"]["rewards"] == [0.0, 0.0, 0.0]
    assert rows["ints-3"]["rewards"] == [1.0, 0.0, 1.0] and rows["ints-3"]["truncated"] == [False, True, False]
    assert rows["ints-3"]["preds"] == ["9", None, "9"]
    assert rows["ints-1"]["sample"]["gold"] == "25" and rows["ints-1"]["answer_type"] == "integer"

    summary = json.loads((out / "summary.json").read_text())["benchmarks"]
    ints = summary["ints"]
    assert ints["n_problems"] == 3 and ints["k"] == 3 and ints["answer_type"] == "integer"
    assert ints["paper"] == "AIME24"
    assert ints["avg_at_k"] == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)
    assert ints["pass_at_k"] == pytest.approx(2 / 3)
    assert ints["maj_at_k"] == pytest.approx(2 / 3)                 # "25"/"025" vote together; 4 beats 3
    assert ints["mean_response_tokens"] == pytest.approx(11.0)
    assert ints["mean_tool_calls"] == pytest.approx(1.0)
    assert ints["truncation_ratio"] == pytest.approx(1 / 9)
    lo, hi = ints["avg_at_k_ci"]
    assert 0.0 <= lo <= ints["avg_at_k"] <= hi <= 2 / 3
    mc = summary["mc"]
    mc_row = json.loads((out / "mc" / "per_problem.jsonl").read_text())
    gold = mc_row["answer"]
    assert mc_row["answer_type"] == "choice" and gold in "AB"
    assert mc_row["rewards"] == [float(x == gold) for x in "ABC"] and mc["avg_at_k"] == pytest.approx(1 / 3)

    # a finished evaluation run again recomputes nothing and gives the same summary
    scripted.clear()
    evaluate.run(params, "m", "unused", str(out))
    assert scripted == []
    assert json.loads((out / "summary.json").read_text())["benchmarks"] == summary

    # killed after some problems: only the missing ones are rolled out
    path = out / "ints" / "per_problem.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    evaluate.run(params, "m", "unused", str(out))
    assert [p["id"] for b in scripted for p in b] == ["ints-3"] * 3
    assert json.loads((out / "summary.json").read_text())["benchmarks"] == summary

    # other params: earlier results are stale and everything is redone
    scripted.clear()
    evaluate.run(_params(bench_files, seed=1), "m", "unused", str(out))
    assert sum(len(b) for b in scripted) == 4 * 3


def test_bad_gold_stops_before_any_rollout(tmp_path, bench_files, scripted):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 1, "problem": "p", "answer": "see figure"}) + "\n")
    spec = {"path": str(bad), "fields": {"problem": "problem", "answer": "answer", "id": "id"}, "answer_type": "math"}
    with pytest.raises(ValueError, match=r"'bad'.*bad-1.*see figure"):
        evaluate.run(_params({"bad": spec}), "m", "unused", str(tmp_path / "out"))
    assert scripted == []


def test_summarise_with_no_rows_is_all_none():
    s = metrics.summarise([], 16)
    assert s["n_problems"] == 0 and s["avg_at_k"] is None and s["maj_at_k"] is None


# IFEval and BFCL through the stage: scripted responses, the checkers' verdicts, greedy one-sample one-turn
# sampling, the per-category limit and resumption.
CHECKED_SCRIPT = {
    "1": "<answer>no commas here</answer>", "2": "<answer>a, b</answer>",
    "simple_python_0": "</reason><tool_call>{\"name\": \"calculate_triangle_area\", \"arguments\": "
                       "{\"base\": 10, \"height\": 5}}</tool_call>",
    "simple_python_1": "I cannot call anything.",
    "irrelevance_0": "No function fits.",
    "irrelevance_1": "</reason><tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>",
}


@pytest.fixture
def checked_benchmarks(tmp_path):
    f = tmp_path / "ifeval.jsonl"
    f.write_text("".join(json.dumps({"key": k, "prompt": f"Answer without commas ({k}).",
                                     "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}) + "\n"
                         for k in (1, 2, 3)))
    return {"ifeval": {"path": str(f), "answer_type": "ifeval", "paper": "IFEval"},
            "bfcl": {"path": "data/eval/bfcl", "answer_type": "bfcl", "paper": "BFCL v3",
                     "categories": ["simple_python", "irrelevance"]}}


def test_ifeval_and_bfcl_are_checked_by_their_checkers_and_resume(tmp_path, checked_benchmarks, monkeypatch):
    calls = []

    def fake_run_rollouts(model, tok, problems, cfg, progress=None, seed=None):
        assert cfg.temperature == 0.0 and cfg.max_turns == 1       # the paper's protocol for these: greedy
        calls.append([p["id"] for p in problems])
        out = []
        for p in problems:
            assert p["prompt"].endswith("<|im_start|>assistant\n<reason>") and "answer" not in p
            out.append(Trajectory(problem_id=p["id"], question=p["problem"], gold=None, prompt_ids=[1],
                                  response_ids=[5] * 7, response_mask=[1] * 7, finish_reason="answer",
                                  turns=[{"text": CHECKED_SCRIPT[p["id"]], "tool_calls": []}]))
        return out

    monkeypatch.setattr(models, "load", lambda d: (object(), object()))
    monkeypatch.setattr(rollout, "run_rollouts", fake_run_rollouts)
    out = tmp_path / "eval" / "m"
    params = _params(checked_benchmarks, limit=2)
    evaluate.run(params, "m", "unused", str(out))
    assert sorted(i for c in calls for i in c) == sorted(CHECKED_SCRIPT)   # limit 2: per BFCL category, k = 1
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]
    ife = summary["ifeval"]
    assert ife["n_problems"] == 2 and ife["k"] == 1 and ife["answer_type"] == "ifeval" and ife["paper"] == "IFEval"
    assert ife["ifeval"]["prompt_level_strict_acc"] == 0.5 and ife["avg_at_k"] == 0.5
    assert ife["ifeval"]["inst_level_loose_acc"] == 0.5 and ife["checker_errors"] == 0
    b = summary["bfcl"]["bfcl"]
    assert b["by_category"] == {"simple_python": {"n": 2, "accuracy": 0.5}, "irrelevance": {"n": 2, "accuracy": 0.5}}
    assert summary["bfcl"]["avg_at_k"] == 0.5
    rows = {r["id"]: r for line in (out / "bfcl" / "per_problem.jsonl").read_text().splitlines()
            for r in [json.loads(line)]}
    assert rows["simple_python_0"]["rewards"] == [1.0] and rows["simple_python_0"]["group"] == "simple_python"
    assert rows["simple_python_0"]["checks"][0]["decoded"] == [{"calculate_triangle_area": {"base": 10, "height": 5}}]
    assert rows["irrelevance_1"]["checks"][0]["error_type"] == "irrelevance_error:decoder_success"

    calls.clear()
    evaluate.run(params, "m", "unused", str(out))                          # finished: nothing recomputed
    assert calls == [] and json.loads((out / "summary.json").read_text())["benchmarks"] == summary


def test_unknown_ifeval_instruction_stops_before_any_rollout(tmp_path, scripted):
    f = tmp_path / "ifeval.jsonl"
    f.write_text(json.dumps({"key": 7, "prompt": "p", "instruction_id_list": ["made:up"], "kwargs": [{}]}) + "\n")
    with pytest.raises(ValueError, match=r"'ife'.*problem 7.*made:up"):
        evaluate.run(_params({"ife": {"path": str(f), "answer_type": "ifeval"}}), "m", "unused", str(tmp_path / "o"))
    assert scripted == []


def test_paper_config_evaluates_the_generalisation_suite_by_hub_id():
    """configs/paper-qwen3-14b.yaml: HMMT25 and GPQA-Diamond by hub id (network / gated), IFEval and BFCL bundled,
    beside the math benchmarks, each graded by its answer type; valid against the schema over config.yaml."""
    import yaml
    from snakemake.utils import validate

    with open("config.yaml") as f:
        config = yaml.safe_load(f)
    with open("configs/paper-qwen3-14b.yaml") as f:
        paper = yaml.safe_load(f)
    config["benchmarks"].update(paper["benchmarks"])
    config["evaluate"].update(paper["evaluate"])
    validate(config, "workflow/schemas/config.schema.yaml")
    names = config["evaluate"]["benchmarks"]
    assert set(names) >= {"aime24", "aime25", "math500", "hmmt25", "gpqa_diamond", "ifeval", "bfcl"}
    kinds = {b: config["benchmarks"][b]["answer_type"] for b in names}
    assert kinds["hmmt25"] == "math" and kinds["gpqa_diamond"] == "choice"
    assert kinds["ifeval"] == "ifeval" and kinds["bfcl"] == "bfcl"
    assert config["benchmarks"]["hmmt25"]["path"] == "hub:MathArena/hmmt_feb_2025"
    assert config["benchmarks"]["gpqa_diamond"]["path"] == "hub:Idavidrein/gpqa"
    assert config["benchmarks"]["gpqa_diamond"]["config"] == "gpqa_diamond"
    assert {config["benchmarks"][b].get("paper") for b in names} >= {"HMMT Feb25", "GPQA-Diamond", "IFEval", "BFCL v3"}


def test_a_per_benchmark_limit_overrides_the_global_one(tmp_path, bench_files, scripted):
    params = stage_params("evaluate", overrides={
        "benchmarks": bench_files, "evaluate": {"benchmarks": list(bench_files), "limit": {"default": 0, "ints": 1},
                                                "k": 3, "max_response_tokens": 64, "max_turns": 2, "batch_size": 6}})
    evaluate.run(params, "m", "unused", str(tmp_path / "out"))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["benchmarks"]
    assert summary["ints"]["n_problems"] == 1 and summary["mc"]["n_problems"] == 1   # mc has one problem anyway
    from rstar2.workflow_checks import check_config
    from conftest import workflow_config

    models = {m: "" for m in ("base", "sft", "rl_stage1", "rl_stage2", "rl_stage3")}
    bad = workflow_config({"evaluate": {"limit": {"default": 1, "gsm8k_tset": 10}}})
    with pytest.raises(ValueError, match="evaluate.limit names benchmark 'gsm8k_tset'"):
        check_config(bad, ["stage1", "stage2", "stage3"], models)
    typo = workflow_config({"report": {"lead_benchmark": "arith_heldot"}})
    with pytest.raises(ValueError, match="report.lead_benchmark names benchmark 'arith_heldot', which is not "
                                         "defined under 'benchmarks'"):
        check_config(typo, ["stage1", "stage2", "stage3"], models)


def test_an_integer_limit_in_a_configfile_replaces_the_default_runs_per_benchmark_limits():
    """config.yaml evaluates a few IFEval prompts; a --configfile with ``limit: 0`` (the paper's) must evaluate all."""
    from conftest import workflow_config

    assert workflow_config({}, files=())["evaluate"]["limit"]["ifeval"] > 0   # a per-benchmark mapping by default
    params = stage_params("evaluate", overrides={"evaluate": {"limit": 0}}, files=())
    assert params["limit"] == 0 and params["limits"] == {}
    paper = stage_params("evaluate", files=["configs/paper-qwen3-14b.yaml"])
    assert paper["limits"] == {} and paper["limit"] == 0
