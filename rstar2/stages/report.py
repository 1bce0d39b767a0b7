"""Report stage: evaluation beside the paper's Table 3, RL training curves, data funnel, sample trajectories.

Reads the outputs of the RL stages, the evaluations and rl_data (schemas in rstar2.report.inputs; any file may
be missing or empty and is then shown as "no data"). Writes into ``out_dir``:

- ``summary.md`` and ``summary.html``: the same tables (HTML with the figures embedded, for Snakemake's report);
- ``trajectories.md`` and ``trajectories.html``: sample trajectories (reasoning, code, output, answer);
- ``training_curves.png``, ``funnel.png`` (rl_data's own ``funnel.png`` when it has one), ``eval.png``;
- last, ``manifest.json``.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from ..io import atomic_write_text, write_manifest
from ..params import to_dict
from ..report import inputs as report_inputs
from ..report import lead, learning, plots, sections, training, trajectories
from ..report.document import Doc, Figure, Heading, Para, to_html, to_markdown
from .params import ReportParams, parse

FIGURES = (lead.FIGURE, "training_curves.png", "funnel.png", "eval.png", "learning_curve.png", "ablation.png")


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def made_from_line(made_from: dict) -> str:
    """One line naming the model, seed and config files a report was made from (``ReportParams.made_from``)."""
    m = made_from["model"]
    where = {"local": m.get("path"), "hub": m.get("hub_id")}.get(m["source"])
    model = f"{m['source']} ({where})" if where else m["source"]
    files = ", ".join(f"{f['path']} (sha256 {f['sha256']})" for f in made_from["config_files"]) or "none recorded"
    overrides = made_from["config_overrides"]
    line = (f"Made from: model {model}; seed {made_from['seed']}; reproducible "
            f"{'on' if made_from['reproducible'] else 'off'}; config files in merge order: {files}")
    if overrides:
        line += "; --config " + " ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
    return line + f"; code {made_from['code'] or 'not a git checkout'}."


def precision_line(manifests: dict) -> str | None:
    """One line with the precision the RL stages ran in, as their manifests record it (``{"training": ...,
    "rollout": ...}``, e.g. float32 on a CPU without native bf16), so a reader can tell a float32 run from a bf16
    one; None when no manifest records it."""
    seen: dict[str, list[str]] = {}
    for m in manifests.values():
        for part, value in ((m or {}).get("precision") or {}).items():
            short = str(value).split(":")[0]   # "float32, not bf16: <why>" -> "float32, not bf16"
            if short not in seen.setdefault(part, []):
                seen[part].append(short)
    if not seen:
        return None
    return "Precision (RL stages' manifests): " + "; ".join(f"{k} {' / '.join(v)}" for k, v in seen.items()) + "."


def run(params: dict, inputs: dict, out_dir: str) -> None:
    """Build the report.

    Args:
        params: ``rstar2.stages.params.ReportParams`` or its JSON dict: ``dpi``, ``title``, ``samples``
            (trajectories shown per evaluated model and per RL stage), ``lead_benchmark`` (the first section,
            "Learning result", leads with it if evaluated, else with the first benchmark evaluated:
            ``rstar2.report.lead.choose_lead``; the one chosen is recorded in the manifest as ``lead_benchmark``),
            ``made_from`` (named under the title).
        inputs: ``{"rl_stages": {"stage1": dir, ...} (any subset), "eval": {model_name: dir},
            "rl_data": dir}``; any key may be missing, any directory may lack its files.
        out_dir: e.g. ``results/report``.
    """
    t0 = time.time()
    p = parse(ReportParams, params, "report params")
    dpi = p.dpi
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    got = report_inputs.load(dict(inputs or {}))

    traj_blocks, shown = trajectories.section(got.eval_dirs, got.stage_dirs, p.samples, got.notes)
    title = p.title
    doc = Doc(title)
    doc.add(Para(made_from_line(p.made_from)))
    if (prec := precision_line(got.manifests)) is not None:
        doc.add(Para(prec))
    bench, why = lead.choose_lead(got.evals, p.lead_benchmark)
    doc.add(*lead.lead_section(got.evals, got.eval_dirs, got.stages, bench, got.notes, why=why, out=out))
    doc.add(*sections.evaluation(got.evals), Heading("Evaluation figure", 3),
            Figure("eval.png", "avg@k per benchmark with 95% bootstrap CI, beside the paper's numbers"))
    doc.add(*sections.funnel(got.funnel, "funnel.png"))
    doc.add(*training.training(got.stages, got.manifests))
    doc.add(*learning.learning_section(got.heldout))
    doc.add(*learning.ablation_section(got.ablation))
    doc.add(Heading("Sample trajectories"),
            Para(f"{shown} sample trajectories (problem, reasoning, code, tool output, answer) are in "
                 "trajectories.md / trajectories.html."))
    if got.notes:
        doc.add(Heading("Notes"), *[Para(n) for n in got.notes])

    lead.plot_lead(got.evals, got.stages, bench, out / lead.FIGURE, dpi)
    plots.plot_training(got.stages, out / "training_curves.png", dpi)
    plots.plot_funnel(got.funnel, out / "funnel.png", dpi)
    plots.plot_eval(got.evals, report_inputs.benchmarks_of(got.evals), out / "eval.png", dpi)
    learning.plot_learning(got.heldout, out / "learning_curve.png", dpi)
    learning.plot_ablation(got.ablation, out / "ablation.png", dpi)

    atomic_write_text(out / "summary.md", to_markdown(doc))
    atomic_write_text(out / "summary.html", to_html(doc, {f: _data_uri(out / f) for f in FIGURES}))
    traj_doc = Doc(f"{title}: sample trajectories").add(*traj_blocks)
    atomic_write_text(out / "trajectories.md", to_markdown(traj_doc))
    atomic_write_text(out / "trajectories.html", to_html(traj_doc))

    write_manifest(out, stage="report", params=to_dict(p), inputs=got.read, counts={
        "rl_stages": len(got.stages),
        "rl_steps": {k: len(v) for k, v in got.stages.items()},
        "models": sum(1 for s in got.evals.values() if s),
        "benchmarks": len(report_inputs.benchmarks_of(got.evals)),
        "funnel": got.funnel is not None,
        "trajectories": shown,
        "ablation_runs": len(got.ablation),
        "notes": len(got.notes),
    }, started=t0, extra={"lead_benchmark": bench})

