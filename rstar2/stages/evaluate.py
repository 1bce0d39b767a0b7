"""Evaluation with the training agent loop and grader (paper §5.1): avg@k pass@1 per benchmark.

The paper's protocol: the Fig. 3 prompt with the tool, temperature 0.6, at most 30K tokens and 30 turns,
16 samples per problem; reported as avg@16 pass@1 and the mean response length. We add the unbiased pass@k,
maj@k, the mean number of tool calls, the truncation ratio and 95% bootstrap intervals over problems.

Each benchmark is graded by its declared answer type (rstar2.data.benchmarks): the answer comes from the
model's own final turn only; a trajectory cut by the token budget scores 0, as in RL.

Per-problem results are appended as each chunk of problems finishes, so a resumed evaluation skips every
problem already graded and recomputes nothing; results made with other params are discarded first.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

from .. import seeds
from ..io import append_jsonl, digest, file_sha256, keep_resumable, read_jsonl, write_json, write_manifest
from ..metrics import summarise
from ..params import to_dict
from ..rollout.scheduler import policy_name
from ..rollout.vllm_reproducible import enable_batch_invariance
from .params import EvaluateParams, parse


def _resume_dir(out: Path) -> Path:
    """``results/eval/<model>`` -> ``results/eval/checkpoints/<model>``: outside the rule's declared outputs."""
    return out.parent / "checkpoints" / out.name


def _open_results(out: Path, params: dict, model_dir: str, benches) -> None:
    """Per-problem results are reused on resume only if they were made with the same params and model (its files'
    names and contents). They are declared outputs, which Snakemake deletes before rerunning a killed job, so
    each keeps a second name in ``_resume_dir`` (``io.keep_resumable``), removed after the manifest."""
    model = sorted((str(f.relative_to(model_dir)), file_sha256(f))
                   for f in Path(model_dir).rglob("*") if f.is_file()) if Path(model_dir).is_dir() else model_dir
    out.mkdir(parents=True, exist_ok=True)
    stamp, made_by = out / "params_digest.txt", digest({"params": params, "model": model})
    fresh = not stamp.exists() or stamp.read_text().strip() != made_by
    for bench in benches:
        keep_resumable(out / bench / "per_problem.jsonl", _resume_dir(out) / bench / "per_problem.jsonl", fresh)
    stamp.write_text(made_by + "\n")


def _first_per_group(probs: list[dict], limit: int) -> list[dict]:
    """The first ``limit`` problems of each group (a BFCL category; one group otherwise); 0 = all."""
    if not limit:
        return probs
    seen: dict = {}
    out = []
    for p in probs:
        g = p.get("group")
        if seen.get(g, 0) < limit:
            seen[g] = seen.get(g, 0) + 1
            out.append(p)
    return out


def _load_problems(ev: EvaluateParams) -> dict[str, tuple[str, list[dict], int]]:
    """``{bench: (answer_type, problems, problems in the benchmark)}``, the first ``limit`` problems of each (of
    each BFCL category);
    every gold or checker reference is checked first, so a data error stops the stage before any rollout,
    naming the benchmark, file and problem."""
    from .. import grading
    from ..data.benchmarks import answer_type, load_benchmark
    from ..grading import gold_is_valid

    out = {}
    for bench, spec in ev.benchmarks.items():
        kind = answer_type(spec).name
        everything = load_benchmark(bench, spec)
        probs = _first_per_group(everything, ev.limits.get(bench, ev.limit))  # overrides
        for p in probs:
            if kind in grading.CHECKERS:
                try:
                    _checker(kind).check_reference(json.loads(p["answer"]))
                except (ValueError, KeyError) as e:
                    raise ValueError(f"benchmark {bench!r} ({spec.get('path')}), problem {p['id']}: {e}") from None
            elif not gold_is_valid(p["answer"], kind):
                raise ValueError(f"benchmark {bench!r} ({spec.get('path')}), problem {p['id']}: "
                                 f"gold answer {p['answer']!r} cannot be parsed as a {kind!r} answer")
        out[bench] = (kind, probs, len(everything))
    return out


def _checker(kind: str):
    from ..grading import bfcl, ifeval

    return {"ifeval": ifeval, "bfcl": bfcl}[kind]


def _check(trajs, refs: list[str], kind: str) -> list[dict]:
    """Reference-checker results (grading.ifeval / grading.bfcl) for single-turn trajectories, in killable
    workers; sets each trajectory's ``reward`` (IFEval: all instructions followed, strict; BFCL: valid) and
    ``pred`` (the checked response / the decoded calls). An item that overran its deadline or crashed scores 0."""
    from .. import grading_pool

    res = grading_pool.check_many(kind, [(t.turns[-1]["text"] if t.turns else "", json.loads(r))
                                         for t, r in zip(trajs, refs, strict=True)])
    for t, r in zip(trajs, res):
        ok = r["status"] == "ok"
        t.reward = float(ok and (r["prompt_level_strict_acc"] if kind == "ifeval" else r["valid"]))
        t.pred = None if not ok else (r["response"] if kind == "ifeval" else json.dumps(r["decoded"]))
    return res


def _checked_summary(kind: str, rows: list[dict], spec: dict) -> dict:
    """The checker's own metrics of an IFEval / BFCL benchmark; ``avg_at_k`` is the headline the report shows:
    IFEval strict prompt-level accuracy (the paper's number), BFCL's unweighted mean over categories. A check
    that timed out or crashed (``checker_errors``) counts as not followed / not valid."""
    results, errors = [], 0
    for r in rows:
        for c in r["checks"]:
            errors += c["status"] != "ok"
            if kind == "bfcl":
                results.append({"category": r["group"], "valid": c["status"] == "ok" and c["valid"]})
            elif c["status"] == "ok":
                results.append(c)
            else:
                n = len(json.loads(r["answer"])["instruction_id_list"])
                results.append({"prompt_level_strict_acc": False, "prompt_level_loose_acc": False,
                                "inst_level_strict_acc": [False] * n, "inst_level_loose_acc": [False] * n})
    if kind == "ifeval":
        from ..grading import ifeval

        out = ifeval.summarise(results)
        return {"ifeval": out, "avg_at_k": out["prompt_level_strict_acc"], "checker_errors": errors}
    from ..grading import bfcl

    out = bfcl.summarise(results, spec["categories"])
    return {"bfcl": out, "avg_at_k": out["accuracy"], "avg_at_k_ci": None, "checker_errors": errors}


def _record(p: dict, kind: str, samples: list, checks: list[dict] | None) -> dict:
    row = {"id": str(p["id"]), "answer": p["answer"], "answer_type": kind, "group": p.get("group"),
           "rewards": [t.reward for t in samples], "preds": [t.pred for t in samples],
           "response_tokens": [len(t.response_ids) for t in samples],
           "tool_calls": [len(t.tool_calls) for t in samples],
           "tool_calls_ok": [sum(c.get("status") == "ok" for c in t.tool_calls) for t in samples],
           "truncated": [t.truncated for t in samples], "sample": samples[0].record()}
    if checks is not None:
        row["checks"] = checks
    return row


def run(params: dict, model_name: str, model_dir: str, out_dir: str) -> None:
    """Evaluate one model on every configured benchmark.

    Answer-graded benchmarks (integer / math / choice) follow the paper's math protocol (params ``k``,
    temperature, turns). IFEval and BFCL follow theirs (paper §5.1: each benchmark's template,
    temperature 0): one greedy sample per problem, one turn (a BFCL call is checked, never executed), the
    response checked by the field's reference checker (grading.ifeval, grading.bfcl).

    Writes ``<bench>/per_problem.jsonl`` (one row per problem: ``id``, ``answer``, ``answer_type``, ``group``,
    and per sample ``rewards``, ``preds``, ``response_tokens``, ``tool_calls``, ``truncated``, plus ``checks``
    (the checker's verdicts) for IFEval / BFCL and one full rollout record ``sample`` for the report), then
    ``summary.json`` (``{"model", "benchmarks": {bench: summarise() + checker metrics}}``), last ``manifest.json``.

    Args:
        params: ``rstar2.stages.params.EvaluateParams`` or its JSON dict: benchmarks {name: spec}, limit (problems
            per benchmark, per BFCL category; 0 = all), k (samples per problem), rollout, seed.
        model_name / model_dir / out_dir: the model's label, its HF folder, e.g. ``results/eval/<model>``.
    Raises:
        ValueError: a benchmark row with a gold or reference its answer type cannot grade against.
    """
    import dataclasses

    from .. import grading, models, precision
    from ..rollout import Progress, grade_all, run_rollouts, shutdown_vllm

    t0 = time.time()
    ev = parse(EvaluateParams, params, "evaluate params")
    out = Path(out_dir)
    problems = _load_problems(ev)           # data errors first, before the model is loaded
    _open_results(out, to_dict(ev), model_dir, problems)
    model, tok = models.load(model_dir)
    base = ev.rollout
    plans = {"answer": (base, ev.k),     # checked kinds: greedy, one sample, one turn
             "checked": (dataclasses.replace(base, temperature=0.0, max_turns=1), 1)}
    for plan, (rcfg, k) in plans.items():
        todo = []             # all benchmarks share each batch, so short sets do not idle the engine
        for bench, (kind, probs, _) in problems.items():
            if (kind in grading.CHECKERS) != (plan == "checked"):
                continue
            done = {r["id"] for r in read_jsonl(out / bench / "per_problem.jsonl")}
            todo += [(bench, kind, p) for p in probs if str(p["id"]) not in done]
        chunk = max(1, rcfg.batch_size // k)
        progress = Progress(f"eval {model_name}" + (" (IFEval/BFCL)" if plan == "checked" else ""), unit="problems")
        for start in range(0, len(todo), chunk):
            batch = todo[start:start + chunk]
            # no gold goes into the rollout: grading happens here, by each benchmark's declared answer type
            # streams (seed, plan) x "<benchmark>/<id>#<sample>": a problem's samples do not depend on its batch
            trajs = run_rollouts(model, tok, [{"id": p["id"], "key": f"{bench}/{p['id']}", "problem": p["problem"],
                                               "prompt": p.get("prompt")} for bench, _, p in batch for _ in range(k)],
                                 rcfg, seed=seeds.derive(ev.seed, "evaluate", plan))
            kinds = [kd for _, kd, _ in batch for _ in range(k)]
            answers = [p["answer"] for _, _, p in batch for _ in range(k)]
            checks: list = [None] * len(trajs)
            for kind in set(kinds):
                idx = [i for i, kd in enumerate(kinds) if kd == kind]
                sel, refs = [trajs[i] for i in idx], [answers[i] for i in idx]
                if kind in grading.CHECKERS:
                    for i, c in zip(idx, _check(sel, refs, kind)):
                        checks[i] = c
                else:
                    grade_all(sel, answer_types=[kind] * len(sel), golds=refs)
            for i, (bench, kind, p) in enumerate(batch):
                sl = slice(i * k, (i + 1) * k)
                append_jsonl(out / bench / "per_problem.jsonl",
                             _record(p, kind, trajs[sl], checks[sl] if kind in grading.CHECKERS else None))
            progress(start + len(batch), len(todo))
    shutdown_vllm()  # rollout.engine vllm: the AsyncLLM is done (nothing else when there is none)
    summary = {"model": model_name, "benchmarks": {}}
    for bench, (kind, probs, available) in problems.items():
        ids = {str(p["id"]) for p in probs}
        path = out / bench / "per_problem.jsonl"
        rows = [r for r in read_jsonl(path) if r["id"] in ids] if path.exists() else []
        spec = ev.benchmarks[bench]
        checked = kind in grading.CHECKERS
        entry = summarise(rows, 1 if checked else ev.k)
        if checked and rows:
            entry.update(_checked_summary(kind, rows, spec))
        entry["answer_type"] = kind
        entry["n_available"] = available   # the benchmark's problems; n_problems were evaluated (evaluate.limit)
        if spec.get("paper"):  # optional in a benchmark spec: no default
            entry["paper"] = spec["paper"]
        summary["benchmarks"][bench] = entry
        avg = entry["avg_at_k"]
        print(f"[eval] {model_name} {bench}: {'score' if checked else 'avg@' + str(ev.k)} "
              f"{avg if avg is None else round(avg, 3)} over {len(rows)} problems", flush=True)
    write_json(out / "summary.json", summary)
    write_manifest(out, stage=f"evaluate_{model_name}", params=to_dict(ev), inputs=[model_dir],
                   counts={b: s["n_problems"] for b, s in summary["benchmarks"].items()}, started=t0,
                   extra={"precision": precision.summary(to_dict(ev)),
                          "scheduler": policy_name(ev.rollout.scheduler, ev.rollout.reproducible),
                          "vllm_batch_invariant": enable_batch_invariance(ev.rollout.reproducible, ev.rollout.engine)})
    shutil.rmtree(_resume_dir(out), ignore_errors=True)
    with contextlib.suppress(OSError):  # results/eval/checkpoints itself, once no evaluation has any left
        _resume_dir(out).parent.rmdir()
