"""CPU: how much of each decode batch's KV cache is left padding (issue 37), logged during a real stage.

Runs an ``rstar2`` command (e.g. the ``rstar2 evaluate ...`` line of ``snakemake -n -p``) with
``rstar2.rollout.hf_cache._decode`` wrapped: per call it records the rows, the shared prefix's length, the
left-padded cache width after it, each row's own cached tokens at entry, the new tokens per row and the call's
wall time, and writes them as JSON to ``--out``, then prints one line per call (pad share = 1 - mean own tokens /
width). The one-token attention reads the whole width for every row, so the pad share is attention memory
traffic spent on masked keys.

Run: ``python benchmarks/log_decode_padding.py --out pad.json -- evaluate --params '...' --name sft --model M --out D``.
"""

from __future__ import annotations

import argparse
import json
import time

import rstar2.rollout.hf_cache as hf_cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for the per-call records")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the rstar2 command's arguments, after --")
    a = ap.parse_args()
    original, log = hf_cache._decode, []

    def logged(model, cache, mask, logits, context, limits, *args, **kwargs):
        t0 = time.perf_counter()
        out = original(model, cache, mask, logits, context, limits, *args, **kwargs)
        prefix = args[5] if len(args) > 5 else kwargs.get("prefix")   # _decode's shared-prefix KV, or None
        log.append({"rows": len(context), "prefix": prefix[0][0].shape[-2] if prefix else 0,
                    "width": mask.shape[1], "own": mask.sum(-1).tolist(),
                    "new": [len(ids) for ids, _ in out], "s": time.perf_counter() - t0})
        return out

    hf_cache._decode = logged
    from rstar2 import cli

    try:
        cli.main(a.command[1:] if a.command[:1] == ["--"] else a.command)
    finally:
        with open(a.out, "w") as f:
            json.dump(log, f)
        for c in log:
            own, new = c["own"], c["new"]
            pad = 1 - sum(own) / (len(own) * c["width"])
            print(f"rows {c['rows']:4d} shared prefix {c['prefix']:4d} width {c['width']:4d} own mean "
                  f"{sum(own) / len(own):6.1f} min {min(own):4d} max {max(own):4d} pad share {pad:5.1%} "
                  f"new tokens mean {sum(new) / len(new):6.1f} max {max(new):4d} decode {c['s']:6.1f} s")


if __name__ == "__main__":
    main()
