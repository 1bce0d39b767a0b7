"""The rollout layer shared by RL, hard-problem mining and evaluation (paper §2.1, §3.2).

``run_rollouts`` builds the agent loop (agent_loop.py), the engines (engines.py; transformers ``generate``
on the policy by default) and the scheduler (scheduler.py; KV-aware, load-balanced, no per-turn barrier
by default), runs every trajectory to its end and grades it.
"""

from __future__ import annotations

from typing import Callable

from .. import sandbox
from .agent_loop import (AgentLoop, DelayedToolRunner, Progress, RolloutConfig, ToolConfig, ToolRunner,
                         Trajectory, grade_all)
from .central import CentralDispatch, run_centrally
from .central import for_trainer as central_for_trainer
from .engines import Generation, HFEngine, engines_for_trainer, inference_copy
from .lane import run_async
from .scheduler import Scheduler
from .servers import OpenAIEngine, server_engines
from .vllm_engines import AsyncVLLMEngine, StepVLLMEngine, shutdown_async_llm, start_async_llm
from .vllm_reproducible import enable_batch_invariance, seed_engines
from .vllm_settings import async_engine_args, set_env

__all__ = ["AgentLoop", "AsyncVLLMEngine", "CentralDispatch", "DelayedToolRunner", "Generation", "HFEngine",
           "OpenAIEngine", "Progress", "RolloutConfig", "Scheduler", "StepVLLMEngine", "ToolConfig", "ToolRunner",
           "Trajectory", "central_for_trainer", "default_engines", "engines_for_trainer", "grade_all", "run_async",
           "run_rollouts", "sample_groups", "server_engines", "shutdown_vllm"]


_VLLM_CACHE: dict = {}


def default_engines(model, tok, cfg: RolloutConfig, seed: int | None = None) -> list:
    """The engines ``cfg.engine`` names (see RolloutConfig): "server" = one engine per data-parallel rank of each
    server in ``cfg.server_urls``; "vllm" = an in-process ``vllm.AsyncLLM``, built once per model folder with the
    settings and environment of ``cfg.vllm`` (vllm_settings.py: prefix caching on; log-probabilities of the processed
    distribution, the one sampled from; with ``cfg.reproducible``
    each turn seeded from ``seed`` and the trajectory, and on a GPU batch-invariant kernels: vllm_reproducible.py);
    "hf" = HFEngine replicas, sampling from the streams of ``seed`` (None: drawn from torch's global RNG). Servers
    and vLLM seed each turn's request from ``seed`` only with ``cfg.reproducible``."""
    stop = [tok.eos_token_id]
    if cfg.engine == "server":
        name = cfg.server_model or model.config._name_or_path
        return [e for url in cfg.server_urls
                for e in server_engines(url, name, stop, cfg.temperature, cfg.top_p, cfg.kv_cache_tokens,
                                        seed=seed if cfg.reproducible else None)]
    if cfg.engine == "vllm":
        path = model.config._name_or_path
        if path not in _VLLM_CACHE:
            set_env(cfg.vllm)  # read when the engine starts, as is batch invariance
            enable_batch_invariance(cfg.reproducible, "vllm")
            _VLLM_CACHE[path] = start_async_llm(async_engine_args(path, cfg.vllm))
        return [AsyncVLLMEngine(_VLLM_CACHE[path], stop, cfg.temperature, cfg.top_p, cfg.kv_cache_tokens,
                                seed=seed if cfg.reproducible else None)]
    if hasattr(model, "eval"):
        model.eval()
    decoder = inference_copy(model, cfg.precision)
    if seed is None:
        import torch

        seed = int(torch.randint(0, 2**62, (1,)))  # one seed for all replicas: a row's stream is its own either way
    return [HFEngine(decoder, tok, cfg.temperature, cfg.top_p, max_batch=cfg.batch_size,
                     kv_tokens=cfg.kv_cache_tokens, kv_budget_mb=cfg.hf_kv_cache_mb, precision=cfg.precision,
                     kv_reuse=cfg.kv_reuse, seed=seed,
                     reproducible=cfg.reproducible)
            for _ in range(cfg.num_engines)]


def shutdown_vllm() -> None:
    """Shut down every in-process ``AsyncLLM`` that ``default_engines`` built (a stage calls it once its rollouts
    are done: vLLM's engine process then exits in order instead of being killed at interpreter exit)."""
    while _VLLM_CACHE:
        shutdown_async_llm(_VLLM_CACHE.popitem()[1])


def run_rollouts(model, tok, problems: list[dict], cfg: RolloutConfig, progress=None, *, engines: list | None = None,
                 tools: ToolRunner | None = None,
                 reward_fn: Callable[[str, str], dict] | None = None,
                 answer_type: str = "math", central: CentralDispatch | None = None,
                 seed: int | None = None, reward: str = "answer") -> list[Trajectory]:
    """Roll out one trajectory per entry of ``problems`` and grade it.

    Args:
        model, tok: the policy and its tokenizer (``model`` is only used to build the default engines).
        problems: dicts with ``id``, ``problem`` and (optional) ``answer``; repeat an entry for several samples.
        cfg: loop limits, sampling and scheduler settings.
        progress: optional callable(done, total) for progress reporting.
        engines: inference engines (engines.py); default ``default_engines(model, tok, cfg)``.
        tools: executes tool calls (``async run(code, stdin) -> sandbox.ExecResult``); default: the sandbox's
            batching client (``sandbox.shared_client``: the configured service, or the shared warm pool).
        answer_type: the grader of the default path (``grading.ANSWER_TYPES``) for problems without their own
            ``answer_type`` (an rl_data row carries its source's).
        reward_fn: ``(final_turn_text, gold) -> {"pred", "reward"}``; default: grading.score_trajectory in the
            killable grading workers. Truncated trajectories score 0 without it.
        reward: on that default path, the reward of the registry (``rl.reward``: ``"answer"`` or
            ``module:function``; rstar2.grading.rewards), run in the same workers.
        central: several training processes share one scheduler (``central.run_centrally``): every process
            calls with its own problems, process 0 rolls out all of them on ``engines`` (which every process must
            reach, e.g. vLLM servers) and each process gets its own trajectories back.
        seed: the default engines' sampling seed (``rstar2.seeds.derive`` of the run's seed and what this call
            is for); trajectory ``<problem id>#<n>`` then samples from its own stream. None: from torch's RNG.
            With ``cfg.reproducible`` also given to vLLM ``engines`` that have no seed (``seed_engines``).
    Returns:
        Trajectories in input order, graded (those without ``answer`` are not graded).
    """
    if central is not None and central.count > 1:
        return run_centrally(problems, lambda every: run_rollouts(
            model, tok, every, cfg, progress, engines=engines, tools=tools, reward_fn=reward_fn,
            answer_type=answer_type, seed=seed, reward=reward), central)
    owned_tools = tools is None
    if tools is None:
        tools = sandbox.shared_client(cfg.tool.limits())
    if engines is None:
        engines = default_engines(model, tok, cfg, seed)
    agent = AgentLoop(tok, cfg, tools)
    trajs = [agent.new_trajectory(p) for p in problems]
    scheduler = Scheduler(engines, agent, cfg.scheduler, cfg.max_response_tokens, cfg.kv_cache_tokens,
                          cfg.max_inflight_per_engine, reproducible=cfg.reproducible)

    async def main():
        try:
            return await scheduler.run(trajs, progress)
        finally:
            for e in engines:
                if hasattr(e, "aclose"):
                    await e.aclose()
    try:
        # vLLM engines built elsewhere (RL: the trainer's) seed this phase's turns from its seed
        with seed_engines(engines, seed if cfg.reproducible else None):
            run_async(main())
    finally:
        if owned_tools:
            tools.close()
    grade_all(trajs, reward_fn, [p.get("answer_type") or answer_type for p in problems], reward=reward)
    return trajs


def sample_groups(model, tok, problems: list[dict], k: int, cfg: RolloutConfig, progress=None,
                  **kwargs) -> list[list[Trajectory]]:
    """``k`` trajectories per problem (evaluation's avg@k, hard-problem mining, label verification, held-out
    evaluation): ``run_rollouts`` on each problem repeated ``k`` times, all in one scheduler run.

    Args:
        problems: as for ``run_rollouts``. k: samples per problem (>= 1). Other arguments go to ``run_rollouts``.
    Returns:
        One list of ``k`` trajectories per problem, in input order.
    Raises:
        ValueError: k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 samples per problem, got {k}")
    trajs = run_rollouts(model, tok, [p for p in problems for _ in range(k)], cfg, progress, **kwargs)
    return [trajs[i * k:(i + 1) * k] for i in range(len(problems))]
