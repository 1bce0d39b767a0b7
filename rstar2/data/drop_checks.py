"""No silent drops: what a source loses to its answer-type filter is an error above a small share, a warning below.

The curation funnel's answer-type step (``integer_answer``, rstar2/data/curate.py) drops the rows whose gold the
source's ``answer_type`` cannot grade: with the default ``integer``, every fraction, radical, decimal or expression.
That is the paper's curation for integer pools (the bundled MATH pool loses a third of its rows to it on purpose),
and the classic mistake with one's own data: forgetting ``answer_type: math`` trains on the few integer rows left.
So a source that loses more than its share (``rl_data.max_filtered_share``: a number, or ``{default: share,
<source name>: share}``) stops the workflow before any job, in one line naming the source, the count, what was
seen and the fix; a smaller loss is a warning line. Either way every dropped row is listed with its reason in the
stage's ``dropped.jsonl``.
"""

from __future__ import annotations

#: Drop reasons of the answer-type step (rstar2/data/curate.py ``keep_integer_answers``).
ANSWER_FILTER_REASONS = ("no_problem", "no_answer", "tuple_or_list", "non_integer_number", "not_a_number",
                         "too_large", "unusable_gold")
DEFAULT_SHARE = 0.05


def share_for(name: str, shares) -> float:
    """The share of its rows source ``name`` may lose: ``shares`` is a number, or a mapping by source name with a
    ``default`` (names that are no source are unused: config.yaml's bundled pools, where a user's sources replace
    them)."""
    if isinstance(shares, dict):
        return float(shares.get(name, shares.get("default", DEFAULT_SHARE)))
    return float(shares)


def filter_losses(funnel: dict, source: str) -> tuple[int, int, dict[str, int]]:
    """(rows dropped by the answer-type step, rows loaded, {reason: count}) of one source in a funnel."""
    per = funnel["per_source"].get(source) or {}
    reasons = {r: n for r, n in (funnel.get("drops_per_source", {}).get(source) or {}).items()
               if r in ANSWER_FILTER_REASONS and n}
    return sum(reasons.values()), int(per.get("loaded", 0)), reasons


def _seen(funnel: dict, source: str, reasons: dict[str, int]) -> str:
    examples = (funnel.get("drop_examples") or {}).get(source) or {}
    parts = []
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        shown = ", ".join(f'"{g}"' for g in examples.get(reason, []) if g is not None)   # as written: no escapes
        parts.append(f"{reason}={n}" + (f" (e.g. {shown})" if shown else ""))
    return ", ".join(parts)


def _fix(name: str, answer_type: str) -> str:
    if answer_type == "integer":
        return (f"if these golds are right, set answer_type: math on this source (graded exactly, then with "
                f"Math-Verify); to train on its integer rows only, set rl_data.max_filtered_share: {{{name}: 1.0}}")
    return (f"check these golds against answer_type {answer_type!r}, or set rl_data.max_filtered_share: "
            f"{{{name}: 1.0}} to train without them")


def check_answer_filter(funnel: dict, sources: list[dict], shares, where: str = "rl_data",
                        index: int = 0) -> list[str]:
    """Refuse a source that loses more than its share of rows to the answer-type filter; warn about a smaller loss.

    Args:
        funnel: a funnel from ``rstar2.data.curate.curate`` over ``sources``.
        sources: the specs (``name``, optional ``answer_type``, default integer), in config order.
        shares: ``rl_data.max_filtered_share`` (``share_for``).
        where: what the messages start with (``config`` at DAG time, ``rl_data`` in the stage).
        index: the position of ``sources[0]`` in ``rl_data.sources`` (the messages name ``rl_data.sources[i]``).
    Returns:
        One warning line per source that lost rows within its share.
    Raises:
        ValueError: one line: the source (index and name), the count and share, the reasons with example golds
            as read, and the fix (``answer_type``, or the share).
    """
    warnings = []
    for i, spec in enumerate(sources, index):
        name, kind = spec["name"], spec.get("answer_type") or "integer"
        lost, loaded, reasons = filter_losses(funnel, name)
        if not lost:
            continue
        limit = share_for(name, shares)
        what = (f"{where}: rl_data.sources[{i}] ({name}): the {kind} answer filter (answer_type {kind!r}) drops "
                f"{lost} of {loaded} rows ({lost / loaded:.1%}): {_seen(funnel, name, reasons)}")
        if lost > limit * loaded:
            raise ValueError(f"{what}; above rl_data.max_filtered_share ({limit:g}): {_fix(name, kind)}")
        warnings.append(f"warning: {what}; within rl_data.max_filtered_share ({limit:g}); each dropped row is "
                        "listed in results/rl_candidates/dropped.jsonl")
    return warnings
