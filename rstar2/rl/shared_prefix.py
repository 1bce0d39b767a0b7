"""The update's log-probabilities with the batch's shared prompt prefix forwarded once (issue 19).

Every trajectory of an RL batch starts with the same tokens: the system prompt with the tool schema (about 300 of
the ~400 prompt tokens on the bundled task). TRL's GRPO loss forwards every row whole, so that prefix is run once per
row, and its LM head is applied at every position on a CPU (TRL's fused head scores all positions off Triton). Here
the longest prefix common to all rows is forwarded once with gradients, its keys and values are expanded to every
row, and only each row's remainder (the rest of its prompt and its completion) is forwarded on top of it through
TRL's fused LM head. The arithmetic is the same as the whole-row forward (the expanded keys and values receive the
sum of every row's gradient), so log-probabilities and gradients agree to rounding (``tests/test_shared_prefix.py``).

Only for a model that is not wrapped for data parallelism: DDP, FSDP and ZeRO-3 hook their collectives into the
wrapper's forward, which calling the backbone directly would bypass (the trainer uses this path on one process).
"""

from __future__ import annotations

import torch

MIN_PREFIX = 16   # tokens; a shorter common prefix is not worth a second forward call


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest prefix all ``rows`` share, leaving every row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for i in range(max(n, 0)):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return max(n, 0)


def shared_prefix_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        compute_entropy: bool, pad_id: int):
    """Per-token log-probabilities (and entropies) of the last ``logits_to_keep`` positions, as TRL's
    ``_get_per_token_logps_and_entropies`` returns them, computed with the common prompt prefix forwarded once.

    Args:
        model: a causal LM patched with TRL's ``add_fused_lm_head`` (``fused_lm_head=True`` forwards).
        input_ids, attention_mask: [B, T] (prompt left-padded, then ``logits_to_keep`` completion positions).
        logits_to_keep: K, the completion length.
        compute_entropy: also return entropies. pad_id: the id written into padding.
    Returns:
        ``(logps [B, K], entropies [B, K] or None)``, or None when the rows share fewer than ``MIN_PREFIX`` prompt
        tokens (the caller then forwards whole rows).
    """
    B, T = input_ids.shape
    K = logits_to_keep
    prompts = [input_ids[b, : T - K][attention_mask[b, : T - K].bool()].tolist() for b in range(B)]
    s = common_prefix(prompts)
    if s < MIN_PREFIX:
        return None
    device = input_ids.device
    backbone = getattr(model, model.base_model_prefix)
    prefix = backbone(input_ids=input_ids.new_tensor([prompts[0][:s]]), use_cache=True).past_key_values
    for layer in prefix.layers:   # every row attends to the one prefix; backward sums the rows' gradients into it
        layer.keys, layer.values = layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1)
    R = max(len(p) - s for p in prompts)
    rem = torch.full((B, R + K), pad_id, dtype=input_ids.dtype, device=device)
    rem_mask = torch.zeros((B, R + K), dtype=attention_mask.dtype, device=device)
    for b, p in enumerate(prompts):
        rest = p[s:]
        rem[b, R - len(rest):R] = torch.tensor(rest, dtype=input_ids.dtype, device=device)
        rem_mask[b, R - len(rest):R] = 1
    rem[:, R:] = input_ids[:, T - K:]
    rem_mask[:, R:] = attention_mask[:, T - K:]
    full_mask = torch.cat([rem_mask.new_ones(B, s), rem_mask], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, s:]
    # position R - 1 + i predicts completion token i (the last prompt token predicts the first)
    labels = torch.full_like(rem, -100)
    comp = input_ids[:, T - K:].masked_fill(attention_mask[:, T - K:] == 0, -100)
    labels[:, R - 1:R - 1 + K] = comp
    out = model(input_ids=rem, attention_mask=full_mask, position_ids=positions, past_key_values=prefix,
                shift_labels=labels, fused_lm_head=True)
    logps = out.log_probs[:, R - 1:R - 1 + K]
    entropy = out.entropy[:, R - 1:R - 1 + K] if compute_entropy and out.entropy is not None else None
    return logps, entropy
