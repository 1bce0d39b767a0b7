"""Each stage's parameters: one dataclass per stage, built from the validated config.

The workflow (``workflow/rules/common.smk``) validates the config against ``workflow/schemas/config.schema.yaml``,
which fills every default, then calls the builders below; each rule passes its stage ``to_json(builder(config))``
and the stage ``parse``s it back (``rstar2.params.parse``: a missing or unknown key is an error). No field here has a
default: the schema is the only place defaults live, and a setting has one spelling, the config's.

Only settings that can change a stage's results are parameters, so that editing one reruns what it affects and
nothing else (Snakemake's params trigger); how the sandbox runs and where jobs run travel elsewhere.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from ..params import parse, to_dict
from ..rl.fault_accounting import FaultPolicy
from ..rl.tis import TISConfig
from ..rollout import RolloutConfig, ToolConfig

__all__ = ["BaseModelParams", "EvaluateParams", "HardProblemsParams", "HeldoutParams", "LabelVerificationParams",
           "NearDedupeParams", "RLDataParams", "RLParams", "ReportParams", "SFTDataParams", "SFTParams", "TinyModelParams",
           "TrainerParams", "VLLMParams", "parse", "to_json"]


@dataclass(frozen=True)
class TinyModelParams:
    """``model.tiny``: a random Qwen3-architecture model of this size (tests)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    stop_early: bool      # turns end after a few tokens (rstar2.models.tiny_qwen3)


@dataclass(frozen=True)
class BaseModelParams:
    """``model``: where the base model comes from (``rstar2.models.materialise``). Only the fields the source reads
    are set (the others None), so that e.g. a new seed does not rebuild a wheel's or a folder's model."""
    source: str
    path: str | None
    hub_id: str | None
    tiny: TinyModelParams | None
    seed: int | None


@dataclass(frozen=True)
class VLLMParams:
    """``distributed.vllm``: TRL's vLLM in the RL stages (also handed to the rollouts of an in-process vLLM:
    ``RolloutConfig.vllm``)."""
    gpu_memory_utilization: float
    enable_sleep_mode: bool
    max_model_length: int | None
    server_timeout_s: float
    enforce_eager: bool
    env: dict


@dataclass(frozen=True)
class TrainerParams:
    """The training settings of ``distributed`` that can change results (``rstar2.distributed``)."""
    device: str
    bf16: bool | str      # false | true (bf16 where native) | "force" (rstar2.precision)
    gradient_checkpointing: bool
    shared_prefix: bool
    vllm: VLLMParams | None   # RL only: SFT never starts vLLM, so its settings must not rerun SFT
    reproducible: bool    # the top-level setting: full_determinism on CUDA (rstar2.distributed.trainer_kwargs)


@dataclass(frozen=True)
class SFTDataParams:
    """``sft_data``: the cold-start sources (``rstar2.data.sft.sources`` specs) and the tool they are rendered for."""
    sources: list
    tool: ToolConfig
    seed: int


@dataclass(frozen=True)
class SFTParams:
    """``sft``: the non-reasoning cold start (paper §4.1). ``trainer_overrides``: further TRL ``SFTConfig`` fields."""
    epochs: float
    learning_rate: float
    batch_size: int
    grad_accum: int
    max_length: int
    warmup_ratio: float
    limit: int
    trainer_overrides: dict
    trainer: TrainerParams
    seed: int


@dataclass(frozen=True)
class NearDedupeParams:
    """``rl_data.near_dedupe``: MinHash LSH over word shingles, confirmed by exact Jaccard similarity."""
    enabled: bool
    threshold: float
    num_perm: int
    shingle_words: int


@dataclass(frozen=True)
class RLDataParams:
    """``rl_data``: the curation funnel (paper §4.2); ``benchmarks`` are the specs decontaminated against."""
    sources: list
    decontaminate_against: list
    ngram: int
    max_abs_answer: int
    max_filtered_share: float | dict
    limit: int
    near_dedupe: NearDedupeParams
    boilerplate_min_problems: int
    benchmarks: dict
    seed: int


@dataclass(frozen=True)
class LabelVerificationParams:
    """The ``rl_data`` rule: the prompt-length filter (``rl_data.max_prompt_tokens``; released code: 2048, prompts
    rendered for ``tool``) and label verification (``label_verification``, paper §4.2: a verifier samples ``samples``
    answers; keep if >= ``min_matches``). Disabled, the verifier's fields are None: editing them reruns nothing."""
    enabled: bool
    samples: int | None
    min_matches: int | None
    only_sources: list | None
    max_prompt_tokens: int | None
    tool: str
    rollout: RolloutConfig | None
    seed: int | None


@dataclass(frozen=True)
class HeldoutParams:
    """``rl.heldout``: the held-out evaluation inside an RL stage (``rstar2.rl.heldout``)."""
    benchmark: str
    spec: dict
    every: int
    limit: int
    k: int
    rollout: RolloutConfig


@dataclass(frozen=True)
class RLParams:
    """One RL stage (paper §2.2, §4.3): GRPO-RoC settings, the stage's rollout budget, trainer, held-out eval.

    ``name`` is the stage (``rl_stage1``; ablation runs are stage 1 too); ``seed`` is the run's seed, and
    ``data_seed`` orders its prompts (derived from seed and name: stage 2 does not replay stage 1's order, while
    every ablation run with one seed sees the same prompts whatever its mode).
    """
    name: str
    mode: str
    steps: int
    positive_selection: str
    error_penalty: str
    format_penalty: str
    penalty_eps: float
    checkpoint_every: int
    group_size: int
    oversample: int
    prompts_per_step: int
    learning_rate: float
    warmup_steps: int
    clip_low: float
    clip_high: float
    trainer_overrides: dict
    micro_batch_tokens: int     # padded tokens per forward/backward micro-batch and process (rl.micro_batch_tokens)
    continue_optimizer: bool    # start from the previous stage's AdamW state and LR schedule (paper §4.3)
    save_optimizer: bool        # leave this stage's optimizer state for the next stage, which continues it
    sources: list | None
    rollout: RolloutConfig
    trainer: TrainerParams
    heldout: HeldoutParams | None
    faults: FaultPolicy         # when to stop for failing infrastructure (rl.faults; changes no fault-free result)
    reward: str                 # rl.reward: a built-in ("answer") or module:function (rstar2.grading.rewards)
    tis: TISConfig              # rl.tis: truncated importance sampling of the sampler/learner mismatch (rl/tis.py)
    seed: int

    @property
    def data_seed(self) -> int:
        return self.seed + zlib.crc32(self.name.encode()) % 10_000


@dataclass(frozen=True)
class HardProblemsParams:
    """``hard_problems`` (paper §4.3): k rollouts per problem with the stage-2 policy; keep those solved at least
    ``min_passes`` times but not k/k (paper: min_passes 0); ``subset_size`` problems per round (0 = all at once),
    rounds until ``min_hard`` are kept (0 = one round). ``sources``: the rl_data sources stage 3 trains on
    (those whose ``stages`` list stage3; None = all)."""
    k: int
    min_passes: int
    subset_size: int
    min_hard: int
    sources: list | None
    rollout: RolloutConfig
    seed: int


@dataclass(frozen=True)
class EvaluateParams:
    """``evaluate`` (paper §5.1): k samples per problem of the first ``limit`` problems of each benchmark
    (``limits[bench]`` where given: ``evaluate.limit`` as a mapping)."""
    benchmarks: dict
    limit: int
    limits: dict
    k: int
    rollout: RolloutConfig
    seed: int


@dataclass(frozen=True)
class ReportParams:
    """``report``: title, figure resolution, sample trajectories per model and stage, and the benchmark whose
    accuracy per model leads the report if evaluated (``report.lead_benchmark``, else ``rl.heldout.benchmark``;
    else the first benchmark evaluated: ``rstar2.report.lead.choose_lead``);
    ``made_from``: what the run was made from, named under the title (model spec, seed, reproducible, config files).
    """
    title: str
    dpi: int
    samples: int
    lead_benchmark: str | None
    made_from: dict


def merge_config(base: dict, over: dict) -> dict:
    """Snakemake's ``--configfile`` merge: dicts key by key, anything else (lists included) replaced whole."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validated_config(root, files: tuple = (), overrides: tuple = ()) -> dict:
    """The config a workflow run in ``root`` would see: ``config.yaml``, then ``files`` (relative to ``root``), then
    ``overrides`` (dicts), validated against the schema, which fills every default (benchmarks, tests).

    Raises:
        ValueError: a value the schema refuses (one line naming its key: ``config_schema.validate_config``).
    """
    from pathlib import Path

    import yaml

    from ..config_schema import validate_config

    root = Path(root)
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    for f in files:
        cfg = merge_config(cfg, yaml.safe_load((root / f).read_text()) or {})
    for o in overrides:
        cfg = merge_config(cfg, o)
    validate_config(cfg, str(root / "workflow/schemas/config.schema.yaml"))
    return cfg


def to_json(params) -> str:
    """The JSON a rule passes its stage (keys sorted, so equal params give equal strings)."""
    return json.dumps(to_dict(params) if not isinstance(params, dict) else params, sort_keys=True)


# ---- builders: validated config -> each rule's parameters ----

def _rollout(config: dict, budget: dict, temperature: float, top_p: float, batch_size: int) -> RolloutConfig:
    """A stage's rollout settings: its token and turn budget, its sampling, the shared engine section, the tool,
    and with ``rollout.engine`` vllm the in-process engine's settings (``distributed.vllm``)."""
    vllm = dict(config["distributed"]["vllm"]) if config["rollout"]["engine"] == "vllm" else None
    return RolloutConfig(max_response_tokens=budget["max_response_tokens"], max_turns=budget["max_turns"],
                         temperature=temperature, top_p=top_p, batch_size=batch_size, **config["rollout"],
                         reproducible=config["reproducible"], vllm=vllm, tool=ToolConfig(**config["tool"]))


def _trainer(config: dict, vllm: bool = True) -> TrainerParams:
    """``vllm`` False (SFT): no vLLM settings, which then change nothing the stage does."""
    d = config["distributed"]
    return parse(TrainerParams, {**{k: d[k] for k in ("device", "bf16", "gradient_checkpointing", "shared_prefix")},
                                 "vllm": d["vllm"] if vllm else None, "reproducible": config["reproducible"]},
                 "distributed")


def base_model(config: dict, section: str = "model") -> BaseModelParams:
    """The ``base_model`` rule's params (``section`` "model"), or the verifier model's."""
    spec = config[section] if section == "model" else config["label_verification"]["model"]
    used = {"local": ("path",), "hub": ("hub_id",), "tiny_qwen3": ("tiny", "seed")}.get(spec["source"], ())
    given = {**spec, "seed": config["seed"]}
    return parse(BaseModelParams, {k: given[k] if k in used else None for k in ("path", "hub_id", "tiny", "seed")}
                 | {"source": spec["source"]}, section)


def sft_data(config: dict) -> SFTDataParams:
    return parse(SFTDataParams, {**config["sft_data"], "tool": config["tool"], "seed": config["seed"]}, "sft_data")


def sft(config: dict) -> SFTParams:
    return parse(SFTParams, {**config["sft"], "trainer": _trainer(config, vllm=False), "seed": config["seed"]}, "sft")


def rl_data(config: dict) -> RLDataParams:
    """Only the benchmarks curation decontaminates against: adding an evaluation benchmark must not rerun it."""
    # max_prompt_tokens belongs to the rl_data rule (it needs the base model's tokenizer), not to curation
    rl = {k: v for k, v in config["rl_data"].items() if k != "max_prompt_tokens"}
    # which stage trains on a source is the RL stages' business: changing the curriculum re-curates nothing
    rl["sources"] = [{k: v for k, v in s.items() if k != "stages"} for s in rl["sources"]]
    return parse(RLDataParams, {**rl, "benchmarks": {b: config["benchmarks"][b] for b in rl["decontaminate_against"]},
                                "seed": config["seed"]}, "rl_data")


def label_verification(config: dict) -> LabelVerificationParams:
    lv = config["label_verification"]
    on = lv["enabled"]
    return LabelVerificationParams(
        enabled=on, samples=lv["samples"] if on else None, min_matches=lv["min_matches"] if on else None,
        only_sources=lv["only_sources"] if on else None, max_prompt_tokens=config["rl_data"]["max_prompt_tokens"],
        tool=config["tool"]["name"],
        rollout=_rollout(config, lv, lv["temperature"], lv["top_p"], lv["batch_size"]) if on else None,
        seed=config["seed"] if on else None)


def rl(config: dict, stage: str, ablation: tuple[str, int] | None = None) -> RLParams:
    """One RL stage's params; ``ablation`` = (mode, seed) gives an ablation run of stage 1: that mode and seed,
    and the ablation's own steps, token and turn budget and held-out settings where set."""
    rl, ab = config["rl"], config["ablation"]
    st = rl["stages"][stage]
    ho = dict(rl["heldout"])
    mode, seed, steps, name = rl["mode"], config["seed"], st["steps"], f"rl_{stage}"
    if ablation:
        # name stays rl_stage1: the data order derives from (seed, name), so both modes see the same prompts
        mode, seed, steps = ablation[0], int(ablation[1]), ab["steps"] or steps
        ho.update({k: ab[f"heldout_{k}"] for k in ("every", "limit") if ab[f"heldout_{k}"] is not None})
        # the ablation's own token and turn budget (a recovered trajectory needs room for two calls)
        st = {**st, **{k: ab[k] for k in ("max_response_tokens", "max_turns") if ab[k] is not None}}
    heldout = None
    if ho["benchmark"]:
        heldout = HeldoutParams(benchmark=ho["benchmark"], spec=config["benchmarks"][ho["benchmark"]],
                                every=ho["every"], limit=ho["limit"], k=ho["k"],
                                rollout=_rollout(config, st, ho["temperature"], ho["top_p"], ho["batch_size"]))
    shared = {k: v for k, v in rl.items()
              if k not in ("stages", "temperature", "top_p", "batch_size", "heldout", "mode", "micro_batch_tokens")}
    following = {"stage1": "stage2", "stage2": "stage3"}.get(stage)
    optimizer = {"continue_optimizer": not ablation and continues_optimizer(config, stage),
                 "save_optimizer": bool(not ablation and following and continues_optimizer(config, following)),
                 "micro_batch_tokens": rl["micro_batch_tokens"][config["distributed"]["device"]]}
    return parse(RLParams, {**shared, **optimizer, "name": name, "mode": mode, "steps": steps, "heldout": heldout,
                            "sources": stage_sources(config, stage),
                            "rollout": _rollout(config, st, rl["temperature"], rl["top_p"], rl["batch_size"]),
                            "trainer": _trainer(config), "seed": seed}, f"rl.stages.{stage}")


def continues_optimizer(config: dict, stage: str) -> bool:
    """Whether an enabled RL stage starts from the previous stage's optimizer state
    (``rl.stages.stageN.continue_optimizer``; stage 1 has no previous stage; paper §4.3)."""
    st = config["rl"]["stages"].get(stage)   # absent = not enabled (the schema's "stage2 / stage3 null or absent")
    return stage != "stage1" and st is not None and st["continue_optimizer"]


def stage_sources(config: dict, stage: str) -> list[str] | None:
    """The names of the rl_data sources whose ``stages`` list ``stage`` (paper §5.1's stages on a curriculum);
    None when every source does (every curated row, whatever its source)."""
    sources = config["rl_data"]["sources"]
    names = [s["name"] for s in sources if stage in s["stages"]]
    return None if len(names) == len(sources) else names


def hard_problems(config: dict) -> HardProblemsParams:
    hp, rl = config["hard_problems"], config["rl"]
    return HardProblemsParams(k=hp["k"], min_passes=hp["min_passes"], subset_size=hp["subset_size"],
                              min_hard=hp["min_hard"], sources=stage_sources(config, "stage3"),
                              rollout=_rollout(config, hp, rl["temperature"], rl["top_p"], rl["batch_size"]),
                              seed=config["seed"])


def evaluate(config: dict) -> EvaluateParams:
    ev = config["evaluate"]
    per = ev["limit"] if isinstance(ev["limit"], dict) else {"default": ev["limit"]}
    return EvaluateParams(benchmarks={b: config["benchmarks"][b] for b in ev["benchmarks"]}, limit=per["default"],
                          limits={b: n for b, n in per.items() if b in ev["benchmarks"]},
                          k=ev["k"], rollout=_rollout(config, ev, ev["temperature"], ev["top_p"], ev["batch_size"]),
                          seed=config["seed"])


def report(config: dict, provenance: dict | None = None) -> ReportParams:
    """The report's params. ``provenance`` (the workflow's ``report_provenance()``): ``config_files`` (each
    ``{"path", "sha256"}``, in merge order), ``config_overrides`` (``--config``) and ``code`` (the git commit,
    ``-dirty`` with uncommitted changes; None outside a git checkout), named in the report beside the model and seed."""
    r = config["report"]
    made_from = {"model": {k: config["model"][k] for k in ("source", "path", "hub_id")}, "seed": config["seed"],
                 "reproducible": config["reproducible"], "config_files": [], "config_overrides": {}, "code": None,
                 **(provenance or {})}
    return parse(ReportParams, {**r, "lead_benchmark": r["lead_benchmark"] or config["rl"]["heldout"]["benchmark"],
                                "made_from": made_from}, "report")
