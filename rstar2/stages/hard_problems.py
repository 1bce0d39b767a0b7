"""Hard-problem mining for RL stage 3 (paper §4.3; spec §5.4): k rollouts per problem with the stage-2
policy; keep the problems not solved k out of k (paper: k = 8 over all 42K, leaving 17.3K)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .. import seeds
from ..io import read_jsonl, write_jsonl, write_manifest
from ..params import to_dict
from .params import HardProblemsParams, parse
from .rl import select_sources


def run(params: dict, model_dir: str, data_path: str, out_dir: str, model_and_tokenizer=None) -> None:
    """Writes ``pass_counts.jsonl`` (every mined problem with its passes out of k) and ``hard.jsonl``.

    params: ``rstar2.stages.params.HardProblemsParams`` or its JSON dict: k, subset_size (0 = all problems; else
    a seeded random subset), sources (stage 3's rl_data sources; None = all), rollout, seed. ``model_and_tokenizer``: an already loaded (model, tokenizer) instead of ``model_dir`` (tests).
    Raises:
        ValueError: nothing is left after mining (every problem solved k/k): stage 3 would have no data.
    """
    from .. import models, precision
    from ..rollout import Progress, sample_groups

    t0 = time.time()
    p = parse(HardProblemsParams, params, "hard_problems params")
    rows = select_sources(read_jsonl(data_path), p.sources, f"hard_problems ({data_path})")
    random.Random(p.seed).shuffle(rows)
    if p.subset_size:
        rows = rows[: p.subset_size]
    model, tok = model_and_tokenizer or models.load(model_dir)
    k = p.k
    groups = sample_groups(model, tok, rows, k, p.rollout, progress=Progress("hard_problems"),
                           seed=seeds.derive(p.seed, "hard_problems"))
    counted = [{**r, "passes": int(sum(t.reward > 0 for t in g)), "k": k} for r, g in zip(rows, groups)]
    hard = [r for r in counted if r["passes"] < k]
    if not hard:
        raise ValueError(f"hard_problems: all {len(rows)} mined problems were solved {k}/{k}; raise subset_size")
    out = Path(out_dir)
    write_jsonl(out / "pass_counts.jsonl", counted)
    write_jsonl(out / "hard.jsonl", hard)
    write_manifest(out, stage="hard_problems", params=to_dict(p), inputs=[model_dir, data_path],
                   counts={"mined": len(rows), "hard": len(hard), "solved_k_of_k": len(rows) - len(hard)},
                   started=t0, extra={"precision": precision.summary(to_dict(p))})
