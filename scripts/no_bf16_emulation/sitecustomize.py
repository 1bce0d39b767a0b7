"""Emulation of a CPU without bf16 on one with AMX, for timing the test suite (docs/tests.md), never for results.

Use: ``PYTHONPATH=scripts/no_bf16_emulation ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 make test``.
The two caps make oneDNN and MKL run AVX2 kernels and ``rstar2.precision`` choose float32 (oneDNN then reports no
bf16); this file, imported by every Python process that has it on ``PYTHONPATH``, makes
``torch.cpu._is_amx_tile_supported()`` answer False, so that vLLM's CPU build picks the kernels it picks on a CPU
without AMX instead of AMX ones that the capped oneDNN refuses (it aborts). ATen's own kernels stay at the CPU's
AVX-512: this is not a Zen 3."""

import importlib.abc
import importlib.machinery
import sys


class _NoAMX(importlib.abc.MetaPathFinder):
    """Patches ``torch.cpu`` right after it is imported; finds nothing itself."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._is_amx_tile_supported = lambda: False

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoAMX())
