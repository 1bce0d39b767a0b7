"""BFCL (Berkeley Function Calling Leaderboard; paper Table 5, §5.1) checked by the Berkeley AST checker.

The model answers in our wire format: the functions in the system prompt as the rStar2 template lists tools
(rstar2.data.bfcl), each call a ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block. The
conversion to what the checker expects is ours (:func:`decode`): every block outside reasoning, in order,
becomes ``{name: arguments}`` (``arguments`` may be a JSON string of an object, as in the code tool), which
is the decoded form BFCL's own Qwen function-calling handler produces from the same tags. A block that is not
such an object makes the whole response undecodable, as a failed ``decode_ast`` is in BFCL.

Scores come from ``bfcl-eval`` 2026.3.23's code, called as its ``eval_runner`` calls it:

* ``irrelevance``: correct when the response decodes to no call (``bfcl_eval.utils.is_empty_output``) or
  does not decode at all;
* every other category: undecodable or not in call format (``is_function_calling_format_output``) is wrong;
  else ``ast_checker(functions, decoded, ground_truth, Language.PYTHON, category, model)``: the simple,
  multiple, parallel (order-free) and parallel-multiple checkers with BFCL's type and value rules.

``bfcl-eval`` is installed ``--no-deps`` (its hard pins, e.g. numpy 1.26.4, conflict with ours, and its
model-API clients are not needed). The AST checker module imports ``bfcl_eval.constants.model_config``,
which imports every model handler (openai, anthropic, ...), only to read a per-model ``underscore_to_dot``
flag when a function name has a dot; :func:`checker` installs a stand-in for that one module whose flag is
False for every model (we keep dotted names as written in the prompt), before importing the checker.
"""

from __future__ import annotations

import json
import sys
import types
from collections import defaultdict
from functools import lru_cache

from .. import chat

#: The model name BFCL's checker is given (it only looks it up for ``underscore_to_dot``).
MODEL_NAME = "rstar2"
#: The categories this module checks: BFCL's single-turn Python AST categories and irrelevance.
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")


class _ModelConfig:
    underscore_to_dot = False   # dotted function names stay dotted: the prompt shows them so


@lru_cache(maxsize=1)
def checker() -> types.SimpleNamespace:
    """``ast_checker``, ``Language``, ``is_empty_output`` and ``is_function_calling_format_output`` from
    bfcl-eval (module docstring for the one stand-in module)."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.MODEL_CONFIG_MAPPING = defaultdict(_ModelConfig)
        sys.modules[name] = stub
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    return types.SimpleNamespace(ast_checker=ast_checker, Language=Language, is_empty_output=is_empty_output,
                                 is_function_calling_format_output=is_function_calling_format_output)


def decode(final_turn: str) -> list[dict]:
    """The calls of a response in BFCL's decoded form ``[{name: {arg: value}}, ...]`` (``[]``: no call).

    Raises:
        ValueError: a ``<tool_call>`` block is not one JSON object with a string ``name`` and an object
            ``arguments`` (or a JSON string of one): the response does not decode, as in BFCL.
    """
    calls = []
    for obj in chat.scan_tool_calls(final_turn or ""):
        if isinstance(obj, ValueError):
            raise obj
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
            raise ValueError("a tool call needs a string 'name' and 'arguments'")
        args = obj["arguments"]
        if isinstance(args, str):
            args = json.loads(args, strict=False)
        if not isinstance(args, dict):
            raise ValueError("'arguments' must be a JSON object")
        calls.append({obj["name"]: args})
    return calls


def check_reference(reference: dict) -> None:
    """Raise ``ValueError`` for a category this module does not check or a missing ground truth."""
    if reference["category"] not in CATEGORIES:
        raise ValueError(f"BFCL category {reference['category']!r} is not checked here; checked: {CATEGORIES}")
    if reference["category"] != "irrelevance" and not reference.get("ground_truth"):
        raise ValueError(f"BFCL {reference['category']} question without ground truth")
    checker()


def summarise(results: list[dict], categories: list[str]) -> dict:
    """BFCL accuracies (fractions in [0, 1]): per category (``by_category``: {category: {"n", "accuracy"}}) and
    their unweighted mean ``accuracy``, as BFCL averages its subcategories; None where there is no result.

    Args:
        results: one ``{"category", "valid"}`` per question.
        categories: the categories evaluated, in report order.
    """
    by = {}
    for c in categories:
        vals = [float(r["valid"]) for r in results if r["category"] == c]
        by[c] = {"n": len(vals), "accuracy": sum(vals) / len(vals) if vals else None}
    accs = [v["accuracy"] for v in by.values() if v["accuracy"] is not None]
    return {"accuracy": sum(accs) / len(accs) if accs else None, "by_category": by}


def check(final_turn: str, reference: dict) -> dict:
    """BFCL's verdict for one response.

    Args:
        final_turn: the model's (single) turn.
        reference: ``{"category", "functions": BFCL function docs, "ground_truth": BFCL possible answers
            (None for irrelevance)}`` (rstar2.data.bfcl).
    Returns:
        ``{"valid": bool, "error_type": str | None, "decoded": [...] | None}``; ``error_type`` is BFCL's.
    Raises:
        ValueError: an unknown category (a data error).
    """
    category = reference["category"]
    if category not in CATEGORIES:
        raise ValueError(f"BFCL category {category!r} is not checked here; checked: {CATEGORIES}")
    bfcl = checker()
    try:
        decoded = decode(final_turn)
    except (ValueError, TypeError) as e:
        if category == "irrelevance":
            return {"valid": True, "error_type": None, "decoded": None}
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "decoded": None, "error": str(e)}
    if category == "irrelevance":
        ok = bool(bfcl.is_empty_output(decoded))
        return {"valid": ok, "error_type": None if ok else "irrelevance_error:decoder_success", "decoded": decoded}
    if not bfcl.is_function_calling_format_output(decoded):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format", "decoded": decoded}
    out = bfcl.ast_checker(reference["functions"], decoded, reference["ground_truth"], bfcl.Language.PYTHON,
                           category, MODEL_NAME)
    ok = bool(out["valid"])
    return {"valid": ok, "error_type": None if ok else out.get("error_type"), "decoded": decoded}
