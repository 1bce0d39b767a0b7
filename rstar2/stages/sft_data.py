"""Stage ``sft_data``: build the non-reasoning SFT cold-start set in the rStar2 wire format (spec §5.2).

The paper's cold start teaches instruction following, JSON function calling and basic coding-tool use, and
deliberately contains **no math reasoning traces** (responses stay short). Its data was not released; this
stage builds a small open stand-in from three sources copied under ``data/sft/`` (see its SOURCE.md):

* ``glaive``  - LLaMA-Factory's glaive-function-calling-v2 demo (ShareGPT, JSON function calls),
* ``toolformer`` - GPTeacher Toolformer rows that grant ``python`` access, turned into REAL calls of our code
  tool whose responses come from actually running the code in :mod:`rstar2.sandbox`,
* ``alpaca``  - LLaMA-Factory's Alpaca demo (instruction following), minus math-looking rows,
* ``string_tools`` - generated string-manipulation tasks solved through the python tool
  (:mod:`rstar2.data.string_tools`; off unless ``n`` is set), in the RL prompt and answer format.

Output ``<out_dir>/train.jsonl``: one row per conversation, ``{"id", "source", "messages"}`` with
``messages = [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]``, ready for
:func:`rstar2.chat.encode_conversation`. Also ``stats.json`` (rows in/out per source, every drop reason with
its count, sandbox outcomes) and, last, ``manifest.json``.

Assistant-turn format (non-reasoning). Every assistant content starts with ``<reason>`` because the RL
generation prompt ends with ``<|im_start|>assistant\\n<reason>`` (chat.ASSISTANT_PREFIX; that tag is masked, the
rest is trained). The reason is ONE short templated sentence, never a worked solution:

* a turn that calls a tool::

      <reason>{one short sentence}</reason>
      <tool_call>
      {"name": ..., "arguments": {...}}
      </tool_call>

  exactly one call per turn (the RL loop executes only the first call of a turn, spec §2.3
  ``max_parallel_calls=1``), so a response with two inline calls becomes two call turns;
* tool results are ``role: "tool"`` messages (encoded as masked ``<tool_response>`` user turns);
* a final reply is ``<reason>{short}</reason>\\n<answer>{text}</answer>``. There is no ``\\boxed{}``: these are
  not math problems.

The user turn is the raw request (no math ``USER_PREFIX``; that belongs to the RL prompt only).
System prompt: glaive rows get ``chat.system_message`` with that row's own function schemas (wrapped as
``{"type": "function", "function": schema}``; the bare rStar2 system prompt when the row has none);
toolformer and alpaca rows get the python code tool (``chat.python_tool_schema(tool_name)``), so the model
sees the RL tool offered and learns both to call it and to answer directly when no code is needed.
The short reason sentences are drawn from small fixed lists with a per-row RNG seeded by ``(seed, row id)``.

Conversions and drop rules (every drop is counted in stats.json under its reason):

* glaive: human -> user, function_call -> assistant call turn (name must be one of the row's tools,
  ``arguments`` a JSON object, or a JSON string of one), observation -> tool (kept verbatim, not truncated:
  the replies quote it), gpt -> assistant answer. Trailing user turns are cut; a row must alternate sensibly
  (``malformed`` otherwise). Rows without any function call are checked with the math heuristic below, and
  every gpt reply with the worked-arithmetic rule.
* toolformer: the task is the instruction's last line(s) after the tool descriptions, plus ``input`` after a
  blank line. Each inline ``python('...')`` is located with :mod:`ast` (the shortest ``python(...)`` slice
  that parses as a call with one argument, so quotes and parentheses inside the code are handled). The
  argument is normally a string literal; an unquoted argument made of constants only (``python('abc'[::-1])``)
  is taken as the code itself. When GPT-4 wrote unescaped inner quotes that no slice parses, a fallback takes
  the text between the opening quote and a closing ``')``, decodes it as a triple-quoted literal (optionally
  re-adding a quote the call swallowed at either end) and accepts the first version that compiles
  (``parse_fallback`` counts these calls). Code that uses ``math.``/``itertools.``/... without importing it
  gets the ``import`` prepended (static check, ``import_repaired`` counts rows); the tool call shows the code
  exactly as it ran. The code runs through :func:`rstar2.sandbox.execute_many` (stdin empty,
  ``tool_timeout_s`` wall clock) and the tool message is :func:`rstar2.sandbox.render_result` of the real
  result. The final answer is the response text with each inline call replaced by the real output (a
  ``repr``'d string is shown unquoted; multi-line output goes into a fenced block, and for "write code"
  tasks the code is shown too, then its output). Drops: no python access, calls to another Toolformer tool,
  no or unparsable ``python(...)`` call, network code (``network_code``) and clock- or randomness-dependent
  code (``nondeterministic_code``), both of which would make the stage non-deterministic, a failed run
  (``exec_error``/``exec_timeout``/...), empty output (e.g. ``def f(): return 1; f()``, where the call is
  part of the body) or a bare object repr such as ``<function f at 0x..>`` (``useless_output``), and output
  longer than ``max_tool_chars`` (the answer would quote text the model never saw in the tool response).
* alpaca: user = instruction (+ "\\n\\n" + input); answer = output. Empty outputs and math-looking rows dropped.

Math heuristic (:func:`math_reason`; conservative: a false positive only costs a row). A prompt is "math" if
it (1) contains an arithmetic expression (``\\d [+*×÷^=] \\d``, spaced ``- x /`` between numbers, ``2x + ...``,
``x^2`` or ``15% of 500``), (2) starts with a computing verb (calculate, compute, solve, evaluate, simplify,
determine, find, add, subtract, multiply, divide, convert, estimate, round, what is, how many, how much) and
contains a digit, or (3) names a math topic (equation but not "chemical equation", algebra, geometry,
fraction, quadratic, derivative, integral, math/mathematical, perimeter, factorial, ...). A reply is "math"
if it shows worked arithmetic (``4 x 4 x 4 = 64``). Drop reasons are ``math_expression``, ``math_verb_number``,
``math_term`` and ``math_worked_arithmetic``.

Sampling and determinism: ``limit`` is the number of source rows read (a seeded random sample of the file
when it is larger; null reads all; 0, a null section or a missing path skips the source). Given the seed and
the files, the output is identical run to run (sandbox outcomes are deterministic for the kept code, barring
a snippet that takes about ``tool_timeout_s``); the final rows are shuffled with ``random.Random(seed)``.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from .. import chat, sandbox
from ..io import write_json, write_jsonl, write_manifest

STAGE = "sft_data"

DEFAULT_PARAMS = {
    "glaive": {"path": "data/sft/glaive_toolcall_en_demo.json", "limit": None},
    "toolformer": {"path": "data/sft/gpteacher_toolformer_python.json", "limit": None},
    "alpaca": {"path": "data/sft/alpaca_en_demo.json", "limit": None},
    "string_tools": None,
    "tool_name": chat.DEFAULT_TOOL_NAME,
    "tool_timeout_s": 5.0,
    "max_tool_chars": 256,
    "seed": 0,
}

# ----------------------------------------------------------------------------------------------------------
# Short reason sentences (non-reasoning: one templated sentence per turn).

_R_CALL_FN = (
    "The user's request needs the {name} function, so I will call it.",
    "I can handle this by calling {name} with the details given.",
    "This is a job for the {name} function.",
)
_R_AFTER_FN = (
    "The function returned its result, so I can reply.",
    "I have the function's output and will share it.",
    "The call succeeded; I will report the result.",
)
_R_NO_CALL_WITH_TOOLS = (
    "No function call is needed for this reply.",
    "I can reply directly without calling a function.",
    "The available functions are not needed here.",
)
_R_DIRECT = (
    "No tool is needed; I can answer directly.",
    "This request can be answered directly.",
    "I will respond directly to the request.",
)
_R_CALL_PY = (
    "I can get this by running Python code.",
    "Running a short Python snippet will give the result.",
    "I will use the Python tool to compute this.",
)
_R_CALL_PY_MORE = (
    "I will run one more snippet for the remaining part.",
    "Next, I need the second result from Python.",
)
_R_AFTER_PY = (
    "The code ran and printed the result.",
    "I have the output from the Python tool.",
    "The tool returned the value I need.",
)
_R_ALPACA = (
    "This request can be answered directly; no code needs to run.",
    "No tool is needed for this; I will answer directly.",
    "This is a language task, so I will respond without calling the tool.",
)


def _assistant(reason: str, body: str) -> dict:
    return {"role": "assistant", "content": f"<reason>{reason}</reason>\n{body}"}


def _answer(reason: str, text: str) -> dict:
    return _assistant(reason, f"<answer>{text}</answer>")


def _rng(seed: int, row_id: str) -> random.Random:
    return random.Random(f"{seed}:{row_id}")


# ----------------------------------------------------------------------------------------------------------
# Math heuristic.

_MATH_EXPR = [re.compile(p, re.I) for p in (
    r"\d\s*[+*×÷^=]\s*\(?-?\d",         # 3 + 4, 2*3, 2^10, x = 5 after a digit
    r"\d\s+[-x/]\s+\(?\d",              # 9 - 2, 5 x 3, 10 / 2 (spaced: leaves 2000-2015 and 4.5/5 alone)
    r"\b\d+[a-z]\s*[+\-=^]\s*\d*[a-z]?", # 2x + 4, 2a+3b
    r"\b[a-z]\s*\^\s*\d",               # x^2
    r"\d\s*%\s*of\s+\$?\d",               # 15% of 500
)]
_MATH_VERB = re.compile(
    r"^\s*(?:calculate|compute|solve|evaluate|simplify|determine|find|add|subtract|multiply|divide|convert|"
    r"estimate|round|what\s+is|what's|how\s+many|how\s+much)\b", re.I)
_MATH_TERM = re.compile(
    r"\b(?:(?<!chemical )equations?|arithmetic|algebra(?:ic)?|geometry|trigonometr\w*|calculus|quadratic|"
    r"polynomials?|derivatives?|integrals?|fractions?|maths?|mathematic(?:s|al)|word problems?|"
    r"order of operations|square roots?|cube roots?|factorials?|prime factori[sz]ation|perimeter|hypotenuse|"
    r"circumference|greatest common|least common|lcm|gcd)\b", re.I)
_MATH_WORKED = re.compile(r"\d\s*[+\-*/×x÷]\s*\(?\d[\d\s+\-*/×x÷().,]*=\s*\$?-?\d")


def math_reason(prompt: str, reply: str = "") -> str | None:
    """Return the drop reason when the prompt or reply looks like a math problem / worked arithmetic, else None."""
    if any(p.search(prompt) for p in _MATH_EXPR):
        return "math_expression"
    if _MATH_VERB.search(prompt) and re.search(r"\d", prompt):
        return "math_verb_number"
    if _MATH_TERM.search(prompt):
        return "math_term"
    if reply and _MATH_WORKED.search(reply):
        return "math_worked_arithmetic"
    return None


# ----------------------------------------------------------------------------------------------------------
# Source loading and sampling.

def _load(section: dict | None) -> tuple[list | None, str | None, str | None]:
    """(rows, path, skip_reason). Rows is None when the source is skipped."""
    if not section:
        return None, None, "no section"
    path, limit = section.get("path"), section.get("limit")
    if limit == 0:
        return None, path, "limit 0"
    if not path or not os.path.exists(path):
        return None, path, f"missing path {path!r}"
    with open(path, encoding="utf-8") as f:
        return json.load(f), path, None


def _select(n: int, limit: int | None, seed: int, name: str) -> list[int]:
    """Indices of the rows read: all when limit is None or >= n, else a seeded sample kept in file order."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(f"{seed}:{name}:sample").sample(range(n), int(limit)))


def _new_stats(path: str | None, available: int, selected: int) -> dict:
    return {"path": path, "rows_available": available, "rows_in": selected, "rows_out": 0, "dropped": Counter()}


# ----------------------------------------------------------------------------------------------------------
# glaive: JSON function calling.

class _Drop(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _glaive_row(row: dict, row_id: str, seed: int) -> dict:
    rng = _rng(seed, row_id)
    try:
        tools = json.loads(row["tools"]) if row.get("tools") else []
        if not isinstance(tools, list) or not all(isinstance(t, dict) and "name" in t for t in tools):
            raise ValueError
    except (ValueError, TypeError):
        raise _Drop("bad_tools")
    names = {t["name"] for t in tools}
    conv = list(row.get("conversations") or [])
    while conv and conv[-1].get("from") == "human":  # nothing to learn from a trailing user turn
        conv.pop()
    if not conv:
        raise _Drop("malformed")
    has_call = any(t.get("from") == "function_call" for t in conv)
    messages = [{"role": "system", "content": chat.system_message([{"type": "function", "function": t}
                                                                    for t in tools])}]
    last = "system"  # user | call | tool | answer
    for t in conv:
        kind, value = t.get("from"), t.get("value")
        if not isinstance(value, str) or not value.strip():
            raise _Drop("empty_turn")
        if kind == "human":
            if last not in ("system", "answer"):
                raise _Drop("malformed")
            if not has_call and (r := math_reason(value)):
                raise _Drop(r)
            messages.append({"role": "user", "content": value})
            last = "user"
        elif kind == "function_call":
            if last not in ("user", "tool"):
                raise _Drop("malformed")
            try:
                obj = json.loads(value)
                args = obj["arguments"]
                if isinstance(args, str):
                    args = json.loads(args)
                if not isinstance(args, dict):
                    raise ValueError
            except (ValueError, TypeError, KeyError):
                raise _Drop("bad_function_call")
            if obj.get("name") not in names:
                raise _Drop("unknown_function")
            payload = json.dumps({"name": obj["name"], "arguments": args}, ensure_ascii=False)
            reason = rng.choice(_R_CALL_FN).format(name=obj["name"])
            messages.append(_assistant(reason, f"<tool_call>\n{payload}\n</tool_call>"))
            last = "call"
        elif kind == "observation":
            if last != "call":
                raise _Drop("malformed")
            messages.append({"role": "tool", "content": value})
            last = "tool"
        elif kind == "gpt":
            if last not in ("user", "tool"):
                raise _Drop("malformed")
            if "<functioncall>" in value or "<tool_call>" in value:
                raise _Drop("inline_call_text")
            if _MATH_WORKED.search(value):
                raise _Drop("math_worked_arithmetic")
            pool = _R_AFTER_FN if last == "tool" else (_R_NO_CALL_WITH_TOOLS if tools else _R_DIRECT)
            messages.append(_answer(rng.choice(pool), value))
            last = "answer"
        else:
            raise _Drop("unknown_turn_kind")
    if last != "answer":
        raise _Drop("malformed")
    return {"id": row_id, "source": "glaive", "messages": messages}


def convert_glaive(rows: list[dict], idx: list[int], seed: int, stats: dict) -> list[dict]:
    out = []
    for i in idx:
        try:
            out.append(_glaive_row(rows[i], f"glaive-{i}", seed))
        except _Drop as d:
            stats["dropped"][d.reason] += 1
    return out


# ----------------------------------------------------------------------------------------------------------
# toolformer: inline python('...') -> real tool calls.

_CALL_START = re.compile(r"(?<![\w.])python\(")
_NONDETERMINISTIC = re.compile(
    r"\b(?:now|today|utcnow|time|localtime|gmtime|perf_counter|monotonic)\s*\(|\brandom\b|\bsecrets\b|\buuid\b")
_NETWORK = re.compile(r"\b(?:requests|urllib\d?|http\.client|httpx|aiohttp|socket)\b")
_USELESS = re.compile(r"^<(?:function|generator object|map object|filter object|zip object|built-in|module|"
                      r"class|bound method|[\w.]+ object at 0x)")
_CODE_TASK = re.compile(r"\b(?:write|create|provide|show|give|generate|implement)\b[^.]*"
                        r"\b(?:code|snippet|script|program|function)\b", re.I)
_CODE_PREFIX = re.compile(r"\b(?:code|snippet|script|program)\b[^.\n]*:\s*$", re.I)


def _parse_call_ast(text: str, start: int, open_end: int) -> tuple[int, str | None] | None:
    """Shortest ``text[start:j+1]`` that parses as a ``python(<one argument>)`` call: (end, code).

    The argument is normally a string literal (its value is the code). GPT-4 sometimes forgot the quotes
    (``python('abc'[::-1])``); an unquoted argument built from constants only is taken as the code itself
    (its source text). Any other argument gives code None (the row is dropped as unparsable).
    """
    j = open_end - 1
    while (j := text.find(")", j + 1)) != -1 and j - start < 50_000:
        src = text[start:j + 1]
        try:
            node = ast.parse(src, mode="eval").body
        except (SyntaxError, ValueError):
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "python"):
            continue
        if len(node.args) != 1 or node.keywords:
            return j + 1, None
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return j + 1, arg.value
        if any(isinstance(n, ast.Name) for n in ast.walk(arg)):
            return j + 1, None
        return j + 1, ast.get_source_segment(src, arg)
    return None


def _compiles(code: str) -> bool:
    try:
        compile(code, "<code>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def _parse_call_fallback(text: str, open_end: int) -> tuple[int, str] | None:
    """For unescaped inner quotes: text between the opening quote and a later ``<quote>)`` that compiles."""
    if open_end >= len(text) or text[open_end] not in "'\"":
        return None
    q = text[open_end]
    body_start = open_end + 1
    k = body_start - 1
    while (k := text.find(q + ")", k + 1)) != -1 and k - body_start < 50_000:
        inner = text[body_start:k]
        # the call's closing quote may also close the code's last string, or its opening quote open the first
        for cand in (inner, inner + q, q + inner):
            for tq in ("'''", '"""'):
                if tq in cand or cand.endswith(tq[0]) or cand.endswith("\\"):
                    continue
                try:
                    code = ast.literal_eval(tq + cand + tq)
                except (SyntaxError, ValueError):
                    continue
                if isinstance(code, str) and code.strip() and _compiles(code):
                    return k + 2, code
    return None


def find_python_calls(text: str) -> list[dict] | None:
    """Every inline ``python('...')`` call in ``text``: dicts {start, end, code, fallback}, in order.

    Returns None when a ``python(`` occurrence cannot be turned into code.
    """
    calls, pos = [], 0
    while (m := _CALL_START.search(text, pos)) is not None:
        found = _parse_call_ast(text, m.start(), m.end())
        fallback = False
        if found is None:
            found, fallback = _parse_call_fallback(text, m.end()), True
        if found is None or found[1] is None:
            return None
        end, code = found
        calls.append({"start": m.start(), "end": end, "code": code, "fallback": fallback})
        pos = end
    return calls


# Modules GPT-4 often used without importing them (``math.pi`` with no ``import math``).
_REPAIRABLE_MODULES = ("math", "cmath", "statistics", "itertools", "functools", "collections", "string", "re",
                       "fractions", "decimal", "json", "operator")


def add_missing_imports(code: str) -> tuple[str, list[str]]:
    """Prepend ``import X`` for each module in ``_REPAIRABLE_MODULES`` the code uses as ``X.attr`` but never
    binds (import, assignment, def, argument). Returns (code, modules added). Static, so deterministic; the
    repaired code is what the tool call in the SFT row shows and what the sandbox runs."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code, []
    used, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and isinstance(n.value.ctx, ast.Load):
            used.add(n.value.id)
        elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
    missing = [mod for mod in _REPAIRABLE_MODULES if mod in used and mod not in bound]
    if not missing:
        return code, []
    sep = "\n" if "\n" in code.strip() else "; "
    return "".join(f"import {mod}{sep}" for mod in missing) + code, missing


def _toolformer_parts(row: dict) -> tuple[list[str], str]:
    """(tools granted, task text) from a Toolformer instruction."""
    lines = row["instruction"].split("\n")
    if len(lines) < 3 or not lines[1].startswith("toolformer access:"):
        raise _Drop("bad_instruction")
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
        show_code = code_task or bool(_CODE_PREFIX.search(prefix))
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


def _run_in_sandbox(jobs: list[tuple[str, str]], limits, name: str, stats: dict) -> list:
    """Run ``(code, stdin)`` jobs through the sandbox client with a progress bar; records ``stats["sandbox"]``."""
    results: list[sandbox.ExecResult] = []
    t0 = time.time()
    with sandbox.shared_client(limits) as client, \
            tqdm(total=len(jobs), desc=f"sft_data {name} sandbox", unit="call", file=sys.stderr,
                 mininterval=2.0) as bar:
        workers = len(client.pool.workers) if client.pool is not None else 0
        for k in range(0, len(jobs), 64):
            chunk = jobs[k:k + 64]
            results += client.run_many(chunk)
            bar.update(len(chunk))
    stats["sandbox"] = {"calls": len(jobs), "wall_s": round(time.time() - t0, 2), "workers": workers,
                        "status": dict(Counter(r.status for r in results))}
    return results


def convert_toolformer(rows: list[dict], idx: list[int], params: dict, stats: dict) -> list[dict]:
    seed, tool_name = params.get("seed", 0), params.get("tool_name", chat.DEFAULT_TOOL_NAME)
    max_chars = int(params.get("max_tool_chars", 256))
    limits = sandbox.SandboxLimits(timeout_s=float(params.get("tool_timeout_s", 5.0)))
    pending = []  # (row_id, user, response, calls, code_task)
    for i in idx:
        row, row_id = rows[i], f"toolformer-{i}"
        try:
            tools, task = _toolformer_parts(row)
            if "python" not in tools:
                raise _Drop("no_python_access")
            response = row.get("response") or ""
            if "_x_ToolPartResult" in response or any(
                    re.search(rf"(?<![\w.]){re.escape(t)}\(", response) for t in tools if t != "python"):
                raise _Drop("other_tool_call")
            calls = find_python_calls(response)
            if calls is None:
                raise _Drop("unparsable_python_call")
            if not calls:
                raise _Drop("no_python_call")
            if any(_NETWORK.search(c["code"]) for c in calls):
                raise _Drop("network_code")
            if any(_NONDETERMINISTIC.search(c["code"]) for c in calls):
                raise _Drop("nondeterministic_code")
        except _Drop as d:
            stats["dropped"][d.reason] += 1
            continue
        stats["parse_fallback"] += sum(c["fallback"] for c in calls)
        for c in calls:
            c["code"], added = add_missing_imports(c["code"])
            stats["import_repaired"] += bool(added)
        inp = (row.get("input") or "").strip()
        user = task + (f"\n\n{inp}" if inp else "")
        pending.append((row_id, user, response, calls, bool(_CODE_TASK.search(task))))

    jobs = [(c["code"], "") for _, _, _, calls, _ in pending for c in calls]
    results = _run_in_sandbox(jobs, limits, "toolformer", stats)

    system = chat.system_message([chat.python_tool_schema(tool_name)])
    out, r_iter = [], iter(results)
    for row_id, user, response, calls, code_task in pending:
        res = [next(r_iter) for _ in calls]
        reason = None
        for r in res:
            if r.status != "ok":
                reason = f"exec_{r.status.replace('-', '_')}"
            elif not r.stdout.strip():
                reason = "empty_output"
            elif _USELESS.match(r.stdout.strip()):
                reason = "useless_output"
            elif sandbox.render_result(r, max_chars) != r.stdout.rstrip("\n"):
                reason = "output_too_long"
            if reason:
                break
        if reason:
            stats["dropped"][reason] += 1
            continue
        rng = _rng(seed, row_id)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        for n, (c, r) in enumerate(zip(calls, res)):
            why = rng.choice(_R_CALL_PY if n == 0 else _R_CALL_PY_MORE)
            messages.append(_assistant(why, chat.tool_call_text(c["code"], "", tool_name)))
            messages.append({"role": "tool", "content": sandbox.render_result(r, max_chars)})
        text = _final_text(response, calls, [r.stdout for r in res], code_task)
        messages.append(_answer(rng.choice(_R_AFTER_PY), text))
        out.append({"id": row_id, "source": "toolformer", "messages": messages})
    return out


# ----------------------------------------------------------------------------------------------------------
# alpaca: instruction following with the tool offered but not used.

def convert_alpaca(rows: list[dict], idx: list[int], params: dict, stats: dict) -> list[dict]:
    seed, tool_name = params.get("seed", 0), params.get("tool_name", chat.DEFAULT_TOOL_NAME)
    system = chat.system_message([chat.python_tool_schema(tool_name)])
    out = []
    for i in idx:
        row, row_id = rows[i], f"alpaca-{i}"
        instr, inp = (row.get("instruction") or "").strip(), (row.get("input") or "").strip()
        output = (row.get("output") or "").strip()
        if not instr:
            stats["dropped"]["empty_instruction"] += 1
            continue
        if not output:
            stats["dropped"]["empty_output"] += 1
            continue
        if r := math_reason(instr + ("\n" + inp if inp else ""), output):
            stats["dropped"][r] += 1
            continue
        user = instr + (f"\n\n{inp}" if inp else "")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user},
                    _answer(_rng(seed, row_id).choice(_R_ALPACA), output)]
        out.append({"id": row_id, "source": "alpaca", "messages": messages})
    return out


# ----------------------------------------------------------------------------------------------------------
# string_tools: generated string-manipulation tasks solved through the python tool, answered in \\boxed{}.

_R_STRING_ANSWER = (
    "The tool printed the result.",
    "The code ran, so I can give the answer.",
    "I have the output from the Python tool.",
)


def convert_string_tools(section: dict, params: dict, stats: dict) -> list[dict]:
    """Tool-use conversations from :mod:`rstar2.data.string_tools`, ``section["n"]`` of them.

    Unlike the other sources these use the RL prompt itself (``chat.user_message``, the python tool offered)
    and end in ``<answer>\\boxed{output}</answer>``, so the cold start teaches the exact format RL rewards,
    without any math. The code runs in the sandbox; a task whose output differs from the expected one is
    dropped (``unexpected_output``).
    """
    from ..data import string_tools

    seed, tool_name = params.get("seed", 0), params.get("tool_name", chat.DEFAULT_TOOL_NAME)
    max_chars = int(params.get("max_tool_chars", 256))
    tasks = string_tools.generate(int(section.get("n", 0)), seed)
    stats["rows_available"] = stats["rows_in"] = len(tasks)
    limits = sandbox.SandboxLimits(timeout_s=float(params.get("tool_timeout_s", 5.0)))
    results = _run_in_sandbox([(t["code"], t["stdin"]) for t in tasks], limits, "string_tools", stats)
    system = chat.system_message([chat.python_tool_schema(tool_name)])
    out = []
    for t, r in zip(tasks, results, strict=True):
        if r.status != "ok" or r.stdout.rstrip("\n") != t["expected"]:
            stats["dropped"]["unexpected_output"] += 1
            continue
        rng = _rng(seed, t["id"])
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": chat.user_message(t["question"])},
                    _assistant(rng.choice(_R_CALL_PY), chat.tool_call_text(t["code"], t["stdin"], tool_name)),
                    {"role": "tool", "content": sandbox.render_result(r, max_chars)},
                    _answer(rng.choice(_R_STRING_ANSWER), f"\\boxed{{{t['expected']}}}")]
        out.append({"id": t["id"], "source": "string_tools", "messages": messages})
    return out


# ----------------------------------------------------------------------------------------------------------

def _check_row(row: dict) -> None:
    for m in row["messages"]:
        if m["role"] not in ("system", "user", "assistant", "tool") or not isinstance(m["content"], str):
            raise AssertionError(f"{row['id']}: bad message {m!r:.80}")
        if m["role"] == "assistant" and not m["content"].startswith("<reason>"):
            raise AssertionError(f"{row['id']}: assistant content must start with <reason>")
    if row["messages"][-1]["role"] != "assistant":
        raise AssertionError(f"{row['id']}: conversation must end on an assistant turn")


def run(params: dict, out_dir: str) -> None:
    """Build ``train.jsonl`` and ``stats.json`` in ``out_dir``, then write the manifest (last)."""
    started = time.time()
    params = {**DEFAULT_PARAMS, **(params or {})}
    tool = params.pop("tool", None)  # the config's tool section (the workflow passes it whole)
    if tool:
        params.update(tool_name=tool["name"], tool_timeout_s=tool["timeout_s"], max_tool_chars=tool["max_output_chars"])
    seed = int(params.get("seed", 0))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows_all: list[dict] = []
    stats: dict = {"seed": seed, "sources": {}}
    inputs: list[str] = []
    for name in ("glaive", "toolformer", "alpaca", "string_tools"):
        section = params.get(name)
        if name == "string_tools":  # generated, no file
            data, path, skip = (None, None, "no section") if not (section or {}).get("n") else ([], None, None)
        else:
            data, path, skip = _load(section)
        if data is None:
            stats["sources"][name] = {"path": path, "skipped": skip, "rows_in": 0, "rows_out": 0, "dropped": {}}
            continue
        if path:
            inputs.append(str(path))
        idx = _select(len(data), section.get("limit"), seed, name)
        st = _new_stats(path, len(data), len(idx))
        if name == "string_tools":
            rows = convert_string_tools(section, params, st)
        elif name == "glaive":
            rows = convert_glaive(data, idx, seed, st)
        elif name == "toolformer":
            st["parse_fallback"] = st["import_repaired"] = 0
            rows = convert_toolformer(data, idx, params, st)
        else:
            rows = convert_alpaca(data, idx, params, st)
        st["rows_out"] = len(rows)
        st["dropped"] = dict(sorted(st["dropped"].items()))
        st["tool_calls"] = sum(m["role"] == "tool" for r in rows for m in r["messages"])
        assert st["rows_in"] == st["rows_out"] + sum(st["dropped"].values()), name
        stats["sources"][name] = st
        rows_all += rows
        print(f"[sft_data] {name}: {st['rows_in']} in -> {st['rows_out']} out, dropped {st['dropped']}",
              file=sys.stderr)
    if not rows_all:
        raise ValueError("sft_data: no conversations: every source is null, has limit 0 or n 0, or lost all its rows "
                         f"(per source: { {k: v.get('skipped') or v.get('dropped') for k, v in stats['sources'].items()} })")
    for r in rows_all:
        _check_row(r)
    random.Random(seed).shuffle(rows_all)
    stats["rows_out"] = len(rows_all)
    stats["wall_s"] = round(time.time() - started, 2)
    write_jsonl(out / "train.jsonl", rows_all)
    write_json(out / "stats.json", stats)
    counts = {"rows": len(rows_all), **{f"{k}_rows": v["rows_out"] for k, v in stats["sources"].items()}}
    write_manifest(out, stage=STAGE, params=params, inputs=inputs, counts=counts, started=started,
                   extra={"outputs": ["train.jsonl", "stats.json"]})


if __name__ == "__main__":  # python -m rstar2.stages.sft_data OUT_DIR [params.json]
    run(json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {}, sys.argv[1])
