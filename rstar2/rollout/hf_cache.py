"""Decoding that keeps each trajectory's KV cache across turns and prefills a group's shared prompt once.

Without it, every turn of a trajectory re-prefills its whole context (system prompt with the tool schema, the
problem, every earlier turn and tool response), and each of a group's 2G rollouts prefills the same ~400-token
prompt. On a CPU that prefill is a large part of a rollout step. Here:

- a row that arrives with ``past`` (the KV of tokens it already holds, from its previous turn) prefills only its
  new tokens (the last sampled token, which was never fed, and the tool response);
- rows without ``past`` whose contexts are equal (a group's prompt in turn 1) are prefilled once and copied, and
  distinct prompts forward their common prefix (system prompt and tool schema) once;
- when a row stops on its stop token, its KV (context + generated tokens but the last) is handed back for the
  next turn. A row cut by its token limit ends its trajectory, so nothing is kept for it;
- on a CPU, every linear layer multiplies through a weight packed for oneDNN (``hf_packed``), which at
  decoding's few rows runs 1.5-4x faster than ``F.linear``'s MKL call;
- the decode loop keeps one copy of the rows' common context prefix (``hf_decode.shared_prefix_kv``; CPU): each
  step reads its keys and values once for all rows, not once per row (2-core Zen 4, SmolLM2-135M, 410-token
  prompts sharing 380: 93 against 128 ms per step at 16 rows, 121 against 172 at 32; bf16).

The result is the same computation as a re-prefill (same tokens, positions and masks); only the batching of the
arithmetic differs, so values agree to rounding (``tests/test_hf_cache.py`` checks greedy tokens in float64).

Layout. Prefill batch: each row's past left-padded to the longest past P, then its new tokens left-padded to the
longest new part N (so a row's mask may have a gap between past and new: attention masks handle any zeros, and
positions come from the mask, so they are contiguous over real tokens). After the prefill every row's real
positions are gathered into one contiguous run, and the decode batch is left-padded as in ``hf_decode``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .hf_decode import PreallocatedCache, draw_uniforms, grouped_query_decoding, sample_next, shared_prefix_kv
from .hf_lean import LeanDecoder
from .hf_packed import packed_linears


@dataclass
class PastKV:
    """A row's cached keys and values: per layer ``(K, V)`` of shape [H_kv, n_tokens, D], for the first
    ``n_tokens`` tokens of ``ids`` (the tokens it was computed on, which a next turn's context must start with)."""
    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def n_tokens(self) -> int:
        return self.layers[0][0].shape[-2] if self.layers else 0

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)


def _gather(cache: PreallocatedCache, row: int, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of one row's keys and values at ``positions`` (int64 [n]) of every layer: [H_kv, n, D] each."""
    return [(layer.keys[row].index_select(-2, positions).clone(), layer.values[row].index_select(-2, positions).clone())
            for layer in cache.layers]


def _left_padded(rows: list[list[tuple[torch.Tensor, torch.Tensor]]], width: int, capacity: int) -> PreallocatedCache:
    """A cache of ``len(rows)`` rows whose row i holds ``rows[i]`` right-aligned in the first ``width`` positions."""
    cache = PreallocatedCache(capacity)
    for li in range(len(rows[0])):
        k0, v0 = rows[0][li]
        k = k0.new_zeros(len(rows), k0.shape[0], width, k0.shape[-1])
        v = v0.new_zeros(len(rows), v0.shape[0], width, v0.shape[-1])
        for i, r in enumerate(rows):
            n = r[li][0].shape[-2]
            if n:
                k[i, :, width - n:] = r[li][0]
                v[i, :, width - n:] = r[li][1]
        cache.update(k, v, li)
    return cache


def _prefill(model, unique: list[tuple[PastKV | None, list[int]]], pad_id: int):
    """Forward every unique row's new tokens on top of its past. Returns (last-position logits [U, vocab], each
    row's contiguous KV of past + new tokens)."""
    device = getattr(model, "device", torch.device("cpu"))
    P = max((p.n_tokens if p is not None else 0) for p, _ in unique)
    N = max(len(new) for _, new in unique)
    ids = torch.full((len(unique), N), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(unique), P + N, dtype=torch.long, device=device)
    for u, (past, new) in enumerate(unique):
        n_past = past.n_tokens if past is not None else 0
        ids[u, N - len(new):] = torch.tensor(new, device=device)
        mask[u, P - n_past:P] = 1
        mask[u, P + N - len(new):] = 1
    cache = PreallocatedCache(P + N)
    if P:
        template = next(p for p, _ in unique if p is not None).layers
        empty = [(k.new_zeros(k.shape[0], 0, k.shape[-1]), v.new_zeros(v.shape[0], 0, v.shape[-1])) for k, v in template]
        loaded = _left_padded([p.layers if p is not None else empty for p, _ in unique], P, P + N)
        cache = loaded
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, P:]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    kv = [_gather(cache, u, mask[u].nonzero().squeeze(-1)) for u in range(len(unique))]
    return out.logits[:, -1, :], kv


PAD_WASTE = 0.125   # a prefill chunk may forward at most this share more (padded) tokens than its rows hold


def _prefill_chunked(model, unique: list[tuple[PastKV | None, list[int]]], pad_id: int):
    """``_prefill`` over rows of similar new-token counts at a time, so a few long rows do not pad every other
    one: the rows, sorted by how many new tokens they forward, form chunks whose padded size is at most
    ``1 + PAD_WASTE`` times their real one. Why: a turn after a tool call forwards the tool response, whose length
    varies most (an error's traceback against a number); padded to the longest, an evaluation's second-turn
    prefill of 98 rows forwarded 81 tokens per row for a mean near 35 (15 s of the turn's 30 s on a 2-core Zen 3).
    Same arithmetic per row as one prefill (its own tokens, positions and mask), batched differently.
    Returns what ``_prefill`` returns, in ``unique``'s order."""
    order = sorted(range(len(unique)), key=lambda u: len(unique[u][1]))
    chunks, cur, real = [], [], 0
    for u in order:
        n = len(unique[u][1])
        if cur and (len(cur) + 1) * n > (1 + PAD_WASTE) * (real + n):
            chunks.append(cur)
            cur, real = [], 0
        cur.append(u)
        real += n
    chunks.append(cur)
    if len(chunks) == 1:
        return _prefill(model, unique, pad_id)
    logits, kv = [None] * len(unique), [None] * len(unique)
    for chunk in chunks:
        lg, layers = _prefill(model, [unique[u] for u in chunk], pad_id)
        for j, u in enumerate(chunk):
            logits[u], kv[u] = lg[j], layers[j]
    return torch.stack(logits), kv


MIN_SHARED_PREFIX = 16   # tokens; a shorter common prefix of distinct prompts is not worth its own forward


def _share_prompt_prefix(model, unique: list[tuple[PastKV | None, list[int]]], pad_id: int):
    """Distinct prompts (rows without ``past``) that start alike (every rStar2 prompt opens with the same system
    prompt and tool schema, ~380 tokens) get the KV of their common prefix from one forward of it, as a ``past``:
    the prefill then forwards only what differs. Keys are computed at the same positions 0..s-1 either way, so the
    arithmetic is that of a whole-prompt prefill. Fewer than two such rows, or a short prefix: unchanged."""
    fresh = [u for u, (past, _) in enumerate(unique) if past is None]
    if len(fresh) < 2:
        return unique
    prompts = [unique[u][1] for u in fresh]
    n = min(len(p) for p in prompts) - 1   # every row keeps at least one token of its own
    s = next((i for i in range(n) if any(p[i] != prompts[0][i] for p in prompts)), n)
    if s < MIN_SHARED_PREFIX:
        return unique
    prefix = prompts[0][:s]
    _, (layers,) = _prefill(model, [(None, prefix)], pad_id)
    past = PastKV(prefix, layers)
    out = list(unique)
    for u in fresh:
        out[u] = (past, unique[u][1][s:])
    return out


@torch.no_grad()
def decode_cached(model, rows: list[tuple[PastKV | None, list[int]]], limits: list[int], stop_id: int, pad_id: int,
                  temperature: float, top_p: float, keep: bool = True,
                  streams: tuple[int, list[str]] | None = None,
                  logprobs: list | None = None, pack: bool = True, lean: bool = True,
                  packs: dict | None = None) -> list[tuple[list[int], PastKV | None]]:
    """Sample a continuation of each row's context, reusing cached KV and prefilling equal contexts once.

    Args:
        model: a ``transformers`` causal LM (called with ``past_key_values``, ``position_ids``, ``logits_to_keep``).
        rows: per row ``(past, new_ids)``: ``past`` holds the KV of the context's first tokens (None: none), and
            ``new_ids`` the rest of the context (at least one token).
        limits: the most new tokens per row (each >= 1). stop_id, pad_id, temperature, top_p: as ``decode_shrinking``.
        keep: return each stopped row's KV for its next turn (False: return None for every row).
        streams: per-row random streams, as ``hf_decode.decode_shrinking`` (the token position is the row's
            context length plus the tokens generated so far, so a cached and a re-prefilled row draw alike).
        logprobs: a list to fill with each row's new tokens' log-probabilities, as ``decode_shrinking``'s.
        pack: on a CPU, the linear layers multiply through oneDNN-packed weights (``hf_packed``) and a supported
            float32 model decodes through ``hf_lean.LeanDecoder`` (fused projections); False: the model's own
            forward through ``F.linear``, the baseline ``benchmarks/bench_decode.py --ab`` compares with.
        lean: with ``pack``, decode through ``hf_lean`` where the model is supported (False: the model's forward
            through packed linear layers; a benchmark arm).
        packs: the packed weights to reuse across calls (``hf_packed.packed_linears``' store), valid only while the
            model's weights do not change (``HFEngine`` keeps one per rollout phase); None: packed for this call.
    Returns:
        Per row, in input order: (new token ids, ending in ``stop_id`` or exactly ``limits[i]`` long; the row's KV
        over its context and every new token but the last when it stopped on ``stop_id`` and ``keep``, else None).
    Raises:
        ValueError: a row without new tokens.
    """
    if any(not new for _, new in rows):
        raise ValueError("every row needs at least one new context token")
    context = [(p.ids[: p.n_tokens] if p is not None else []) + list(new) for p, new in rows]
    index, unique = {}, []
    for i, (past, new) in enumerate(rows):
        key = ("past", i) if past is not None else ("prompt", tuple(new))
        if key not in index:
            index[key] = len(unique)
            unique.append((past, list(new)))
    which = [index[("past", i) if p is not None else ("prompt", tuple(new))] for i, (p, new) in enumerate(rows)]
    with grouped_query_decoding(model) as switched, packed_linears(model, packs) if pack else \
            contextlib.nullcontext():
        unique = _share_prompt_prefix(model, unique, pad_id)
        logits, kv = _prefill_chunked(model, unique, pad_id)
        device = logits.device
        # the decode cache holds each row's tokens after the rows' common prefix; the prefix's KV is kept once
        s = _common_prefix(context) if switched and device.type == "cpu" else 0
        prefix = [(k[:, :s].contiguous(), v[:, :s].contiguous()) for k, v in kv[which[0]]] if s else None
        width = max(len(c) for c in context) - s
        cache = _left_padded([[(k[:, s:], v[:, s:]) for k, v in kv[u]] for u in which], width, width + max(limits))
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
        for i, c in enumerate(context):
            mask[i, width - len(c) + s:] = 1
        lean = LeanDecoder.for_model(model, packs) if pack and lean and switched else None
        with shared_prefix_kv(prefix) if prefix else contextlib.nullcontext():
            return _decode(model, cache, mask, logits[torch.tensor(which, device=device)], context, limits, stop_id,
                           temperature, top_p, keep, streams, prefix, logprobs, lean)


MIN_DECODE_PREFIX = 64   # tokens; a shorter common prefix is decoded as part of each row


def _common_prefix(context: list[list[int]]) -> int:
    """How many leading tokens every row's context shares (each row keeps at least one of its own), or 0 when
    there is one row or the shared part is shorter than ``MIN_DECODE_PREFIX``."""
    if len(context) < 2:
        return 0
    n = min(len(c) for c in context) - 1
    first = context[0]
    s = next((i for i in range(n) if any(c[i] != first[i] for c in context)), n)
    return s if s >= MIN_DECODE_PREFIX else 0


def _decode(model, cache, mask, logits, context, limits, stop_id, temperature, top_p, keep, streams, prefix, lps,
            lean=None):
    """The sampling loop; ``cache``/``mask`` cover each row's context after its first s tokens, whose KV is
    ``prefix`` (per layer [H_kv, s, D], shared by every row; None: s = 0), so positions are offset by s. ``lean``:
    the ``hf_lean.LeanDecoder`` that runs each step instead of the model's forward (None: the forward)."""
    s = prefix[0][0].shape[-2] if prefix else 0
    device = mask.device
    n_rows = len(context)
    rows: list[int | None] = list(range(n_rows))   # input index of each batch row; None once it has finished
    new: list[list[int]] = [[] for _ in range(n_rows)]
    kept: list[PastKV | None] = [None] * n_rows
    if lps is not None:
        lps[:] = [[] for _ in range(n_rows)]
    while True:
        u = draw_uniforms(streams, rows, [len(c) + len(g) for c, g in zip(context, new)])
        nxt, lp = sample_next(logits, temperature, top_p, u, with_logprobs=True) if lps is not None else \
            (sample_next(logits, temperature, top_p, u), None)
        lp = lp.tolist() if lp is not None else None
        for j, tok in enumerate(nxt.tolist()):
            i = rows[j]
            if i is None:
                continue
            new[i].append(tok)
            if lp is not None:
                lps[i].append(lp[j])
            if tok == stop_id or len(new[i]) >= limits[i]:
                if keep and tok == stop_id:   # the cache holds the context and every new token but this one
                    own = _gather(cache, j, mask[j].nonzero().squeeze(-1))
                    if prefix:
                        own = [(torch.cat([pk, k], -2), torch.cat([pv, v], -2)) for (pk, pv), (k, v) in zip(prefix, own)]
                    kept[i] = PastKV(context[i] + new[i][:-1], own)
                rows[j] = None
        live = [j for j, i in enumerate(rows) if i is not None]
        if not live:
            return list(zip(new, kept))
        # finished rows leave together once they are an eighth of the batch (each removal copies the cache)
        if (len(rows) - len(live)) * 8 >= len(rows):
            idx = torch.tensor(live, device=device)
            cache.batch_select_indices(idx)
            mask, nxt = mask[idx], nxt[idx]
            rows = [rows[j] for j in live]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        if lean is not None:
            logits = lean.step(nxt, mask.sum(-1) - 1 + s, cache, mask, prefix)
            continue
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1 + s,
                    past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :]
