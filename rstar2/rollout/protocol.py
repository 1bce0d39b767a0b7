"""The inference-engine protocol shared by the scheduler, the agent loop and every engine (paper §3.2); see
engines.py for what each method means and which engines there are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol


@dataclass
class Generation:
    """One generated turn: new token ids (EOS included when finish_reason == "stop"); ``logprobs``, when the
    engine reports them, has one sampling log-probability (natural log, of the distribution sampled from) per
    token id."""
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    logprobs: list[float] | None = None


class Engine(Protocol):
    """What the scheduler and the agent loop need from an inference engine (engines.py says what each method means)."""

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation: ...

    def release(self, key: str) -> None: ...

    def kv_capacity_tokens(self) -> int | None: ...


class TurnRequest(NamedTuple):
    """One turn to generate: the trajectory's key, its whole context (prompt + response so far), the budget."""
    key: str
    context_ids: list[int]
    max_new_tokens: int


def normalise_finish(ids: list[int], finish: str | None, stop: list[int], max_new: int) -> Generation:
    """vLLM/OpenAI finish reasons -> ours. A turn stopped by a stop token ends with that token (servers
    may leave it out of the ids; it is trained, as in the released code)."""
    if finish == "stop":
        return Generation(ids if ids and ids[-1] in stop else ids + [stop[0]], "stop")
    return Generation(ids[:max_new], "length")
