"""What every SFT source shares: the drop and error signals, the short reason sentences, the assistant-turn
builders, the system prompt, the sandbox runner and the final row check (paper §4.1; wire format rstar2/chat.py).

Assistant turns are non-reasoning: ``<reason>{one templated sentence}</reason>\\n`` then either one
``<tool_call>`` block or ``<answer>{text}</answer>``. The sentence is drawn from the fixed lists below with a
per-row RNG seeded by ``(seed, row id)``, so a row converts the same way whatever else is in the run.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from ... import chat, sandbox

R_CALL_FN = (
    "The user's request needs the {name} function, so I will call it.",
    "I can handle this by calling {name} with the details given.",
    "This is a job for the {name} function.",
)
R_AFTER_FN = (
    "The function returned its result, so I can reply.",
    "I have the function's output and will share it.",
    "The call succeeded; I will report the result.",
)
R_NO_CALL_WITH_TOOLS = (
    "No function call is needed for this reply.",
    "I can reply directly without calling a function.",
    "The available functions are not needed here.",
)
R_DIRECT = (
    "No tool is needed; I can answer directly.",
    "This request can be answered directly.",
    "I will respond directly to the request.",
)
R_CALL_PY = (
    "I can get this by running Python code.",
    "Running a short Python snippet will give the result.",
    "I will use the Python tool to compute this.",
)
R_CALL_PY_MORE = (
    "I will run one more snippet for the remaining part.",
    "Next, I need the second result from Python.",
)
R_AFTER_PY = (
    "The code ran and printed the result.",
    "I have the output from the Python tool.",
    "The tool returned the value I need.",
)
R_ALPACA = (
    "This request can be answered directly; no code needs to run.",
    "No tool is needed for this; I will answer directly.",
    "This is a language task, so I will respond without calling the tool.",
)


class Drop(Exception):
    """A row left out for a counted reason (stats.json ``dropped``): data quality, not a broken file."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Broken(Exception):
    """A row whose structure does not fit its format: the stage stops with a one-line error.

    ``role`` is the field role (``conversations``, ``messages``, ...) and ``path`` the place inside its value
    (``"3.from"``); the stage adds the source, file, row and mapped column.
    """

    def __init__(self, role: str, path: str, message: str):
        super().__init__(message)
        self.role, self.path, self.message = role, path, message


@dataclass
class Context:
    """What a converter needs besides the row: the source spec and the stage's tool settings.

    ``counts`` collects a format's extra counters (toolformer: ``parse_fallback``, ``import_repaired``), which
    the stage copies into the source's stats.
    """
    name: str
    spec: dict
    seed: int
    tool_name: str
    max_tool_chars: int
    counts: Counter = field(default_factory=Counter)


@dataclass
class Pending:
    """A converted row that may still need its Python tool calls run: ``jobs`` are ``(code, stdin)`` pairs;
    ``finish(results)`` takes one sandbox result per job and returns the messages, or raises :class:`Drop`."""
    jobs: list[tuple[str, str]]
    finish: Callable[[list], list[dict]]


def done(messages: list[dict]) -> Pending:
    """A row with nothing to run."""
    return Pending([], lambda results: messages)


def rng(seed: int, row_id: str) -> random.Random:
    """The per-row RNG that picks reason sentences."""
    return random.Random(f"{seed}:{row_id}")


def assistant(reason: str, body: str) -> dict:
    """An assistant message ``<reason>{reason}</reason>\\n{body}``."""
    return {"role": "assistant", "content": f"<reason>{reason}</reason>\n{body}"}


def answer(reason: str, text: str) -> dict:
    """A final assistant message with ``<answer>{text}</answer>``."""
    return assistant(reason, f"<answer>{text}</answer>")


def system_prompt(tools: list[dict], extra: str = "") -> str:
    """``chat.system_message(tools)`` with a row's own system text (a domain policy, say) after the rStar2
    prompt and before the tool block; the bare rStar2 system message when ``extra`` is empty."""
    base = chat.system_message(tools)
    if not extra.strip():
        return base
    return chat.SYSTEM_PROMPT + "\n\n" + extra.strip() + base[len(chat.SYSTEM_PROMPT):]


def run_in_sandbox(jobs: list[tuple[str, str]], limits: sandbox.SandboxLimits, name: str, stats: dict) -> list:
    """Run ``(code, stdin)`` jobs through the sandbox client with a progress bar (rate and ETA on stderr).

    Returns one :class:`rstar2.sandbox.ExecResult` per job, in order; records ``stats["sandbox"]`` (calls,
    wall seconds, workers, status counts).
    """
    results: list[sandbox.ExecResult] = []
    t0 = time.time()
    with sandbox.shared_client(limits) as client, \
            tqdm(total=len(jobs), desc=f"sft_data {name} sandbox", unit="call", file=sys.stderr,
                 mininterval=2.0) as bar:
        workers = len(client.pool.workers) if client.pool is not None else 0
        for k in range(0, len(jobs), 64):
            chunk = jobs[k:k + 64]
            results += client.run_many(chunk)
            bar.update(len(chunk))
    stats["sandbox"] = {"calls": len(jobs), "wall_s": round(time.time() - t0, 2), "workers": workers,
                        "status": dict(Counter(r.status for r in results))}
    return results


def check_row(row: dict) -> None:
    """The invariants every output row keeps (roles, ``<reason>`` prefix, ends on the assistant).

    Raises:
        AssertionError: a converter produced a row that ``chat.encode_conversation`` would mis-train on.
    """
    for m in row["messages"]:
        if m["role"] not in ("system", "user", "assistant", "tool") or not isinstance(m["content"], str):
            raise AssertionError(f"{row['id']}: bad message {m!r:.80}")
        if m["role"] == "assistant" and not m["content"].startswith("<reason>"):
            raise AssertionError(f"{row['id']}: assistant content must start with <reason>")
    if row["messages"][-1]["role"] != "assistant":
        raise AssertionError(f"{row['id']}: conversation must end on an assistant turn")
