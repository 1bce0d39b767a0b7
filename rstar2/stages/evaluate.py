"""Evaluation with the training agent loop and grader (paper §5.1; spec §6): avg@k pass@1 per benchmark.

The paper's protocol: the Fig. 3 prompt with the tool, temperature 0.6, at most 30K tokens and 30 turns,
16 samples per problem; reported as avg@16 pass@1 and the mean response length. We add the unbiased pass@k,
maj@k, the mean number of tool calls, the truncation ratio and 95% bootstrap intervals over problems.

Each benchmark is graded by its declared answer type (rstar2.data.benchmarks): the answer comes from the
model's own final turn only; a trajectory cut by the token budget scores 0, as in RL.

Per-problem results are appended as each chunk of problems finishes, so a resumed evaluation skips every
problem already graded and recomputes nothing; results made with other params are discarded first.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from ..io import append_jsonl, digest, read_jsonl, write_json, write_manifest


def summarise(rows: list[dict], k: int) -> dict:
    """One benchmark's entry of ``summary.json`` from its per-problem rows.

    Args:
        rows: per-problem records with ``rewards``, ``preds``, ``response_tokens``, ``tool_calls``,
            ``truncated`` (one entry per sample).
        k: samples per problem.
    Returns:
        ``{"n_problems", "k", "avg_at_k", "avg_at_k_ci" [lo, hi], "pass_at_k", "maj_at_k",
        "mean_response_tokens", "mean_tool_calls", "truncation_ratio"}``; scores are fractions in [0, 1],
        means are over problems of the per-problem mean over samples. With no rows every value is None.
    """
    from .. import metrics

    if not rows:
        return {"n_problems": 0, "k": k, "avg_at_k": None, "avg_at_k_ci": None, "pass_at_k": None,
                "maj_at_k": None, "mean_response_tokens": None, "mean_tool_calls": None, "truncation_ratio": None}
    rewards = [r["rewards"] for r in rows]
    out = metrics.summarize_rewards(rewards, k=min(k, min(len(r) for r in rewards)))
    out["k"] = k

    def mean_of_means(key):
        return statistics.fmean(statistics.fmean(float(x) for x in r[key]) for r in rows)
    out.update(maj_at_k=metrics.maj_at_k([r["preds"] for r in rows], rewards),
               mean_response_tokens=mean_of_means("response_tokens"), mean_tool_calls=mean_of_means("tool_calls"),
               truncation_ratio=mean_of_means("truncated"))
    return out


def _drop_stale_results(out: Path, params: dict) -> None:
    """Per-problem results are reused on resume only if they were made with the same params."""
    stamp = out / "params_digest.txt"
    if not stamp.exists() or stamp.read_text().strip() != digest(params):
        for f in out.glob("*/per_problem.jsonl"):
            f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest(params) + "\n")


def score(trajs, golds: list[str], answer_types: list[str]) -> None:
    """Grade trajectories in place (``pred``, ``reward``, ``gold``) by their benchmark's answer type.

    The answer is read from the final turn's text (grading.score_trajectory, run in killable workers with a
    per-item time bound by grading_pool; an item that overruns scores 0); a trajectory cut by the token
    budget gets no answer and reward 0. Bad golds were rejected before any rollout.
    """
    from ..rollout import grade_all

    for t, gold in zip(trajs, golds, strict=True):
        t.gold = gold
    grade_all(trajs, answer_types=answer_types)


def _load_problems(params: dict) -> dict[str, tuple[str, list[dict]]]:
    """``{bench: (answer_type, problems)}``, the first ``limit`` problems of each; every gold is checked first,
    so a data error stops the stage before any rollout, naming the benchmark, file and problem."""
    from ..data.benchmarks import answer_type, load_benchmark
    from ..grading import gold_is_valid

    out = {}
    for bench, spec in params["benchmarks"].items():
        kind = answer_type(spec).name
        probs = load_benchmark(bench, spec)[: params.get("limit") or None]
        for p in probs:
            if not gold_is_valid(p["answer"], kind):
                raise ValueError(f"benchmark {bench!r} ({spec.get('path')}), problem {p['id']}: "
                                 f"gold answer {p['answer']!r} cannot be parsed as a {kind!r} answer")
        out[bench] = (kind, probs)
    return out


def run(params: dict, model_name: str, model_dir: str, out_dir: str) -> None:
    """Evaluate one model on every configured benchmark.

    Writes ``<bench>/per_problem.jsonl`` (one row per problem: ``id``, ``answer``, ``answer_type``, and per
    sample ``rewards``, ``preds``, ``response_tokens``, ``tool_calls``, ``truncated``; plus one full rollout
    record ``sample`` for the report), then ``summary.json`` (``{"model", "benchmarks": {bench: summarise()}}``)
    and last ``manifest.json``.

    Args:
        params: {"benchmarks": {name: benchmark spec}, "limit": problems per benchmark (0 = all), "k": samples
            per problem, "rollout": {...}, "tool": {...}, "seed"}.
        model_name / model_dir / out_dir: the model's label, its HF folder, e.g. ``results/eval/<model>``.
    Raises:
        ValueError: a benchmark row with a gold that its answer type cannot grade against.
    """
    import torch

    from .. import models, precision
    from ..rollout import Progress, run_rollouts
    from .rl import rollout_config

    t0 = time.time()
    out = Path(out_dir)
    problems = _load_problems(params)           # data errors first, before the model is loaded
    _drop_stale_results(out, params)
    torch.manual_seed(params["seed"])
    model, tok = models.load(model_dir)
    rcfg = rollout_config(params)
    k = params["k"]
    todo = []                 # all benchmarks share each batch, so short sets do not idle the engine
    for bench, (kind, probs) in problems.items():
        path = out / bench / "per_problem.jsonl"
        done = {r["id"] for r in read_jsonl(path)} if path.exists() else set()
        todo += [(bench, kind, p) for p in probs if str(p["id"]) not in done]
    chunk = max(1, rcfg.batch_size // k)
    progress = Progress(f"eval {model_name}", unit="problems")
    for start in range(0, len(todo), chunk):
        batch = todo[start:start + chunk]
        # no gold goes into the rollout: grading happens here, by each benchmark's declared answer type
        trajs = run_rollouts(model, tok, [{"id": p["id"], "problem": p["problem"]}
                                          for _, _, p in batch for _ in range(k)], rcfg)
        score(trajs, [p["answer"] for _, _, p in batch for _ in range(k)], [kd for _, kd, _ in batch for _ in range(k)])
        for i, (bench, kind, p) in enumerate(batch):
            samples = trajs[i * k:(i + 1) * k]
            append_jsonl(out / bench / "per_problem.jsonl", {
                "id": str(p["id"]), "answer": p["answer"], "answer_type": kind,
                "rewards": [t.reward for t in samples], "preds": [t.pred for t in samples],
                "response_tokens": [len(t.response_ids) for t in samples],
                "tool_calls": [len(t.tool_calls) for t in samples],
                "truncated": [t.truncated for t in samples], "sample": samples[0].record()})
        progress(start + len(batch), len(todo))
    summary = {"model": model_name, "benchmarks": {}}
    for bench, (kind, probs) in problems.items():
        ids = {str(p["id"]) for p in probs}
        path = out / bench / "per_problem.jsonl"
        rows = [r for r in read_jsonl(path) if r["id"] in ids] if path.exists() else []
        entry = summarise(rows, k)
        entry["answer_type"] = kind
        if params["benchmarks"][bench].get("paper"):
            entry["paper"] = params["benchmarks"][bench]["paper"]
        summary["benchmarks"][bench] = entry
        avg = entry["avg_at_k"]
        print(f"[eval] {model_name} {bench}: avg@{k} {avg if avg is None else round(avg, 3)} "
              f"over {len(rows)} problems", flush=True)
    write_json(out / "summary.json", summary)
    write_manifest(out, stage=f"evaluate_{model_name}", params=params, inputs=[model_dir],
                   counts={b: s["n_problems"] for b, s in summary["benchmarks"].items()}, started=t0,
                   extra={"precision": precision.summary(params)})
