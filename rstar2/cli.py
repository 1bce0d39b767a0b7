"""Command-line entry points, one subcommand per workflow rule (``rstar2 <stage> --params JSON ...``).

The Snakemake rules pass each stage's resolved config section as JSON, so the same command can be run
by hand to debug one stage. Data and config errors exit with status 2 and a one-line message; a stage stopped for a
fault (``rstar2.faults.StageFault``) with status 3 and one line.
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
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object")
    return value


def _params(text: str) -> dict:
    """argparse type of --params: a bad value is a usage error (``rstar2 <stage>: error: ...``, exit 2)."""
    try:
        return _json_object(text, "--params")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# Earlier names of subcommands, still accepted (scripts written for them keep working).
ALIASES = {"rl-data": ["label-verification"]}


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] != ["stage-server"]:
        # a job started from the command line: on a pre-imported stage server when one is configured
        from .stage_client import delegate
        served = delegate(sys.argv)
        if served is not None:
            return served
    parser = argparse.ArgumentParser(prog="rstar2", description=__doc__)
    sub = parser.add_subparsers(dest="stage", required=True)
    specs = {
        "base-model": [], "sft-data": [], "rl-candidates": [],
        "sft": ["--model", "--data"], "rl": ["--model", "--data"], "hard-problems": ["--model", "--data"],
        "evaluate": ["--model", "--name"], "report": ["--inputs"], "rl-data": ["--data", "--funnel"],
    }
    # the workflow rule each subcommand runs: the same name (stages/<name>.py), "-" for "_"
    rules = {"base-model": "base_model: the base model folder", "sft-data": "sft_data: the cold-start SFT data",
             "rl-candidates": "rl_candidates: the RL curation funnel up to label verification",
             "rl-data": "rl_data: prompt length and label verification, the final RL set",
             "sft": "sft: the non-reasoning cold start", "rl": "rl: one RL stage or ablation run (GRPO-RoC)",
             "hard-problems": "hard_problems: mine problems not always solved", "evaluate": "evaluate: one model",
             "report": "report: the summary, figures and HTML"}
    flags = {"--model": "input model folder (Hugging Face format)", "--data": "input JSONL rows of the stage",
             "--name": "the evaluated model's label (e.g. sft, rl_stage3)", "--funnel": "rl_candidates' funnel.json",
             "--inputs": "JSON object of the report's input folders by name"}
    for name, extra in specs.items():
        p = sub.add_parser(name, help=f"rule {rules[name]}", description=f"Workflow rule {rules[name]}.",
                           aliases=ALIASES.get(name, []))
        p.add_argument("--params", required=True, type=_params, help="the stage's config section as JSON")
        p.add_argument("--out", required=True, help="the stage's output folder")
        p.add_argument("--log", default=None, help="the job's log: the params' digest and JSON are appended to it "
                                                   "(the workflow's rules; the console gets the digest only)")
        for flag in extra:
            p.add_argument(flag, required=True, help=flags[flag])
        if name == "rl":
            p.add_argument("--optimizer-from", default=None,
                           help="the previous stage's optimizer/ folder (params continue_optimizer)")
            p.add_argument("--checkpoint-every", type=int, default=None,
                           help="steps between resumable checkpoints (rl.checkpoint_every), set over --params' value; "
                                "default: $RSTAR2_CHECKPOINT_EVERY, where the workflow puts it so that changing it "
                                "reruns no finished stage")
        if name == "rl-data":
            p.add_argument("--model", default=None, help="verifier model folder (only when enabled)")
            p.add_argument("--tokenizer", default=None, help="policy model folder whose tokenizer measures prompts "
                                                             "(only with max_prompt_tokens)")
    _reproduce_parsers(sub)
    p = sub.add_parser("stage-server", help="serve stage jobs from one pre-imported process (small runs, tests)",
                       description="Listen on SOCKET; `rstar2 <stage>` commands with RSTAR2_STAGE_SERVER=SOCKET in "
                                   "their environment fork from this process instead of importing torch, "
                                   "transformers and TRL themselves (rstar2/stages/server.py).")
    p.add_argument("socket", help="path of the Unix socket to create")
    a = parser.parse_args(argv)
    if a.stage == "stage-server":
        from .stages import server
        server.serve(a.socket, run=main)
        return 0
    a.stage = next((name for name, old in ALIASES.items() if a.stage in old), a.stage)
    if a.stage in ("compare-runs", "reproduce"):
        return _reproduce(a)
    from .faults import StageFault

    if argv is None:
        _lighter_imports(a)
    try:
        _dispatch(a)
    except StageFault as e:
        # A fault the stage must not train through (rstar2.faults): one line; its checkpoints stay for a rerun.
        if os.environ.get("RSTAR2_TRACEBACK"):
            raise
        print(f"rstar2 {a.stage}: stopped: {e}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError) as e:
        # Data and config errors already name the file, row and field: print just that, not a traceback
        # (set RSTAR2_TRACEBACK=1 to see one).
        if os.environ.get("RSTAR2_TRACEBACK"):
            raise
        print(f"rstar2 {a.stage}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _reproduce_parsers(sub) -> None:
    p = sub.add_parser("compare-runs", help="list the artifacts in which two results folders differ",
                       description="Compare two results folders, ignoring fields that record wall-clock time "
                                   "(rstar2.reproduce.IGNORED_FIELDS); exit 1 when they differ.")
    p.add_argument("a", help="results folder of run A (or its workflow folder)")
    p.add_argument("b", help="results folder of run B (or its workflow folder)")
    p = sub.add_parser("reproduce", help="run a config twice in scratch copies and compare the results",
                       description="Run snakemake twice with the same config into WORKDIR/a and WORKDIR/b, then "
                                   "compare-runs their results folders; exit 1 when they differ.")
    p.add_argument("--configfile", nargs="*", default=[], help="config files merged over config.yaml")
    p.add_argument("--workdir", required=True, help="a new or empty folder for the two scratch copies")
    p.add_argument("--cores", type=int, default=2, help="snakemake --cores for each run (default: 2)")
    p.add_argument("--target", action="append", default=[], dest="targets",
                   help="a snakemake target, e.g. results/rl/stage1/manifest.json (repeatable; default: everything)")


def _reproduce(a: argparse.Namespace) -> int:
    from pathlib import Path

    from . import reproduce

    repo = Path(__file__).resolve().parents[1]
    try:
        if a.stage == "compare-runs":
            first, second = a.a, a.b
            diffs = reproduce.compare_runs(first, second)
        else:
            diffs = reproduce.run_twice(repo, Path(a.workdir), a.configfile, a.targets, a.cores)
            first, second = Path(a.workdir) / "a", Path(a.workdir) / "b"
        n = reproduce.compared_files(first, second)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"rstar2 {a.stage}: error: {e}", file=sys.stderr)
        return 2
    tag = f"[{a.stage}]"
    if not diffs:
        print(f"{tag} identical: {n} files compared (ignoring " + ", ".join(sorted(reproduce.IGNORED_FIELDS)) + ")")
        return 0
    print(f"{tag} {len(diffs)} of {n} compared files differ; the first: {diffs[0]}")
    for d in diffs[1:]:
        print(f"  {d}")
    return 1


def _log_params(a: argparse.Namespace) -> None:
    """The params' digest (what Snakemake's ``reason:`` lines show: ``rstar2.io.ParamsJSON``) on the console, and
    with their JSON in the job's log (``--log``; under a multi-process launch, by the first process only)."""
    from .io import ParamsJSON

    if os.environ.get("RANK", "0") != "0":
        return
    text = ParamsJSON(json.dumps(a.params, sort_keys=True))
    if a.log:   # before anything is printed: the console's copy reaches the log through tee, later
        with open(a.log, "a", encoding="utf-8") as f:
            f.write(f"params sha256:{text.digest} {text}\n")
    print(f"[{a.stage}] params sha256:{text.digest}" + (f" (the JSON: {a.log})" if a.log else ""), flush=True)


MODEL_STAGES = ("base-model", "sft", "rl", "hard-problems", "evaluate")


def _lighter_imports(a: argparse.Namespace) -> None:
    """Imports a stage job does not use, left out. Only for a process that is one job (``main()`` with the
    command line's arguments): a caller passing ``argv`` may run other stages in the same process.

    * transformers' generation module imports scikit-learn (about 2-3 s of CPU on a 2-core Zen 3) for the ROC curve
      of assisted generation, which no stage uses: it is imported while ``sklearn`` is hidden (None in
      ``sys.modules``, for which ``importlib.util.find_spec`` answers None), then ``sklearn`` is importable again
      (lm-eval's IFEval checker may need it). transformers caches its answer (``is_sklearn_available``).
    * an RL job on the transformers engine (``rollout.engine: hf``): TRL sees vLLM as not installed, for good;
      where vLLM is installed (the test dependency, the GPU extra), importing TRL's GRPO trainer otherwise imports
      vLLM too, about 5 s of CPU, for rollouts that never use it. Not done once vLLM is imported.
    """
    if a.stage in MODEL_STAGES and "sklearn" not in sys.modules:
        sys.modules["sklearn"] = None
        try:
            import transformers.generation.candidate_generator  # noqa: F401
        finally:
            if sys.modules.get("sklearn", 0) is None:
                del sys.modules["sklearn"]
    if a.stage == "rl" and a.params.get("rollout", {}).get("engine") == "hf" and "vllm" not in sys.modules:
        sys.modules["vllm"] = None


def _dispatch(a: argparse.Namespace) -> None:
    _log_params(a)
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
    elif a.stage == "rl-candidates":
        from .stages import rl_candidates
        rl_candidates.run(a.params, a.out)
    elif a.stage == "rl-data":
        from .stages import rl_data
        rl_data.run(a.params, a.data, a.funnel, a.out, model_dir=a.model, tokenizer_dir=a.tokenizer)
    elif a.stage == "sft":
        from .stages import sft
        sft.run(a.params, a.model, a.data, a.out)
    elif a.stage == "rl":
        from .stages import rl
        every = a.checkpoint_every if a.checkpoint_every is not None else os.environ.get("RSTAR2_CHECKPOINT_EVERY")
        params = a.params if every is None else {**a.params, "checkpoint_every": int(every)}
        faults = os.environ.get("RSTAR2_RL_FAULTS")  # rl.faults, put there by the workflow (common.smk)
        params = params if faults is None or "faults" in params else {**params, "faults": json.loads(faults)}
        rl.run(params, a.model, a.data, a.out, optimizer_from=a.optimizer_from)
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
