"""Number notations read by kind before any comparison: repeating decimals and scientific notation (paper §2.2.1:
the answer reward is a rule-based equivalence check; these are the rules for how a number may be written).

:func:`rewrite` turns each notation into the LaTeX the rest of the grader reads exactly, in the answer as in the
gold, wherever it stands (alone, inside a tuple, set or interval):

* a repeating decimal, an overline or bar over the repeating digits (``0.\\overline{3}``, ``0.1\\overline{6}``,
  ``1.\\bar{3}``) or a dot over one repeating digit (``0.\\dot{3}``), becomes the exact fraction it denotes
  (``\\frac{1}{3}``, ``\\frac{1}{6}``, ``\\frac{4}{3}``);
* scientific notation written the programmer's way, a mantissa, ``e`` or ``E`` and an integer exponent with no
  space between them (``6.02e23``, ``1.5E-03``, ``1e+3``), becomes ``6.02 \\cdot 10^{23}``, the LaTeX form
  (``\\times`` or ``\\cdot``), so ``e`` is never read as Euler's number there. Euler's number is ``e`` anywhere
  else: ``2e - 3`` (spaced), ``2e^{-3}``, ``e^{3}``, ``3e``.

:func:`scientific_value` reads either form of scientific notation as an exact rational
(:func:`rstar2.grading.normalize.as_fraction` uses it). Neither function raises.
"""

from __future__ import annotations

import re
from fractions import Fraction

# "0.1\overline{6}", "1.\bar{3}", "0.\dot{3}": integer part, fixed digits, repeating digits (a dot over one digit
# only; nothing may follow the repeating block).
_REPEATING_RE = re.compile(r"(\d*)\.(\d*)(?:\\(?:overline|bar)\s*(?:\{\s*(\d+)\s*\}|(\d))"
                           r"|\\dot\s*(?:\{\s*(\d)\s*\}|(\d)))(?!\s*\d)")
# A programmer's float: starts a number (no letter, digit or point before it), ends one (none after it).
_E_NOTATION_RE = re.compile(r"(?<![\w.])(\d+\.?\d*|\.\d+)[eE]([+-]?\d+)(?![\w.])")
# The LaTeX form, after spaces are removed: mantissa, \times or \cdot (or *, ×, ·), 10^exponent.
_LATEX_SCI_RE = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)(?:\\times|\\cdot|\*|×|·)10\^(?:\{([+-]?\d+)\}|([+-]?\d))")
# The programmer's form as a whole answer (already rewritten inside grade; kept for direct callers).
_E_SCI_RE = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)[eE]([+-]?\d+)")
#: Exponents beyond this are not expanded into a rational (10^10^6 has a million digits); Math-Verify decides.
MAX_EXPONENT = 400


def repeating_value(integer: str, fixed: str, repeat: str) -> Fraction:
    """The rational ``integer.fixed(repeat)(repeat)...`` denotes: I + (F + R / (10^r - 1)) / 10^f."""
    tail = Fraction(int(fixed or "0")) + Fraction(int(repeat), 10 ** len(repeat) - 1)
    return int(integer or "0") + tail / 10 ** len(fixed)


def _fraction_latex(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"\\frac{{{x.numerator}}}{{{x.denominator}}}"


def _repeating_sub(m: re.Match) -> str:
    repeat = next(g for g in m.groups()[2:] if g is not None)
    return _fraction_latex(repeating_value(m.group(1), m.group(2), repeat))


def _e_notation_sub(m: re.Match) -> str:
    return f"{m.group(1)} \\cdot 10^{{{int(m.group(2))}}}"


def rewrite(s: str) -> str:
    """``s`` with repeating decimals as exact fractions and programmer's scientific notation in LaTeX form (see
    the module docstring); everything else unchanged. A minus sign in front stays in front:
    ``-0.\\overline{3}`` -> ``-\\frac{1}{3}``."""
    if "\\" in s and ("overline" in s or "bar" in s or "dot" in s):
        s = _REPEATING_RE.sub(_repeating_sub, s)
    if "e" in s or "E" in s:
        s = _E_NOTATION_RE.sub(_e_notation_sub, s)
    return s


def scientific_value(t: str) -> Fraction | None:
    """The exact value of a whole answer in scientific notation, either form, or None.

    ``t``: a cleaned answer with its spaces removed (``6.02\\times10^{23}``, ``1.5e-3``). An exponent above
    :data:`MAX_EXPONENT` in size gives None (left to the symbolic grader, which is bounded by its deadline).
    """
    m = _LATEX_SCI_RE.fullmatch(t)
    if m:
        sign, mantissa, exp = m.group(1), m.group(2), int(m.group(3) or m.group(4))
    else:
        m = _E_SCI_RE.fullmatch(t)
        if not m:
            return None
        sign, mantissa, exp = m.group(1), m.group(2), int(m.group(3))
    if abs(exp) > MAX_EXPONENT:
        return None
    value = Fraction(mantissa) * Fraction(10) ** exp
    return -value if sign == "-" else value


def has_fraction_digits(t: str) -> bool:
    """True when a scientific-notation answer's mantissa has a fractional part (``6.02e23``, ``1.5\\times10^3``):
    a measured or printed value, compared between decimals with the decimal tolerance."""
    m = _LATEX_SCI_RE.fullmatch(t) or _E_SCI_RE.fullmatch(t)
    return bool(m) and "." in m.group(2)


def is_normalized_scientific(t: str) -> bool:
    """True when ``t`` (cleaned, spaces removed) is scientific notation with a mantissa in [1, 10), as Python and
    LaTeX write a number (``2.5e+04``, ``2.5\\times10^{4}``), not a product such as ``25\\times10^{3}``."""
    m = _LATEX_SCI_RE.fullmatch(t) or _E_SCI_RE.fullmatch(t)
    return bool(m) and 1 <= Fraction(m.group(2)) < 10


__all__ = ["MAX_EXPONENT", "has_fraction_digits", "is_normalized_scientific", "repeating_value", "rewrite",
           "scientific_value"]
