"""Tests for rstar2.stages.report with fake inputs in the fixed schemas."""

import json
import os

import pytest

from conftest import stage_params
from rstar2.report import plots
from rstar2.stages import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("training_curves.png", "funnel.png", "eval.png", "learning_curve.png", "ablation.png")
PAGES = ("summary.md", "summary.html", "trajectories.md", "trajectories.html")


def _rp(**report):
    """The report stage's params as the workflow builds them, with ``report`` settings changed."""
    return stage_params("report", overrides={"report": report} if report else None)


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
    for name in PAGES + FIGURES + ("manifest.json",):
        assert (out / name).is_file(), name
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "report"
    # the manifest is written last
    assert all((out / "manifest.json").stat().st_mtime_ns >= (out / n).stat().st_mtime_ns
               for n in PAGES + FIGURES)
    return (out / "summary.md").read_text(), manifest


def _sample(pid, reward, code="print(6*7)", text_extra=""):
    return {"problem_id": pid, "question": "What is 6*7?", "gold": "42", "finish_reason": "answer",
            "pred": "42" if reward else "41", "reward": reward, "truncated": False, "num_turns": 2,
            "response_tokens": 120,
            "turns": [{"text": "I will compute." + text_extra + "<tool_call>{\"name\": \"x\"}</tool_call>",
                       "tool_calls": [{"code": code, "status": "ok", "output": "42\n"}]},
                      {"text": "<answer>\\boxed{42}</answer>", "tool_calls": []}]}


def test_report_full(tmp_path, fake_inputs):
    ev = tmp_path / "eval"
    _write_jsonl(ev / "sft" / "aime24" / "per_problem.jsonl", [
        {"id": "aime24-60", "rewards": [1.0], "sample": _sample("aime24-60", 1.0, code="print('<b>bold</b>')",
                                                                 text_extra="<script>alert(1)</script>")},
        {"id": "aime24-61", "rewards": [0.0], "sample": _sample("aime24-61", 0.0)}])
    _write_jsonl(tmp_path / "rl" / "stage1" / "rollouts.jsonl",
                 [{"step": 1, "kept": True, **_sample("old", 1.0)}]
                 + [{"step": 2, "kept": k, **_sample(f"s2-{i}", float(k))} for i, k in enumerate([False, True])])
    out = tmp_path / "report"
    report.run(_rp(dpi=60), fake_inputs, str(out))
    md, manifest = _check_outputs(out)

    # evaluation table: avg@k in percent with CI for both models, the paper's Table 3 rows beside them
    assert "| model | source | aime24 | math500 | aime25 |" in md
    assert "| sft | this run | 12.3 [5.7, 20.1] | 45.6 [42.1, 49.0] | – |" in md
    assert "| rl_stage3 | this run | 33.3 [20.0, 46.7] | – | 25.0 [15.0, 35.0] |" in md
    assert "| rStar2-Agent-14B | paper Table 3 (avg@16) | 80.6 | 97.8 | 69.8 |" in md
    assert "| Qwen3-14B | paper Table 3 | 79.3 | 96.8 | 70.4 |" in md
    assert "| Kimi k1.5 | paper Table 3 | 77.5 | 96.2 | – |" in md
    assert "| DeepSeek-R1-Zero (671B) | paper Table 3 | 71.0 | 95.9 | 53.3 |" in md
    # details: pass@k, maj@k (absent here), the paper's value and mean length (Table 4) beside ours
    assert "| sft | math500 | – | 500 | 4 | 45.6 | [42.1, 49.0] | 61.0 | – | 2100.0 | 0.80 | – | 97.8 | – |" in md
    assert "| sft | aime24 | – | 30 | 4 | 12.3 | [5.7, 20.1] | 30.0 | – | 4321.0 | 1.50 | – | 80.6 | 9339.7 |" in md
    # the paper's tables only in the columns evaluated; the rest in one line
    assert "| model | reasoning SFT |" not in md and "Generalisation beside paper Table 5" not in md
    assert ("Paper columns this run did not evaluate: HMMT Feb25 (Table 3); GPQA-Diamond, BFCL v3, IFEval, "
            "Arena-Hard (Table 5).") in md

    # funnel
    assert "| step | dapo | openr1 | total |" in md
    assert "| loaded | 17,917 | 9,000 | 26,917 |" in md
    assert "| decontaminated | 16,480 | 4,890 | 21,370 |" in md
    assert "| non_integer_answer | 4,917 |" in md
    assert "| aime24 | 21 |" in md

    # training summary: steps, first/last reward, the quantities of paper Figs. 4, 8, 9, wall time
    assert "| stage1 | – | – | 10 | 0.260 | 0.350 | 0.260 | 0.350 | 1100 | 0.050 | 0.020 | 0.300 | 10.0 min |" in md
    assert "| stage2 | – | – | 4 | 0.500 | 0.500 |" in md  # the half-written 5th line is skipped ...
    assert "line 5 is not valid JSON" in md        # ... with a note
    assert "| stage3 | – | – | 0 | no data |" in md

    # sample trajectories: reasoning, code, output, answer; eval samples and the last RL step only
    traj = (out / "trajectories.md").read_text()
    assert "## Evaluation: sft" in traj and "## RL stage1, step 2" in traj
    assert "sft · aime24 · aime24-60" in traj and "sft · aime24 · aime24-61" in traj
    assert "stage1 · step 2 · s2-0" in traj and "s2-1" in traj and "· old" not in traj
    assert "```python\nprint(6*7)\n```" in traj
    assert "*turn 1, tool call 1: output (ok)*" in traj and "42\n```" in traj
    assert "I will compute.[tool call: code below]" in traj
    assert "Final answer: 42 (gold 42) → reward 1.0" in traj and "kept by RoC" in traj
    html_page = (out / "trajectories.html").read_text()
    assert "<script>alert" not in html_page and "&lt;script&gt;alert(1)&lt;/script&gt;" in html_page
    assert "print(&#x27;&lt;b&gt;bold&lt;/b&gt;&#x27;)" in html_page
    summary_html = (out / "summary.html").read_text()
    assert summary_html.count("data:image/png;base64,") == 4     # figures embedded (the lead's: aime24)
    assert "Lead benchmark aime24: the first benchmark this run evaluated (report.lead_benchmark chooses another: " \
        "aime24, math500, aime25)." in md
    assert "<td>rStar2-Agent-14B</td><td>paper Table 3 (avg@16)</td><td>80.6</td>" in summary_html

    assert manifest["counts"]["rl_steps"] == {"stage1": 10, "stage2": 4, "stage3": 0}
    assert manifest["counts"]["models"] == 2
    assert manifest["counts"]["trajectories"] == 4
    assert len(manifest["inputs"]) == 6


def test_report_draws_the_funnel_and_uses_declared_paper_columns(tmp_path, fake_inputs):
    """The report draws the funnel from funnel.json with the curation stages' own plotter (a stale funnel.png
    beside it is not copied); a benchmark that declares its paper column (hmmt) gets it."""
    funnel_png = tmp_path / "rl_data" / "funnel.png"
    funnel_png.write_bytes(PNG_MAGIC + b"a stale funnel" * 100)
    _write_json(tmp_path / "eval" / "sft" / "summary.json", {"model": "sft", "benchmarks": {
        "hmmt_february": {"n_problems": 30, "k": 4, "avg_at_k": 0.1, "avg_at_k_ci": [0.0, 0.2],
                          "paper": "HMMT Feb25", "answer_type": "math", "maj_at_k": 0.2},
        "gpqa_diamond": {"n_problems": 198, "k": 4, "avg_at_k": 0.3, "avg_at_k_ci": [0.25, 0.35],
                         "answer_type": "choice"}}})
    out = tmp_path / "report"
    report.run(_rp(dpi=60), fake_inputs, str(out))
    drawn = (out / "funnel.png").read_bytes()
    assert drawn.startswith(PNG_MAGIC) and drawn != funnel_png.read_bytes() and len(drawn) > 1000
    md = (out / "summary.md").read_text()
    assert "| model | source | hmmt_february | aime24 | aime25 |" in md
    assert "| rStar2-Agent-14B | paper Table 3 (avg@16) | 52.7 | 80.6 | 69.8 |" in md
    assert "| QWQ-32B | paper Table 3 | 47.5 | 79.5 | 65.8 |" in md
    # GPQA-Diamond is a Table 5 benchmark: shown beside the paper's generalisation numbers, in its column only
    assert "| model | source | GPQA-Diamond |" in md
    assert "| sft | this run | 30.0 [25.0, 35.0] |" in md
    assert "| rStar2-Agent-14B | paper Table 5 | 60.9 |" in md
    assert "| rStar2-Agent-14B after SFT | paper Table 5 | 42.1 |" in md
    assert "| DeepSeek-V3 | paper Table 5 | 59.1 |" in md
    assert "Paper columns this run did not evaluate: MATH-500 (Table 3); BFCL v3, IFEval, Arena-Hard (Table 5)." in md
    assert "| sft | hmmt_february | math | 30 | 4 | 10.0 | [0.0, 20.0] | – | 20.0 |" in md


def test_report_shows_ifeval_and_bfcl_checker_metrics(tmp_path, fake_inputs):
    """IFEval's four accuracies and BFCL's per-category scores, and their headlines in the Table 5 comparison."""
    _write_json(tmp_path / "eval" / "sft" / "summary.json", {"model": "sft", "benchmarks": {
        "ifeval": {"n_problems": 541, "k": 1, "avg_at_k": 0.25, "avg_at_k_ci": [0.2, 0.3], "answer_type": "ifeval",
                   "paper": "IFEval", "ifeval": {"prompt_level_strict_acc": 0.25, "inst_level_strict_acc": 0.4,
                                                 "prompt_level_loose_acc": 0.3, "inst_level_loose_acc": 0.45}},
        "bfcl": {"n_problems": 10, "k": 1, "avg_at_k": 0.5, "avg_at_k_ci": None, "answer_type": "bfcl",
                 "paper": "BFCL v3", "bfcl": {"accuracy": 0.5, "by_category": {
                     "simple_python": {"n": 5, "accuracy": 0.2}, "irrelevance": {"n": 5, "accuracy": 0.8}}}}}})
    out = tmp_path / "report"
    report.run(_rp(dpi=60), fake_inputs, str(out))
    md = (out / "summary.md").read_text()
    assert "| model | source | BFCL v3 | IFEval |" in md and "| sft | this run | 50.0 | 25.0 [20.0, 30.0] |" in md
    assert "| sft | ifeval | 541 | 25.0 | 40.0 | 30.0 | 45.0 |" in md
    assert "| model | benchmark | simple_python | irrelevance | mean |" in md
    assert "| sft | bfcl | 20.0 (n=5) | 80.0 (n=5) | 50.0 |" in md


def test_training_curves_plot_new_metrics_when_present(tmp_path):
    stages = {"stage1": [_metrics_row(1, 0.2, tool_error_ratio_pos_kept=0.01), _metrics_row(2, 0.3)],
              "stage2": [_metrics_row(1, 0.4)]}
    fig = plots.plot_training(stages, tmp_path / "c.png", 50)
    labels = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert "stage1: kept positives (after RoC)" in labels and "stage2: kept positives (after RoC)" not in labels
    assert {"stage1: positive trajectories", "stage2: truncated", "stage2: all correct"} <= labels
    fig = plots.plot_training({"stage1": [_metrics_row(1, 0.2)]}, tmp_path / "d.png", 50)
    labels = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert not any("kept positives" in x for x in labels)


def test_report_with_no_inputs(tmp_path):
    out = tmp_path / "report"
    report.run(_rp(), {}, str(out))
    md, manifest = _check_outputs(out)
    assert "Evaluation: no data." in md
    assert "Data funnel: no data." in md
    assert "RL training: no data." in md
    assert "Paper columns this run did not evaluate: MATH-500, AIME24, AIME25, HMMT Feb25 (Table 3)" in md
    assert "No learning result: this run evaluated no model on any benchmark" in md
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
    report.run(_rp(), inputs, str(out))
    md, _ = _check_outputs(out)
    assert "Evaluation: no data." in md
    assert "Data funnel: no data." in md
    assert "| stage1 | – | – | 0 | no data |" in md
    assert "unreadable" in md


def test_report_partial_stages_and_percent_values(tmp_path):
    """Only stage 2 present; an eval summary that already reports percentages."""
    _write_jsonl(tmp_path / "s2" / "metrics.jsonl", [{"step": 1, "reward_mean": 0.4}, {"step": 2}])
    _write_json(tmp_path / "ev" / "summary.json", {"model": "m", "benchmarks": {
        "MATH-500": {"n_problems": 10, "k": 1, "avg_at_k": 70.0, "avg_at_k_ci": [60.0, 80.0]}}})
    out = tmp_path / "report"
    report.run(_rp(), {"rl_stages": {"stage2": str(tmp_path / "s2")}, "eval": {"m": str(tmp_path / "ev")}},
               str(out))
    md, _ = _check_outputs(out)
    assert "| m | this run | 70.0 [60.0, 80.0] |" in md
    assert "| rStar2-Agent-14B | paper Table 3 (avg@16) | 97.8 |" in md
    assert "| stage2 | – | – | 2 | 0.400 | 0.400 |" in md


def test_cumulative_x():
    stages = {"stage1": [{"step": 1}, {"step": 2}, {"step": 3}], "stage2": [{"step": 1}, {}],
              "stage3": []}
    xs, spans = plots.cumulative_x(stages)
    assert xs == {"stage1": [1, 2, 3], "stage2": [4, 5], "stage3": []}
    assert spans == [("stage1", 0, 3), ("stage2", 3, 5), ("stage3", 5, 5)]


def test_report_warns_when_a_stage_had_no_learning_signal(tmp_path):
    for name, wrong in (("flat", 1.0), ("mixed", 0.5)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": i, "reward_mean": 0.0, "all_correct_frac": 0.0, "all_wrong_frac": wrong} for i in (1, 2)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    report.run(_rp(), {"rl_stages": {"flat": str(tmp_path / "flat"), "mixed": str(tmp_path / "mixed")}, "eval": {},
                    "rl_data": str(tmp_path / "none")}, str(out))
    warnings = [line for line in (out / "summary.md").read_text().splitlines() if "no learning signal" in line]
    assert len(warnings) == 1 and "(flat)" in warnings[0] and "2 steps all wrong" in warnings[0]
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600


def test_report_pages_render_in_headless_chromium(tmp_path, fake_inputs):
    """summary.html and trajectories.html as a browser renders them: tables, decoded figures, code blocks,
    and model-written markup shown as text, never run."""
    import browser

    ev = tmp_path / "eval"
    _write_jsonl(ev / "sft" / "aime24" / "per_problem.jsonl", [
        {"id": "aime24-60", "rewards": [1.0], "sample": _sample("aime24-60", 1.0, text_extra="<script>x=1</script>")}])
    out = tmp_path / "report"
    report.run(_rp(dpi=40), fake_inputs, str(out))
    page = browser.static_page(out / "summary.html", tmp_path)
    tables = page["tables"]
    assert ["model", "source", "aime24", "math500", "aime25"] in [t[0] for t in tables]
    main = next(t for t in tables if t[0][:2] == ["model", "source"])
    assert ["rStar2-Agent-14B", "paper Table 3 (avg@16)", "80.6", "97.8", "69.8"] in main
    assert ["sft", "this run", "12.3 [5.7, 20.1]", "45.6 [42.1, 49.0]", "–"] in main
    assert any(t[0][0] == "step" for t in tables) and any(t[0][0] == "stage" for t in tables)
    assert len(page["decoded"]) == 4 and all(w > 100 and h > 100 for w, h in page["decoded"])

    traj = browser.static_page(out / "trajectories.html", tmp_path)
    assert traj["scripts"] == 2                     # the probe's own two; the model's <script> is text
    assert "print(6*7)" in traj["code"] and any("<script>x=1</script>" in c for c in traj["code"])
    assert "sft · aime24 · aime24-60" in traj["headings"]


def test_unparsed_or_cut_tool_call_stays_visible_in_trajectory_pages():
    """Only executed calls are replaced by a placeholder (their code is shown below); a call that was cut off
    by the length limit or failed to parse is shown as the model wrote it."""
    from rstar2.report.trajectories import render

    cut = 'Let me check.<tool_call>{"name": "python", "arguments": {"code": "print(2**10'
    bad = 'Try.<tool_call>{"name": "python", "arguments": {"code": oops}}</tool_call>'
    ran = 'Compute.<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    rec = {"question": "q", "pred": None, "gold": "1", "reward": 0.0,
           "turns": [{"text": ran, "tool_calls": [{"code": "print(1)", "status": "ok", "output": "1"}]},
                     {"text": cut, "tool_calls": []},
                     {"text": bad, "tool_calls": [{"code": None, "status": "parse-error", "output": "bad JSON"}]}]}
    texts = [getattr(b, "text", "") for b in render("t", rec)]
    assert any("Compute.[tool call: code below]" in t for t in texts)
    assert any("print(2**10" in t and "Let me check." in t for t in texts)
    assert any('"code": oops' in t for t in texts)


def _heldout_rows(accs, n=100):
    return [{"step": 10 * i, "n_problems": n, "k": 1, "accuracy": a, "accuracy_ci": [max(0, a - 0.09), a + 0.09],
             "tool_use_ratio": 0.8, "tool_ok_ratio": 0.5 + 0.1 * i, "response_length_mean": 150}
            for i, a in enumerate(accs)]


def test_report_learning_curve_and_ablation(tmp_path):
    rl = tmp_path / "rl" / "stage1"
    _write_jsonl(rl / "metrics.jsonl", [_metrics_row(s, 0.2 + 0.02 * s) for s in range(1, 21)])
    # step 10 logged twice (a second run appended to the same folder): the later row is the one reported
    _write_jsonl(rl / "heldout.jsonl", _heldout_rows([0.12, 0.99, 0.45]) + _heldout_rows([0.12, 0.30])[1:])
    runs = []
    for mode, seed, err in [("grpo_roc", 0, 0.1), ("grpo_roc", 1, 0.12), ("grpo", 0, 0.3), ("grpo", 1, 0.34)]:
        d = tmp_path / "ablation" / f"{mode}-seed{seed}"
        _write_jsonl(d / "metrics.jsonl", [_metrics_row(s, 0.3, tool_error_ratio_pos=err) for s in range(1, 9)])
        _write_jsonl(d / "heldout.jsonl", _heldout_rows([0.1, 0.2 + seed / 10], n=50)[:1]
                     + [{**_heldout_rows([0.1, 0.2 + seed / 10], n=50)[1], "step": 8}])
        runs.append({"mode": mode, "seed": seed, "dir": str(d)})
    out = tmp_path / "report"
    report.run(_rp(), {"rl_stages": {"stage1": str(rl)}, "ablation": runs}, str(out))
    md, manifest = _check_outputs(out)
    assert manifest["counts"]["ablation_runs"] == 4
    # held-out table: one row per evaluation, accuracy with its interval in percent
    assert "| stage1 | 20 | 100 | 45.0 [36.0, 54.0] |" in md
    assert "| stage1 | 10 | 100 | 30.0 [21.0, 39.0] |" in md and "99.0" not in md
    assert "heldout.jsonl: 1 row(s) repeat an earlier step" in md
    # ablation rows per run and per mode; mode means over seeds (tool-error ratio of positives 0.32 for grpo)
    assert "| grpo | 1 | 8 (last 3) | 10.0 [1.0, 19.0] | 30.0 [21.0, 39.0] |" in md
    assert "Warning" not in md
    grpo_mean = next(line for line in md.splitlines() if line.startswith("| **grpo mean**"))
    assert "| 32.0 [" in grpo_mean and "| 25.0 [" in grpo_mean  # err 32 %, end accuracy mean (20+30)/2


def test_ablation_table_reads_the_evaluation_at_the_last_step_and_names_runs_without_data(tmp_path):
    runs = []
    for seed, heldout in [(0, _heldout_rows([0.1])), (1, _heldout_rows([0.1]) + [{**_heldout_rows([0, 0.4])[1], "step": 6}])]:
        d = tmp_path / f"grpo-seed{seed}"
        _write_jsonl(d / "metrics.jsonl", [_metrics_row(s, 0.3) for s in range(1, 7)])
        _write_jsonl(d / "heldout.jsonl", heldout)
        runs.append({"mode": "grpo", "seed": seed, "dir": str(d)})
    runs.append({"mode": "grpo", "seed": 2, "dir": str(tmp_path / "never-started")})
    out = tmp_path / "report"
    report.run(_rp(), {"ablation": runs}, str(out))
    md, _ = _check_outputs(out)
    # seed 0 was never evaluated at its last step (6): its end column is empty, not step 0's 10 %
    assert "| grpo | 0 | 6 (last 2) | 10.0 [1.0, 19.0] | – |" in md
    assert "| grpo | 1 | 6 (last 2) | 10.0 [1.0, 19.0] | 40.0 [31.0, 49.0] |" in md
    assert "training reward % (last third)" in md
    grpo_mean = next(line for line in md.splitlines() if line.startswith("| **grpo mean**"))
    assert "| 10.0 | 40.0 |" in grpo_mean
    assert "no steps logged yet by grpo-seed2" in md


def test_report_without_heldout_or_ablation_says_so(tmp_path):
    out = tmp_path / "report"
    report.run(_rp(), {}, str(out))
    md, _ = _check_outputs(out)
    assert "No held-out evaluation during RL was found" in md and "No ablation runs configured" in md


def test_report_rejects_bad_inputs_naming_the_flag_and_the_entry(tmp_path, capsys):
    from rstar2 import cli

    assert cli.main(["report", "--params", "{}", "--inputs", "{oops", "--out", str(tmp_path / "r")]) == 2
    assert "rstar2 report: error: --inputs is not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:   # argparse's usage error: exit 2, the subcommand named
        cli.main(["rl-candidates", "--params", "notjson", "--out", str(tmp_path / "c")])
    assert e.value.code == 2
    assert "rstar2 rl-candidates: error: argument --params: --params is not valid JSON" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"ablation entry 1 lacks \['mode'\]"):
        report.run(_rp(), {"ablation": [{"mode": "grpo", "seed": 0, "dir": str(tmp_path)},
                                     {"seed": 1, "dir": str(tmp_path)}]}, str(tmp_path / "r"))


def test_report_survives_malformed_inputs_with_notes(tmp_path):
    rl = tmp_path / "rl" / "stage1"
    rl.mkdir(parents=True)
    (rl / "metrics.jsonl").write_bytes(b"\xff\xfe" + json.dumps(_metrics_row(1, 0.2)).encode() + b"\n"
                                       + json.dumps(_metrics_row(2, 0.3)).encode() + b"\n")
    _write_jsonl(rl / "heldout.jsonl", [{**_heldout_rows([0.2])[0], "accuracy_ci": [0.9]}])
    _write_jsonl(rl / "rollouts.jsonl", [{"step": 2, "problem_id": "p1", "turns": "notalist"},
                                         {"step": 2, "problem_id": "p2", "turns": [{"text": "hi"}, 5]}])
    ablation = [{"mode": "grpo", "seed": "x", "dir": str(tmp_path / "a")},
                {"mode": "grpo", "seed": None, "dir": str(tmp_path / "b")}]
    out = tmp_path / "report"
    report.run(_rp(), {"rl_stages": {"stage1": str(rl), "stage2": str(tmp_path / "none")}, "ablation": ablation},
               str(out))
    md, _ = _check_outputs(out)
    assert "metrics.jsonl: line 1 is not valid JSON" in md
    assert "problem 'p1' has malformed turns" in md and "problem 'p2' has malformed turns" in md
    assert "| stage1 | 0 | 100 | 20.0 |" in md                      # accuracy without its broken interval
    assert "none/metrics.jsonl: not found" in md
    assert "some (mode, seed) pairs appear more than once" not in md
    with pytest.raises(ValueError, match="'rl_stages' must be a JSON object, got list"):
        report.run(_rp(), {"rl_stages": [str(rl)]}, str(out))


def test_ablation_warns_on_repeated_runs_and_unequal_budgets(tmp_path):
    runs = []
    for i, (mode, seed, steps) in enumerate([("grpo", 0, 8), ("grpo", 0, 20), ("grpo_roc", 0, 8)]):
        d = tmp_path / f"run{i}"
        _write_jsonl(d / "metrics.jsonl", [_metrics_row(s, 0.3) for s in range(1, steps + 1)])
        runs.append({"mode": mode, "seed": seed, "dir": str(d)})
    out = tmp_path / "report"
    report.run(_rp(), {"ablation": runs}, str(out))
    md, _ = _check_outputs(out)
    assert "some (mode, seed) pairs appear more than once" in md and "different numbers of steps ([8, 20])" in md


def test_report_leads_with_the_held_out_learning_result(tmp_path, fake_inputs):
    """The first section: accuracy per model with intervals, the gain, and one problem the SFT model got wrong and
    the final model right, shown side by side."""
    ev = tmp_path / "eval"
    for model, acc, ci, ok in (("sft", 0.05, [0.01, 0.10], 0.38), ("rl_stage3", 0.71, [0.62, 0.80], 1.0)):
        summary = json.loads((ev / model / "summary.json").read_text())
        summary["benchmarks"]["arith_heldout"] = {"n_problems": 100, "k": 1, "avg_at_k": acc, "avg_at_k_ci": ci,
                                                  "tool_ok_ratio": ok, "mean_tool_calls": 1.2, "truncation_ratio": 0.0}
        _write_json(ev / model / "summary.json", summary)
    _write_jsonl(ev / "sft" / "arith_heldout" / "per_problem.jsonl",
                 [{"id": "h1", "sample": _sample("h1", 1.0)}, {"id": "h2", "sample": _sample("h2", 0.0)}])
    _write_jsonl(ev / "rl_stage3" / "arith_heldout" / "per_problem.jsonl",
                 [{"id": "h1", "sample": _sample("h1", 1.0)}, {"id": "h2", "sample": _sample("h2", 1.0)}])
    out = tmp_path / "report"
    report.run(_rp(lead_benchmark="arith_heldout"), fake_inputs, str(out))
    md = (out / "summary.md").read_text()
    first = md.index("## ")
    assert md[first:].startswith("## Learning result: accuracy on arith_heldout\n\nLead benchmark arith_heldout: "
                                 "report.lead_benchmark (else rl.heldout.benchmark).")
    assert "rl_stage3 vs sft: +66.0 points; the 95% intervals do not overlap." in md
    assert "| sft | 5.0 [1.0, 10.0] | 100 | 1 | 38.0 | 1.20 | 0.0 |" in md
    assert "| rl_stage3 | 71.0 [62.0, 80.0] | 100 | 1 | 100.0 |" in md
    lead = md[first:md.index("\n## ", first + 3)]
    pair = lead[lead.index("### One problem of arith_heldout"):]
    assert "sft · h2" in pair and "rl_stage3 · h2" in pair and "h1" not in pair   # wrong before, right after
    # the benchmark problem by problem: gold as written, each model's answer and correct samples
    assert "| problem | gold | sft: answer | sft: correct | rl_stage3: answer | rl_stage3: correct |" in lead
    assert "| h2 | 42 | 41 | 0/1 | 42 | 1/1 |" in lead
    assert (out / "lead_per_problem.csv").read_text().splitlines()[1:] == ["h1,42,42,1/1,42,1/1", "h2,42,41,0/1,42,1/1"]
    assert (out / "learning_result.png").read_bytes().startswith(PNG_MAGIC)


def test_a_lead_benchmark_this_run_did_not_evaluate_gives_way_and_the_hint_names_the_right_keys(tmp_path,
                                                                                                 fake_inputs):
    out = tmp_path / "report"
    report.run(_rp(lead_benchmark="arith_heldout"), fake_inputs, str(out))
    md = (out / "summary.md").read_text()
    assert "## Learning result: accuracy on aime24" in md
    assert ("Lead benchmark aime24: the first benchmark this run evaluated; report.lead_benchmark (else "
            "rl.heldout.benchmark) names 'arith_heldout', which this run did not evaluate (it evaluated aime24, math500, "
            "aime25): set "
            "report.lead_benchmark to one of those, or add 'arith_heldout' to evaluate.benchmarks.") in md
    assert (out / "learning_result.png").read_bytes().startswith(PNG_MAGIC)


def test_a_one_problem_benchmark_shows_no_interval_and_a_skipped_funnel_step_says_so():
    """A bootstrap interval over one problem is a point ([0.0, 0.0]); the report says n=1 instead. A funnel step
    that did not run (label verification off) is labelled skipped, not shown as if it kept every problem."""
    from rstar2.report import sections
    from rstar2.report.document import Table

    one = {"avg_at_k": 0.0, "avg_at_k_ci": [0.0, 0.0], "n_problems": 1}
    assert sections._with_ci(one) == "0.0 (n=1)"
    assert sections._with_ci({**one, "avg_at_k": 0.25, "avg_at_k_ci": [0.1, 0.4], "n_problems": 40}) == \
        "25.0 [10.0, 40.0]"
    blocks = sections.funnel({"steps": ["loaded", "label_verification"],
                              "step_status": {"loaded": "done", "label_verification": "skipped"},
                              "per_source": {"a": {"loaded": 5, "label_verification": 5}}}, None)
    table = next(b for b in blocks if isinstance(b, Table))
    assert [r[0] for r in table.rows] == ["loaded", "label_verification (skipped: not enabled)"]
    from rstar2.report import lead
    from rstar2.report.document import Para

    note = lead.lead_section({"sft": {"benchmarks": {"aime24": {"avg_at_k": 0.0}}}}, {}, {}, "arith_heldout", [])
    assert len(note) == 1 and isinstance(note[0], Para) and "'arith_heldout'" in note[0].text \
        and "was not evaluated in this run" in note[0].text


def test_the_report_names_the_model_seed_and_config_files_it_was_made_from(tmp_path):
    params = stage_params("report")
    params["made_from"] = {"model": {"source": "local", "path": "/models/mine", "hub_id": None}, "seed": 3,
                           "reproducible": False, "code": "0123abcd4567-dirty", "config_overrides": {"seed": 3},
                           "config_files": [{"path": "config.yaml", "sha256": "aaaa"},
                                            {"path": "configs/mine.yaml", "sha256": "bbbb"}]}
    report.run(params, {}, str(tmp_path / "r"))
    text = (tmp_path / "r" / "summary.md").read_text()
    assert ("Made from: model local (/models/mine); seed 3; reproducible off; config files in merge order: "
            "config.yaml (sha256 aaaa), configs/mine.yaml (sha256 bbbb); --config seed=3; code "
            "0123abcd4567-dirty.") in text
    assert "Made from: model local (/models/mine)" in (tmp_path / "r" / "summary.html").read_text()


def test_the_training_table_says_what_each_stage_trained_on(tmp_path):
    d = tmp_path / "stage3"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(_metrics_row(i, 0.5)) + "\n" for i in (1, 2, 3, 4)))
    (d / "manifest.json").write_text(json.dumps({
        "stage": "rl_stage3", "params": {"sources": ["arith_easy", "arith_hard"]},
        "inputs": ["results/rl/stage2/model", "results/hard_problems/hard.jsonl"],
        "counts": {"steps": 4, "updates_skipped": 1, "train_problems": 13}}))
    out = tmp_path / "out"
    report.run(_rp(), {"rl_stages": {"stage3": str(d)}}, str(out))
    row = next(line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| stage3 |"))
    assert row.startswith("| stage3 | arith_easy, arith_hard (hard.jsonl) | 13 / 3 | 4 |"), row


def test_the_report_says_which_precision_the_rl_stages_ran_in(tmp_path):
    """A float32 run (a CPU without native bf16) reads as one under the title, from the stages' manifests."""
    why = ": this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)"
    d = tmp_path / "stage1"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps(_metrics_row(1, 0.5)) + "\n")
    (d / "manifest.json").write_text(json.dumps({"stage": "rl_stage1", "precision": {
        "training": "float32, not bf16" + why, "rollout": "float32, not bf16" + why}}))
    report.run(_rp(), {"rl_stages": {"stage1": str(d)}}, str(tmp_path / "r"))
    text = (tmp_path / "r" / "summary.md").read_text()
    assert "Precision (RL stages' manifests): training float32, not bf16; rollout float32, not bf16." in text
    report.run(_rp(), {}, str(tmp_path / "r2"))
    assert "Precision" not in (tmp_path / "r2" / "summary.md").read_text()


def _stage_with_reward(tmp_path, name, reward):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(_metrics_row(i, 0.75)) + "\n" for i in (1, 2)))
    params = {"sources": ["mine"]} if reward is None else {"sources": ["mine"], "reward": reward}
    (d / "manifest.json").write_text(json.dumps({"stage": f"rl_{name}", "params": params,
                                                 "counts": {"steps": 2, "updates_skipped": 0, "train_problems": 5}}))
    return str(d)


def test_the_rl_section_names_each_stages_reward_and_a_non_answer_reward_is_not_called_accuracy(tmp_path):
    """configs/tiny.yaml's smoke reward, inherited by an overlay, must not read as solved problems: the section
    names it from the manifests, warns, and heads the column with what it counts."""
    smoke = "rstar2.grading.smoke_reward:ascii_letter_share"
    stages = {"stage1": _stage_with_reward(tmp_path, "stage1", smoke),
              "stage2": _stage_with_reward(tmp_path, "stage2", smoke)}
    report.run(_rp(), {"rl_stages": stages}, str(tmp_path / "r"))
    text = (tmp_path / "r" / "summary.md").read_text()
    section = text[text.index("## RL training"):]
    assert f"RL reward (rl.reward, from each stage's manifest): stage1, stage2: {smoke}." in section
    assert f"Warning: stage1, stage2 trained on {smoke}, not the answer reward" in section
    assert "ignores the golds" in section and "Set rl.reward: answer to train on the golds" in section
    header = next(line for line in section.splitlines() if line.startswith("| stage |"))
    assert "first share with reward > 0 | last share with reward > 0" in header and "accuracy" not in header
    assert f"stage1, stage2: {smoke}" in (tmp_path / "r" / "summary.html").read_text()

    # the answer reward, and a manifest from before rl.reward was recorded: accuracy, no warning
    (tmp_path / "b").mkdir()
    answer = {"stage1": _stage_with_reward(tmp_path / "b", "stage1", "answer"),
              "stage2": _stage_with_reward(tmp_path / "b", "stage2", None)}
    report.run(_rp(), {"rl_stages": answer}, str(tmp_path / "r2"))
    text = (tmp_path / "r2" / "summary.md").read_text()
    assert ("RL reward (rl.reward, from each stage's manifest): stage1: answer (the paper's binary answer reward, "
            "§2.2); stage2: not recorded.") in text
    assert "not the answer reward" not in text
    header = next(line for line in text.splitlines() if line.startswith("| stage |"))
    assert "first accuracy | last accuracy" in header

    # a user's reward on stage 2 only: the column is not called accuracy; a note (it may use the golds) names
    # that stage only
    (tmp_path / "c").mkdir()
    mixed = {"stage1": answer["stage1"], "stage2": _stage_with_reward(tmp_path / "c", "stage2", "my_rewards:f")}
    report.run(_rp(), {"rl_stages": mixed}, str(tmp_path / "r3"))
    text = (tmp_path / "r3" / "summary.md").read_text()
    assert "Note: stage2 trained on my_rewards:f, not the answer reward" in text and "Warning: stage" not in text
    assert "first share with reward > 0" in text
