"""Stage ``sft_data``: the non-reasoning SFT cold-start set in the rStar2 wire format (paper §4.1).

The paper's cold start teaches instruction following, JSON function calling and basic coding-tool use, and
deliberately contains **no math reasoning traces**. Its data was not released; ``sft_data.sources`` lists what
goes in instead: local files or hub datasets in one of the formats of :mod:`rstar2.data.sft` (OpenAI
``messages``, ``sharegpt``/glaive, ``alpaca``, ``toolformer``), or generated rows (``generate: string_tools`` or ``recovery``).
The bundled default (data/sft/SOURCE.md): LLaMA-Factory's glaive demo (JSON function calling), GPTeacher
Toolformer python rows (real calls of our code tool whose responses come from running the code in the
sandbox) and LLaMA-Factory's Alpaca demo (instruction following).

Output ``<out_dir>/train.jsonl``: one row per conversation, ``{"id", "source", "messages"}`` with
``messages = [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]``, ready for
:func:`rstar2.chat.encode_conversation`; ``stats.json`` (per source: file, rows available / read / out, every
drop reason with its count, tool calls, sandbox outcomes); and, last, ``manifest.json`` (the same counts).

Every source is read and checked before any code runs or anything is written: a broken file fails the stage
with one line naming the source, file, row and field. Given the seed and the files the output is identical run
to run (sandbox outcomes are deterministic for the code that is kept, barring a snippet that takes about
``tool_timeout_s``); the rows of all sources are shuffled together with ``random.Random(seed)``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from ..data import loaders
from ..data.sft import sources as sft_sources
from ..data.sft.common import check_row
from ..io import write_json, write_jsonl, write_manifest
from ..params import to_dict
from .params import SFTDataParams, parse

STAGE = "sft_data"


def run(params: dict, out_dir: str) -> None:
    """Build ``train.jsonl`` and ``stats.json`` in ``out_dir`` from ``params["sources"]``, then the manifest.

    params: ``rstar2.stages.params.SFTDataParams`` or its JSON dict::

        sources  list of source specs (rstar2.data.sft.sources; the config's sft_data.sources)
        tool     the code tool (config ``tool``: name, timeout_s and memory_mb of an executed call, max_output_chars)
        seed     int: seeds sampling, reason sentences and the final shuffle

    Relative paths start at the working directory (the folder snakemake runs in).

    Raises:
        ValueError: a bad or duplicate source spec, a broken file or row (one line: source, file, row,
            field), duplicate ids across sources, or no conversation left; nothing is written then.
        FileNotFoundError: a source file does not exist.
    """
    started = time.time()
    p = parse(SFTDataParams, params, "sft_data params")
    seed, specs = p.seed, list(p.sources)
    base_dir = loaders.WORKING_DIR
    names = [s.get("name") for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"sft_data: source names must be unique, got {names}")
    for spec in specs:
        sft_sources.check_spec(spec)

    # every source is read and converted before any code runs
    converted = [sft_sources.read(spec, seed, p.tool.name, p.tool.max_output_chars, base_dir) for spec in specs]

    limits = p.tool.limits()  # the same per-call limits as the RL loop
    rows_all: list[dict] = []
    stats: dict = {"seed": seed, "sources": {}}
    for ctx, items, st in converted:
        if "skipped" not in st:
            rows = sft_sources.finish(items, st, ctx, limits)
            rows_all += rows
            print(f"[sft_data] {ctx.name}: {st['rows_in']} in -> {st['rows_out']} out, dropped {st['dropped']}",
                  file=sys.stderr)
        stats["sources"][ctx.name] = st
    if not rows_all:
        why = {k: v.get("skipped") or v["dropped"] for k, v in stats["sources"].items()}
        raise ValueError(f"sft_data: no conversations: every source has limit 0 or n 0, or lost all its rows "
                         f"(per source: {why})")
    ids = [r["id"] for r in rows_all]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"sft_data: two sources produce the same row ids {dup}; rename a source")
    for r in rows_all:
        check_row(r)
    random.Random(seed).shuffle(rows_all)
    stats["rows_out"] = len(rows_all)
    stats["wall_s"] = round(time.time() - started, 2)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", rows_all)
    write_json(out / "stats.json", stats)
    inputs = [loaders.resolve_path(s, base_dir) for s in specs if s.get("path")]
    counts = {"rows": len(rows_all), "per_source": {k: v["rows_out"] for k, v in stats["sources"].items()},
              "dropped": {k: v["dropped"] for k, v in stats["sources"].items()}}
    write_manifest(out, stage=STAGE, params=to_dict(p), inputs=inputs, counts=counts, started=started,
                   extra={"outputs": ["train.jsonl", "stats.json"]})


if __name__ == "__main__":  # python -m rstar2.stages.sft_data OUT_DIR params.json
    run(json.load(open(sys.argv[2])), sys.argv[1])
