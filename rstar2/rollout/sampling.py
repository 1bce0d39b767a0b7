"""Token sampling for ``HFEngine``'s decoders (hf_decode.py, hf_cache.py): ``generate``'s warpers in the same order
(temperature, then top-p: the smallest set of tokens whose probability reaches ``top_p``, at least one;
temperature 0 is greedy), drawing each row's token from its own counter-based stream so that it does not
depend on the batch, and the sampled tokens' log-probabilities under the distribution sampled from.
"""

from __future__ import annotations

import torch

from ..seeds import MASK64, splitmix64


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None = None,
                with_logprobs: bool = False):
    """Next token per row from ``logits`` [rows, vocab] (any float dtype); returns int64 [rows], and with
    ``with_logprobs`` also float32 [rows]: each token's natural-log probability under the distribution sampled from
    (after temperature and top-p, renormalised: vLLM's ``processed_logprobs``; temperature 0: the softmax's).

    ``uniforms`` None: draws from the global torch RNG (seed it for reproducible rollouts), like ``generate``.
    ``uniforms`` float64 [rows] in [0, 1): row i takes the token where its cumulative probability (in token-id
    order) first exceeds ``uniforms[i]``, so a row's token depends on its own number only, not on which other rows
    share the batch or in which order they were drawn (``row_uniforms`` derives the numbers from a seed, the
    trajectory and the position).
    """
    if temperature <= 0:
        tokens = logits.argmax(dim=-1)
        if not with_logprobs:
            return tokens
        return tokens, logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        # Sorting the whole vocabulary every step costs more than the model on a CPU (49k tokens x rows); the
        # nucleus nearly always lies in the top few hundred, and when every row's top k already reaches top_p
        # the tokens below them would be dropped anyway, so only those k are sorted (else the whole row is).
        k = min(probs.shape[-1], 256)
        sorted_p, order = probs.topk(k, dim=-1)
        if not bool((sorted_p.sum(dim=-1) >= top_p).all()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens ranked above it already reach top_p (the first one is always kept)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    if uniforms is None:
        tokens = torch.multinomial(probs, 1).squeeze(-1)
    else:
        cdf = probs.double().cumsum(dim=-1)
        target = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    if not with_logprobs:
        return tokens
    return tokens, (probs.gather(-1, tokens[:, None]).squeeze(-1) / probs.sum(-1)).log()


def row_uniforms(seed: int, stream: str, positions: list[int]) -> list[float]:
    """Uniform numbers in [0, 1) for token ``positions`` of one stream (a trajectory), from a counter-based
    generator (SplitMix64 over seed, a stable hash of ``stream`` and the position): the same arguments always give
    the same numbers, whatever else runs, in whatever order."""
    import zlib

    base = splitmix64((seed & MASK64) ^ (zlib.crc32(stream.encode()) << 32) ^ zlib.adler32(stream.encode()))
    return [(splitmix64(base ^ pos) >> 11) * (1.0 / (1 << 53)) for pos in positions]


def draw_uniforms(streams: tuple[int, list[str]] | None, rows: list[int | None], positions: list[int]):
    """The ``uniforms`` argument of ``sample_next`` for the batch rows ``rows`` (input index, None = finished) at
    token ``positions`` (per input index), or None (global RNG) when ``streams`` is None."""
    if streams is None:
        return None
    seed, names = streams
    return torch.tensor([row_uniforms(seed, names[i], [positions[i]])[0] if i is not None else 0.0 for i in rows],
                        dtype=torch.float64)
