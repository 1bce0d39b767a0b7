"""Base-n numerals compared by value (paper §2.2.1: the answer reward is a rule-based equivalence check).

A numeral states its base in a subscript: ``1011_2``, ``1011_{2}``, ``(1011)_2``, ``2A_{16}``, ``\\text{B}_{12}``
or a number word (``1011_{\\text{two}}``). Its digits are 0-9 then A-Z (case ignored), each below the base, and
the base is 2 to 36. So that a subscripted variable is never read as a numeral, the digits must include a decimal
digit, or be capital letters in a base above 10 (``B_{12}``; ``a_{10}``, ``x_2`` and ``A_2`` stay variables).

Rules (:func:`base_decision`), applied when either side is a numeral:

* both state a base: equal when their values are equal (``1011_2`` = ``23_4`` = ``11_{10}``), so the same digits in
  two bases are two different numbers (``1011_2`` != ``1011_3``);
* only the gold states one: an answer of bare digits is read in that base, the base the problem asked for
  (``1011`` = ``1011_2``, while ``11`` against ``1011_2`` is three, not eleven); anything else is unequal;
* only the answer states one: the gold is a decimal integer, compared by value (``1011_2`` = ``11``);
* digits that are not digits of the stated base (``1021_2``) make the side no number: unequal.
"""

from __future__ import annotations

import re

_WORDS = {w: i for i, w in enumerate(("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                       "fourteen fifteen sixteen").split())}
_NUMERAL_RE = re.compile(r"([+-]?)\s*(?:\(\s*([0-9A-Za-z]+)\s*\)|([0-9A-Za-z]+))\s*_\s*(?:\{\s*([^{}]*?)\s*\}|(\d))")
_BARE_RE = re.compile(r"([+-]?)\s*([0-9A-Za-z]+)")
INVALID = "invalid"


def _base(text: str) -> int | None:
    t = text.strip().lower()
    base = int(t) if t.isdigit() else _WORDS.get(t)
    return base if base is not None and 2 <= base <= 36 else None


def digits_value(digits: str, base: int) -> int | None:
    """The value of ``digits`` in ``base`` (0-9 then A-Z, case ignored), or None when one is not a digit of it."""
    try:
        return int(digits, base)
    except ValueError:
        return None


def read_numeral(s: str) -> tuple[int, int] | str | None:
    """(value, base) of a whole answer that is a base-n numeral, :data:`INVALID` when it is written as one but its
    digits do not fit its base, None when it is no numeral. ``s`` is a cleaned answer (``\\text{}`` removed)."""
    m = _NUMERAL_RE.fullmatch(s.strip())
    if not m:
        return None
    sign, digits, base = m.group(1), m.group(2) or m.group(3), _base(m.group(4) or m.group(5))
    if base is None:
        return None
    if not any(c.isdigit() for c in digits) and not (digits.isupper() and base > 10):
        return None                         # a subscripted variable: a_{10}, x_2, A_2
    value = digits_value(digits, base)
    if value is None:
        return INVALID
    return (-value if sign == "-" else value), base


def base_decision(pred: str, gold: str, gold_int: int | None) -> bool | None:
    """Equal / unequal by the rules of the module docstring when either side is a numeral, else None.

    Args:
        pred, gold: cleaned answers. gold_int: the integer the gold spells, if it is one
            (:func:`rstar2.grading.normalize.as_int`).
    """
    gn, pn = read_numeral(gold), read_numeral(pred)
    if gn is None and pn is None:
        return None
    if gn == INVALID or pn == INVALID:
        return False
    if gn is None:
        return gold_int is not None and pn[0] == gold_int
    value, base = gn
    if pn is not None:
        return pn[0] == value
    bare = _BARE_RE.fullmatch(pred.rsplit("=", 1)[-1].strip())
    if not bare:
        return False
    got = digits_value(bare.group(2), base)
    return got is not None and (-got if bare.group(1) == "-" else got) == value


__all__ = ["INVALID", "base_decision", "digits_value", "read_numeral"]
