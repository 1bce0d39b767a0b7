"""``reproducible: true`` on the vLLM engines (docs/resume.md): seeded requests and, on CUDA, vLLM's
batch-invariant kernels.

- Seeds: each trajectory turn is its own vLLM request with its own ``SamplingParams(seed=...)``, derived from the
  phase's seed, the trajectory's key (``<problem id>#<sample index>``, unique within a group) and how many context
  tokens the turn starts from (``turn_seed``). Never one seed per group: G equal samples would all get the same
  reward and a zero advantage. vLLM then samples each seeded request from its own ``torch.Generator`` (vllm 0.31.0
  ``vllm/v1/sample/ops/topk_topp_sampler.py``: ``random_sample``), so its tokens do not depend on what else runs
  in the batch as long as the logits do not.
- Logits: on a GPU they do depend on the batch (split-K matmuls, attention tiling); ``VLLM_BATCH_INVARIANT=1``
  (vllm 0.31.0 ``vllm/model_executor/determinism/batch_invariant.py``: ``init_batch_invariance``) switches vLLM to
  kernels whose results do not. vLLM implements that mode for CUDA (compute capability 8.0: Triton matmuls; 9.0 and
  10.0: cuBLAS without split-K) and XPU; it reads the variable when an engine starts, so it is set before one is
  built (``enable_batch_invariance``) and recorded in the stage's manifest (``vllm_batch_invariant``). On CPU vLLM
  has no such mode; in tests/test_vllm_rollout.py two seeded runs gave the same tokens, also with another request
  in the batch (log-probs equal to ~1e-6).
"""

from __future__ import annotations

import contextlib
import os

from .. import seeds

ENV = "VLLM_BATCH_INVARIANT"


def turn_seed(seed: int | None, key: str, n_context: int) -> int | None:
    """The vLLM seed of the turn of trajectory ``key`` that starts from ``n_context`` context tokens, in [0, 2**62);
    None when ``seed`` is None (unseeded: vLLM's own random stream)."""
    return None if seed is None else seeds.derive(seed, "vllm", key, n_context)


@contextlib.contextmanager
def seed_engines(engines: list, seed: int | None):
    """Within the block, each vLLM engine (``vllm_engines._Sampling``, ``servers.OpenAIEngine``) without a seed of
    its own seeds its turns from
    ``seed`` (``run_rollouts`` with ``reproducible``: RL's engines are built by the trainer, the step's seed comes from
    ``RolloutFunc``); afterwards it is unseeded again. Other engines are left as they are (the hf engine takes its
    seed when it is built)."""
    lent = [e for e in engines if getattr(e, "seeded_turns", False) and e.seed is None] if seed is not None else []
    for e in lent:
        e.seed = seed
    try:
        yield
    finally:
        for e in lent:
            e.seed = None


def batch_invariant_supported() -> bool:
    """Whether vLLM 0.31.0 has batch-invariant kernels for this machine's accelerator: a CUDA GPU of compute
    capability 8.0 or newer (its Triton overrides target SM80, cuBLAS settings SM90/SM100)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


def enable_batch_invariance(reproducible: bool, engine: str) -> bool | None:
    """Before an in-process vLLM engine is built (``engine`` "vllm"): with ``reproducible`` on a supported GPU set
    ``VLLM_BATCH_INVARIANT=1`` in this process's environment (child processes inherit it). Returns what the
    manifest records: None when no in-process vLLM engine runs (hf, or a server whose environment is its own),
    else whether the mode is on (also when the user set it)."""
    if engine != "vllm":
        return None
    if reproducible and batch_invariant_supported():
        os.environ[ENV] = "1"
    return os.environ.get(ENV, "0") not in ("", "0")
