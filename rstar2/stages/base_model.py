"""base_model stage: materialise the configured base model as a plain Hugging Face folder."""

from __future__ import annotations

import time
from pathlib import Path

from ..io import write_manifest


def run(params: dict, out_dir: str) -> None:
    """Writes ``out_dir/model/`` (config, safetensors, tokenizer) and then ``manifest.json``."""
    from .. import models

    t0 = time.time()
    info = models.materialise(params, Path(out_dir) / "model")
    print(f"[base_model] {info}", flush=True)
    write_manifest(out_dir, stage="base_model", params=params, inputs=[], counts=info, started=t0)
