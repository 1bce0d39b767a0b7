"""One RL step of the learning task on the old and the new CPU rollout path, same work (issue 19).

Runs the real RL stage (``rstar2.stages.rl.run``: rollouts through the agent loop and the sandbox, grading,
GRPO-RoC selection, one TRL update per step) for ``--steps`` steps from one SFT model, on the old path
(``rollout.kv_reuse: false``: every turn re-prefills its whole context, each of a group's 2G rollouts prefills the
prompt; ``distributed.shared_prefix: false``: the update forwards every row whole) and on the new one (each
trajectory's KV cache kept across turns, a group's prompt prefilled once, the update forwards the batch's shared
prompt prefix once; and the process runtime of today: decoding on the thread that started the rollouts
(``rstar2/rollout/lane.py``, the old path decodes on a worker thread) and glibc's allocator tuned at model load
(``rstar2.memory.tune_allocator``, the old path keeps glibc's defaults)), in fresh processes, alternating ``--rounds``
times. Same config, seed and prompts; sampling draws
from per-trajectory counter-based streams, so both paths sample the same tokens wherever their logits agree (bf16
rounding can flip a rare token: the script counts identical trajectories and tokens, so "equal work" is checked,
not assumed).

    python benchmarks/bench_rl_step.py results/sft/model --steps 2 --rounds 2 [--config config.yaml] [--fp32]

Prints per path: seconds per step (rollout, update = step - rollout), generated and prefilled tokens, tool calls,
and old / new ratios. Measure on a quiet machine and say which CPU (lscpu).

``--compare reproducible`` (issue 22) runs the same step work with ``reproducible: false`` ("off": batches as
requests arrive, the scheduler places by load) and ``true`` ("on": per-engine turn rounds, round-robin placement),
both on the new path, and also reports how many trajectories repeat between the rounds of each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from rstar2.stages import rl
from rstar2.rollout import engines
made = []
init = engines.HFEngine.__init__
def spy(self, *a, **k):
    init(self, *a, **k)
    made.append(self)
engines.HFEngine.__init__ = spy
params, model, data, out, runtime = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
if runtime.get("decode_on_worker_thread"):   # the old path: every batch on asyncio's worker thread
    import asyncio
    async def on_worker(fn, *args):
        return await asyncio.to_thread(fn, *args)
    engines.run_blocking = on_worker
if runtime.get("default_allocator"):         # the old path: glibc's default mmap threshold and trimming
    from rstar2 import models
    models.tune_allocator = lambda: False
rl.run(params, model, data, out)
json.dump({"prefilled": [e.prefilled_tokens for e in made]}, open(out + "/engines.json", "w"))
"""


# the two arms of each comparison: config overrides (A first)
ARMS = {"kv": {"old": {"rollout": {"kv_reuse": False}, "distributed": {"shared_prefix": False}},
               "new": {"rollout": {"kv_reuse": True}, "distributed": {"shared_prefix": True}}},
        "reproducible": {"off": {"reproducible": False}, "on": {"reproducible": True}}}
# what the child process changes in the code itself (no config key selects it): the old runtime
RUNTIME = {"old": {"decode_on_worker_thread": True, "default_allocator": True}}


def _params(config: str, steps: int, arm: dict, seed: int, fp32: bool, heldout: int) -> dict:
    from rstar2.params import to_dict
    from rstar2.stages import params as P

    precision = {"rollout": {"precision": "fp32"}, "distributed": {"bf16": False}} if fp32 else {}
    # heldout > 0: the config's held-out evaluation on that many problems, at step 0 and after the last step
    ho = {"every": steps, "limit": heldout} if heldout else {"benchmark": None}
    cfg = P.validated_config(REPO, (config,), (precision, arm, {"seed": seed, "rl": {
        "checkpoint_every": 0, "heldout": ho, "stages": {"stage1": {"steps": steps}}}},))
    # every row of --data (the config's per-stage source names would select from rl_data's own sources)
    return {**to_dict(P.rl(cfg, "stage1")), "sources": None}


def run_once(model: str, data: str, params: dict, workdir: Path, runtime: dict) -> dict:
    out = workdir / "stage1"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(params), model, data, str(out), json.dumps(runtime)],
                       cwd=REPO, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"RL stage failed:\n{r.stderr[-3000:]}")
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    return {"wall": time.time() - t0, "metrics": metrics, "rollouts": rollouts, "dir": out,
            "prefilled": sum(json.loads((out / "engines.json").read_text())["prefilled"])}


def summary(run: dict) -> dict:
    m = run["metrics"]
    return {"step_s": statistics.fmean(r["step_time_s"] for r in m),
            "rollout_s": statistics.fmean(r["rollout_time_s"] for r in m),
            "update_s": statistics.fmean(r["step_time_s"] - r["rollout_time_s"] for r in m),
            "generated": sum(r["generated_tokens"] for r in run["rollouts"]),
            "tool_calls": sum(len(c) for r in run["rollouts"] for c in [[x for t in r["turns"] for x in t["tool_calls"]]]),
            "prefilled": run["prefilled"], "reward": statistics.fmean(r["reward_mean"] for r in m)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="an SFT model folder (e.g. results/sft/model of the learning config)")
    ap.add_argument("--config", default="configs/cpu-learning.yaml", help="merged over config.yaml")
    ap.add_argument("--data", default="data/learning/train.jsonl")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare", choices=sorted(ARMS), default="kv",
                    help="kv: old vs new CPU rollout path (issue 19); reproducible: reproducible false vs true")
    ap.add_argument("--heldout", type=int, default=0, help="also run the config's held-out evaluation on this many "
                    "problems at step 0 and after the last step (0 = none)")
    ap.add_argument("--fp32", action="store_true", help="float32 rollouts and update (else the config's precision): "
                    "both paths then sample the same tokens wherever the logits agree to float32 rounding")
    a = ap.parse_args()
    data = a.data
    with tempfile.TemporaryDirectory() as tmp:
        # the RL stage reads rl_data rows: id, problem, answer, source
        rows = [json.loads(x) for x in Path(REPO / data).read_text().splitlines()]
        data = str(Path(tmp) / "train.jsonl")
        Path(data).write_text("".join(json.dumps({**r, "source": "arith_train"}) + "\n" for r in rows))
        arms = ARMS[a.compare]
        A, B = list(arms)
        runs: dict[str, list[dict]] = {A: [], B: []}
        for rnd in range(a.rounds):
            for path in ((A, B) if rnd % 2 == 0 else (B, A)):
                wd = Path(tmp) / f"{path}{rnd}"
                params = _params(a.config, a.steps, arms[path], a.seed, a.fp32, a.heldout)
                runs[path].append(run_once(a.model, data, params, wd, RUNTIME.get(path, {}) if a.compare == "kv" else {}))
                s = summary(runs[path][-1])
                print(f"round {rnd} {path}: {s['step_s']:.1f} s/step (rollout {s['rollout_s']:.1f}, update "
                      f"{s['update_s']:.1f}), {s['generated']} generated, {s['prefilled']} prefilled tokens; per step "
                      "(reward, loss, grad norm): " + ", ".join(
                          f"({m['reward_mean']:.3f}, {m['loss'] if m['loss'] is None else round(m['loss'], 5)}, "
                          f"{m['grad_norm'] if m['grad_norm'] is None else round(m['grad_norm'], 4)})"
                          for m in runs[path][-1]["metrics"]), flush=True)
                if a.heldout:
                    print("  held-out: " + "; ".join(
                        f"step {r['step']} accuracy {r['accuracy']:.3f} (n={r['n_problems']}, {r['wall_s']} s)"
                        for r in map(json.loads, (wd / "stage1" / "heldout.jsonl").read_text().splitlines())))
        if a.rounds > 1:  # the whole stage folders, while they exist (rstar2 compare-runs)
            from rstar2.reproduce import compare_runs

            for path, rs in runs.items():
                diffs = [compare_runs(x["dir"], y["dir"]) for x, y in zip(rs, rs[1:])]
                print(f"stage folders of {path} between rounds: " + "; ".join(
                    "identical (timings aside)" if not d else f"{len(d)} files differ, first {d[0]}" for d in diffs))
    print("\npath  s/step  rollout s  update s  generated  prefilled  tool calls  reward")
    means = {}
    for path, rs in runs.items():
        ss = [summary(r) for r in rs]
        means[path] = {k: statistics.fmean(s[k] for s in ss) for k in ss[0]}
        m = means[path]
        print(f"{path:<5} {m['step_s']:6.1f} {m['rollout_s']:10.1f} {m['update_s']:9.1f} {m['generated']:10.0f} "
              f"{m['prefilled']:10.0f} {m['tool_calls']:11.0f} {m['reward']:7.3f}")
    o, n = means[A], means[B]
    print(f"\n{A} / {B}: {o['step_s'] / n['step_s']:.2f}x per step, {o['rollout_s'] / n['rollout_s']:.2f}x rollout, "
          f"{o['update_s'] / n['update_s']:.2f}x update, {o['prefilled'] / n['prefilled']:.1f}x prefilled tokens")
    print(f"equal work: {_same(runs[A], runs[B]):.0%} of trajectories identical in both arms; generated tokens "
          f"{A} {o['generated']:.0f} vs {B} {n['generated']:.0f}")
    if a.rounds > 1:
        for path, rs in runs.items():
            print(f"repeats: {path}: {_same(rs[:-1], rs[1:]):.0%} of trajectories identical between its rounds, "
                  f"metrics rows identical (timings aside): {_same_metrics(rs)}")


def _same(xs: list[dict], ys: list[dict]) -> float:
    """Share of trajectories whose turns are identical (tool-call durations aside), pairing runs of ``xs`` and
    ``ys`` in order."""
    from rstar2.reproduce import first_difference

    return statistics.fmean(sum(first_difference(a_["turns"], b_["turns"]) is None
                                for a_, b_ in zip(x["rollouts"], y["rollouts"])) / len(x["rollouts"])
                            for x, y in zip(xs, ys))


def _same_metrics(runs: list[dict]) -> bool:
    from rstar2.reproduce import first_difference

    return all(first_difference(r["metrics"], runs[0]["metrics"]) is None for r in runs[1:])


if __name__ == "__main__":
    main()
