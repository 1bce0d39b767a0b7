"""hf_lean: the fused one-token decode step gives the tokens and log-probabilities of the transformers forward
(float32, Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms; with and without a shared context prefix), writes the
same KV cache, and leaves unsupported models to the forward."""

import pytest
import torch

from rstar2.models import tiny_qwen3
from rstar2.rollout import hf_packed
from rstar2.rollout.hf_cache import decode_cached
from rstar2.rollout.hf_lean import LeanDecoder

# Only the lean path itself needs oneDNN; the fallback tests below run on every build (test_hf_packed.py likewise).
needs_onednn = pytest.mark.skipif(not hf_packed.available(torch.float32),
                                  reason="this PyTorch build has no oneDNN linear for float32 on this CPU")


def _model(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch == "qwen3":
        return tiny_qwen3(hidden_size=64, num_layers=2, num_heads=4, seed=3)[0].float().eval()
    torch.manual_seed(3)
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=arch == "llama")
    model = LlamaForCausalLM(LlamaConfig(**kw)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    model.config._attn_implementation = "sdpa"
    return model.float().eval()


def _rows(shared: int):
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, 500, (shared,), generator=g).tolist()
    return [(None, prefix + torch.randint(3, 500, (n,), generator=g).tolist()) for n in (3, 9, 5)]


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("shared", [0, 70])   # 70: a common prefix the decode attends to once (MIN_DECODE_PREFIX)
def test_lean_steps_give_the_forwards_tokens_and_logprobs(arch, shared):
    model = _model(arch)
    assert LeanDecoder.supported(model)
    steps = []
    step = LeanDecoder.step
    LeanDecoder.step = lambda self, *a, **k: (steps.append(1), step(self, *a, **k))[1]
    try:
        runs = {}
        for lean in (True, False):   # pack=False: the model's own forward through F.linear
            lps: list = []
            out = decode_cached(model, _rows(shared), [20, 20, 20], -1, 0, 1.0, 1.0, keep=True,
                                streams=(7, ["a", "b", "c"]), logprobs=lps, pack=lean)
            runs[lean] = (out, lps, len(steps))
    finally:
        LeanDecoder.step = step
    (lean_out, lean_lps, n_lean), (plain_out, plain_lps, n_after) = runs[True], runs[False]
    assert n_lean == 19 and n_after == n_lean             # the lean path ran every step, the other run none
    assert [ids for ids, _ in lean_out] == [ids for ids, _ in plain_out]
    for a, b in zip(lean_lps, plain_lps):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("shared", [0, 70])
def test_lean_writes_the_kv_the_next_turn_reuses(shared):
    """A row that stops on its stop token hands over its KV (context and every new token but the last, written by
    the lean steps) for its next turn: the same keys and values as the forward path's."""
    model = _model("qwen3")
    first = decode_cached(model, _rows(shared), [12] * 3, -1, 0, 0.0, 1.0, keep=False, pack=False)
    stop = first[0][0][6]           # row 0's 7th greedy token: it stops there (or earlier) on both paths
    kept = {}
    for lean in (True, False):
        out = decode_cached(model, _rows(shared), [12] * 3, stop, 0, 0.0, 1.0, keep=True, pack=lean)
        kept[lean] = out[0]
    (ids, kv), (ref_ids, ref_kv) = kept[True], kept[False]
    assert ids == ref_ids and ids[-1] == stop and kv is not None and kv.ids == ref_kv.ids
    assert kv.n_tokens == len(_rows(shared)[0][1]) + len(ids) - 1
    for (k, v), (rk, rv) in zip(kv.layers, ref_kv.layers):
        torch.testing.assert_close(k, rk, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v, rv, rtol=1e-4, atol=1e-4)


def test_unsupported_models_decode_through_the_forward():
    if hf_packed.available(torch.float32):
        assert LeanDecoder.supported(_model("llama"))
    assert not LeanDecoder.supported(_model("llama").double())
    assert not LeanDecoder.supported(_model("llama").to(torch.bfloat16))
    assert LeanDecoder.for_model(_model("llama").double(), {}) is None
    store = {}
    model = _model("llama")
    if hf_packed.available(torch.float32):
        assert LeanDecoder.for_model(model, store) is LeanDecoder.for_model(model, store)   # made once per store


def test_without_onednn_the_default_decode_is_the_forwards(monkeypatch):
    """A PyTorch build (or CPU) without oneDNN's float32 linear: no lean decoder is made, and the CPU default's
    decode (pack=True, as the hf engine calls it) gives the plain forward's tokens and log-probabilities."""
    model = _model("qwen3")
    runs = {}
    for pack in (True, False):
        with monkeypatch.context() as m:
            if pack:   # what such a build reports (hf_packed.available's probe fails there)
                m.setattr(hf_packed, "_AVAILABLE", {torch.float32: False})
                assert not hf_packed.available(torch.float32) and LeanDecoder.for_model(model, {}) is None
            lps: list = []
            out = decode_cached(model, _rows(70), [10, 10, 10], -1, 0, 1.0, 1.0, keep=False,
                                streams=(7, ["a", "b", "c"]), logprobs=lps, pack=pack)
            runs[pack] = ([ids for ids, _ in out], lps)
    assert runs[True][0] == runs[False][0]
    for a, b in zip(runs[True][1], runs[False][1]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=0)
