"""The settings an in-process vLLM engine starts with (``distributed.vllm``, handed to the rollouts as
``RolloutConfig.vllm``): the environment it reads when it starts, the ``AsyncEngineArgs`` of the engine that
evaluation and hard-problem mining build, and ``enforce_eager`` for the ``vllm.LLM`` TRL colocates with the RL
trainer (paper §3.2: the rollout engine; §5: evaluation).

vLLM reads its ``VLLM_*`` variables when an engine starts (vllm 0.31.0 ``vllm/envs.py``; the CPU build's
``vllm/platforms/cpu.py`` reads ``VLLM_CPU_KVCACHE_SPACE``, the KV cache in GiB, and ``VLLM_CPU_OMP_THREADS_BIND``
in ``check_and_update_config``), and its engine-core processes inherit this process's environment: so the stage
sets them in its own process first (``set_env``), before TRL builds its colocated ``vllm.LLM`` or before
``default_engines`` builds an ``AsyncLLM``.
"""

from __future__ import annotations

import contextlib
import os


def set_env(vllm: dict | None) -> dict:
    """Set ``vllm["env"]`` (name -> value strings) in this process's environment; returns what was set ({} for
    None or no ``env``). The config's value replaces one inherited from the caller's shell. Logs one line naming
    what it set (the stage's log shows the environment its engine started with, whatever vLLM's log level)."""
    env = {str(k): str(v) for k, v in ((vllm or {}).get("env") or {}).items()}
    os.environ.update(env)
    if env:
        print("[vllm] environment: " + " ".join(f"{k}={v!r}" for k, v in env.items()), flush=True)
    return env


def async_engine_args(model_path: str, vllm: dict | None):
    """``vllm.AsyncEngineArgs`` of the in-process engine on ``model_path``: prefix caching on, log-probabilities of
    the processed distribution (the one sampled from), ``max_model_len`` from ``max_model_length`` (None: the
    model's) and ``enforce_eager``; the model's own dtype (vLLM's ``auto``).

    Raises:
        ImportError: vLLM is not installed.
    """
    from vllm import AsyncEngineArgs  # optional: the GPU extra or vLLM's CPU build

    v = vllm or {}
    return AsyncEngineArgs(model=model_path, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                           max_model_len=v.get("max_model_length"), enforce_eager=bool(v.get("enforce_eager")))


@contextlib.contextmanager
def colocated_llm_args(vllm: dict | None):
    """While open, the ``vllm.LLM`` that TRL's colocate mode builds (trl 1.16 ``trl/generation/vllm_generation.py``,
    in the trainer's ``__init__``) also gets ``enforce_eager`` where ``vllm["enforce_eager"]`` is set: TRL passes
    no such argument, so its engine would trace and compile the model before the first rollout (on a 2-core CPU a
    tiny Qwen3's first ``generate`` took 16.8 s traced against 5.5 s eager). Without the switch, or without vLLM
    (TRL then raises its own "vLLM is not available" when it builds the engine), nothing changes.
    """
    if not (vllm or {}).get("enforce_eager"):   # before the import: it imports vLLM where vLLM is installed
        yield
        return
    import functools

    from trl.generation import vllm_generation  # imports without vLLM; LLM is there only with it

    built = getattr(vllm_generation, "LLM", None)
    if built is None:
        yield
        return
    vllm_generation.LLM = functools.partial(built, enforce_eager=True)
    try:
        yield
    finally:
        vllm_generation.LLM = built
