"""scripts/measurements.py: a run's kept source regenerates its row (accuracy with intervals, gain, wall time,
per-stage times) from the files it copied, with the report's own headline arithmetic."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("measurements", REPO / "scripts" / "measurements.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_saved_run_regenerates_the_readme_row(tmp_path, monkeypatch):
    m = _load()
    monkeypatch.setattr(m, "REPO", tmp_path)
    results, logs = tmp_path / "results", tmp_path / "logs"
    for model, acc, ci in (("sft", 0.18, [0.11, 0.26]), ("rl_stage3", 0.53, [0.43, 0.63]), ("base", 0.02, [0.0, 0.05])):
        d = results / "eval" / model
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"model": model, "benchmarks": {
            "arith_heldout": {"avg_at_k": acc, "avg_at_k_ci": ci, "n_problems": 100, "k": 1}}}))
    (results / "report").mkdir()
    (results / "report" / "manifest.json").write_text(json.dumps({"params": {"lead_benchmark": "arith_heldout"}}))
    (logs / "benchmarks" / "rl").mkdir(parents=True)
    (logs / "benchmarks" / "sft.tsv").write_text("s\th:m:s\n187.2\t0:03:07\n")
    (logs / "benchmarks" / "rl" / "stage1.tsv").write_text("s\th:m:s\n397.0\t0:06:37\n")
    (results / "eval" / "sft" / "arith_heldout").mkdir()
    (results / "eval" / "sft" / "arith_heldout" / "per_problem.jsonl").write_text('{"id": "a", "rewards": [1.0]}\n')
    (results / "rl" / "stage1").mkdir(parents=True)
    (results / "rl" / "stage1" / "metrics.jsonl").write_text('{"step": 1, "step_time_s": 20.0}\n')
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    (tmp_path / ".snakemake" / "log" / "2026-01-01T000000.snakemake.log").write_text("Elapsed time: 0:20:28\n")
    m.save("run-a", 1869.0, "make run", results, logs)
    kept = tmp_path / "docs" / "measurements" / "run-a"   # the rows behind per-kind and per-step figures
    assert (kept / "eval" / "sft" / "arith_heldout" / "per_problem.jsonl").read_text() == '{"id": "a", "rewards": [1.0]}\n'
    assert (kept / "rl" / "stage1" / "metrics.jsonl").read_text() == '{"step": 1, "step_time_s": 20.0}\n'
    assert (kept / "snakemake.log").read_text() == "Elapsed time: 0:20:28\n"   # job times and Snakemake's total
    out = m.table("run-a").splitlines()
    assert out[0].startswith("machine: ") and "commit" in out[0] and "`make run`" in out[0]
    assert out[1] == "| base 2.0% [0.0, 5.0] | rl_stage3 53.0% [43.0, 63.0] (+51 points, intervals apart) | 31.1 min |"
    assert out[2] == "per-stage wall time (s): rl/stage1 397, sft 187"
