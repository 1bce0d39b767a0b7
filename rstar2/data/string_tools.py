"""Non-math tool-use tasks for the SFT cold start: string manipulation done through the Python tool.

The paper's cold start (§4.1) teaches the tool-call format on non-reasoning data and contains no math. These
tasks do the same at CPU scale: each asks for a string transformation or count that the model gets by
writing a one- or two-line program, reading the tool's output, and boxing it in ``<answer>`` exactly as an RL
answer is boxed. There is no arithmetic: ``+`` and ``*`` appear only between strings (joining and repeating
words inside ``print(...)``). What transfers to the arithmetic task is the *habit* of calling the tool,
printing an expression's value and copying the result. Without the operator tasks a model trained on these
tasks learned to pass an arithmetic problem as standard input and print it back unchanged, then box the
expression (which a lenient grader scores as correct).

:func:`generate` returns ``n`` tasks ``{"id", "question", "code", "stdin", "expected"}`` (``expected`` is the
output the code must print, computed here so the SFT builder can check the sandbox agrees). About one task
in four passes the text through standard input (``input()``) instead of a literal, so both tool arguments
are exercised.
"""

from __future__ import annotations

import random

_WORDS = ("planet", "garden", "river", "silver", "window", "pencil", "rocket", "marble", "forest", "candle",
          "guitar", "butter", "island", "jacket", "lemon", "mirror", "orange", "pillow", "rabbit", "tunnel",
          "velvet", "wander", "yellow", "zipper", "anchor", "breeze", "castle", "dragon", "engine", "falcon",
          "harbor", "jungle", "kitten", "ladder", "meadow", "nickel", "oyster", "parrot", "quartz", "saddle")


def _phrase(r: random.Random, lo: int = 1, hi: int = 4) -> str:
    return " ".join(r.choice(_WORDS) for _ in range(r.randint(lo, hi)))


def _task(r: random.Random) -> tuple[str, str, str, str]:
    """One task: (question, the text it operates on, a Python expression on ``s``, the expected output)."""
    s = _phrase(r)
    kind = r.randrange(13)
    if kind == 0:
        return f"Reverse the string '{s}'.", s, "s[::-1]", s[::-1]
    if kind == 1:
        return f"Write '{s}' in capital letters.", s, "s.upper()", s.upper()
    if kind == 2:
        ch = r.choice(sorted(set(s.replace(" ", ""))))
        return f"How many times does the letter '{ch}' appear in '{s}'?", s, f"s.count({ch!r})", str(s.count(ch))
    if kind == 3:
        return f"How many characters long is the string '{s}'?", s, "len(s)", str(len(s))
    if kind == 4:
        w = r.choice(_WORDS)
        return f"Sort the letters of '{w}' alphabetically.", w, "''.join(sorted(s))", "".join(sorted(w))
    if kind == 5:
        return (f"Remove every vowel from '{s}'.", s, "''.join(c for c in s if c not in 'aeiou')",
                "".join(c for c in s if c not in "aeiou"))
    if kind >= 10:
        return _operator_task(r, kind)
    s = _phrase(r, 2, 6)
    if kind == 6:
        return f"How many words are in the sentence '{s}'?", s, "len(s.split())", str(len(s.split()))
    if kind == 7:
        return (f"Join the first letters of the words in '{s}'.", s, "''.join(w[0] for w in s.split())",
                "".join(w[0] for w in s.split()))
    if kind == 8:
        return f"Which is the longest word in '{s}'?", s, "max(s.split(), key=len)", max(s.split(), key=len)
    return f"Write '{s}' with every word capitalized.", s, "s.title()", s.title()


_TIMES = {2: "twice", 3: "three times", 4: "four times"}


def _operator_task(r: random.Random, kind: int) -> tuple[str, str, str, str]:
    """Strings joined or repeated with ``+`` and ``*`` inside ``print``: the shape ``print(a + b)`` that a
    computation takes, on strings only (empty text: the expression needs no input)."""
    a, b = r.sample(_WORDS, 2)
    if kind == 10:
        return f"Join the words '{a}' and '{b}' into one word.", "", f"{a!r} + {b!r}", a + b
    if kind == 11:
        k = r.choice(sorted(_TIMES))
        return f"Write '{a}' {_TIMES[k]} in a row, with no spaces.", "", f"{a!r} * {k}", a * k
    return f"Put a dash between '{a}' and '{b}'.", "", f"{a!r} + '-' + {b!r}", f"{a}-{b}"


def generate(n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct string tasks (see the module docstring), deterministic given ``seed``.

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    r = random.Random(f"string_tools:{seed}")
    out, seen = [], set()
    while len(out) < n:
        question, text, expr, expected = _task(r)
        if question in seen:
            continue
        seen.add(question)
        if not text:
            code, stdin = f"print({expr})", ""
        elif r.random() < 0.25:
            code, stdin = f"s = input()\nprint({expr})", text
        else:
            code, stdin = f"s = {text!r}\nprint({expr})", ""
        out.append({"id": f"string-{len(out):05d}", "question": question, "code": code, "stdin": stdin,
                    "expected": expected})
    return out
