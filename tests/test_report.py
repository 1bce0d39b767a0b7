"""Tests for rstar2.stages.report with fake inputs in the fixed schemas."""

import json
import os

import pytest

from rstar2.stages import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("training_curves.png", "funnel.png", "eval.png")


def _metrics_row(step, reward, **kw):
    row = {"step": step, "reward_mean": reward, "accuracy": reward, "response_length_mean": 1000 + 10 * step,
           "response_length_max": 8192, "tool_calls_per_traj": 2.5, "tool_error_ratio": 0.1,
           "tool_error_ratio_pos": 0.05, "truncation_ratio": 0.02, "all_correct_frac": 0.3,
           "all_wrong_frac": 0.2, "kept_pos": 8, "kept_neg": 8, "loss": 0.01, "step_time_s": 60.0}
    row.update(kw)
    return row


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture
def fake_inputs(tmp_path):
    rl = tmp_path / "rl"
    _write_jsonl(rl / "stage1" / "metrics.jsonl", [_metrics_row(s, 0.25 + 0.01 * s) for s in range(1, 11)])
    # stage 2: keys missing and a null value; a half-written last line
    s2 = [_metrics_row(s, 0.5) for s in range(1, 5)]
    del s2[1]["tool_error_ratio_pos"]
    s2[2]["truncation_ratio"] = None
    _write_jsonl(rl / "stage2" / "metrics.jsonl", s2)
    with open(rl / "stage2" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "reward_me')
    (rl / "stage3").mkdir(parents=True)
    (rl / "stage3" / "metrics.jsonl").write_text("")          # a stage with 0 rows

    ev = tmp_path / "eval"
    _write_json(ev / "sft" / "summary.json", {"model": "sft", "benchmarks": {
        "aime24": {"n_problems": 30, "k": 4, "avg_at_k": 0.1234, "avg_at_k_ci": [0.0567, 0.2011],
                   "pass_at_k": 0.3, "mean_response_tokens": 4321.0, "mean_tool_calls": 1.5},
        "math500": {"n_problems": 500, "k": 4, "avg_at_k": 0.456, "avg_at_k_ci": [0.421, 0.49],
                    "pass_at_k": 0.61, "mean_response_tokens": 2100.0, "mean_tool_calls": 0.8}}})
    _write_json(ev / "rl_stage3" / "summary.json", {"model": "rl_stage3", "benchmarks": {
        "aime24": {"n_problems": 30, "k": 4, "avg_at_k": 0.3333, "avg_at_k_ci": [0.2, 0.4667],
                   "pass_at_k": 0.5, "mean_response_tokens": 5000.0, "mean_tool_calls": 2.0},
        "aime25": {"n_problems": 30, "k": 4, "avg_at_k": 0.25, "avg_at_k_ci": [0.15, 0.35],
                   "pass_at_k": 0.4, "mean_response_tokens": 5500.0, "mean_tool_calls": 2.2}}})

    data = tmp_path / "rl_data"
    _write_json(data / "funnel.json", {
        "steps": ["loaded", "integer_answer", "deduplicated", "decontaminated"],
        "per_source": {"dapo": {"loaded": 17917, "integer_answer": 17000, "deduplicated": 16500,
                                "decontaminated": 16480},
                       "openr1": {"loaded": 9000, "integer_answer": 5000, "deduplicated": 4900,
                                  "decontaminated": 4890}},
        "drops": {"non_integer_answer": 4917, "duplicate": 600, "contaminated": 30},
        "decontamination": {"aime24": 21, "math500": 9}})
    inputs = {"rl_stages": {"stage1": str(rl / "stage1"), "stage2": str(rl / "stage2"),
                            "stage3": str(rl / "stage3")},
              "eval": {"sft": str(ev / "sft"), "rl_stage3": str(ev / "rl_stage3")},
              "rl_data": str(data)}
    return inputs


def _check_outputs(out):
    for name in ("summary.md",) + FIGURES + ("manifest.json",):
        assert (out / name).is_file(), name
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "report"
    # the manifest is written last
    assert all((out / "manifest.json").stat().st_mtime_ns >= (out / n).stat().st_mtime_ns
               for n in ("summary.md",) + FIGURES)
    return (out / "summary.md").read_text(), manifest


def test_report_full(tmp_path, fake_inputs):
    out = tmp_path / "report"
    report.run({"dpi": 60}, fake_inputs, str(out))
    md, manifest = _check_outputs(out)

    # evaluation table: avg@k in percent with CI, for both models
    assert "| model | aime24 | math500 | aime25 |" in md
    assert "12.3 [5.7, 20.1]" in md
    assert "45.6 [42.1, 49.0]" in md
    assert "33.3 [20.0, 46.7]" in md
    assert "25.0 [15.0, 35.0]" in md
    # paper Table 3 reference beside it
    assert "80.6" in md and "97.8" in md and "69.8" in md
    ref_row = next(line for line in md.splitlines() if line.startswith("| rStar2-Agent-14B (paper"))
    assert ref_row == "| rStar2-Agent-14B (paper Table 3, avg@16) | 80.6 | 97.8 | 69.8 |"
    # details table
    assert "| sft | math500 | 500 | 4 | 45.6 | [42.1, 49.0] | 61.0 | 2100.0 | 0.80 | 97.8 |" in md

    # funnel
    assert "| step | dapo | openr1 | total |" in md
    assert "| loaded | 17,917 | 9,000 | 26,917 |" in md
    assert "| decontaminated | 16,480 | 4,890 | 21,370 |" in md
    assert "| non_integer_answer | 4,917 |" in md
    assert "| aime24 | 21 |" in md

    # training summary: steps, first/last reward, wall time
    assert "| stage1 | 10 | 0.260 | 0.350 |" in md
    assert "10.0 min" in md                      # 10 steps x 60 s
    assert "| stage2 | 4 | 0.500 | 0.500 |" in md  # the half-written 5th line is skipped ...
    assert "line 5 is not valid JSON" in md        # ... with a note
    assert "| stage3 | 0 | no data |" in md

    assert manifest["counts"]["rl_steps"] == {"stage1": 10, "stage2": 4, "stage3": 0}
    assert manifest["counts"]["models"] == 2
    assert len(manifest["inputs"]) == 6


def test_report_with_no_inputs(tmp_path):
    out = tmp_path / "report"
    report.run({}, {}, str(out))
    md, manifest = _check_outputs(out)
    assert "Evaluation: no data." in md
    assert "Data funnel: no data." in md
    assert "RL training: no data." in md
    assert "97.8" in md                         # the paper reference is always shown
    assert manifest["inputs"] == []


def test_report_with_missing_files(tmp_path):
    """Directories that exist but lack their files, and an eval summary with no benchmarks."""
    (tmp_path / "s1").mkdir()
    _write_json(tmp_path / "ev" / "summary.json", {"model": "m", "benchmarks": {}})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "funnel.json").write_text("{not json")
    inputs = {"rl_stages": {"stage1": str(tmp_path / "s1")}, "eval": {"m": str(tmp_path / "ev"),
                                                                     "gone": str(tmp_path / "nope")},
              "rl_data": str(tmp_path / "data")}
    out = tmp_path / "report"
    report.run({}, inputs, str(out))
    md, _ = _check_outputs(out)
    assert "Evaluation: no data." in md
    assert "Data funnel: no data." in md
    assert "| stage1 | 0 | no data |" in md
    assert "unreadable" in md


def test_report_partial_stages_and_percent_values(tmp_path):
    """Only stage 2 present; an eval summary that already reports percentages."""
    _write_jsonl(tmp_path / "s2" / "metrics.jsonl", [{"step": 1, "reward_mean": 0.4}, {"step": 2}])
    _write_json(tmp_path / "ev" / "summary.json", {"model": "m", "benchmarks": {
        "MATH-500": {"n_problems": 10, "k": 1, "avg_at_k": 70.0, "avg_at_k_ci": [60.0, 80.0]}}})
    out = tmp_path / "report"
    report.run({}, {"rl_stages": {"stage2": str(tmp_path / "s2")}, "eval": {"m": str(tmp_path / "ev")}},
               str(out))
    md, _ = _check_outputs(out)
    assert "| m | 70.0 [60.0, 80.0] |" in md
    assert "| rStar2-Agent-14B (paper Table 3, avg@16) | 97.8 |" in md
    assert "| stage2 | 2 | 0.400 | 0.400 |" in md


def test_cumulative_x():
    stages = {"stage1": [{"step": 1}, {"step": 2}, {"step": 3}], "stage2": [{"step": 1}, {}],
              "stage3": []}
    xs, spans = report._cumulative_x(stages)
    assert xs == {"stage1": [1, 2, 3], "stage2": [4, 5], "stage3": []}
    assert spans == [("stage1", 0, 3), ("stage2", 3, 5), ("stage3", 5, 5)]


def test_report_warns_when_a_stage_had_no_learning_signal(tmp_path):
    import json

    from rstar2.stages import report

    for name, wrong in (("flat", 1.0), ("mixed", 0.5)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": i, "reward_mean": 0.0, "all_correct_frac": 0.0, "all_wrong_frac": wrong} for i in (1, 2)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    report.run({}, {"rl_stages": {"flat": str(tmp_path / "flat"), "mixed": str(tmp_path / "mixed")}, "eval": {},
                    "rl_data": str(tmp_path / "none")}, str(out))
    warnings = [line for line in (out / "summary.md").read_text().splitlines() if "no learning signal" in line]
    assert len(warnings) == 1 and "(flat)" in warnings[0] and "2 steps all wrong" in warnings[0]
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
