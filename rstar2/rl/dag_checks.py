"""What a GPU cluster would reject hours into a run, refused at DAG time instead: token budgets beyond
the model's context window, batch shapes the training processes cannot split evenly, and generation budgets whose
KV cache does not fit next to the weights in vLLM. Pure arithmetic (no torch); the workflow calls ``refusals``
beside the memory plan (workflow/rules/common.smk). Each refusal is one line naming the setting and the limit.
"""

from __future__ import annotations

import json
from pathlib import Path

from rstar2.gpus import memory_bytes
from rstar2.rl.memory_plan import GB, KNOWN_MODELS, PROMPT_TOKENS, VLLM_OVERHEAD_BYTES, ModelShape, model_shape

VLLM_DEFAULT_UTILIZATION = 0.9   # vllm.AsyncEngineArgs.gpu_memory_utilization when not given (vLLM's default)
# max_position_embeddings of the hub models' config.json (huggingface.co/Qwen/<name>/blob/main/config.json): the
# -Base models were trained to 32,768 tokens, the post-trained ones to 40,960
KNOWN_CONTEXT = {**{f"Qwen/Qwen3-{n}-Base": 32768 for n in ("4B", "8B", "14B")},
                 **{f"Qwen/Qwen3-{n}": 40960 for n in ("4B", "8B", "14B", "32B")}}


def context_window(model_cfg: dict, base_model_dir: str | Path) -> tuple[int | None, str]:
    """(max_position_embeddings, whose) of a ``model`` section: from the config.json memory_plan.model_shape reads,
    else ``KNOWN_CONTEXT`` for a hub id; (None, "") when unknown yet."""
    _, source = model_shape(model_cfg, base_model_dir)
    path = Path(source) / "config.json"
    if path.is_file():
        cfg = json.loads(path.read_text())
        n = (cfg.get("text_config") or cfg).get("max_position_embeddings")
        return (int(n), f"{path}") if n else (None, "")
    hub = model_cfg.get("hub_id")
    return (KNOWN_CONTEXT[hub], f"{hub}'s config.json") if hub in KNOWN_CONTEXT else (None, "")


def vllm_fit(shape: ModelShape, gpu_bytes: float, sequence: int) -> tuple[bool, int]:
    """Whether one ``sequence``-token KV cache fits in an in-process vLLM at its default utilisation next to the bf16
    weights and overhead, and the most tokens that do."""
    room = VLLM_DEFAULT_UTILIZATION * gpu_bytes - 2.0 * shape.params() - VLLM_OVERHEAD_BYTES
    most = max(0, int(room // shape.kv_bytes_per_token(2)))
    return most >= sequence, most


def _gen_budgets(config: dict, stages: list[str]) -> list[tuple[str, int, int, str]]:
    """(setting, response budget, prompt allowance, which model) of every generating GPU stage."""
    rl_prompt = config["rl_data"]["max_prompt_tokens"] or PROMPT_TOKENS
    out = [(f"rl.stages.{s}.max_response_tokens", config["rl"]["stages"][s]["max_response_tokens"], rl_prompt,
            "policy") for s in stages]
    if "stage3" in stages:
        out.append(("hard_problems.max_response_tokens", config["hard_problems"]["max_response_tokens"], rl_prompt,
                    "policy"))
    if config["evaluate"]["models"]:
        out.append(("evaluate.max_response_tokens", config["evaluate"]["max_response_tokens"], PROMPT_TOKENS, "policy"))
    lv = config["label_verification"]
    if lv["enabled"]:
        out.append(("label_verification.max_response_tokens", lv["max_response_tokens"], rl_prompt,
                    "verifier" if lv["model"] else "policy"))
    return out


def refusals(config: dict, stages: list[str], gpus: dict[str, int], base_model_dir: str | Path) -> list[str]:
    """One line per setting a cuda run would fail on (none on cpu).

    gpus: GPUs per job of the families "rl", "sft", "generate" (resources gpu x nodes). Prompt allowance: the RL data's
    ``rl_data.max_prompt_tokens`` (the memory plan's PROMPT_TOKENS when 0) for RL, mining and label verification,
    PROMPT_TOKENS for evaluation (its prompts are not filtered)."""
    dist = config["distributed"]
    if dist["device"] != "cuda":
        return []
    out = []
    models = {"policy": config["model"]}
    if config["label_verification"]["enabled"] and config["label_verification"]["model"]:
        models["verifier"] = config["label_verification"]["model"]
    ctx = {k: context_window(m, base_model_dir if k == "policy" else "/nonexistent") for k, m in models.items()}
    shapes = {k: model_shape(m, base_model_dir if k == "policy" else "/nonexistent")[0] for k, m in models.items()}
    shapes["verifier"] = shapes.get("verifier") or KNOWN_MODELS.get((models.get("verifier") or {}).get("hub_id"))
    gpu_bytes = memory_bytes(dist)
    for setting, budget, prompt, who in _gen_budgets(config, stages):
        (limit, whose), total = ctx[who], budget + prompt
        if limit and total > limit:
            out.append(f"{setting}: {budget} + {prompt} prompt tokens = {total} exceeds the context window of "
                       f"{limit} tokens (max_position_embeddings, {whose}): lower it to at most {limit - prompt}")
        generate = not setting.startswith("rl.stages") and config["rollout"]["engine"] == "vllm"
        if generate and shapes.get(who) is not None:
            fits, most = vllm_fit(shapes[who], gpu_bytes, total)
            if not fits:
                out.append(f"{setting}: {budget} + {prompt} prompt tokens = {total}: the KV cache of one sequence "
                           f"needs {total * shapes[who].kv_bytes_per_token(2) / GB:.1f} GB, vLLM's "
                           f"{VLLM_DEFAULT_UTILIZATION} x {gpu_bytes / GB:.0f} GB leaves room for {most} tokens next "
                           f"to the bf16 weights of {shapes[who].name}: lower it to at most {max(0, most - prompt)}, "
                           "or use a larger distributed.gpu")
    vllm = dist["vllm"]
    limit, whose = ctx["policy"]
    if config["rollout"]["engine"] == "vllm" and vllm["max_model_length"]:
        if limit and vllm["max_model_length"] > limit:
            out.append(f"distributed.vllm.max_model_length: {vllm['max_model_length']} exceeds the context window "
                       f"of {limit} tokens (max_position_embeddings, {whose})")
        longest = max((b + p for s, b, p, _ in _gen_budgets(config, stages) if s.startswith("rl.stages")), default=0)
        if vllm["max_model_length"] < longest:
            out.append(f"distributed.vllm.max_model_length: {vllm['max_model_length']} is less than the longest RL "
                       f"rollout ({longest} prompt + response tokens): raise it to at least {longest}")
    if limit and config["sft"]["max_length"] > limit:
        out.append(f"sft.max_length: {config['sft']['max_length']} exceeds the context window of {limit} tokens "
                   f"(max_position_embeddings, {whose})")
    n = gpus.get("rl", 0)
    if n > 1 and config["rl"]["prompts_per_step"] % n:
        out.append(f"rl.prompts_per_step: {config['rl']['prompts_per_step']} does not split into whole groups over "
                   f"the {n} training processes (distributed.resources.rl gpu x nodes): use a multiple of {n}")
    n, sft = gpus.get("sft", 0), config["sft"]
    if n > 1 and sft["batch_size"] % (sft["grad_accum"] * n):
        out.append(f"sft.batch_size: {sft['batch_size']} is not a multiple of sft.grad_accum ({sft['grad_accum']}) x "
                   f"the {n} training processes (distributed.resources.sft gpu x nodes) = {sft['grad_accum'] * n}")
    return out
