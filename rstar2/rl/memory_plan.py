"""Per-GPU memory plan of an RL stage, computed from the config before anything runs.

Pure arithmetic (no torch): the workflow calls it at parse time (workflow/rules/rl.smk), so ``snakemake -n``
prints it and a config that cannot fit fails before a job is queued. Units: bytes; GB = 1e9 bytes, the unit
of ``distributed.gpu_memory_gb`` (or the memory of ``distributed.gpu``, rstar2/gpus.py) and of vLLM's ``gpu_memory_utilization`` x total memory.

What is counted, per training process (one GPU) of a stage, in its two phases:
  * training state: float32 weights (the stages load every model in float32), float32 gradients and AdamW's
    two float32 moments, i.e. 4 + 4 + 8 bytes per parameter, each divided by the world size where sharded
    (FSDP full shard or ZeRO-3: all three; ZeRO-2: gradients and moments; ZeRO-1: moments; DDP: none);
  * one micro-batch (``rl.micro_batch_tokens`` padded tokens): activations saved for backward, with and without
    gradient checkpointing (``activation_elements``), the LM head of TRL 1.16's fused log-prob kernel (never the
    (tokens x vocab) logits: one 4096 x 32768 tile, the head's float32 gradient, and under sharding the
    gathered head), and, under FSDP/ZeRO-3, two gathered decoder layers and one layer's unsharded gradient;
  * vLLM (rollout.engine vllm, colocated): ``gpu_memory_utilization`` x GPU = bf16 weights + vLLM's own
    overhead + KV cache; KV bytes per token = 2 (K and V) x layers x KV heads x head dim x 2 (bf16), as
    vLLM allocates it; concurrent rollouts = KV tokens / (prompt allowance + the stage's max_response_tokens).
Rollout phase: weights + AdamW moments (gradients are freed after each step) + vLLM's share. Update phase:
training state + micro-batch + vLLM asleep (``enable_sleep_mode``: level 2 frees weights and KV cache) or awake.
The two constants below are estimates, not measurements (no GPU has run this code).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rstar2.gpus import memory_bytes

GB = 1e9
VLLM_OVERHEAD_BYTES = 2.0e9   # vLLM besides weights and KV: profile-run activations (TRL caps max_num_batched_tokens
#                               at 4096), CUDA graphs, sampler buffers; also what is left of it asleep [estimate]
CUDA_CONTEXT_BYTES = 1.0e9    # CUDA context and cuBLAS/NCCL workspaces of one training process [estimate]
# Prompt allowance per rollout (chat template + tool schema + problem), over the 30,407 bundled RL candidates with
# the Qwen3 tokenizer: median 408, p99 702, max 3,641 tokens (measured).
PROMPT_TOKENS = 1024
# TRL 1.16's fused LM head allocates one (tokens, vocab) tile buffer of at most TOKEN_CHUNK_SIZE x
# _CHUNKED_LOGPROB_CHUNK_SIZE (trl/kernels/chunked_logprob.py, trl/trainer/utils.py)
TILE_TOKENS, TILE_VOCAB = 4096, 32768


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Qwen3/Llama-style decoder that memory depends on (config.json field names)."""
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o projections, SwiGLU MLP, two RMSNorms, q/k norms."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h + 2 * self.head_dim

    def params(self) -> int:
        """All parameters: embedding, layers, final norm, and the LM head unless tied to the embedding."""
        embed = self.vocab_size * self.hidden_size
        return embed * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * self.layer_params() \
            + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """vLLM's KV cache per token: 2 (K, V) x layers x KV heads x head dim x dtype bytes."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def activation_elements(self) -> int:
        """Elements one decoder layer saves for backward per token: about 7 x hidden (the two RMSNorms' input,
        normalised and output tensors, and the residual), 4 x intermediate (gate, up, SiLU(gate), their product),
        5 x query and 4 x KV head dims (q/k projections, q/k norms, rotated q/k, v, attention output and its
        copy into o_proj) and 2 per head (norm and attention statistics): the tensors transformers'
        Qwen3DecoderLayer saves, checked against torch's saved-tensor accounting in tests/test_memory_plan.py."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return (7 * self.hidden_size + 4 * self.intermediate_size + 5 * q + 4 * kv
                + 2 * (self.num_attention_heads + self.num_key_value_heads))


# config.json of the hub models the paper config may name (huggingface.co/Qwen/<name>/blob/main/config.json;
# the -Base models have the same architecture). A hub model not listed here and not materialised yet is skipped.
_QWEN3 = {"Qwen3-4B": (2560, 9728, 36, 32, 8, True), "Qwen3-8B": (4096, 12288, 36, 32, 8, False),
          "Qwen3-14B": (5120, 17408, 40, 40, 8, False), "Qwen3-32B": (5120, 25600, 64, 64, 8, False)}
KNOWN_MODELS = {f"Qwen/{n}{suffix}": ModelShape(f"Qwen/{n}{suffix}", h, i, layers, heads, kv, 128, 151936, tied)
                for n, (h, i, layers, heads, kv, tied) in _QWEN3.items() for suffix in ("", "-Base")}


def shape_from_config(cfg: dict, name: str) -> ModelShape:
    """A ModelShape from a Hugging Face config.json dict (``text_config`` of a multimodal one is used).

    Raises:
        KeyError: a required field (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            vocab_size) is missing; the message names it.
    """
    cfg = cfg.get("text_config") or cfg
    heads = cfg["num_attention_heads"]
    return ModelShape(name, cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], heads,
                      cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads,
                      cfg["vocab_size"], bool(cfg.get("tie_word_embeddings", False)))


def model_shape(model_cfg: dict, base_model_dir: str | Path) -> tuple[ModelShape | None, str]:
    """The shape of the configured base model (every RL stage trains the same architecture) and where it came
    from: the base_model stage's folder if it was materialised from this very ``model`` section (its manifest's
    params), a local model folder's config.json, or ``KNOWN_MODELS`` for a hub id; (None, reason) otherwise."""
    base = Path(base_model_dir)
    try:
        made = json.loads((base / "manifest.json").read_text())["params"]
    except (OSError, ValueError, KeyError):
        made = None
    same = isinstance(made, dict) and all(made.get(k) == v for k, v in model_cfg.items())
    for folder in ([base / "model"] if same else []) + [Path(model_cfg.get("path") or "/nonexistent")]:
        if (folder / "config.json").exists():
            return shape_from_config(json.loads((folder / "config.json").read_text()), str(folder)), str(folder)
    hub_id = model_cfg.get("hub_id")
    if model_cfg.get("source") == "hub" and hub_id in KNOWN_MODELS:
        return KNOWN_MODELS[hub_id], f"built-in config of {hub_id}"
    return None, f"no config.json for model {model_cfg.get('hub_id') or model_cfg.get('source')!r} yet"


@dataclass(frozen=True)
class Placement:
    """How one RL job places a model: GPUs, sharding and precision, from the config and the accelerate file.

    sharded: which of (weights, gradients, AdamW moments) are divided over ``world_size`` processes."""
    gpu_bytes: float
    world_size: int
    strategy: str
    sharded: tuple[bool, bool, bool]
    bf16: bool
    checkpointing: bool


def placement(dist: dict, world_size: int, accelerate_cfg: dict | None) -> Placement:
    """``distributed`` config section + GPUs of the job + the accelerate config file of ``distributed.launch.rl``
    (None: one plain process) -> Placement. ZeRO stage s shards moments (s >= 1), gradients (>= 2), weights (3)."""
    kind = (accelerate_cfg or {}).get("distributed_type", "NO")
    if kind == "FSDP":
        strategy, sharded = "FSDP full shard", (True, True, True)
    elif kind == "DEEPSPEED":
        stage = int(accelerate_cfg.get("deepspeed_config", {}).get("zero_stage", 0))
        strategy, sharded = f"DeepSpeed ZeRO-{stage}", (stage >= 3, stage >= 2, stage >= 1)
    else:
        strategy, sharded = ("DDP" if world_size > 1 else "one process"), (False, False, False)
    return Placement(memory_bytes(dist), world_size, strategy, sharded, dist["bf16"],
                     dist["gradient_checkpointing"])


def saved_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    """What the forward pass of ``tokens`` padded tokens leaves saved for backward: every layer's
    ``activation_elements`` (with per-layer gradient checkpointing only each layer's input, hidden_size) plus
    2 x hidden for the final norm (its input and normalised output)."""
    layers = shape.hidden_size if checkpointing else shape.activation_elements()
    return float(tokens * (shape.num_hidden_layers * layers + 2 * shape.hidden_size) * dtype_bytes)


def activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    """Peak activations of one micro-batch in backward: ``saved_activation_bytes``, plus with checkpointing one
    layer's full activations while it is recomputed."""
    recompute = tokens * shape.activation_elements() * dtype_bytes if checkpointing else 0
    return saved_activation_bytes(shape, tokens, dtype_bytes, checkpointing) + recompute


def lm_head_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, sharded: bool) -> float:
    """TRL's fused LM head in backward: one logit tile, float32 gradients of the head (vocab x hidden) and of the
    hidden states (tokens x hidden), and the gathered head in the compute dtype when the weights are sharded."""
    head = shape.vocab_size * shape.hidden_size
    return float(min(tokens, TILE_TOKENS) * TILE_VOCAB * dtype_bytes + head * 4 + tokens * shape.hidden_size * 4
                 + (head * dtype_bytes if sharded else 0))


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


@dataclass(frozen=True)
class StagePlan:
    """One RL stage's per-GPU estimate (bytes). ``errors`` name the setting to change; empty = it fits."""
    stage: str
    lines: tuple[str, ...]
    errors: tuple[str, ...]
    rollout_phase: float
    update_phase: float
    kv_tokens: int | None
    concurrent_rollouts: int | None


def plan_stage(stage: str, shape: ModelShape, pl: Placement, micro_batch_tokens: int, max_response_tokens: int,
               vllm: dict | None) -> StagePlan:
    """The memory plan of one RL stage on one GPU (module docstring for what is counted).

    Args:
        stage: rule name, for the messages. shape, pl: the model and its placement.
        micro_batch_tokens: ``rl.micro_batch_tokens`` of the device. max_response_tokens: the stage's budget.
        vllm: ``distributed.vllm`` when rollouts run in a colocated vLLM (rollout.engine vllm), else None.
    Returns:
        StagePlan with printable ``lines`` and ``errors`` such as a vLLM share below its weights, a micro-batch
        that does not fit next to the training state, or one rollout longer than a micro-batch.
    """
    P, N, G = shape.params(), pl.world_size, pl.gpu_bytes
    per = [4 * P / (N if s else 1) for s in pl.sharded]  # weights, gradients, AdamW moments (float32)
    per[2] *= 2
    d = 2 if pl.bf16 else 4
    lines, errors = [], []
    lines.append(f"{stage}: {shape.name}, {P / 1e9:.2f}B parameters, {N} x {G / GB:.0f} GB GPUs, {pl.strategy}, "
                 f"{'bf16' if pl.bf16 else 'float32'} compute")
    lines.append(f"  training state  weights {_gb(per[0])} + gradients {_gb(per[1])} + AdamW {_gb(per[2])} "
                 f"= {_gb(sum(per))} per GPU (float32)")
    act = activation_bytes(shape, micro_batch_tokens, d, pl.checkpointing)
    other = activation_bytes(shape, micro_batch_tokens, d, not pl.checkpointing)
    head = lm_head_bytes(shape, micro_batch_tokens, d, pl.sharded[0])
    gathered = shape.layer_params() * (2 * d + 4) if pl.sharded[0] else 0.0
    lines.append(f"  micro-batch     {micro_batch_tokens} tokens: activations {_gb(act)} "
                 f"{'with' if pl.checkpointing else 'without'} gradient checkpointing "
                 f"({_gb(other)} {'without' if pl.checkpointing else 'with'}); LM head {_gb(head)}"
                 + (f"; gathered layers {_gb(gathered)}" if gathered else ""))
    update = sum(per) + act + head + gathered + CUDA_CONTEXT_BYTES
    rollout = per[0] + per[2] + CUDA_CONTEXT_BYTES
    kv_tokens = rollouts = None
    one_rollout = PROMPT_TOKENS + max_response_tokens
    if vllm is not None:
        share = vllm["gpu_memory_utilization"] * G
        weights, kv_token = 2.0 * P, shape.kv_bytes_per_token(2)
        longest = max(vllm["max_model_length"] or 0, one_rollout)
        kv = share - weights - VLLM_OVERHEAD_BYTES
        kv_tokens = max(0, int(kv // kv_token))
        rollouts = kv_tokens // one_rollout
        lines.append(f"  vLLM            {vllm['gpu_memory_utilization']:.2f} x {G / GB:.0f} GB = {_gb(share)}: "
                     f"bf16 weights {_gb(weights)} + overhead {_gb(VLLM_OVERHEAD_BYTES)} + KV cache {_gb(max(kv, 0))} "
                     f"= {kv_tokens:,} tokens ({kv_token:,} B/token) = {rollouts} concurrent rollouts of "
                     f"{one_rollout:,} tokens ({PROMPT_TOKENS} prompt + {max_response_tokens} response)")
        if kv_tokens < longest:
            need = (weights + VLLM_OVERHEAD_BYTES + longest * kv_token) / G
            errors.append(f"distributed.vllm.gpu_memory_utilization: {vllm['gpu_memory_utilization']} gives vLLM "
                          f"{_gb(share)} of a {G / GB:.0f} GB GPU (distributed.gpu_memory_gb), less than "
                          f"{shape.name}'s bf16 weights {_gb(weights)} + {_gb(VLLM_OVERHEAD_BYTES)} vLLM overhead + "
                          f"the KV cache of one {longest:,}-token sequence {_gb(longest * kv_token)}: raise it to at "
                          f"least {math.ceil(need * 100) / 100:.2f}")
        rollout += share
        update += VLLM_OVERHEAD_BYTES if vllm["enable_sleep_mode"] else share
        if rollout > G:
            room = (G - (rollout - share)) / G
            errors.append(f"distributed.vllm.gpu_memory_utilization: {vllm['gpu_memory_utilization']} leaves no room "
                          f"for the training state during rollouts ({_gb(per[0] + per[2])} weights and AdamW per GPU "
                          f"+ {_gb(share)} vLLM + {_gb(CUDA_CONTEXT_BYTES)} CUDA context = {_gb(rollout)} > "
                          f"{G / GB:.0f} GB): lower it to at most {math.floor(room * 100) / 100:.2f}, or shard over "
                          "more GPUs")
    if update > G:
        fixed = update - act - micro_batch_tokens * shape.hidden_size * 4
        per_token = (act / micro_batch_tokens) + shape.hidden_size * 4
        fit = int((G - fixed) // per_token) if G > fixed else 0
        errors.append(f"rl.micro_batch_tokens.cuda: {micro_batch_tokens} ({'with' if pl.checkpointing else 'without'} "
                      f"gradient checkpointing) needs {_gb(update)} per GPU in the update phase, over the "
                      f"{G / GB:.0f} GB GPU: lower it to at most {fit} tokens"
                      + ("" if pl.checkpointing else " or set distributed.gradient_checkpointing: true")
                      + ("" if not vllm or vllm["enable_sleep_mode"] else
                         " (vLLM stays resident: distributed.vllm.enable_sleep_mode: true frees it)"))
    if micro_batch_tokens < one_rollout:
        errors.append(f"rl.micro_batch_tokens.cuda: {micro_batch_tokens} is less than one rollout of {stage} "
                      f"({PROMPT_TOKENS} prompt + {max_response_tokens} response tokens = {one_rollout}): raise it "
                      f"to at least {one_rollout}")
    lines.append(f"  peak per GPU    rollout phase {_gb(rollout)}, update phase {_gb(update)}"
                 f"{' (vLLM asleep)' if vllm and vllm['enable_sleep_mode'] else ''} of {G / GB:.0f} GB: "
                 + ("fits" if not errors else "DOES NOT FIT"))
    return StagePlan(stage, tuple(lines), tuple(errors), rollout, update, kv_tokens, rollouts)


def accelerate_config(launch: str) -> dict | None:
    """The accelerate config file a launch command names (``accelerate launch --config_file X.yaml ...`` or
    ``scripts/slurm_accelerate.sh X.yaml``), parsed; None for a plain ``rstar2`` command.

    Raises:
        FileNotFoundError: the named file does not exist (relative paths start at the working directory).
    """
    import yaml

    for word in launch.split():
        if word.endswith((".yaml", ".yml")):
            return yaml.safe_load(Path(word).read_text()) or {}
    return None


def workflow_plans(config: dict, stages: list[str], world_size: int, accelerate_cfg: dict | None,
                   base_model_dir: str) -> tuple[list[StagePlan], str | None]:
    """Plans of the configured RL stages of a cuda run (none on cpu) and a notice when none could be made.

    world_size: GPUs of one RL job (distributed.resources.rl gpu x nodes). accelerate_cfg: the accelerate config
    file of distributed.launch.rl, parsed (None = plain process). base_model_dir: the base_model stage's folder."""
    dist, rl = config["distributed"], config["rl"]
    if dist["device"] != "cuda":
        return [], None
    shape, source = model_shape(config["model"], base_model_dir)
    if shape is None:
        return [], f"memory plan skipped: {source}"
    if world_size < 1:
        return [], "memory plan skipped: distributed.resources.rl.gpu is 0 for a cuda run"
    pl = placement(dist, world_size, accelerate_cfg)
    vllm = dist["vllm"] if config["rollout"]["engine"] == "vllm" else None
    return [plan_stage(f"rl_{s}", shape, pl, rl["micro_batch_tokens"]["cuda"],
                       rl["stages"][s]["max_response_tokens"], vllm) for s in stages], None
