"""Generated SFT sources: rows made by code instead of read from a file (source key ``generate``, count ``n``).

``GENERATORS`` maps a kind to ``fn(n, ctx) -> [(row_id, Pending)]``; the stage runs their sandbox jobs and
drops like any source's. To add a kind, write such a function and register it here and in the schema's
``sft_source.generate`` enum.

* ``string_tools`` (:mod:`rstar2.data.string_tools`): string-manipulation tasks solved through the python
  tool. Unlike the other sources these use the RL prompt itself (``chat.user_message``, the python tool
  offered) and end in ``<answer>\\boxed{output}</answer>``, so the cold start teaches the exact format RL
  rewards, without any math. The code runs in the sandbox; a task whose output differs from the expected one
  is dropped (``unexpected_output``).
* ``recovery`` (:mod:`.recovery`): the same kind of string tasks, but the first call fails for a real reason
  (NameError, SyntaxError, AttributeError, EOFError, TypeError, or a call that is not valid JSON), the model
  reads the real traceback or parser error, and a corrected, self-contained call succeeds (this gives
  GRPO-RoC correct trajectories with failed calls to choose between).
"""

from __future__ import annotations

from typing import Callable

from ... import chat, sandbox
from .. import string_tools
from .common import R_CALL_PY, Context, Drop, Pending, answer, assistant, rng
from .recovery import recovery_rows

R_STRING_ANSWER = (
    "The tool printed the result.",
    "The code ran, so I can give the answer.",
    "I have the output from the Python tool.",
)


def string_tools_rows(n: int, ctx: Context) -> list[tuple[str, Pending]]:
    """``n`` string tasks as pending conversations (module docstring), ids ``string-00000`` ..."""
    out = []
    for t in string_tools.generate(n, ctx.seed):
        def finish(results: list, t: dict = t) -> list[dict]:
            (r,) = results
            if r.status != "ok" or r.stdout.rstrip("\n") != t["expected"]:
                raise Drop("unexpected_output")
            pick = rng(ctx.seed, t["id"])
            return [{"role": "system", "content": chat.system_message([chat.python_tool_schema(ctx.tool_name)])},
                    {"role": "user", "content": chat.user_message(t["question"])},
                    assistant(pick.choice(R_CALL_PY), chat.tool_call_text(t["code"], t["stdin"], ctx.tool_name)),
                    {"role": "tool", "content": sandbox.render_result(r, ctx.max_tool_chars)},
                    answer(pick.choice(R_STRING_ANSWER), f"\\boxed{{{t['expected']}}}")]
        out.append((t["id"], Pending([(t["code"], t["stdin"])], finish)))
    return out


GENERATORS: dict[str, Callable[[int, Context], list[tuple[str, Pending]]]] = {"string_tools": string_tools_rows,
                                                                             "recovery": recovery_rows}
