"""Checks the workflow runs when it parses the config, so that a bad setting fails before any job starts.

Called from ``workflow/rules/common.smk`` after schema validation (``rstar2.config_schema``; this module is the
top layer, beside ``cli.py``):

- ``check_config``: names that must exist (benchmarks, evaluated models), the order of the RL stages, the shape
  of the ablation; the config alone, no files read.
- ``check_data_files``: every local dataset path exists (hub ids are not files).
- ``cached_check``: the RL held-out benchmark loads and shares no problem with any training source. Loading every
  source costs seconds (pandas, a 17K-row parquet) on every ``snakemake -n``, so a passed check is remembered
  under a key made of the config it read and the size and mtime of each file; a changed file checks again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def check_config(config: dict, rl_stages: list[str], model_dirs: dict) -> list[tuple[str, int]]:
    """Validate names and structure of an already schema-validated config.

    Returns:
        The ablation runs ``[(mode, seed), ...]`` (every mode with every seed; empty without an ablation).
    Raises:
        ValueError: a local model whose folder does not exist, a hub model without hub_id, two rl_data sources of one name, RL stages
            enabled out of order, an evaluated model this run does not train, a benchmark name
            (held-out, decontamination, evaluation, per-benchmark limit, report lead) that is not defined, an
            enabled stage no rl_data source trains, hard_problems.min_passes not below k with stage 3 enabled, or an
            ablation with modes but no seeds (or the reverse).
    """
    for key, spec in (("model", config["model"]),
                      ("label_verification.model", config["label_verification"]["model"]
                       if config["label_verification"]["enabled"] else None)):
        if spec and spec.get("source") == "local" and not (spec.get("path") and os.path.isdir(spec["path"])):
            raise ValueError(f"config: {key}.source is local, but {key}.path {spec.get('path')!r} is not a folder "
                             "(a transformers model folder: config.json, weights, tokenizer)")
        if spec and spec.get("source") == "hub" and not spec.get("hub_id"):
            raise ValueError(f"config: {key}.source is hub, but {key}.hub_id is not set (e.g. Qwen/Qwen3-14B-Base)")
    names = [s["name"] for s in config["rl_data"]["sources"]]
    if len(set(names)) < len(names):
        raise ValueError(f"config: rl_data.sources names {sorted({n for n in names if names.count(n) > 1})} more than "
                         "once (a source's name prefixes its problem ids and names it in the funnel)")
    if rl_stages != ["stage1", "stage2", "stage3"][: len(rl_stages)]:
        raise ValueError(f"config: rl.stages must enable stage1, stage1-2 or stage1-3 in order; enabled: {rl_stages}")
    hp = config["hard_problems"]
    if "stage3" in rl_stages and hp["min_passes"] >= hp["k"]:
        raise ValueError(f"config: hard_problems.min_passes ({hp['min_passes']}) must be below hard_problems.k "
                         f"({hp['k']}): no mined problem could be kept for stage 3")
    known = set(config["benchmarks"])
    heldout = config["rl"]["heldout"]["benchmark"]
    if heldout is not None and heldout not in known:
        raise ValueError(f"config: rl.heldout.benchmark names benchmark {heldout!r}, which is not defined under "
                         f"'benchmarks' (defined: {sorted(known)})")
    if heldout is not None and config["benchmarks"][heldout].get("answer_type") in ("ifeval", "bfcl"):
        kind = config["benchmarks"][heldout]["answer_type"]
        raise ValueError(f"config: rl.heldout.benchmark {heldout!r} is an {kind} benchmark, checked on whole "
                         "responses by its own checker; the held-out evaluation grades answers like the reward")
    for m in config["evaluate"]["models"]:
        if m not in model_dirs:
            raise ValueError(f"config: evaluate.models names {m!r}, which this run does not train "
                             f"(models: {sorted(model_dirs)}; rl.stages enables {rl_stages})")
    for key in ("rl_data.decontaminate_against", "evaluate.benchmarks"):
        section, field = key.split(".")
        for name in config[section][field]:
            if name not in known:
                raise ValueError(f"config: {key} names benchmark {name!r}, which is not defined under "
                                 f"'benchmarks' (defined: {sorted(known)})")
    lead = config["report"]["lead_benchmark"]
    if lead is not None and lead not in known:  # a typo would silently leave the report without its lead
        raise ValueError(f"config: report.lead_benchmark names benchmark {lead!r}, which is not defined under "
                         f"'benchmarks' (defined: {sorted(known)})")
    per = config["evaluate"]["limit"] if isinstance(config["evaluate"]["limit"], dict) else {}
    for name in set(per) - {"default"}:  # a limit of a benchmark not evaluated in this run is unused
        if name not in known:
            raise ValueError(f"config: evaluate.limit names benchmark {name!r}, which is not defined under "
                             f"'benchmarks' (defined: {sorted(known)})")
    for stage in rl_stages:
        if not any(stage in s["stages"] for s in config["rl_data"]["sources"]):
            names = {s.get("name"): s["stages"] for s in config["rl_data"]["sources"]}
            raise ValueError(f"config: rl stage {stage} is enabled but no rl_data source lists it in its 'stages' "
                             f"(sources and their stages: {names})")
    ab = config["ablation"]
    if bool(ab["modes"]) != bool(ab["seeds"]):
        raise ValueError(f"config: ablation needs both modes and seeds (got modes {ab['modes']}, seeds {ab['seeds']}); "
                         "with one of them empty no run would be planned")
    return [(m, s) for m in ab["modes"] for s in ab["seeds"]]


def check_data_files(paths) -> list[str]:
    """The local files among ``paths`` (``None`` and ``hub:`` ids left out), each of which must exist.

    ``paths``: a list of paths, or ``(config key, path)`` pairs so that a missing file's message names the key
    that set it (e.g. ``rl_data.sources[0].path``).
    A missing file fails here, at parse time: otherwise Snakemake may keep the outputs built from the old file and
    never schedule the stage that would report it.
    Raises:
        ValueError: a local path does not exist (relative paths start at the working directory, which is named).
    """
    pairs = [p if isinstance(p, tuple) else (None, p) for p in paths]
    local = [(key, str(p)) for key, p in pairs if p and not str(p).startswith("hub:")]
    missing = [f"{key}: {p}" if key else p for key, p in local if not os.path.exists(p)]
    if missing:
        raise ValueError(f"config: data file(s) not found (paths are relative to {os.getcwd()}): "
                         + "; ".join(missing))
    return [p for _, p in local]


def check_benchmarks(config: dict) -> None:
    """Load every local benchmark the evaluate stage will read (a fraction of a second for the bundled ones), so
    a wrong field mapping or a bad row fails before SFT, not when evaluation starts. Hub ids are not fetched.

    Raises:
        ValueError: a benchmark cannot be loaded; the message names it and ``load_benchmark``'s file, row, field.
    """
    if not config["evaluate"]["models"]:
        return
    from .data.benchmarks import load_benchmark

    for name in config["evaluate"]["benchmarks"]:
        spec = config["benchmarks"][name]
        if str(spec.get("path", "")).startswith("hub:"):
            continue
        try:
            load_benchmark(name, spec)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"config: benchmarks.{name} cannot be loaded: {e}") from None


def _file_key(path: str) -> list:
    try:
        st = os.stat(path)
        return [path, st.st_size, st.st_mtime_ns]
    except OSError:
        return [path, None, None]


def _stamp(cache_dir: str, tag: str, payload: dict, files: list[str]) -> Path:
    """The file whose existence records that the check ``tag`` passed on ``payload`` and these files' sizes and
    mtimes (an edited file or setting gives another stamp, so the check runs again)."""
    key = hashlib.sha256(json.dumps({**payload, "files": [_file_key(f) for f in files]}, sort_keys=True,
                                    default=str).encode()).hexdigest()
    return Path(cache_dir) / f"{tag}-{key[:32]}.ok"


def check_rl_sources(config: dict, cache_dir: str) -> None:
    """Load every local rl_data source now, so a wrong field mapping, filter column or bad row fails before the
    first job starts, not when rl_candidates runs. The full load takes about a second for the bundled pools, so a
    passed check is cached by the sources' settings and their files' sizes and mtimes. Hub ids are not fetched.

    Raises:
        ValueError: ``config: rl_data.sources[i] (<name>) cannot be loaded: ...`` with ``load_source``'s message
            (dataset, file, row, field); or a source none of whose rows yields a gold answer (e.g. an
            ``answer_after`` marker that occurs in no answer), which curation would drop whole as "no_answer"; or
            a source that loses more than ``rl_data.max_filtered_share`` of its rows to its answer-type filter
            (``rstar2.data.drop_checks``; a smaller loss prints a warning line on every run).
    """
    # a missing file is left to check_data_files, whose message says what to do about it
    sources = [(i, s) for i, s in enumerate(config["rl_data"]["sources"]) if os.path.exists(s["path"])]
    rl = config["rl_data"]
    stamp = _stamp(cache_dir, "rl-sources", {"sources": [s for _, s in sources], "max_abs": rl["max_abs_answer"],
                                             "shares": rl["max_filtered_share"]}, [s["path"] for _, s in sources])
    if stamp.exists():   # passed before: its warnings are shown again on every run, not only the first
        for line in json.loads(stamp.read_text()).get("warnings", []):
            print(line, file=sys.stderr)
        return
    from .data.curate import curate
    from .data.drop_checks import check_answer_filter
    from .data.loaders import load_source

    for i, src in sources:
        try:
            rows = load_source(src)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"config: rl_data.sources[{i}] ({src['name']}) cannot be loaded: {e}") from None
        if rows and all(r["answer_raw"] is None for r in rows):
            how = (f"answer_after {src['answer_after']!r} occurs in none of them" if src.get("answer_after") else
                   "answer_from_boxed finds no \\boxed{} in any" if src.get("answer_from_boxed") else "every one is empty")
            raise ValueError(f"config: rl_data.sources[{i}] ({src['name']}): none of its {len(rows)} rows has a gold "
                             f"answer in field {src['fields'].get('answer')!r} ({how}); curation would drop them all")
    # what each source loses to its answer-type filter (rstar2.data.drop_checks), the source alone: no dedupe across
    # sources, no decontamination; above rl_data.max_filtered_share an error, below a warning
    warnings = []
    for i, src in sources:
        _, funnel = curate([src], {}, max_abs_answer=rl["max_abs_answer"], near_dedupe={"enabled": False})
        warnings += check_answer_filter(funnel, [src], rl["max_filtered_share"], where="config", index=i)
    for line in warnings:
        print(line, file=sys.stderr)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"sources": [s["name"] for _, s in sources], "warnings": warnings}) + "\n")


def check_reward(config: dict) -> None:
    """Load ``rl.reward`` when it names a user function and call it once on the first row with a gold of the first
    local rl_data source (``rstar2.grading.rewards.check``), so a wrong one fails before any job. The built-in
    costs nothing; a user reward is imported on every DAG build (not cached: its module may change).

    Raises:
        ValueError: ``config: rl.reward ...`` in one line (import, signature, the dry call's exception or value).
    """
    spec = config["rl"]["reward"]
    from .grading import rewards

    if spec in rewards.BUILTIN:
        return
    row = None
    for src in config["rl_data"]["sources"]:
        if os.path.exists(src["path"]):
            from .data.loaders import load_source

            try:
                rows = load_source(src)
            except (OSError, ValueError, KeyError):
                continue  # check_rl_sources names the bad source
            row = next(({**r, "answer": str(r["answer_raw"]).strip(), "answer_type": src.get("answer_type")}
                        for r in rows if r["answer_raw"] is not None), None)
            if row is not None:
                break
    try:
        rewards.check(spec, row)
    except ValueError as e:
        raise ValueError(f"config: {e}") from None


def check_sft_sources(config: dict, cache_dir: str) -> None:
    """Read and convert every local sft_data file source now (no tool call is run), so a bad spec, a wrong field
    mapping or a broken row fails before the first job, not when sft_data runs; cached like ``check_rl_sources``.
    Generated sources, ``limit: 0`` ones and hub ids are left to the stage.

    Raises:
        ValueError: ``config: sft_data.sources[i] (<name>) cannot be loaded: ...`` with the source's message (file,
            row, field), or two sources of one name.
    """
    specs = config["sft_data"]["sources"]
    names = [s.get("name") for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"config: sft_data.sources: names must be unique, got {names}")
    local = [(i, s) for i, s in enumerate(specs) if s.get("path") and s.get("limit") != 0
             and not str(s["path"]).startswith("hub:") and os.path.exists(s["path"])]
    stamp = _stamp(cache_dir, "sft-sources", {"sources": [s for _, s in local], "tool": config["tool"]},
                   [s["path"] for _, s in local])
    if stamp.exists():
        return
    from .data import loaders
    from .data.sft import sources as sft_sources

    for i, spec in local:
        try:
            sft_sources.read(spec, config["seed"], config["tool"]["name"], config["tool"]["max_output_chars"],
                             loaders.WORKING_DIR)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"config: sft_data.sources[{i}] ({spec['name']}) cannot be loaded: {e}") from None
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"sources": [s["name"] for _, s in local]}) + "\n")


def cached_check(config: dict, cache_dir: str) -> None:
    """The held-out benchmark checks of ``check_heldout``, skipped when the same check passed before.

    Raises:
        ValueError: what ``check_heldout`` raises (nothing is cached then).
    """
    name = config["rl"]["heldout"]["benchmark"]
    if name is None:
        return
    decontaminated = name in config["rl_data"]["decontaminate_against"]
    sources = [] if decontaminated else config["rl_data"]["sources"]
    spec = config["benchmarks"][name]
    files = [spec["path"]] + [s["path"] for s in sources]
    stamp = _stamp(cache_dir, "heldout", {"name": name, "spec": spec, "sources": sources,
                                          "decontaminated": decontaminated}, files)
    if stamp.exists():
        return
    check_heldout(config)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"benchmark": name, "files": files}) + "\n")


def warn_heldout_answer_type(config: dict, rl_stages: list[str]) -> str | None:
    """The warning line (also printed to stderr) when the RL held-out benchmark is graded with another answer type
    than the answer reward grades the sources the enabled RL stages train on; None when it is not.

    Called after every check has passed, so it never stands before a refusal whose fix is elsewhere (a source that
    loses its rows to the integer filter wants ``answer_type: math`` on the source, not on the benchmark). No
    warning under another ``rl.reward`` (a user's function or the tiny config's smoke reward): answer types say
    nothing about what it rewards. A benchmark graded more leniently can count what the reward does not (an
    unevaluated expression boxed as the answer scores 1 under Math-Verify, 0 under the integer grader).
    """
    from .grading.rewards import BUILTIN

    name = config["rl"]["heldout"]["benchmark"]
    trained = [s for s in config["rl_data"]["sources"] if set(s.get("stages", rl_stages)) & set(rl_stages)]
    if name is None or config["rl"]["reward"] not in BUILTIN or not trained:
        return None
    answer_type = config["benchmarks"][name].get("answer_type", "math")
    rl_types = {s.get("answer_type", "integer") for s in trained}
    if answer_type in rl_types:
        return None
    want = " or ".join(repr(t) for t in sorted(rl_types))
    line = (f"warning: rl.heldout.benchmark {name!r} is graded with answer_type {answer_type!r}, the answer reward "
            f"of the RL stages with {want} (their rl_data.sources[].answer_type): set benchmarks.{name}.answer_type "
            "to measure what RL trains for")
    print(line, file=sys.stderr)   # not cached: shown on every run, not only the first
    return line


def check_heldout(config: dict) -> None:
    """The RL held-out benchmark is read only when RL starts (after SFT); read it now so a bad file fails first,
    and refuse one that shares problems with a training source (its curve would measure memorisation).

    Raises:
        ValueError: the benchmark cannot be loaded (the message names file, row and field), or a held-out problem
            is also a problem of an rl_data source that is not decontaminated against it.
    """
    from .data.benchmarks import load_benchmark

    name = config["rl"]["heldout"]["benchmark"]
    try:
        heldout = load_benchmark(name, config["benchmarks"][name])
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"config: rl.heldout.benchmark {name!r} cannot be loaded: {e}") from None
    if name in config["rl_data"]["decontaminate_against"]:
        return  # rl_data removes its problems (and near-copies) from the training data
    from .data.loaders import load_source
    from .rl.heldout import check_disjoint

    for src in config["rl_data"]["sources"]:
        try:
            check_disjoint(heldout, load_source(src), name, f"rl_data source {src.get('name', src.get('path'))!r}")
        except ValueError as e:
            raise ValueError(f"config: {e}") from None


def check_before_jobs(config: dict, cache_dir: str) -> tuple[list[str], dict, list[tuple[str, int]]]:
    """Every check ``workflow/rules/common.smk`` runs on a schema-validated config when Snakemake builds the DAG, in
    its order; the tests call this one function instead of a ``snakemake -n`` per refused config. Paths in the
    config are relative to the working directory (the workflow folder).

    Warnings (stderr) come from the checks that passed, and the held-out answer-type warning
    (:func:`warn_heldout_answer_type`) only once every check has passed.

    Returns:
        (the enabled RL stages in order, the folder of each trainable model by name, the ablation runs)
    Raises:
        ValueError: the first refusal (one line starting ``config:``), from :func:`check_config`,
            :func:`cached_check`, :func:`check_rl_sources`, :func:`check_reward`, :func:`check_sft_sources` or
            :func:`check_benchmarks`.
    """
    # RL stages run in order; a null stage ends the pipeline at the one before (configs/cpu-learning.yaml: stage 1)
    rl_stages = [s for s in ("stage1", "stage2", "stage3") if config["rl"]["stages"].get(s)]
    model_dirs = {"base": "results/base_model", "sft": "results/sft",
                  **{f"rl_{s}": f"results/rl/{s}" for s in rl_stages}}
    # names, stage order, ablation shape: the config alone
    ablation_runs = check_config(config, rl_stages, model_dirs)
    # the RL held-out benchmark loads and shares no problem with the training sources (cached: loading is slow)
    cached_check(config, cache_dir)
    # every local rl_data source loads (field mapping, filters, rows); cached the same way
    check_rl_sources(config, cache_dir)
    # rl.reward: a user reward function imports, takes (completion, answer, answer_type) and answers one real row
    check_reward(config)
    # every local sft_data file source reads and converts (no tool call is run)
    check_sft_sources(config, cache_dir)
    # every local benchmark the evaluate stage reads loads now (field mapping, rows), not after SFT
    check_benchmarks(config)
    # last, once nothing is refused: a warning printed before a refusal would point at the wrong fix
    warn_heldout_answer_type(config, rl_stages)
    return rl_stages, model_dirs, ablation_runs
