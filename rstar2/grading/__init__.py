"""Answer extraction and the binary answer reward (paper §2.1, §2.2.1; released code fused_compute_score/).

The reward is 1.0 when the model's final answer is equivalent to the gold answer, else 0.0. There is no
format, tool-error or length term. Grading runs in this order, and the first rule that applies decides:

1. The answer comes from the model's **own final turn only** (:mod:`.extraction`): the last box of the last
   ``<answer>`` block, else of the turn; tool calls and responses removed; never merged; an unfinished last
   box is no answer.
2. No answer, or an empty one: 0.
3. Notations are read first, on both sides alike (:mod:`.notation`): a repeating decimal
   (``0.1\\overline{6}``) is the fraction it denotes, and ``6.02e23`` (a mantissa, ``e``, an exponent, no
   space) is scientific notation, never Euler's number.
4. Multiple-choice gold (a letter A–E, ``(B)``, ``\\text{(B)}``): compare the letters; the answer may be a
   phrase around one letter (``The answer is (B)``; :mod:`.choice`).
5. Base-n numerals (``1011_2``, ``2A_{16}``) are compared by value, never by their digits across bases; bare
   digits are read in the base the gold states (:mod:`.bases`).
6. Units (:mod:`.units`): when both sides carry one (``5 \\text{ cm}``, ``30^\\circ``, ``\\$5``, ``28\\%``)
   they must be the same unit, or the answer is wrong; then only the values are compared (a unit on one side
   only does not decide). No conversion: ``5 m`` is not ``500 cm``.
7. Both sides normalise to integers (``$``, ``\\text{}``, spaces, thousands separators in proper groups of
   three, unicode minus, leading zeros, a trailing ``.0``): compare exactly. ``12,34`` is *not* an integer.
   For an ``integer`` benchmark the answer must be an integer (:mod:`.integer`): ``x = 25`` counts, an
   unevaluated expression (``505 * 26``, ``2^{3}``, ``5!``) scores 0.
8. Both sides are rationals written as numbers (``0.5``, ``1/2``, ``\\frac{1}{2}``, ``1.5e-3``,
   ``1.5 \\times 10^{-3}``): compared exactly with :class:`fractions.Fraction`, except that two decimals
   (neither side exact) are equal within the relative tolerance :data:`DECIMAL_RTOL` (1e-9), and that a decimal
   of 15 to 17 significant digits equals a non-integer exact value when it reads as the float64 nearest it
   (``0.6666666666666666`` = 2/3, what ``print(2/3)`` shows; :mod:`.floats`).
9. Both sides parse to exact values or structures (:mod:`.symbolic`): equal only if the difference is
   exactly 0, element by element for intervals, tuples, sets and matrices (the float64 rule of 8 for a
   decimal standing alone); no float tolerance.
10. Otherwise Math-Verify 0.9.0 ``verify(gold, pred)``, **gold first**. Every exception and Math-Verify's
    ``TimeoutException`` (a ``BaseException``) gives 0.

The same function grades RL rewards, hard-problem mining and evaluation (all through :func:`score_trajectory`
in :mod:`rstar2.grading_pool`), so one rule set decides everywhere; docs/grading.md states the rules with
examples.

An unparseable gold answer (empty, prose such as ``see figure``, or nothing Math-Verify can read) is a data
error: :func:`grade` raises ``ValueError`` naming it and never rewards 1. Data preparation should reject such
rows with :func:`gold_is_valid`. Comparisons can take long or hang (``2^{2^{100}}``): run them through
:mod:`rstar2.grading_pool`, whose workers are killed at a per-item deadline.

Benchmarks that are not answer-graded (IFEval, BFCL) are checked by the field's reference checkers in
:mod:`.ifeval` and :mod:`.bfcl` (:data:`CHECKERS`), also inside the grading workers.
"""

from __future__ import annotations

import re

from fractions import Fraction

from .answers import last_boxed
from .bases import INVALID, base_decision, read_numeral
from .choice import choice_letter, letters_match
from .extraction import extract_final_answer, final_turn_text
from .floats import is_float_print, same_double
from .integer import integer_tail
from .normalize import as_fraction, as_int, as_letter, clean, is_decimal, light, normalize_answer
from .notation import rewrite
from .units import split_unit
from .symbolic import (DECIMAL_RTOL, PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S, TimeoutException, decimals_close,
                       exact_decision, math_verify_equal, parse_gold, printed_equal, timeout)

#: How a gold answer is read and compared; benchmarks declare one (rstar2.data.benchmarks).
#: ``math``: the general rules above (a letter gold is compared as a letter); ``integer``: the gold must be an
#: integer (else a data error), then the general rules; ``choice``: multiple choice, the gold is one letter and
#: only the predicted letter counts (GPQA-Diamond), so ``\\boxed{(C) 4.2 eV}`` is graded on its ``C``.
ANSWER_TYPES = ("math", "integer", "choice")
#: Benchmarks checked by a reference checker on the whole response instead of an extracted answer.
CHECKERS = ("ifeval", "bfcl")

__all__ = ["ANSWER_TYPES", "CHECKERS", "DECIMAL_RTOL", "PARSE_TIMEOUT_S", "TimeoutException", "VERIFY_TIMEOUT_S",
           "check_gold", "extract_final_answer", "final_turn_text", "gold_is_valid", "grade", "grade_choice",
           "last_boxed", "normalize_answer", "score_trajectory"]

_LATEX_CMD_RE = re.compile(r"\\[A-Za-z]+")
_TEXT_BLOCK_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_PHRASE_RE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")


def _looks_like_prose(gold: str) -> bool:
    """True when the gold, outside ``\\text{}`` blocks and LaTeX commands, has two words in a row.

    Math-Verify reads ``see figure`` as the product s*e*e*f*i*g*u*r*e, so parsing alone cannot tell.
    ``\\text{no solution}`` and ``2ab + bc`` are not prose.
    """
    bare = _LATEX_CMD_RE.sub(" ", _TEXT_BLOCK_RE.sub(" ", gold))
    return _PHRASE_RE.search(bare) is not None


def _braces_balanced(text: str) -> bool:
    """LaTeX groups close in order: every ``}`` has an open ``{`` before it and none stays open (``\\{`` and
    ``\\}``, literal braces, do not count)."""
    depth = 0
    for ch in text.replace("\\{", "").replace("\\}", ""):
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


def _gold_problem(gold, answer_type: str = "math") -> str | None:
    """Why ``gold`` is unusable as a gold of ``answer_type``, or None when it is fine. Cheap paths first;
    Math-Verify last."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, not {answer_type!r}")
    if gold is None or not str(gold).strip():
        return "empty gold answer"
    g = str(gold).strip()
    if answer_type == "choice":
        return None if choice_letter(g) is not None else "a multiple-choice gold must be one letter A-Z"
    if answer_type == "integer":
        return None if as_int(g) is not None else "gold of an integer-answer benchmark is not an integer"
    if as_letter(g) is not None or as_fraction(rewrite(light(g))) is not None:
        return None
    if read_numeral(clean(g)) == INVALID:
        return "gold answer is a base-n numeral whose digits do not fit its base"
    if _looks_like_prose(g):
        return "gold answer is prose, not a math answer"
    if not _braces_balanced(g):   # Math-Verify reads "\\frac{5}{" as something, which no answer would equal
        return "gold answer has unbalanced braces"
    try:
        parsed = parse_gold(light(g), timeout(PARSE_TIMEOUT_S))
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


def grade_choice(pred: str | None, gold: str) -> float:
    """Multiple-choice grading on the letter: 1.0 if ``pred`` names the gold's option letter, else 0.0.

    Raises:
        ValueError: ``gold`` is not one letter (a data error).
    """
    check_gold(gold, "choice")
    return letters_match(pred, gold)


def grade(pred: str | None, gold: str, answer_type: str = "math") -> float:
    """1.0 if ``pred`` (an extracted final answer) is equivalent to ``gold``, else 0.0 (rules 2-10 above).

    Any exception or Math-Verify timeout during the comparison gives 0.0; the reward never defaults to 1.
    ``answer_type="choice"`` grades on the option letter only (:func:`grade_choice`).

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
        lp, lg = rewrite(light(pred)), rewrite(light(str(gold)))
        p, g = clean(lp), clean(lg)
        if not p:
            return 0.0
        gl = as_letter(g)
        if gl is not None:
            return float(choice_letter(p, phrase=True) == gl)
        if p == g:
            return 1.0
        gi = as_int(g)
        based = base_decision(p, g, gi)
        if based is not None:
            return float(based)
        (lp, p_unit), (lg, g_unit) = split_unit(lp), split_unit(lg)
        if p_unit and g_unit and p_unit != g_unit:     # () is a label, not a unit
            return 0.0
        if p_unit is not None or g_unit is not None:
            p, g = clean(lp), clean(lg)
            if p == g:
                return 1.0
            if g_unit is not None:
                gi = as_int(g)
        pi = as_int(p)
        if gi is not None and pi is not None:
            return float(gi == pi)
        if answer_type == "integer":
            decided = integer_tail(p, gi)
            if decided is not None:
                return decided
        gf = Fraction(gi) if gi is not None else as_fraction(g)
        pf = as_fraction(p)
        if gf is not None and pf is not None:
            return float(_rationals_equal(pf, gf, p, None if gi is not None else g))
        if pf is not None and is_float_print(pf) and is_decimal(p) and printed_equal(pf, lg, other_is_gold=True):
            return 1.0
        if gf is not None and is_float_print(gf) and is_decimal(g) and printed_equal(gf, lp, other_is_gold=False):
            return 1.0
        decided = exact_decision(lp, lg)
        if decided is not None:
            return float(decided)
        return float(math_verify_equal(lp, lg))
    except (Exception, TimeoutException):       # TimeoutException derives from BaseException
        return 0.0


def _rationals_equal(pf: Fraction, gf: Fraction, p: str, g: str | None) -> bool:
    """Rule 8 for the rationals ``p`` and ``g`` spell: two decimals within :data:`DECIMAL_RTOL`; a decimal against an
    exact value by the float64 rule or exactly; two exact values exactly. ``g`` None: the gold is an integer."""
    if pf == gf:
        return True
    p_decimal, g_decimal = is_decimal(p), g is not None and is_decimal(g)
    if p_decimal and g_decimal:
        return decimals_close(gf, pf)
    if p_decimal != g_decimal:
        return same_double(pf, gf) if p_decimal else same_double(gf, pf)
    return False


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
