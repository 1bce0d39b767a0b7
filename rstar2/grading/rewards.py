"""The reward registry (``rl.reward``): a built-in name or a user function ``module:function``.

The built-in ``answer`` is the paper's binary answer reward (§2.2, Eq. 3): 1.0 when the final answer of the
model's last turn is equivalent to the gold under the row's ``answer_type``, else 0.0
(:func:`rstar2.grading.score_trajectory`). A user reward, as TRL's and open-r1's reward functions are plain
callables, is a function

    fn(completion: str, answer: str, answer_type: str) -> float | {"reward": float, "pred": str | None}

called with the model's final assistant turn (tool calls and responses removed, as for the built-in), the row's
gold and its answer type. It runs inside the grading workers (``rstar2.grading_pool``, kind ``reward``) under the
same per-item deadline; a timeout, exception or non-finite value scores 0.0 (counted per RL step:
``grading_timeouts``, ``reward_errors``; rl/fault_accounting.py stops a stage whose user reward fails on every
answer of a step). GRPO-RoC sees the returned value as the trajectory's reward (> 0 is a positive,
rstar2/rl/roc.py), exactly as it sees the built-in's. ``module`` is imported with the working directory first on
``sys.path``, so a ``my_rewards.py`` in the run folder works (and wins over an installed module of that name). The workflow checks the setting when it builds the DAG (:func:`check`), and the RL stage again
before it trains. Hard-problem mining and the held-out evaluation keep the answer reward (they measure solving).
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
import sys

#: Built-in rewards by name.
BUILTIN = {"answer": "the paper's binary answer reward (§2.2): 1 if the final answer equals the gold, else 0"}
_LOADED: dict = {}


def load(spec: str, search_dir: str | None = None):
    """The callable ``spec`` names (``"module:function"``); cached per process. ``search_dir`` (default: the
    working directory) is put on ``sys.path`` first, so a module in the run folder is found (grading workers pass
    the caller's working directory, since theirs is the one their pool started in).

    Raises:
        ValueError: ``spec`` is not ``module:function``, the module cannot be imported, or the attribute is
            missing or not callable (one line naming ``rl.reward``).
    """
    if spec in _LOADED:
        return _LOADED[spec]
    module, sep, name = str(spec).partition(":")
    if not sep or not module or not name:
        raise ValueError(f"rl.reward {spec!r}: expected a built-in ({', '.join(BUILTIN)}) or 'module:function'")
    where = search_dir or os.getcwd()
    if where not in sys.path:   # first, as documented: the run folder's module wins over an installed one
        sys.path.insert(0, where)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # an import error inside the user's module is also a bad setting
        raise ValueError(f"rl.reward {spec!r}: module {module!r} cannot be imported "
                         f"({type(e).__name__}: {e})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"rl.reward {spec!r}: module {module!r} has no function {name!r}")
    _LOADED[spec] = fn
    return fn


def _as_result(value, spec: str) -> tuple[float, str | None]:
    """(reward, pred) from a user reward's return value.

    Raises:
        ValueError: not a finite real number (Python, numpy or bool), nor a dict with one under ``reward``.
    """
    pred = None
    if isinstance(value, dict):
        pred, value = value.get("pred"), value.get("reward")
    if not isinstance(value, numbers.Real) or not math.isfinite(value):   # numpy scalars and bools are Real
        raise ValueError(f"rl.reward {spec!r}: returned {value!r}, not a finite number "
                         "(or a dict with a finite 'reward')")
    return float(value), pred


def score(spec: str, final_turn: str, gold: str, answer_type: str, search_dir: str | None = None) -> dict:
    """``{"pred", "reward"}`` of one trajectory under reward ``spec`` (a built-in name or ``module:function``).

    The built-in never raises for a bad gold (reward 0 with an ``error``, as ``score_trajectory(on_bad_gold=
    "zero")``); a user reward's exception or bad value gives reward 0.0 with an ``error`` entry.
    """
    from . import extract_final_answer, final_turn_text, score_trajectory

    if spec == "answer":
        return score_trajectory(final_turn, gold, on_bad_gold="zero", answer_type=answer_type)
    try:
        fn = load(spec, search_dir)
        reward, pred = _as_result(fn(final_turn_text(final_turn), gold, answer_type), spec)
    except Exception as e:
        return {"pred": extract_final_answer(final_turn), "reward": 0.0, "error": f"{type(e).__name__}: {e}"}
    return {"pred": pred if pred is not None else extract_final_answer(final_turn), "reward": reward}


def check(spec: str, row: dict | None) -> None:
    """Check ``rl.reward`` before any job runs: a built-in, or a function that takes ``(completion, answer,
    answer_type)`` and, called once on ``row`` (``{"answer", "answer_type"}``; a boxed copy of its gold as the
    completion), returns a finite number. ``row`` None: the dry call is skipped (no local row to call it on).

    Raises:
        ValueError: one line naming ``rl.reward`` and what is wrong (import, signature, exception, return value).
    """
    if spec in BUILTIN:
        return
    fn = load(spec)
    try:
        inspect.signature(fn).bind("completion", "answer", "integer")
    except TypeError as e:
        raise ValueError(f"rl.reward {spec!r}: must accept (completion, answer, answer_type): {e}") from None
    except ValueError:  # a builtin without a signature: the dry call decides
        pass
    if row is None:
        return
    from . import final_turn_text

    kind = row.get("answer_type") or "integer"
    completion = final_turn_text(f"The answer is computed.</reason>\n<answer>\\boxed{{{row['answer']}}}</answer>")
    try:
        value = fn(completion, str(row["answer"]), kind)
    except Exception as e:
        raise ValueError(f"rl.reward {spec!r}: the dry call on row {row.get('id')!r} raised "
                         f"{type(e).__name__}: {e}") from None
    _as_result(value, spec)
