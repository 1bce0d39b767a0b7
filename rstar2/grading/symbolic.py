"""Exact equivalence of math answers (answer_type ``math``; paper §2.2.1), then Math-Verify.

Both sides are parsed with Math-Verify 0.9.0 (gold wrapped in ``\\boxed{}``, fallback ``$...$``; prediction
wrapped in ``\\boxed{}`` with the LaTeX and Expr configs). Math-Verify's own ``verify`` compares numbers
within a float tolerance, so two different exact values that are both tiny (``2^{-30}`` and ``2^{-31}``,
``1/20!`` and ``1/21!``) or that differ far from the leading digits scored as equal. Here, wherever both
sides are exact values or expressions, equality is decided exactly:

* every decimal literal is read as the rational it spells (``1.5 \\times 10^{-3}`` is 3/2000), a trailing
  ``\\%`` is a unit (``28\\%`` is 28, handed case G09);
* numbers and expressions (rationals, radicals, π, e, factorials, powers, logs, trig, symbols, sums of these):
  equal only if the difference is exactly 0: it evaluates to 0, ``sympy.simplify`` reduces it to 0, or its
  minimal polynomial is ``x`` (exact for algebraic numbers: radicals that do not denest). Unequal when it is
  provably non-zero: sympy's adaptive ``evalf`` certifies 30 significant digits of a non-zero value (which
  resolves differences in the 20th digit, or of size 10^-400), or the minimal polynomial is not ``x``, or an
  expression with free symbols does not simplify to 0. An undecided difference is unequal: never 1 by default;
* intervals (endpoints and open/closed ends), tuples (in order), sets (as sets), unions of intervals,
  matrices (by shape and entry) and ``x = value`` (its value) element by element with the same rule; an open
  interval ``(a, b)`` against a 2-tuple or 2-set is compared as the pair;
* two plain decimals (``3.14`` vs ``3.1400001``; neither side exact, a value the problem may give
  approximately) are equal within a **relative tolerance of 1e-9**: :data:`DECIMAL_RTOL`, applied in
  :func:`rstar2.grading.grade` before this module is reached. No other tolerance exists;
* a decimal of 15 to 17 significant digits standing alone (the whole answer, or one element of a structure)
  equals a non-integer exact value when it reads as the float64 nearest that value (:mod:`.floats`).

Anything else (inequalities, booleans, text Math-Verify reads as something other than the above, or two
sides of different kinds) is left to ``verify(gold, pred)``, **gold first**. Every exception and
Math-Verify's ``TimeoutException`` (a ``BaseException``) gives 0.

Threads: Math-Verify's timeouts use ``signal.alarm``, which only works in the main thread. Timeouts are
passed there and ``None`` elsewhere; the sympy work here has no timeout of its own. Both are bounded by the
caller: rstar2.grading_pool runs every comparison in the main thread of a worker process and SIGKILLs a
worker that overruns its per-item deadline (``2^{2^{100}}`` never returns).
"""

from __future__ import annotations

import threading
from fractions import Fraction
from functools import lru_cache

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from sympy.core.evalf import PrecisionExhausted

from .floats import is_float_print, same_double

#: Seconds for one Math-Verify parse / one verify call (main thread only; ``signal.alarm`` granularity is 1 s).
PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
#: The only tolerance: between two plain decimals, |a - b| <= DECIMAL_RTOL * max(|a|, |b|).
DECIMAL_RTOL = Fraction(1, 10**9)
#: Significant digits sympy's evalf must certify before a non-zero difference counts as proof of inequality.
_CERTIFY_DIGITS = 30
_X = sympy.Symbol("x")


def timeout(seconds: int) -> int | None:
    """``seconds`` in the main thread, None elsewhere (signal-based timeouts fail outside the main thread)."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def decimals_close(a: Fraction, b: Fraction) -> bool:
    """Two plain decimals within :data:`DECIMAL_RTOL` of each other (exact arithmetic on the rationals)."""
    return abs(a - b) <= DECIMAL_RTOL * max(abs(a), abs(b))


@lru_cache(maxsize=65536)
def parse_gold(gold: str, timeout_s: int | None) -> tuple:
    """Math-Verify parse of a gold answer: ``\\boxed{gold}`` with the LaTeX config, fallback ``$gold$``."""
    parsed = parse("\\boxed{" + gold + "}", extraction_config=[LatexExtractionConfig()],
                   parsing_timeout=timeout_s)
    if not parsed:
        parsed = parse("$" + gold + "$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                       parsing_timeout=timeout_s)
    return tuple(parsed)


def parse_pred(pred: str, timeout_s: int | None) -> list:
    """Math-Verify parse of a prediction: ``\\boxed{pred}`` with the LaTeX and Expr configs."""
    return parse("\\boxed{" + pred + "}", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=timeout_s)


def _strip_percent(s: str) -> str:
    t = s.rstrip()
    for unit in ("\\%", "%"):
        if t.endswith(unit):
            return t[: -len(unit)].rstrip()
    return s


def _exact(obj) -> tuple[object, frozenset]:
    """``obj`` with every Float replaced by the rational its decimal digits spell (Math-Verify keeps the
    digits of the text in the Float's precision, so ``str`` gives them back), and the set of those rationals
    that have a float64 print's 15 to 17 significant digits (:mod:`.floats`)."""
    if isinstance(obj, sympy.MatrixBase):
        floats = set().union(*(e.atoms(sympy.Float) for e in obj)) if obj else set()
    elif isinstance(obj, sympy.Basic):
        floats = obj.atoms(sympy.Float)
    else:
        return obj, frozenset()
    if not floats:
        return obj, frozenset()
    exact = {f: sympy.Rational(str(f)) for f in floats}
    printed = frozenset(r for r in exact.values() if is_float_print(Fraction(int(r.p), int(r.q))))
    return (obj.applyfunc(lambda e: e.xreplace(exact)) if isinstance(obj, sympy.MatrixBase)
            else obj.xreplace(exact)), printed


def _first_sympy(parsed) -> tuple[object, frozenset] | None:
    for p in parsed or ():
        if isinstance(p, (sympy.Basic, sympy.MatrixBase)):
            return _exact(p)
    return None


def _float_print_equal(a, b, printed: frozenset) -> bool:
    """The float64 rule (:mod:`.floats`): one side a number a float64 print spelled, the other exact."""
    if (a in printed) == (b in printed):
        return False
    dec, other = (a, b) if a in printed else (b, a)
    return same_double(Fraction(int(dec.p), int(dec.q)), other)


def expressions_equal(a: sympy.Expr, b: sympy.Expr, printed: frozenset = frozenset()) -> bool:
    """Exact equality of two sympy expressions (module docstring): True only for a zero difference, or by the
    float64 rule when one of them is a number in ``printed`` (decimals of 15-17 digits, :mod:`.floats`)."""
    if a == b:
        return True
    if printed and _float_print_equal(a, b, printed):
        return True
    d = sympy.sympify(a - b).doit()
    if d == 0:
        return True
    if d.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return False                        # infinities that are not the same infinity
    if d.free_symbols:
        return sympy.simplify(d) == 0
    try:
        if d.evalf(_CERTIFY_DIGITS, strict=True) != 0:
            return False                    # certified non-zero
    except PrecisionExhausted:
        pass                                # cancels to many digits: possibly exactly 0
    s = sympy.simplify(d)
    if s == 0:
        return True
    try:
        return sympy.minimal_polynomial(s, _X) == _X
    except (sympy.polys.polyerrors.NotAlgebraic, NotImplementedError, ValueError):
        return False                        # undecided: never equal by default


def _as_elements(obj) -> tuple[list, bool] | None:
    """(elements, ordered) of a tuple, a finite set or an open interval read as a pair; None otherwise."""
    if isinstance(obj, sympy.Tuple):
        return list(obj), True
    if isinstance(obj, sympy.FiniteSet):
        return list(obj), False
    if isinstance(obj, sympy.Interval) and obj.left_open and obj.right_open:
        return [obj.start, obj.end], True
    return None


def _elements_equal(xs: list, ys: list, ordered: bool, printed: frozenset = frozenset()) -> bool | None:
    if len(xs) != len(ys):
        return False
    if ordered:
        results = [structures_equal(x, y, printed) for x, y in zip(xs, ys)]
        return None if None in results else all(results)
    left = list(ys)
    for x in xs:                            # set: every element matched by a distinct equal one
        for j, y in enumerate(left):
            r = structures_equal(x, y, printed)
            if r is None:
                return None
            if r:
                del left[j]
                break
        else:
            return False
    return True


def structures_equal(a, b, printed: frozenset = frozenset()) -> bool | None:
    """Exact equality of two parsed answers, element by element; None when ``a`` and ``b`` are not kinds this
    module decides (then Math-Verify does). ``printed``: numbers spelled by float64 prints (:mod:`.floats`),
    which equal an exact element by the float64 rule."""
    if isinstance(a, sympy.Eq) != isinstance(b, sympy.Eq):
        eq, other = (a, b) if isinstance(a, sympy.Eq) else (b, a)
        if eq.lhs.is_Symbol:                # "x = 5" against "5": its value
            return structures_equal(eq.rhs, other, printed)
        return None
    if isinstance(a, sympy.Eq):
        r = [structures_equal(a.lhs, b.lhs, printed), structures_equal(a.rhs, b.rhs, printed)]
        return None if None in r else all(r)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if not (isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase)):
            return None
        return a.shape == b.shape and _elements_equal(list(a), list(b), True, printed)
    if isinstance(a, sympy.Interval) and isinstance(b, sympy.Interval):
        return (a.left_open == b.left_open and a.right_open == b.right_open
                and expressions_equal(a.start, b.start, printed) and expressions_equal(a.end, b.end, printed))
    if isinstance(a, sympy.Union) and isinstance(b, sympy.Union):
        return _elements_equal(list(a.args), list(b.args), False, printed)
    ea, eb = _as_elements(a), _as_elements(b)
    if ea is not None and eb is not None:
        return _elements_equal(ea[0], eb[0], ea[1] and eb[1], printed)
    if isinstance(a, sympy.FiniteSet) and len(a) == 1 and isinstance(b, sympy.Expr):
        return structures_equal(next(iter(a)), b, printed)   # {3} against 3
    if isinstance(b, sympy.FiniteSet) and len(b) == 1 and isinstance(a, sympy.Expr):
        return structures_equal(a, next(iter(b)), printed)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return expressions_equal(a, b, printed)
    return None


def exact_decision(pred: str, gold: str) -> bool | None:
    """Decide ``pred`` == ``gold`` exactly when both parse to exact values or structures of them; None when
    either does not (the caller then asks Math-Verify). Inputs are lightly cleaned strings."""
    t = timeout(PARSE_TIMEOUT_S)
    g = _first_sympy(parse_gold(_strip_percent(gold), t))
    p = _first_sympy(parse_pred(_strip_percent(pred), t))
    if g is None or p is None:
        return None
    return structures_equal(g[0], p[0], g[1] | p[1])


def printed_equal(decimal: Fraction, other: str, other_is_gold: bool) -> bool:
    """The float64 rule (:mod:`.floats`) for a whole answer that is a decimal (``1.7320508075688772e-05``)
    against the other side, a lightly cleaned string parsed as the gold or the prediction."""
    t = timeout(PARSE_TIMEOUT_S)
    x = _first_sympy(parse_gold(other, t) if other_is_gold else parse_pred(other, t))
    return x is not None and isinstance(x[0], sympy.Expr) and same_double(decimal, x[0])


def math_verify_equal(pred: str, gold: str) -> bool:
    """Math-Verify's ``verify(gold, pred)`` (gold first), for what :func:`exact_decision` leaves undecided."""
    t_parse, t_verify = timeout(PARSE_TIMEOUT_S), timeout(VERIFY_TIMEOUT_S)
    gold_parsed = list(parse_gold(gold, t_parse))
    pred_parsed = parse_pred(pred, t_parse)
    if not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=t_verify))


__all__ = ["DECIMAL_RTOL", "PARSE_TIMEOUT_S", "TimeoutException", "VERIFY_TIMEOUT_S", "decimals_close",
           "exact_decision", "expressions_equal", "math_verify_equal", "parse_gold", "printed_equal",
           "structures_equal", "timeout"]
