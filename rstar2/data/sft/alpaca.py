"""Format ``alpaca``: instruction following (paper §4.1), one user turn and one direct answer, with the python
tool offered in the system prompt but not used, so the model also learns to answer without calling it.

Fields: ``instruction`` (required), ``input`` (optional; appended after a blank line), ``output`` (required).
A field that holds chat messages instead of text (Llama-Nemotron's ``input``) gives its last user message.
Drops: ``empty_instruction``, ``empty_output``, and the math filter on prompt and reply
(:func:`rstar2.data.sft.math_filter.math_reason`).
"""

from __future__ import annotations

from ... import chat
from .common import R_ALPACA, Broken, Context, Drop, Pending, answer, done, rng
from .math_filter import math_reason

FIELDS = {"instruction": True, "input": False, "output": True}   # role -> required
EXECUTES = False   # nothing to run


def convert(values: dict, row_id: str, ctx: Context) -> Pending:
    """One Alpaca row -> system (python tool offered), user, answer.

    Raises:
        Drop: empty instruction or output, or math. Broken: a field that is neither text nor chat messages.
    """
    instr, inp, output = (_text(values.get(role), role) for role in ("instruction", "input", "output"))
    if not instr:
        raise Drop("empty_instruction")
    if not output:
        raise Drop("empty_output")
    if r := math_reason(instr + ("\n" + inp if inp else ""), output):
        raise Drop(r)
    user = instr + (f"\n\n{inp}" if inp else "")
    system = chat.system_message([chat.python_tool_schema(ctx.tool_name)])
    return done([{"role": "system", "content": system}, {"role": "user", "content": user},
                 answer(rng(ctx.seed, row_id).choice(R_ALPACA), output)])


def _text(value, role: str) -> str:
    """A field as stripped text; chat messages give their last user message; null gives ''."""
    if value is None:
        return ""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1].strip()
        raise Broken(role, "", "a list without a user message with text content")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value).strip()
    raise Broken(role, "", f"expected text, got {type(value).__name__}")
