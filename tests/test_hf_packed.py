"""hf_packed: decoding's linear layers through oneDNN-packed weights give F.linear's values (float32 rounding) and
greedy tokens, follow the weights after an optimizer step, leave training (gradients) alone and the model as it
was."""

import pytest
import torch

from rstar2.models import tiny_qwen3
from rstar2.rollout import hf_packed
from rstar2.rollout.hf_cache import decode_cached
from rstar2.rollout.hf_packed import packed_linears

if not hf_packed.available(torch.float32):
    pytest.skip("this PyTorch build has no oneDNN linear for float32 on this CPU", allow_module_level=True)


def _model():
    model, tok = tiny_qwen3(hidden_size=64, num_layers=2, num_heads=4, seed=3)
    return model.float().eval(), tok


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def test_packed_logits_and_greedy_tokens_equal_f_linear_and_the_model_is_restored():
    model, tok = _model()
    ids = torch.tensor([tok.encode("What is 6 times 7? Compute it with the tool, please.")])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with packed_linears(model) as n:
            packed = model(input_ids=ids).logits
    assert n == len(_linears(model)) == 7 * 2 + 1          # q, k, v, o, gate, up, down per layer, and the LM head
    assert all(lin in hf_packed._KEPT for lin in _linears(model))   # the packed path ran
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)
    assert not any("forward" in lin.__dict__ for lin in _linears(model))

    prompts = [tok.encode("Compute 17 * 23."), tok.encode("Reverse the word 'rollout' and print it.")]
    a = decode_cached(model, [(None, p) for p in prompts], [24, 24], -1, 0, 0.0, 1.0, keep=False, pack=True)
    b = decode_cached(model, [(None, p) for p in prompts], [24, 24], -1, 0, 0.0, 1.0, keep=False, pack=False)
    assert [g for g, _ in a] == [g for g, _ in b]


def test_an_optimizer_step_is_seen_and_gradients_take_the_modules_own_forward():
    model, _ = _model()
    ids = torch.tensor([[5, 17, 300, 42, 9, 7]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with packed_linears(model):
        with torch.no_grad():
            before = model(input_ids=ids).logits
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()   # gradients on: F.linear, autograd
        loss.backward()
        assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
        opt.step()                                                       # in-place update of every weight
        with torch.no_grad():
            after = model(input_ids=ids).logits
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert (after - before).abs().max() > 1e-2                         # the step moved the outputs ...
    torch.testing.assert_close(after, want, rtol=1e-4, atol=1e-4)      # ... and the packed weights followed


def test_float64_is_left_to_f_linear():
    model, _ = _model()
    with packed_linears(model.double()) as n:
        assert n == 0
