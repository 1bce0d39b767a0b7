# Config validation, the checks that must fail before any job runs, and each rule's parameters. Each rule
# receives only its own stage's parameters as JSON (rstar2/stages/params.py builds them from the validated config),
# so editing one stage's settings reruns that stage and what depends on it, nothing else.

import json
import os
import re
import sys

from rstar2.io import ParamsJSON, file_sha256
from rstar2.rl.checkpoints import checkpoint_root
from rstar2.stages import interrupts
from rstar2.reproduce import code_version
from rstar2.params import to_dict as params_dict
from rstar2.stages import params as stage_params
from rstar2.config_schema import validate_config
from rstar2.workflow_checks import check_before_jobs, check_data_files


def refusing(check, *args, **kwargs):
    """``check(*args, **kwargs)``; a ValueError it raises (a refused config: ``config: ...``, one line) is printed
    alone on stderr and ends snakemake with exit status 1. Snakemake prints any Exception raised while it reads
    these files as "ValueError in file ..., line N:" with the message and a traceback (snakemake/exceptions.py
    print_exception; its own WorkflowError too); SystemExit is not an Exception, so its handlers (cli.main and
    the API catch Exception) let it through and Python exits with its status, printing nothing more.
    RSTAR2_TRACEBACK=1 leaves the ValueError to Snakemake, with its traceback (as rstar2/cli.py does)."""
    try:
        return check(*args, **kwargs)
    except ValueError as e:
        if os.environ.get("RSTAR2_TRACEBACK"):
            raise
        print(e, file=sys.stderr)
        raise SystemExit(1) from None


# A refused value is one line naming its key (Snakemake's own validate prints the whole schema and config).
refusing(validate_config, config, os.path.join(workflow.basedir, "workflow/schemas/config.schema.yaml"),
         [os.path.join(workflow.basedir, "config.yaml"), *workflow.overwrite_configfiles,
          dict(workflow.config_settings.config)])

# Jobs inherit this environment: put the bin folder of the interpreter running snakemake first on PATH, so
# the `rstar2` CLI of its virtual environment is found even when the venv was not activated.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

# How the sandbox runs (isolation, pool size, batching, service URL) does not change results, so it travels in
# the environment, not in params: changing it reruns nothing. Read by `rstar2 <stage>` (rstar2/cli.py). Jobs on
# other nodes that do not inherit it run the sandbox with its defaults.
os.environ.update(RSTAR2_SANDBOX=json.dumps(config["sandbox"]))
# Nor does how often an RL run checkpoints (rl.checkpoint_every): `rstar2 rl` reads it from here (a job on another
# node parses this file again and sets it there too).
os.environ.update(RSTAR2_CHECKPOINT_EVERY=str(config["rl"]["checkpoint_every"]))
# Nor does when an RL run stops for failing infrastructure (rl.faults): RSTAR2_RL_FAULTS, read by `rstar2 rl`.
os.environ.update(RSTAR2_RL_FAULTS=json.dumps(config["rl"]["faults"]))

# Every check that must fail before any job runs (names, stage order, ablation shape, data files, held-out
# benchmark, RL and SFT sources, rl.reward, benchmarks): rstar2/workflow_checks.py check_before_jobs, which the
# tests call directly. The slow ones (loading sources) are cached by the files' size and mtime.
RL_STAGES, MODEL_DIRS, ABLATION_RUNS = refusing(check_before_jobs, config, ".snakemake/rstar2_checks")


def report_provenance():
    """What the report names under its title: the config files in merge order with a digest of each, the --config
    overrides and the code's git commit (rstar2.stages.params.report)."""
    files = [os.path.join(workflow.basedir, "config.yaml"), *workflow.overwrite_configfiles]
    return {"config_files": [{"path": os.path.relpath(f), "sha256": file_sha256(f)[:12]} for f in files],
            "config_overrides": dict(workflow.config_settings.config), "code": code_version(workflow.basedir)}


def params_json(p):
    """A stage's params JSON, which Snakemake records and compares, and prints in `reason:` lines, by a digest
    (rstar2.io.ParamsJSON)."""
    return ParamsJSON(stage_params.to_json(p))


def to_json(p):
    """A rule's `params: p=...`: a function, so that Snakemake keeps the ParamsJSON as it is."""
    text = params_json(p)
    return lambda wildcards: text


def logged(command, training=False):
    """A rule's shell command: `rstar2 <stage> ... --log {log}` writes its params' digest (what Snakemake's
    `reason:` lines show) and their JSON into the job's log only; then the command's output goes to the console and
    is appended to the log (Snakemake deletes a job's log before it runs). A training job's `tee` ignores SIGINT
    and SIGTERM: a Ctrl-C reaches every process of the group, and the line a stopped stage prints on its way out
    (where a rerun resumes) must still reach the log (rstar2/stages/interrupts.py)."""
    tee = "(trap '' INT TERM; exec tee -a {log})" if training else "tee -a {log}"
    return f"{command} --log {{log}} 2>&1 | {tee}"


TRAINING_RULES = ("sft", "rl", "rl_keeping_optimizer")


# Snakemake waits for its running jobs on SIGINT and lets them finish on SIGTERM: both are passed on to the jobs,
# which stop within seconds; a training run's kept outputs and checkpoints are deleted once Snakemake has recorded
# it complete (rstar2/stages/interrupts.py).
onstart:
    interrupts.forward_signals()
    interrupts.drop_recorded(workflow, TRAINING_RULES, checkpoint_root)


onsuccess:
    interrupts.drop_recorded(workflow, TRAINING_RULES, checkpoint_root, all_done=True)


def launch(family):
    """The command that runs `rstar2 <stage>` for a training rule: `rstar2` itself (one process) or e.g.
    `accelerate launch --config_file configs/accelerate/fsdp.yaml -m rstar2.cli` (several)."""
    return config["distributed"]["launch"][family]


def job_resources(family):
    """Snakemake resources of one family of rules: distributed.resources `default` merged with the family's."""
    res = config["distributed"]["resources"]
    return {**res["default"], **res.get(family, {})}


# Local dataset files are inputs, so editing one reruns the stages that read it; hub ids are not files.
def rl_data_files():
    sources = enumerate(config["rl_data"]["sources"])
    return refusing(check_data_files, [(f"rl_data.sources[{i}].path", s["path"]) for i, s in sources]
                    + [(f"benchmarks.{b}.path", config["benchmarks"][b]["path"])
                       for b in config["rl_data"]["decontaminate_against"]])


def sft_data_files():
    sources = enumerate(config["sft_data"]["sources"])
    return refusing(check_data_files, [(f"sft_data.sources[{i}].path", s["path"]) for i, s in sources
                                       if s.get("path") and s.get("limit") != 0])


def benchmark_files():
    from rstar2.data.benchmarks import benchmark_files as files  # BFCL: one question and answer file per category

    return refusing(check_data_files, [(f"benchmarks.{b}.path", f) for b in config["evaluate"]["benchmarks"]
                                       for f in files(config["benchmarks"][b])])


def heldout_files():
    b = config["rl"]["heldout"]["benchmark"]
    return refusing(check_data_files, [(f"benchmarks.{b}.path", config["benchmarks"][b]["path"])]) if b else []


def _verifier_dir():
    # null model = verify with the base model (no second copy); otherwise the verifier_model rule materialises it.
    lv = config["label_verification"]
    if not lv["enabled"]:
        return None
    return "results/verifier_model" if lv["model"] else "results/base_model"


def verifier_model_input():
    return {"model": f"{_verifier_dir()}/model"} if _verifier_dir() else {}


def verifier_model_arg(wildcards, input):
    return f"--model {input.model}" if _verifier_dir() else ""


def prompt_tokenizer_input():
    # the prompt-length filter counts tokens with the policy's tokenizer, the base model's
    return {"tokenizer": "results/base_model/model"} if config["rl_data"]["max_prompt_tokens"] else {}


def prompt_tokenizer_arg(wildcards, input):
    return f"--tokenizer {input.tokenizer}" if config["rl_data"]["max_prompt_tokens"] else ""


# ---- the RL rule: results/rl/stageN (the three stages) and results/ablation/MODE-seedS (the ablation) ----

RL_RUNS = {f"rl/{s}": ("stage", s) for s in RL_STAGES}
RL_RUNS.update({f"ablation/{m}-seed{s}": ("ablation", (m, s)) for (m, s) in ABLATION_RUNS})


def rl_run_params(wildcards):
    kind, what = RL_RUNS[wildcards.run]
    p = stage_params.rl(config, what) if kind == "stage" else stage_params.rl(config, "stage1", what)
    # how often to checkpoint and when to stop for faults change no result: they travel in the environment
    # (RSTAR2_CHECKPOINT_EVERY, RSTAR2_RL_FAULTS, above), so that editing them reruns no finished stage (Snakemake reruns a job whose params changed)
    return params_json({k: v for k, v in params_dict(p).items() if k not in ("checkpoint_every", "faults")})


def rl_run_input(wildcards):
    """Model and data of one RL run: stage 1 and the ablation start from the SFT model on the curated data, stage 2
    from stage 1, stage 3 from stage 2 on the mined hard problems (paper §4.3)."""
    kind, what = RL_RUNS[wildcards.run]
    stage = what if kind == "stage" else "stage1"
    previous = {"stage1": "results/sft", "stage2": "results/rl/stage1", "stage3": "results/rl/stage2"}[stage]
    data = "results/hard_problems/hard.jsonl" if stage == "stage3" else "results/rl_data/train.jsonl"
    carried = _optimizer_from(wildcards.run)
    return {"model": f"{previous}/model", "data": data, "heldout": heldout_files(),
            **({"optimizer": f"results/{carried}/optimizer"} if carried else {})}


def _optimizer_from(run):
    """The previous stage whose optimizer ``run`` continues (paper §4.3: stage 2 continues stage 1's, stage 3 starts
    fresh by default), or None."""
    kind, what = RL_RUNS[run]
    if kind != "stage" or not stage_params.continues_optimizer(config, what):
        return None
    return {"stage2": "rl/stage1", "stage3": "rl/stage2"}[what]


# The runs whose optimizer state a later stage reads (an output of the RL rule that keeps the optimizer).
KEEPING_OPTIMIZER = {_optimizer_from(run) for run in RL_RUNS} - {None}


def rl_runs_pattern(keeping_optimizer):
    """The wildcard constraint of the RL rule (``keeping_optimizer`` False) or of the one that also declares the
    optimizer state (True), so that every run has exactly one rule."""
    runs = [r for r in RL_RUNS if (r in KEEPING_OPTIMIZER) == keeping_optimizer]
    return "|".join(re.escape(r) for r in runs) or "(?!)"


def rl_optimizer_arg(wildcards, input):
    """` --optimizer-from results/rl/stageN/optimizer` for a stage that continues the previous stage's optimizer."""
    return f"--optimizer-from {input.optimizer}" if "optimizer" in input.keys() else ""


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
    from rstar2.rl.dag_checks import refusals

    per_job = {f: job_resources(f).get("gpu", 0) * job_resources(f).get("nodes", 1) for f in ("rl", "sft", "generate")}
    errors += refusals(config, RL_STAGES, per_job, "results/base_model")
    shape = memory_plan.model_shape(config["model"], "results/base_model")[0] if plans else None
    if shape is not None and not errors:   # time and GPU-hours per GPU stage (rstar2/rl/estimate.py)
        from rstar2.rl.estimate import workflow_estimate

        gen = job_resources("generate")
        print("\n".join(workflow_estimate(config, RL_STAGES, plans, shape, gpus,
                                          gen.get("gpu", 0) * gen.get("nodes", 1))), file=sys.stderr)
    if errors:
        listed = "\n  ".join(errors)
        raise ValueError("config: the RL memory plan does not fit (rstar2/rl/memory_plan.py) or a GPU stage would "
                         f"fail (rstar2/rl/dag_checks.py):\n  {listed}")


def model_dir(wildcards):
    return f"{MODEL_DIRS[wildcards.model]}/model"


def report_inputs():
    stages = {s: f"results/rl/{s}" for s in RL_STAGES}
    evals = {m: f"results/eval/{m}" for m in config["evaluate"]["models"]}
    ablation = [{"mode": m, "seed": s, "dir": f"results/ablation/{m}-seed{s}"} for (m, s) in ABLATION_RUNS]
    # not sorted: the report lists models in the configured order
    return json.dumps({"rl_stages": stages, "eval": evals, "rl_data": "results/rl_data", "ablation": ablation})


def report_manifests():
    return ([f"results/eval/{m}/manifest.json" for m in config["evaluate"]["models"]]
            + [f"results/{run}/manifest.json" for run in RL_RUNS] + ["results/rl_data/manifest.json"])


def report_files():
    """What the report reads besides the manifests: each RL run's per-step logs, each evaluation's summary and
    per-problem results, the curation funnel."""
    runs = [f"results/{run}/{log}" for run in RL_RUNS for log in ("metrics.jsonl", "rollouts.jsonl", "heldout.jsonl")]
    evals = [f"results/eval/{m}/{f}" for m in config["evaluate"]["models"]
             for f in ["summary.json", *(f"{b}/per_problem.jsonl" for b in config["evaluate"]["benchmarks"])]]
    return runs + evals + ["results/rl_data/funnel.json"]


def all_manifests():
    stages = ["base_model", "sft_data", "sft", "rl_candidates", "rl_data", *RL_RUNS,
              *(["hard_problems"] if "stage3" in RL_STAGES else []), "report"]
    evals = [f"eval/{m}" for m in config["evaluate"]["models"]]
    verifier = ["verifier_model"] if _verifier_dir() == "results/verifier_model" else []
    # A missing intermediate output is not regenerated unless something asks for it: the optimizer state only a
    # later stage reads is a target too, and so is every file the report reads: deleting one reruns its stage.
    return ([f"results/{s}/manifest.json" for s in stages + verifier + evals]
            + [f"results/{run}/optimizer" for run in sorted(KEEPING_OPTIMIZER)] + report_files())


refusing(_rl_memory_plan)
