"""The RL memory plan (rstar2/rl/memory_plan.py) against figures that can be checked: the Qwen3 model cards'
parameter counts, the KV cache bytes per token vLLM allocates, and torch's own accounting of what a real tiny
Qwen3 saves for backward; then the verdicts the workflow acts on (fits / names the setting to change)."""

from __future__ import annotations

import pytest
import torch

from rstar2.rl import memory_plan as mp

# Model cards (huggingface.co/Qwen/Qwen3-<size>): "Number of Parameters" and "(Non-Embedding)", in billions.
MODEL_CARDS = {"Qwen/Qwen3-4B": (4.0, 3.6), "Qwen/Qwen3-8B": (8.2, 6.95), "Qwen/Qwen3-14B": (14.8, 13.2),
               "Qwen/Qwen3-32B": (32.8, 31.2)}


@pytest.mark.parametrize("name", sorted(MODEL_CARDS))
def test_parameter_counts_match_the_model_cards(name):
    shape = mp.KNOWN_MODELS[name]
    total, non_embedding = MODEL_CARDS[name]
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    assert shape.params() / 1e9 == pytest.approx(total, abs=0.05)
    assert (shape.params() - embeddings) / 1e9 == pytest.approx(non_embedding, abs=0.05)
    assert mp.KNOWN_MODELS[name + "-Base"] == mp.ModelShape(name + "-Base", *list(vars(shape).values())[1:])


def test_kv_cache_bytes_per_token_is_what_vllm_allocates():
    """vLLM's FullAttentionSpec page = 2 (K, V) x block x KV heads x head dim x dtype bytes per layer: Qwen3-14B
    (40 layers, 8 KV heads, head dim 128, bf16) holds 163,840 bytes per token. The same count from a real cache:
    transformers' DynamicCache of a tiny Qwen3 after a forward pass."""
    assert mp.KNOWN_MODELS["Qwen/Qwen3-14B-Base"].kv_bytes_per_token(2) == 2 * 40 * 8 * 128 * 2 == 163_840
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 500, (2, 37)), use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    shape = mp.shape_from_config(cfg.to_dict(), "tiny")
    assert measured == 2 * 37 * shape.kv_bytes_per_token(2)


def _saved_bytes(model, ids) -> int:
    """Bytes of the distinct tensors autograd saves for backward during one forward pass (torch's own hooks)."""
    storages = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids).last_hidden_state.sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("dims", [dict(hidden_size=64, intermediate_size=160, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, num_hidden_layers=3),
                                  dict(hidden_size=96, intermediate_size=256, num_attention_heads=6,
                                       num_key_value_heads=3, head_dim=32, num_hidden_layers=2),
                                  dict(hidden_size=128, intermediate_size=448, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=16, num_hidden_layers=2)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_matches_what_torch_saves(dims, checkpointing):
    """The per-token activation count (float32 here) against the bytes a real tiny Qwen3 saves for backward,
    within 5% (the rest: per-sequence buffers of the attention kernel, which vanish at long sequences)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, **dims)
    model = Qwen3ForCausalLM(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    B, T = 1, 512
    measured = _saved_bytes(model, torch.randint(0, 300, (B, T)))
    estimate = mp.saved_activation_bytes(mp.shape_from_config(cfg.to_dict(), "tiny"), B * T, 4, checkpointing)
    print(f"saved {measured} B, estimated {estimate} B, ratio {measured / estimate:.4f}")   # 0.98-1.05 measured
    assert measured == pytest.approx(estimate, rel=0.05), (measured, estimate)


QWEN3_14B = mp.KNOWN_MODELS["Qwen/Qwen3-14B-Base"]
FSDP = {"distributed_type": "FSDP"}
PAPER_VLLM = {"gpu_memory_utilization": 0.6, "enable_sleep_mode": True, "max_model_length": 16384}


def _dist(gb, checkpointing=True):
    return {"gpu_memory_gb": gb, "bf16": True, "gradient_checkpointing": checkpointing}


@pytest.mark.parametrize("gb", [80, 141])
def test_the_paper_setup_fits_8_gpus_of_80_and_141_gb(gb):
    pl = mp.placement(_dist(gb), 8, FSDP)
    for stage, budget in (("rl_stage1", 8192), ("rl_stage2", 12288)):
        plan = mp.plan_stage(stage, QWEN3_14B, pl, 32768, budget, PAPER_VLLM)
        assert plan.errors == () and plan.rollout_phase <= gb * 1e9 and plan.update_phase <= gb * 1e9, plan.lines
        assert plan.concurrent_rollouts >= 1 and plan.kv_tokens >= 16384
    # training state per GPU: 16 bytes per parameter over 8 GPUs = 29.5 GB for Qwen3-14B
    assert "= 29.5 GB per GPU" in plan.lines[1]


def test_a_vllm_share_below_the_weights_fails_naming_the_setting_and_the_numbers():
    """The issue's case: 0.35 of an 80 GB GPU is 28 GB, less than Qwen3-14B's 29.5 GB of bf16 weights."""
    plan = mp.plan_stage("rl_stage1", QWEN3_14B, mp.placement(_dist(80), 8, FSDP), 32768, 8192,
                         {**PAPER_VLLM, "gpu_memory_utilization": 0.35})
    (err,) = plan.errors
    assert err.startswith("distributed.vllm.gpu_memory_utilization: 0.35 gives vLLM 28.0 GB of a 80 GB GPU")
    assert "bf16 weights 29.5 GB" in err and "raise it to at least 0.43" in err
    fixed = mp.plan_stage("rl_stage1", QWEN3_14B, mp.placement(_dist(80), 8, FSDP), 32768, 8192,
                          {**PAPER_VLLM, "gpu_memory_utilization": 0.43})
    assert fixed.errors == ()   # the value the message asks for is enough


def test_a_vllm_share_that_crowds_out_the_training_state_fails():
    plan = mp.plan_stage("rl_stage1", QWEN3_14B, mp.placement(_dist(80), 8, FSDP), 32768, 8192,
                         {**PAPER_VLLM, "gpu_memory_utilization": 0.9})
    assert len(plan.errors) == 1 and "lower it to at most 0.71" in plan.errors[0]


def test_a_micro_batch_that_cannot_fit_fails_with_the_largest_that_does():
    pl = mp.placement(_dist(80), 8, FSDP)
    plan = mp.plan_stage("rl_stage1", QWEN3_14B, pl, 131072, 8192, PAPER_VLLM)
    (err,) = plan.errors
    assert err.startswith("rl.micro_batch_tokens.cuda: 131072 (with gradient checkpointing) needs")
    fit = int(err.split("lower it to at most ")[1].split()[0])
    assert 32768 < fit < 131072
    assert mp.plan_stage("rl_stage1", QWEN3_14B, pl, fit, 8192, PAPER_VLLM).errors == ()
    assert mp.plan_stage("rl_stage1", QWEN3_14B, pl, fit + 64, 8192, PAPER_VLLM).errors != ()
    # without gradient checkpointing not even one rollout fits: the message says what to switch on
    (err,) = mp.plan_stage("rl_stage1", QWEN3_14B, mp.placement(_dist(80, False), 8, FSDP), 32768, 8192,
                           PAPER_VLLM).errors
    assert "set distributed.gradient_checkpointing: true" in err


def test_a_micro_batch_shorter_than_one_rollout_fails():
    (err,) = mp.plan_stage("rl_stage2", QWEN3_14B, mp.placement(_dist(141), 8, FSDP), 8192, 12288,
                           PAPER_VLLM).errors
    assert err == ("rl.micro_batch_tokens.cuda: 8192 is less than one rollout of rl_stage2 (1024 prompt + 12288 "
                   "response tokens = 13312): raise it to at least 13312")
