"""Format ``sharegpt``: ShareGPT / glaive function calling (``conversations`` of ``{from, value}`` turns, a
``tools`` JSON list), as LLaMA-Factory, glaive-function-calling-v2, APIGen-MT and ToolACE write it (paper §4.1).

Fields: ``conversations`` (required), ``tools`` (optional: a JSON string or a list of function schemas, bare
or as ``{"type": "function", "function": ...}``), ``system`` (optional: the row's system text, kept after the
rStar2 system prompt). Roles (``from``): human/user, gpt/assistant, function_call, observation/tool/function,
system; any other is an error naming the row and turn. A ``function_call`` value is ``{"name", "arguments"}``
(JSON text or an object; ``arguments`` may itself be JSON text).

Source options: ``calls: python`` reads assistant turns written as ``[name(key=value, ...)]`` (ToolACE) as
calls (more than one call in a turn is ``parallel_calls``: a single observation answers them all, which one
call per turn cannot express); ``tools_from_system: true`` takes the tools from the JSON list inside the system
text and drops that text (ToolACE's describes its own call syntax). Conversion and drops:
:mod:`rstar2.data.sft.conversation`; also ``bad_tools`` and ``bad_function_call``. A gpt or function_call turn's
``"weight": 0`` (the OpenAI fine-tuning format's per-message weight, as axolotl's ShareGPT datasets take it) keeps
it in the context and out of the loss.
"""

from __future__ import annotations

import json

from .common import Broken, Context, Drop, Pending
from .conversation import build, message_weight
from .pycalls import parse_call_list

FIELDS = {"conversations": True, "tools": False, "system": False}   # role -> required
EXECUTES = False   # rows record their tool results; execute (with python_tool) re-runs Python calls
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "function_call": "call",
         "observation": "tool", "tool": "tool", "function": "tool", "system": "system"}


def convert(values: dict, row_id: str, ctx: Context) -> Pending:
    """One ShareGPT row -> rStar2 messages (module docstring).

    Raises:
        Drop: a counted reason. Broken: ``conversations`` is not a list of ``{from, value}`` objects, or a turn
            has an unknown role.
    """
    conv = values["conversations"]
    if not isinstance(conv, list):
        raise Broken("conversations", "", f"expected a list of {{from, value}} turns, got {type(conv).__name__}")
    tools = function_schemas(values.get("tools"))
    system = values.get("system")
    if ctx.spec.get("tools_from_system"):
        tools, system = tools or tools_in_text(system), None
    turns: list[tuple[str, object]] = [("system", system)] if isinstance(system, str) and system.strip() else []
    python_syntax = ctx.spec.get("calls") == "python"
    for k, t in enumerate(conv):
        if not isinstance(t, dict) or "from" not in t:
            raise Broken("conversations", str(k), "expected an object with 'from' and 'value'")
        kind = ROLES.get(str(t["from"]).strip().lower())
        if kind is None:
            raise Broken("conversations", f"{k}.from", f"unknown role {t['from']!r}; expected one of {sorted(ROLES)}")
        value = t.get("value")
        weight = [message_weight(t, "conversations", str(k))] if kind in ("call", "assistant") else []
        if kind == "call":
            turns.append(("call", json_call(value), *weight))
        elif kind == "assistant" and python_syntax and isinstance(value, str):
            turns += [(*turn, *weight) for turn in _python_calls(value)]
        else:
            turns.append((kind, value, *weight))
    return build(turns, tools, row_id, ctx)


def function_schemas(value) -> list[dict]:
    """A row's tools as bare function schemas (each with a ``name``); [] for none.

    Raises:
        Drop: ``bad_tools`` (not JSON, not a list of schemas with names).
    """
    if value is None or value == "":
        return []
    try:
        tools = json.loads(value) if isinstance(value, str) else value
        if not isinstance(tools, list):
            raise ValueError
        tools = [t["function"] if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
                 for t in tools]
        if not all(isinstance(t, dict) and "name" in t for t in tools):
            raise ValueError
    except (ValueError, TypeError):
        raise Drop("bad_tools")
    return tools


def json_call(value) -> tuple[str, dict] | Drop:
    """``(name, arguments)`` from a ``{"name", "arguments"}`` call (text or object), or the :class:`Drop` to
    raise in turn order (``empty_turn``, ``bad_function_call``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return Drop("empty_turn")
    try:
        obj = json.loads(value) if isinstance(value, str) else value
        args = obj["arguments"]
        if isinstance(args, str):
            args = json.loads(args)
        if not isinstance(args, dict):
            raise ValueError
    except (ValueError, TypeError, KeyError):
        return Drop("bad_function_call")
    return obj.get("name"), args


def tools_in_text(text) -> list[dict]:
    """The first JSON list of function schemas inside ``text`` (ToolACE's system prompt); [] if none."""
    decoder = json.JSONDecoder()
    pos = 0
    while isinstance(text, str) and (pos := text.find("[", pos)) >= 0:
        try:
            found, _ = decoder.raw_decode(text, pos)
            if found and isinstance(found, list) and all(isinstance(t, dict) and "name" in t for t in found):
                return found
        except ValueError:
            pass
        pos += 1
    return []


def _python_calls(value: str) -> list[tuple[str, object]]:
    try:
        calls = parse_call_list(value)
    except (ValueError, SyntaxError):
        return [("call", Drop("bad_function_call"))]
    if calls is None:
        return [("assistant", value)]
    return [("call", calls[0] if len(calls) == 1 else Drop("parallel_calls"))]
