"""GPU kinds in the config's terms (``distributed.gpu``): memory, HBM bandwidth and dense bf16 throughput, the three
figures the memory plan (rstar2/rl/memory_plan.py) and the throughput model (rstar2/rl/throughput.py) need.

Pure data, no imports beyond the standard library. Units: memory in GB (1e9 bytes, as ``distributed.gpu_memory_gb``),
bandwidth in bytes/s, compute in FLOP/s. All figures are the vendors' datasheet peaks for the SXM/OAM module, dense
(the "with sparsity" figures halved), so a model using them must apply an efficiency (MFU, bandwidth share).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """One accelerator kind: ``memory_gb`` (1e9 bytes), ``hbm_bytes_s`` peak memory bandwidth, ``bf16_flops``
    peak dense bf16 tensor FLOP/s."""
    name: str
    memory_gb: float
    hbm_bytes_s: float
    bf16_flops: float


# Datasheet values (peak, dense bf16):
#   A100 80GB SXM: NVIDIA A100 Tensor Core GPU datasheet: 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS.
#   H100 SXM: NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS with sparsity -> 989.
#   H200 SXM: NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with sparsity -> 989.
#   MI300X OAM: AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense (2,614.9 sparse).
#   B200: NVIDIA HGX/DGX B200 datasheet, per GPU = 1/8 of the 8-GPU board: 1,440 GB -> 180 GB HBM3e, 64 TB/s ->
#         8 TB/s, FP16/BF16 36 PFLOPS with sparsity -> 2.25 PFLOPS dense.
GPUS = {
    "a100-80gb": GPU("A100 80GB", 80, 2.039e12, 312e12),
    "h100-80gb": GPU("H100 80GB", 80, 3.35e12, 989e12),
    "h200": GPU("H200 141GB", 141, 4.8e12, 989e12),
    "mi300x": GPU("MI300X 192GB", 192, 5.3e12, 1307.4e12),
    "b200": GPU("B200 180GB", 180, 8.0e12, 2250e12),
}


def memory_bytes(dist: dict) -> float:
    """Memory of one GPU in bytes: ``distributed.gpu_memory_gb`` when set, else the table's for ``gpu``."""
    return 1e9 * (dist.get("gpu_memory_gb") or gpu_spec(dist).memory_gb)


def gpu_spec(dist: dict) -> GPU:
    """The GPU of a ``distributed`` config section: ``GPUS[dist["gpu"]]``, its memory replaced by
    ``gpu_memory_gb`` when that is set (a card with less memory than the table's, or a share of one).

    Raises:
        ValueError: ``gpu`` is not a key of ``GPUS`` (the schema's enum normally refuses it first).
    """
    kind = dist.get("gpu")
    if kind not in GPUS:
        raise ValueError(f"config: distributed.gpu: {kind!r} is not one of {sorted(GPUS)}")
    spec = GPUS[kind]
    gb = dist.get("gpu_memory_gb")
    return spec if not gb else GPU(spec.name, gb, spec.hbm_bytes_s, spec.bf16_flops)
