"""Python code inside source rows: the AST parser of GPTeacher Toolformer's inline ``python('...')`` calls, the
import fixer, and the static checks that keep re-executed code deterministic (paper §4.1 coding-tool use).

* :func:`find_python_calls` locates each inline ``python('...')`` with :mod:`ast` (the shortest
  ``python(...)`` slice that parses as a call with one argument, so quotes and parentheses inside the code are
  handled). The argument is normally a string literal; an unquoted argument made of constants only
  (``python('abc'[::-1])``) is taken as the code itself. When GPT-4 wrote unescaped inner quotes that no slice
  parses, a fallback takes the text between the opening quote and a closing ``')``, decodes it as a
  triple-quoted literal (optionally re-adding a quote the call swallowed at either end) and accepts the first
  version that compiles (``fallback`` is then true).
* :func:`add_missing_imports` prepends ``import X`` for stdlib modules used as ``X.attr`` but never bound.
* ``NETWORK`` and ``NONDETERMINISTIC`` match code that would make the stage's output depend on the network,
  the clock or randomness; such code is never run (drop reasons ``network_code``, ``nondeterministic_code``).
"""

from __future__ import annotations

import ast
import re

_CALL_START = re.compile(r"(?<![\w.])python\(")
NONDETERMINISTIC = re.compile(
    r"\b(?:now|today|utcnow|time|localtime|gmtime|perf_counter|monotonic)\s*\(|\brandom\b|\bsecrets\b|\buuid\b")
NETWORK = re.compile(r"\b(?:requests|urllib\d?|http\.client|httpx|aiohttp|socket)\b")
USELESS = re.compile(r"^<(?:function|generator object|map object|filter object|zip object|built-in|module|"
                      r"class|bound method|[\w.]+ object at 0x)")


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




_CALL_NAME = re.compile(r"\s*([A-Za-z_][\w .\-]*?)\s*\(")


def parse_call_list(text: str) -> list[tuple[str, dict]] | None:
    """Function calls written as a Python-style list, ``[name(key=value, ...), ...]`` (ToolACE's assistant
    turns), as ``[(name, arguments)]``; None when ``text`` is not such a list.

    Names may contain spaces, dots and dashes ("Get Stock Price"); every argument must be a keyword with a
    literal value (:func:`ast.literal_eval`).

    Raises:
        ValueError: it is such a list but an argument is positional or not a literal.
    """
    s = text.strip()
    if not (s.startswith("[") and s.endswith("]")) or not _CALL_NAME.match(s, 1):
        return None
    calls, pos, end = [], 1, len(s) - 1
    while pos < end:
        m = _CALL_NAME.match(s, pos)
        if not m:
            return None
        j, node = m.end() - 1, None
        while node is None and (j := s.find(")", j + 1)) != -1 and j < end:
            try:
                node = ast.parse("f(" + s[m.end():j + 1], mode="eval").body
            except SyntaxError:
                continue
        if node is None:
            return None
        if node.args or any(k.arg is None for k in node.keywords):
            raise ValueError(f"call {m.group(1)!r}: only keyword arguments are supported")
        calls.append((m.group(1).strip(), {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
        pos = j + 1
        while pos < end and s[pos] in ", \n\t":
            pos += 1
    return calls
