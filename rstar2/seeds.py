"""Derived random streams for reproducible runs.

Every random choice of a run draws from a stream named by what it is for, e.g. the sampling seed of RL step 3
of stage 1 is ``derive(seed, "rl_stage1", "rollout", 3)``; a trajectory's tokens then come from
``(that seed, "<problem id>#<sample index>")`` (``rollout.hf_decode.row_uniforms``). No stream depends on how
many numbers another consumer drew before it, or in which order tool calls finished, so adding an evaluation,
resuming a stage or reordering a batch changes nothing else. Pure Python (no torch): the bottom layer.
"""

from __future__ import annotations

import zlib

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One SplitMix64 step (Steele et al. 2014): a 64-bit integer -> a well-mixed 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive(seed: int, *parts) -> int:
    """A seed in [0, 2**62) for the stream named by ``parts`` (strings or integers) under the run's ``seed``.

    The same arguments give the same seed in every process and Python version (crc32 of the parts' text, not
    ``hash``); different parts give unrelated seeds. Raises nothing; ``parts`` may be empty.
    """
    x = splitmix64(int(seed) & MASK64)
    for part in parts:
        x = splitmix64(x ^ zlib.crc32(f"{type(part).__name__}:{part}".encode()))
    return x >> 2
