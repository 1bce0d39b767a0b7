"""Precision by capability: bf16 only where the device computes it natively.

``distributed.bf16`` (training: torch.autocast mixed precision, float32 master weights) and ``rollout.precision``
(the "hf" engine: a bfloat16 copy of the policy, generation under autocast) ask for bf16 *where the device has it*:

    distributed.bf16   false | true | force          rollout.precision   fp32 | bf16 | force-bf16

``true`` / ``bf16`` mean bf16 on a device with native bf16 arithmetic and float32 elsewhere, with a one-line
notice in the stage's log and the choice in its manifest; ``force`` / ``force-bf16`` use bf16 anyway.
Why: on a CPU without bf16 instructions (AVX2 only, e.g. AMD Zen 3) PyTorch runs bf16 matrix products on a
fallback path; one forward + backward of SmolLM2-135M on 4 x 256 tokens took 6.7 s in float32 and more than 180 s
under bf16 autocast on a 2-core Zen 3 (``benchmarks/bench_bf16_cpu.py`` measures it on the machine at hand).

Native bf16 means:
- CPU (x86): the ``avx512_bf16`` or ``amx_bf16`` flag in /proc/cpuinfo, *and* PyTorch using it: its ATen
  kernels dispatch at AVX512 or above (``torch.backends.cpu.get_cpu_capability()``, lowered by
  ``ATEN_CPU_CAPABILITY``) and oneDNN reports bf16 support (lowered by ``ONEDNN_MAX_CPU_ISA``). A CPU with
  AVX-512 but no bf16 instructions (Skylake-SP, Cascade Lake) counts as not native: oneDNN only emulates bf16 there.
- CPU (aarch64): the ``bf16`` feature in /proc/cpuinfo and oneDNN's bf16 support.
- CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)`` (compute capability 8.0 and newer).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})   # x86 /proc/cpuinfo "flags"
ARM_BF16_FEATURE = "bf16"                              # aarch64 /proc/cpuinfo "Features"
# setting -> mode ("off": float32; "auto": bf16 where native; "force": bf16); documented in the config schema
TRAINING_SETTINGS = {False: "off", True: "auto", "force": "force"}            # distributed.bf16
ROLLOUT_SETTINGS = {"fp32": "off", "bf16": "auto", "force-bf16": "force"}      # rollout.precision
_announced: set[str] = set()


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (first ``flags`` line on x86, ``Features`` on aarch64); empty if unreadable."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def native_bf16(device: str) -> tuple[bool, str]:
    """Whether ``device`` ("cpu" | "cuda") computes bf16 natively, and the evidence in words (for the notice).

    Cached per process: the answer cannot change while it runs. Any other device type: (False, reason).
    """
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device is available"
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, f"{torch.cuda.get_device_name()} {'has' if ok else 'has no'} native bf16"
    if device != "cpu":
        return False, f"device {device!r} is not probed for bf16"
    flags, (arch, capability, onednn_bf16) = cpu_flags(), torch_cpu_support()
    if not flags:
        return False, "the CPU's flags cannot be read (no /proc/cpuinfo)"
    if arch in ("aarch64", "arm64"):
        have = [ARM_BF16_FEATURE] if ARM_BF16_FEATURE in flags else []
    else:
        have = sorted(flags & BF16_FLAGS)
    if not have:
        return False, "this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)"
    if arch not in ("aarch64", "arm64") and not capability.startswith("AVX512"):
        return False, f"PyTorch dispatches at {capability} (ATEN_CPU_CAPABILITY), below the CPU's {'/'.join(have)}"
    if not onednn_bf16:
        return False, f"oneDNN reports no bf16 support (ONEDNN_MAX_CPU_ISA?) although the CPU has {'/'.join(have)}"
    return True, f"this CPU has {'/'.join(have)}"


def torch_cpu_support() -> tuple[str, str, bool]:
    """(machine, PyTorch's CPU capability, oneDNN bf16 support): what this PyTorch build uses on this CPU."""
    import torch

    try:  # honours ONEDNN_MAX_CPU_ISA; a build without oneDNN has no bf16 fast path at all
        onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn_bf16 = False
    return platform.machine().lower(), torch.backends.cpu.get_cpu_capability(), onednn_bf16


@dataclass(frozen=True)
class Choice:
    """What runs: ``bf16`` (bool) and ``ran``, one line for the log and the manifest."""
    bf16: bool
    ran: str


def _choose(key: str, setting, table: dict, device: str) -> Choice:
    if not any(setting is s or (isinstance(s, str) and setting == s) for s in table):  # 1 is not True here
        raise ValueError(f"{key} must be one of {list(table)}, got {setting!r}")
    mode = table[setting]
    if mode == "off":
        return Choice(False, "float32")
    native, why = native_bf16(device)
    if native:
        return Choice(True, f"bf16 ({why})")
    force = next(s for s, m in table.items() if m == "force")
    if mode == "force":
        choice = Choice(True, f"bf16, forced ({key}: {force}), although {why}: expect it to be slower than float32")
    else:
        choice = Choice(False, f"float32, not bf16: {why}, where bf16 runs many times slower than float32 "
                               f"({key}: {force} uses it anyway)")
    if choice.ran not in _announced:  # once per process, not once per rollout batch
        _announced.add(choice.ran)
        print(f"[precision] {key}: {choice.ran}", flush=True)
    return choice


def training(setting, device: str) -> Choice:
    """Training autocast for ``distributed.bf16`` (False | True | "force") on ``device`` ("cpu" | "cuda").

    Prints the one-line notice (once per process) when the choice is not what the setting names plainly.
    Raises:
        ValueError: an unknown setting.
    """
    return _choose("distributed.bf16", setting, TRAINING_SETTINGS, device)


def rollout(setting: str, device: str) -> Choice:
    """The "hf" engine's precision for ``rollout.precision`` ("fp32" | "bf16" | "force-bf16") on ``device``.

    Prints the one-line notice as ``training`` does. Raises ValueError on an unknown setting.
    """
    return _choose("rollout.precision", setting, ROLLOUT_SETTINGS, device)


def summary(params: dict) -> dict:
    """What a stage's precision settings ran as, for its manifest: ``{"training": ran, "rollout": ran}``, each
    present where ``params`` has a ``trainer`` section (SFT, RL) or an "hf"-engine ``rollout`` section. The
    rollouts run on the training device (RL) or on the CPU (evaluation, mining, label verification)."""
    trainer, ro = params.get("trainer"), params.get("rollout")   # sections a stage may not have
    device = trainer["device"] if trainer is not None else "cpu"
    out = {}
    if trainer is not None:
        out["training"] = training(trainer["bf16"], device).ran
    if ro is not None and ro["engine"] == "hf":
        out["rollout"] = rollout(ro["precision"], device).ran
    return out
