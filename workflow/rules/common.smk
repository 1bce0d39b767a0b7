# Config validation and the per-stage parameter sets. Each rule receives only its own section as
# JSON in `params`, so editing one stage's settings reruns that stage and what depends on it, nothing else.

import json
import os
import sys

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

# Jobs inherit this environment: put the bin folder of the interpreter running snakemake first on PATH, so
# the `rstar2` CLI of its virtual environment is found even when the venv was not activated.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

# RL stages run in order; a null stage ends the pipeline at the one before (configs/cpu-learning.yaml runs stage 1).
RL_STAGES = [s for s in ("stage1", "stage2", "stage3") if config["rl"]["stages"].get(s)]
if RL_STAGES != ["stage1", "stage2", "stage3"][: len(RL_STAGES)]:
    raise ValueError(f"config: rl.stages must enable stage1, stage1-2 or stage1-3 in order; enabled: {RL_STAGES}")

MODEL_DIRS = {
    "base": "results/base_model",
    "sft": "results/sft",
    **{f"rl_{s}": f"results/rl/{s}" for s in RL_STAGES},
}


def _check_benchmark_names():
    known = set(config["benchmarks"])
    heldout = config["rl"]["heldout"]["benchmark"]
    if heldout is not None and heldout not in known:
        raise ValueError(f"config: rl.heldout.benchmark names benchmark {heldout!r}, which is not defined under "
                         f"'benchmarks' (defined: {sorted(known)})")
    for m in config["evaluate"]["models"]:
        if m not in MODEL_DIRS:
            raise ValueError(f"config: evaluate.models names {m!r}, which this run does not train "
                             f"(models: {sorted(MODEL_DIRS)}; rl.stages enables {RL_STAGES})")
    for key in ("rl_data.decontaminate_against", "evaluate.benchmarks"):
        section, field = key.split(".")
        for name in config[section][field]:
            if name not in known:
                raise ValueError(
                    f"config: {key} names benchmark {name!r}, which is not defined under "
                    f"'benchmarks' (defined: {sorted(known)})"
                )


_check_benchmark_names()


def _check_heldout_benchmark():
    """The RL held-out benchmark is read only when RL starts (after SFT); read it now so a bad file fails first."""
    name = config["rl"]["heldout"]["benchmark"]
    if name is None:
        return
    from rstar2.data.benchmarks import load_benchmark

    try:
        heldout = load_benchmark(name, config["benchmarks"][name])
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"config: rl.heldout.benchmark {name!r} cannot be loaded: {e}") from None
    answer_type = config["benchmarks"][name].get("answer_type", "math")
    if answer_type != "integer":
        # RL rewards always use the integer grader; a lenient grader on the held-out set can count what the
        # reward does not (an unevaluated expression boxed as the answer scores 1 under Math-Verify)
        print(f"warning: rl.heldout.benchmark {name!r} is graded with answer_type {answer_type!r}, the RL reward "
              f"with 'integer': set benchmarks.{name}.answer_type: integer to measure what RL trains for",
              file=sys.stderr)
    if name in config["rl_data"]["decontaminate_against"]:
        return  # rl_data removes its problems (and near-copies) from the training data
    from rstar2.data.loaders import load_source
    from rstar2.rl.heldout import check_disjoint

    for src in config["rl_data"]["sources"]:
        try:
            check_disjoint(heldout, load_source(src), name, f"rl_data source {src.get('name', src.get('path'))!r}")
        except ValueError as e:
            raise ValueError(f"config: {e}") from None


_check_heldout_benchmark()


def as_json(obj):
    return json.dumps(obj, sort_keys=True)


def base_model_params():
    return as_json({**config["model"], "seed": config["seed"]})


def sft_data_params():
    return as_json({**config["sft_data"], "tool_name": config["tool"]["name"],
                    "tool_timeout_s": config["tool"]["timeout_s"],
                    "max_tool_chars": config["tool"]["max_output_chars"],
                    "seed": config["seed"]})


def _trainer():
    # The training settings of the distributed section that can change results (device, precision, vLLM);
    # the launcher and resources cannot, so they are not params and changing them reruns nothing.
    d = config["distributed"]
    return {"trainer": {k: d[k] for k in ("device", "bf16", "gradient_checkpointing", "vllm")}}


def sft_params():
    return as_json({**config["sft"], **_trainer(), "seed": config["seed"]})


def launch(family):
    """The command that runs `rstar2 <stage>` for a training rule: `rstar2` itself (one process) or e.g.
    `accelerate launch --config_file configs/accelerate/fsdp.yaml -m rstar2.cli` (several)."""
    return config["distributed"]["launch"][family]


def job_resources(family):
    """Snakemake resources of one family of rules: distributed.resources `default` merged with the family's."""
    res = config["distributed"]["resources"]
    return {**res["default"], **res.get(family, {})}


def _local(paths):
    # Local dataset files are inputs, so editing one reruns the stages that read it; hub ids are not files.
    # A missing file fails here, at parse time: otherwise Snakemake may keep the outputs built from the old
    # file and never schedule the stage that would report it.
    local = [p for p in paths if p and not str(p).startswith("hub:")]
    missing = [p for p in local if not os.path.exists(p)]
    if missing:
        raise ValueError(f"config: data file(s) not found (paths are relative to {os.getcwd()}): {missing}")
    return local


def rl_data_files():
    return _local([s["path"] for s in config["rl_data"]["sources"]]
                  + [config["benchmarks"][b]["path"] for b in config["rl_data"]["decontaminate_against"]])


def sft_data_files():
    return _local([s.get("path") for s in config["sft_data"].values() if s and s.get("limit", 1) != 0])


def benchmark_files():
    return _local([config["benchmarks"][b]["path"] for b in config["evaluate"]["benchmarks"]])


def rl_data_params():
    # only the benchmarks it decontaminates against: adding an evaluation benchmark must not rerun curation
    rl = config["rl_data"]
    return as_json({**rl, "benchmarks": {b: config["benchmarks"][b] for b in rl["decontaminate_against"]},
                    "seed": config["seed"]})


def verifier_model_params():
    return as_json({**(config["label_verification"]["model"] or {}), "seed": config["seed"]})


def _verifier_dir():
    # null model = verify with the base model (no second copy); otherwise the verifier_model rule materialises it.
    lv = config["label_verification"]
    if not lv["enabled"]:
        return None
    return "results/verifier_model" if lv["model"] else "results/base_model"


def verifier_inputs():
    return [f"{_verifier_dir()}/manifest.json"] if _verifier_dir() else []


def verifier_model_arg():
    return f"--model {_verifier_dir()}/model" if _verifier_dir() else ""


def label_verification_params():
    lv = config["label_verification"]
    return as_json({"enabled": lv["enabled"], "samples": lv["samples"], "min_matches": lv["min_matches"],
                    "only_sources": lv["only_sources"], **_tools(),
                    "rollout": _rollout(lv, lv["temperature"], lv["top_p"], lv["batch_size"]),
                    "seed": config["seed"]})


def _tools():
    # The tool's wire settings, for every stage that rolls out. How the sandbox runs (isolation, pool size,
    # batching, service URL) does not change results, so it travels in the environment, not in params:
    # changing it reruns nothing (see RSTAR2_SANDBOX below).
    return {"tool": config["tool"]}


# Set by the workflow itself, not required from the user, hence no `envvars:` declaration. Jobs on other nodes
# (cluster executors) that do not inherit it run the sandbox with its defaults.
os.environ.update(RSTAR2_SANDBOX=json.dumps(config["sandbox"]))  # read by `rstar2 <stage>` (rstar2/cli.py)


def _rollout(section, temperature, top_p, batch_size):
    return {"max_response_tokens": section["max_response_tokens"], "max_turns": section["max_turns"],
            "temperature": temperature, "top_p": top_p, "batch_size": batch_size, **config.get("rollout", {})}


def continues_optimizer(stage):
    """Whether an RL stage starts from the previous stage's optimizer state (rl.stages.stageN.continue_optimizer;
    stage 1 has no previous stage)."""
    return stage != "stage1" and stage in RL_STAGES and config["rl"]["stages"][stage]["continue_optimizer"]


def rl_params(stage, ablation=None):
    """One RL stage's params; `ablation` = (mode, seed) gives an ablation run of stage 1: that mode and seed,
    and the ablation's own steps and held-out settings where set."""
    rl, ab = config["rl"], config["ablation"]
    st = rl["stages"][stage]
    shared = {k: v for k, v in rl.items()
              if k not in ("stages", "temperature", "top_p", "batch_size", "heldout", "micro_batch_tokens")}
    following = {"stage1": "stage2", "stage2": "stage3"}.get(stage)
    optimizer = {"continue_optimizer": bool(not ablation and continues_optimizer(stage)),
                 "save_optimizer": bool(not ablation and following and continues_optimizer(following)),
                 "micro_batch_tokens": rl["micro_batch_tokens"][config["distributed"]["device"]]}
    ho = dict(rl["heldout"])
    mode, seed, steps = rl["mode"], config["seed"], st["steps"]
    if ablation:
        mode, seed, steps = ablation[0], int(ablation[1]), ab["steps"] or steps
        ho.update({k: ab[f"heldout_{k}"] for k in ("every", "limit") if ab[f"heldout_{k}"] is not None})
    heldout = {**ho, "spec": config["benchmarks"][ho["benchmark"]]} if ho["benchmark"] else None
    return as_json({**shared, **optimizer, "mode": mode, "name": f"rl_{stage}", "steps": steps,
                    **_tools(), **_trainer(), "heldout": heldout,
                    "rollout": _rollout(st, rl["temperature"], rl["top_p"], rl["batch_size"]),
                    "seed": seed})


def _rl_memory_plan():
    """The memory plan of each RL stage on its GPUs (rstar2/rl/memory_plan.py), printed at parse time so that
    `snakemake -n` shows it; a config that cannot fit stops here, before any job is queued."""
    from rstar2.rl import memory_plan

    res = job_resources("rl")
    gpus = res.get("gpu", 0) * res.get("nodes", 1)
    plans, notice = memory_plan.workflow_plans(config, RL_STAGES, gpus, memory_plan.accelerate_config(launch("rl")),
                                               "results/base_model")
    if notice:
        print(notice, file=sys.stderr)
    for plan in plans:
        print("memory plan " + "\n".join(plan.lines), file=sys.stderr)
    errors = [f"{plan.stage}: {e}" for plan in plans for e in plan.errors]
    if errors:
        raise ValueError("config: the RL memory plan does not fit (rstar2/rl/memory_plan.py):\n  " + "\n  ".join(errors))


def optimizer_from_arg(stage):
    """` --optimizer-from <previous stage>/optimizer` for a stage that continues its optimizer (paper §4.3)."""
    previous = {"stage2": "stage1", "stage3": "stage2"}[stage]
    return f" --optimizer-from results/rl/{previous}/optimizer" if continues_optimizer(stage) else ""


def heldout_files():
    b = config["rl"]["heldout"]["benchmark"]
    return _local([config["benchmarks"][b]["path"]]) if b else []


def ablation_runs():
    """{(mode, seed): run folder} of the ablation (every mode with every seed)."""
    ab = config["ablation"]
    if bool(ab["modes"]) != bool(ab["seeds"]):
        raise ValueError(f"config: ablation needs both modes and seeds (got modes {ab['modes']}, seeds {ab['seeds']}); "
                         "with one of them empty no run would be planned")
    return {(m, s): f"results/ablation/{m}-seed{s}" for m in ab["modes"] for s in ab["seeds"]}


def hard_problems_params():
    hp, rl = config["hard_problems"], config["rl"]
    return as_json({"k": hp["k"], "subset_size": hp["subset_size"], **_tools(),
                    "rollout": _rollout(hp, rl["temperature"], rl["top_p"], rl["batch_size"]),
                    "seed": config["seed"]})


def evaluate_params():
    ev = config["evaluate"]
    return as_json({"benchmarks": {b: config["benchmarks"][b] for b in ev["benchmarks"]},
                    "limit": ev["limit"], "k": ev["k"], **_tools(),
                    "rollout": _rollout(ev, ev["temperature"], ev["top_p"], ev["batch_size"]),
                    "seed": config["seed"]})


def model_manifest(wildcards):
    return f"{MODEL_DIRS[wildcards.model]}/manifest.json"


def model_dir(wildcards):
    return f"{MODEL_DIRS[wildcards.model]}/model"


def report_inputs():
    stages = {s: f"results/rl/{s}" for s in RL_STAGES}
    evals = {m: f"results/eval/{m}" for m in config["evaluate"]["models"]}
    ablation = [{"mode": m, "seed": s, "dir": d} for (m, s), d in ablation_runs().items()]
    # not sorted: the report lists models in the configured order
    return json.dumps({"rl_stages": stages, "eval": evals, "rl_data": "results/rl_data", "ablation": ablation})


def report_manifests():
    return ([f"results/eval/{m}/manifest.json" for m in config["evaluate"]["models"]]
            + [f"results/rl/{s}/manifest.json" for s in RL_STAGES]
            + [f"{d}/manifest.json" for d in ablation_runs().values()] + ["results/rl_data/manifest.json"])


def all_manifests():
    stages = ["base_model", "sft_data", "sft", "rl_candidates", "rl_data", *[f"rl/{s}" for s in RL_STAGES],
              *(["hard_problems"] if "stage3" in RL_STAGES else []), "report"]
    evals = [f"eval/{m}" for m in config["evaluate"]["models"]]
    verifier = ["verifier_model"] if _verifier_dir() == "results/verifier_model" else []
    ablation = [f"{d}/manifest.json" for d in ablation_runs().values()]
    return [f"results/{s}/manifest.json" for s in stages + verifier + evals] + ablation


_rl_memory_plan()
