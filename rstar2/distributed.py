"""Trainer placement shared by the SFT and RL stages: device, precision, process count, vLLM (issue 8).

The stages run unchanged under ``accelerate launch`` (DDP, DeepSpeed ZeRO-3 or FSDP, per the accelerate config
file the workflow's ``distributed.launch`` names): accelerate sets the process group up from the environment the
launcher exports, and TRL/transformers' Trainer reads it. What the stages themselves must know is here:
which process they are (only the main one writes logs, manifests and tokenizer files) and the trainer
arguments that follow from the ``distributed`` config section.
"""

from __future__ import annotations

from . import precision

DEVICES = ("cpu", "cuda")


def process_state(dist: dict | None = None):
    """accelerate's ``PartialState`` (initialises the process group under ``accelerate launch``; one process
    otherwise). Attributes used: is_main_process, process_index, num_processes, wait_for_everyone().

    On CPU it must be created with ``cpu=True`` (gloo backend): created without, it stays a single process even
    when the launcher started several, and since the state is shared, the first creation decides.
    """
    from accelerate import PartialState

    return PartialState(cpu=(dist or {}).get("device", "cpu") == "cpu")


def trainer_kwargs(dist: dict | None) -> dict:
    """transformers ``TrainingArguments`` fields for a stage's ``trainer`` params (the ``distributed`` section).

    dist keys: device ("cpu" | "cuda"), bf16 (False | True | "force"), gradient_checkpointing (bool); None or {} =
    the CPU defaults.
    Raises:
        ValueError: unknown device or bf16 setting.
    bf16 on CPU is torch.autocast mixed precision (float32 master weights), about 2x faster training on CPUs
    with AMX / AVX512-BF16; ``True`` gives bf16 only where the device has native bf16 and float32 elsewhere, with
    a one-line notice (``rstar2.precision.training``); the default CPU run stays float32 (exact tests).
    """
    dist = dist or {}
    device = dist.get("device", "cpu")
    if device not in DEVICES:
        raise ValueError(f"distributed.device must be one of {DEVICES}, got {device!r}")
    bf16 = precision.training(dist.get("bf16", False), device).bf16
    return {"use_cpu": device == "cpu", "bf16": bf16,
            "gradient_checkpointing": bool(dist.get("gradient_checkpointing", False))}


def vllm_kwargs(rollout: dict, dist: dict | None) -> dict:
    """TRL ``GRPOConfig`` vLLM fields for an RL stage, from ``rollout.engine`` and ``distributed.vllm``.

    rollout.engine "hf" -> no vLLM; "vllm" -> TRL colocate mode (one in-process vLLM per training process,
    sharing its GPU); "server" -> TRL server mode against ``rollout.server_urls[0]`` (started with
    ``trl vllm-serve``, whose weights TRL updates over NCCL). Importance-sampling correction is off: the rollout
    engines return token ids, not sampling log-probabilities (see rstar2.rl.trainer).
    Raises:
        ValueError: engine "vllm"/"server" with distributed.device "cpu" (TRL's vLLM paths need CUDA).
    """
    engine = rollout.get("engine", "hf")
    if engine == "hf":
        return {"use_vllm": False}
    dist = dist or {}
    if dist.get("device", "cpu") != "cuda":
        raise ValueError(f"rollout.engine {engine!r} in an RL stage needs distributed.device: cuda")
    v = dist.get("vllm") or {}
    kw = {"use_vllm": True, "vllm_importance_sampling_correction": False,
          "vllm_gpu_memory_utilization": v.get("gpu_memory_utilization", 0.3),
          "vllm_enable_sleep_mode": bool(v.get("enable_sleep_mode", False)),
          "vllm_max_model_length": v.get("max_model_length"), "vllm_tensor_parallel_size": 1}
    if engine == "vllm":
        return {**kw, "vllm_mode": "colocate"}
    urls = rollout.get("server_urls") or []
    if not urls:
        raise ValueError("rollout.engine 'server' needs rollout.server_urls (the trl vllm-serve address)")
    return {**kw, "vllm_mode": "server", "vllm_server_base_url": urls[0],
            "vllm_server_timeout": v.get("server_timeout_s", 240.0)}
