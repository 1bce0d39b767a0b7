"""Generated SFT kind ``recovery``: string tasks whose first tool call fails for a real reason and whose
second, corrected call succeeds (issue 23; the paper's models recover from failed calls, §2.2, Fig. 4).

Why: GRPO-RoC prefers, among correct trajectories, those with clean tool calls. A cold start that never
recovers from a failed call gives it nothing to choose between: every correct trajectory is then clean, and
the GRPO / GRPO-RoC ablation cannot separate the modes (measured in issue 9's ablation). These rows teach
the recovery turn, on the same non-math string tasks as ``string_tools`` (:mod:`rstar2.data.string_tools`).

One row: the RL prompt; a call with one injected mistake; the tool response the sandbox really printed for
it (its traceback, through ``sandbox.render_result``, as the RL loop shows it); a reason sentence naming the
exception class read from that real output; the task's correct, self-contained call (each call runs in a
fresh interpreter, as in the RL loop); its real output; ``<answer>\\boxed{output}</answer>``.

Mistakes (:data:`MISTAKES`, one per row, drawn from those that apply to the task):

* ``name_error``: the expression uses a variable that was never defined (``text`` for ``s``), or a word
  left unquoted (``print(planet + 'river')``);
* ``syntax_error``: the ``print(`` call's closing parenthesis is missing;
* ``attribute_error``: a method strings or lists do not have (``s.reverse()``, ``s.uppercase()``, ...);
* ``eof_error``: the code reads ``input()`` but the call passes no input.

Drops (counted in stats.json): ``mistake_did_not_fail`` (the injected mistake ran cleanly, or failed with
another exception than intended), ``unexpected_output`` (the corrected call's output differs from the
task's expected output). Nothing here writes a tool output itself: every tool message is a sandbox result.
"""

from __future__ import annotations

import re

from ... import chat, sandbox
from .. import string_tools
from .common import R_CALL_PY, Context, Drop, Pending, answer, assistant, rng

R_RETRY = (
    "The call failed with {exc}, so I will fix the code and run it again.",
    "The tool reported {exc}; I will correct the code and try again.",
    "The code raised {exc}. I will fix it and run it again.",
)
R_RETRY_PLAIN = ("The call failed, so I will fix the code and run it again.",)
R_AFTER_RETRY = (
    "The corrected code ran and printed the result.",
    "This time the code ran, so I can give the answer.",
    "The fixed call worked; I have the output.",
)
EXPECTED_EXCEPTION = {"name_error": "NameError", "syntax_error": "SyntaxError",
                      "attribute_error": "AttributeError", "eof_error": "EOFError"}
_EXC = re.compile(r"^(\w+(?:Error|Exception))\b", re.M)
_STRING_OR_S = re.compile(r"'[^']*'|\"[^\"]*\"|\bs\b")
_WRONG_METHOD = (  # a correct expression's piece -> a method the object does not have
    ("''.join(c for c in s if c not in 'aeiou')", "s.remove_vowels()"),
    ("''.join(w[0] for w in s.split())", "''.join(s.split().first_letters())"),
    ("max(s.split(), key=len)", "s.split().longest()"),
    ("''.join(sorted(s))", "''.join(s.sort())"),
    ("len(s.split())", "s.split().length()"),
    ("s[::-1]", "s.reverse()"),
    ("s.upper()", "s.uppercase()"),
    ("s.title()", "s.capitalize_words()"),
    ("s.count(", "s.count_of("),
    ("len(s)", "s.length()"),
    (" * ", ".repeat("),
    (" + ", ".concat("),
)
_OTHER_NAMES = ("text", "word", "string", "sentence", "phrase")


def _print_line(code: str) -> tuple[list[str], int]:
    lines = code.split("\n")
    return lines, next(i for i, ln in enumerate(lines) if ln.startswith("print("))


def name_error(task: dict, pick) -> tuple[str, str] | None:
    """The printed expression uses an undefined name: another name for ``s``, or a word left unquoted."""
    lines, i = _print_line(task["code"])
    if any(ln.startswith("s = ") for ln in lines):
        other = pick.choice(_OTHER_NAMES)
        lines[i] = _STRING_OR_S.sub(lambda m: other if m.group(0) == "s" else m.group(0), lines[i])
    else:
        m = re.search(r"'([a-z]+)'", lines[i])
        if not m:
            return None
        lines[i] = lines[i][:m.start()] + m.group(1) + lines[i][m.end():]
    return "\n".join(lines), task["stdin"]


def syntax_error(task: dict, pick) -> tuple[str, str] | None:
    """The ``print(`` call is never closed."""
    lines, i = _print_line(task["code"])
    lines[i] = lines[i][:-1]
    return "\n".join(lines), task["stdin"]


def attribute_error(task: dict, pick) -> tuple[str, str] | None:
    """One piece of the expression replaced by a method its object does not have (:data:`_WRONG_METHOD`)."""
    lines, i = _print_line(task["code"])
    expr = lines[i][len("print("):-1]
    for right, wrong in _WRONG_METHOD:
        if right not in expr:
            continue
        if right in (" * ", " + "):  # 'a' + 'b' -> 'a'.concat('b'); 'a' + '-' + 'b' -> 'a'.concat('-', 'b')
            head, *rest = expr.split(right)
            expr = f"{head}{wrong}{', '.join(rest)})"
        else:
            expr = expr.replace(right, wrong, 1)
        lines[i] = f"print({expr})"
        return "\n".join(lines), task["stdin"]
    return None


def eof_error(task: dict, pick) -> tuple[str, str] | None:
    """The code reads standard input, but the call passes none."""
    return (task["code"], "") if task["stdin"] else None


MISTAKES = {"name_error": name_error, "syntax_error": syntax_error, "attribute_error": attribute_error,
            "eof_error": eof_error}


def exception_name(rendered: str) -> str | None:
    """The exception class named at the start of a line of a rendered tool response (``NameError``), or None."""
    found = _EXC.findall(rendered)
    return found[-1] if found else None


def recovery_rows(n: int, ctx: Context) -> list[tuple[str, Pending]]:
    """``n`` recovery demonstrations as pending conversations (module docstring), ids ``recovery-00000`` ...

    The tasks come from :func:`rstar2.data.string_tools.generate` with seed ``-1 - seed``, a stream the
    ``string_tools`` source (seeds >= 0) never uses. Each row has two sandbox jobs: the mistaken call and the
    corrected one.
    """
    out = []
    for k, t in enumerate(string_tools.generate(n, -1 - ctx.seed)):
        row_id = f"recovery-{k:05d}"
        pick = rng(ctx.seed, row_id)
        options = [(kind, bad) for kind, fn in MISTAKES.items() if (bad := fn(t, pick)) is not None]
        kind, (bad_code, bad_stdin) = pick.choice(options)
        ctx.counts[f"mistake_{kind}"] += 1

        def finish(results: list, t: dict = t, kind: str = kind, bad=(bad_code, bad_stdin), pick=pick) -> list[dict]:
            failed, fixed = results
            shown = sandbox.render_result(failed, ctx.max_tool_chars)
            exc = exception_name(failed.stderr)
            if failed.status != "error" or exc != EXPECTED_EXCEPTION[kind]:
                raise Drop("mistake_did_not_fail")
            if fixed.status != "ok" or fixed.stdout.rstrip("\n") != t["expected"]:
                raise Drop("unexpected_output")
            retry = pick.choice(R_RETRY).format(exc=exc) if exception_name(shown) == exc else R_RETRY_PLAIN[0]
            return [{"role": "system", "content": chat.system_message([chat.python_tool_schema(ctx.tool_name)])},
                    {"role": "user", "content": chat.user_message(t["question"])},
                    assistant(pick.choice(R_CALL_PY), chat.tool_call_text(bad[0], bad[1], ctx.tool_name)),
                    {"role": "tool", "content": shown},
                    assistant(retry, chat.tool_call_text(t["code"], t["stdin"], ctx.tool_name)),
                    {"role": "tool", "content": sandbox.render_result(fixed, ctx.max_tool_chars)},
                    answer(pick.choice(R_AFTER_RETRY), f"\\boxed{{{t['expected']}}}")]
        out.append((row_id, Pending([(bad_code, bad_stdin), (t["code"], t["stdin"])], finish)))
    return out
