"""The model's final answer from its own final turn (paper §2.2.1; handed cases G01, G02, G05, G08).

The answer is the last ``\\boxed{}`` (or ``\\fbox{}``) inside the last ``<answer>`` block if there is one,
else the last box of the turn. ``<tool_call>`` and ``<tool_response>`` blocks are removed first, so a box
printed by code never counts. Boxes are never merged into a set (Math-Verify merges several boxes of one
string). A last box that is unfinished (cut off by the length limit) gives no answer: there is no fallback to
an earlier box. The box reader itself is :func:`rstar2.grading.answers.last_boxed`, shared with data loading.
"""

from __future__ import annotations

import re

from .answers import last_boxed

_TOOL_CALL_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)
_ASSISTANT_MARK = "<|im_start|>assistant"


def final_turn_text(text: str | None) -> str:
    """Reduce a response (or a whole transcript) to the model's own text of its final assistant turn.

    Keeps what follows the last ``<|im_start|>assistant`` marker and the last ``</tool_response>``, then
    removes ``<tool_call>`` and ``<tool_response>`` blocks (closed or cut off at the end). The prompt's
    instruction and tool outputs both contain ``\\boxed{}`` text that must never count as the model's answer.
    """
    text = text or ""
    if _ASSISTANT_MARK in text:
        text = text.rsplit(_ASSISTANT_MARK, 1)[1]
    if "</tool_response>" in text:
        text = text.rsplit("</tool_response>", 1)[1]
    text = _TOOL_RESPONSE_RE.sub(" ", text)
    text = _TOOL_CALL_RE.sub(" ", text)
    return text


def extract_final_answer(final_turn: str | None) -> str | None:
    """The model's final answer, or None.

    From the model's final turn (see :func:`final_turn_text`): if it has an ``<answer>`` tag, the answer
    region is the last ``<answer>`` block (up to ``</answer>``, or to the end when the tag was never closed)
    and the answer is the last box inside it; otherwise the last box of the turn. An empty or unfinished
    last box gives None. Several boxes are never merged.
    """
    text = final_turn_text(final_turn)
    if "<answer>" in text:
        region = text.rsplit("<answer>", 1)[1]
        region = region.split("</answer>", 1)[0]
    else:
        region = text
    box = last_boxed(region)
    return box or None
