"""Cheap, exact readings of an answer string: wrappers removed, integers, rationals, option letters.

These run before any symbolic work: an integer or a rational that the string spells is compared exactly,
and the same integer rules as gold curation apply (rstar2.grading.answers), so the grader and the integer
filter can never disagree on what an integer answer is.
"""

from __future__ import annotations

import re
from fractions import Fraction

from .answers import MATH_DELIMITERS, matching_brace, normalize_integer_answer
from .notation import has_fraction_digits, scientific_value

_MINUS = {"\u2212": "-", "\ufe63": "-", "\uff0d": "-"}
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
# A decimal number with a fractional part (scientific notation: rstar2.grading.notation).
_PLAIN_DECIMAL_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
# "2e - 3", "2 e-3": spaced, so arithmetic with Euler's number, never scientific notation
_SPACED_E_RE = re.compile(r"\d\s+[eE]|[eE]\s+[+-]?\s*\d")
_SLASH_RE = re.compile(r"([+-]?)\(?([+-]?\d+)\)?/\(?(\d+)\)?")
_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
_LETTER_RE = re.compile(r"\(?\s*([A-E])\s*\)?\.?")
_SIZING_RE = re.compile(r"\\(?:left|right|displaystyle|big|Big|bigg|Bigg)(?![A-Za-z])")


def ascii_minus(s: str) -> str:
    for k, v in _MINUS.items():
        s = s.replace(k, v)
    return s


def strip_delimiters(s: str) -> str:
    """Remove one pair of math delimiters ($..$, $$..$$, \\(..\\), \\[..\\]) enclosing the whole string."""
    for a, b in MATH_DELIMITERS:
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a):len(s) - len(b)].strip()
    return s


def light(s: str) -> str:
    """Minimal cleaning for Math-Verify input: unicode minus and outer math delimiters only.

    ``\\text{}`` stays, so Math-Verify reads ``\\text{Evelyn}`` as one symbol, not a product of letters.
    """
    return strip_delimiters(ascii_minus(str(s).strip()))


def clean(s: str) -> str:
    """Strip the wrappers that never change a value: math delimiters, \\text{}, \\left/\\right, unicode minus."""
    s = ascii_minus(str(s).strip())
    changed = True
    while changed:
        before = s
        s = strip_delimiters(s.strip())
        box = re.fullmatch(r"\\(?:boxed|fbox)\s*\{(.*)\}", s, re.DOTALL)
        if box and matching_brace(s, s.index("{")) == len(s) - 1:
            s = box.group(1).strip()
        s = _TEXT_WRAP_RE.sub(r"\1", s)
        s = _SIZING_RE.sub("", s).strip()
        if s.endswith(".") and not s.endswith(".."):
            s = s[:-1].rstrip()
        changed = s != before
    return s


def as_int(s: str) -> int | None:
    """The integer ``s`` spells, or None (the gold-curation rules of rstar2.grading.answers, up to 10^100)."""
    return normalize_integer_answer(clean(s), max_abs=10**100)


def as_fraction(s: str) -> Fraction | None:
    """The exact rational ``s`` spells (integer, decimal, scientific notation in either form: ``1.5e-3``,
    ``1.5 \\times 10^{-3}``; ``a/b``, ``\\frac{a}{b}``), or None (also for an exponent beyond
    :data:`rstar2.grading.notation.MAX_EXPONENT`)."""
    n = as_int(s)
    if n is not None:
        return Fraction(n)
    c = clean(s)
    if _SPACED_E_RE.search(c):
        return None
    t = c.replace(" ", "")
    try:
        if _PLAIN_DECIMAL_RE.fullmatch(t):
            return Fraction(t)
        sci = scientific_value(t)
        if sci is not None:
            return sci
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


def is_decimal(s: str) -> bool:
    """True when ``s`` is a plain decimal with a fractional part (``3.14``, ``-0.5``), also in scientific
    notation (``1.5e-3``, ``1.5 \\times 10^{-3}``): a value a problem may give approximately. Integers,
    fractions, repeating decimals and every symbolic form are exact."""
    c = clean(s)
    t = c.replace(" ", "")
    if _SPACED_E_RE.search(c) or as_int(t) is not None:
        return False
    return bool(_PLAIN_DECIMAL_RE.fullmatch(t)) or has_fraction_digits(t)


def as_letter(s: str) -> str | None:
    """The multiple-choice letter A–E that ``s`` spells (``B``, ``(B)``, ``\\text{(B)}``, ``\\textbf{(B)}``)."""
    m = _LETTER_RE.fullmatch(clean(s))
    return m.group(1) if m else None


def normalize_answer(s: str | None) -> str | None:
    """A canonical string for an answer: the integer as digits when it is one (``004`` -> ``4``,
    ``1{,}000`` -> ``1000``, ``−3`` -> ``-3``), else the cleaned string. Used for display and for
    majority voting; grading itself uses :func:`rstar2.grading.grade`."""
    if s is None:
        return None
    n = as_int(s)
    if n is not None:
        return str(n)
    return clean(s)
