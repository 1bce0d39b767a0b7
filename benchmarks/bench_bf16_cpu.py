"""bf16 autocast against float32 on this CPU (issue 17): one training step and one no-grad forward of SmolLM2-135M.

Usage: .venv/bin/python benchmarks/bench_bf16_cpu.py [--batch 4] [--tokens 256] [--repeats 2] [--max-s 240]

Measures, per precision: a forward + backward of ``--batch`` x ``--tokens`` random token ids (the training step's
compute, no optimizer) and a no-grad forward of the same batch (the rollouts' prefill; bf16 = the bfloat16 copy
the "hf" engine decodes with, ``rollout.engines.inference_copy``). Each timing is the median of ``--repeats``
after one untimed warm-up; a precision whose first step already exceeds ``--max-s`` is reported from that step
alone. ``cpu/wall`` is the process's CPU time over wall time during the timed steps: about the number of cores
the step kept busy (2 on 2 idle cores; lower on a shared machine).

To see what a CPU without native bf16 gets (AVX2 only, e.g. AMD Zen 3), run it with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``: ATen's kernels then dispatch to AVX2 and oneDNN reports
no bf16 support (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is False), so bf16 matrix products take
PyTorch's fallback path, as on such a CPU. ``rstar2.precision`` reads the same two settings.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from rstar2 import models, precision
from rstar2.rollout.engines import inference_copy


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, repeats: int, max_s: float) -> tuple[float, float]:
    """(median seconds per call, cpu/wall) over ``repeats`` calls after one warm-up (or the warm-up alone if
    it took longer than ``max_s``)."""
    c0, t0 = _cpu_s(), time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > max_s:
        return first, (_cpu_s() - c0) / first
    times, c0 = [], _cpu_s()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (_cpu_s() - c0) / sum(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-s", type=float, default=240.0)
    a = ap.parse_args()

    native, why = precision.native_bf16("cpu")
    machine, capability, onednn = precision.torch_cpu_support()
    print(f"{machine}, PyTorch CPU capability {capability}, oneDNN bf16 {onednn}, bf16 flags "
          f"{sorted(precision.cpu_flags() & precision.BF16_FLAGS)}; rstar2.precision native bf16: {native} ({why}); "
          f"torch threads {torch.get_num_threads()}")
    model, _ = models.load_smollm2_wheel()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.tokens), generator=torch.Generator().manual_seed(0))

    def train_step(bf16: bool):
        def step():
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return step

    def prefill(m):
        def step():
            with torch.no_grad():
                m(input_ids=ids)
        return step

    model.train()
    rows = {}
    for name, bf16 in (("float32", False), ("bf16 autocast", True)):
        rows[f"train fwd+bwd, {name}"] = timed(train_step(bf16), a.repeats, a.max_s)
    model.eval()
    rows["no-grad forward, float32"] = timed(prefill(model), a.repeats, a.max_s)
    rows["no-grad forward, bf16 copy"] = timed(prefill(inference_copy(model, "force-bf16")), a.repeats, a.max_s)
    print(f"SmolLM2-135M, batch {a.batch} x {a.tokens} tokens, median of {a.repeats} after a warm-up:")
    for k, (s, busy) in rows.items():
        print(f"  {k:28s} {s:8.2f} s   cpu/wall {busy:.2f}")
    for kind in ("train fwd+bwd", "no-grad forward"):
        f32 = rows[f"{kind}, float32"][0]
        b16 = rows[f"{kind}, bf16 autocast" if kind.startswith("train") else f"{kind}, bf16 copy"][0]
        print(f"  {kind}: bf16 / float32 time = {b16 / f32:.2f}")


if __name__ == "__main__":
    main()
