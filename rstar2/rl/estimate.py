"""The time estimate ``snakemake -n`` prints per GPU stage: the config, the GPU table (rstar2/gpus.py)
and the memory plan's KV room fed into the throughput model (throughput.py). Pure arithmetic, no torch.

Which engines a stage has: an RL stage colocates one vLLM per training GPU (rollout.engine vllm, TRL colocate
mode); hard-problem mining and evaluation build one in-process vLLM (rstar2/rollout/__init__.py
``default_engines``) at vLLM's own default ``gpu_memory_utilization`` of 0.9, so they use one GPU of the generate
job however many it holds; rollout.engine server uses one engine per listed server.
"""

from __future__ import annotations

import math

from rstar2.gpus import GPUS, gpu_spec
from rstar2.rl import throughput as tp
from rstar2.rl.dag_checks import VLLM_DEFAULT_UTILIZATION
from rstar2.rl.memory_plan import GB, PROMPT_TOKENS, VLLM_OVERHEAD_BYTES, ModelShape, StagePlan


def _generate_engines(config: dict, gen_gpus: int) -> int:
    engine = config["rollout"]["engine"]
    return len(config["rollout"]["server_urls"]) if engine == "server" else 1 if gen_gpus >= 1 else 0


def generate_slots(shape: ModelShape, gpu_bytes: float, sequence: int) -> int:
    """KV room in sequences of an in-process vLLM of a generate job (mining, evaluation) on one GPU."""
    return tp.kv_slots(gpu_bytes, VLLM_DEFAULT_UTILIZATION, shape.params(), shape.kv_bytes_per_token(2),
                       VLLM_OVERHEAD_BYTES, sequence)


def _job_limit_warning(stage: str, seconds: float, dist: dict) -> list[str]:
    """A line when one RL stage is predicted to outlast its job's time limit (distributed.resources rl ``runtime``,
    minutes): the stage then needs that many submissions, each resuming from the last checkpoint."""
    res = {**dist["resources"]["default"], **dist["resources"].get("rl", {})}
    limit_s = 60 * res["runtime"] if res.get("runtime") else None
    if not limit_s or seconds <= limit_s:
        return []
    jobs = math.ceil(seconds / limit_s)
    return [f"  warning         {stage} is predicted to take {seconds / tp.HOUR:,.1f} h, over its job's time limit "
            f"(distributed.resources.rl.runtime {res['runtime']} min = {limit_s / tp.HOUR:,.1f} h): it needs {jobs} "
            f"submissions, each resuming from the last checkpoint; raise the limit or the profile's retries "
            f"(profiles/slurm: retries) to at least {jobs - 1}"]


def workflow_estimate(config: dict, stages: list[str], plans: list[StagePlan], shape: ModelShape, world_size: int,
                      gen_gpus: int) -> list[str]:
    """Printable lines: each RL stage's per-step phases, stage time and GPU-hours with its bottleneck (and advice
    where the rollout phase dominates on little KV room), mining and evaluation, and the run's total.

    config: the validated config; stages: the RL stages (stage1..3) of ``plans`` (memory_plan.workflow_plans, same
    order); world_size: GPUs of an RL job; gen_gpus: GPUs of a generate job (mining, evaluation)."""
    dist, rl, est = config["distributed"], config["rl"], config["distributed"]["estimate"]
    gpu = gpu_spec(dist)
    gpu_bytes = (dist.get("gpu_memory_gb") or gpu.memory_gb) * GB
    hw = tp.gpu_rates(gpu, est)
    N, kv = shape.params(), shape.kv_bytes_per_token(2)
    lines = [f"time estimate: {gpu.name} at {est['mfu']:.0%} MFU and {est['bandwidth_share']:.0%} of "
             f"{gpu.hbm_bytes_s / 1e12:.2f} TB/s; mean response {est['response_fill']:.0%} of the budget; "
             f"{est['tool_calls_per_rollout']:g} tool calls per rollout at {est['tool_latency_s']:g} s "
             "(distributed.estimate)"]
    total_s = total_gpu_h = 0.0
    for stage, plan in zip(stages, plans):
        if config["rollout"]["engine"] != "vllm" or not plan.concurrent_rollouts:
            lines.append(f"{plan.stage}: not estimated (rollout.engine {config['rollout']['engine']}: only the "
                         "colocated vLLM's KV room is planned)")
            continue
        cfg = rl["stages"][stage]
        s = tp.RLShape(rl["prompts_per_step"], rl["group_size"], rl["oversample"] if rl["mode"] == "grpo_roc" else 1,
                       PROMPT_TOKENS, cfg["max_response_tokens"], cfg["steps"])
        t = tp.rl_stage_time(plan.stage, N, kv, hw, world_size, plan.concurrent_rollouts, s, est,
                             dist["gradient_checkpointing"])
        lines += [*t.lines, *_job_limit_warning(plan.stage, t.seconds, dist)]
        sequence = PROMPT_TOKENS + s.max_response
        share = dist["vllm"]["gpu_memory_utilization"]
        server = (hw, tp.kv_slots(gpu_bytes, VLLM_DEFAULT_UTILIZATION, N, kv, VLLM_OVERHEAD_BYTES, sequence))
        bigger = [(tp.gpu_rates(g, est), tp.kv_slots(g.memory_gb * GB, share, N, kv, VLLM_OVERHEAD_BYTES, sequence),
                   g.memory_gb) for g in GPUS.values() if g.memory_gb * GB > gpu_bytes]
        lines += tp.advice(t, N, kv, world_size, s, est, bigger, server)
        total_s, total_gpu_h = total_s + t.seconds, total_gpu_h + t.gpu_hours
    engines = _generate_engines(config, gen_gpus)
    if engines and config["rollout"]["engine"] != "hf":
        hp, ev = config["hard_problems"], config["evaluate"]
        jobs = []
        if "stage3" in stages:
            problems = hp["subset_size"] or config["rl_data"]["limit"] or None
            jobs.append(("hard_problems", problems and problems * hp["k"], hp["max_response_tokens"], 1,
                         "problems known after rl_data"))
        if ev["models"]:
            per_model = ev["limit"] * ev["k"] * len(ev["benchmarks"]) if ev["limit"] else None
            jobs.append((f"evaluate (each of {len(ev['models'])} models)", per_model, ev["max_response_tokens"],
                         len(ev["models"]), "benchmark sizes known at run time"))
        for name, rollouts, budget, times, unknown in jobs:
            slots = generate_slots(shape, gpu_bytes, PROMPT_TOKENS + budget)
            if slots < 1:
                continue   # refused by rstar2/rl/dag_checks.py
            t = tp.generate_time(name, N, kv, hw, engines, max(gen_gpus, engines), slots, rollouts, PROMPT_TOKENS,
                                 budget, est, unknown)
            lines += t.lines
            if rollouts is not None:
                total_s, total_gpu_h = total_s + times * t.seconds, total_gpu_h + times * t.gpu_hours
    lines.append(f"time estimate total: {total_s / tp.HOUR:,.1f} h wall ({total_s / 86400:.1f} days), "
                 f"{total_gpu_h:,.0f} GPU-hours for the estimated stages (SFT and stages of unknown size not counted)")
    return lines
