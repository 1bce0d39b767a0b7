"""The rStar2-Agent wire format: prompt template, tool schema, tool-call parsing, tool-response turns, token masks.

Source: paper §2.1, Fig. 3 and the released code: the Jinja template in rstar2_agent/config/rstar2_agent_trainer.yaml,
the hermes-style parser in rstar2_agent/tools/tool_parser.py.
Layout of one trajectory (``|`` separates token segments; ``[m]`` = masked, loss weight 0)::

    <|im_start|>system\\n{SYSTEM + tools}<|im_end|>\\n                        [m]  prompt
    <|im_start|>user\\n{USER_PREFIX}{question}<|im_end|>\\n                   [m]  prompt
    <|im_start|>assistant\\n<reason>                                         [m]  prompt (generation prompt)
    ...model text... <tool_call>{json}</tool_call><|im_end|>                 [1]  generated
    \\n<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n<reason>  [m]
    ...model text... <answer>... \\boxed{N} ...</answer><|im_end|>            [1]  generated

Every segment is tokenised on its own and the ids are concatenated, so SFT examples and RL rollouts
share exactly the same token boundaries; earlier text is never re-tokenised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ASSISTANT_PREFIX = f"{IM_START}assistant\n<reason>"

SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the "
    "answer. The reasoning process is enclosed within <reason> </reason> and answer is enclosed within "
    "<answer> </answer> tags, respectively, i.e., <reason> reasoning process here </reason> "
    "<answer> answer here </answer>."
)
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
USER_PREFIX = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n"
)

# Paper (Fig. 3) name; the released code uses "python_code_with_standard_io" (spec Appendix A.6).
DEFAULT_TOOL_NAME = "execute_python_code_with_standard_io"

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
# The released parser's regex; kept for simple checks on well-formed data (SFT examples), not for parsing rollouts.
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Closed reasoning blocks; a tool call written inside one is only mentioned, never executed (case T02).
_REASONING_RE = re.compile(r"<(think|reason)>.*?</\1>", re.DOTALL)
_FENCE_RE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)
_JSON = json.JSONDecoder(strict=False)  # strict=False: raw newlines inside the code string are accepted


def python_tool_schema(name: str = DEFAULT_TOOL_NAME) -> dict:
    """JSON schema of the code tool (released code rstar2_agent/config/tool_config/python_tool_config.yaml): required
    string parameters ``code`` and ``input`` (stdin)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Execute Python code. The code is run with the given standard input; standard "
                           "output is captured and returned. If the code raises, the error message is returned.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The Python code to execute."},
                    "input": {"type": "string", "description": "The standard input for the code."},
                },
                "required": ["code", "input"],
            },
        },
    }


def system_message(tools: list[dict]) -> str:
    """The rStar2 system prompt with one JSON tool schema per line (paper Fig. 3)."""
    if not tools:
        return SYSTEM_PROMPT
    return SYSTEM_PROMPT + TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def user_message(question: str) -> str:
    """The user turn the template builds from a raw question (instruction prefix + problem)."""
    return USER_PREFIX + question


def turn(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def prompt_text(question: str, tools: list[dict]) -> str:
    """Full RL/eval prompt: system + user + generation prompt ending in ``<reason>``."""
    return turn("system", system_message(tools)) + turn("user", user_message(question)) + ASSISTANT_PREFIX


def tool_response_text(results: list[str]) -> str:
    """The masked text appended after an assistant turn that made tool calls (paper §2.1).

    Consecutive tool results share one user turn; the next generation prompt follows.
    """
    body = "".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return "\n" + turn("user", body) + ASSISTANT_PREFIX


@dataclass
class ToolCall:
    """One parsed tool call. ``error`` is set (and code is None) when the call could not be parsed."""
    name: str | None
    code: str | None
    stdin: str = ""
    error: str | None = None


def _outside_reasoning(text: str) -> str:
    """Blank out reasoning that is not an action: the opening reasoning (the turn starts inside the
    ``<reason>`` the generation prompt opened, so everything before the first ``</reason>``) and every
    later closed ``<reason>``/``<think>`` block. Offsets are kept (blanked with spaces)."""
    def blank(m: re.Match) -> str:
        return " " * len(m.group(0))
    head = text.find("</reason>")
    if head >= 0 and text.find("<reason>", 0, head) < 0:
        text = " " * (head + len("</reason>")) + text[head + len("</reason>"):]
    return _REASONING_RE.sub(blank, text)


def strip_code_fence(code: str) -> str:
    """Code wrapped whole in a markdown fence (three backticks, optional language) -> the code inside (case T01)."""
    m = _FENCE_RE.match(code)
    return m.group(1) if m else code


def _decode_call(obj, tool_name: str) -> ToolCall:
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        raise ValueError("a tool call needs the keys 'name' and 'arguments'")
    args = obj["arguments"]
    if isinstance(args, str):  # arguments given as a JSON string (case T01)
        args = json.loads(args, strict=False)
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        raise ValueError("'arguments' must be an object with a string 'code'")
    if obj["name"] != tool_name:
        raise ValueError(f"unknown tool {obj['name']!r}; the only tool is {tool_name!r}")
    code = strip_code_fence(args["code"])
    if not code.strip():
        raise ValueError("'code' is empty")
    stdin = args.get("input") or ""
    return ToolCall(name=obj["name"], code=code, stdin=str(stdin))


def scan_tool_calls(text: str) -> list:
    """Every ``<tool_call>{json}</tool_call>`` block of one complete assistant turn, in order: the decoded
    JSON value, or the ``ValueError`` that says why the block is not one JSON object followed by its
    closing tag. Blocks inside reasoning are skipped (rules in :func:`parse_tool_calls`); the schema of the
    object (which tool, which arguments) is the caller's: the code tool here, BFCL's functions in
    :mod:`rstar2.grading.bfcl`.
    """
    text = _outside_reasoning(text)
    found: list = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        body = start + len(TOOL_CALL_OPEN)
        try:
            i = body
            while i < len(text) and text[i].isspace():
                i += 1
            obj, end = _JSON.raw_decode(text, i)
            j = end
            while j < len(text) and text[j].isspace():
                j += 1
            if not text.startswith(TOOL_CALL_CLOSE, j):
                close = text.find(TOOL_CALL_CLOSE, j)
                pos = len(text) if close < 0 else close + len(TOOL_CALL_CLOSE)
                raise ValueError("no closing </tool_call> after the JSON object" if close < 0 else
                                 "extra text after the JSON object; write one object per <tool_call>")
            pos = j + len(TOOL_CALL_CLOSE)
            found.append(obj)
        except ValueError as e:
            if pos <= start:  # the JSON itself failed: resume after this block's closing tag
                close = text.find(TOOL_CALL_CLOSE, body)
                pos = len(text) if close < 0 else close + len(TOOL_CALL_CLOSE)
            found.append(e)
    return found


def parse_tool_calls(text: str, tool_name: str = DEFAULT_TOOL_NAME) -> list[ToolCall]:
    """Parse every ``<tool_call>{json}</tool_call>`` block of one complete assistant turn, in order (paper §2.1).

    Rules (the released hermes parser, plus fixes for the handed failure cases T01-T03, tests/test_chat.py):
    - The JSON object is read with a JSON decoder from just after ``<tool_call>`` and must be followed by
      ``</tool_call>``; so a ``</tool_call>`` *inside* the code string does not end the call (the
      released non-greedy regex cuts there). Raw newlines in strings are accepted.
    - ``arguments`` given as a JSON string is decoded; a code string wrapped whole in markdown fences is unwrapped.
    - Calls inside closed ``<reason>``/``<think>`` blocks (and before the first ``</reason>``, since the
      turn starts inside ``<reason>``) are mentions, not calls, and are ignored.
    - Anything else wrong (bad JSON, a second object in one tag, unknown tool, missing/empty code, no
      closing tag) yields ``ToolCall(error="Failed to decode tool call: ...")``: the text goes back to the
      model as the tool response and code never runs with missing or partial arguments.
    The caller must not parse a turn that was cut by the length limit (case T04; released code
    rstar2_agent/rollout/rstar2_agent_loop.py).
    """
    calls: list[ToolCall] = []
    for obj in scan_tool_calls(text):
        try:
            if isinstance(obj, ValueError):
                raise obj
            calls.append(_decode_call(obj, tool_name))
        except (ValueError, TypeError) as e:
            calls.append(ToolCall(name=None, code=None, error=f"Failed to decode tool call: {e}"))
    return calls


def tool_call_text(code: str, stdin: str = "", tool_name: str = DEFAULT_TOOL_NAME) -> str:
    """Render a tool call the way the model is taught to write it (used to build SFT data)."""
    payload = {"name": tool_name, "arguments": {"code": code, "input": stdin}}
    return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"


def encode_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Tokenise a conversation into ``(input_ids, loss_mask)`` with the segment layout above.

    Args:
        messages: dicts with ``role`` in {system, user, assistant, tool} and ``content``. Assistant
            contents start with ``<reason>`` (it belongs to the masked generation prompt). Consecutive
            tool messages share one user turn. An assistant message with ``"weight": 0`` is masked whole.
    Returns:
        Two equal-length lists: token ids and a 0/1 loss mask (1 = assistant-generated token of a message
        whose weight is not 0, the closing ``<|im_end|>`` included).
    Raises:
        ValueError: an unknown role or an assistant message that does not start with ``<reason>``.
    """
    segments: list[tuple[str, int]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        role, content = m["role"], m["content"]
        if role in ("system", "user"):
            segments.append((turn(role, content), 0))
        elif role == "assistant":
            if not content.startswith("<reason>"):
                raise ValueError(f"assistant message {i} must start with <reason>: {content[:60]!r}")
            segments.append((ASSISTANT_PREFIX, 0))
            # "weight": 0 (OpenAI fine-tuning format): in the context, out of the loss
            segments.append((content[len("<reason>"):] + IM_END, 0 if m.get("weight", 1) == 0 else 1))
            segments.append(("\n", 0))
        elif role == "tool":
            results = []
            while i < len(messages) and messages[i]["role"] == "tool":
                results.append(messages[i]["content"])
                i += 1
            body = "".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
            segments.append((turn("user", body), 0))
            continue
        else:
            raise ValueError(f"message {i}: unknown role {role!r}")
        i += 1
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in segments:
        seg = tokenizer.encode(text, add_special_tokens=False)
        ids += seg
        mask += [trained] * len(seg)
    return ids, mask
