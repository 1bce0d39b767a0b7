"""RL prompt-length filter (the released rstar2_agent/main_rstar2_agent.py drops prompts longer than 2048 tokens,
measured with the tool schema included; config ``rl_data.max_prompt_tokens``).

A problem's prompt is exactly what a rollout starts from: ``chat.prompt_text(problem, [python tool schema])``
(system prompt with the tool schema, user prefix, problem, generation prompt), encoded without special tokens
by the policy's tokenizer, as :meth:`rstar2.rollout.agent_loop.AgentLoop.new_trajectory` does. A problem whose
prompt has more than ``max_tokens`` tokens is dropped (``prompt_too_long``); exactly ``max_tokens`` is kept.
The funnel gets the step ``prompt_length`` and ``funnel["prompt_length"]`` (limit, longest prompt, drops).
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from .. import chat
from .curate import append_step

STEP = "prompt_length"
DROP_REASON = "prompt_too_long"
_PROBE = 8   # problems whose whole prompts check that the system turn's count adds up (prompt_lengths)


def prompt_lengths(problems: list[str], tokenizer, tool_name: str, batch_size: int = 512) -> list[int]:
    """Token count of each problem's rendered RL prompt (module docstring), in order.

    The system turn (system prompt and tool schema: 326 tokens in SmolLM2's tokenizer, 288 in Qwen3's) is the same
    in every prompt and ends in the chat template's end-of-turn marker. Where the tokenizer splits there (the marker
    is a special token, as in Qwen's and SmolLM2's), a prompt's count is the system turn's plus that of the rest, so
    only the rest (the user turn and generation prompt, a median of ~80 tokens over the default's candidates) is
    tokenized per problem: the default run's rl_data took 27 s before, 13 s after, on a 2-core Zen 3
    (``docs/measurements/zen3_seed0_r2`` and ``zen3_seed0_r3``, ``benchmarks/rl_data.tsv``). Whether the counts add
    up is a property of that fixed boundary, not of the problem; it is checked on the first problems (whole prompts)
    and, if they differ, every prompt is tokenized whole.

    Args:
        problems: problem texts (any number, empty strings too).
        tokenizer: a transformers tokenizer (called on a batch of texts, ``add_special_tokens=False``).
        tool_name: the code tool's name in the schema (config ``tool.name``).
        batch_size: texts per tokenizer call.
    Returns:
        One int per problem: the tokens of ``chat.prompt_text(problem, [python tool schema])``.
    """
    tools = [chat.python_tool_schema(tool_name)]
    head = chat.turn("system", chat.system_message(tools))

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []

    n_head = count([head])[0]
    probe = [chat.prompt_text(p, tools) for p in problems[:_PROBE]]
    additive = count(probe) == [n_head + n for n in count([t[len(head):] for t in probe])]
    out: list[int] = []
    with tqdm(total=len(problems), desc="rl_data prompt tokens", unit="prompt", file=sys.stderr,
              mininterval=2.0) as bar:
        for k in range(0, len(problems), batch_size):
            texts = [chat.prompt_text(p, tools) for p in problems[k:k + batch_size]]
            out += [n_head + n for n in count([t[len(head):] for t in texts])] if additive else count(texts)
            bar.update(len(texts))
    return out


def filter_prompts(rows: list[dict], funnel: dict, max_tokens: int | None, lengths: list[int] | None) -> list[dict]:
    """Keep the rows whose prompt has at most ``max_tokens`` tokens and record the step in ``funnel``.

    Args:
        rows: RL problems ``{"id", "source", "problem", ...}``.
        max_tokens: the limit; None or 0 records the step as "skipped" and keeps every row.
        lengths: :func:`prompt_lengths` of ``rows`` (ignored when skipped).

    Raises:
        ValueError: ``lengths`` does not have one entry per row.
    """
    if not max_tokens:
        append_step(funnel, STEP, rows, [], DROP_REASON, "skipped")
        return rows
    if lengths is None or len(lengths) != len(rows):
        raise ValueError(f"prompt_length: need one length per row, got {None if lengths is None else len(lengths)} "
                         f"for {len(rows)} rows")
    kept = [r for r, n in zip(rows, lengths) if n <= max_tokens]
    dropped = [r for r, n in zip(rows, lengths) if n > max_tokens]
    append_step(funnel, STEP, kept, dropped, DROP_REASON, "done")
    funnel["prompt_length"] = {"max_tokens": int(max_tokens), "longest": max(lengths, default=0),
                               "dropped": len(dropped)}
    return kept
