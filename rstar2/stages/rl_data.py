"""Stage ``rl_data`` (rule and CLI ``rstar2 rl-data``; ``label-verification`` is an alias): the prompt-length
filter and label verification, the last steps of the RL data funnel (paper §4.2; prompt length: released code
rstar2_agent/main_rstar2_agent.py).

Prompt length first (rstar2/data/prompt_length.py): with ``max_prompt_tokens`` set, problems whose rendered RL
prompt (tool schema included) is longer in the policy's tokenizer are dropped (the released code: 2048), so no
verifier samples are spent on them; funnel step ``prompt_length`` ("skipped" when unset).

The paper removes incorrect labels from OpenMathReasoning: Qwen3-32B samples 16 responses per problem, and a
problem is kept only if at least 2 responses give an integer answer that matches the label. Here the
configured verifier model runs through the same agent loop and grader as RL and evaluation
(``rstar2.rollout.run_rollouts``); a response matches when its reward is positive (the gold is an integer, so
a positive reward means an integer answer equal to the label).

When ``enabled`` is false (the CPU default: a 135M model cannot verify anything) the rows pass through
unchanged and the funnel records the step as "skipped".

Outputs in ``out_dir``: ``train.jsonl`` (the RL training set), ``verification.jsonl`` (when enabled: every
verified problem with its matches and predicted answers), ``dropped.jsonl`` (each row this stage dropped, with
its step and reason), ``funnel.json`` / ``funnel.csv`` / ``funnel.png`` (the candidates' funnel plus this step),
and ``manifest.json`` last.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from .. import seeds
from ..data.curate import append_step
from ..data.prompt_length import filter_prompts, prompt_lengths
from ..io import read_json, read_jsonl, write_jsonl, write_manifest
from ..params import to_dict
from .params import LabelVerificationParams, parse
from .rl_candidates import write_funnel

STEP = "label_verification"
DROP_REASON = "label_mismatch"


def run(params: dict, data_path: str, funnel_path: str, out_dir: str, model_dir: str | None = None,
        model_and_tokenizer=None, tokenizer_dir: str | None = None, tokenizer=None) -> None:
    """Verify the labels of ``data_path``'s problems and write the final RL data to ``out_dir``.

    params: ``rstar2.stages.params.LabelVerificationParams`` or its JSON dict::

        enabled      bool: run the verifier (else pass the rows through, step "skipped")
        samples      responses per problem (paper: 16)
        min_matches  keep a problem if at least this many responses match its label (paper: 2)
        only_sources source names to verify (paper: only OpenMathReasoning); empty = all
        max_prompt_tokens  drop problems whose RL prompt has more tokens (null = no filter)
        tool         the tool name prompts are rendered for (their length counts its system prompt)
        rollout      the verifier's rollout settings (budget, sampling, engine, tool)
        seed         int
    (``samples``, ``min_matches``, ``only_sources``, ``rollout`` and ``seed`` are None when not enabled.)

    Args:
        data_path: the curated candidates (JSON Lines with ``id``, ``source``, ``problem``, ``answer``).
        funnel_path: their funnel.json; this stage appends its step.
        model_dir: the materialised verifier model folder (needed when enabled, unless ``model_and_tokenizer``).
        model_and_tokenizer: an already loaded ``(model, tokenizer)`` (tests; a scripted model).
        tokenizer_dir: the policy (base) model folder whose tokenizer measures prompts, or ``tokenizer`` loaded.

    Raises:
        ValueError: enabled without a model; max_prompt_tokens without a tokenizer; samples < 1 or min_matches
            outside 1..samples; no problem left.
    """
    t0 = time.time()
    p = parse(LabelVerificationParams, params, "label_verification params")
    rows = read_jsonl(data_path)
    funnel = copy.deepcopy(read_json(funnel_path))
    max_tokens, lengths = p.max_prompt_tokens, None
    if max_tokens:
        if tokenizer is None:
            if not tokenizer_dir:
                raise ValueError("rl_data: max_prompt_tokens is set but no tokenizer folder was given (--tokenizer)")
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        lengths = prompt_lengths([r["problem"] for r in rows], tokenizer, p.tool)
    n_before, before_length = len(rows), rows
    rows = filter_prompts(rows, funnel, max_tokens, lengths)
    print(f"[rl_data] prompt length: {n_before - len(rows)} of {n_before} problems over {max_tokens} tokens"
          if max_tokens else "[rl_data] prompt length: no limit (funnel step 'skipped')", flush=True)
    enabled = p.enabled
    verified: list[dict] = []
    if enabled:
        samples, min_matches = p.samples, p.min_matches
        if samples < 1 or not 1 <= min_matches <= samples:
            raise ValueError(f"label_verification: need samples >= 1 and 1 <= min_matches <= samples, "
                             f"got samples={samples}, min_matches={min_matches}")
        if model_and_tokenizer is None:
            if not model_dir:
                raise ValueError("label_verification: enabled but no verifier model folder was given")
            from .. import models
            model_and_tokenizer = models.load(model_dir)
        verify = set(p.only_sources or {r["source"] for r in rows})
        targets = [r for r in rows if r["source"] in verify]
        verified = count_matches(targets, model_and_tokenizer, p)
        kept_ids = {v["id"] for v in verified if v["matches"] >= min_matches}
        dropped = [r for r in targets if r["id"] not in kept_ids]
        kept = [r for r in rows if r["source"] not in verify or r["id"] in kept_ids]
        print(f"[label_verification] {len(targets)} problems verified with {samples} samples each; "
              f"{len(dropped)} had fewer than {min_matches} matching answers", flush=True)
    else:
        dropped, kept = [], rows
        print("[label_verification] disabled: rows pass through (funnel step 'skipped')", flush=True)

    record_step(funnel, kept, dropped, status="done" if enabled else "skipped")
    if not kept:
        raise ValueError(f"label_verification: no problem kept; funnel: {funnel['total']}")
    out = Path(out_dir)
    write_jsonl(out / "train.jsonl", kept)
    # this stage's drops, one row each (rl_candidates/dropped.jsonl lists the curation funnel's)
    long_ids = {r["id"] for r in before_length} - {r["id"] for r in rows}
    write_jsonl(out / "dropped.jsonl",
                [{"id": r["id"], "source": r["source"], "step": "prompt_length", "reason": "prompt_too_long",
                  "answer_raw": r.get("answer_raw")} for r in before_length if r["id"] in long_ids]
                + [{"id": r["id"], "source": r["source"], "step": STEP, "reason": DROP_REASON,
                    "answer_raw": r.get("answer_raw")} for r in dropped])
    if enabled:
        write_jsonl(out / "verification.jsonl", verified)
    write_funnel(out, funnel)
    write_manifest(out, stage="rl_data", params=to_dict(p), started=t0,
                   inputs=[data_path, funnel_path] + ([model_dir] if enabled and model_dir else [])
                   + ([tokenizer_dir] if max_tokens and tokenizer_dir else []),
                   counts={"rows": len(kept), "verified": len(verified), "label_mismatch": len(dropped),
                           "prompt_too_long": n_before - len(rows),
                           "label_verification": "done" if enabled else "skipped",
                           "per_source": {s: n[STEP] for s, n in funnel["per_source"].items()},
                           "drops": funnel["drops"], "decontamination": funnel.get("decontamination", {})})


def count_matches(rows: list[dict], model_and_tokenizer, p: LabelVerificationParams) -> list[dict]:
    """Sample ``p.samples`` responses per problem and count those whose answer matches the label.

    Returns:
        One dict per row, in order: ``{"id", "source", "answer", "matches", "samples", "preds"}`` where
        ``preds`` are the extracted answers (None when a response gave none).
    """
    from ..rollout import Progress, sample_groups

    model, tok = model_and_tokenizer
    samples = p.samples
    groups = sample_groups(model, tok, rows, samples, p.rollout, progress=Progress("label_verification"),
                           seed=seeds.derive(p.seed, "label_verification"))
    out = []
    for r, group in zip(rows, groups):
        out.append({"id": r["id"], "source": r["source"], "answer": r["answer"],
                    "matches": int(sum(t.reward > 0 for t in group)), "samples": samples,
                    "preds": [t.pred for t in group]})
    return out


def record_step(funnel: dict, kept: list[dict], dropped: list[dict], status: str) -> None:
    """Append the label-verification step to ``funnel`` (counts per source, drops as ``label_mismatch``)."""
    append_step(funnel, STEP, kept, dropped, DROP_REASON, status)
