"""Time and GPU-hours of the GPU stages, predicted from the config before anything runs.

Pure arithmetic (no torch), beside the memory plan (memory_plan.py), whose KV room it uses; the workflow prints it at
parse time (workflow/rules/common.smk), so ``snakemake -n`` shows it per stage. Units: seconds, bytes, FLOP.

One RL step (paper §2.2, §3.2) is a rollout phase, then an update phase (colocated: the same GPUs do both in turn):
  * rollout, per engine (one GPU): R = its share of the step's rollouts, C = min(R, KV room in sequences of
    prompt + max_response_tokens, the load-balanced scheduler's K, paper §3.2, Fig. 7). A decode step reads the bf16 weights
    and the batch's KV cache once: t = max((2N + C * ctx * kv_bytes) / bandwidth, 2N * C / FLOP/s), ctx = prompt +
    half the mean response. A rollout holds its slot for mean_response decode steps plus its tool calls' latency
    (tool_calls_per_rollout x tool_latency_s; the service's figure, paper Fig. 6). Continuous batching: the phase
    takes R / C slot-lengths, plus the tail of one longest rollout (max - mean response steps at batch 1), plus the
    prefill of every prompt at 2N FLOP per token;
  * update: (6 + 2 with gradient checkpointing's recomputed forward) x N FLOP per trained token over all GPUs at the
    MFU; trained tokens = prompts x G kept rollouts x (prompt + mean response). No reference-model or old-policy
    forward: beta = 0 and num_iterations = 1 (rstar2/rl/trainer.py), so the ratio's old log-probs are the
    detached current ones. Weight sync to vLLM and sleep/wake are not counted.
Mining and evaluation are rollout phases alone on their engines. Efficiencies (MFU, bandwidth share) and the mean
response length are assumptions of ``distributed.estimate``; nothing here was measured on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0


@dataclass(frozen=True)
class Rates:
    """What one device reaches: ``read_bytes_s`` bytes read per second by a decode step, ``flops`` FLOP/s of training
    and prefill (both after efficiencies: datasheet peak x share, or measured)."""
    name: str
    read_bytes_s: float
    flops: float


def gpu_rates(gpu, estimate: dict) -> Rates:
    """Rates of a rstar2.gpus.GPU under ``distributed.estimate`` (bandwidth_share, mfu)."""
    return Rates(gpu.name, gpu.hbm_bytes_s * estimate["bandwidth_share"], gpu.bf16_flops * estimate["mfu"])


def decode_step_s(n_params: float, kv_bytes_token: float, batch: int, context: float, hw: Rates,
                  weight_bytes: int = 2) -> float:
    """Seconds of one decode step of ``batch`` sequences of mean ``context`` tokens: the larger of reading the
    weights (``weight_bytes`` per parameter) plus the batch's KV cache, and 2N FLOP per sequence."""
    read = (weight_bytes * n_params + batch * context * kv_bytes_token) / hw.read_bytes_s
    return max(read, 2.0 * n_params * batch / hw.flops)


@dataclass(frozen=True)
class Rollout:
    """One engine's rollout phase: ``seconds`` and its parts, the batch ``slots`` used and what limits it."""
    seconds: float
    decode_s: float
    tool_s: float
    prefill_s: float
    tail_s: float
    slots: int
    bottleneck: str


def rollout_phase(n_params: float, kv_bytes_token: float, hw: Rates, rollouts: int, kv_slots: int, prompt: int,
                  mean_response: float, max_response: int, tool_calls: float, tool_latency_s: float) -> Rollout:
    """The rollout phase of one engine (module docstring). rollouts: R on this engine; kv_slots: sequences of
    prompt + max_response its KV cache holds.

    Raises:
        ValueError: kv_slots < 1 (not even one rollout fits; the memory plan names the setting).
    """
    if kv_slots < 1:
        raise ValueError("KV cache holds no rollout of prompt + max_response_tokens")
    c = max(1, min(rollouts, kv_slots))
    step = decode_step_s(n_params, kv_bytes_token, c, prompt + mean_response / 2, hw)
    waves = rollouts / c
    decode, tool = waves * mean_response * step, waves * tool_calls * tool_latency_s
    tail = (max_response - mean_response) * decode_step_s(n_params, kv_bytes_token, 1, prompt + max_response, hw)
    prefill = rollouts * 2.0 * n_params * prompt / hw.flops
    if c < rollouts:
        why = f"KV room for {c} sequences per GPU ({rollouts} rollouts each: {waves:.1f} waves)"
    elif tool > decode:
        why = f"tool-call latency ({tool_calls:g} calls x {tool_latency_s:g} s per rollout)"
    else:
        why = f"decode at batch {c} ({'compute' if 2.0 * n_params * c / hw.flops >= step else 'memory'} bound)"
    return Rollout(decode + tool + prefill + tail, decode, tool, prefill, tail, c, why)


def update_s(n_params: float, tokens: float, gpus: int, hw: Rates, checkpointing: bool) -> float:
    """Seconds of one update over ``tokens`` trained tokens on ``gpus`` GPUs: (6 + 2 x checkpointing) N FLOP/token."""
    return (8.0 if checkpointing else 6.0) * n_params * tokens / (gpus * hw.flops)


def _h(s: float) -> str:
    return f"{s / HOUR:.2f} h" if s >= HOUR else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


@dataclass(frozen=True)
class StageTime:
    """Prediction for one GPU stage: wall ``seconds``, ``gpu_hours`` (GPUs held x wall), printable ``lines``."""
    stage: str
    seconds: float
    gpu_hours: float
    rollout_s: float
    update_s: float
    bottleneck: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class RLShape:
    """What one RL stage does per step: prompts x G kept of prompts x G x oversample drawn; budgets in tokens."""
    prompts: int
    group_size: int
    oversample: int
    prompt_tokens: int
    max_response: int
    steps: int


def rl_stage_time(stage: str, n_params: float, kv_bytes_token: float, hw: Rates, gpus: int, kv_slots: int,
                  s: RLShape, estimate: dict, checkpointing: bool) -> StageTime:
    """Wall time of an RL stage whose ``gpus`` each run one colocated engine of ``kv_slots`` sequences, then train.

    Returns the StageTime; ``lines`` name the per-step phases, the stage total and the GPU-hours."""
    mean = estimate["response_fill"] * s.max_response
    drawn = s.prompts * s.group_size * s.oversample
    per_gpu = -(-drawn // gpus)
    r = rollout_phase(n_params, kv_bytes_token, hw, per_gpu, kv_slots, s.prompt_tokens, mean, s.max_response,
                      estimate["tool_calls_per_rollout"], estimate["tool_latency_s"])
    u = update_s(n_params, s.prompts * s.group_size * (s.prompt_tokens + mean), gpus, hw, checkpointing)
    step = r.seconds + u
    total = step * s.steps
    main = "rollout" if r.seconds >= u else "update"
    why = f"rollout: {r.bottleneck}" if main == "rollout" else "update: FLOPs at the stated MFU"
    lines = (f"{stage}: {gpus} x {hw.name}, {drawn:,} rollouts per step ({per_gpu:,} per GPU, mean response "
             f"{mean:,.0f} of {s.max_response:,} tokens)",
             f"  per step        rollout {_h(r.seconds)} (decode {_h(r.decode_s)}, tool calls {_h(r.tool_s)}, "
             f"prefill {_h(r.prefill_s)}, tail {_h(r.tail_s)}) + update {_h(u)} = {_h(step)}",
             f"  stage           {s.steps} steps = {_h(total)} = {gpus * total / HOUR:,.0f} GPU-hours; "
             f"bottleneck {why}")
    return StageTime(stage, total, gpus * total / HOUR, r.seconds, u, why, lines)


def generate_time(stage: str, n_params: float, kv_bytes_token: float, hw: Rates, engines: int, gpus_held: int,
                  kv_slots: int, rollouts: int | None, prompt: int, max_response: int, estimate: dict,
                  unknown: str = "count known at run time") -> StageTime:
    """A rollout-only stage (hard-problem mining, evaluation) on ``engines`` engines while the job holds
    ``gpus_held`` GPUs. rollouts: the stage's total, or None when unknown at DAG time (then per 1,000 rollouts)."""
    n = rollouts if rollouts is not None else 1000
    mean = estimate["response_fill"] * max_response
    r = rollout_phase(n_params, kv_bytes_token, hw, -(-n // engines), kv_slots, prompt, mean, max_response,
                      estimate["tool_calls_per_rollout"], estimate["tool_latency_s"])
    what = f"{rollouts:,} rollouts" if rollouts is not None else f"per 1,000 rollouts ({unknown})"
    idle = f"; {gpus_held - engines} of the job's {gpus_held} GPUs idle" if gpus_held > engines else ""
    lines = (f"{stage}: {what} on {engines} engine(s) of {hw.name}, {r.slots} sequences of {prompt + max_response:,}"
             f" tokens each = {_h(r.seconds)} = {gpus_held * r.seconds / HOUR:,.1f} GPU-hours; bottleneck "
             f"rollout: {r.bottleneck}{idle}",)
    return StageTime(stage, r.seconds, gpus_held * r.seconds / HOUR, r.seconds, 0.0, r.bottleneck, lines)


def kv_slots(gpu_bytes: float, utilization: float, n_params: float, kv_bytes_token: float, overhead: float,
             sequence: int) -> int:
    """Sequences of ``sequence`` tokens in the KV cache of a vLLM given ``utilization`` of a GPU (bf16 weights and
    ``overhead`` bytes come first); 0 when not even one fits."""
    return max(0, int((utilization * gpu_bytes - 2.0 * n_params - overhead) // kv_bytes_token) // sequence)


def advice(t: StageTime, n_params: float, kv_bytes_token: float, gpus: int, s: RLShape, estimate: dict,
           alternatives: list[tuple[Rates, int, int]], server: tuple[Rates, int] | None) -> list[str]:
    """What else would give a rollout-dominated, KV-limited stage: ``server``'s (rates, KV slots of one whole GPU)
    with a quarter or half of the GPUs serving and the rest training (trl vllm-serve, rollout.engine server), and
    each of ``alternatives`` (rates, KV slots of that GPU, its memory in GB) on as many GPUs. Empty when the rollout
    phase is under half the step or not limited by KV room."""
    if t.rollout_s < t.update_s or not t.bottleneck.startswith("rollout: KV room"):
        return []
    out, ckpt = [], t.update_s > 0
    mean = estimate["response_fill"] * s.max_response
    tokens = s.prompts * s.group_size * (s.prompt_tokens + mean)
    drawn = s.prompts * s.group_size * s.oversample

    def step(hw, engines, slots, trainers):
        r = rollout_phase(n_params, kv_bytes_token, hw, -(-drawn // engines), slots, s.prompt_tokens, mean,
                          s.max_response, estimate["tool_calls_per_rollout"], estimate["tool_latency_s"])
        return r.seconds + update_s(n_params, tokens, trainers, hw, ckpt), r.slots
    if server is not None and gpus >= 2:
        for k in sorted({max(1, gpus // 4), max(1, gpus // 2)}):
            sec, c = step(server[0], k, server[1], gpus - k)
            out.append(f"  advice          server mode, {k} GPUs serving ({c} sequences each) + {gpus - k} training: "
                       f"{_h(sec)} per step, {_h(sec * s.steps)} for the stage ({t.seconds / (sec * s.steps):.2f}x)")
    for hw, slots, gb in alternatives:
        if slots >= 1:
            sec, c = step(hw, gpus, slots, gpus)
            out.append(f"  advice          {gpus} x {hw.name} (distributed.gpu, {gb:.0f} GB: {c} sequences each): "
                       f"{_h(sec)} per step, {_h(sec * s.steps)} for the stage ({t.seconds / (sec * s.steps):.2f}x)")
    return out
