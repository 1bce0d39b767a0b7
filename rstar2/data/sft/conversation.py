"""The conversation builder the chat formats share (``messages``, ``sharegpt``): a list of turns in, rStar2
wire-format messages out (paper §4.1 function calling; rstar2/chat.py).

A converter turns a row into ``(kind, value)`` turns: ``system`` (the row's own system text), ``user``,
``assistant`` (a reply), ``call`` (value ``(name, arguments dict)``, or the :class:`Drop` its parsing raised,
re-raised in turn order), ``tool`` (a tool result). An ``assistant`` or ``call`` turn may carry a third element,
its loss weight (:func:`message_weight`): 0 keeps the message in the context and out of the loss (its message gets
``"weight": 0``, which ``chat.encode_conversation`` masks), as the OpenAI fine-tuning format's per-message
``weight``. The rules, in order:

* trailing user turns are cut (nothing to learn from them); system turns must come first;
* a user turn follows the start or an answer; a call follows a user turn or a tool result; a tool result
  follows a call; an answer follows a user turn or a tool result; the conversation ends on an answer
  (``malformed`` otherwise); an empty or non-text turn is ``empty_turn``;
* a call names one of the row's tools (``unknown_function``); its turn is
  ``<reason>..</reason>\\n<tool_call>\\n{"name", "arguments"}\\n</tool_call>``, one call per turn;
* a reply that writes its own call markup is ``inline_call_text``;
* math filter: the user turns of a row without any call, and every reply (worked arithmetic).

Python tool (source key ``python_tool``: the name the data gives its Python tool): its calls become calls of
the rStar2 code tool (``arguments.code``, optional ``input``/``stdin``; ``bad_function_call`` without code)
and its schema in the system prompt becomes ``chat.python_tool_schema``. With ``execute: true`` the code is
run in the sandbox and the tool turn is the real result; drops: ``network_code``, ``nondeterministic_code``
(never run), ``exec_<status>``, ``output_too_long`` (over ``max_tool_chars``), ``output_mismatch`` (the row's
recorded result differs from the real output, so its reply may quote something the model never saw).
"""

from __future__ import annotations

import json

from ... import chat, sandbox
from .common import (R_AFTER_FN, R_AFTER_PY, R_CALL_FN, R_CALL_PY, R_CALL_PY_MORE, R_DIRECT, R_NO_CALL_WITH_TOOLS,
                     Broken, Context, Drop, Pending, answer, assistant, rng, system_prompt)
from .math_filter import MATH_WORKED, math_reason
from .pycalls import NETWORK, NONDETERMINISTIC


def build(turns: list[tuple[str, object]], tools: list[dict], row_id: str, ctx: Context) -> Pending:
    """Messages for one row (module docstring); ``tools`` are bare function schemas (``{"name", ...}``).

    Returns:
        A :class:`Pending` whose jobs are the Python calls to run (none unless ``execute``).
    Raises:
        Drop: a rule above.
    """
    python_tool, execute = ctx.spec.get("python_tool"), bool(ctx.spec.get("execute"))
    pick = rng(ctx.seed, row_id)
    turns = list(turns)
    while turns and turns[-1][0] == "user":
        turns.pop()
    extra = []
    while turns and turns[0][0] == "system":
        extra.append(_text(turns.pop(0)[1]))
    if not turns:
        raise Drop("malformed")
    has_call = any(t[0] == "call" for t in turns)
    offered = _system_tools(tools, turns, python_tool, ctx)
    messages = [{"role": "system", "content": system_prompt(offered, "\n\n".join(extra))}]
    names = {t["name"] for t in tools} | ({python_tool} if python_tool else set())
    jobs, pending = [], []   # pending: (message index, recorded result) per executed call
    last, last_call, python_calls = "system", None, 0   # last: system | user | call | tool | answer
    for kind, value, *weight in turns:
        if kind == "call":
            if isinstance(value, Drop) and value.reason == "empty_turn":
                raise value
            if last not in ("user", "tool"):
                raise Drop("malformed")
            if isinstance(value, Drop):
                raise value
            name, args = value
            if name not in names:
                raise Drop("unknown_function")
            if name == python_tool:
                code, stdin = _python_args(args)
                if execute and (NETWORK.search(code) or NONDETERMINISTIC.search(code)):
                    raise Drop("network_code" if NETWORK.search(code) else "nondeterministic_code")
                why = pick.choice(R_CALL_PY if python_calls == 0 else R_CALL_PY_MORE)
                messages.append(assistant(why, chat.tool_call_text(code, stdin, ctx.tool_name)))
                python_calls += 1
                if execute:
                    jobs.append((code, stdin))
            else:
                payload = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
                messages.append(assistant(pick.choice(R_CALL_FN).format(name=name),
                                          f"<tool_call>\n{payload}\n</tool_call>"))
            _weigh(messages[-1], weight)
            last, last_call = "call", name
            continue
        text = _text(value)
        if kind == "system":
            raise Drop("malformed")
        if kind == "user":
            if last not in ("system", "answer"):
                raise Drop("malformed")
            if not has_call and (r := math_reason(text)):
                raise Drop(r)
            messages.append({"role": "user", "content": text})
            last = "user"
        elif kind == "tool":
            if last != "call":
                raise Drop("malformed")
            if execute and last_call == python_tool:
                pending.append((len(messages), text))
            messages.append({"role": "tool", "content": text})
            last = "tool"
        else:  # assistant reply
            if last not in ("user", "tool"):
                raise Drop("malformed")
            if "<functioncall>" in text or "<tool_call>" in text:
                raise Drop("inline_call_text")
            if MATH_WORKED.search(text):
                raise Drop("math_worked_arithmetic")
            if last == "tool":
                pool = R_AFTER_PY if last_call == python_tool else R_AFTER_FN
            else:
                pool = R_NO_CALL_WITH_TOOLS if offered else R_DIRECT
            messages.append(answer(pick.choice(pool), text))
            _weigh(messages[-1], weight)
            last = "answer"
    if last != "answer" or len(pending) != len(jobs):
        raise Drop("malformed")   # a call without its result, or an executed call whose result is missing
    return Pending(jobs, lambda results: _fill(messages, pending, results, ctx.max_tool_chars))


def message_weight(message: dict, field: str, index: str):
    """A chat message's loss weight: 1 when it has no ``weight`` key, else its value, which must be 0 or 1 (the
    OpenAI fine-tuning format's rule; ``true``/``false`` too).

    Raises:
        Broken: names ``field`` and ``index``.weight and the bad value.
    """
    w = message.get("weight", 1)
    if isinstance(w, bool) or w in (0, 1):
        return int(w)
    raise Broken(field, f"{index}.weight", f"a message weight must be 0 or 1, got {w!r}")


def _weigh(message: dict, weight: list) -> None:
    """Mark ``message`` context-only when its turn's weight (``weight``: [] or [w]) is 0."""
    if weight and weight[0] == 0:
        message["weight"] = 0


def _text(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Drop("empty_turn")
    return value


def _system_tools(tools: list[dict], turns: list, python_tool: str | None, ctx: Context) -> list[dict]:
    """The system prompt's tool list: the row's tools, the Python one replaced by the rStar2 code tool (added
    when the row calls it without listing it)."""
    out = [chat.python_tool_schema(ctx.tool_name) if python_tool and t["name"] == python_tool
           else {"type": "function", "function": t} for t in tools]
    calls_python = any(t[0] == "call" and isinstance(t[1], tuple) and t[1][0] == python_tool for t in turns)
    if python_tool and calls_python and all(t["name"] != python_tool for t in tools):
        out.append(chat.python_tool_schema(ctx.tool_name))
    return out


def _python_args(args: dict) -> tuple[str, str]:
    code, stdin = args.get("code"), args.get("input", args.get("stdin")) or ""
    if not isinstance(code, str) or not code.strip() or not isinstance(stdin, str):
        raise Drop("bad_function_call")
    return code, stdin


def _fill(messages: list[dict], pending: list[tuple[int, str]], results: list, max_chars: int) -> list[dict]:
    """Put the real results of the executed calls into their tool turns (module docstring for the drops)."""
    out = [dict(m) for m in messages]
    for (i, recorded), r in zip(pending, results, strict=True):
        if r.status != "ok":
            raise Drop(f"exec_{r.status.replace('-', '_')}")
        shown = sandbox.render_result(r, max_chars)
        if shown != r.stdout.rstrip("\n"):
            raise Drop("output_too_long")
        if recorded.strip() != r.stdout.strip():
            raise Drop("output_mismatch")
        out[i]["content"] = shown
    return out
