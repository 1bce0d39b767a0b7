"""Decimals a tool printed for an exact value: the float64 rule (paper §2.2.1: the answer reward is exact
equivalence; §2.1: the model computes with Python, whose ``print(2/3)`` gives ``0.6666666666666666``).

Rule: a decimal of **15 to 17 significant digits** (leading and trailing zeros not counted; plain or in scientific
notation) equals an exact value that is **not an integer** when the decimal, read as a float64 (IEEE 754 binary64,
round to nearest), **is the float64 nearest that value**, and that float64 is a normal number (magnitude
2^-1022 to 2^1024). Everything else keeps the exact rules: a shorter decimal must equal the value exactly
(``0.667`` is not 2/3), as must a longer one (no float64 prints more than 17 significant digits, so
``0.3333333333333333333`` claims a value and is compared as one), a decimal against an integer, values below
float64's normal range (``e^{-1000}``), and a decimal inside an expression (``x + 0.6666666666666666``).

So ``0.6666666666666666`` = 2/3, ``1.7320508075688772`` = sqrt 3 and ``1.5777218104420236e-30`` = 2^-99, while
``1.5777218104420236e-30`` != 2^-98 (each tiny value has its own float64) and sympy's ``1.73205080756888``
(15 digits, but not the float64 nearest sqrt 3) != sqrt 3. Two decimals are compared with the decimal tolerance
instead (:data:`rstar2.grading.symbolic.DECIMAL_RTOL`), never with this rule.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

#: Significant digits of a float64 print: ``%.15g`` gives 15, ``repr`` at most 17.
MIN_DIGITS, MAX_DIGITS = 15, 17
#: Digits of the exact value's evaluation before it is rounded to float64.
EVAL_DIGITS = 40


def significant_digits(value: Fraction) -> int | None:
    """Significant digits of a terminating decimal (``Fraction('0.6666666666666666')`` -> 16), None when
    ``value`` has no finite decimal expansion (its denominator has a prime factor other than 2 and 5)."""
    if value == 0:
        return 0
    den, k = value.denominator, 0
    while den % 10 == 0:
        den //= 10
        k += 1
    while den % 2 == 0 or den % 5 == 0:
        den, k = (den // 2 if den % 2 == 0 else den // 5), k + 1
    if den != 1:
        return None
    digits = str(abs(value.numerator * 10 ** k // value.denominator)).rstrip("0")
    return len(digits)


def is_float_print(value: Fraction) -> bool:
    """True when a decimal's exact value has :data:`MIN_DIGITS` to :data:`MAX_DIGITS` significant digits."""
    n = significant_digits(value)
    return n is not None and MIN_DIGITS <= n <= MAX_DIGITS


def nearest_double(x) -> float | None:
    """The float64 nearest ``x`` (a Fraction, or a sympy number evaluated to :data:`EVAL_DIGITS` digits), None
    when ``x`` is not a real number, is an integer, or its float64 is not a normal number."""
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return None
        try:
            f = float(x)                        # int / int: correctly rounded
        except OverflowError:
            return None
    else:
        import sympy

        if not (x.is_number and x.is_real is not False) or x.is_integer:
            return None
        v = sympy.N(x, EVAL_DIGITS)
        if not v.is_real or not v.is_finite or v.is_zero:
            return None
        r = sympy.Rational(v)                    # exact; mpmath's own float() rounds toward zero
        try:
            f = float(Fraction(int(r.p), int(r.q)))
        except OverflowError:
            return None
        if f.is_integer():
            return None                          # an integer, or a value closer to one than float64 resolves
    if not math.isfinite(f) or abs(f) < sys.float_info.min:
        return None
    return f


def same_double(decimal: Fraction, exact) -> bool:
    """The float64 rule: ``decimal`` (15 to 17 significant digits) reads as the float64 nearest ``exact``."""
    if not is_float_print(decimal):
        return False
    target = nearest_double(exact)
    return target is not None and float(decimal) == target


__all__ = ["EVAL_DIGITS", "MAX_DIGITS", "MIN_DIGITS", "is_float_print", "nearest_double", "same_double",
           "significant_digits"]
