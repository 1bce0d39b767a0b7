"""CPU: the decode step's attention beside the memory read it cannot avoid (issue 37), float32.

Times ``rstar2.rollout.hf_decode._prefix_decode_attention``, the one-token attention every decode step of the
lean path runs once per layer: one flash pass of all rows' queries over the shared prefix's keys (system prompt
and tool schema), one flash pass of each row over its own cached keys, merged by log-sum-exp. Shapes default to
the default model's (SmolLM2-135M: 9 query heads, 3 KV heads, head dim 64, 30 layers) and its 378-token shared
prefix; ``--widths`` are each row's own cache width (the left-padded batch width after the prefix).

The floor per layer is the bytes it must read (each row's own K and V over the width, plus the prefix's once;
``floor_bytes``) over this machine's read bandwidth (``torch.sum`` over a large array, best of ``--repeats``),
and a ratio is floor time / measured time. Also printed: the own-keys pass alone (with its mask precomputed,
where the engine converts it per layer), its floor, and the per-step total over the layers. Random tensors; no
model is loaded. Half the rows are left-padded by a quarter of the width: the CPU flash kernel reads masked keys
as well, so the time does not depend on the padding share. Caveats: every call reuses the same tensors, so at
small batches they may stay in cache (ratios then read high), and the bandwidth is measured once, before the
table.

Run: ``python benchmarks/bench_decode_attention.py [--batches 16 64 114 --widths 100 200 400 --threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import cpu_model, read_bandwidth  # noqa: E402

from rstar2.rollout.hf_decode import _prefix_decode_attention  # noqa: E402

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def floor_bytes(batch: int, width: int, prefix: int, kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(bytes of the whole attention, bytes of the own-keys pass) one decode layer must read, float32: every row's
    K and V over ``width``, plus the shared prefix's K and V once."""
    own = 2 * batch * kv_heads * width * head_dim * 4
    return own + 2 * kv_heads * prefix * head_dim * 4, own


def per_call_s(fn, min_s: float = 0.3) -> float:
    """Mean wall time (s) of ``fn`` over calls filling at least ``min_s``, after one warm-up call."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 114])
    ap.add_argument("--widths", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--prefix", type=int, default=378, help="shared prefix tokens")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--bandwidth-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    bw = read_bandwidth(a.bandwidth_mb, a.repeats) * 1e9   # bytes/s
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, threads {a.threads}; PyTorch {torch.__version__}, "
          f"float32")
    print(f"memory read bandwidth: {bw / 1e9:.1f} GB/s (torch.sum over {a.bandwidth_mb} MB, best of {a.repeats})")
    print(f"shapes: {a.heads} query heads, {a.kv_heads} KV heads, head dim {a.head_dim}, {a.layers} layers, "
          f"shared prefix {a.prefix} tokens")
    print(f"{'batch':>5} {'width':>5}  {'attn ms/layer':>13} {'floor':>6} {'ratio':>6}  {'own-keys ms':>11} "
          f"{'floor':>6} {'ratio':>6}  {'attn ms/step':>12}")
    h, hkv, d = a.heads, a.kv_heads, a.head_dim
    pk, pv = torch.randn(hkv, a.prefix, d), torch.randn(hkv, a.prefix, d)
    for b in a.batches:
        for w in a.widths:
            q = torch.randn(b, h, 1, d)
            k, v = torch.randn(b, hkv, w, d), torch.randn(b, hkv, w, d)
            mask = torch.ones(b, 1, 1, w, dtype=torch.bool)
            mask[: b // 2, :, :, : w // 4] = False   # half the rows left-padded by a quarter of the width
            full = per_call_s(lambda: _prefix_decode_attention(q, k, v, mask, None, (pk, pv)))
            qf = q.reshape(b, hkv, h // hkv, d)
            add = torch.zeros(b, 1, 1, w).masked_fill(~mask, float("-inf"))
            own = per_call_s(lambda: FLASH(qf, k, v, attn_mask=add, scale=d ** -0.5))
            full_bytes, own_bytes = floor_bytes(b, w, a.prefix, hkv, d)
            floor_full, floor_own = full_bytes / bw, own_bytes / bw
            print(f"{b:>5} {w:>5}  {full * 1e3:>13.3f} {floor_full * 1e3:>6.3f} {floor_full / full:>6.0%}  "
                  f"{own * 1e3:>11.3f} {floor_own * 1e3:>6.3f} {floor_own / own:>6.0%}  {full * a.layers * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
