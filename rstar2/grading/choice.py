"""Multiple-choice answers graded on the option letter (GPQA-Diamond; paper §5.1).

A gold is one letter (``C``, ``(C)``, ``\\text{(C)}``). An answer names a letter when it is one, when it starts
with one and then writes the option out (``(C) 4.2 eV``, ``C: 4.2 eV``), or when it is a phrase around one
letter (:func:`choice_letter` with ``phrase=True``), read in this order:

1. a cue word and the letter after it: ``The answer is (C)``, ``Answer: C``, ``Option C``, ``the correct choice
   is C``, ``I choose C``;
2. else a letter in parentheses: ``(B) is the correct choice``;
3. else the only capital letter standing alone in a phrase of words (``C is correct``; not ``A = 5``).

A phrase that names two different letters at one step (``B or C``, ``A, B and C``, ``I think B``: ``I`` and
``B``) names none, and so does any phrase with a negation or a verdict against an option (``not C``, ``C is
wrong``, ``none of these``): never a substring search.
"""

from __future__ import annotations

import re

from .normalize import clean

_CHOICE_RE = re.compile(r"\(?\s*([A-Za-z])\s*\)?[.:]?")
_CHOICE_PREFIX_RE = re.compile(r"\(\s*([A-Za-z])\s*\)|([A-Z])\s*[.:)](?=\s|$)")
# cue words in any case; the letter after them a capital, or any letter in parentheses
_CUE_RE = re.compile(r"\b(?i:answers?|options?|choices?|choose|chose|select|pick|letter)\b"
                     r"(?:\s+(?i:is|would be|will be|must be|should be))?\s*[:=\-]?\s*"
                     r"(?:\(\s*([A-Za-z])\s*\)|([A-Z])(?![A-Za-z0-9']))")
_PAREN_RE = re.compile(r"\(\s*([A-Za-z])\s*\)")
_LONE_RE = re.compile(r"(?<![A-Za-z0-9'\\])([A-Z])(?![A-Za-z0-9'])")
_PROSE_RE = re.compile(r"[A-Za-z\s.,;:!?'()]+")
_NEGATION_RE = re.compile(r"\b(?:not|no|never|none|neither|nor|except|incorrect|wrong|false)\b|n't", re.I)


def _one(letters: list[str]) -> str | None | bool:
    """The one distinct letter, None for several, False for none (the next rule is asked)."""
    distinct = {x.upper() for x in letters}
    if not distinct:
        return False
    return distinct.pop() if len(distinct) == 1 else None


def _phrase_letter(t: str) -> str | None:
    """The letter a phrase names by rules 1-3 of the module docstring, or None."""
    t = t.replace("*", " ")
    if _NEGATION_RE.search(t):
        return None
    lone = _LONE_RE.findall(t) if _PROSE_RE.fullmatch(t) else []    # "A = 5" is mathematics, not a choice
    for letters in ([a or b for a, b in _CUE_RE.findall(t)], _PAREN_RE.findall(t), lone):
        one = _one(letters)
        if one is not False:
            return one
    return None


def choice_letter(s: str, phrase: bool = False) -> str | None:
    """The option letter a multiple-choice answer names, upper-cased, or None.

    Accepts ``C``, ``(C)``, ``\\text{(C)}``, ``C.`` and an option written out after its letter
    (``(C) 4.2 eV``, ``C: 4.2 eV``). A lower-case letter counts only in parentheses: ``c`` alone is as
    likely a variable. ``phrase=True`` (answers, never golds) also reads a phrase around one letter (module
    docstring).
    """
    t = clean(s)
    m = _CHOICE_RE.fullmatch(t)
    if m and (t[0] == "(" or m.group(1).isupper()):
        return m.group(1).upper()
    m = _CHOICE_PREFIX_RE.match(t)
    if m and len(t) > m.end():
        return (m.group(1) or m.group(2)).upper()
    return _phrase_letter(t) if phrase else None


def letters_match(pred: str | None, gold: str) -> float:
    """1.0 if ``pred`` names the option letter of ``gold`` (already checked to be one letter), else 0.0.

    GPQA-Diamond's grading is not stated in the paper (§5.1); comparing the letter the
    model boxed is the usual protocol. Never a substring search: ``\\boxed{B or C}`` names no single letter.
    """
    if pred is None:
        return 0.0
    return float(choice_letter(pred, phrase=True) == choice_letter(gold))
