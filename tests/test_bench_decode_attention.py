"""benchmarks/bench_decode_attention.py runs and prints one row per (batch, width) with its floor ratios."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_floor_counts_each_rows_keys_and_values_and_the_prefix_once(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))   # the script imports bench_decode beside it
    spec = importlib.util.spec_from_file_location("bench_attn", REPO / "benchmarks/bench_decode_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # 16 rows x 3 KV heads x 200 tokens x 64 dims x (K, V) x 4 bytes; the 378-token prefix's K and V once
    assert mod.floor_bytes(16, 200, 378, 3, 64) == (16 * 3 * 200 * 64 * 2 * 4 + 3 * 378 * 64 * 2 * 4,
                                                   16 * 3 * 200 * 64 * 2 * 4)


def test_attention_benchmark_prints_a_row_per_shape():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_decode_attention.py"), "--batches", "2", "4",
                          "--widths", "8", "--prefix", "16", "--layers", "2", "--bandwidth-mb", "8", "--repeats", "1",
                          "--threads", "1"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert "memory read bandwidth:" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d", line)]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(2, 8), (4, 8)]
    for r in rows:
        attn_ms, own_ms, step_ms = float(r[2]), float(r[5]), float(r[8])
        assert attn_ms > 0 and own_ms > 0
        assert abs(step_ms - 2 * attn_ms) <= 0.06   # the two layers' total, printed to 0.1 ms
        assert r[4].endswith("%") and r[7].endswith("%")
