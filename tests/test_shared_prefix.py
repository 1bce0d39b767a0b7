"""rl/shared_prefix: training forwards with the batch's shared prompt prefix run once give the log-probabilities,
entropies, token flags and gradients of TRL's whole-row fused forward (float64 tiny random Qwen3), for the GRPO
layout (left-padded prompts, right-padded completions) and the SFT layout (right-padded conversations)."""

import copy

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from rstar2.models import tiny_qwen3
from rstar2.rl import shared_prefix
from rstar2.rl.shared_prefix import MIN_PREFIX, common_prefix

K = 9
FIELDS = ("log_probs", "entropy", "is_top1")


def _grpo_batch(prefix_len: int):
    """4 rows: a common prefix, row-specific prompt tails (left-padded), completions (right-padded); labels as TRL's
    GRPO loss builds them (completion tokens only)."""
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
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-K] = -100
    return ids, mask, labels


def _group_batch(prefix_len: int):
    """4 rollouts of one GRPO group: the same prompt, completions that open with the same 3 tokens (as a small
    model's samples often do) and then differ; labels on the completions only."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(5, 500, (prefix_len,), generator=g).tolist()
    opening = torch.randint(5, 500, (3,), generator=g).tolist()
    comps = [opening + torch.randint(5, 500, (n,), generator=g).tolist() for n in (6, 1, 4, 2)]
    ids = torch.tensor([prompt + c + [0] * (K - len(c)) for c in comps])
    mask = torch.tensor([[1] * (prefix_len + len(c)) + [0] * (K - len(c)) for c in comps])
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :prefix_len] = -100
    return ids, mask, labels


def _sft_batch(prefix_len: int):
    """3 conversations sharing a system prefix, right-padded; loss on two spans of each (assistant turns)."""
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(5, 500, (prefix_len,), generator=g).tolist()
    bodies = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (12, 20, 7)]
    T = prefix_len + 20
    ids = torch.tensor([prefix + b + [0] * (T - prefix_len - len(b)) for b in bodies])
    mask = torch.tensor([[1] * (prefix_len + len(b)) + [0] * (T - prefix_len - len(b)) for b in bodies])
    labels = torch.full_like(ids, -100)
    for i, b in enumerate(bodies):
        labels[i, prefix_len + 2: prefix_len + 5] = ids[i, prefix_len + 2: prefix_len + 5]
        labels[i, prefix_len + len(b) - 3: prefix_len + len(b)] = ids[i, prefix_len + len(b) - 3: prefix_len + len(b)]
    return ids, mask, labels


def _models():
    model, _ = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=7)
    model = model.double()
    plain = copy.deepcopy(model)
    for m in (model, plain):
        add_fused_lm_head(m, temperature=0.8, outputs=("log_probs", "entropy", "is_top1"))
    shared_prefix.install(model)
    return model, plain


def test_common_prefix_leaves_each_row_a_token():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5]]) == 2
    assert common_prefix([[1, 2], [1, 2, 3]]) == 1
    assert common_prefix([[7, 1], [8, 1]]) == 0


@pytest.mark.parametrize("layout", ["grpo", "group", "sft"])
def test_outputs_and_gradients_equal_the_whole_row_forward(layout):
    """Also for one group's rollouts whose common prefix runs into their completions: the prefix stops at the prompt
    (the last prompt token predicts the first labelled one), not the whole-row path."""
    model, plain = _models()
    ids, mask, labels = {"grpo": _grpo_batch, "group": _group_batch, "sft": _sft_batch}[layout](40)
    w = torch.randn(ids.shape[0], ids.shape[1] - 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    seen = []
    fwd = model.model.forward
    model.model.forward = lambda *a, **kw: (seen.append(kw["input_ids"].shape), fwd(*a, **kw))[1]

    def run(m):
        m.zero_grad()
        out = m(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        ((out.log_probs * w).sum() + 0.1 * out.entropy.sum()).backward()
        return out, {n: p.grad.clone() for n, p in m.named_parameters()}

    got, got_g = run(model)
    ref, ref_g = run(plain)
    assert seen[0] == (1, 39) and seen[1][1] < ids.shape[1] - 30   # the prefix once, then the remainders only
    assert torch.equal(got.label_mask, ref.label_mask)
    # transformers computes RMSNorm and the rotary angles in float32 even in a float64 model, so agreement is to
    # float32 precision; a wrong prefix, mask or label alignment differs in the first digit
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(ref, f), rtol=1e-6, atol=1e-6, msg=f)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-6, atol=1e-6)
    for n in ref_g:
        torch.testing.assert_close(got_g[n], ref_g[n], rtol=1e-5, atol=2e-6, msg=n)


def test_short_or_labelled_prefixes_and_other_calls_take_the_whole_row_path():
    model, plain = _models()
    calls = []
    fwd = model.model.forward
    model.model.forward = lambda *a, **kw: (calls.append(kw["input_ids"].shape), fwd(*a, **kw))[1]
    short, smask, slabels = _grpo_batch(MIN_PREFIX - 2)
    model(input_ids=short, attention_mask=smask, labels=slabels, fused_lm_head=True)
    ids, mask, labels = _sft_batch(40)
    labels[:, 5] = ids[:, 5]          # a loss inside the prefix
    model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    model(input_ids=ids, attention_mask=mask)                                 # generation-style call, no labels
    assert [c[1] for c in calls] == [short.shape[1], ids.shape[1], ids.shape[1]]   # whole rows every time
    with pytest.raises(ValueError, match="fused LM head"):
        shared_prefix.install(tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4, seed=1)[0])


def test_the_fused_head_scores_only_labelled_positions_on_the_cpu_with_the_same_values(monkeypatch):
    """``score_only_labelled_positions``: TRL's fused LM head projects the labelled positions only (its compact
    path) instead of every position, with the same log-probabilities, entropies and gradients."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    monkeypatch.setattr(utils, "_use_triton", chunked_logprob._use_triton)   # TRL as shipped
    model, _ = tiny_qwen3(hidden_size=32, num_layers=2, num_heads=4, seed=7)
    model = model.double()
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy", "is_top1"))
    ids, mask, labels = _sft_batch(40)
    scored = []
    apply = utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(utils._ChunkedLogProbFunction, "apply",
                        lambda hidden, *a: (scored.append(hidden.shape[0]), apply(hidden, *a))[1])

    def run():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + 0.1 * out.entropy.sum()).backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    ref, ref_g = run()
    shared_prefix.score_only_labelled_positions()
    got, got_g = run()
    labelled = int((labels[:, 1:] != -100).sum())
    assert scored == [ids.shape[0] * (ids.shape[1] - 1), labelled] and labelled < scored[0] // 4
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(ref, f), rtol=1e-12, atol=1e-12, msg=f)
    # TRL's chunked head computes the head weight's gradient in float32 (trl/kernels/chunked_logprob.py), summed over
    # every position or over the labelled ones only, in an order MKL picks by shape: bitwise equal with MKL's AVX-512
    # kernels, 2.4e-7 apart (of gradients up to 5.9) with its AVX2 ones (MKL_ENABLE_INSTRUCTIONS=AVX2; a Zen 3's).
    # Every other gradient comes out equal.
    head = {n for n, p in model.named_parameters() if p is model.get_output_embeddings().weight}
    assert len(head) == 1, head
    for n in ref_g:
        tol = {"rtol": 1e-5, "atol": 1e-6} if n in head else {"rtol": 1e-10, "atol": 1e-12}
        assert ref_g[n].abs().max() > 1e-3, n   # against what the tolerance allows
        torch.testing.assert_close(got_g[n], ref_g[n], **tol, msg=n)
