"""Format ``toolformer``: GPTeacher Toolformer rows whose inline ``python('...')`` calls become real calls of
the rStar2 code tool, with tool responses from really running the code in the sandbox (paper §4.1 basic
coding-tool use). The rows record no tool output, so the source must set ``execute: true``.

Fields: ``instruction`` (required; "toolformer: enabled\\ntoolformer access: <tools>\\n<description>\\n<signature>
...\\n<task>", a description and a signature line per tool), ``input`` (optional, appended to the task after
a blank line), ``response`` (required; text with inline calls).

Conversion: system = the python tool offered; user = the task; one assistant call turn and one tool turn per
inline call (exactly one call per turn: the RL loop runs only a turn's first call); the final answer
is the response with each call replaced by its real output (a ``repr``'d string shown unquoted; multi-line
output in a fenced block; for "write code" tasks the code too, then its output). Code using ``math.`` and
friends without importing them gets the import prepended; the tool call shows the code exactly as it ran.

Drops: ``bad_instruction``, ``no_python_access``, ``other_tool_call`` (calls to another Toolformer tool),
``unparsable_python_call``, ``no_python_call``, ``network_code``, ``nondeterministic_code``, a failed run
(``exec_error``, ``exec_timeout``, ...), ``empty_output`` (e.g. ``def f(): return 1; f()``), ``useless_output``
(a bare object repr such as ``<function f at 0x..>``), and ``output_too_long`` (longer than ``max_tool_chars``:
the answer would quote text the model never saw). No math filter: as in the chat formats, a row that calls a
tool is exempt from the prompt rule, and every Toolformer row calls one (computing with the code tool is what
these rows teach; the prompt rule would drop 81% of the bundled file's kept rows); the reply quotes the tool's
output, so the worked-arithmetic rule does not apply either.
"""

from __future__ import annotations

import ast
import re

from ... import chat, sandbox
from .common import R_AFTER_PY, R_CALL_PY, R_CALL_PY_MORE, Broken, Context, Drop, Pending, answer, assistant, rng
from .pycalls import NETWORK, NONDETERMINISTIC, USELESS, add_missing_imports, find_python_calls

FIELDS = {"instruction": True, "input": False, "response": True}   # role -> required
EXECUTES = True   # the rows hold no tool output: execute must be on

CODE_TASK = re.compile(r"\b(?:write|create|provide|show|give|generate|implement)\b[^.]*"
                       r"\b(?:code|snippet|script|program|function)\b", re.I)
CODE_PREFIX = re.compile(r"\b(?:code|snippet|script|program)\b[^.\n]*:\s*$", re.I)


def convert(values: dict, row_id: str, ctx: Context) -> Pending:
    """One Toolformer row -> a :class:`Pending` with one sandbox job per inline call (module docstring).

    Raises:
        Drop: see the module docstring. Broken: ``instruction`` or ``response`` is not text.
    """
    instruction, response = values["instruction"], values["response"] or ""
    for role, value in (("instruction", instruction), ("response", response)):
        if not isinstance(value, str):
            raise Broken(role, "", f"expected text, got {type(value).__name__}")
    tools, task = _parts(instruction)
    if "python" not in tools:
        raise Drop("no_python_access")
    if "_x_ToolPartResult" in response or any(
            re.search(rf"(?<![\w.]){re.escape(t)}\(", response) for t in tools if t != "python"):
        raise Drop("other_tool_call")
    calls = find_python_calls(response)
    if calls is None:
        raise Drop("unparsable_python_call")
    if not calls:
        raise Drop("no_python_call")
    if any(NETWORK.search(c["code"]) for c in calls):
        raise Drop("network_code")
    if any(NONDETERMINISTIC.search(c["code"]) for c in calls):
        raise Drop("nondeterministic_code")
    ctx.counts["parse_fallback"] += sum(c["fallback"] for c in calls)
    for c in calls:
        c["code"], added = add_missing_imports(c["code"])
        ctx.counts["import_repaired"] += bool(added)
    inp = str(values.get("input") or "").strip()
    user = task + (f"\n\n{inp}" if inp else "")
    code_task = bool(CODE_TASK.search(task))

    def finish(results: list) -> list[dict]:
        for r in results:
            if r.status != "ok":
                raise Drop(f"exec_{r.status.replace('-', '_')}")
            if not r.stdout.strip():
                raise Drop("empty_output")
            if USELESS.match(r.stdout.strip()):
                raise Drop("useless_output")
            if sandbox.render_result(r, ctx.max_tool_chars) != r.stdout.rstrip("\n"):
                raise Drop("output_too_long")
        pick = rng(ctx.seed, row_id)
        messages = [{"role": "system", "content": chat.system_message([chat.python_tool_schema(ctx.tool_name)])},
                    {"role": "user", "content": user}]
        for n, (c, r) in enumerate(zip(calls, results)):
            why = pick.choice(R_CALL_PY if n == 0 else R_CALL_PY_MORE)
            messages.append(assistant(why, chat.tool_call_text(c["code"], "", ctx.tool_name)))
            messages.append({"role": "tool", "content": sandbox.render_result(r, ctx.max_tool_chars)})
        text = _final_text(response, calls, [r.stdout for r in results], code_task)
        messages.append(answer(pick.choice(R_AFTER_PY), text))
        return messages

    return Pending([(c["code"], "") for c in calls], finish)


def _parts(instruction: str) -> tuple[list[str], str]:
    """(tools granted, task text) from a Toolformer instruction."""
    lines = instruction.split("\n")
    if len(lines) < 3 or not lines[1].startswith("toolformer access:"):
        raise Drop("bad_instruction")
    tools = [t.strip() for t in lines[1].split(":", 1)[1].split(",") if t.strip()]
    task_lines = lines[2 + 2 * len(tools):] or lines[-1:]  # each tool: one description + one signature line
    return tools, "\n".join(task_lines).strip()


def _display_value(stdout: str) -> str:
    s = stdout.strip()
    if "\n" not in s and s[:1] in "'\"":
        try:
            v = ast.literal_eval(s)
            if isinstance(v, str):
                return v
        except (SyntaxError, ValueError):
            pass
    return s


def _final_text(response: str, calls: list[dict], outputs: list[str], code_task: bool) -> str:
    """The response with each inline call replaced by its real output (inline, or a fenced block)."""
    pieces, pos = [], 0
    for c, out in zip(calls, outputs):
        prefix, value = response[pos:c["start"]], _display_value(out)
        pos = c["end"]
        show_code = code_task or bool(CODE_PREFIX.search(prefix))
        if not show_code and "\n" not in value:
            pieces.append(prefix + value)
            continue
        code = f"```python\n{c['code'].strip()}\n```\nOutput:\n" if show_code else ""
        pieces.append(prefix.rstrip() + f"\n\n{code}```\n{value}\n```\n")
        # a "." or "," right after the call reads badly after a block: skip it
        if m := re.match(r"\s*[.,;]", response[pos:]):
            pos += m.end()
    pieces.append(response[pos:])
    return re.sub(r"\n{3,}", "\n\n", "".join(pieces)).strip()
