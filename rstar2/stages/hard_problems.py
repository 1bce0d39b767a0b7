"""Hard-problem mining for RL stage 3 (paper §4.3, Table 2): k rollouts per problem with the stage-2
policy; keep the problems not solved k out of k (paper: k = 8 over all 42K, leaving 17.3K), and, with
``min_passes`` > 0, solved at least that many times (problems the policy solves sometimes). With a
``subset_size``, mining goes on over further seeded subsets until ``min_hard`` problems are kept or every problem
was mined: a policy that solves each problem of one small subset always or never would otherwise leave stage 3
nothing."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .. import seeds
from ..io import read_jsonl, write_jsonl, write_manifest
from ..params import to_dict
from ..rollout.scheduler import policy_name
from ..rollout.vllm_reproducible import enable_batch_invariance
from .params import HardProblemsParams, parse
from .rl import select_sources


def run(params: dict, model_dir: str, data_path: str, out_dir: str, model_and_tokenizer=None) -> None:
    """Writes ``pass_counts.jsonl`` (every mined problem with its passes out of k) and ``hard.jsonl``.

    params: ``rstar2.stages.params.HardProblemsParams`` or its JSON dict: k, min_passes, subset_size (0 = all
    problems at once; else problems mined per round, in a seeded order), min_hard (rounds go on until this many are
    kept or the problems run out; 0 = one round), sources (stage 3's rl_data sources; None = all), rollout, seed.
    ``model_and_tokenizer``: an already loaded (model, tokenizer) instead of ``model_dir`` (tests).
    Raises:
        ValueError: nothing is left after mining (every problem solved k/k, or fewer than min_passes times):
            stage 3 would have no data; min_passes not below k.
    """
    from .. import models, precision
    from ..rollout import Progress, sample_groups, shutdown_vllm

    t0 = time.time()
    p = parse(HardProblemsParams, params, "hard_problems params")
    if p.min_passes >= p.k:
        raise ValueError(f"hard_problems.min_passes must be below k ({p.k}), got {p.min_passes}: nothing could be kept")
    rows = select_sources(read_jsonl(data_path), p.sources, f"hard_problems ({data_path})")
    random.Random(p.seed).shuffle(rows)
    model, tok = model_and_tokenizer or models.load(model_dir)
    k, size = p.k, p.subset_size or max(len(rows), 1)
    counted, hard = [], []
    for start in range(0, len(rows), size):
        chunk, n = rows[start:start + size], start // size
        # round 0's seed is the one a single-round mining always had (same run, same samples)
        seed = seeds.derive(p.seed, "hard_problems", *([n] if n else []))
        # each row is graded with its rl_data source's answer_type, as in the RL stages (integer when a row has none)
        groups = sample_groups(model, tok, chunk, k, p.rollout, progress=Progress(f"hard_problems round {n + 1}"),
                               answer_type="integer", seed=seed)
        counted += [{**r, "passes": int(sum(t.reward > 0 for t in g)), "k": k} for r, g in zip(chunk, groups)]
        hard = [r for r in counted if p.min_passes <= r["passes"] < k]
        print(f"[hard_problems] round {n + 1}: {len(hard)} kept of {len(counted)} mined ({len(rows)} problems)",
              flush=True)
        if len(hard) >= p.min_hard or not p.subset_size:
            break
    shutdown_vllm()  # rollout.engine vllm: the AsyncLLM is done (nothing else when there is none)
    if not hard:
        raise ValueError(f"hard_problems: none of {len(counted)} mined problems was solved between {p.min_passes} and "
                         f"{k - 1} times out of {k}" + ("; raise subset_size or min_hard" if len(counted) < len(rows) else "")
                         + (" or lower min_passes" if p.min_passes else ""))
    out = Path(out_dir)
    write_jsonl(out / "pass_counts.jsonl", counted)
    write_jsonl(out / "hard.jsonl", hard)
    write_manifest(out, stage="hard_problems", params=to_dict(p), inputs=[model_dir, data_path],
                   counts={"mined": len(counted), "problems": len(rows), "hard": len(hard), "solved_k_of_k": sum(r["passes"] == k for r in counted),
                           "below_min_passes": sum(r["passes"] < p.min_passes for r in counted)},
                   started=t0, extra={"precision": precision.summary(to_dict(p)),
                          "scheduler": policy_name(p.rollout.scheduler, p.rollout.reproducible),
                          "vllm_batch_invariant": enable_batch_invariance(p.rollout.reproducible, p.rollout.engine)})
