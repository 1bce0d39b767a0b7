"""Multiple-choice answers graded on the option letter (GPQA-Diamond; paper §5.1)."""

from __future__ import annotations

import re

from .normalize import clean

_CHOICE_RE = re.compile(r"\(?\s*([A-Za-z])\s*\)?[.:]?")
_CHOICE_PREFIX_RE = re.compile(r"\(\s*([A-Za-z])\s*\)|([A-Z])\s*[.:)](?=\s|$)")


def choice_letter(s: str) -> str | None:
    """The option letter a multiple-choice answer names, upper-cased, or None.

    Accepts ``C``, ``(C)``, ``\\text{(C)}``, ``C.`` and an option written out after its letter
    (``(C) 4.2 eV``, ``C: 4.2 eV``). A lower-case letter counts only in parentheses: ``c`` alone is as
    likely a variable.
    """
    t = clean(s)
    m = _CHOICE_RE.fullmatch(t)
    if m and (t[0] == "(" or m.group(1).isupper()):
        return m.group(1).upper()
    m = _CHOICE_PREFIX_RE.match(t)
    if m and len(t) > m.end():
        return (m.group(1) or m.group(2)).upper()
    return None


def letters_match(pred: str | None, gold: str) -> float:
    """1.0 if ``pred`` names the option letter of ``gold`` (already checked to be one letter), else 0.0.

    GPQA-Diamond's grading is not stated in the paper (§5.1); comparing the letter the
    model boxed is the usual protocol. Never a substring search: ``\\boxed{B or C}`` names no single letter.
    """
    if pred is None:
        return 0.0
    return float(choice_letter(pred) == choice_letter(gold))
