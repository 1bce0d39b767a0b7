"""Tests for rstar2.grading: the handed grading cases G01..G09 (hard-coded here) plus edge cases."""

import threading

import pytest

from rstar2 import grading
from rstar2.grading import (TimeoutException, check_gold, extract_final_answer, gold_is_valid, grade, last_boxed,
                            normalize_answer, score_trajectory)

# ---------------------------------------------------------------------------------------------------------
# Handed cases (shared/cases/handed.jsonl, kind "grading"), copied so the tests do not need /work/shared.
# Each row: (case id, gold, response, expected reward).
# ---------------------------------------------------------------------------------------------------------

HANDED = [
    # G01 Repeated final box and zero-padded AIME answers
    ("G01", "840", "So the answer is \\boxed{840}.\n\nLet me restate it after one more explanation.\n\n"
                   "**Final Answer**\n\\boxed{840}", 1.0),
    ("G01", "4", "The last three digits are 004, so \\boxed{004}.\n\n**Final Answer**\n\\boxed{004}", 1.0),
    ("G01", "42", "\\boxed{042}", 1.0),
    # G02 Truncated response ending in an unfinished \boxed{
    ("G02", "12", "First guess: \\boxed{12}. Hmm, wait, that ignores the overlap case. Recounting: 12 + 3 = 15, "
                  "so the final answer is \\boxed{", 0.0),
    ("G02", "42", "Let me compute the partial sum... it is 42 so far and then we add the tail \\boxed{", 0.0),
    # G05 \boxed text in tool output or the prompt is read as the model's answer
    ("G05", "10", "Let me compute with code.\n<tool_call>{\"name\":\"python\",\"arguments\":{\"code\":"
                  "\"print(r'\\\\boxed{10}')\"}}</tool_call>\n<tool_response>\n\\boxed{10}\n</tool_response>\n"
                  "I am not sure what the answer is.", 0.0),
    ("G05", "12", "...\n<tool_response>\n\\boxed{10}\n</tool_response> Hmm, so the answer is \\boxed{12}", 1.0),
    ("G05", "7", "The problem says: put your final answer within \\boxed{}. Let me think... the count is 7 so far",
     0.0),
    # G06 Stripping commas fuses tuples but must still accept thousands separators
    ("G06", "0,1", "\\boxed{(0,1)}", 1.0),
    ("G06", "1000", "\\boxed{1,000}", 1.0),
    ("G06", "1000", "\\boxed{1{,}000}", 1.0),
    ("G06", "1234", "\\boxed{12,34}", 0.0),
    ("G06", "3,5,7", "\\boxed{3, 5, 7}", 1.0),
    # G08 Unparseable gold or empty answer gets credit (row 2, gold "see figure", is tested below)
    ("G08", "\\dfrac{9}{7}", "\\boxed{\\frac{9}{7}}", 1.0),
    ("G08", "12", "Therefore the answer is \\boxed{}.", 0.0),
    ("G08", "12", "<answer></answer>", 0.0),
    # G09 Table of equivalent answer spellings (row 1, "$\text{13}$" without a box, is tested below)
    ("G09", "5", "\\boxed{x = 5}", 1.0),
    ("G09", "30", "\\boxed{30^\\circ}", 1.0),
    ("G09", "B", "\\boxed{\\text{(B)}}", 1.0),
    ("G09", "\\frac{1}{2}", "\\boxed{0.5}", 1.0),
    ("G09", "-3", "\\boxed{\u22123}", 1.0),
    ("G09", "42", "Thus \\[ \\boxed{42} \\]", 1.0),
    ("G09", "7", "The answer is \\fbox{7}.", 1.0),
    ("G09", "E", "\\boxed{\\text{E}}", 1.0),
    ("G09", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}", 1.0),
    ("G09", "28", "\\boxed{28\\%}", 1.0),  # policy: math-verify 0.9.0 says equal in both directions
    ("G09", "28", "\\boxed{0.28}", 0.0),
]


@pytest.mark.parametrize("case_id,gold,response,expected", HANDED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HANDED)])
def test_handed_case(case_id, gold, response, expected):
    assert score_trajectory(response, gold)["reward"] == expected


# G01: extracted values, and the glued / decimal forms an old Math-Verify produced must never appear.
@pytest.mark.parametrize("response,extracted", [
    ("So the answer is \\boxed{840}.\n\nLet me restate it after one more explanation.\n\n"
     "**Final Answer**\n\\boxed{840}", "840"),
    ("The last three digits are 004, so \\boxed{004}.\n\n**Final Answer**\n\\boxed{004}", "4"),
    ("\\boxed{042}", "42"),
])
def test_g01_extracted_never_glued(response, extracted):
    pred = extract_final_answer(response)
    assert normalize_answer(pred) == extracted
    for never in ("840840", "4.004", "4004"):
        assert pred != never and normalize_answer(pred) != never


def test_g02_truncated_has_no_answer():
    assert extract_final_answer("First guess: \\boxed{12}. ... so the final answer is \\boxed{") is None
    assert last_boxed("\\boxed{12} then \\boxed{3") is None
    assert last_boxed("ends with \\boxed") is None


def test_g05_box_in_tool_output_is_not_the_answer():
    resp = ("<tool_call>{\"name\":\"python\",\"arguments\":{\"code\":\"print(r'\\\\boxed{10}')\"}}</tool_call>\n"
            "<tool_response>\n\\boxed{10}\n</tool_response>\nI am not sure.")
    assert extract_final_answer(resp) is None


def test_g08_unparseable_gold_raises_and_never_rewards():
    with pytest.raises(ValueError, match="see figure"):
        grade("3", "see figure")
    with pytest.raises(ValueError, match="see figure"):
        score_trajectory("\\boxed{3}", "see figure")
    out = score_trajectory("\\boxed{3}", "see figure", on_bad_gold="zero")
    assert out["reward"] == 0.0 and "see figure" in out["error"]
    assert not gold_is_valid("see figure")
    assert gold_is_valid("\\dfrac{9}{7}")


def test_g09_unboxed_spelling_text_13():
    # The G09 row "$\text{13}$" has no box: as a spelling it grades equal to 13; as a response it has
    # no boxed answer, so it gets no reward (the protocol extracts the answer from \boxed{} only).
    assert grade("$\\text{13}$", "13") == 1.0
    assert score_trajectory("$\\text{13}$", "13")["reward"] == 0.0


# ---------------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("a \\boxed{1} b \\boxed{2}", "2"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\boxed{\\text{E}}", "\\text{E}"),
    ("\\fbox{7}", "7"),
    ("\\boxed {5}", "5"),
    ("\\boxed 5.", "5"),
    ("\\boxed{}", ""),
    ("no box here", None),
    ("", None),
    (None, None),
    ("\\boxed{1} \\boxed{\\frac{1}{", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_answer_block_wins_over_reasoning_boxes():
    turn = "<reason>try \\boxed{3}</reason><answer>So \\boxed{5}</answer> later \\boxed{9}"
    assert extract_final_answer(turn) == "5"
    # last <answer> block, last box inside it
    turn = "<answer>\\boxed{1}</answer> <answer>\\boxed{2} or \\boxed{4}</answer>"
    assert extract_final_answer(turn) == "4"
    # an <answer> block without a box has no answer, even if the reasoning had one
    assert extract_final_answer("\\boxed{3}<answer>I do not know</answer>") is None
    # an unclosed <answer> (truncated) still counts if its box is complete
    assert extract_final_answer("<reason>x</reason><answer>\\boxed{8}") == "8"
    assert extract_final_answer("\\boxed{3}<answer>the answer is \\boxed{") is None


def test_full_transcript_uses_final_assistant_turn():
    transcript = ("<|im_start|>user\nput it in \\boxed{}<|im_end|>\n<|im_start|>assistant\n<reason>\\boxed{1}"
                  "<tool_call>{}</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n\\boxed{2}\n"
                  "</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>done</reason>"
                  "<answer>\\boxed{6}</answer><|im_end|>")
    assert extract_final_answer(transcript) == "6"
    # an unfinished tool call at the end is not part of the answer
    assert extract_final_answer("\\boxed{4} <tool_call>{\"code\": \"print('\\\\boxed{5}')") == "4"


# ---------------------------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pred,gold,expected", [
    (None, "5", 0.0),
    ("", "5", 0.0),
    ("  ", "5", 0.0),
    ("005", "5", 1.0),
    ("5.0", "5", 1.0),
    ("5.00", "5", 1.0),
    ("1\\,000", "1000", 1.0),
    ("1 000", "1000", 1.0),
    ("1,234,567", "1234567", 1.0),
    ("1,23,4567", "1234567", 0.0),
    ("$42$", "42", 1.0),
    ("\\text{42}", "42", 1.0),
    ("- 3", "-3", 1.0),
    ("\u22123", "\u22123", 1.0),
    ("3", "-3", 0.0),
    ("41", "42", 0.0),
    ("1/2", "\\frac{1}{2}", 1.0),
    ("\\dfrac12", "0.5", 1.0),
    ("-\\frac{1}{2}", "-0.5", 1.0),
    ("0.333", "\\frac{1}{3}", 0.0),     # exact rational comparison: no float tolerance
    ("(B)", "B", 1.0),
    ("\\textbf{(B)}", "(B)", 1.0),
    ("C", "B", 0.0),
    ("b", "B", 0.0),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("2\\pi", "2\\pi", 1.0),
    ("\\text{Evelyn}", "\\text{Evelyn}", 1.0),
    ("3", "\\text{odd}", 0.0),
])
def test_grade(pred, gold, expected):
    assert grade(pred, gold) == expected


@pytest.mark.parametrize("gold", ["", "   ", "see figure", "$see figure$", "\\frac{5}{", "\\frac{1}{2}}"])
def test_bad_gold_raises(gold):
    with pytest.raises(ValueError):
        grade("3", gold)
    with pytest.raises(ValueError):
        check_gold(gold)


@pytest.mark.parametrize("gold", ["\\text{no solution}", "2ab + bc", "x y", "\\sin x", "\\{1, 2\\}", "[0, 1)"])
def test_not_prose_gold_is_valid(gold):
    assert gold_is_valid(gold)


@pytest.mark.parametrize("exc", [TimeoutException("Operation timed out!"), RuntimeError("sympy blew up")])
def test_exceptions_in_either_path_give_zero(monkeypatch, exc):
    def boom(*args, **kwargs):
        raise exc
    assert grade("3 > x", "x < 3") == 1.0           # an inequality: Math-Verify's verify decides
    monkeypatch.setattr(grading.symbolic, "verify", boom)
    assert grade("3 > x", "x < 3") == 0.0
    assert grade("1 + x^2", "x^2 + 1") == 1.0       # an expression: decided exactly, verify not reached
    monkeypatch.setattr(grading.symbolic, "parse_pred", boom)
    assert grade("1 + x^2", "x^2 + 1") == 0.0


def test_grade_from_a_thread_disables_signal_timeouts():
    seen = {}

    def work():
        seen["timeout"] = grading.symbolic.timeout(5)
        seen["reward"] = grade("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2")
        seen["wrong"] = grade("x + 2", "x + 1")
    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert seen == {"timeout": None, "reward": 1.0, "wrong": 0.0}
    assert grading.symbolic.timeout(5) == 5


def test_normalize_answer():
    assert normalize_answer("004") == "4"
    assert normalize_answer("1{,}000") == "1000"
    assert normalize_answer("\u22123") == "-3"
    assert normalize_answer("0,1") == "0,1"       # a tuple, never "01"
    assert normalize_answer("12,34") == "12,34"
    assert normalize_answer(None) is None


def test_score_trajectory_shape():
    assert score_trajectory("<answer>\\boxed{7}</answer>", "7") == {"pred": "7", "reward": 1.0}
    with pytest.raises(ValueError):
        score_trajectory("\\boxed{7}", "7", on_bad_gold="ignore")


# ---------------------------------------------------------------------------------------------------------
# Several boxes never become a set; answer types (integer, math, choice)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("response,gold,expected", [
    ("\\boxed{1}, \\boxed{2}", "1,2", 0.0),          # the last box alone is the answer: 2, not {1, 2}
    ("\\boxed{1}, \\boxed{2}", "2", 1.0),
    ("\\boxed{3} and \\boxed{5}", "\\{3, 5\\}", 0.0),
    ("\\boxed{3, 5}", "3,5", 1.0),                   # one box holding a tuple is fine
])
def test_several_boxes_never_become_a_set(response, gold, expected):
    assert score_trajectory(response, gold)["reward"] == expected


@pytest.mark.parametrize("pred,gold,expected", [
    ("C", "C", 1.0), ("(C)", "C", 1.0), ("\\text{(C)}", "C", 1.0), ("\\textbf{C}", "C", 1.0),
    ("(C) 4.2 eV", "C", 1.0), ("C: 4.2 eV", "C", 1.0), ("(c)", "C", 1.0),
    ("B", "C", 0.0), ("c", "C", 0.0), ("B or C", "C", 0.0), ("4.2 eV", "C", 0.0), ("", "C", 0.0), (None, "C", 0.0),
])
def test_choice_is_graded_on_the_letter(pred, gold, expected):
    assert grade(pred, gold, "choice") == expected
    assert grading.grade_choice(pred, gold) == expected


def test_choice_gold_must_be_a_letter():
    with pytest.raises(ValueError, match="one letter"):
        grade("A", "4.2 eV", "choice")
    assert not gold_is_valid("12", "choice") and gold_is_valid("(D)", "choice")
    out = score_trajectory("\\boxed{A}", "3.5", answer_type="choice", on_bad_gold="zero")
    assert out["reward"] == 0.0 and "one letter" in out["error"]


def test_integer_answer_type():
    assert grade("025", "25", "integer") == 1.0 and grade("26", "25", "integer") == 0.0
    with pytest.raises(ValueError, match="not an integer"):
        grade("1/2", "\\frac{1}{2}", "integer")
    with pytest.raises(ValueError, match="answer_type"):
        grade("1", "1", "letters")


@pytest.mark.parametrize("pred, gold, want", [
    ("505 * 26", "13130", 0.0), ("655 * 28 + 389", "18729", 0.0), ("2^{3}", "8", 0.0), ("\\frac{16}{2}", "8", 0.0),
    ("\\dfrac{16}{2}", "8", 0.0), ("5!", "120", 0.0), ("2 \\times 4", "8", 0.0), ("\\sqrt{64}", "8", 0.0),
    ("13130", "13130", 1.0), ("x = 13130", "13130", 1.0), ("505 \\times 26 = 13130", "13130", 1.0),
    ("8.0", "8", 1.0), ("-2950", "-2950", 1.0), ("1,000", "1000", 1.0), ("8 \\text{ cm}", "8", 1.0),
    ("x = 13131", "13130", 0.0),
])
def test_integer_answers_must_be_evaluated(pred, gold, want):
    """A problem that is an expression ("505 * 26") is not solved by boxing the expression: Math-Verify would
    evaluate it and reward the copy (an RL policy on the bundled arithmetic task learned this in 5 steps)."""
    assert grade(pred, gold, "integer") == want
    if want == 0.0 and "=" not in pred:
        assert grade(pred, gold, "math") == 1.0    # the general grader still accepts equivalent expressions


def test_exact_rationals_before_float_tolerance():
    # Math-Verify alone would call these equal within its float tolerance; exact comparison decides first.
    assert grade("0.3333333333", "\\frac{1}{3}") == 0.0
    assert grade("\\frac{333333333}{1000000000}", "\\frac{1}{3}") == 0.0
    assert grade("\\frac{2}{6}", "\\frac{1}{3}") == 1.0


def test_score_trajectory_is_picklable_for_forked_workers():
    """grade/score_trajectory are plain module functions: a process pool can send them to a worker."""
    import pickle

    assert pickle.loads(pickle.dumps(score_trajectory)) is score_trajectory
    assert pickle.loads(pickle.dumps(grade)) is grade
