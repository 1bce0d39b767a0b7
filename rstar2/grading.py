"""Answer extraction and the binary answer reward (spec §1.1, §2.7; Math-Verify notes in frameworks.md §6).

The reward is 1.0 when the model's final answer is equivalent to the gold answer, else 0.0. There is no
format, tool-error or length term. Grading runs in this order, and the first rule that applies decides:

1. The answer comes from the model's **own final turn only** (:func:`extract_final_answer`): the last
   ``\\boxed{}`` (or ``\\fbox{}``) inside the last ``<answer>`` block if there is one, else the last box of
   the turn. ``<tool_call>`` and ``<tool_response>`` blocks are removed first, so a box printed by code never
   counts. Boxes are never merged into a set (Math-Verify merges several boxes of one string). A response
   whose last box is unfinished (``\\boxed{`` cut off by the length limit) has no answer: the extractor does
   not fall back to an earlier box.
2. No answer, or an empty one: 0.
3. Multiple-choice gold (a letter A–E, ``(B)``, ``\\text{(B)}``): compare the letters.
4. Both sides normalise to integers (``$``, ``\\text{}``, spaces, thousands separators in proper groups of
   three, unicode minus, leading zeros, a trailing ``.0``): compare exactly. ``12,34`` is *not* an integer.
   For an ``integer`` benchmark the answer must be an integer: the value after a last ``=`` counts
   (``x = 25``), but an unevaluated expression (``505 * 26``, ``2^{3}``, ``\\frac{16}{2}``, ``5!``) scores 0
   instead of going to Math-Verify, which would evaluate it. Otherwise a problem that *is* an expression is
   solved by copying it into the box (a policy found this within 5 RL steps on the bundled arithmetic task).
5. Both sides are exact rationals (``0.5``, ``1/2``, ``\\frac{1}{2}``): compare exactly with
   :class:`fractions.Fraction`, before any float tolerance.
6. Otherwise Math-Verify 0.9.0: the gold is parsed wrapped in ``\\boxed{}`` (fallback ``$...$``), the
   prediction wrapped in ``\\boxed{}`` with the LaTeX and Expr configs, then ``verify(gold, pred)``,
   **gold first**. Every exception and Math-Verify's ``TimeoutException`` (a ``BaseException``) gives 0.

An unparseable gold answer (empty, prose such as ``see figure``, or nothing Math-Verify can read) is a data
error: :func:`grade` raises ``ValueError`` naming it and never rewards 1. Data preparation should reject such
rows with :func:`gold_is_valid`.

Threads: Math-Verify's timeouts use ``signal.alarm``, which only works in the main thread. Timeouts are
passed there and ``None`` elsewhere (a caller that grades from threads must enforce its own deadline, e.g.
a process pool whose workers run tasks in their main thread). The alarm is process-wide, so do not grade in
the main thread while something else in the same process relies on ``SIGALRM``.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from functools import lru_cache

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .data.answers import MATH_DELIMITERS, normalize_integer_answer

#: How a gold answer is read and compared; benchmarks declare one (rstar2.data.benchmarks).
#: ``math``: the general rules below (a letter gold is compared as a letter); ``integer``: the gold must be an
#: integer (else a data error), then the general rules; ``choice``: multiple choice, the gold is one letter and
#: only the predicted letter counts (GPQA-Diamond), so ``\\boxed{(C) 4.2 eV}`` is graded on its ``C``.
ANSWER_TYPES = ("math", "integer", "choice")

#: Seconds for one Math-Verify parse / one verify call (main thread only; ``signal.alarm`` granularity is 1 s).
PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5

# ---------------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TOOL_CALL_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)
_ASSISTANT_MARK = "<|im_start|>assistant"


def _balanced(text: str, start: int) -> int | None:
    """Index just past the ``}`` matching the ``{`` at ``text[start]``; None if it never closes.

    Escaped braces (``\\{``, ``\\}``) do not count.
    """
    depth = 0
    i = start
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_boxed(text: str | None) -> str | None:
    """Content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (nested braces handled).

    Returns None when there is no box, or when the last box is unfinished (``\\boxed{`` without its closing
    brace, as in a response cut off by the length limit). It never falls back to an earlier box. An empty
    box gives ``""``. The Minerva-style ``\\boxed 5`` (space, no braces) is read as the token after the space.
    """
    if not text:
        return None
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    i = m.end()
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if i >= len(text):
        return None                         # "\boxed" at the very end: truncated
    if text[i] == "{":
        end = _balanced(text, i)
        if end is None:
            return None                     # unfinished box: no answer
        return text[i + 1:end - 1]
    if i > m.end():                          # "\boxed 5"
        tok = re.match(r"[^\s$]+", text[i:])
        return tok.group(0).rstrip(".,;") if tok else None
    return None


def final_turn_text(text: str | None) -> str:
    """Reduce a response (or a whole transcript) to the model's own text of its final assistant turn.

    Keeps what follows the last ``<|im_start|>assistant`` marker and the last ``</tool_response>``, then
    removes ``<tool_call>`` and ``<tool_response>`` blocks (closed or cut off at the end). The prompt's
    instruction and tool outputs both contain ``\\boxed{}`` text that must never count as the model's answer.
    """
    text = text or ""
    if _ASSISTANT_MARK in text:
        text = text.rsplit(_ASSISTANT_MARK, 1)[1]
    if "</tool_response>" in text:
        text = text.rsplit("</tool_response>", 1)[1]
    text = _TOOL_RESPONSE_RE.sub(" ", text)
    text = _TOOL_CALL_RE.sub(" ", text)
    return text


def extract_final_answer(final_turn: str | None) -> str | None:
    """The model's final answer, or None.

    From the model's final turn (see :func:`final_turn_text`): if it has an ``<answer>`` tag, the answer
    region is the last ``<answer>`` block (up to ``</answer>``, or to the end when the tag was never closed)
    and the answer is the last box inside it; otherwise the last box of the turn. An empty or unfinished
    last box gives None. Several boxes are never merged.
    """
    text = final_turn_text(final_turn)
    if "<answer>" in text:
        region = text.rsplit("<answer>", 1)[1]
        region = region.split("</answer>", 1)[0]
    else:
        region = text
    box = extract_boxed(region)
    if box is None or not box.strip():
        return None
    return box.strip()


# ---------------------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------------------

_MINUS = {"\u2212": "-", "\ufe63": "-", "\uff0d": "-"}
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEC_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_SLASH_RE = re.compile(r"([+-]?)\(?([+-]?\d+)\)?/\(?(\d+)\)?")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
_LETTER_RE = re.compile(r"\(?\s*([A-E])\s*\)?\.?")
_SIZING_RE = re.compile(r"\\(?:left|right|displaystyle|big|Big|bigg|Bigg)(?![A-Za-z])")


def _ascii_minus(s: str) -> str:
    for k, v in _MINUS.items():
        s = s.replace(k, v)
    return s


def _strip_delimiters(s: str) -> str:
    """Remove one pair of math delimiters ($..$, $$..$$, \\(..\\), \\[..\\]) enclosing the whole string."""
    for a, b in MATH_DELIMITERS:
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a):len(s) - len(b)].strip()
    return s


def _light(s: str) -> str:
    """Minimal cleaning for Math-Verify input: unicode minus and outer math delimiters only.

    ``\\text{}`` stays, so Math-Verify reads ``\\text{Evelyn}`` as one symbol, not a product of letters.
    """
    return _strip_delimiters(_ascii_minus(str(s).strip()))


def _clean(s: str) -> str:
    """Strip the wrappers that never change a value: math delimiters, \\text{}, \\left/\\right, unicode minus."""
    s = _ascii_minus(str(s).strip())
    changed = True
    while changed:
        before = s
        s = _strip_delimiters(s.strip())
        box = re.fullmatch(r"\\(?:boxed|fbox)\s*\{(.*)\}", s, re.DOTALL)
        if box and _balanced(s, s.index("{")) == len(s):
            s = box.group(1).strip()
        s = _TEXT_WRAP_RE.sub(r"\1", s)
        s = _SIZING_RE.sub("", s).strip()
        if s.endswith(".") and not s.endswith(".."):
            s = s[:-1].rstrip()
        changed = s != before
    return s


def _as_int(s: str) -> int | None:
    """The integer ``s`` spells, or None: the same rules as gold curation (data.answers), so the grader and
    the integer filter can never disagree on what an integer answer is."""
    return normalize_integer_answer(_clean(s), max_abs=10**100)


def _as_fraction(s: str) -> Fraction | None:
    """The exact rational ``s`` spells (integer, decimal, ``a/b``, ``\\frac{a}{b}``), or None."""
    n = _as_int(s)
    if n is not None:
        return Fraction(n)
    t = _clean(s).replace(" ", "")
    try:
        if _DEC_RE.fullmatch(t):
            return Fraction(t)
        m = _SLASH_RE.fullmatch(t)
        if m:
            sign, num, den = m.groups()
            if int(den) == 0:
                return None
            return Fraction(int(num), int(den)) * (-1 if sign == "-" else 1)
        m = _FRAC_RE.fullmatch(t)
        if m:
            sign, n1, n2, d1, d2 = m.groups()
            num, den = int(n1 or n2), int(d1 or d2)
            if den == 0:
                return None
            return Fraction(num, den) * (-1 if sign == "-" else 1)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _as_letter(s: str) -> str | None:
    """The multiple-choice letter A–E that ``s`` spells (``B``, ``(B)``, ``\\text{(B)}``, ``\\textbf{(B)}``)."""
    m = _LETTER_RE.fullmatch(_clean(s))
    return m.group(1) if m else None


def normalize_answer(s: str | None) -> str | None:
    """A canonical string for an answer: the integer as digits when it is one (``004`` -> ``4``,
    ``1{,}000`` -> ``1000``, ``−3`` -> ``-3``), else the cleaned string. Used for display and for
    majority voting; grading itself uses :func:`grade`."""
    if s is None:
        return None
    n = _as_int(s)
    if n is not None:
        return str(n)
    return _clean(s)


# ---------------------------------------------------------------------------------------------------------
# Gold validation and grading
# ---------------------------------------------------------------------------------------------------------

_LATEX_CMD_RE = re.compile(r"\\[A-Za-z]+")
_TEXT_BLOCK_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_PHRASE_RE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")


def _timeout(seconds: int) -> int | None:
    """``seconds`` in the main thread, None elsewhere (signal-based timeouts fail outside the main thread)."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def _looks_like_prose(gold: str) -> bool:
    """True when the gold, outside ``\\text{}`` blocks and LaTeX commands, has two words in a row.

    Math-Verify reads ``see figure`` as the product s*e*e*f*i*g*u*r*e, so parsing alone cannot tell.
    ``\\text{no solution}`` and ``2ab + bc`` are not prose.
    """
    bare = _LATEX_CMD_RE.sub(" ", _TEXT_BLOCK_RE.sub(" ", gold))
    return _PHRASE_RE.search(bare) is not None


@lru_cache(maxsize=65536)
def _parse_gold(gold: str, timeout: int | None) -> tuple:
    """Math-Verify parse of a gold answer: ``\\boxed{gold}`` with the LaTeX config, fallback ``$gold$``."""
    parsed = parse("\\boxed{" + gold + "}", extraction_config=[LatexExtractionConfig()],
                   parsing_timeout=timeout)
    if not parsed:
        parsed = parse("$" + gold + "$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                       parsing_timeout=timeout)
    return tuple(parsed)


def _gold_problem(gold, answer_type: str = "math") -> str | None:
    """Why ``gold`` is unusable as a gold of ``answer_type``, or None when it is fine. Cheap paths first;
    Math-Verify last."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, not {answer_type!r}")
    if gold is None or not str(gold).strip():
        return "empty gold answer"
    g = str(gold).strip()
    if answer_type == "choice":
        return None if _choice_letter(g) is not None else "a multiple-choice gold must be one letter A-Z"
    if answer_type == "integer":
        return None if _as_int(g) is not None else "gold of an integer-answer benchmark is not an integer"
    if _as_letter(g) is not None or _as_fraction(g) is not None:
        return None
    if _looks_like_prose(g):
        return "gold answer is prose, not a math answer"
    try:
        parsed = _parse_gold(_light(g), _timeout(PARSE_TIMEOUT_S))
    except (Exception, TimeoutException) as e:   # TimeoutException is a BaseException
        return f"gold answer could not be parsed ({type(e).__name__})"
    if not parsed:
        return "Math-Verify parses nothing from the gold answer"
    return None


def gold_is_valid(gold, answer_type: str = "math") -> bool:
    """True when ``gold`` can be graded against. Data preparation drops rows for which this is False.

    Raises:
        ValueError: ``answer_type`` is not one of :data:`ANSWER_TYPES`.
    """
    return _gold_problem(gold, answer_type) is None


def check_gold(gold, answer_type: str = "math") -> None:
    """Raise ``ValueError`` naming the gold answer when it cannot be graded against (a data error)."""
    problem = _gold_problem(gold, answer_type)
    if problem is not None:
        raise ValueError(f"unparseable gold answer {gold!r}: {problem}")


_CHOICE_RE = re.compile(r"\(?\s*([A-Za-z])\s*\)?[.:]?")
_CHOICE_PREFIX_RE = re.compile(r"\(\s*([A-Za-z])\s*\)|([A-Z])\s*[.:)](?=\s|$)")


def _choice_letter(s: str) -> str | None:
    """The option letter a multiple-choice answer names, upper-cased, or None.

    Accepts ``C``, ``(C)``, ``\\text{(C)}``, ``C.`` and an option written out after its letter
    (``(C) 4.2 eV``, ``C: 4.2 eV``). A lower-case letter counts only in parentheses: ``c`` alone is as
    likely a variable.
    """
    t = _clean(s)
    m = _CHOICE_RE.fullmatch(t)
    if m and (t[0] == "(" or m.group(1).isupper()):
        return m.group(1).upper()
    m = _CHOICE_PREFIX_RE.match(t)
    if m and len(t) > m.end():
        return (m.group(1) or m.group(2)).upper()
    return None


def grade_choice(pred: str | None, gold: str) -> float:
    """Multiple-choice grading on the letter: 1.0 if ``pred`` names the gold's option letter, else 0.0.

    GPQA-Diamond's grading is not stated in the paper (spec §6.1, [UNCONFIRMED]); comparing the letter the
    model boxed is the usual protocol. Never a substring search: ``\\boxed{B or C}`` names no single letter.

    Raises:
        ValueError: ``gold`` is not one letter (a data error).
    """
    check_gold(gold, "choice")
    if pred is None:
        return 0.0
    return float(_choice_letter(pred) == _choice_letter(gold))


def _math_verify(pred: str, gold: str) -> bool:
    t_parse, t_verify = _timeout(PARSE_TIMEOUT_S), _timeout(VERIFY_TIMEOUT_S)
    gold_parsed = list(_parse_gold(_light(gold), t_parse))
    pred_parsed = parse("\\boxed{" + pred + "}",
                        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                        parsing_timeout=t_parse)
    if not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=t_verify))


# An arithmetic operation between two operands, or a LaTeX operator that computes a value.
_UNEVALUATED = re.compile(r"[\w)}\]]\s*(?:[-+*/^×÷·]|\\times|\\cdot|\\div|\\ast)\s*[\w({\[\\]"
                          r"|\\(?:d?t?frac|sqrt|binom|choose)\b|\d\s*!")


def grade(pred: str | None, gold: str, answer_type: str = "math") -> float:
    """1.0 if ``pred`` (an extracted final answer) is equivalent to ``gold``, else 0.0.

    Order: gold check (``ValueError`` if unusable) → no/empty prediction 0 → multiple-choice letters →
    exact integers → exact rationals → Math-Verify ``verify(gold, pred)``. Any exception or Math-Verify
    timeout during the comparison gives 0.0; the reward never defaults to 1. ``answer_type="choice"``
    grades on the option letter only (:func:`grade_choice`).

    Raises:
        ValueError: ``gold`` is empty or unparseable (data error), or not a gold of ``answer_type``; the
            message names it.
    """
    if answer_type == "choice":
        return grade_choice(pred, gold)
    check_gold(gold, answer_type)
    if pred is None:
        return 0.0
    try:
        p = _clean(pred)
        if not p:
            return 0.0
        g = _clean(str(gold))
        gl = _as_letter(g)
        if gl is not None:
            return float(_as_letter(p) == gl)
        if p == g:
            return 1.0
        gi, pi = _as_int(g), _as_int(p)
        if gi is not None and pi is not None:
            return float(gi == pi)
        if answer_type == "integer":
            # the value after the last "=" is the answer ("x = 25", "505 \times 26 = 13130"); an expression
            # left for the grader to evaluate ("505 * 26", "2^{3}") is not an integer answer
            tail = p.rsplit("=", 1)[-1].strip()
            ti = _as_int(tail)
            if ti is not None:
                return float(gi == ti)
            if _UNEVALUATED.search(tail):
                return 0.0
        gf, pf = _as_fraction(g), _as_fraction(p)
        if gf is not None and pf is not None:
            return float(gf == pf)
        return float(_math_verify(_light(pred), str(gold)))
    except (Exception, TimeoutException):       # TimeoutException derives from BaseException
        return 0.0


def score_trajectory(final_turn: str, gold: str, *, on_bad_gold: str = "raise",
                     answer_type: str = "math") -> dict:
    """Extract the final answer of a trajectory and grade it: ``{"pred": str | None, "reward": float}``.

    Args:
        final_turn: the model's final assistant turn (a whole transcript also works: everything up to the
            last tool response is ignored, see :func:`final_turn_text`).
        gold: the gold answer.
        on_bad_gold: ``"raise"`` (default) lets :func:`grade`'s ``ValueError`` through; ``"zero"`` returns
            reward 0.0 with an ``"error"`` entry instead, so an RL step can count bad rows and go on.
        answer_type: one of :data:`ANSWER_TYPES` (the benchmark's declared type), passed to :func:`grade`.
    """
    if on_bad_gold not in ("raise", "zero"):
        raise ValueError(f"on_bad_gold must be 'raise' or 'zero', not {on_bad_gold!r}")
    pred = extract_final_answer(final_turn)
    try:
        reward = grade(pred, gold, answer_type)
    except ValueError as e:
        if on_bad_gold == "raise":
            raise
        return {"pred": pred, "reward": 0.0, "error": f"bad_gold: {e}"}
    return {"pred": pred, "reward": reward}
