"""scripts/gpu_vllm_smoke.py cannot go stale: its ``--dry-run`` builds every param set of the GPU run with the
workflow's builders from config.yaml + configs/gpu-smoke.yaml and parses them with the stages' strict parser, on
CPU, without vLLM; a wrong key in a param set or in the smoke config is refused."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_vllm_smoke.py"


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _script():
    spec = importlib.util.spec_from_file_location("gpu_vllm_smoke", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_parses_every_param_set_and_the_fsdp_launch():
    p = _dry_run("--fsdp", "--processes", "2")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = p.stdout
    for line in ("[dry-run] rl params parse as RLParams", "[dry-run] evaluate params parse as EvaluateParams",
                 "[dry-run] accelerate config configs/accelerate/fsdp.yaml: FSDP",
                 "[dry-run] accelerate launch arguments parse (2 process(es))", "DRY RUN OK"):
        assert line in out, out
    rl = next(ln for ln in out.splitlines() if ln.startswith("[dry-run] would run:") and " rl --params " in ln)
    assert "--fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer" in rl
    # the params the GPU run would train with: configs/gpu-smoke.yaml's, as the builders made them
    words = shlex.split(rl)
    params = json.loads(words[words.index("--params") + 1])
    assert params["steps"] == 2 and params["rollout"]["engine"] == "vllm" and params["micro_batch_tokens"] == 8192
    assert params["trainer"]["device"] == "cuda" and params["trainer"]["bf16"] is True
    assert params["trainer"]["vllm"]["enable_sleep_mode"] is True


def test_a_wrong_or_missing_key_in_the_built_params_is_refused():
    smoke = _script()
    config = smoke.smoke_config([smoke.SMOKE_CONFIG], None, False, 1, smoke.WHEEL_DECODER_LAYER)
    plan = smoke.build_plan(config, Path("WORK"), Path("WORK/base_model"))
    assert smoke.check_plan(plan)[:2] == ["rl params parse as RLParams", "evaluate params parse as EvaluateParams"]
    cmd = plan["rl_cmd"]
    i = cmd.index("--params") + 1
    good = json.loads(cmd[i])
    for bad, key in (({**good, "bogus_key": 1}, "bogus_key"),
                     ({k: v for k, v in good.items() if k != "micro_batch_tokens"}, "micro_batch_tokens")):
        cmd[i] = json.dumps(bad)
        with pytest.raises(ValueError, match=key):
            smoke.check_plan(plan)


def test_a_smoke_config_with_an_unknown_key_stops_the_dry_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs" / "gpu-smoke.yaml").read_text() + "\nrl_bogus_section: {steps: 2}\n")
    p = _dry_run("--config", str(bad))
    assert p.returncode != 0 and "DRY RUN OK" not in p.stdout
    assert p.stderr.strip().splitlines() == [
        "SMOKE FAILED: config: (top level): Additional properties are not allowed ('rl_bogus_section' was unexpected)"
    ], p.stderr[-2000:]
