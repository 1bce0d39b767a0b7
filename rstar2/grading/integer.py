"""The integer-answer rule (answer_type ``integer``: AIME, AMC and every RL reward).

The answer must *be* an integer: the value after a last ``=`` counts (``x = 25``), but an unevaluated
expression (``505 * 26``, ``2^{3}``, ``\\frac{16}{2}``, ``5!``) scores 0 instead of going to the symbolic
grader, which would evaluate it. Otherwise a problem that *is* an expression is solved by copying it into the
box (a policy found this within 5 RL steps on the bundled arithmetic task).
"""

from __future__ import annotations

import re

from .normalize import as_int
from .notation import is_normalized_scientific, scientific_value

# An arithmetic operation between two operands, or a LaTeX operator that computes a value.
_UNEVALUATED = re.compile(r"[\w)}\]]\s*(?:[-+*/^×÷·]|\\times|\\cdot|\\div|\\ast)\s*[\w({\[\\]"
                          r"|\\(?:d?t?frac|sqrt|binom|choose)\b|\d\s*!")


def integer_tail(pred: str, gold_int: int) -> float | None:
    """Decide an ``integer`` answer that is not itself an integer: 1.0/0.0 from the integer after its last
    ``=``, or from a number in scientific notation with a mantissa in [1, 10) (``2.5e4``, ``2.5 \\times 10^{4}``:
    a way to write a number, not an operation to carry out); 0.0 for an unevaluated expression (``25 \\times
    10^{3}`` too); None when neither applies (the general rules go on)."""
    tail = pred.rsplit("=", 1)[-1].strip()
    ti = as_int(tail)
    if ti is not None:
        return float(gold_int == ti)
    compact = tail.replace(" ", "")
    if is_normalized_scientific(compact):
        value = scientific_value(compact)
        if value is not None:
            return float(value == gold_int)
    if _UNEVALUATED.search(tail):
        return 0.0
    return None
