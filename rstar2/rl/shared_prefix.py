"""Training forwards with the batch's shared prompt prefix run once.

Every row of an SFT or RL batch starts with the same tokens: the system prompt with the tool schema (378 of the
~530 tokens of a bundled SFT example, 378 of the ~400 prompt tokens of an RL trajectory). TRL's losses forward every
row whole, so that prefix is computed once per row (and, on a CPU, TRL's fused LM head scores every position). With
``install(model)``, a fused forward (``model(..., labels=..., fused_lm_head=True)``, what TRL's SFT and GRPO losses
call) whose rows share at least ``MIN_PREFIX`` leading tokens with no loss on them instead:

1. forwards the shared prefix once, with gradients, and expands its keys and values to every row;
2. forwards each row's remainder (its real tokens after the prefix) on top of it through TRL's fused head;
3. scatters the per-token outputs back to the positions the caller expects ([B, T - 1], zeros where ignored).

The arithmetic is that of the whole-row forward (the expanded keys and values receive the sum of every row's
gradient), so log-probabilities, entropies and gradients agree to rounding (``tests/test_shared_prefix.py``).
Anything else (no labels, a pre-shifted label layout, a cache, one row, a short or labelled prefix) goes to the
unchanged forward. Install only on a model that is not wrapped for data parallelism: DDP, FSDP and ZeRO-3 hook
their collectives into the wrapper's forward, which calling the backbone directly would bypass.
"""

from __future__ import annotations

import types

import torch

MIN_PREFIX = 16   # tokens; a shorter common prefix is not worth a second forward call
_FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest prefix all ``rows`` share, leaving every row at least one token of its own."""
    n = max(min(len(r) for r in rows) - 1, 0)
    first = rows[0]
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return n


def _plan(input_ids, attention_mask, labels):
    """(prefix length s, each row's real-token columns) when the shared path applies, else None. The prefix ends one
    token before the rows diverge or before the first token with a loss, whichever comes first: the prediction made
    at its last token is a row's own, and no prefix position predicts a labelled token."""
    B, T = input_ids.shape
    if B < 2 or attention_mask is None:
        return None
    cols = [attention_mask[b].nonzero().squeeze(-1) for b in range(B)]
    seqs = [input_ids[b, c].tolist() for b, c in zip(range(B), cols)]
    s = common_prefix(seqs) - 1
    # no loss on what the prefix predicts: it ends before the first labelled token. A GRPO group's rollouts share
    # the whole prompt and often their opening words, so the common prefix alone would reach into the completions
    for b, c in enumerate(cols):
        labelled = (labels[b, c[1:s + 1]] != -100).nonzero()
        if len(labelled):
            s = int(labelled[0])   # prefix positions 0..s-1 predict columns c[1..s], none of them labelled
    if s < MIN_PREFIX:
        return None
    return s, cols


def _shared_forward(self, original, input_ids, attention_mask, labels, plan, num_items_in_batch, kwargs):
    s, cols = plan
    B, T = input_ids.shape
    device = input_ids.device
    backbone = getattr(self, self.base_model_prefix)
    prefix = backbone(input_ids=input_ids[:1, cols[0][:s]], use_cache=True).past_key_values
    for layer in prefix.layers:   # every row attends to the one prefix; backward sums their gradients into it
        layer.keys, layer.values = layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1)
    rest = [c[s:] for c in cols]
    R = max(len(r) for r in rest)
    rem = input_ids.new_zeros(B, R)
    rem_mask = attention_mask.new_zeros(B, R)
    shift = torch.full((B, R), -100, dtype=labels.dtype, device=device)
    for b, r in enumerate(rest):
        off = R - len(r)
        rem[b, off:] = input_ids[b, r]
        rem_mask[b, off:] = 1
        nxt = r + 1                        # the column each remainder token predicts
        inside = nxt < T
        shift[b, off:][inside] = labels[b, nxt[inside]]
    full_mask = torch.cat([rem_mask.new_ones(B, s), rem_mask], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, s:]
    out = original(input_ids=rem, attention_mask=full_mask, position_ids=positions, past_key_values=prefix,
                   shift_labels=shift, fused_lm_head=True, num_items_in_batch=num_items_in_batch, **kwargs)
    # back to the caller's layout: position c (of T - 1) predicts column c + 1
    label_mask = torch.zeros(B, T - 1, dtype=torch.bool, device=device)
    for b, r in enumerate(rest):
        keep = r < T - 1
        label_mask[b, r[keep]] = out.label_mask[b, R - len(r):][keep]
    for name in _FIELDS:
        value = getattr(out, name, None)
        if value is None:
            continue
        full = value.new_zeros(B, T - 1)
        idx_b = torch.cat([torch.full_like(r[r < T - 1], b) for b, r in enumerate(rest)])
        idx_c = torch.cat([r[r < T - 1] for r in rest])
        src = torch.cat([value[b, R - len(r):][r < T - 1] for b, r in enumerate(rest)])
        setattr(out, name, full.index_put((idx_b, idx_c), src))
    out.label_mask = label_mask
    return out


def score_only_labelled_positions() -> None:
    """Make TRL's fused LM head (trl 1.16 ``trainer/utils.py`` ``add_fused_lm_head``) project only the positions that
    carry a label on the CPU too, as it does where Triton runs (``compact``). Off Triton it scores every position
    (to keep tile shapes fixed for compiled backends, e.g. Neuron); on a CPU in eager mode that only adds work: in an
    RL update of the default run (8 rows, 2-core Zen 3, float32) the head's vocabulary-wide passes over all 1,616
    positions took 3.9 of 18.9 s, for about 1,100 labelled (completion) positions; in SFT only the assistant tokens
    carry labels. The values are the same (TRL's own compact path). Idempotent; it changes that one decision only
    (the kernels choose Triton through their own module's function)."""
    from trl.trainer import utils

    uses_triton = utils._use_triton
    if getattr(uses_triton, "_rstar2_compact", False):
        return

    def compact(device) -> bool:
        return device.type == "cpu" or uses_triton(device)
    compact._rstar2_compact = True
    utils._use_triton = compact


def install(model) -> None:
    """Route ``model``'s fused training forwards through the shared-prefix path (call after TRL's
    ``add_fused_lm_head``; idempotent), scoring labelled positions only (``score_only_labelled_positions``).
    ``model.shared_prefix_calls`` counts the forwards that took it.

    Raises:
        ValueError: the model has no TRL fused forward.
    """
    score_only_labelled_positions()
    original = model.forward
    if getattr(original, "_rstar2_shared_prefix", False):
        return
    func = getattr(original, "__func__", None)
    if func is None or "fused_lm_head" not in func.__code__.co_varnames:
        raise ValueError("install() needs TRL's fused LM head on the model (trl.trainer.utils.add_fused_lm_head)")

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        input_ids, mask = kw.get("input_ids"), kw.get("attention_mask")
        plan = None
        if fused_lm_head and not args and labels is not None and shift_labels is None and input_ids is not None \
                and kw.get("past_key_values") is None and kw.get("position_ids") is None and \
                set(kw) <= {"input_ids", "attention_mask", "use_cache"}:
            plan = _plan(input_ids, mask, labels)
        if plan is None:
            return original(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                            num_items_in_batch=num_items_in_batch, **kw)
        extra = {k: v for k, v in kw.items() if k not in ("input_ids", "attention_mask", "use_cache")}
        self.shared_prefix_calls = getattr(self, "shared_prefix_calls", 0) + 1
        return _shared_forward(self, original, input_ids, mask, labels, plan, num_items_in_batch, extra)

    forward._rstar2_shared_prefix = True
    model.forward = types.MethodType(forward, model)
