"""Evaluation with the training agent loop and grader (paper §5.1; spec §6): avg@k pass@1 per benchmark.

Per-problem results are appended as each chunk of problems finishes, so a resumed evaluation skips every
problem already graded and recomputes nothing.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from ..io import append_jsonl, digest, read_jsonl, write_json, write_manifest


def _summarise(rows: list[dict], k: int) -> dict:
    from .. import metrics

    per_problem = [r["rewards"] for r in rows]
    means = [statistics.fmean(r) for r in per_problem]
    return {
        "n_problems": len(rows), "k": k,
        "avg_at_k": metrics.avg_at_k(per_problem) if rows else 0.0,
        "avg_at_k_ci": list(metrics.bootstrap_ci(means)) if rows else [0.0, 0.0],
        "pass_at_k": statistics.fmean(metrics.pass_at_k(len(r), int(sum(x > 0 for x in r)), k) for r in per_problem)
        if rows else 0.0,
        "mean_response_tokens": statistics.fmean(statistics.fmean(r["response_tokens"]) for r in rows) if rows else 0.0,
        "mean_tool_calls": statistics.fmean(statistics.fmean(r["tool_calls"]) for r in rows) if rows else 0.0,
    }


def _drop_stale_results(out: Path, params: dict) -> None:
    """Per-problem results are reused on resume only if they were made with the same params."""
    stamp = out / "params_digest.txt"
    if not stamp.exists() or stamp.read_text().strip() != digest(params):
        for f in out.glob("*/per_problem.jsonl"):
            f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest(params) + "\n")


def run(params: dict, model_name: str, model_dir: str, out_dir: str) -> None:
    """Evaluate one model on every configured benchmark; writes ``<bench>/per_problem.jsonl``, ``summary.json``.

    params: {"benchmarks": {name: loader spec}, "limit": problems per benchmark (0 = all), "k": samples per
    problem, "rollout": {...}, "tool": {...}, "seed"}.
    """
    import torch

    from .. import models
    from ..data.benchmarks import load_benchmark
    from ..grading import gold_is_valid
    from ..rollout import Progress, run_rollouts
    from .rl import rollout_config

    t0 = time.time()
    torch.manual_seed(params["seed"])
    out = Path(out_dir)
    _drop_stale_results(out, params)
    model, tok = models.load(model_dir)
    rcfg = rollout_config(params)
    k = params["k"]
    summary = {"model": model_name, "benchmarks": {}}
    problems, todo = {}, []          # all benchmarks share each batch, so short sets do not idle the engine
    for bench, spec in params["benchmarks"].items():
        problems[bench] = load_benchmark(bench, spec)[: params.get("limit") or None]
        for p in problems[bench]:  # a bad gold is a data error: stop before any rollout, naming the row
            if not gold_is_valid(p["answer"]):
                raise ValueError(f"benchmark {bench!r} ({spec.get('path')}), problem {p['id']}: "
                                 f"gold answer {p['answer']!r} cannot be parsed")
        path = out / bench / "per_problem.jsonl"
        done = {r["id"] for r in read_jsonl(path)} if path.exists() else set()
        todo += [(bench, p) for p in problems[bench] if str(p["id"]) not in done]
    chunk = max(1, rcfg.batch_size // k)
    progress = Progress(f"eval {model_name}", unit="problems")
    for start in range(0, len(todo), chunk):
        batch = todo[start:start + chunk]
        trajs = run_rollouts(model, tok, [p for _, p in batch for _ in range(k)], rcfg)
        for i, (bench, p) in enumerate(batch):
            samples = trajs[i * k:(i + 1) * k]
            append_jsonl(out / bench / "per_problem.jsonl", {
                "id": str(p["id"]), "answer": p["answer"], "rewards": [t.reward for t in samples],
                "preds": [t.pred for t in samples], "response_tokens": [len(t.response_ids) for t in samples],
                "tool_calls": [len(t.tool_calls) for t in samples],
                "truncated": [t.truncated for t in samples], "sample": samples[0].record()})
        progress(start + len(batch), len(todo))
    for bench, probs in problems.items():
        ids = {str(p["id"]) for p in probs}
        rows = [r for r in read_jsonl(out / bench / "per_problem.jsonl") if r["id"] in ids] if probs else []
        summary["benchmarks"][bench] = _summarise(rows, k)
        print(f"[eval] {model_name} {bench}: avg@{k} {summary['benchmarks'][bench]['avg_at_k']:.3f} "
              f"over {len(rows)} problems", flush=True)
    write_json(out / "summary.json", summary)
    write_manifest(out, stage=f"evaluate_{model_name}", params=params, inputs=[model_dir],
                   counts={b: s["n_problems"] for b, s in summary["benchmarks"].items()}, started=t0)
