"""Sample trajectories rendered readably: the problem, each turn's reasoning, the code it ran, the tool output,
and the final answer against the gold. Sources: evaluation per-problem records (``sample``) and the last RL step
of each stage's ``rollouts.jsonl`` (record schema: rstar2.rollout.Trajectory.record)."""

from __future__ import annotations

import re
from pathlib import Path

from .document import Code, Heading, Para
from .inputs import iter_json_lines, num

#: Characters of one text shown before it is cut (the rest is counted, not shown).
MAX_CHARS = 3000
#: Records of the last RL step kept in memory while streaming a rollouts.jsonl.
_KEEP_PER_STEP = 256

_TOOL_CALL_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit:,} more characters not shown)"


def written(answer) -> str:
    """An answer or gold as written (``\\frac{2}{3}``, not its Python repr with doubled backslashes); ``none``
    for no answer, ``""`` for an empty one."""
    if answer is None:
        return "none"
    return str(answer) if str(answer) else '""'


def pick(records: list[dict], n: int) -> list[dict]:
    """Up to ``n`` varied records, deterministically: first a correct one, one that called the tool, one that
    was wrong, one kept by RoC, then the rest in file order."""
    if n <= 0:
        return []
    wants = [lambda r: (num(r.get("reward")) or 0) > 0,
             lambda r: any(t.get("tool_calls") for t in r.get("turns") or []),
             lambda r: (num(r.get("reward")) or 0) <= 0,
             lambda r: r.get("kept") is True]
    chosen: list[int] = []
    for want in wants:
        i = next((i for i, r in enumerate(records) if i not in chosen and want(r)), None)
        if i is not None and len(chosen) < n:
            chosen.append(i)
    chosen += [i for i in range(len(records)) if i not in chosen][: n - len(chosen)]
    return [records[i] for i in sorted(chosen)]


def _well_formed(rec: dict, path: Path, notes: list[str]) -> bool:
    """A record whose ``turns`` is a list of objects, each with a list of tool-call objects (else a note)."""
    turns = rec.get("turns") or []
    ok = isinstance(turns, list) and all(
        isinstance(t, dict) and isinstance(t.get("tool_calls") or [], list)
        and all(isinstance(c, dict) for c in t.get("tool_calls") or []) for t in turns)
    if not ok:
        notes.append(f"{path}: a record of problem {rec.get('problem_id', rec.get('id'))!r} has malformed turns, "
                     "not shown")
    return ok


def eval_samples(eval_dir: Path, notes: list[str]) -> list[tuple[str, dict]]:
    """``[(benchmark, rollout record)]`` from ``<eval_dir>/<bench>/per_problem.jsonl``, benchmarks in name order."""
    out = []
    for path in sorted(Path(eval_dir).glob("*/per_problem.jsonl")):
        for row in iter_json_lines(path, notes):
            if isinstance(row.get("sample"), dict) and _well_formed(row["sample"], path, notes):
                out.append((path.parent.name, row["sample"]))
    return out


def last_step_rollouts(path: Path, notes: list[str]) -> list[dict]:
    """Records of the last step in an RL ``rollouts.jsonl`` (streamed: the file holds every step)."""
    last_step, kept = None, []
    for r in iter_json_lines(path, notes):
        step = num(r.get("step"))
        if step is None or not _well_formed(r, path, notes):
            continue
        if last_step is None or step > last_step:
            last_step, kept = step, []
        if step == last_step and len(kept) < _KEEP_PER_STEP:
            kept.append(r)
    return kept


def render(title: str, rec: dict) -> list:
    """Document blocks for one rollout record."""
    turns = rec.get("turns") or []
    calls = sum(len(t.get("tool_calls") or []) for t in turns)
    reward = num(rec.get("reward"))
    facts = [f"reward {reward:g}" if reward is not None else "reward –",
             f"answer {written(rec.get('pred'))}", f"gold {written(rec.get('gold'))}",
             f"finish: {rec.get('finish_reason') or '–'}", f"{len(turns)} turns", f"{calls} tool calls"]
    if rec.get("response_tokens") is not None:
        facts.append(f"{rec['response_tokens']} response tokens")
    if "kept" in rec:
        facts.append("kept by RoC" if rec["kept"] else "not kept")
    blocks: list = [Heading(title, 4), Para(" · ".join(facts)),
                    Code(_cut(rec.get("question") or ""), label="problem")]
    for i, turn in enumerate(turns, 1):
        text = (turn.get("text") or "").strip()
        if any(c.get("code") is not None for c in turn.get("tool_calls") or []):
            # The executed code is shown below; a call that was cut off or failed to parse stays in the raw text.
            text = _TOOL_CALL_RE.sub("[tool call: code below]", text)
        blocks.append(Code(_cut(text) or "(empty)", label=f"turn {i}: model"))
        for j, call in enumerate(turn.get("tool_calls") or [], 1):
            status = call.get("status") or "?"
            if call.get("code") is not None:
                blocks.append(Code(_cut(call["code"]), "python", label=f"turn {i}, tool call {j}: code"))
            blocks.append(Code(_cut(str(call.get("output") or "")) or "(no output)",
                               label=f"turn {i}, tool call {j}: output ({status})"))
    blocks.append(Para(f"Final answer: {written(rec.get('pred'))} (gold {written(rec.get('gold'))}) → reward "
                       f"{reward if reward is not None else '–'}"))
    return blocks


def section(eval_dirs: dict[str, Path], stage_dirs: dict[str, Path], per_source: int,
            notes: list[str]) -> tuple[list, int]:
    """Blocks for the sample-trajectory page and how many trajectories it shows: ``per_source`` samples per
    evaluated model and per RL stage (from its last step)."""
    blocks: list = []
    shown = 0
    for model, d in eval_dirs.items():
        samples = eval_samples(d, notes)
        chosen = pick([rec for _, rec in samples], per_source)
        if not chosen:
            continue
        bench_of = {id(rec): b for b, rec in samples}
        blocks.append(Heading(f"Evaluation: {model}", 2))
        for rec in chosen:
            blocks += render(f"{model} · {bench_of[id(rec)]} · {rec.get('problem_id')}", rec)
            shown += 1
    for stage, d in stage_dirs.items():
        recs = last_step_rollouts(Path(d) / "rollouts.jsonl", notes)
        chosen = pick(recs, per_source)
        if not chosen:
            continue
        blocks.append(Heading(f"RL {stage}, step {chosen[0].get('step')}", 2))
        for rec in chosen:
            blocks += render(f"{stage} · step {rec.get('step')} · {rec.get('problem_id')}", rec)
            shown += 1
    if not blocks:
        blocks.append(Para("Sample trajectories: no data."))
    return blocks, shown
