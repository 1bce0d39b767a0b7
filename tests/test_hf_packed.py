"""hf_packed: decoding's linear layers through oneDNN-packed weights give F.linear's values (float32 rounding) and
greedy tokens, are kept only in the store their caller owns (a new store after an optimizer step decodes the new
weights), leave training (gradients) alone and the model as it was."""

import pytest
import torch

from rstar2.models import tiny_qwen3
from rstar2.rollout import hf_packed
from rstar2.rollout.hf_cache import decode_cached
from rstar2.rollout.hf_packed import packed_linears

needs_onednn = pytest.mark.skipif(not hf_packed.available(torch.float32),
                                  reason="this PyTorch build has no oneDNN linear for float32 on this CPU")


def _model():
    model, tok = tiny_qwen3(hidden_size=64, num_layers=2, num_heads=4, seed=3)
    return model.float().eval(), tok


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@needs_onednn
def test_packed_logits_and_greedy_tokens_equal_f_linear_and_the_model_is_restored():
    model, tok = _model()
    ids = torch.tensor([tok.encode("What is 6 times 7? Compute it with the tool, please.")])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        store = {}
        with packed_linears(model, store) as n:
            packed = model(input_ids=ids).logits
    assert n == len(_linears(model)) == 7 * 2 + 1          # q, k, v, o, gate, up, down per layer, and the LM head
    assert set(store) == set(_linears(model))              # the packed path ran
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)
    assert not any("forward" in lin.__dict__ for lin in _linears(model))

    prompts = [tok.encode("Compute 17 * 23."), tok.encode("Reverse the word 'rollout' and print it.")]
    a = decode_cached(model, [(None, p) for p in prompts], [24, 24], -1, 0, 0.0, 1.0, keep=False, pack=True)
    b = decode_cached(model, [(None, p) for p in prompts], [24, 24], -1, 0, 0.0, 1.0, keep=False, pack=False)
    assert [g for g, _ in a] == [g for g, _ in b]


@needs_onednn
@pytest.mark.parametrize("fused", [True, False])
def test_a_store_decodes_the_weights_it_packed_and_a_new_one_the_updated_ones(fused):
    """transformers' default optimizer (fused AdamW) updates weights in place without bumping their version
    counter, so no check of the weights can tell a store is stale: a store kept across the update still decodes the
    old weights (why HFEngine keeps one per rollout phase), a new store the new ones. Gradients take F.linear."""
    model, _ = _model()
    ids = torch.tensor([[5, 17, 300, 42, 9, 7]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    store = {}
    with packed_linears(model, store):
        with torch.no_grad():
            before = model(input_ids=ids).logits
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()   # gradients on: F.linear, autograd
        loss.backward()
        assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
        opt.step()                                                       # in-place update of every weight
        with torch.no_grad():
            stale = model(input_ids=ids).logits
    with torch.no_grad(), packed_linears(model, {}):
        after = model(input_ids=ids).logits
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert (want - before).abs().max() > 1e-2                          # the step moved the outputs ...
    torch.testing.assert_close(after, want, rtol=1e-4, atol=1e-4)      # ... a new store follows them
    assert (stale - want).abs().max() > 1e-2                           # ... the kept one does not (its linears
                                                                       # are the old ones; norms are not packed)


def test_float64_is_left_to_f_linear():
    model, _ = _model()
    with packed_linears(model.double()) as n:
        assert n == 0
