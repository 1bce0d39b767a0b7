"""Integer-answer normalisation for RL data curation (paper §4.2: the answer must be an integer).

The RL reward compares the model's final answer with the gold one. rStar2-Agent keeps only problems whose
gold answer is an integer, because rule-based verifiers cannot reliably decide algebraic equivalence. This
module decides, for one gold string, whether it *is* an integer and which one.

It is deliberately conservative: anything ambiguous is rejected, because a wrong gold label silently
teaches the policy the wrong thing, while a dropped problem costs only one row of a 10k+ pool.
"""

from __future__ import annotations

import math
import re

# Reasons returned by classify_integer_answer; curate.py uses them as funnel drop reasons.
OK = "ok"
NO_ANSWER = "no_answer"                # None, NaN or blank
TUPLE = "tuple_or_list"                # "0,1", "3, 5, 7", "12,34" (commas that are not thousands groups)
NON_INTEGER_NUMBER = "non_integer_number"  # "3.5", "\frac{1}{2}", "-5/4"
NOT_A_NUMBER = "not_a_number"          # expressions, text, units we do not accept, multi-part answers
TOO_LARGE = "too_large"                # |value| > max_abs

# Whole-string wrappers we peel off. Only when they enclose the *entire* string (checked with brace
# matching), so "\boxed{1}, \boxed{2}" is never turned into "1}, \boxed{2".
_WRAPPER_COMMANDS = ("boxed", "fbox", "text", "textbf", "textrm", "mathrm", "mathbf", "displaystyle")
# Math-mode delimiters around a whole answer (shared with grading).
MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Trailing degree units: "73^\circ", "50^{\circ}", "30°". A unit, not an expression.
_DEGREE_SUFFIX = re.compile(r"\s*(\^\s*\{?\s*\\circ\s*\}?|°)$")
# Leading currency: "\$42409", "\$ 1500" (an *escaped* dollar is a currency sign, "$..$" is math mode).
_CURRENCY_PREFIX = re.compile(r"^\\\$\s*")
# LaTeX digit-group separators: "112,\!875", "1{,}000", "1\,000". "\!" is a negative thin space used next to
# a comma; "{,}" and "\," are written *as* the separator. After this they are plain commas, which must then
# still form proper groups of three.
_NEG_THIN_SPACE = re.compile(r"\\!")
_SEPARATOR_MACROS = re.compile(r"\{,\}|\\,")
# A plain space is a separator only before a group of exactly three digits ("1 000"; "12 34" stays invalid).
_SPACE_SEPARATOR = re.compile(r"(?<=\d) (?=\d{3}(?!\d))")

# An integer: optional sign, then digits, or a proper thousands grouping ("1,000", "12,345,678": first
# group 1-3 digits not starting with 0, then groups of exactly three), then an optional ".000" tail.
_INTEGER = re.compile(r"(?P<sign>[+-]?)\s*(?P<digits>\d+|[1-9]\d{0,2}(?:,\d{3})+)(?:\.0*)?")
_DECIMAL = re.compile(r"[+-]?\s*(\d[\d,]*)?\.\d+|[+-]?\s*\d+\s*/\s*\d+")
_FRACTION_MACRO = re.compile(r"\\[dt]?frac")
# Scientific notation ("6.5e27330467", "3 \times 10^{20}"): never accepted as a gold (not canonical), but one whose
# magnitude exceeds max_abs is reported as too_large, the paper's reason for dropping such Project Euler answers.
_SCIENTIFIC = re.compile(r"[+-]?\s*(?P<mant>\d+(?:\.\d*)?)\s*(?:[eE]\+?|\\times\s*10\s*\^\s*\{?\s*)(?P<exp>\d+)\s*\}?")


def normalize_integer_answer(s, max_abs: int = 10**18) -> int | None:
    """Return the integer a gold answer string denotes, or ``None`` if it is not (safely) an integer.

    Args:
        s: the gold answer, usually a string; ints are accepted as-is, integer-valued finite floats too.
        max_abs: reject values with ``abs(value) > max_abs`` (paper §4.2: huge answers time out verifiers).

    Accepted (returns the int):
        - plain integers, with an optional sign: ``"12"``, ``"-7"``, ``"+3"``;
        - leading zeros: ``"042"`` -> 42, ``"-0"`` -> 0;
        - thousands separators only in proper groups of three: ``"1,000"``, ``"12,345,678"``;
          LaTeX separators ``"1{,}000"``, ``"1\\,000"``, a plain space ``"1 000"``, ``"112,\\!875"`` (``\\!`` is dropped first);
        - an all-zero decimal tail: ``"27.0"``, ``"10.00"``, ``"27."``;
        - whole-string wrappers, peeled repeatedly: ``\\boxed{..}``, ``\\fbox{..}``, ``\\text{..}``,
          ``\\textbf{..}``, ``\\textrm{..}``, ``\\mathrm{..}``, ``\\mathbf{..}``, ``\\displaystyle``, bare ``{..}``,
          math delimiters ``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]``;
        - the unicode minus sign U+2212 (``"−5"``), read as ``-``;
        - surrounding whitespace, a space between sign and digits, and one trailing period (``"12."``);
        - a trailing degree unit (``"73^\\circ"``, ``"50^{\\circ}"``, ``"30°"``) and a leading escaped
          currency sign (``"\\$42409"``): units around a single integer, not expressions.

    Rejected (returns None):
        - missing/blank input;
        - tuples and lists: ``"0,1"``, ``"3, 5, 7"``, ``"(0,1)"``; and ``"12,34"`` is NOT 1234, because commas
          count as separators only in proper groups of three (case G06);
        - non-integers: ``"3.5"``, ``"0.20"``, ``"\\frac{1}{2}"``, ``"-5/4"``; a fraction macro is rejected even
          when its value is an integer (``"\\frac{4}{2}"``), since the gold should be written canonically;
        - expressions: ``"2^{10}"``, ``"3\\sqrt2"``, ``"2^{100} - 2"``, ``"1e5"``, base subscripts ``"12_5"``;
        - multi-part or worded answers: ``"x=5"``, ``"AB=9, CD=4"``, ``"does not exist"``, ``"20\\%"``;
        - magnitude above ``max_abs`` (``too_large``), also when written in scientific notation
          (``"6.5e27330467"``, ``"3\\times 10^{20}"``; below the bound those are ``not_a_number``).
    """
    value, _ = classify_integer_answer(s, max_abs)
    return value


def classify_integer_answer(s, max_abs: int = 10**18) -> tuple[int | None, str]:
    """Like :func:`normalize_integer_answer`, but also say why a value was rejected.

    Returns:
        ``(value, "ok")`` or ``(None, reason)`` with reason one of ``no_answer``, ``tuple_or_list``,
        ``non_integer_number``, ``not_a_number``, ``too_large``.
    """
    if s is None or isinstance(s, bool):
        return None, NO_ANSWER if s is None else NOT_A_NUMBER
    if isinstance(s, int):
        return _check_magnitude(s, max_abs)
    if isinstance(s, float):
        if math.isnan(s):
            return None, NO_ANSWER
        if not math.isfinite(s) or s != int(s):
            return None, NON_INTEGER_NUMBER
        return _check_magnitude(int(s), max_abs)

    text = _strip_decorations(str(s))
    if not text:
        return None, NO_ANSWER
    match = _INTEGER.fullmatch(text)
    if match:
        value = int(match.group("digits").replace(",", ""))
        return _check_magnitude(-value if match.group("sign") == "-" else value, max_abs)
    return None, _rejection_reason(text, max_abs)


def _check_magnitude(value: int, max_abs: int) -> tuple[int | None, str]:
    return (value, OK) if abs(value) <= max_abs else (None, TOO_LARGE)


def _rejection_reason(text: str, max_abs: int) -> str:
    """Pick a funnel reason for a string that did not match an integer (for reporting only)."""
    sci = _SCIENTIFIC.fullmatch(text)
    if sci:
        mantissa = float(sci.group("mant"))
        # log10 comparison: the exponent can be 27 million digits' worth, far beyond float range.
        if mantissa > 0 and math.log10(mantissa) + int(sci.group("exp")) > math.log10(max_abs):
            return TOO_LARGE
        return NOT_A_NUMBER
    if _DECIMAL.fullmatch(text) or _FRACTION_MACRO.search(text):
        return NON_INTEGER_NUMBER
    if re.fullmatch(r"[\s()\[\]{}\\]*[+-]?\d+([\s;,]+[+-]?\d+)+[\s()\[\]{}\\]*", text):
        return TUPLE
    return NOT_A_NUMBER


def _strip_decorations(text: str) -> str:
    """Peel wrappers, units and LaTeX separators until the string stops changing."""
    text = text.replace("\u2212", "-")
    text = _NEG_THIN_SPACE.sub("", text)
    text = _SPACE_SEPARATOR.sub(",", _SEPARATOR_MACROS.sub(",", text))
    previous = None
    while text != previous:
        previous = text
        text = text.strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
        text = _unwrap_delimiters(text)
        text = _unwrap_command(text)
        text = _DEGREE_SUFFIX.sub("", text)
        text = _CURRENCY_PREFIX.sub("", text)
    return text


def _unwrap_delimiters(text: str) -> str:
    for left, right in MATH_DELIMITERS:
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left):len(text) - len(right)]
            # "$1$ and $2$" starts and ends with "$" but is two math spans, not one.
            if left == "$" and "$" in inner:
                continue
            return inner
    return text


def _unwrap_command(text: str) -> str:
    """``\\boxed{X}`` -> ``X`` and ``{X}`` -> ``X``, only if the opening brace closes at the very end."""
    command = re.match(r"\\([a-zA-Z]+)\s*", text)
    if command and command.group(1) in _WRAPPER_COMMANDS:
        rest = text[command.end():]
        if command.group(1) == "displaystyle":
            return rest
        if rest.startswith("{") and matching_brace(rest, 0) == len(rest) - 1:
            return rest[1:-1]
        return text
    if text.startswith("{") and matching_brace(text, 0) == len(text) - 1:
        return text[1:-1]
    return text


def matching_brace(text: str, open_index: int) -> int:
    """Index of the ``}`` that closes the ``{`` at ``open_index``, or -1 if unbalanced.

    Escaped braces (``\\{``, ``\\}``) are skipped, so set notation ``\\{1,2\\}`` does not confuse it.
    """
    depth = 0
    i = open_index
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def last_boxed(text: str | None) -> str | None:
    """The content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (stripped), or None.

    The one box reader of the project: gold answers inside dataset solutions (``answer_from_boxed``) and the
    model's final answer (:func:`rstar2.grading.extract_final_answer`) both use it, so they cannot disagree.
    Braces are matched (:func:`matching_brace`), so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. The
    brace-less Minerva form ``\\boxed 5`` gives the token after the space (a trailing ``.``, ``,`` or ``;``
    dropped). An empty box gives ``""``.

    Only the last box counts: when it is unfinished (``\\boxed{`` without its closing brace, a response cut
    off by the length limit, or a damaged solution) the result is None; it never falls back to an earlier
    box, which would be an answer the text went on to revise (handed case G02).
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
        return None                          # "\boxed" at the very end: truncated
    if text[i] == "{":
        close = matching_brace(text, i)
        return None if close == -1 else text[i + 1:close].strip()
    if i > m.end():                          # "\boxed 5"
        tok = re.match(r"[^\s$]+", text[i:])
        return tok.group(0).rstrip(".,;") if tok else None
    return None
