"""The math filter of the SFT cold start (paper §4.1: the cold start holds no math reasoning traces).

Conservative: a false positive only costs a row. A prompt is "math" if it (1) contains an arithmetic expression
(``\\d [+*×÷^=] \\d``, spaced ``- x /`` between numbers, ``2x + ...``, ``x^2`` or ``15% of 500``), (2) starts
with a computing verb (calculate, compute, solve, evaluate, simplify, determine, find, add, subtract, multiply,
divide, convert, estimate, round, what is, how many, how much) and contains a digit, or (3) names a math topic
(equation but not "chemical equation", algebra, geometry, fraction, quadratic, derivative, integral,
math/mathematical, perimeter, factorial, ...). A reply is "math" if it shows worked arithmetic
(``4 x 4 x 4 = 64``). Drop reasons: ``math_expression``, ``math_verb_number``, ``math_term``,
``math_worked_arithmetic``.
"""

from __future__ import annotations

import re

_MATH_EXPR = [re.compile(p, re.I) for p in (
    r"\d\s*[+*×÷^=]\s*\(?-?\d",         # 3 + 4, 2*3, 2^10, x = 5 after a digit
    r"\d\s+[-x/]\s+\(?\d",              # 9 - 2, 5 x 3, 10 / 2 (spaced: leaves 2000-2015 and 4.5/5 alone)
    r"\b\d+[a-z]\s*[+\-=^]\s*\d*[a-z]?", # 2x + 4, 2a+3b
    r"\b[a-z]\s*\^\s*\d",               # x^2
    r"\d\s*%\s*of\s+\$?\d",               # 15% of 500
)]
_MATH_VERB = re.compile(
    r"^\s*(?:calculate|compute|solve|evaluate|simplify|determine|find|add|subtract|multiply|divide|convert|"
    r"estimate|round|what\s+is|what's|how\s+many|how\s+much)\b", re.I)
_MATH_TERM = re.compile(
    r"\b(?:(?<!chemical )equations?|arithmetic|algebra(?:ic)?|geometry|trigonometr\w*|calculus|quadratic|"
    r"polynomials?|derivatives?|integrals?|fractions?|maths?|mathematic(?:s|al)|word problems?|"
    r"order of operations|square roots?|cube roots?|factorials?|prime factori[sz]ation|perimeter|hypotenuse|"
    r"circumference|greatest common|least common|lcm|gcd)\b", re.I)
MATH_WORKED = re.compile(r"\d\s*[+\-*/×x÷]\s*\(?\d[\d\s+\-*/×x÷().,]*=\s*\$?-?\d")


def math_reason(prompt: str, reply: str = "") -> str | None:
    """Return the drop reason when the prompt or reply looks like a math problem / worked arithmetic, else None."""
    if any(p.search(prompt) for p in _MATH_EXPR):
        return "math_expression"
    if _MATH_VERB.search(prompt) and re.search(r"\d", prompt):
        return "math_verb_number"
    if _MATH_TERM.search(prompt):
        return "math_term"
    if reply and MATH_WORKED.search(reply):
        return "math_worked_arithmetic"
    return None
