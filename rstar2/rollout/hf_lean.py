"""A lean one-token decode step for Llama-family models on the CPU, with fused projections (float32).

A decode step of the default model (SmolLM2-135M, 30 layers) through transformers' modules runs about 70 small
operations per layer: three separate q / k / v products and two gate / up products, the rotary embedding per
tensor, the cache update, mask slicing, dtype round trips in each RMSNorm. At the batch sizes of a rollout most of
those are dispatch overhead, and three thin products reach less of oneDNN's rate than one wider one
(``[16, 576] x [576, 960]`` against q, k and v apart: 165 against 221 us on a 2-core Zen 3). ``LeanDecoder.step``
computes the same layer with one q/k/v product and one gate/up product through oneDNN-packed weights
(``hf_packed``), transformers' own rotary module for the angles, ``F.rms_norm`` (bit-equal to the models' RMSNorm in
float32), and the attention ``hf_decode`` uses (grouped-query, optionally over a shared prefix's keys). On that
Zen 3, float32, contexts of 128 tokens: 53.0 -> 44.6 ms per step at batch 1, 92.0 -> 79.4 at 16, 210 -> 199 at 64.

It writes keys and values into the same ``hf_decode.PreallocatedCache`` the transformers forward does, so prefill,
row dropping and the KV hand-over between turns are unchanged. Values agree with the module forward to float32
rounding (the products sum in another order). Supported: ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM`` (its q/k RMSNorm) with SiLU MLPs, no sliding window, float32 weights on the CPU with oneDNN;
``LeanDecoder.for_model`` returns None for anything else, which then decodes through transformers' forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .hf_decode import _prefix_decode_attention
from .hf_packed import PACK_ROWS, available

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS)


def _cat_bias(*linears):
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else lin.weight.new_zeros(lin.out_features)
                      for b, lin in zip(biases, linears)])


class _Layer:
    """One decoder layer's weights, fused and packed: q/k/v, o, gate/up, down; its norms' weights and modules."""

    def __init__(self, layer):
        a, m = layer.self_attn, layer.mlp
        self.qkv = _pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        self.qkv_bias = _cat_bias(a.q_proj, a.k_proj, a.v_proj)
        self.o, self.o_bias = _pack(a.o_proj.weight), a.o_proj.bias
        self.gate_up = _pack(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        self.gate_up_bias = _cat_bias(m.gate_proj, m.up_proj)
        self.down, self.down_bias = _pack(m.down_proj.weight), m.down_proj.bias
        self.norm_in, self.norm_post = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        self.scaling = a.scaling


def _linear(x, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _rms(x, norm):
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _rotate(x, cos, sin):
    """transformers' ``apply_rotary_pos_emb`` for one tensor: x [B, heads, D], cos/sin [B, 1, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanDecoder:
    """The decode step of one model, with its fused packed weights (made once; valid while the weights do not
    change, as ``hf_packed``'s store: ``for_model`` keeps it in the caller's store)."""

    def __init__(self, model):
        cfg = model.config
        self.model, self.backbone = model, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter = cfg.intermediate_size
        self.layers = [_Layer(layer) for layer in model.model.layers]
        head = model.get_output_embeddings()
        self.head, self.head_bias = _pack(head.weight), head.bias

    @staticmethod
    def supported(model) -> bool:
        """Whether ``model`` is a float32 CPU model of a supported architecture and layout (module docstring)."""
        cfg = getattr(model, "config", None)
        if cfg is None or type(model).__name__ not in ARCHITECTURES or not hasattr(model, "model"):
            return False
        try:
            weight = model.get_output_embeddings().weight
        except AttributeError:
            return False
        layer_types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        return (weight.device.type == "cpu" and weight.dtype == torch.float32 and available(torch.float32)
                and getattr(cfg, "hidden_act", "silu") == "silu" and layer_types == {"full_attention"}
                and not getattr(cfg, "use_sliding_window", False) and not getattr(cfg, "mlp_bias", False)
                and getattr(cfg, "pretraining_tp", 1) == 1)

    @classmethod
    def for_model(cls, model, store: dict | None) -> "LeanDecoder | None":
        """The decoder of ``model`` from ``store`` (made and kept there on first use; None: not kept), or None when
        the model is not supported."""
        if not cls.supported(model):
            return None
        if store is None:
            return cls(model)
        key = ("lean", id(model))
        if key not in store:
            store[key] = cls(model)
        return store[key]

    @torch.no_grad()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor, prefix=None):
        """One decode step: append each row's token to ``cache`` and return the next-token logits.

        Args:
            ids: int64 [B], the token each row feeds. positions: int64 [B], its position.
            cache: the ``hf_decode.PreallocatedCache`` holding every row's earlier keys and values (L positions).
            mask: [B, L + 1] (1 = attend), the keys after this step's token is appended.
            prefix: per layer ``(K, V)`` [H_kv, s, D] every row attends to ahead of its own keys
                (``hf_decode.shared_prefix_kv``), or None.
        Returns:
            float32 logits [B, vocab].
        """
        B, H, Hkv, D = ids.shape[0], self.heads, self.kv_heads, self.head_dim
        h = self.backbone.embed_tokens(ids)
        cos, sin = self.backbone.rotary_emb(h, positions[:, None])   # [B, 1, D]: broadcast over the heads
        keep = mask.bool()[:, None, None, :]
        for li, w in enumerate(self.layers):
            x = _rms(h, w.norm_in)
            qkv = _linear(x, w.qkv, w.qkv_bias)
            q = qkv[:, :H * D].view(B, H, D)
            k = qkv[:, H * D:(H + Hkv) * D].view(B, Hkv, D)
            v = qkv[:, (H + Hkv) * D:].view(B, Hkv, D)
            if w.q_norm is not None:
                q, k = w.q_norm(q), w.k_norm(k)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            keys, values = cache.update(k[:, :, None], v[:, :, None], li)
            if prefix is not None:
                att = _prefix_decode_attention(q[:, :, None], keys, values, keep, w.scaling, prefix[li])[0]
            else:   # query heads of one KV head are consecutive (hf_decode.gqa_decode_attention)
                att = F.scaled_dot_product_attention(q.view(B, Hkv, H // Hkv, D), keys, values, attn_mask=keep,
                                                     scale=w.scaling)
            h = h + _linear(att.reshape(B, H * D), w.o, w.o_bias)
            gu = _linear(_rms(h, w.norm_post), w.gate_up, w.gate_up_bias)
            h = h + _linear(F.silu(gu[:, :self.inter]) * gu[:, self.inter:], w.down, w.down_bias)
        return _linear(_rms(h, self.backbone.norm), self.head, self.head_bias)
