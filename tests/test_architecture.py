"""The package's structure: layers whose imports point down only, no import cycle, nothing heavy in
the grading workers, and every stage parameter's default taken from the config schema and nowhere else."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, workflow_config

PKG = REPO_ROOT / "rstar2"
SCHEMA = yaml.safe_load((REPO_ROOT / "workflow/schemas/config.schema.yaml").read_text())

# Top: what the workflow calls. Middle: RL, rollouts, the report. Ground: everything else (data, grading, sandbox,
# the wire format, metrics, io, models, params).
TOP = ("rstar2.cli", "rstar2.stages", "rstar2.workflow_checks", "rstar2.config_schema", "rstar2.reproduce")
MIDDLE = ("rstar2.rl", "rstar2.rollout", "rstar2.report")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    if any(module == t or module.startswith(t + ".") for t in TOP):
        return 2
    if any(module == m or module.startswith(m + ".") for m in MIDDLE):
        return 1
    return 0


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of rstar2 it imports}``, every import in the file (function-level ones included)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # `from . import x` imports the submodule x when there is one
                names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in files else prefix for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name.startswith("rstar2") and name != mod:
                    targets.add(name)
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_real_imports():
    """The check below is only as good as this graph: it must see relative, absolute and function-level imports."""
    g = import_graph()
    assert "rstar2.rollout.agent_loop" in g["rstar2.rollout"]                 # from .agent_loop import ...
    assert "rstar2.grading_pool" in g["rstar2.rollout.agent_loop"]             # from .. import grading_pool
    assert "rstar2.rl.trainer" in g["rstar2.stages.rl"]                       # inside run()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_imports_point_down_the_layers():
    """stages/ and cli above rl/, rollout/, report/, above data, grading, sandbox, chat and the rest."""
    upward = [(m, t) for m, ts in import_graph().items() for t in ts if _layer(t) > _layer(m)]
    assert upward == []


def test_no_two_packages_import_each_other():
    """Between the subpackages of rstar2 (data, grading, rl, rollout, report, sandbox, stages), imports go one way
    only: a pair that imports each other is one package split in two, or a module in the wrong one."""
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 or (PKG / parts[-1]).is_dir() else module

    edges = {(package(m), package(t)) for m, ts in import_graph().items() for t in ts if package(m) != package(t)}
    assert ("rstar2.data", "rstar2.grading") in edges          # the walker sees package-level edges
    assert sorted((a, b) for a, b in edges if (b, a) in edges and a < b) == []


def test_grading_does_not_load_pandas_or_datasketch():
    """Every grading worker imports rstar2.grading: pandas and datasketch would cost seconds per worker."""
    code = "import rstar2.grading, sys; bad = {'pandas', 'datasketch'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_one_list_of_answer_types():
    """The benchmarks' answer types (data.benchmarks) are exactly the graders' (grading.ANSWER_TYPES) and the
    reference checkers' (grading.CHECKERS), and the schema offers the same names."""
    from rstar2 import grading
    from rstar2.data.benchmarks import ANSWER_TYPE_RULES

    assert set(ANSWER_TYPE_RULES) == set(grading.ANSWER_TYPES) | set(grading.CHECKERS)
    enum = SCHEMA["$defs"]["benchmark"]["properties"]["answer_type"]["enum"]
    assert set(enum) == set(ANSWER_TYPE_RULES)


# ---- defaults live in the schema only ----

def schema_defaults(section: str) -> dict:
    """``{key: default}`` of one top-level section of the schema (keys without a default left out)."""
    props = SCHEMA["properties"][section]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


MINIMAL = {  # only what the schema requires: everything else comes from its defaults
    "rl_data": {"sources": [{"name": "s", "path": "data/learning/train.jsonl",
                             "fields": {"problem": "problem", "answer": "answer"}}]},
    "rl": {"stages": {"stage1": {"max_response_tokens": 64, "max_turns": 2, "steps": 1},
                      "stage2": {"max_response_tokens": 96, "max_turns": 3, "steps": 2},
                      "stage3": {"max_response_tokens": 96, "max_turns": 4, "steps": 3}}},
    "benchmarks": {"b": {"path": "data/learning/heldout.jsonl", "fields": {"problem": "problem", "answer": "answer"}}},
}


@pytest.fixture(scope="module")
def minimal_config():
    from snakemake.utils import validate

    cfg = yaml.safe_load(yaml.safe_dump(MINIMAL))
    cfg["evaluate"] = {"benchmarks": ["b"]}   # the default names benchmarks a minimal config does not define
    validate(cfg, str(REPO_ROOT / "workflow/schemas/config.schema.yaml"))
    return cfg


def test_stage_parameter_classes_have_no_defaults_of_their_own():
    from rstar2.stages import params

    for name in params.__all__:
        cls = getattr(params, name)
        if dataclasses.is_dataclass(cls):
            own = [f.name for f in dataclasses.fields(cls)
                   if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
            assert own == [], (name, own)


def test_every_stage_parameter_is_the_schema_default_on_a_minimal_config(minimal_config):
    from rstar2.params import to_dict
    from rstar2.stages import params as P

    cfg = minimal_config
    rollout, tool, dist = schema_defaults("rollout"), schema_defaults("tool"), schema_defaults("distributed")
    vllm = {k: v["default"] for k, v in SCHEMA["properties"]["distributed"]["properties"]["vllm"]["properties"].items()}

    def check_rollout(r: dict, budget: dict, sampling: dict):
        assert {k: r[k] for k in rollout} == rollout and r["reproducible"] == reproducible
        assert r["tool"] == tool
        assert {k: r[k] for k in budget} == budget and {k: r[k] for k in sampling} == sampling

    sft = to_dict(P.sft(cfg))
    assert {k: sft[k] for k in schema_defaults("sft")} == schema_defaults("sft")
    reproducible = SCHEMA["properties"]["reproducible"]["default"]
    trainer = {k: dist[k] for k in ("device", "bf16", "gradient_checkpointing", "shared_prefix")} | {
        "vllm": vllm, "reproducible": reproducible}
    # SFT never starts vLLM: its params carry no vLLM settings, so changing them reruns no SFT
    assert sft["trainer"] == {**trainer, "vllm": None} and sft["seed"] == SCHEMA["properties"]["seed"]["default"]

    base = to_dict(P.base_model(cfg))
    model = schema_defaults("model")
    assert {k: base[k] for k in ("source", "path", "hub_id")} == {k: model[k] for k in ("source", "path", "hub_id")}
    tiny = SCHEMA["properties"]["model"]["properties"]["tiny"]["properties"]
    # only the fields the source reads are parameters (a new seed does not rebuild a wheel's model)
    assert model["source"] == "smollm2_wheel" and (base["tiny"], base["seed"]) == (None, None)
    tiny_base = to_dict(P.base_model({**cfg, "model": {**cfg["model"], "source": "tiny_qwen3"}}))
    assert tiny_base["tiny"] == {k: v["default"] for k, v in tiny.items()} and tiny_base["seed"] == cfg["seed"]

    rl_defaults = schema_defaults("rl")
    for stage in ("stage1", "stage2", "stage3"):
        rl = to_dict(P.rl(cfg, stage))
        shared = {k: v for k, v in rl_defaults.items()
                  if k not in ("temperature", "top_p", "batch_size", "heldout", "micro_batch_tokens", "faults", "tis")}
        assert {k: rl[k] for k in shared} == shared, stage
        for section in ("faults", "tis"):
            props = SCHEMA["properties"]["rl"]["properties"][section]["properties"]
            assert rl[section] == {k: v["default"] for k, v in props.items()}
        mbt = SCHEMA["properties"]["rl"]["properties"]["micro_batch_tokens"]["properties"]["cpu"]["default"]
        assert rl["micro_batch_tokens"] == mbt
        # the schema's continue_optimizer defaults: stage 2 continues stage 1's optimizer, stage 3 starts fresh
        assert (rl["continue_optimizer"], rl["save_optimizer"]) == {"stage1": (False, True), "stage2": (True, False),
                                                                    "stage3": (False, False)}[stage]
        st = MINIMAL["rl"]["stages"][stage]
        assert rl["steps"] == st["steps"] and rl["trainer"] == trainer and rl["heldout"] is None
        check_rollout(rl["rollout"], {"max_response_tokens": st["max_response_tokens"], "max_turns": st["max_turns"]},
                      {k: rl_defaults[k] for k in ("temperature", "top_p", "batch_size")})

    hp, hp_defaults = to_dict(P.hard_problems(cfg)), schema_defaults("hard_problems")
    assert (hp["k"], hp["subset_size"]) == (hp_defaults["k"], hp_defaults["subset_size"])
    check_rollout(hp["rollout"], {k: hp_defaults[k] for k in ("max_response_tokens", "max_turns")},
                  {k: rl_defaults[k] for k in ("temperature", "top_p", "batch_size")})

    ev, ev_defaults = to_dict(P.evaluate(cfg)), schema_defaults("evaluate")
    assert (ev["limit"], ev["k"]) == (ev_defaults["limit"], ev_defaults["k"])
    check_rollout(ev["rollout"], {k: ev_defaults[k] for k in ("max_response_tokens", "max_turns")},
                  {k: ev_defaults[k] for k in ("temperature", "top_p", "batch_size")})

    lv, lv_defaults = to_dict(P.label_verification(cfg)), schema_defaults("label_verification")
    # off by default: the verifier's settings are not parameters then (editing them reruns nothing)
    assert lv["enabled"] is lv_defaults["enabled"] is False and lv["tool"] == tool["name"]
    assert all(lv[k] is None for k in ("samples", "min_matches", "only_sources", "rollout", "seed"))
    lv = to_dict(P.label_verification({**cfg, "label_verification": {**cfg["label_verification"], "enabled": True}}))
    assert {k: lv[k] for k in ("samples", "min_matches", "only_sources")} == \
        {k: lv_defaults[k] for k in ("samples", "min_matches", "only_sources")}
    check_rollout(lv["rollout"], {k: lv_defaults[k] for k in ("max_response_tokens", "max_turns")},
                  {k: lv_defaults[k] for k in ("temperature", "top_p", "batch_size")})

    assert lv["max_prompt_tokens"] == schema_defaults("rl_data")["max_prompt_tokens"]   # the rl_data rule's filter
    data = to_dict(P.rl_data(cfg))
    data_defaults = {k: v for k, v in schema_defaults("rl_data").items() if k != "max_prompt_tokens"}
    assert {k: data[k] for k in data_defaults if k != "near_dedupe"} == \
        {k: v for k, v in data_defaults.items() if k != "near_dedupe"}
    nd = SCHEMA["properties"]["rl_data"]["properties"]["near_dedupe"]["properties"]
    assert data["near_dedupe"] == {k: v["default"] for k, v in nd.items()}
    made = to_dict(P.report(cfg))
    assert made.pop("made_from") == {"model": {k: model[k] for k in ("source", "path", "hub_id")},
                                     "seed": SCHEMA["properties"]["seed"]["default"], "reproducible": reproducible,
                                     "config_files": [], "config_overrides": {}, "code": None}
    assert made == schema_defaults("report")


def test_a_stage_refuses_missing_and_unknown_parameters():
    """The stages take every value from the workflow: a hand-made dict that leaves a setting out is an error,
    not a silent default."""
    from rstar2.stages import params as P

    cfg = workflow_config()
    good = P.to_json(P.sft(cfg))
    import json

    d = json.loads(good)
    d.pop("warmup_ratio")
    with pytest.raises(ValueError, match="sft params: missing warmup_ratio"):
        P.parse(P.SFTParams, d, "sft params")
    d = json.loads(good)
    d["rollout"] = {}
    with pytest.raises(ValueError, match="unknown rollout"):
        P.parse(P.SFTParams, d, "sft params")
    d = json.loads(P.to_json(P.rl(cfg, "stage1")))
    del d["rollout"]["tool"]["memory_mb"]
    with pytest.raises(ValueError, match=r"rl params\.rollout\.tool: missing memory_mb"):
        P.parse(P.RLParams, d, "rl params")


def test_trainer_overrides_reach_trl_and_typos_are_errors(tmp_path):
    from rstar2.stages import params as P
    from rstar2.stages.rl import grpo_config
    from rstar2.stages.sft import sft_config

    cfg = workflow_config({"rl": {"trainer_overrides": {"adam_beta2": 0.99}},
                           "sft": {"trainer_overrides": {"adam_beta2": 0.95}}})
    assert grpo_config(P.rl(cfg, "stage1"), str(tmp_path), seed=0).adam_beta2 == 0.99
    assert sft_config(P.sft(cfg), str(tmp_path)).adam_beta2 == 0.95
    bad = workflow_config({"rl": {"trainer_overrides": {"adam_beta3": 0.9}}})
    with pytest.raises(ValueError, match=r"rl.trainer_overrides: \['adam_beta3'\] are not fields of GRPOConfig"):
        grpo_config(P.rl(bad, "stage1"), str(tmp_path), seed=0)
    locked = workflow_config({"rl": {"trainer_overrides": {"num_iterations": 2}}})
    with pytest.raises(ValueError, match="cannot be overridden"):
        grpo_config(P.rl(locked, "stage1"), str(tmp_path), seed=0)


def test_rule_subcommand_and_module_share_one_name():
    """Every rule runs `rstar2 <name>` (the rule's name, "-" for "_"), which runs stages/<name>.py. The only rules of
    other names are second instances of a stage: the verifier model (a base model) and the RL rule that also keeps
    its optimizer state."""
    import re

    from rstar2 import cli

    root = Path(__file__).resolve().parents[1]
    instances = {"verifier_model": "base_model", "rl_keeping_optimizer": "rl"}
    rules = "".join(p.read_text() for p in sorted((root / "workflow" / "rules").glob("*.smk")))
    # a shell command starts `rstar2 <sub>`, or launch("<family>") + " <sub>" for the training rules
    ran = dict(re.findall(r'^\s*rule (\w+):(?:\n(?!\s*rule ).*)*?(?:rstar2 |\) \+ " )([a-z-]+) --params', rules, re.M))
    used = re.findall(r"^use rule (\w+) as (\w+)", rules, re.M)
    assert used == [("rl", "rl_keeping_optimizer")]
    ran["rl_keeping_optimizer"] = ran["rl"]
    assert len(ran) == 11, ran
    dispatch = (root / "rstar2" / "cli.py").read_text()
    for rule, sub in ran.items():
        stage = instances.get(rule, rule)
        assert sub == stage.replace("_", "-"), (rule, sub)
        assert (root / "rstar2" / "stages" / f"{stage}.py").is_file(), stage
        assert re.search(rf'a\.stage == "{sub}":\n\s+from \.stages import {stage}\n', dispatch), sub
    assert cli.ALIASES == {"rl-data": ["label-verification"]}


def test_every_enum_the_code_checks_is_the_schema_s():
    """A value the schema accepts must be one the code handles, and the reverse: each closed set of names in the
    code equals the enum of its config key."""
    from rstar2 import models, precision
    from rstar2.data import loaders
    from rstar2.data.sft import sources
    from rstar2.rl import roc
    from rstar2.rollout import agent_loop
    from rstar2.sandbox import isolation

    def enum(*path):
        """The enum at ``path`` (``$defs`` entries by their name), or its items' enum for an array."""
        node = SCHEMA["$defs"] if path[0] in SCHEMA["$defs"] else SCHEMA["properties"]
        for key in path:
            node = node[key]
            if key != path[-1]:
                node = node.get("properties", node)
        return set(node["enum"] if "enum" in node else node["items"]["enum"])
    pairs = {
        "rollout.engine": (enum("rollout", "engine"), set(agent_loop.ENGINES)),
        "rollout.scheduler": (enum("rollout", "scheduler"), set(agent_loop.SCHEDULERS)),
        "rollout.precision": (enum("rollout", "precision"), set(precision.ROLLOUT_SETTINGS)),
        "rl.mode": (enum("rl", "mode"), set(roc.MODES)),
        "ablation.modes": (enum("ablation", "modes"), set(roc.MODES)),
        "rl.positive_selection": (enum("rl", "positive_selection"), set(roc.POSITIVE_SELECTIONS)),
        "sandbox.isolation": (enum("sandbox", "isolation"), set(isolation.MODES)),
        "model.source": (enum("model", "source"), set(models.SOURCES)),
        "sft_data.sources[].format": (enum("sft_source", "format"), set(sources.FORMATS)),
        "rl_data.sources[].format": (enum("source", "format"), set(loaders._EXTENSION_FORMATS.values())),
    }
    wrong = {key: (schema, code) for key, (schema, code) in pairs.items() if schema != code}
    assert wrong == {}
