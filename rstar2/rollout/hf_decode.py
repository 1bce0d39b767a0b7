"""Batched sampling for ``HFEngine`` that drops each row from the batch as soon as it is finished.

``transformers``' ``generate`` keeps every row of a batch in every decode step until the longest one ends
(finished rows are only overwritten with padding), and uses one ``max_new_tokens`` for all rows. On a CPU,
where a decode step costs about the same per row whatever the others do, that wastes most of a turn's
compute: one rollout that writes 192 tokens makes fifteen others that stopped after 40 pay for 192. Here a row
leaves the batch (and the KV cache) when it emits the stop token or reaches its own token limit.

Sampling follows ``generate``'s warpers in the same order: temperature, then top-p (nucleus: the smallest
set of tokens whose probability reaches ``top_p``, at least one); temperature 0 is greedy.
"""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Next token per row from ``logits`` [rows, vocab] (any float dtype); returns int64 [rows].

    Uses the global torch RNG (seed it for reproducible rollouts), like ``generate``.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
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
    return torch.multinomial(probs, 1).squeeze(-1)


@torch.no_grad()
def decode_shrinking(model, prompts: list[list[int]], limits: list[int], stop_id: int, pad_id: int,
                     temperature: float, top_p: float) -> list[list[int]]:
    """Sample a continuation for each prompt; each row leaves the batch when it is done.

    Args:
        model: a ``transformers`` causal LM (called with ``past_key_values``, ``position_ids``, ``logits_to_keep``).
        prompts: token ids per row (any lengths; left-padded here).
        limits: the most new tokens per row (each >= 1).
        stop_id: the token that ends a row (kept as its last token).
        pad_id: the id written into padding positions (never attended to).
        temperature, top_p: see ``sample_next``.
    Returns:
        The new token ids per row, in input order: ending in ``stop_id``, or exactly ``limits[i]`` long.
    """
    from transformers import DynamicCache

    device = getattr(model, "device", torch.device("cpu"))
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    rows = list(range(len(prompts)))          # input index of each row still in the batch
    new: list[list[int]] = [[] for _ in prompts]
    while True:
        nxt = sample_next(out.logits[:, -1, :], temperature, top_p)
        keep = []
        for j, (i, tok) in enumerate(zip(rows, nxt.tolist())):
            new[i].append(tok)
            if tok != stop_id and len(new[i]) < limits[i]:
                keep.append(j)
        if not keep:
            return new
        if len(keep) < len(rows):
            idx = torch.tensor(keep, device=device)
            cache.batch_select_indices(idx)
            mask, nxt = mask[idx], nxt[idx]
            rows = [rows[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                    past_key_values=cache, use_cache=True)
