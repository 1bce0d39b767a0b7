"""Answers in every notation, graded by kind in both directions (equal and not equal): base-n numerals, units,
scientific notation in both forms, repeating decimals, choice letters inside a phrase, and decimals that a tool
printed as the float64 nearest an exact value (docs/grading.md states each rule).

Every row is graded in process with :func:`rstar2.grading.grade` and, once more, through the killable grading
workers with the answer reward of the RL step (``grading.rewards.score("answer", ...)``, what rollouts and
evaluation run), so training rewards and evaluation use one rule set.
"""

import pytest

from rstar2.grading import grade, gold_is_valid, score_trajectory
from rstar2.grading.choice import choice_letter
from rstar2.grading_pool import score_many

# (gold, prediction, expected reward); answer type "math" unless the table says otherwise.
BASES = [
    ("1011_2", "1011_2", 1.0),
    ("1011_2", "1011_{2}", 1.0),
    ("1011_2", "(1011)_2", 1.0),
    ("1011_2", "1011", 1.0),                    # bare digits are read in the base the gold states
    ("1011_2", "23_4", 1.0),                    # both state a base: compared by value (eleven)
    ("1011_2", "11_{10}", 1.0),
    ("11", "1011_2", 1.0),                      # a gold without a base is decimal
    ("2A_{16}", "2a_{16}", 1.0),
    ("2A_{16}", "42_{10}", 1.0),
    ("\\text{B}_{12}", "B", 1.0),
    ("1011_{\\text{two}}", "1011_2", 1.0),
    ("1011_2", "1011_3", 0.0),                  # same digits, other base: a different number
    ("1011_3", "1011_2", 0.0),
    ("1011_2", "1011_{10}", 0.0),
    ("1011_{10}", "1011_2", 0.0),
    ("123_4", "123_5", 0.0),
    ("1011_2", "11", 0.0),                      # "11" in the gold's base 2 is three
    ("11", "11_2", 0.0),
    ("2A_{16}", "2A_{17}", 0.0),
    ("1011_2", "1021_2", 0.0),                  # 2 is no digit in base 2
    ("a_{10}", "a_{10}", 1.0),                  # a subscripted variable is no numeral: compared as before
    ("a_{10}", "a_{11}", 0.0),
]

UNITS = [
    ("5 \\text{ cm}", "5 \\text{ cm}", 1.0),
    ("5 \\text{ cm}", "5\\,\\mathrm{cm}", 1.0),
    ("5 \\text{ cm}", "5 \\text{ centimeters}", 1.0),
    ("5 \\text{ cm}", "5 cm", 1.0),
    ("12 \\text{ inches}", "12 \\text{ in}", 1.0),
    ("30^\\circ", "30 \\text{ degrees}", 1.0),
    ("\\$5", "5 \\text{ dollars}", 1.0),
    ("10 \\text{ cm}^2", "10 \\text{ square centimeters}", 1.0),
    ("3 \\text{ m/s}", "3 \\text{ meters per second}", 1.0),
    ("\\frac{1}{2} \\text{ m}", "0.5 \\text{ m}", 1.0),
    ("0.0025 \\text{ m}", "2.5 \\times 10^{-3} \\text{ m}", 1.0),    # the exponent stays with the value
    ("5", "5 \\text{ cm}", 1.0),                # a unit on one side only: the number decides
    ("5 \\text{ cm}", "5", 1.0),
    ("9 \\text{ values}", "9 \\text{ solutions}", 1.0),  # words outside the unit table are labels, not units
    ("\\$18.90", "18.9", 1.0),
    ("5 \\text{ cm}", "5 \\text{ m}", 0.0),     # different units: never equal by the number alone
    ("5 \\text{ m}", "5 \\text{ cm}", 0.0),
    ("5 \\text{ m}", "500 \\text{ cm}", 0.0),   # no conversion
    ("5 \\text{ cm}^2", "5 \\text{ cm}", 0.0),
    ("5 \\text{ cm}", "5 \\text{ cm}^3", 0.0),
    ("\\$5", "5 \\text{ cents}", 0.0),
    ("30^\\circ", "30 \\text{ radians}", 0.0),
    ("5 \\text{ hours}", "5 \\text{ minutes}", 0.0),
    ("5 \\text{ cm}", "6 \\text{ cm}", 0.0),
    ("5", "6 \\text{ cm}", 0.0),
    ("28\\%", "28 \\text{ cm}", 0.0),
    ("9 \\text{ values}", "8 \\text{ values}", 0.0),
    ("4 \\text{ feet}", "4 \\text{ yards}", 0.0),
    ("2.5 \\times 10^{-3} \\text{ m}", "2.5 \\times 10^{-3} \\text{ s}", 0.0),
]

SCIENTIFIC = [
    ("6.02 \\times 10^{23}", "6.02e23", 1.0),
    ("6.02e23", "6.02 \\times 10^{23}", 1.0),
    ("1.5 \\times 10^{-3}", "1.5E-3", 1.0),
    ("1.5 \\cdot 10^{-3}", "1.5e-03", 1.0),
    ("\\frac{3}{2000}", "1.5e-3", 1.0),
    ("\\frac{3}{2000}", "1.5 \\times 10^{-3}", 1.0),
    ("1000", "1e3", 1.0),
    ("1e3", "1000", 1.0),
    ("25000", "2.5 \\times 10^4", 1.0),
    ("10^{5}", "1e5", 1.0),
    ("(1.5e-3, 2)", "(\\frac{3}{2000}, 2)", 1.0),    # inside a tuple too
    ("6.02 \\times 10^{23}", "6.02e22", 0.0),
    ("6.02e23", "6.02 \\times 10^{22}", 0.0),
    ("\\frac{3}{2000}", "1.5e-2", 0.0),
    ("1000", "1e4", 0.0),
    ("e^{3}", "1e3", 0.0),                       # Euler's number stays Euler's number where it is one
    ("2e - 3", "0.002", 0.0),                    # spaced: 2e - 3 is arithmetic with Euler's number
    ("2e - 3", "2e-3", 0.0),
    ("2e^{-3}", "2e-3", 0.0),
]

REPEATING = [
    ("\\frac{1}{3}", "0.\\overline{3}", 1.0),
    ("0.\\overline{3}", "\\frac{1}{3}", 1.0),
    ("\\frac{1}{6}", "0.1\\overline{6}", 1.0),
    ("\\frac{1}{7}", "0.\\overline{142857}", 1.0),
    ("\\frac{13}{11}", "1.\\overline{18}", 1.0),
    ("-\\frac{1}{3}", "-0.\\overline{3}", 1.0),
    ("\\frac{1}{3}", "0.\\bar{3}", 1.0),
    ("\\frac{1}{3}", "0.\\dot{3}", 1.0),
    ("0.\\overline{3}", "0.\\overline{33}", 1.0),
    ("1", "0.\\overline{9}", 1.0),
    ("\\frac{\\sqrt{9}}{9}", "0.\\overline{3}", 1.0),     # against a symbolic gold
    ("(0.\\overline{3}, 1)", "(\\frac{1}{3}, 1)", 1.0),
    ("\\frac{1}{3}", "0.3", 0.0),
    ("\\frac{1}{3}", "0.\\overline{3}4", 0.0),              # digits after the repeating block: no number
    ("0.\\overline{3}", "0.3333", 0.0),
    ("\\frac{1}{6}", "0.\\overline{16}", 0.0),
    ("0.1\\overline{6}", "0.\\overline{16}", 0.0),
    ("\\frac{1}{7}", "0.\\overline{142856}", 0.0),
    ("0.\\overline{3}", "\\frac{1}{3}+10^{-20}", 0.0),
]

# The float64 rule: a decimal of 15 to 17 significant digits equals a non-integer exact value when it reads as the
# float64 nearest that value; any other decimal must be exact.
FLOATS = [
    ("\\frac{2}{3}", "0.6666666666666666", 1.0),           # print(2/3)
    ("0.6666666666666666", "\\frac{2}{3}", 1.0),
    ("\\frac{12}{19}", "0.631578947368421", 1.0),          # print(12/19): 15 digits
    ("-\\frac{2}{3}", "-0.6666666666666666", 1.0),
    ("\\sqrt{3}", "1.7320508075688772", 1.0),              # print(3 ** 0.5)
    ("\\sqrt{2}", "1.4142135623730951", 1.0),
    ("\\pi", "3.141592653589793", 1.0),
    ("\\frac{\\sqrt{3}}{10^{5}}", "1.7320508075688772e-05", 1.0),
    ("\\frac{1}{2^{99}}", "1.5777218104420236e-30", 1.0),
    ("(\\frac{1}{3}, \\frac{2}{3})", "(0.3333333333333333, 0.6666666666666666)", 1.0),
    ("\\frac{2}{3}", "0.667", 0.0),                        # short decimals stay exact
    ("\\frac{2}{3}", "0.66666666666667", 0.0),             # 14 digits
    ("\\sqrt{3}", "1.73205080756888", 0.0),                # sympy's 15 digits: not the double nearest sqrt(3)
    ("\\frac{1}{3}", "0.333333333333333", 0.0),            # '%.15g': another double
    ("\\frac{2}{3}", "0.6666666666666667", 0.0),           # 2/3 rounded to 16 digits: the next double up
    ("\\pi", "3.14159265358979", 0.0),
    ("\\frac{1}{2^{98}}", "1.5777218104420236e-30", 0.0),  # tiny values: their own doubles, apart
    ("\\frac{1}{2^{99}}", "3.1554436208840472e-30", 0.0),
    ("\\frac{1}{3}", "0.3333333333333333333", 0.0),        # 19 digits: no float64 prints that, so exact
    ("3", "3.0000000000000004", 0.0),                      # an integer gold is exact
    ("e^{-1000}", "1.2345678901234567e-435", 0.0),         # below float64's normal range: exact
    ("x + \\frac{2}{3}", "x + 0.6666666666666666", 0.0),  # inside an expression: exact
]

# answer_type "choice": the option letter, also inside a phrase.
CHOICE = [
    ("C", "\\text{The answer is (C)}", 1.0),
    ("C", "Option C", 1.0),
    ("C", "\\text{Answer: C}", 1.0),
    ("C", "C is correct", 1.0),
    ("B", "\\text{(B) is the correct choice}", 1.0),
    ("D", "the correct option is D", 1.0),
    ("A", "Answer: (A)", 1.0),
    ("A", "\\textbf{A}", 1.0),
    ("C", "\\text{The answer is (B)}", 0.0),
    ("C", "Option B", 0.0),
    ("C", "B or C", 0.0),
    ("C", "either B or C", 0.0),
    ("C", "the answer is not C", 0.0),
    ("C", "A, B and C", 0.0),
    ("C", "I think B", 0.0),
    ("C", "\\text{none of these}", 0.0),
]

KINDS = {"base": BASES, "unit": UNITS, "scientific": SCIENTIFIC, "repeating": REPEATING, "float64": FLOATS,
         "choice": CHOICE}
TABLE = [(kind, g, p, want, "choice" if kind == "choice" else "math")
         for kind, rows in KINDS.items() for g, p, want in rows]


def test_every_kind_has_both_directions():
    for kind, rows in KINDS.items():
        assert {w for _, _, w in rows} == {0.0, 1.0}, kind
        assert sum(w == 0.0 for _, _, w in rows) >= 5, kind


@pytest.mark.parametrize("kind,gold,pred,want,answer_type", TABLE,
                         ids=[f"{k}:{g}|{p}" for k, g, p, _, _ in TABLE])
def test_notation(kind, gold, pred, want, answer_type):
    assert gold_is_valid(gold, answer_type)
    assert grade(pred, gold, answer_type) == want, (gold, pred)


def test_rewards_and_evaluation_grade_alike():
    """The same table through the grading workers with the RL step's answer reward: identical rewards."""
    items = [(f"<answer>\\boxed{{{p}}}</answer>", g, t) for _, g, p, _, t in TABLE]
    scored = score_many(items, timeout_s=20.0)
    for (kind, g, p, want, t), r, item in zip(TABLE, scored, items):
        assert r["status"] == "ok" and r["reward"] == want, (kind, g, p, r)
        assert score_trajectory(*item[:2], answer_type=t)["reward"] == want


@pytest.mark.parametrize("gold", ["C", "(C)", "\\text{(C)}"])
def test_a_choice_gold_is_still_one_letter(gold):
    assert choice_letter(gold) == "C"
    assert not gold_is_valid("The answer is C", "choice")   # a phrase is read in answers, not accepted as a gold


def test_a_numeral_whose_digits_do_not_fit_its_base_is_no_gold():
    assert not gold_is_valid("1021_2") and gold_is_valid("1011_2") and gold_is_valid("a_{10}")


@pytest.mark.parametrize("pred,want", [("\\text{(A)}", 1.0), ("The answer is A", 1.0), ("(A) 5 cm", 1.0),
                                       ("A = 5", 0.0), ("B", 0.0), ("A or B", 0.0)])
def test_a_letter_gold_of_a_math_benchmark_reads_the_same_letters(pred, want):
    assert grade(pred, "A") == want
