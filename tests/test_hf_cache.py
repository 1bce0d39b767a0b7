"""hf_cache: keeping a trajectory's KV cache across turns and prefilling equal prompts once gives the tokens of a
full re-prefill (greedy, float64: batch composition cannot flip an argmax)."""

import pytest
import torch

from rstar2.models import tiny_qwen3
from rstar2.rollout.hf_cache import PastKV, decode_cached
from rstar2.rollout.hf_decode import decode_shrinking


def _model():
    model, tok = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=5)
    return model.double().eval(), tok


def _stop_after(model, stop: int, every: int):
    """Make ``stop`` the argmax at every ``every``-th decoding position of a row, so turns end on the stop token
    (a random model almost never samples it): keeps the logits of all other tokens as they are."""
    forward = model.forward

    def patched(*a, **kw):
        out = forward(*a, **kw)
        pos = kw["position_ids"][:, -1]
        hit = (pos % every) == every - 1
        out.logits[hit, -1, stop] = out.logits[hit, -1].max(dim=-1).values + 50.0
        return out
    model.forward = patched
    return model


def test_cached_turns_give_the_tokens_of_a_full_reprefill():
    model, tok = _model()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    _stop_after(model, stop, 7)
    prompts = [tok.encode("What is 6 times 7?")] * 3 + [tok.encode("Compute the sum of the first ten primes, please.")]
    limits = [20, 20, 20, 20]
    turn1 = decode_cached(model, [(None, p) for p in prompts], limits, stop, 0, 0.0, 1.0)
    assert [g for g, _ in turn1] == decode_shrinking(model, prompts, limits, stop, 0, 0.0, 1.0)
    assert all(g[-1] == stop and kv is not None for g, kv in turn1)

    # turn 2: the tool response is appended; a cached row feeds only [last sampled token] + tool tokens
    tool = [tok.encode("<tool_response>\n42\n</tool_response>"), tok.encode("<tool_response>\nerror\n</tool_response>"),
            tok.encode("ok"), tok.encode("<tool_response>\n129\n</tool_response>")]
    contexts = [p + g + t for p, (g, _), t in zip(prompts, turn1, tool)]
    rows = []
    for (g, kv), ctx in zip(turn1, contexts):
        assert kv.n_tokens == len(ctx) - len(tool[len(rows)]) - 1 and ctx[: kv.n_tokens] == kv.ids
        rows.append((kv, ctx[kv.n_tokens:]))
    rows[2] = (None, contexts[2])   # one row without a cache in the same batch
    turn2 = decode_cached(model, rows, limits, stop, 0, 0.0, 1.0)
    assert [g for g, _ in turn2] == decode_shrinking(model, contexts, limits, stop, 0, 0.0, 1.0)
    # and the keys/values handed back equal those of one plain forward pass over the same tokens
    _, kv = turn2[0]
    plain = model(input_ids=torch.tensor([kv.ids]), position_ids=torch.arange(len(kv.ids))[None], use_cache=True)
    plain = plain.past_key_values
    for li, (k, v) in enumerate(kv.layers):
        torch.testing.assert_close(k, plain.layers[li].keys[0])
        torch.testing.assert_close(v, plain.layers[li].values[0])


def test_equal_prompts_are_prefilled_once():
    model, tok = _model()
    sizes = []
    forward = model.forward
    model.forward = lambda *a, **kw: (sizes.append(tuple(kw["input_ids"].shape)), forward(*a, **kw))[1]
    p, q = tok.encode("a b c d"), tok.encode("e f")
    decode_cached(model, [(None, p)] * 4 + [(None, q)] * 4, [3] * 8, -1, 0, 0.0, 1.0)
    first_decode = sizes.index((8, 1))                      # then 8 rows decode
    # the 2 unique prompts prefilled (in chunks of similar length: 4 and 2 tokens are not padded to one width)
    assert sorted(sizes[:first_decode]) == [(1, len(q)), (1, len(p))]


def test_sampled_rows_of_one_prompt_differ_and_limits_hold():
    model, tok = _model()
    torch.manual_seed(0)
    out = decode_cached(model, [(None, tok.encode("hello there"))] * 6, [2, 4, 6, 8, 10, 12], -1, 0, 1.0, 1.0)
    assert [len(g) for g, _ in out] == [2, 4, 6, 8, 10, 12]
    assert len({tuple(g[:2]) for g, _ in out}) > 1        # each copy of the prompt samples on its own
    assert all(kv is None for _, kv in out)               # cut by the limit: the trajectory ends, nothing kept


def test_a_row_needs_a_new_token():
    model, tok = _model()
    with pytest.raises(ValueError, match="at least one new"):
        decode_cached(model, [(PastKV([1], []), [])], [2], -1, 0, 0.0, 1.0)


def test_per_row_streams_sample_the_same_tokens_cached_or_reprefilled_and_in_any_batch():
    """With counter-based per-row random numbers a row's sampled tokens depend on its own stream only: the same
    with the cache as with a full re-prefill, alone or beside other rows, in any order."""
    model, tok = _model()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    _stop_after(model, stop, 5)
    prompts = [tok.encode("What is 6 times 7?")] * 3 + [tok.encode("Add 2 and 3.")]
    names = ["g0-0", "g0-1", "g0-2", "g1-0"]
    limits = [12] * 4
    cached = decode_cached(model, [(None, p) for p in prompts], limits, stop, 0, 1.0, 1.0, streams=(7, names))
    full = decode_shrinking(model, prompts, limits, stop, 0, 1.0, 1.0, streams=(7, names))
    assert [g for g, _ in cached] == full
    assert len({tuple(g) for g in full[:3]}) > 1            # one prompt, three streams: different samples
    alone = decode_shrinking(model, prompts[3:], limits[3:], stop, 0, 1.0, 1.0, streams=(7, names[3:]))
    reordered = decode_shrinking(model, prompts[::-1], limits, stop, 0, 1.0, 1.0, streams=(7, names[::-1]))
    assert alone == full[3:] and reordered == full[::-1]
    other_seed = decode_shrinking(model, prompts, limits, stop, 0, 1.0, 1.0, streams=(8, names))
    assert other_seed != full


def test_hf_engine_reuses_a_trajectorys_cache_across_turns_with_the_same_tokens():
    """Two turns of four trajectories through HFEngine: with kv_reuse the second turn prefills only the new tokens,
    and every sampled token equals the re-prefilling engine's (same seed and keys); release drops the cache."""
    import asyncio

    from rstar2.rollout.engines import HFEngine

    model, tok = _model()
    tok.eos_token = "<|im_end|>"
    stop = tok.eos_token_id
    _stop_after(model, stop, 6)
    prompt = tok.encode("Solve 12 * 13 with the tool.")
    tool = tok.encode("<tool_response>\n156\n</tool_response>")

    def two_turns(engine):
        async def one(key):
            first = await engine.generate(key, prompt, 20)
            second = await engine.generate(key, prompt + first.token_ids + tool, 20)
            return first.token_ids, second.token_ids

        async def main():
            try:
                return await asyncio.gather(*(one(f"p#{i}") for i in range(4)))
            finally:
                await engine.aclose()
        return asyncio.run(main())

    cached = HFEngine(model, tok, temperature=1.0, seed=11, kv_reuse=True)
    plain = HFEngine(model, tok, temperature=1.0, seed=11, kv_reuse=False)
    got, want = two_turns(cached), two_turns(plain)
    assert got == want
    assert all(first[-1] == stop for first, _ in got)
    assert len({tuple(f) for f, _ in got}) > 1                   # four samples of one prompt differ
    # the prompt once (4 equal contexts), then per trajectory its last sampled token and the tool response
    assert cached.prefilled_tokens == len(prompt) + 4 * (1 + len(tool))
    assert plain.prefilled_tokens == 4 * len(prompt) + sum(len(prompt) + len(f) + len(tool) for f, _ in got)
    assert cached.cached_bytes() > 0
    for i in range(4):
        cached.release(f"p#{i}")
    assert cached.cached_bytes() == 0


def test_distinct_prompts_forward_their_common_prefix_once():
    """Distinct problems under one system prompt: its KV comes from one forward of the shared prefix, and the
    greedy tokens equal a whole-prompt prefill's."""
    model, tok = _model()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    _stop_after(model, stop, 9)
    system = tok.encode("You are a helpful assistant. Use the Python tool to compute exact answers, then answer.")
    prompts = [system + tok.encode(q) for q in ("What is 6 times 7?", "Add 12 and 30.", "Compute 2 ** 10.")]
    limits = [15, 15, 15]
    sizes = []
    forward = model.forward
    model.forward = lambda *a, **kw: (sizes.append(tuple(kw["input_ids"].shape)), forward(*a, **kw))[1]
    out = decode_cached(model, [(None, p) for p in prompts], limits, stop, 0, 0.0, 1.0)
    assert sizes[0] == (1, len(system)) and sizes[1][0] == 3 and sizes[1][1] < max(map(len, prompts)) - 10
    model.forward = forward
    assert [g for g, _ in out] == decode_shrinking(model, prompts, limits, stop, 0, 0.0, 1.0)
    # the KV handed back covers the whole context, as without the shared prefix
    g, kv = out[1]
    assert kv.ids == prompts[1] + g[:-1] and kv.n_tokens == len(kv.ids)


def test_rows_decode_against_one_copy_of_their_common_prefix_with_the_tokens_of_a_full_reprefill(monkeypatch):
    """A common context prefix of >= MIN_DECODE_PREFIX tokens is held once for the decode loop (its KV read once
    per step for all rows): greedy tokens over two turns equal a whole-context re-prefill's, and the KV handed
    back for the next turn still covers the whole context."""
    from rstar2.rollout import hf_cache

    model, tok = _model()
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    _stop_after(model, stop, 9)
    system = tok.encode("You are a helpful assistant who writes Python to compute exact answers. " * 6)
    assert len(system) >= hf_cache.MIN_DECODE_PREFIX
    prompts = [system + tok.encode(q) for q in ("What is 6 times 7?", "Add 12 and 30.", "Compute 2 ** 10.")]
    used = []
    real = hf_cache.shared_prefix_kv
    monkeypatch.setattr(hf_cache, "shared_prefix_kv", lambda layers: (used.append(layers[0][0].shape[-2]),
                                                                      real(layers))[1])
    turn1 = decode_cached(model, [(None, p) for p in prompts], [12] * 3, stop, 0, 0.0, 1.0)
    assert [g for g, _ in turn1] == decode_shrinking(model, prompts, [12] * 3, stop, 0, 0.0, 1.0)
    assert used and used[0] >= len(system)
    tool = tok.encode("<tool_response>\n42\n</tool_response>")
    contexts = [p + g + tool for p, (g, _) in zip(prompts, turn1)]
    rows = [(kv, ctx[kv.n_tokens:]) if kv is not None else (None, ctx) for (_, kv), ctx in zip(turn1, contexts)]
    turn2 = decode_cached(model, rows, [12] * 3, stop, 0, 0.0, 1.0)
    assert [g for g, _ in turn2] == decode_shrinking(model, contexts, [12] * 3, stop, 0, 0.0, 1.0)
    assert len(used) == 2
    g, kv = next((g, kv) for g, kv in turn2 if kv is not None)
    plain = model(input_ids=torch.tensor([kv.ids]), position_ids=torch.arange(len(kv.ids))[None], use_cache=True)
    for li, (k, v) in enumerate(kv.layers):
        torch.testing.assert_close(k, plain.past_key_values.layers[li].keys[0])
        torch.testing.assert_close(v, plain.past_key_values.layers[li].values[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_prefix_attention_equals_attention_over_the_concatenated_keys(dtype):
    """The two-pass attention (shared prefix + each row's masked keys, merged by log-sum-exp) is the softmax
    attention over prefix + row keys, to the dtype's rounding."""
    import torch.nn.functional as F

    from rstar2.rollout.hf_decode import _prefix_decode_attention

    g = torch.Generator().manual_seed(0)
    B, h_kv, n_rep, D, P, L = 5, 2, 3, 16, 40, 11
    q = torch.randn(B, h_kv * n_rep, 1, D, generator=g).to(dtype)
    pk, pv = (torch.randn(h_kv, P, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, h_kv, L, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    mask[1, ..., :4] = False   # left padding of a shorter row
    out, _ = _prefix_decode_attention(q, k, v, mask, 0.25, (pk, pv))
    full_k = torch.cat([pk.expand(B, -1, -1, -1), k], -2).repeat_interleave(n_rep, 1)
    full_v = torch.cat([pv.expand(B, -1, -1, -1), v], -2).repeat_interleave(n_rep, 1)
    full_mask = torch.cat([torch.ones(B, 1, 1, P, dtype=torch.bool), mask], -1)
    want = F.scaled_dot_product_attention(q.double(), full_k.double(), full_v.double(), attn_mask=full_mask,
                                          scale=0.25).transpose(1, 2)
    tol = 1e-12 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


def test_prefill_in_chunks_of_similar_length_equals_one_padded_prefill():
    """Rows whose new parts differ in length (a tool error against a number) are prefilled in chunks of similar
    length, padding at most PAD_WASTE more tokens than they hold; logits and each row's KV equal one padded prefill."""
    from rstar2.rollout import hf_cache

    model, tok = _model()
    g = torch.Generator().manual_seed(3)
    past = hf_cache._prefill(model, [(None, torch.randint(5, 400, (9,), generator=g).tolist())], 0)[1][0]
    lengths = [3, 40, 4, 38, 3, 12]
    rows = [(PastKV(list(range(9)), past) if i % 2 else None, torch.randint(5, 400, (n,), generator=g).tolist())
            for i, n in enumerate(lengths)]
    widths = []
    forward = model.forward
    model.forward = lambda *a, **kw: (widths.append(tuple(kw["input_ids"].shape)), forward(*a, **kw))[1]
    logits, kv = hf_cache._prefill_chunked(model, rows, 0)
    # sorted 3, 3, 4, 12, 38, 40: a third row would pad [3, 3, 4] to 12 tokens for 10 (over 1.125x)
    assert sorted(widths) == [(1, 4), (1, 12), (2, 3), (2, 40)]
    model.forward = forward
    ref_logits, ref_kv = hf_cache._prefill(model, rows, 0)
    torch.testing.assert_close(logits, ref_logits)
    for got, ref in zip(kv, ref_kv):
        for (k, v), (rk, rv) in zip(got, ref):
            torch.testing.assert_close(k, rk)
            torch.testing.assert_close(v, rv)
