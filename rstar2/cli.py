"""Command-line entry points, one subcommand per workflow rule (``rstar2 <stage> --params JSON ...``).

The Snakemake rules pass each stage's resolved config section as JSON, so the same command can be run
by hand to debug one stage. Data and config errors exit with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{flag} must be a JSON object")
    return value


def _params(text: str) -> dict:
    return _json_object(text, "--params")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rstar2", description=__doc__)
    sub = parser.add_subparsers(dest="stage", required=True)
    specs = {
        "base-model": [], "sft-data": [], "rl-data": [],
        "sft": ["--model", "--data"], "rl": ["--model", "--data"], "hard-problems": ["--model", "--data"],
        "evaluate": ["--model", "--name"], "report": ["--inputs"], "label-verification": ["--data", "--funnel"],
    }
    for name, extra in specs.items():
        p = sub.add_parser(name)
        p.add_argument("--params", required=True, type=_params, help="the stage's config section as JSON")
        p.add_argument("--out", required=True, help="the stage's output folder")
        for flag in extra:
            p.add_argument(flag, required=True)
        if name == "rl":
            p.add_argument("--optimizer-from", default=None,
                           help="the previous stage's optimizer/ folder (params continue_optimizer)")
        if name == "label-verification":
            p.add_argument("--model", default=None, help="verifier model folder (only when enabled)")
            p.add_argument("--tokenizer", default=None, help="policy model folder whose tokenizer measures prompts "
                                                             "(only with max_prompt_tokens)")
    a = parser.parse_args(argv)
    try:
        _dispatch(a)
    except (ValueError, FileNotFoundError) as e:
        # Data and config errors already name the file, row and field: print just that, not a traceback
        # (set RSTAR2_TRACEBACK=1 to see one).
        if os.environ.get("RSTAR2_TRACEBACK"):
            raise
        print(f"rstar2 {a.stage}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _dispatch(a: argparse.Namespace) -> None:
    sandbox_cfg = os.environ.get("RSTAR2_SANDBOX")
    if sandbox_cfg:
        # The config's sandbox section, set by the workflow in the environment (not in params: it does not
        # change results). Tool calls of this stage (rollouts, SFT data) go through this pool or service.
        from . import sandbox
        sandbox.configure(**json.loads(sandbox_cfg))
    if a.stage == "base-model":
        from .stages import base_model
        base_model.run(a.params, a.out)
    elif a.stage == "sft-data":
        from .stages import sft_data
        sft_data.run(a.params, a.out)
    elif a.stage == "rl-data":
        from .stages import rl_data
        rl_data.run(a.params, a.out)
    elif a.stage == "label-verification":
        from .stages import label_verification
        label_verification.run(a.params, a.data, a.funnel, a.out, model_dir=a.model, tokenizer_dir=a.tokenizer)
    elif a.stage == "sft":
        from .stages import sft
        sft.run(a.params, a.model, a.data, a.out)
    elif a.stage == "rl":
        from .stages import rl
        rl.run(a.params, a.model, a.data, a.out, optimizer_from=a.optimizer_from)
    elif a.stage == "hard-problems":
        from .stages import hard_problems
        hard_problems.run(a.params, a.model, a.data, a.out)
    elif a.stage == "evaluate":
        from .stages import evaluate
        evaluate.run(a.params, a.name, a.model, a.out)
    elif a.stage == "report":
        from .stages import report
        report.run(a.params, _json_object(a.inputs, "--inputs"), a.out)


if __name__ == "__main__":
    sys.exit(main())
