"""Emulation of a CPU without bf16 (AVX2 only, as a Zen 3) on one with AMX, for timing the test suite
(docs/tests.md), never for results.

Use: ``PYTHONPATH=$PWD/scripts/no_bf16_emulation ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 make test`` (an absolute path: the workflow's jobs run in other folders). The three
caps make ATen, oneDNN and MKL run their AVX2 kernels and ``rstar2.precision`` choose float32. They do not reach
``torch.cpu._is_*_supported()``, which read the CPU's own flags, and vLLM's CPU build picks its kernels from those:
its AVX-512 bf16 library and AMX kernels, which the capped oneDNN refuses (it aborts). This file, imported by every
Python process that has it on ``PYTHONPATH``, makes each of them but AVX2's answer False, so vLLM loads
``vllm._C_AVX2`` and the kernels it uses on a CPU without AVX-512, as on a Zen 3. Code compiled for AVX-512 that
decides by other means still runs it."""

import importlib.abc
import importlib.machinery
import sys


class _AVX2Only(importlib.abc.MetaPathFinder):
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
            for attr in dir(module):
                if attr.startswith("_is_") and attr.endswith("_supported") and attr != "_is_avx2_supported":
                    setattr(module, attr, lambda: False)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AVX2Only())
