"""base_model stage: materialise the configured base model as a plain Hugging Face folder."""

from __future__ import annotations

import time
from pathlib import Path

from ..io import write_manifest
from ..params import to_dict
from .params import BaseModelParams, parse


def run(params: dict, out_dir: str) -> None:
    """Writes ``out_dir/model/`` (config, safetensors, tokenizer) and then ``manifest.json``.

    params: ``rstar2.stages.params.BaseModelParams`` or its JSON dict (source, path, hub_id, tiny, seed).
    Raises:
        ValueError: a missing or unknown parameter; what ``rstar2.models.materialise`` raises.
    """
    from .. import models

    t0 = time.time()
    p = to_dict(parse(BaseModelParams, params, "base_model params"))
    info = models.materialise(p, Path(out_dir) / "model")
    print(f"[base_model] {info}", flush=True)
    write_manifest(out_dir, stage="base_model", params=p, inputs=[], counts=info, started=t0)
