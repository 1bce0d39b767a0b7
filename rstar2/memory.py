"""glibc's allocator for CPU training and generation: reuse large buffers within a phase, give memory back after it.

CPU training and generation allocate tensors of a different shape every step, from two threads (the trainer's
and the rollout engine's), each with its own glibc malloc arena. Freed blocks stay in those arenas and the
process's resident memory grows by gigabytes per RL step until the OOM killer stops the run (measured: 8 GB
after one step, 16 GB after three on SmolLM2-135M). Trimming the arenas after each rollout phase and each
optimizer step keeps it flat.

Within a phase the opposite matters: glibc serves every block above its mmap threshold (at most 32 MB) with a
fresh ``mmap`` and unmaps it on free, so each such tensor (an LM-head gradient of SmolLM2-135M is 113 MB in
float32, allocated and zeroed several times per micro-batch) is paid again in page faults, one per 4 KB page,
while the other core waits. ``tune_allocator`` serves them from the heap instead, where a freed block is reused
without faults, and leaves returning memory to ``release_freed_memory`` at the phase ends. Measured on a 2-core
Xeon (Sapphire Rapids), SmolLM2-135M RL step, bf16: an 8-row update 12.6 -> 9.1 s, CPU use 1.65 -> 1.96 cores.
Both are no-ops where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_libc = None
# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4


def _glibc():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
            _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return _libc


def release_freed_memory() -> None:
    """Call ``malloc_trim(0)`` on every arena; silently does nothing without glibc."""
    if _glibc():
        _libc.malloc_trim(0)


def tune_allocator() -> bool:
    """Serve large blocks from the heap and keep freed memory until ``release_freed_memory`` (see the module
    docstring): no mmap per block, no automatic trim of the heap's top, heap growth in 64 MB steps. Call once at the
    start of a process that trains or generates on the CPU. Returns whether glibc accepted the settings."""
    if not _glibc():
        return False
    return all(_libc.mallopt(param, value) == 1 for param, value in
               ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20)))
