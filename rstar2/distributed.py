"""Trainer placement shared by the SFT and RL stages: device, precision, process count, vLLM.

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

    return PartialState(cpu=_need(dist, "device")["device"] == "cpu")


def _need(section: dict, *keys: str) -> dict:
    """``section`` itself, once it has every key: the stage's params carry each one, defaulted by the config
    schema (the one place defaults live), so a missing key is a caller's bug, named here."""
    missing = [k for k in keys if k not in section]
    if missing:
        raise ValueError(f"distributed settings lack {missing} (have {sorted(section)}): pass the stage's "
                         "complete `trainer` / `rollout` params")
    return section


def trainer_kwargs(dist: dict | None) -> dict:
    """transformers ``TrainingArguments`` fields for a stage's ``trainer`` params (the ``distributed`` section).

    dist keys (all required): device ("cpu" | "cuda"), bf16 (False | True | "force"), gradient_checkpointing (bool),
    reproducible (bool: on CUDA, transformers' ``full_determinism``, i.e. ``torch.use_deterministic_algorithms`` and
    deterministic cuBLAS/cuDNN; on CPU nothing is needed: two same-seed runs already give identical weights, a test,
    while deterministic mode would fill every new tensor with NaN first).
    Raises:
        ValueError: a missing key, an unknown device or bf16 setting.
    bf16 on CPU is torch.autocast mixed precision (float32 master weights), about 2x faster training on CPUs
    with AMX / AVX512-BF16; ``True`` gives bf16 only where the device has native bf16 and float32 elsewhere, with
    a one-line notice (``rstar2.precision.training``); the default CPU run stays float32 (exact tests).
    """
    device = _need(dist, "device", "bf16", "gradient_checkpointing", "reproducible")["device"]
    if device not in DEVICES:
        raise ValueError(f"distributed.device must be one of {DEVICES}, got {device!r}")
    bf16 = precision.training(dist["bf16"], device).bf16
    return {"use_cpu": device == "cpu", "bf16": bf16, "gradient_checkpointing": bool(dist["gradient_checkpointing"]),
            "full_determinism": bool(dist["reproducible"]) and device == "cuda"}


def vllm_kwargs(rollout: dict, dist: dict | None) -> dict:
    """TRL ``GRPOConfig`` vLLM fields for an RL stage, from ``rollout.engine`` and ``distributed.vllm``.

    rollout.engine "hf" -> no vLLM; "vllm" -> TRL colocate mode (one in-process vLLM per training process,
    sharing its GPU; with distributed.device "cpu" vLLM's CPU build beside the CPU trainer, its weights reloaded
    each step by ``rollout.vllm_sync``); "server" -> TRL server mode against ``rollout.server_urls[0]`` (started
    with ``trl vllm-serve``, whose weights TRL updates over NCCL, so CUDA only). TRL's importance-sampling
    correction is off: it needs TRL's own generation path, which RoCGRPOTrainer replaces; ``rl.tis`` is ours
    (rstar2/rl/tis.py).
    Raises:
        ValueError: engine "server" with distributed.device "cpu" (NCCL weight sync needs CUDA); "server"
            without server_urls; a missing key.
    """
    engine = _need(rollout, "engine")["engine"]
    if engine == "hf":
        return {"use_vllm": False}
    if _need(dist, "device", "vllm")["device"] != "cuda" and engine == "server":
        raise ValueError("rollout.engine 'server' in an RL stage needs distributed.device: cuda (TRL updates the "
                         "server's weights over NCCL); on CPU use rollout.engine vllm (colocate)")
    v = _need(dist["vllm"], "gpu_memory_utilization", "enable_sleep_mode", "max_model_length", "server_timeout_s")
    kw = {"use_vllm": True, "vllm_importance_sampling_correction": False,
          "vllm_gpu_memory_utilization": v["gpu_memory_utilization"],
          "vllm_enable_sleep_mode": bool(v["enable_sleep_mode"]),
          "vllm_max_model_length": v["max_model_length"], "vllm_tensor_parallel_size": 1}
    if engine == "vllm":
        return {**kw, "vllm_mode": "colocate"}
    urls = _need(rollout, "server_urls")["server_urls"]
    if not urls:
        raise ValueError("rollout.engine 'server' needs rollout.server_urls (the trl vllm-serve address)")
    return {**kw, "vllm_mode": "server", "vllm_server_base_url": urls[0], "vllm_server_timeout": v["server_timeout_s"]}
