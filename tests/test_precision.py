"""Precision by capability: bf16 where the device has it natively, float32 with a notice elsewhere.

The capability probe is patched both ways: with native bf16 the settings behave as before (bf16 autocast in
training, a bfloat16 copy for decoding); without it ``true`` / ``bf16`` run float32 and say so once, in the log
and in the stage's manifest, and ``force`` / ``force-bf16`` still give bf16.
"""

from __future__ import annotations

import json

import pytest
from conftest import stage_params
import torch

from rstar2 import distributed, precision
from rstar2.models import tiny_qwen3

NATIVE = (True, "this CPU has avx512_bf16")
NOT_NATIVE = (False, "this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)")


@pytest.fixture
def probe(monkeypatch):
    """``probe(True | False)`` patches the capability probe; each test starts with no notice printed yet."""
    monkeypatch.setattr(precision, "_announced", set())

    def set_native(native: bool):
        monkeypatch.setattr(precision, "native_bf16", lambda device: NATIVE if native else NOT_NATIVE)
    return set_native


# ---- the probe itself ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, support, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, ("x86_64", "AVX512", True), (True, "avx512_bf16")),
    ({"avx2", "amx_bf16", "avx512_bf16"}, ("x86_64", "AVX512", True), (True, "amx_bf16/avx512_bf16")),
    ({"avx2", "fma"}, ("x86_64", "AVX2", False), (False, "no avx512_bf16 or amx_bf16 flag")),   # Zen 3
    ({"avx2", "avx512f", "avx512bw"}, ("x86_64", "AVX512", True), (False, "no avx512_bf16")),   # Cascade Lake
    ({"avx2", "avx512_bf16"}, ("x86_64", "AVX2", True), (False, "dispatches at AVX2")),         # ATEN_CPU_CAPABILITY
    ({"avx2", "avx512_bf16"}, ("x86_64", "AVX512", False), (False, "oneDNN reports no bf16")),  # ONEDNN_MAX_CPU_ISA
    ({"fp", "asimd", "bf16"}, ("aarch64", "SVE256", True), (True, "bf16")),
    ({"fp", "asimd"}, ("aarch64", "DEFAULT", True), (False, "no native bf16")),
    (set(), ("x86_64", "AVX512", True), (False, "cannot be read")),
])
def test_cpu_probe_needs_the_flag_and_pytorch_using_it(monkeypatch, flags, support, expected):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision, "torch_cpu_support", lambda: support)
    native, why = precision.native_bf16.__wrapped__("cpu")
    assert native is expected[0] and expected[1] in why, why


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\nbugs\t\t: none\n\nprocessor\t: 1\n"
                    "flags\t\t: fpu\n")
    assert precision.cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_probe_of_this_machine_agrees_with_its_cpu_flags():
    """Not patched: whatever this CPU is, the answer follows its flags and this PyTorch's CPU support."""
    native, why = precision.native_bf16("cpu")
    flags, (_, capability, onednn) = precision.cpu_flags(), precision.torch_cpu_support()
    if native:
        assert flags & (precision.BF16_FLAGS | {precision.ARM_BF16_FEATURE}) and onednn, why
    else:
        assert why, "a fallback must say why"


def _dist(bf16) -> dict:
    """A stage's complete ``trainer`` settings with ``bf16``."""
    return {"device": "cpu", "bf16": bf16, "gradient_checkpointing": False, "reproducible": True}


# ---- training: distributed.bf16 --------------------------------------------------------------------------------

def test_training_bf16_with_native_support_is_bf16_without_notice(probe, capsys):
    probe(True)
    assert distributed.trainer_kwargs(_dist(True))["bf16"] is True
    assert precision.training(True, "cpu").ran == "bf16 (this CPU has avx512_bf16)"
    assert capsys.readouterr().out == ""


def test_training_bf16_without_native_support_runs_float32_and_says_so_once(probe, capsys):
    probe(False)
    assert distributed.trainer_kwargs(_dist(True))["bf16"] is False
    assert distributed.trainer_kwargs(_dist(True))["bf16"] is False
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[precision] distributed.bf16: float32, not bf16: this CPU has "
                                                   "no native bf16"), lines
    assert "distributed.bf16: force uses it anyway" in lines[0]


def test_full_determinism_only_on_cuda_and_only_when_reproducible(probe):
    """Transformers' full_determinism (torch.use_deterministic_algorithms, deterministic cuBLAS) on CUDA;
    on CPU same-seed runs are already identical (tests/test_reproducible.py) and the mode would only cost time."""
    probe(True)
    assert distributed.trainer_kwargs(_dist(False))["full_determinism"] is False
    assert distributed.trainer_kwargs({**_dist(False), "device": "cuda"})["full_determinism"] is True
    assert distributed.trainer_kwargs({**_dist(False), "device": "cuda", "reproducible": False})[
        "full_determinism"] is False


def test_training_force_and_false(probe, capsys):
    probe(False)
    assert distributed.trainer_kwargs(_dist("force"))["bf16"] is True
    assert "[precision] distributed.bf16: bf16, forced" in capsys.readouterr().out
    probe(True)
    assert distributed.trainer_kwargs(_dist(False))["bf16"] is False
    with pytest.raises(ValueError, match=r"distributed settings lack \['bf16', 'reproducible'\]"):
        distributed.trainer_kwargs({"device": "cpu", "gradient_checkpointing": False})
    with pytest.raises(ValueError, match=r"distributed.bf16 must be one of \[False, True, 'force'\], got 1"):
        distributed.trainer_kwargs(_dist(1))


# ---- rollouts: rollout.precision -------------------------------------------------------------------------------

def test_rollout_bf16_decodes_with_a_bfloat16_copy_only_with_native_support(probe, capsys):
    from rstar2.rollout import RolloutConfig
    from rstar2.rollout.engines import inference_copy

    model, _ = tiny_qwen3(hidden_size=32, num_layers=1, num_heads=4)
    probe(True)
    assert inference_copy(model, "bf16").dtype == torch.bfloat16
    assert capsys.readouterr().out == ""
    probe(False)
    assert inference_copy(model, "bf16") is model
    assert inference_copy(model, "bf16") is model
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("[precision] rollout.precision: float32, not bf16"), out
    assert inference_copy(model, "force-bf16").dtype == torch.bfloat16
    assert inference_copy(model, "fp32") is model
    with pytest.raises(ValueError, match="rollout.precision must be one of"):
        RolloutConfig(precision="bf17")


class _AutocastRecorder:
    """A generate()-only stand-in that records whether bf16 autocast was on (HFEngine's non-HF path)."""

    def __init__(self):
        self.seen = []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        self.seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return torch.cat([input_ids, torch.full((len(input_ids), 1), 7)], dim=1)


@pytest.mark.parametrize("native, setting, autocast", [(True, "bf16", True), (False, "bf16", False),
                                                      (False, "force-bf16", True), (True, "fp32", False)])
def test_hf_engine_autocasts_per_capability(probe, native, setting, autocast):
    from rstar2.rollout.engines import HFEngine
    from rstar2.rollout.protocol import TurnRequest

    class Tok:
        pad_token_id, eos_token_id = 0, 7
    probe(native)
    rec = _AutocastRecorder()
    out = HFEngine(rec, Tok(), temperature=0.0, precision=setting)._generate_batch([TurnRequest("t0", [1, 2], 1)])
    assert out[0].token_ids == [7] and rec.seen == [autocast]


# ---- what the stage's manifest records -------------------------------------------------------------------------

def test_summary_names_what_ran(probe):
    probe(False)
    s = precision.summary({"trainer": {"device": "cpu", "bf16": True},
                           "rollout": {"engine": "hf", "precision": "fp32"}})
    assert s["training"].startswith("float32, not bf16: this CPU has no native bf16") and s["rollout"] == "float32"
    probe(True)
    assert precision.summary({"rollout": {"engine": "hf", "precision": "bf16"}}) == {"rollout": "bf16 (this CPU has avx512_bf16)"}
    assert precision.summary({"rollout": {"engine": "vllm", "precision": "bf16"}}) == {}


def test_sft_stage_without_native_bf16_trains_float32_and_its_manifest_says_so(probe, tmp_path, capsys):
    """The real SFT stage on a tiny model with distributed.bf16: true on a CPU without native bf16."""
    from rstar2 import models
    from rstar2.stages import sft

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4}},
                       tmp_path / "base")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"id": f"s{i}", "messages": [
        {"role": "user", "content": f"Say {i}."},
        {"role": "assistant", "content": f"<reason>It is {i}.</reason>\n<answer>{i}</answer>"}]}) + "\n"
        for i in range(4)))
    probe(False)
    params = stage_params("sft", overrides={"sft": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 4,
                                                    "grad_accum": 1, "max_length": 256, "warmup_ratio": 0.0},
                                            "distributed": {"bf16": True}})
    assert sft.sft_config(params, str(tmp_path / "scratch")).bf16 is False
    sft.run(params, str(tmp_path / "base"), str(data), str(tmp_path / "sft"))
    m = json.loads((tmp_path / "sft" / "manifest.json").read_text())
    assert m["precision"]["training"].startswith("float32, not bf16: this CPU has no native bf16"), m["precision"]
    assert capsys.readouterr().out.count("[precision] distributed.bf16: float32") == 1
