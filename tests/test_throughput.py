"""The time estimate's arithmetic (rstar2/rl/throughput.py) on small hand-computed cases, the GPU table
(rstar2/gpus.py) as the config selects it, and the paper's setup (64 MI300X, configs/paper-qwen3-14b.yaml) against
the paper's "about one week" for 510 RL steps (paper §1; docs/scale.md, "Time estimate", explains the factor)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rstar2 import gpus
from rstar2.config_schema import validate_config
from rstar2.rl import memory_plan as mp
from rstar2.rl import throughput as tp
from rstar2.rl.estimate import workflow_estimate

ROOT = Path(__file__).resolve().parents[1]
HW = tp.Rates("toy", read_bytes_s=1e12, flops=1e14)
N, KV = 1e9, 1e5   # parameters, KV bytes per token
EST = {"mfu": 0.5, "bandwidth_share": 0.5, "response_fill": 0.5, "tool_calls_per_rollout": 2, "tool_latency_s": 0.5}


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def paper_config(overlay: str = "") -> dict:
    """config.yaml, then the paper config, then ``overlay``, validated with the schema's defaults filled in."""
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    for text in ((ROOT / "configs/paper-qwen3-14b.yaml").read_text(), overlay):
        cfg = merge(cfg, yaml.safe_load(text) or {})
    validate_config(cfg, str(ROOT / "workflow/schemas/config.schema.yaml"))
    return cfg


def test_decode_step_reads_weights_and_kv_or_is_compute_bound():
    # (2 x 1e9 weight bytes + 10 x 1000 x 1e5 KV bytes) / 1e12 B/s = 3 ms; 2e9 x 10 / 1e14 = 0.2 ms of FLOPs
    assert tp.decode_step_s(N, KV, 10, 1000, HW) == pytest.approx(3e-3)
    # batch 1000, no context: reading takes 2 ms, the FLOPs 2e9 x 1000 / 1e14 = 20 ms
    assert tp.decode_step_s(N, KV, 1000, 0, HW) == pytest.approx(0.02)


def test_rollout_phase_by_hand():
    r = tp.rollout_phase(N, KV, HW, rollouts=100, kv_slots=10, prompt=1000, mean_response=2000, max_response=4000,
                         tool_calls=2, tool_latency_s=0.5)
    # batch 10 at context 1000 + 2000 / 2: (2e9 + 10 x 2000 x 1e5) / 1e12 = 4 ms a step; 10 waves x 2000 steps
    assert (r.slots, r.decode_s) == (10, pytest.approx(80.0))
    assert r.tool_s == pytest.approx(10 * 2 * 0.5)
    assert r.tail_s == pytest.approx(2000 * (2e9 + 5000 * 1e5) / 1e12)            # 5 s at batch 1
    assert r.prefill_s == pytest.approx(100 * 2e9 * 1000 / 1e14)                  # 2 s
    assert r.seconds == pytest.approx(97.0)
    assert r.bottleneck == "KV room for 10 sequences per GPU (100 rollouts each: 10.0 waves)"
    few = tp.rollout_phase(N, KV, HW, 4, 10, 1000, 2000, 4000, 2, 0.5)
    assert few.slots == 4 and few.bottleneck.startswith("decode at batch 4 (memory bound)")
    with pytest.raises(ValueError, match="KV cache holds no rollout"):
        tp.rollout_phase(N, KV, HW, 4, 0, 1000, 2000, 4000, 2, 0.5)


def test_update_is_6_or_8_N_per_token_over_the_gpus():
    assert tp.update_s(N, 1e6, 4, HW, checkpointing=False) == pytest.approx(6e9 * 1e6 / 4e14)   # 15 s
    assert tp.update_s(N, 1e6, 4, HW, checkpointing=True) == pytest.approx(20.0)


def test_rl_stage_time_by_hand():
    s = tp.RLShape(prompts=5, group_size=4, oversample=5, prompt_tokens=1000, max_response=4000, steps=10)
    t = tp.rl_stage_time("rl_stage1", N, KV, HW, gpus=1, kv_slots=10, s=s, estimate=EST, checkpointing=True)
    # 100 rollouts: the rollout phase above (97 s); update 5 x 4 kept x 3000 tokens x 8e9 / 1e14 = 4.8 s
    assert (t.rollout_s, t.update_s) == (pytest.approx(97.0), pytest.approx(4.8))
    assert t.seconds == pytest.approx(1018.0) and t.gpu_hours == pytest.approx(1018.0 / 3600)
    assert t.bottleneck == "rollout: KV room for 10 sequences per GPU (100 rollouts each: 10.0 waves)"
    assert "10 steps = 17.0 min" in t.lines[2]


def test_kv_slots_and_advice():
    # 0.5 x 100 GB - 2 GB weights - 1 GB overhead = 47 GB = 470,000 tokens of 1e5 B = 470 sequences of 1000
    assert tp.kv_slots(100e9, 0.5, N, KV, 1e9, 1000) == 470
    assert tp.kv_slots(3e9, 0.5, N, KV, 1e9, 1000) == 0
    s = tp.RLShape(5, 4, 5, 1000, 4000, 10)
    t = tp.rl_stage_time("rl_stage1", N, KV, HW, 2, 10, s, EST, True)
    lines = tp.advice(t, N, KV, 2, s, EST, [(HW, 100, 192)], (HW, 40))
    # one GPU serving 100 rollouts at batch 40 (2.5 waves), one training: the slots are what changes
    assert lines[0].startswith("  advice          server mode, 1 GPUs serving (40 sequences each) + 1 training")
    # the larger GPU: 50 rollouts per GPU at batch 50, context 2000: (2e9 + 50 x 2000 x 1e5) / 1e12 = 12 ms a step,
    # decode 24 s + tools 1 s + tail 5 s + prefill 1 s + update 60,000 x 8e9 / 2e14 = 2.4 s
    assert "2 x toy (distributed.gpu, 192 GB: 50 sequences each): 33.4 s per step" in lines[1]
    fast = tp.rl_stage_time("rl_stage1", N, KV, HW, 2, 1000, s, EST, True)
    assert tp.advice(fast, N, KV, 2, s, EST, [(HW, 100, 192)], (HW, 40)) == []   # not KV-limited: no advice


def test_the_gpu_table_is_selected_by_distributed_gpu():
    cfg = paper_config("distributed: {gpu: mi300x}\n")
    assert gpus.gpu_spec(cfg["distributed"]) == gpus.GPUS["mi300x"]
    assert gpus.memory_bytes(cfg["distributed"]) == 192e9
    assert mp.placement(cfg["distributed"], 8, None).gpu_bytes == 192e9
    # an explicit gpu_memory_gb wins over the table's memory (e.g. a 40 GB card); bandwidth and FLOPs stay
    assert gpus.memory_bytes(paper_config("distributed: {gpu: a100-80gb, gpu_memory_gb: 40}\n")["distributed"]) == 40e9
    with pytest.raises(ValueError, match="distributed.gpu"):
        paper_config("distributed: {gpu: v100}\n")


PAPER_WEEK_H = 7 * 24   # "about one week" for the 510 RL steps (paper §1)


def test_the_paper_setup_is_within_the_stated_factor_of_a_week():
    """64 MI300X (8 nodes x 8) on the paper config: the three RL stages (300 + 85 + 125 steps) predict about 4.5 days,
    0.64 of the paper's week (docs/scale.md, "Time estimate", says why the prediction is low)."""
    cfg = paper_config("distributed: {gpu: mi300x, resources: {rl: {gpu: 8, nodes: 8}}}\n")
    stages = ["stage1", "stage2", "stage3"]
    plans, notice = mp.workflow_plans(cfg, stages, 64, {"distributed_type": "FSDP"}, "/nonexistent")
    assert notice is None and all(p.errors == () for p in plans)
    lines = workflow_estimate(cfg, stages, plans, mp.KNOWN_MODELS["Qwen/Qwen3-14B-Base"], 64, 8)
    rl_hours = sum(float(line.split(" = ")[1].split()[0]) for line in lines if line.startswith("  stage  "))
    assert 0.55 < rl_hours / PAPER_WEEK_H < 0.75, lines
    assert "rl_stage1: 64 x MI300X 192GB, 16,384 rollouts per step (256 per GPU" in "\n".join(lines)
    assert "bottleneck rollout: KV room for 55 sequences per GPU" in "\n".join(lines)


def test_the_released_8_gpu_setup_names_its_bottleneck_and_advises():
    cfg = paper_config()
    plans, _ = mp.workflow_plans(cfg, ["stage1"], 8, {"distributed_type": "FSDP"}, "/nonexistent")
    lines = workflow_estimate(cfg, ["stage1"], plans, mp.KNOWN_MODELS["Qwen/Qwen3-14B-Base"], 8, 8)
    text = "\n".join(lines)
    assert "bottleneck rollout: KV room for 10 sequences per GPU (2048 rollouts each: 204.8 waves)" in text
    assert "server mode, 4 GPUs serving" in text and "8 x MI300X 192GB (distributed.gpu, 192 GB" in text
    assert "7 of the job's 8 GPUs idle" in text   # evaluation's one in-process vLLM
    # 1385 h against the paper config's 10080-minute RL jobs: 9 submissions, 8 resubmissions
    assert ("rl_stage1 is predicted to take 1,385.4 h, over its job's time limit (distributed.resources.rl.runtime "
            "10080 min = 168.0 h): it needs 9 submissions") in text and "retries) to at least 8" in text
    cfg = paper_config("distributed: {resources: {rl: {runtime: 100000}}}\n")
    assert "warning" not in "\n".join(workflow_estimate(cfg, ["stage1"], plans, mp.KNOWN_MODELS["Qwen/Qwen3-14B-Base"],
                                                          8, 8))


def test_the_dry_run_prints_time_and_gpu_hours_per_stage(tmp_path):
    from test_paper_config import _dry_run

    r = _dry_run(tmp_path, "distributed: {gpu: mi300x, resources: {rl: {gpu: 8, nodes: 8}}}\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "time estimate: MI300X 192GB at 35% MFU" in r.stderr
    for stage, steps in (("rl_stage1", 300), ("rl_stage2", 85), ("rl_stage3", 125)):
        assert f"{stage}: 64 x MI300X 192GB, 16,384 rollouts per step" in r.stderr
        assert f"  stage           {steps} steps = " in r.stderr
    assert r.stderr.count("GPU-hours; bottleneck rollout: KV room for") == 5   # 3 RL stages, mining, evaluation
    assert "hard_problems: per 1,000 rollouts" in r.stderr and "evaluate (each of 5 models)" in r.stderr
    (tmp_path / "bad").mkdir()
    bad = _dry_run(tmp_path / "bad", "rl: {stages: {stage2: {max_response_tokens: 31000}}}\n")
    assert bad.returncode != 0 and "Job stats" not in bad.stdout
    assert "rl.stages.stage2.max_response_tokens: 31000 + 2048 prompt tokens = 33048 exceeds" in bad.stdout + bad.stderr
