"""CPU calibration of the time estimate (issue 36): does the throughput model (rstar2/rl/throughput.py), fed this
machine's measured rates, predict a real rollout phase of an RL stage?

Per round: the real rollout phase of ``--config``'s RL stage 1 (``rstar2.rollout.sample_groups``: the agent loop,
the hf engine, the sandbox; prompts_per_step x 2G rollouts, as one RL step draws), timed; then a decode probe in
the same process with no rollout code involved (one decode step of the rollout batch after a prefill at the
workload's mean context, bf16 copy where rollout.precision gives bf16, as the hf engine decodes), read as bytes per
second in the model's terms (2 bytes per weight + KV cache). From round 1 on the probe is the mean of the probes
before and after the phase (a shared machine's load moves). The model's rollout_phase then predicts the phase from
that rate and the phase's measured workload (generated tokens, longest rollout, tool calls and their measured
latency), and the error is printed. An update probe first (forward, backward, AdamW on two rows of the step's mean length) gives
the FLOP/s used for prefill and printed for the update phase.

The workload (lengths, tool calls) is measured, not predicted: this checks the model's rate-to-time arithmetic, not
``distributed.estimate.response_fill``. The update phase is not compared with a real RL update here (the default
model's rewards are all 0 at the start, so a real step skips its update; docs/scale.md, "Time estimate").

    python benchmarks/bench_throughput_probe.py [--config config.yaml] [--rounds 2] [--model DIR]

Say which CPU (lscpu) and whether other jobs loaded the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_decode(model, batch: int, context: int, bf16: bool, steps: int = 12) -> float:
    """Seconds of one decode step of ``batch`` sequences after a ``context``-token prefill (median of ``steps``)."""
    import copy

    import torch

    m = copy.deepcopy(model).to(torch.bfloat16) if bf16 else model
    ids = torch.randint(0, m.config.vocab_size, (batch, context))
    times = []
    with torch.no_grad():
        out = m(input_ids=ids, use_cache=True)
        past, nxt = out.past_key_values, ids[:, -1:]
        for _ in range(steps + 2):
            t0 = time.perf_counter()
            out = m(input_ids=nxt, past_key_values=past, use_cache=True)
            times.append(time.perf_counter() - t0)
            past = out.past_key_values
    return statistics.median(times[2:])


def probe_update(model, rows: int, length: int, bf16: bool, reps: int = 1) -> float:
    """Seconds of one update of ``rows`` x ``length`` tokens: forward, backward, AdamW step (median of ``reps`` after one warm-up)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-9)
    ids = torch.randint(0, model.config.vocab_size, (rows, length))
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config.yaml", help="merged over config.yaml")
    ap.add_argument("--data", default="data/learning/train.jsonl", help="problems (id, problem), the first "
                    "prompts_per_step of them")
    ap.add_argument("--rounds", type=int, default=2, help="rollout phases measured, each between two probes")
    ap.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M from its wheel)")
    a = ap.parse_args()

    import torch

    from rstar2 import models, precision, rollout
    from rstar2.data.prompt_length import prompt_lengths
    from rstar2.rl import throughput as tp
    from rstar2.rl.memory_plan import shape_from_config
    from rstar2.stages import params as P

    torch.set_num_threads(2)
    p = P.rl(P.validated_config(REPO, (a.config,), ()), "stage1")
    rcfg, k = p.rollout, p.group_size * p.oversample
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model
        if model_dir is None:
            model_dir = str(Path(tmp) / "model")
            models.materialise({"source": "smollm2_wheel"}, model_dir)
        model, tok = models.load(model_dir)
    rows = [json.loads(x) for x in (REPO / a.data).read_text().splitlines()]
    problems = [{"id": str(r["id"]), "problem": r["problem"]} for r in rows[:p.prompts_per_step]]
    prompt = statistics.fmean(prompt_lengths([q["problem"] for q in problems], tok, "python"))
    bf16 = precision.rollout(rcfg.precision, "cpu").bf16
    shape = shape_from_config(model.config.to_dict(), model_dir)
    N, kv = shape.params(), shape.kv_bytes_per_token(2 if bf16 else 4)
    drawn = len(problems) * k
    batch = min(drawn, rcfg.batch_size)
    print(f"workload: rl stage 1 of {a.config}: {drawn} rollouts ({len(problems)} prompts x {k}), prompt "
          f"{prompt:.0f} tokens, max_response_tokens {rcfg.max_response_tokens}, max_turns {rcfg.max_turns}; "
          f"{shape.name}: {N / 1e6:.0f}M parameters, {'bf16' if bf16 else 'fp32'} decode", flush=True)
    # two rows of the step's mean length: the FLOP rate per token barely depends on the row count, the memory does
    kept, length = 2, int(prompt + rcfg.max_response_tokens / 2)
    t_upd = probe_update(model, kept, length, precision.training(p.trainer.bf16, "cpu").bf16)
    print(f"update probe (forward, backward, AdamW; {kept} x {length} tokens): {t_upd:.2f} s = "
          f"{6 * N * kept * length / t_upd / 1e9:.1f} GFLOP/s effective (6 N per token; the prefill rate below)", flush=True)
    flops = 6 * N * kept * length / t_upd
    errors = []
    probes = []
    for rnd in range(a.rounds):
        t0 = time.perf_counter()
        trajs = [t for g in rollout.sample_groups(model, tok, problems, k, rcfg, seed=rnd) for t in g]
        measured = time.perf_counter() - t0
        gen = [t.num_generated_tokens for t in trajs]
        calls = [c for t in trajs for c in t.tool_calls]
        latency = statistics.fmean(c["duration_s"] for c in calls) if calls else 0.0
        ctx = int(prompt + statistics.fmean(gen) / 2)
        # probes on both sides of the measured phase: the machine's load moves (a shared machine)
        probes.append(statistics.fmean(probe_decode(model, batch, ctx, bf16) for _ in range(2)))
        t_dec = probes[-1] if rnd == 0 else statistics.fmean(probes[-2:])
        # read in the model's own terms (2 bytes per weight): at the probed batch the model gives t_dec exactly
        hw = tp.Rates("this CPU", (2 * N + batch * ctx * kv) / t_dec, flops)
        r = tp.rollout_phase(N, kv, hw, drawn, batch, int(prompt), statistics.fmean(gen), max(gen),
                             len(calls) / len(trajs), latency)
        errors.append((r.seconds - measured) / measured)
        print(f"round {rnd}: measured rollout phase {measured:.2f} s; generated {statistics.fmean(gen):.1f} tokens "
              f"per rollout (longest {max(gen)}), {len(calls) / len(trajs):.2f} tool calls at {latency * 1000:.1f} "
              f"ms; probe: decode step at batch {batch}, context {ctx}: {t_dec * 1000:.1f} ms = "
              f"{hw.read_bytes_s / 1e9:.2f} GB/s effective; predicted {r.seconds:.2f} s (decode {r.decode_s:.2f}, "
              f"tool {r.tool_s:.2f}, tail {r.tail_s:.2f}, prefill {r.prefill_s:.3f}): "
              f"error {100 * errors[-1]:+.0f}%", flush=True)
    print(f"rollout phase error over {a.rounds} rounds: mean {100 * statistics.fmean(errors):+.0f}%, "
          f"largest {100 * max(errors, key=abs):+.0f}%")


if __name__ == "__main__":
    main()
