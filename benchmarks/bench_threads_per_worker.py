"""Two test workers at once on this machine: torch threads per process = cores against 1 (tests/conftest.py).

Usage: .venv/bin/python benchmarks/bench_threads_per_worker.py [--hidden 128] [--threads 2]

Runs a tiny random Qwen2 (4 layers, ``--hidden``) through 30 AdamW steps on 8 x 256 tokens and 100 greedy decode
steps, first alone with ``--threads`` threads, then as two processes at once with ``--threads`` each, then as two
with 1 each; prints each process's seconds. Measured on a 2-core Xeon (AMX), hidden 128: alone 5.1 s; two at
2 threads 25.8 s each; two at 1 thread 8.4 s each. Hidden 512: 31.9 s; 207.5 s; 59.1 s. Hidden 128 again an
hour later, on the same machine then slower: 8.4 s; 57.6 s; 12.7 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

WORK = """
import sys, time, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
hid = int(sys.argv[1])
m = Qwen2ForCausalLM(Qwen2Config(vocab_size=2000, hidden_size=hid, intermediate_size=4 * hid, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2))
opt = torch.optim.AdamW(m.parameters(), 1e-4)
x = torch.randint(0, 2000, (8, 256))
t0 = time.time()
for _ in range(30):
    m(input_ids=x, labels=x).loss.backward(); opt.step(); opt.zero_grad()
with torch.no_grad():
    ids = x[:, :16]
    for _ in range(100):
        ids = torch.cat([ids, m(input_ids=ids[:, -64:]).logits[:, -1:].argmax(-1)], 1)
print(f"{time.time() - t0:.1f}")
"""


def run(n: int, threads: int, hidden: int) -> list[str]:
    """``n`` processes at once with ``threads`` torch threads each; their seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    procs = [subprocess.Popen([sys.executable, "-c", WORK, str(hidden)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    return [p.communicate()[0].strip() for p in procs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    t0 = time.time()
    print(f"hidden {a.hidden}, {len(os.sched_getaffinity(0))} cores")
    print(f"alone, {a.threads} threads: {run(1, a.threads, a.hidden)} s")
    print(f"two at once, {a.threads} threads each: {run(2, a.threads, a.hidden)} s")
    print(f"two at once, 1 thread each: {run(2, 1, a.hidden)} s")
    print(f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
