"""Hard-problem mining for RL stage 3 (paper §4.3, Table 2): k rollouts per problem with the stage-2
policy; keep the problems not solved k out of k (paper: k = 8 over all 42K, leaving 17.3K), and, with
``min_passes`` > 0, solved at least that many times (problems the policy solves sometimes)."""

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

    params: ``rstar2.stages.params.HardProblemsParams`` or its JSON dict: k, min_passes, subset_size (0 = all problems; else
    a seeded random subset), sources (stage 3's rl_data sources; None = all), rollout, seed. ``model_and_tokenizer``: an already loaded (model, tokenizer) instead of ``model_dir`` (tests).
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
    if p.subset_size:
        rows = rows[: p.subset_size]
    model, tok = model_and_tokenizer or models.load(model_dir)
    k = p.k
    # each row is graded with its rl_data source's answer_type, as in the RL stages (integer when a row has none)
    groups = sample_groups(model, tok, rows, k, p.rollout, progress=Progress("hard_problems"), answer_type="integer",
                           seed=seeds.derive(p.seed, "hard_problems"))
    shutdown_vllm()  # rollout.engine vllm: the AsyncLLM is done (nothing else when there is none)
    counted = [{**r, "passes": int(sum(t.reward > 0 for t in g)), "k": k} for r, g in zip(rows, groups)]
    hard = [r for r in counted if p.min_passes <= r["passes"] < k]
    if not hard:
        raise ValueError(f"hard_problems: none of {len(rows)} mined problems was solved between {p.min_passes} and "
                         f"{k - 1} times out of {k}; raise subset_size" + (" or lower min_passes" if p.min_passes else ""))
    out = Path(out_dir)
    write_jsonl(out / "pass_counts.jsonl", counted)
    write_jsonl(out / "hard.jsonl", hard)
    write_manifest(out, stage="hard_problems", params=to_dict(p), inputs=[model_dir, data_path],
                   counts={"mined": len(rows), "hard": len(hard), "solved_k_of_k": sum(r["passes"] == k for r in counted),
                           "below_min_passes": sum(r["passes"] < p.min_passes for r in counted)},
                   started=t0, extra={"precision": precision.summary(to_dict(p)),
                          "scheduler": policy_name(p.rollout.scheduler, p.rollout.reproducible),
                          "vllm_batch_invariant": enable_batch_invariance(p.rollout.reproducible, p.rollout.engine)})
