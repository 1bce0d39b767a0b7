"""Format ``messages``: OpenAI chat messages with ``tools`` and ``tool_calls`` (Tulu 3, most recent SFT sets;
paper §4.1).

Fields: ``messages`` (required: a list of ``{"role", "content"}``, as a list or JSON text), ``tools`` (optional:
OpenAI tool schemas ``{"type": "function", "function": {...}}`` or bare function schemas, as a list or JSON
text). Roles: system (its text is kept after the rStar2 system prompt), user, assistant, tool (``function``, the
legacy name, too); any other, or a message that is not an object with a role, is an error naming the row and
message. ``content`` may be text, null (an assistant message that only calls) or a list of ``{"type": "text",
"text"}`` parts.

An assistant message's ``tool_calls`` (``{"id", "function": {"name", "arguments"}}``, arguments as JSON text
or an object; the legacy ``function_call`` too) become one call turn each, its text is not kept. The tool
messages after it are paired with the calls (by ``tool_call_id`` when every one has it, else in order), so
two parallel calls become call, result, call, result: one call per turn, as in RL. A count that does not
match leaves the order broken (``malformed``). Conversion and drops: :mod:`rstar2.data.sft.conversation`;
also ``bad_tools`` and ``bad_function_call``. An assistant message's ``"weight": 0`` (OpenAI fine-tuning format)
keeps it, and each call turn it makes, in the context and out of the loss; 1 or absent trains on it.
"""

from __future__ import annotations

import json
from collections import Counter

from .common import Broken, Context, Drop, Pending
from .conversation import build, message_weight
from .sharegpt import function_schemas

FIELDS = {"messages": True, "tools": False}   # role -> required
EXECUTES = False   # rows record their tool results; execute (with python_tool) re-runs Python calls
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "function": "tool"}


def convert(values: dict, row_id: str, ctx: Context) -> Pending:
    """One row of OpenAI messages -> rStar2 messages (module docstring).

    Raises:
        Drop: a counted reason. Broken: ``messages`` is not a list of messages with known roles.
    """
    msgs = values["messages"]
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except ValueError as e:
            raise Broken("messages", "", f"not valid JSON: {e}") from None
    if not isinstance(msgs, list):
        raise Broken("messages", "", f"expected a list of {{role, content}} messages, got {type(msgs).__name__}")
    tools = function_schemas(values.get("tools"))
    turns: list[tuple[str, object]] = []
    k = 0
    while k < len(msgs):
        m = msgs[k]
        if not isinstance(m, dict) or "role" not in m:
            raise Broken("messages", str(k), "expected an object with 'role' and 'content'")
        kind = ROLES.get(str(m["role"]).strip().lower())
        if kind is None:
            raise Broken("messages", f"{k}.role", f"unknown role {m['role']!r}; expected one of {sorted(ROLES)}")
        calls = _calls(m, k) if kind == "assistant" else []
        weight = [message_weight(m, "messages", str(k))] if kind == "assistant" else []
        if not calls:
            turns.append((kind, _content(m, k), *weight))
            k += 1
            continue
        results = []   # (index, message) of the tool messages that follow
        k += 1
        while k < len(msgs) and isinstance(msgs[k], dict) and ROLES.get(str(msgs[k].get("role")).lower()) == "tool":
            results.append((k, msgs[k]))
            k += 1
        if len(results) == len(calls):
            ids = [c[0] for c in calls]
            if None not in ids and Counter(ids) == Counter(r.get("tool_call_id") for _, r in results):
                results.sort(key=lambda ir: ids.index(ir[1].get("tool_call_id")))
            for (_, call), (i, r) in zip(calls, results):
                turns += [("call", call, *weight), ("tool", _content(r, i))]
        else:
            turns += [("call", call, *weight) for _, call in calls] + [("tool", _content(r, i)) for i, r in results]
    return build(turns, tools, row_id, ctx)


def _content(m: dict, k: int):
    """A message's text; list-of-parts content joined; None stays None (an empty turn)."""
    c = m.get("content")
    if isinstance(c, list):
        if not all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in c):
            raise Broken("messages", f"{k}.content", "a list of content parts must hold {type, text} objects")
        return "".join(p.get("text", "") for p in c)
    if c is not None and not isinstance(c, str):
        raise Broken("messages", f"{k}.content", f"expected text, got {type(c).__name__}")
    return c


def _calls(m: dict, k: int) -> list[tuple[str | None, object]]:
    """``[(tool_call_id, (name, arguments) or Drop)]`` of an assistant message."""
    raw = m.get("tool_calls")
    if raw is None and isinstance(m.get("function_call"), dict):
        raw = [{"function": m["function_call"]}]
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise Broken("messages", f"{k}.tool_calls", f"expected a list, got {type(raw).__name__}")
    out = []
    for c in raw:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise Broken("messages", f"{k}.tool_calls", "each call needs a 'function' object with name and arguments")
        out.append((c.get("id"), _call(fn)))
    return out


def _call(fn: dict):
    try:
        args = fn.get("arguments")
        args = json.loads(args) if isinstance(args, str) else args
        if not isinstance(args, dict):
            raise ValueError
    except ValueError:
        return Drop("bad_function_call")
    return fn.get("name"), args
