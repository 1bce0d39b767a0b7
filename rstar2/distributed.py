"""Trainer placement shared by the SFT and RL stages: device, precision, process count, vLLM.

The stages run unchanged under ``accelerate launch`` (DDP or FSDP2, per the accelerate config file the workflow's
``distributed.launch`` names): accelerate sets the process group up from the environment the launcher exports,
and TRL/transformers' Trainer reads it. What the stages themselves must know is here: which process they are
(only the main one writes logs, manifests and tokenizer files), the trainer arguments that follow from the
``distributed`` config section, and two guards around accelerate's choice of engine:

* FSDP on a CPU (gloo) process group (``fsdp_on_gloo``): accelerate applies its FSDP plugin only to accelerator
  process groups, so an FSDP launch without a GPU would silently train as plain data-parallel processes; the
  stages set the FSDP type and plugin there themselves (configs/accelerate/fsdp_cpu_2proc.yaml, the tests).
* ``check_engine``: a run launched for FSDP (or as several processes) that got anything else stops in one line,
  on CPU and GPU alike, instead of training unsharded or as independent copies.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

from . import precision

DEVICES = ("cpu", "cuda")


def process_state(dist: dict | None = None):
    """accelerate's ``PartialState`` (initialises the process group under ``accelerate launch``; one process
    otherwise). Attributes used: is_main_process, process_index, num_processes, wait_for_everyone().

    On CPU it must be created with ``cpu=True`` (gloo backend): created without, it stays a single process even
    when the launcher started several, and since the state is shared, the first creation decides. On CPU the
    FSDP shim is installed first (``fsdp_on_gloo``; a no-op unless the launch asked for FSDP).
    Raises:
        ValueError: the launcher started several processes but this one trains alone (``check_processes``).
    """
    from accelerate import PartialState

    cpu = _need(dist, "device")["device"] == "cpu"
    if cpu:
        fsdp_on_gloo()
    state = PartialState(cpu=cpu)
    check_processes(state.num_processes, str(state.distributed_type))
    return state


def fsdp_asked() -> bool:
    """Whether the launch asked for FSDP: ``accelerate launch`` with ``distributed_type: FSDP`` exports
    ``ACCELERATE_USE_FSDP=true`` (accelerate/commands/launch.py, ``prepare_multi_gpu_env``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_processes(num_processes: int, distributed_type: str) -> None:
    """Fail when the launcher started ``WORLD_SIZE`` > 1 processes but this one sees ``num_processes`` == 1: each
    would train its own copy on its own share of the data and write the same outputs (e.g. an FSDP or DDP launch
    with ``distributed.device: cuda`` on a machine without a GPU: accelerate then picks no backend).

    Raises:
        ValueError: one line naming the launch, what this process got, and the setting to check (the CLI prints
            it without a traceback).
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and num_processes == 1:
        asked = "FSDP" if fsdp_asked() else "data-parallel"
        raise ValueError(f"accelerate launched {world} processes for {asked} training, but this one trains alone "
                         f"({distributed_type}, 1 process): they would be independent copies; check "
                         "distributed.device against the machine (cpu without a GPU)")


def check_engine(accelerator) -> None:
    """Fail when the launch asked for FSDP (``fsdp_asked``) but the trainer's accelerator is not sharding
    (e.g. a CPU run without ``fsdp_on_gloo``, where accelerate leaves ``MULTI_CPU``), on CPU and GPU alike.
    Called by the stages right after building their trainer, before any step.

    Raises:
        ValueError: one line naming the distributed type the run got.
    """
    from accelerate.utils import DistributedType

    check_processes(accelerator.num_processes, str(accelerator.distributed_type))
    if fsdp_asked() and accelerator.distributed_type != DistributedType.FSDP:
        raise ValueError(f"accelerate launched this run for FSDP, but its trainer got "
                         f"{accelerator.distributed_type} over {accelerator.num_processes} process(es): "
                         "the weights would not be sharded")


def fsdp_on_gloo() -> None:
    """Let accelerate run its FSDP plugin on a CPU (gloo) process group, as it does on accelerator groups.

    accelerate 1.15's ``AcceleratorState.__init__`` (accelerate/state.py lines 986-1016: ``elif
    self.distributed_type in [DistributedType.MULTI_GPU, ...]``) turns a launch's FSDP plugin into
    ``DistributedType.FSDP`` only for accelerator types; a CPU group is ``MULTI_CPU`` (``_prepare_backend``,
    line 808), so the plugin is dropped and the processes train unsharded (plain data parallel). This wraps
    ``AcceleratorState.__init__`` once per process and, afterwards, does what that branch does when, and only when,
    an FSDP plugin was passed to a ``MULTI_CPU`` state on the gloo backend: type FSDP, the plugin, its mixed
    precision. On CUDA (or any accelerator) the state is never ``MULTI_CPU``, so this changes nothing there, and
    the stages install it only for ``distributed.device: cpu``. FSDP2's ``fully_shard`` then shards over gloo
    exactly as over NCCL (DTensor parameters, reduce-scatter of gradients; tests/test_fsdp.py).
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__
    if getattr(init, "_rstar2_fsdp_on_gloo", False):
        return

    @functools.wraps(init)
    def patched(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU and self.backend == "gloo":
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    patched._rstar2_fsdp_on_gloo = True
    AcceleratorState.__init__ = patched


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


@contextlib.contextmanager
def unsharded(model, reshard_after_forward: bool) -> Iterator:
    """Within the block, an FSDP2 model's full parameters stay gathered in this process: every FSDP unit is
    all-gathered once on entry (a collective: every process enters), its forward passes then run without
    communication, and the shards are restored on exit. For generation with the model itself (the transformers
    rollout engine), where each process runs its own number of forward passes: with resharding after each
    forward, those passes would each start an all-gather, and processes with different counts would pair up
    the wrong gathers or hang. Memory: the full weights per process for the block (as one FSDP forward at a time
    would gather them anyway, one unit after another). A model without FSDP units is left as it is.

    reshard_after_forward: the value to restore afterwards (the FSDP plugin's ``reshard_after_forward``), as
    PyTorch's ``FSDPModule.set_reshard_after_forward`` documents for evaluation between training steps.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield model
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(bool(reshard_after_forward), recurse=False)
