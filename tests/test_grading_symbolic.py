"""Exact symbolic grading: a table of equal pairs and near-misses, graded through the killable
grading workers (grading_pool.score_many) as evaluation does. No near-miss may score 1, every equal pair
must score 1, and every item must come back within its per-item deadline (status ok, not timeout).

Before the exact path (commit ac27f31), 10 of these 28 near-misses scored 1 under Math-Verify's float
tolerance: 1/20! vs 1/21!, 10^{-20} vs 2·10^{-20}, e^{-50} vs e^{-51}, 10^{-100} vs 10^{-101}, π, √2 and ln 2
against decimals, π/10^15 against its decimal, √(5+2√6) vs √2+√3+10^{-20}, and [0, 10^{-20}] vs
[0, 2·10^{-20}] (benchmarks/bench_symbolic_grading.py: 12 of 28 under Math-Verify's verify alone).

The float64 rule (rstar2/grading/floats.py) made ``1.4142135623730951`` (what ``print(2 ** 0.5)`` shows) equal to
sqrt 2, so that pair moved to EQUAL; the near-miss for sqrt 2 is now a 16-digit decimal that is not its float64.
"""

from fractions import Fraction

import pytest

from rstar2.grading import DECIMAL_RTOL, grade
from rstar2.grading_pool import score_many

TIMEOUT_S = 20.0

# (gold, prediction): every pair is a different value.
NEAR_MISSES = [
    ("2^{-30}", "2^{-31}"),
    ("\\frac{1}{20!}", "\\frac{1}{21!}"),                                     # reciprocals of factorials
    ("\\frac{1}{10^{20}}", "\\frac{2}{10^{20}}"),
    ("e^{-50}", "e^{-51}"),
    ("10^{-100}", "10^{-101}"),
    ("e^{-1000}", "0"),                                                      # 10^-435, far below any float
    ("2^{-1074}", "0"),
    ("1", "1+10^{-20}"),                                                     # 20th digit
    ("1+\\frac{2}{10^{20}}", "\\frac{10^{20}+1}{10^{20}}"),                  # 20th digit, both exact
    ("1", "1.00000000000000000001"),                                         # 20th digit, decimal vs exact
    ("\\frac{1}{3}", "0.3333333333333333333"),
    ("\\frac{1}{7}", "0.142857142857142857"),
    ("\\pi", "3.14159265358979"),                                            # decimal for an exact value
    ("\\sqrt{2}", "1.414213562373095"),                                      # 16 digits, not sqrt 2's double
    ("\\ln 2", "0.693147180559945309417232121458"),
    ("\\frac{\\pi}{10^{15}}", "\\frac{3.141592653589793}{10^{15}}"),
    ("10^{30}", "10^{30}+1"),                                                # huge values
    ("2^{100}", "2^{100}+1"),
    ("100!", "100!+1"),
    ("3^{200}", "3^{200}-1"),
    ("\\binom{100}{50}", "\\binom{100}{50}+1"),
    ("\\sqrt{5+2\\sqrt{6}}", "\\sqrt{2}+\\sqrt{3}+10^{-20}"),
    ("x^2", "x^2+10^{-20}x"),                                                # expressions with a symbol
    ("0.123456", "0.123457"),                                                # two decimals, beyond 1e-9
    ("[0, 10^{-20}]", "[0, 2\\cdot 10^{-20}]"),                              # intervals
    ("[10^{-20}, 1)", "(10^{-20}, 1)"),                                      # closed vs open end
    ("\\{2^{-40}, 1\\}", "\\{2^{-41}, 1\\}"),                                # sets
    ("(1, 2^{-30})", "(1, 2^{-31})"),                                        # tuples
]

# (gold, prediction): the same value written differently.
EQUAL = [
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt{5+2\\sqrt{6}}", "\\sqrt{2}+\\sqrt{3}"),                          # denesting: minimal polynomial
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("2", "\\sqrt[3]{2}\\cdot\\sqrt[3]{4}"),
    ("2^{-30}", "\\frac{1}{1073741824}"),
    ("\\frac{1}{20!}", "\\frac{1}{2432902008176640000}"),
    ("10^{-20}", "0.00000000000000000001"),
    ("e^{-50}", "\\frac{1}{e^{50}}"),
    ("1.00000000000000000001", "\\frac{10^{20}+1}{10^{20}}"),
    ("2^{100}", "1267650600228229401496703205376"),
    ("100!", "100 \\cdot 99!"),
    ("\\binom{100}{50}", "100891344545564193334812497256"),
    ("10^{300}", "1000^{100}"),
    ("3", "\\log_2 8"),
    ("5", "e^{\\ln 5}"),
    ("\\frac{1}{2}", "\\sin\\frac{\\pi}{6}"),
    ("\\frac{\\pi^2}{6}", "\\pi^2/6"),
    ("x^2+2x+1", "(x+1)^2"),
    ("1", "\\sin^2 x + \\cos^2 x"),
    ("\\frac{1}{2}", "0.5"),
    ("3.14", "3.140"),
    ("0.3", "0.30000000000000004"),              # two plain decimals: within the stated relative 1e-9
    ("10^{-20}", "x = \\frac{1}{10^{20}}"),
    ("[0, \\frac{1}{2})", "[0, 0.5)"),
    ("(-\\infty, 2^{-30}]", "(-\\infty, \\frac{1}{1073741824}]"),
    ("\\{\\frac{1}{4}, 2^{-3}\\}", "\\{0.125, 0.25\\}"),
    ("(1, 2)", "(1, \\sqrt{4})"),
    ("(3, \\frac{\\pi}{2})", "\\left(3, \\frac{\\pi}{2}\\right)"),
    ("\\sqrt{2}", "1.4142135623730951"),        # the float64 nearest sqrt 2, as print() shows it (grading/floats.py)
]

TABLE = [(g, p, 0.0) for g, p in NEAR_MISSES] + [(g, p, 1.0) for g, p in EQUAL]


def test_table_size():
    assert len(TABLE) >= 40 and len(NEAR_MISSES) >= 20 and len(EQUAL) >= 20


@pytest.fixture(scope="module")
def scored():
    items = [(f"The answer is \\boxed{{{p}}}.", g, "math") for g, p, _ in TABLE]
    return score_many(items, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("i", range(len(TABLE)), ids=[f"{'eq' if w else 'miss'}:{g}|{p}" for g, p, w in TABLE])
def test_symbolic_pair(scored, i):
    gold, pred, want = TABLE[i]
    r = scored[i]
    assert r["status"] == "ok" and r["duration_s"] < TIMEOUT_S, r
    assert r["pred"] == pred
    assert r["reward"] == want, f"gold {gold!r} vs {pred!r}: got {r['reward']}, want {want}"


def test_both_directions_agree_in_process():
    """Equality is symmetric: the table with gold and prediction swapped gives the same verdicts."""
    for g, p, want in TABLE:
        assert grade(g, p) == want, (p, g)


def test_decimal_tolerance_is_relative_and_only_between_decimals():
    assert DECIMAL_RTOL == Fraction(1, 10**9)
    assert grade("1000000.0001", "1000000.0002") == 1.0          # relative 1e-10
    assert grade("0.0000000001", "0.0000000002") == 0.0          # tiny decimals: relative 1, not absolute
    assert grade("1.0000000001", "1") == 0.0                     # an integer is exact: no tolerance
    assert grade("0.3333333333", "\\frac{1}{3}") == 0.0
