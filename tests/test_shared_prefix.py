"""rl/shared_prefix: the update's log-probabilities, entropies and gradients with the shared prompt prefix forwarded
once equal TRL's whole-row forward (float64, a tiny random Qwen3)."""

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from rstar2.models import tiny_qwen3
from rstar2.rl.shared_prefix import MIN_PREFIX, common_prefix, shared_prefix_logps

K = 9


def _batch(prefix_len: int):
    """4 rows: a common prefix, row-specific prompt tails of different lengths (left-padded), completions of
    different lengths (right-padded)."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(5, 500, (prefix_len,), generator=g).tolist()
    tails = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (3, 7, 1, 5)]
    comps = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (9, 4, 6, 2)]
    P = max(prefix_len + len(t) for t in tails)
    ids, mask = [], []
    for t, c in zip(tails, comps):
        p = prefix + t
        ids.append([0] * (P - len(p)) + p + c + [0] * (K - len(c)))
        mask.append([0] * (P - len(p)) + [1] * len(p) + [1] * len(c) + [0] * (K - len(c)))
    return torch.tensor(ids), torch.tensor(mask)


def _trl_logps(model, ids, mask, positions=False):
    """What TRL 1.16's _get_per_token_logps_and_entropies computes for one chunk; ``positions``: with the rollout's
    position ids (counted over real tokens) instead of TRL's (counted from the first column, padding included)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-K] = -100
    extra = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if positions else {}
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, **extra)
    return out.log_probs[:, -K:], out.entropy[:, -K:]


def test_common_prefix_leaves_each_row_a_token():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5]]) == 2
    assert common_prefix([[1, 2], [1, 2, 3]]) == 1
    assert common_prefix([[7, 1], [8, 1]]) == 0


def test_logps_entropies_and_gradients_equal_the_whole_row_forward():
    model, _ = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=7)
    model = model.double()
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    ids, mask = _batch(40)
    w = torch.randn(ids.shape[0], K, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    comp_mask = mask[:, -K:].double()

    def grads(fn):
        model.zero_grad()
        logps, ent = fn()
        ((logps * w * comp_mask).sum() + 0.1 * (ent * comp_mask).sum()).backward()
        return logps.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    got_lp, got_ent, got_g = grads(lambda: shared_prefix_logps(model, ids, mask, K, True, pad_id=0))
    on = comp_mask.bool()
    assert (got_lp[~on] == 0).all()
    # Against the whole-row forward with the same positions, and with TRL's own (numbered from the first column,
    # padding included: RoPE depends on position differences only). transformers computes RMSNorm and the rotary
    # angles in float32 even in a float64 model, so agreement is to float32 precision (a wrong prefix, mask or label
    # alignment differs in the first digit).
    for positions in (True, False):
        ref_lp, ref_ent, ref_g = grads(lambda: _trl_logps(model, ids, mask, positions))
        torch.testing.assert_close(got_lp[on], ref_lp[on], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_ent[on], ref_ent[on], rtol=1e-6, atol=1e-6)
        for n in ref_g:
            torch.testing.assert_close(got_g[n], ref_g[n], rtol=1e-5, atol=2e-6, msg=n)


def test_a_short_common_prefix_falls_back_to_whole_rows():
    model, _ = tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4, seed=7)
    add_fused_lm_head(model)
    ids, mask = _batch(MIN_PREFIX - 2)
    assert shared_prefix_logps(model, ids, mask, K, False, pad_id=0) is None


@pytest.mark.parametrize("prefix_len", [MIN_PREFIX, 64])
def test_fewer_positions_are_forwarded(prefix_len):
    model, _ = tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4, seed=7)
    add_fused_lm_head(model)
    seen = []
    forward = model.forward
    model.forward = lambda *a, **kw: (seen.append(kw["input_ids"].numel()), forward(*a, **kw))[1]
    ids, mask = _batch(prefix_len)
    shared_prefix_logps(model, ids, mask, K, False, pad_id=0)
    assert seen == [ids.shape[0] * (7 + K)]   # each row's remainder only: its longest tail is 7 tokens
