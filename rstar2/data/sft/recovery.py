"""Generated SFT kind ``recovery``: string tasks whose first tool call fails for a real reason and whose
second, corrected call succeeds (the paper's models recover from failed calls, §2.2, Fig. 4).

Why: GRPO-RoC prefers, among correct trajectories, those with clean tool calls. A cold start that never
recovers from a failed call gives it nothing to choose between: every correct trajectory is then clean, and
the GRPO / GRPO-RoC ablation cannot separate the modes (as measured). These rows teach
the recovery turn, on the same non-math string tasks as ``string_tools`` (:mod:`rstar2.data.string_tools`).

One row: the RL prompt; a call with one injected mistake; the tool response the RL loop really shows for it
(the sandbox's traceback through ``sandbox.render_result``, or for a call that is not valid JSON the error of
``chat.parse_tool_calls``, the rollout's own parser); a reason sentence naming the exception class read from
that real output; the task's correct call written self-contained with literals, no standard input (each
call runs in a fresh interpreter, as in the RL loop; what transfers to arithmetic is "put the values in the
code"); its real output; ``<answer>\\boxed{output}</answer>``.

Mistakes (:data:`MISTAKES`, one per row, drawn from those that apply to the task):

* ``name_error``: the expression uses a variable that was never defined (``text`` for ``s``), or a word
  left unquoted (``print(planet + 'river')``);
* ``syntax_error``: the ``print(`` call's closing parenthesis is missing;
* ``attribute_error``: a method strings or lists do not have (``s.reverse()``, ``s.uppercase()``, ...);
* ``eof_error``: the code reads ``input()`` but the call passes no input;
* ``type_error``: a number read with ``input()`` used as a count (``'planet' * n``), or a count joined to a
  label string (``'Answer: ' + len(s)``): the str/int mix-up that is the commonest failure of the cold-start
  model on the arithmetic task (``s = input()`` then ``s * 59``);
* ``json_error``: the code is written with double quotes and the call's JSON leaves them unescaped, so the
  call cannot be decoded (the cold-start model's second commonest failure); this call is never run.

Source option ``mistake_weight``: 1 (absent) trains on the mistaken first call like every other assistant
turn; 0 gives it ``"weight": 0`` (the OpenAI fine-tuning format's per-message weight), so the model sees the
mistake and its traceback but is trained only on the recovery (``benchmarks/bench_recovery_step0.py`` compares
both at RL step 0).

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
R_RETRY_JSON = (
    "The tool call was not valid JSON, so I will write it again.",
    "The call could not be decoded; I will write it again as valid JSON.",
)
R_AFTER_RETRY = (
    "The corrected code ran and printed the result.",
    "This time the code ran, so I can give the answer.",
    "The fixed call worked; I have the output.",
)
EXPECTED_EXCEPTION = {"name_error": "NameError", "syntax_error": "SyntaxError",
                      "attribute_error": "AttributeError", "eof_error": "EOFError", "type_error": "TypeError"}
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
_REPEAT = re.compile(r"^print\((.+) \* (\d+)\)$")
_LABELS = ("Answer: ", "Result: ", "Count: ")


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


def type_error(task: dict, pick) -> tuple[str, str] | None:
    """A str where an int is needed: the count of a repetition read with ``input()``, or a count joined to a
    label string."""
    lines, i = _print_line(task["code"])
    expr = lines[i][len("print("):-1]
    if m := _REPEAT.match(lines[i]):
        lines[i] = f"print({m.group(1)} * n)"
        return "\n".join(["n = input()", *lines]), m.group(2)
    if expr.startswith(("len(", "s.count(")):
        lines[i] = f"print({pick.choice(_LABELS)!r} + {expr})"
        return "\n".join(lines), task["stdin"]
    return None


def json_error(task: dict, pick) -> tuple[str, str] | None:
    """The code with double-quoted strings (the call text leaves them unescaped: :func:`call_text`)."""
    code = task["code"]
    return (code.replace("'", '"'), task["stdin"]) if "'" in code and '"' not in code else None


MISTAKES = {"name_error": name_error, "syntax_error": syntax_error, "attribute_error": attribute_error,
            "eof_error": eof_error, "type_error": type_error, "json_error": json_error}
UNDECODABLE = {"json_error"}  # mistakes in the call's JSON: the rollout's parser answers, the code never runs


def call_text(kind: str, code: str, stdin: str, tool_name: str) -> str:
    """The tool call as the model writes it; for :data:`UNDECODABLE` kinds the code's quotes left unescaped."""
    text = chat.tool_call_text(code, stdin, tool_name)
    return text.replace('\\"', '"') if kind in UNDECODABLE else text


def self_contained(task: dict) -> tuple[str, str]:
    """The task's code with the text it reads from standard input written in as a literal; no input."""
    if not task["stdin"]:
        return task["code"], ""
    return task["code"].replace("s = input()", f"s = {task['stdin']!r}", 1), ""


def exception_name(rendered: str) -> str | None:
    """The exception class named at the start of a line of a rendered tool response (``NameError``), or None."""
    found = _EXC.findall(rendered)
    return found[-1] if found else None


def recovery_rows(n: int, ctx: Context) -> list[tuple[str, Pending]]:
    """``n`` recovery demonstrations as pending conversations (module docstring), ids ``recovery-00000`` ...

    The tasks come from :func:`rstar2.data.string_tools.generate` with seed ``-1 - seed``, a stream the
    ``string_tools`` source (seeds >= 0) never uses. Each row has two sandbox jobs, the mistaken call and the
    corrected one, or one (the corrected call) where the mistaken call cannot be decoded.
    """
    out = []
    for k, t in enumerate(string_tools.generate(n, -1 - ctx.seed)):
        row_id = f"recovery-{k:05d}"
        pick = rng(ctx.seed, row_id)
        options = [(kind, bad) for kind, fn in MISTAKES.items() if (bad := fn(t, pick)) is not None]
        kind, bad = pick.choice(options)
        ctx.counts[f"mistake_{kind}"] += 1
        fix = self_contained(t)
        bad_text = call_text(kind, *bad, ctx.tool_name)
        jobs = [fix] if kind in UNDECODABLE else [bad, fix]

        def finish(results: list, t=t, kind=kind, bad_text=bad_text, fix=fix, pick=pick) -> list[dict]:
            fixed, first = results[-1], assistant(pick.choice(R_CALL_PY), bad_text)
            if ctx.spec.get("mistake_weight") == 0:  # the mistaken call stays in the context, out of the loss
                first["weight"] = 0
            if kind in UNDECODABLE:  # parsed as the rollout parses the generated turn (after the prompt's <reason>)
                (call,) = chat.parse_tool_calls(first["content"].removeprefix("<reason>"), ctx.tool_name)
                if call.error is None:
                    raise Drop("mistake_did_not_fail")
                shown, retry = call.error, pick.choice(R_RETRY_JSON)
            else:
                shown, exc = sandbox.render_result(results[0], ctx.max_tool_chars), exception_name(results[0].stderr)
                if results[0].status != "error" or exc != EXPECTED_EXCEPTION[kind]:
                    raise Drop("mistake_did_not_fail")
                retry = pick.choice(R_RETRY).format(exc=exc) if exception_name(shown) == exc else R_RETRY_PLAIN[0]
            if fixed.status != "ok" or fixed.stdout.rstrip("\n") != t["expected"]:
                raise Drop("unexpected_output")
            return [{"role": "system", "content": chat.system_message([chat.python_tool_schema(ctx.tool_name)])},
                    {"role": "user", "content": chat.user_message(t["question"])},
                    first,
                    {"role": "tool", "content": shown},
                    assistant(retry, chat.tool_call_text(*fix, ctx.tool_name)),
                    {"role": "tool", "content": sandbox.render_result(fixed, ctx.max_tool_chars)},
                    answer(pick.choice(R_AFTER_RETRY), f"\\boxed{{{t['expected']}}}")]
        out.append((row_id, Pending(jobs, finish)))
    return out
