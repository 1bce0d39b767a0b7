"""Step 0 of the GRPO / GRPO-RoC ablation: does the cold-start model recover from failed tool calls? (issue 23)

Rolls out the SFT model on training problems of the learning task with the RL rollout settings (the RL
stage's first step sees exactly this policy) and counts, among correct trajectories, those with at least one
failed tool call: the trajectories GRPO-RoC can demote and GRPO rewards like clean ones (paper §2.2, Fig. 4).

    python benchmarks/bench_recovery_step0.py results/sft/model --problems 32 --samples 8 \
        --max-response-tokens 320 --max-turns 3 [--data data/learning/train.jsonl] [--json out.json]

Prints accuracy, the tool-error ratio over all calls and over positives' calls (metrics.jsonl's
``tool_error_ratio_pos``), the share of positives with >= 1 failed call (issue 23 asks >= 20%), the share of
trajectories that recovered (a failed call followed by a clean one), first-call statuses and the exception
classes of failed calls, with a 95% bootstrap interval over problems for the share of recovering positives.
Run on 2 cores under ``flock /work/heavy.lock``; say the load (uptime) beside the numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_EXC = re.compile(r"(\w+(?:Error|Exception))\b")


def summarise(trajs: list, samples: int, rng: random.Random) -> dict:
    """The step-0 numbers above from graded trajectories (``samples`` consecutive ones per problem)."""
    pos = [t for t in trajs if t.reward > 0]
    failed = lambda t: any(c["status"] != "ok" for c in t.tool_calls)  # noqa: E731
    recovered = lambda t: any(c["status"] != "ok" for c in t.tool_calls[:-1]) and bool(  # noqa: E731
        t.tool_calls) and t.tool_calls[-1]["status"] == "ok"
    calls = [c for t in trajs for c in t.tool_calls]
    pos_calls = [c for t in pos for c in t.tool_calls]
    excs = collections.Counter(
        (m[-1] if (m := _EXC.findall(c.get("output") or "")) else c["status"]) for c in calls if c["status"] != "ok")
    groups = [trajs[i:i + samples] for i in range(0, len(trajs), samples)]

    def share(gs):
        p = [t for g in gs for t in g if t.reward > 0]
        return sum(map(failed, p)) / len(p) if p else float("nan")
    boot = sorted(share([rng.choice(groups) for _ in groups]) for _ in range(2000))
    boot = [b for b in boot if b == b]
    return {
        "trajectories": len(trajs), "problems": len(groups),
        "accuracy": len(pos) / len(trajs),
        "tool_calls_per_traj": len(calls) / len(trajs),
        "tool_error_ratio": sum(c["status"] != "ok" for c in calls) / len(calls) if calls else None,
        "tool_error_ratio_pos": sum(c["status"] != "ok" for c in pos_calls) / len(pos_calls) if pos_calls else None,
        "positives": len(pos),
        "positives_with_failed_call": sum(map(failed, pos)),
        "share_pos_with_failed_call": share(groups),
        "share_pos_with_failed_call_ci95": [boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]]
        if boot else None,
        "recovered_traj_share": sum(map(recovered, trajs)) / len(trajs),
        "groups_with_clean_and_failed_positive": sum(
            any(t.reward > 0 and failed(t) for t in g) and any(t.reward > 0 and not failed(t) for t in g)
            for g in groups),
        "first_call_status": dict(collections.Counter(t.tool_calls[0]["status"] if t.tool_calls else "no call"
                                                      for t in trajs)),
        "failed_call_kinds": dict(excs.most_common()),
        "truncation_ratio": sum(t.truncated for t in trajs) / len(trajs),
        "response_length_mean": statistics.fmean(len(t.response_ids) for t in trajs),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--data", default=str(REPO / "data/learning/train.jsonl"))
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-response-tokens", type=int, default=320)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=3, help="print this many positives with a failed call")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--dump", help="also write every trajectory here (JSONL: question, gold, reward, finish, turns)")
    a = ap.parse_args(argv)

    from rstar2 import models, rollout
    from rstar2.rollout import RolloutConfig

    rows = [json.loads(x) for x in Path(a.data).read_text().splitlines() if x.strip()]
    rng = random.Random(a.seed)
    picked = rng.sample(rows, a.problems)
    problems = [{"id": r["id"], "problem": r["problem"], "answer": r["answer"]} for r in picked for _ in range(a.samples)]
    model, tok = models.load(a.model, threads=2)
    cfg = RolloutConfig(max_response_tokens=a.max_response_tokens, max_turns=a.max_turns, temperature=a.temperature,
                        batch_size=a.batch_size, precision="bf16")
    t0 = time.time()
    trajs = rollout.run_rollouts(model, tok, problems, cfg, answer_type="integer",
                                 progress=rollout.Progress("step-0 rollouts"))
    out = {"model": a.model, "settings": vars(a), "wall_s": round(time.time() - t0, 1),
           **summarise(trajs, a.samples, rng)}
    print(json.dumps(out, indent=1))
    shown = 0
    for t in trajs:
        if shown < a.show and t.reward > 0 and any(c["status"] != "ok" for c in t.tool_calls):
            shown += 1
            print(f"--- {t.problem_id}: {t.question}")
            for turn in t.turns:
                print(turn["text"])
                for c in turn["tool_calls"]:
                    print(f"[tool {c['status']}] {c['output']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    if a.dump:
        Path(a.dump).write_text("".join(json.dumps({"question": t.question, "gold": t.gold, "reward": t.reward,
                                                    "finish_reason": t.finish_reason, "turns": t.turns}) + "\n"
                                        for t in trajs))
    return out


if __name__ == "__main__":
    main()
