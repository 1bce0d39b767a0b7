"""Units after (or a currency sign before) an answer's value (paper §2.2.1: rule-based equivalence of answers).

:func:`split_unit` separates ``5 \\text{ cm}`` into the value ``5`` and its unit. A unit is what follows the
value: ``\\text{}``/``\\mathrm{}``/``\\mbox{}`` blocks of words (``\\text{ cm}``, ``\\mathrm{m/s}``,
``\\text{ square units}``), the degree sign (``^\\circ``, ``°``), the percent sign (``\\%``, ``%``), known unit
words written bare after a space (``5 cm``, ``12 inches``; a bare single letter is a variable, not a unit), with
exponents (``^2``, ``^{3}``), ``/``, ``per``, ``square``/``cubic``; or a leading ``\\$``.

:func:`canonical_unit` reads a unit as a product of named units with exponents: plurals and spellings of one
unit share a name (``cm``, ``centimeters``; ``^\\circ``, ``degrees``; ``\\$``, ``dollars``), ``square cm`` is
``cm^2`` and ``meters per second`` is ``m/s``. A word outside the unit table (``9 \\text{ ways}``, ``\\text{ values}``)
is a label, not a unit: it is split off and never compared. Units are never converted: ``5 m`` and ``500 cm`` are
different answers (a problem names the unit it wants). The grading rule (``rstar2.grading.grade``): when both
sides have a unit, they must be the same unit; when one side has none, the values decide (the problem states the
unit; a bare number does not contradict it).
"""

from __future__ import annotations

import re

_ALIASES = {
    "mm": "millimeter millimeters millimetre millimetres", "cm": "centimeter centimeters centimetre centimetres",
    "m": "meter meters metre metres", "km": "kilometer kilometers kilometre kilometres",
    "in": "inch inches", "ft": "foot feet", "yd": "yard yards", "mi": "mile miles",
    "s": "sec secs second seconds", "min": "mins minute minutes", "h": "hr hrs hour hours",
    "day": "days", "week": "weeks", "month": "months", "year": "years yr yrs",
    "mg": "milligram milligrams", "g": "gram grams", "kg": "kilogram kilograms kilo kilos",
    "lb": "lbs pound pounds", "oz": "ounce ounces", "ton": "tons tonne tonnes",
    "L": "l liter liters litre litres", "mL": "ml milliliter milliliters millilitre millilitres",
    "gal": "gallon gallons", "deg": "degree degrees \\circ °", "rad": "radian radians",
    "$": "\\$ dollar dollars usd", "cent": "cents ¢", "%": "\\% percent percentage",
    "unit": "units", "acre": "acres", "euro": "euros €", "dm": "decimeter decimeters", "cup": "cups",
    "pt": "pint pints", "qt": "quart quarts",
}
_CANONICAL = {alias: name for name, aliases in _ALIASES.items() for alias in aliases.split() + [name]}
_PER_UNIT = {"mph": {"mi": 1, "h": -1}, "kph": {"km": 1, "h": -1}, "kmh": {"km": 1, "h": -1}}
# Bare words (outside \text{}) taken as a unit: the known ones of two letters or more.
_BARE_UNITS = {a for a in _CANONICAL if len(a) >= 2 and a.isalpha()} | set(_PER_UNIT) | {"per"}
# Words that are mathematics, not units, even inside \text{} or \mathrm{} (Euler's e, i, d of dx, functions).
_NOT_UNITS = {"e", "i", "d", "pi", "and", "or", "for", "if", "of", "not", "sqrt", "ln", "log", "sin", "cos", "tan",
              "exp", "mod", "inf", "infty", "undefined", "none", "no", "yes", "true", "false"}
_POWERS = {"square": 2, "sq": 2, "squared": 2, "cubic": 3, "cu": 3, "cubed": 3}
_BARE_UNITS |= set(_POWERS)
_TEXT = r"\\(?:text|textrm|textnormal|mathrm|mbox|rm)\s*\{([^{}]*)\}"
_TAIL = [  # one unit token at the end of the remaining string, tried in this order
    ("text", re.compile(_TEXT + r"\s*$")),
    ("exp", re.compile(r"\^\s*(?:\{\s*([+-]?\d)\s*\}|(\d))\s*$")),
    ("deg", re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°)\s*$")),
    ("pct", re.compile(r"(?:\\%|%)\s*$")),
    ("sep", re.compile(r"(?:/|\\cdot)\s*$")),
    ("word", re.compile(r"(?<=[\s}~,;])([A-Za-z]+)\s*$")),
    ("space", re.compile(r"(?:\\[,;:! ]|~|\\quad)\s*$")),
]
_VALUE_END = re.compile(r"[\w)}\]|.!]$")


def _unit_text(text: str) -> bool:
    """A ``\\text{}`` block that can be a unit: words, unit signs, ``/``, exponents; no other digits."""
    bare = re.sub(r"\^\s*\{?\s*[+-]?\d\s*\}?", "", text).replace("\\%", "%").replace("\\$", "$")
    return bool(re.fullmatch(r"[\sA-Za-z/.°%$()-]*", bare) and re.search(r"[A-Za-z°%$]", bare))


def _tail_tokens(s: str) -> list[tuple[str, str, int]]:
    """Peel unit tokens off the end of ``s``: (kind, text, start in ``s``) left to right."""
    tokens: list[tuple[str, str, int]] = []
    rest = s.rstrip()
    while rest:
        for kind, pat in _TAIL:
            m = pat.search(rest)
            if m:
                break
        else:
            break
        text = next((g for g in m.groups() if g is not None), "") if m.groups() else m.group(0).strip()
        if kind == "word" and text not in _BARE_UNITS and text.lower() not in _BARE_UNITS:
            break
        if kind == "text" and not _unit_text(text):
            break
        tokens.insert(0, (kind, text, m.start()))
        rest = rest[:m.start()].rstrip()
    return tokens


def canonical_unit(tokens: list[tuple[str, str]]) -> tuple | None:
    """The unit the tokens spell as a sorted tuple of (name, exponent); ``()`` for a label that is not a unit
    (a word outside the unit table: ``ways``, ``values``, ``people``); None when they spell nothing (or
    mathematics: ``\\mathrm{e}``)."""
    words: list[str] = []
    for kind, text in tokens:
        if kind == "text":
            words += re.findall(r"[A-Za-z]+|°|%|\$|/|\^\{?[+-]?\d\}?", text.replace("\\%", "%").replace("\\$", "$"))
        elif kind == "exp":
            words.append(f"^{text}")
        elif kind in ("deg", "pct", "sep"):
            words.append({"deg": "°", "pct": "%", "sep": "/" if "/" in text else ""}[kind])
        elif kind == "word":
            words.append(text)
    unit: dict[str, int] = {}
    sign, power, last, label = 1, 1, None, False
    for w in filter(None, words):
        low = w.lower()
        if low in _NOT_UNITS:
            return None
        if w in ("/", "per"):
            sign = -1
        elif w.startswith("^") or low in ("squared", "cubed"):
            if last is not None:
                unit[last] += sign * ((int(w.strip("^{}")) if w.startswith("^") else _POWERS[low]) - 1)
        elif low in _POWERS:
            power = _POWERS[low]
        elif _known(w) is None:
            label = True
        else:
            for name, exp in _known(w).items():
                unit[name] = unit.get(name, 0) + sign * power * exp
                last = name
            power = 1
    if label:
        return ()
    out = tuple(sorted((k, v) for k, v in unit.items() if v))
    return out or None


def _known(word: str) -> dict[str, int] | None:
    """The unit one word names as {name: exponent} (``mph``: {mi: 1, h: -1}), None for a word outside the table.
    Case counts for symbols (``mL``, ``L``); words of three letters or more match in any case."""
    if word.lower() in _PER_UNIT:
        return _PER_UNIT[word.lower()]
    if word in _CANONICAL:
        return {_CANONICAL[word]: 1}
    if len(word) > 2 and word.lower() in _CANONICAL:
        return {_CANONICAL[word.lower()]: 1}
    return None


def split_unit(s: str) -> tuple[str, tuple | None]:
    """(value, unit) of an answer: the unit as :func:`canonical_unit` gives it (``()`` for a label such as
    ``\\text{ ways}``), None without one; the value is ``s`` without the unit or label (``s`` itself when it has
    none). Never raises."""
    t, lead = s.strip(), None
    if t.startswith("\\$"):
        t, lead = t[2:].lstrip(), [("text", "$")]
    whole = re.fullmatch(_TEXT, t)
    if whole and re.match(r"\s*[+-]?\d", whole.group(1)):
        t = whole.group(1).strip()              # \text{5 cm}: the whole answer in one text block
    tokens = _tail_tokens(t)
    while tokens and tokens[0][0] in ("space", "sep", "exp"):
        tokens.pop(0)       # a unit starts with a name: 10^{-3} \\text{ m} keeps its ^{-3} in the value
    rest = re.sub(r"(?:\\[,;:! ]|~|\\quad|\s)+$", "", t[:tokens[0][2]] if tokens else t)
    unit = canonical_unit((lead or []) + [tok[:2] for tok in tokens]) if (tokens or lead) else None
    if unit is None or not rest or not _VALUE_END.search(rest):
        return s, None
    return rest, unit      # () for a label: split off, but no unit to compare


__all__ = ["canonical_unit", "split_unit"]
