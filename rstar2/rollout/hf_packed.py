"""Decoding's linear layers on oneDNN with weights reordered ("packed") for it once, instead of MKL per call.

A decode step on a CPU multiplies a few rows (the batch) by every weight matrix of the model: about 80% of a
SmolLM2-135M decode step at 16 rows is ``aten::mm`` (torch.profiler). ``torch.nn.functional.linear`` gives that
to MKL's sgemm, which at so few rows reaches a fraction of the cores' rate. oneDNN's matmul on a weight laid out
in its blocked format ahead of time (``torch.ops.mkldnn._reorder_linear_weight``, what PyTorch's Inductor uses
for CPU weight prepacking) does the same product 1.5-2x faster on a 2-core AMD EPYC with its kernels capped at
AVX2 and 3-4x faster with AVX-512 (60 [B, 576] x [576, 1536] products, float32: B = 16, 23.8 -> 12.9 ms and
30.3 -> 7.7 ms; ``benchmarks/bench_decode.py --ab`` measures the whole decode step). Values agree to float32
rounding (the products sum in another order), so a greedy token can flip where two logits tie to ~1e-5.

Within ``packed_linears(model, store)`` every ``nn.Linear`` of a CPU model (the LM head too) computes through its
packed weight while gradients are off and the input has the weight's dtype; anything else takes the module's own
forward. Packed weights are kept in ``store``, a dict the caller owns for as long as the weights do not change:
``HFEngine`` keeps one per rollout phase (an RL step builds new engines after its optimizer step), so a stage packs
once per step or evaluation, not once per decode call. Nothing here can see an update by itself: transformers'
default optimizer (``adamw_torch_fused``) writes the weights in place without bumping their version counter, and a
store kept across an RL update decoded every later step with the first step's policy (the sampler/learner
log-prob gap of a float32 run went from 1e-6 to 2.3 nats). Memory: one packed copy of the linear weights while the
store is kept.
"""

from __future__ import annotations

import contextlib

import torch

PACK_ROWS = 16   # the batch size oneDNN is told to expect; any batch works, this one picks the layout


def available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build packs and multiplies ``dtype`` weights with oneDNN on this CPU (bf16 needs native
    bf16 instructions): a one-off 2 x 8 product compared with ``F.linear`` (False on any error)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype not in _AVAILABLE:
        try:
            w, x = torch.randn(8, 8).to(dtype), torch.randn(2, 8).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
            got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            _AVAILABLE[dtype] = bool(torch.allclose(got.float(), torch.nn.functional.linear(x, w).float(),
                                                    rtol=1e-2, atol=1e-2))
        except RuntimeError:
            _AVAILABLE[dtype] = False
    return _AVAILABLE[dtype]


_AVAILABLE: dict = {}


def _packed(lin: torch.nn.Linear, store: dict):
    """``lin``'s packed weight from ``store``, packed on first use (and again if the module holds another weight
    tensor than the one packed: a cheap guard, not a check of its values)."""
    w = lin.weight
    key = (w.data_ptr(), w.dtype, tuple(w.shape))
    kept = store.get(lin)
    if kept is None or kept[0] != key:
        with torch.no_grad():
            kept = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS))
        store[lin] = kept
    return kept[1]


def _forward(lin: torch.nn.Linear, own, store: dict):
    linear = torch.ops.mkldnn._linear_pointwise

    def forward(x):
        if torch.is_grad_enabled() or x.dtype != lin.weight.dtype or x.device.type != "cpu":
            return own(x)
        return linear(x, _packed(lin, store), lin.bias, "none", [], "")
    return forward


@contextlib.contextmanager
def packed_linears(model, store: dict | None = None):
    """Within the block, ``model``'s ``nn.Linear`` layers (exactly that class, on the CPU, in a dtype oneDNN
    packs here: ``available``) multiply through packed weights when gradients are off; outside it they are as
    they were. The block gets the number of layers switched (0: nothing to do, e.g. float64 or no oneDNN).

    Args:
        store: where the packed weights are kept (module -> packed weight), to reuse them in later blocks; the
            caller must drop it (or pass a new one) once the weights change (module docstring). None: packed for
            this block only.
    """
    store = {} if store is None else store
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
               and available(m.weight.dtype)]
    patched = []
    try:
        for lin in linears:
            old = lin.__dict__.get("forward")
            patched.append((lin, old))
            lin.forward = _forward(lin, old or lin.__class__.forward.__get__(lin), store)
        yield len(patched)
    finally:
        for lin, old in patched:
            if old is None:
                lin.__dict__.pop("forward", None)
            else:
                lin.forward = old
