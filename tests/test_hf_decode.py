"""hf_decode: the shrinking-batch sampler gives generate()'s tokens and honours each row's own limit."""

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rstar2.models import tiny_qwen3
from rstar2.rollout.hf_decode import (GQA_DECODE, PreallocatedLayer, decode_shrinking, gqa_decode_attention,
                                      sample_next)


def _model():
    model, tok = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=3)
    return model.double().eval(), tok   # float64: batch composition cannot flip a greedy argmax


def _generate_alone(model, prompt, n, stop):
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=stop, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_rows_equal_generate_on_each_prompt_alone():
    model, tok = _model()
    prompts = [tok.encode(t) for t in ("What is 6 times 7?", "Hi", "Compute the sum of the first ten primes.")]
    limits = [12, 5, 30]
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    got = decode_shrinking(model, prompts, limits, stop, pad_id=0, temperature=0, top_p=1.0)
    want = [_generate_alone(model, p, n, stop) for p, n in zip(prompts, limits)]
    assert got == want


def test_a_row_leaves_the_batch_at_its_stop_token():
    """Row 1 is forced to stop at once (its logits favour the stop token); the others go on to their limits."""
    model, tok = _model()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    batch_sizes = []
    forward = model.forward

    def spy(*a, **kw):
        out = forward(*a, **kw)
        ids = kw["input_ids"]
        batch_sizes.append(len(ids))
        forced_stop = out.logits[1, -1].clone().fill_(-1e9)
        forced_stop[stop] = 0.0
        out.logits[..., stop] = -1e9       # nobody stops on their own
        if len(batch_sizes) == 1:          # prefill: row 1 samples the stop token
            out.logits[1, -1] = forced_stop
        return out
    model.forward = spy
    got = decode_shrinking(model, [tok.encode("a b c"), tok.encode("d"), tok.encode("e f")], [4, 4, 4], stop, 0, 0, 1.0)
    assert got[1] == [stop]
    assert len(got[0]) == len(got[2]) == 4
    assert batch_sizes == [3, 2, 2, 2]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    torch.manual_seed(0)
    seen = {int(sample_next(logits, 1.0, 0.8)) for _ in range(300)}
    assert seen == {0, 1}                # 0.5 < 0.8 <= 0.5 + 0.3
    seen = {int(sample_next(logits, 1.0, 0.81)) for _ in range(300)}
    assert seen == {0, 1, 2}
    assert {int(sample_next(logits, 1.0, 0.1)) for _ in range(50)} == {0}
    assert int(sample_next(logits, 0.0, 1.0)) == 0


def test_top_p_on_a_flat_distribution_falls_back_to_the_whole_vocabulary():
    """Top 256 of 1000 equally likely tokens hold 25.6% < top_p: the nucleus is 900 tokens, found by a full sort."""
    torch.manual_seed(0)
    seen = {int(t) for _ in range(40) for t in sample_next(torch.zeros(64, 1000), 1.0, 0.9)}
    assert len(seen) > 800 and max(seen) >= 256


def test_decoding_uses_grouped_query_attention_and_restores_sdpa():
    model, tok = _model()
    assert model.config._attn_implementation == "sdpa" and model.model.layers[0].self_attn.num_key_value_groups == 2
    seen = []
    forward = model.forward
    model.forward = lambda *a, **kw: (seen.append(model.config._attn_implementation), forward(*a, **kw))[1]
    decode_shrinking(model, [tok.encode("a b"), tok.encode("c")], [3, 3], stop_id=-1, pad_id=0, temperature=0, top_p=1.0)
    assert seen and set(seen) == {GQA_DECODE}
    assert model.config._attn_implementation == "sdpa"


def test_grouped_query_attention_equals_sdpa_with_repeated_heads():
    model, _ = _model()
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, n, 8, generator=g, dtype=torch.float64) for h, n in ((4, 1), (2, 5), (2, 5)))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    got, _ = gqa_decode_attention(attn, q, k, v, mask, scaling=0.35)
    want, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=0.35)
    torch.testing.assert_close(got, want)


def test_preallocated_layer_grows_past_its_capacity_and_drops_rows():
    layer = PreallocatedLayer(capacity=2)
    chunks = [torch.randn(3, 2, n, 4) for n in (2, 1, 3)]
    for c in chunks:
        keys, values = layer.update(c, -c)
    torch.testing.assert_close(keys, torch.cat(chunks, dim=-2))
    torch.testing.assert_close(values, -torch.cat(chunks, dim=-2))
    layer.batch_select_indices(torch.tensor([2, 0]))
    torch.testing.assert_close(layer.keys, torch.cat(chunks, dim=-2)[[2, 0]])
    assert layer.get_seq_length() == 6


def test_bf16_decoding_uses_a_bfloat16_copy_of_the_current_weights():
    from rstar2.rollout.engines import inference_copy

    model, _ = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=3)
    assert inference_copy(model, "fp32") is model
    original = model.forward  # a trainer's instance-level patch (TRL's fused forward) that calls the original

    def patched(*a, fused_lm_head=False, **kw):
        calls.append(1)
        return original(*a, **kw)
    calls = []
    model.forward = patched
    twin = inference_copy(model, "force-bf16")
    twin(input_ids=torch.tensor([[1, 2, 3]]))
    assert calls == [] and "forward" not in vars(twin), "the copy decoded through the original float32 model"
    copy = inference_copy(model, "force-bf16")
    assert copy is not model and copy.dtype == torch.bfloat16 and model.dtype == torch.float32
    w = model.model.layers[0].mlp.up_proj.weight
    torch.testing.assert_close(copy.model.layers[0].mlp.up_proj.weight, w.detach().to(torch.bfloat16))
    with torch.no_grad():
        w.add_(1.0)  # a later optimizer step does not reach the copy, and the copy does not alias the weights
    assert not torch.equal(copy.model.layers[0].mlp.up_proj.weight, w.detach().to(torch.bfloat16))


def test_grouped_query_prefill_equals_sdpa_with_repeated_heads():
    model, _ = _model()
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 5, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    pad = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None] & pad[:, None, None, :]
    for m in (mask, None):  # padded batch; and no mask at all (causal)
        got, _ = gqa_decode_attention(attn, q, k, v, m, scaling=0.35)
        want, _ = sdpa_attention_forward(attn, q, k, v, m, scaling=0.35)
        torch.testing.assert_close(got[:, 2:] if m is not None else got, want[:, 2:] if m is not None else want)
