"""The Snakemake workflow end to end on the tiny config: lint, dry run, a real run that is killed with
SIGKILL mid-stage and then completes, and the exact job lists that a deleted stage or a changed stage
setting reruns. Runs in a scratch copy of the workflow; no network, no model hub."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import served
from conftest import REPO_ROOT, copy_run, copy_workflow, kill_group_when
from rstar2.io import file_sha256, read_jsonl
from rstar2.rl.checkpoints import STATE_FILE

SNAKEMAKE = [sys.executable, "-m", "snakemake", *served.snakemake_args()]   # the worker's threads
TINY = "configs/tiny.yaml"
ENV = served.env()   # the stage server (tests/served.py) imports under the same


def smk(workdir: Path, *args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}"
                             f"\n{proc.stderr[-4000:]}")
    return proc


def planned_jobs(workdir: Path, *args: str) -> dict[str, int]:
    """Job counts from a dry run ({} when there is nothing to do), per rule; the one RL rule's jobs are named by
    their run: rl_stage1..3 for the stages, rl_ablation for the ablation runs."""
    out = smk(workdir, "-n", "--configfile", *args).stdout
    if "Nothing to be done" in out:
        return {}
    table = out[out.index("Job stats:"):out.index("total")]
    jobs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
    runs = re.findall(r"^rule rl(?:_keeping_optimizer)?:\n(?:    .*\n)*?    wildcards: run=(\S+)$", out, re.M)
    assert len(runs) == jobs.pop("rl", 0) + jobs.pop("rl_keeping_optimizer", 0), out
    for run in runs:
        name = "rl_" + run.split("/")[1] if run.startswith("rl/") else "rl_ablation"
        jobs[name] = jobs.get(name, 0) + 1
    return jobs


def planned_eval_models(workdir: Path, *args: str) -> set[str]:
    out = smk(workdir, "-n", "--configfile", *args).stdout
    return set(re.findall(r"output: results/eval/(\w+)/summary.json", out))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("wf"))


def test_lint(workdir):
    proc = smk(workdir, "--lint", "--configfile", TINY)
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


def test_dry_run_lists_every_stage(workdir):
    jobs = planned_jobs(workdir, TINY)
    assert jobs == {"base_model": 1, "sft_data": 1, "sft": 1, "rl_candidates": 1, "rl_data": 1, "rl_stage1": 1,
                    "rl_stage2": 1, "hard_problems": 1, "rl_stage3": 1, "evaluate": 2, "report": 1, "all": 1}


def test_learning_and_ablation_configs_plan_stage1_only_and_every_run(workdir):
    jobs = planned_jobs(workdir, "configs/cpu-learning.yaml")
    assert jobs == {"base_model": 1, "sft_data": 1, "sft": 1, "rl_candidates": 1, "rl_data": 1, "rl_stage1": 1,
                    "report": 1, "all": 1}
    jobs = planned_jobs(workdir, "configs/cpu-learning.yaml", "configs/cpu-ablation.yaml")
    assert jobs["rl_ablation"] == 6 and "rl_stage2" not in jobs and "hard_problems" not in jobs


def test_label_verification_schedules_its_verifier_model(workdir, tmp_path):
    on = tmp_path / "lv.yaml"
    on.write_text("label_verification: {enabled: true, model: {source: tiny_qwen3}}\n")
    assert planned_jobs(workdir, TINY, str(on))["verifier_model"] == 1
    base = tmp_path / "lv_base.yaml"
    base.write_text("label_verification: {enabled: true}\n")  # null model = verify with the base model
    assert "verifier_model" not in planned_jobs(workdir, TINY, str(base))


#: Lines Snakemake prints on every run before it reads the Snakefile (the default profile, --configfile).
SNAKEMAKE_PREAMBLE = (re.compile(r"Using workflow specific profile \S+ for setting default command line arguments\."),
                      re.compile(r"Config file \S+ is extended by additional config specified via the command line\."))


def refusal_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """What a refused config printed besides Snakemake's fixed preamble lines; fails if snakemake succeeded."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return [line for line in (proc.stderr + proc.stdout).splitlines()
            if line.strip() and not any(p.fullmatch(line) for p in SNAKEMAKE_PREAMBLE)]


def test_bad_config_value_names_the_key(workdir, tmp_path):
    """A refused config prints its one line and nothing else of its own: no "ValueError in file ...", no
    traceback (workflow/rules/common.smk ``refusing``)."""
    bad = tmp_path / "bad.yaml"
    # an override file layered on tiny.yaml, so the test cannot silently no-op when tiny.yaml's layout changes
    bad.write_text("hard_problems: {k: 0}\n")
    proc = smk(workdir, "-n", "--configfile", TINY, str(bad), check=False)
    assert refusal_lines(proc) == [f"config: hard_problems.k: 0 is less than the minimum of 1 (set in {bad})"]
    typo = tmp_path / "typo.yaml"
    typo.write_text((workdir / TINY).read_text() + "\nrll: {steps: 3}\n")
    proc = smk(workdir, "-n", "--configfile", str(typo), check=False)
    assert refusal_lines(proc) == ["config: (top level): Additional properties are not allowed ('rll' was "
                                   f"unexpected) (set in {typo})"]
    # a value given with --config is named as such, not as the file it overrides
    proc = smk(workdir, "-n", "--configfile", TINY, "--config", "seed=abc", check=False)
    assert refusal_lines(proc) == ["config: seed: 'abc' is not of type 'integer' (set with --config)"]
    # a refusal of the checks after the schema (check_before_jobs) and of a rule's data files, the same way
    bad.write_text("hard_problems: {k: 2, min_passes: 2}\n")
    proc = smk(workdir, "-n", "--configfile", TINY, str(bad), check=False)
    assert refusal_lines(proc) == ["config: hard_problems.min_passes (2) must be below hard_problems.k (2): no "
                                   "mined problem could be kept for stage 3"]
    missing = tmp_path / "missing.yaml"
    missing.write_text("sft_data: {sources: [{name: mine, path: no_such_file.jsonl, format: alpaca}]}\n")
    proc = smk(workdir, "-n", "--configfile", TINY, str(missing), check=False)
    lines = refusal_lines(proc)   # after the checks that passed: their warnings (tiny.yaml's MATH pool), then it
    assert lines[-1] == (f"config: data file(s) not found (paths are relative to {workdir}): "
                         "sft_data.sources[0].path: no_such_file.jsonl")
    assert all(line.startswith("warning: config: rl_data.sources[") for line in lines[:-1]), lines


@pytest.fixture(scope="module")
def killed_run(tiny_upstream, tmp_path_factory) -> tuple[Path, dict]:
    """The tiny DAG from the session's finished upstream stages (conftest ``tiny_upstream``), its whole process group
    SIGKILLed while rl_stage1 trains (after its step-1 checkpoint, before its last step), then completed by a rerun.
    Returns the folder and what was on disk at the kill."""
    wd = copy_run(tiny_upstream, tmp_path_factory.mktemp("killed") / "wf")
    proc = subprocess.Popen([*SNAKEMAKE, "--cores", "2", "--configfile", TINY], cwd=wd, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stage1 = wd / "results/rl/stage1"
    checkpoint = wd / "results/rl/checkpoints/stage1/checkpoint-1" / STATE_FILE
    kill_group_when(proc, checkpoint.exists, 600, "the run ended before rl_stage1 wrote its step-1 checkpoint",
                    "rl_stage1 wrote no checkpoint in time")
    at_kill = {name: (wd / "results" / name / "manifest.json").exists() for name in ("sft", "rl/stage1", "report")}
    # A kill while the stage wrote its model leaves a partial declared output, which Snakemake marks incomplete
    # (it stopped CI once, when the kill came during the save). Make that case certain: the rerun must redo the
    # stage (profiles/default: rerun-incomplete) and the partial file must not survive.
    (stage1 / "model").mkdir(parents=True, exist_ok=True)
    (stage1 / "model" / "partial.bin").write_bytes(b"cut off")
    smk(wd, "--unlock", "--configfile", TINY)
    smk(wd, "--cores", "2", "--configfile", TINY, timeout=900)
    return wd, at_kill


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted run of the whole tiny DAG with the same seed, from nothing (its upstream stages are built
    again, not copied), the run the killed one must equal."""
    wd = copy_workflow(tmp_path_factory.mktemp("reference"))
    smk(wd, "--cores", "2", "--configfile", TINY, timeout=1200)
    return wd


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_killed_mid_stage_then_completes_after_real_updates(killed_run):
    """SIGKILL the whole run after rl_stage1's step-1 checkpoint: no stage looks finished that was not; the rerun
    resumes stage 1 from that checkpoint and completes the DAG. Every RL stage updated the weights (tiny.yaml's
    reward, which a random model earns part of): what the same-seed and resume comparisons compare changed."""
    wd, at_kill = killed_run
    assert at_kill == {"sft": True, "rl/stage1": False, "report": False}, at_kill
    stage1 = wd / "results/rl/stage1"
    assert not (stage1 / "model" / "partial.bin").exists()
    assert json.loads((stage1 / "manifest.json").read_text())["counts"]["resumed_from_step"] == 1
    for stage in ("base_model", "sft_data", "sft", "rl_candidates", "rl_data", "rl/stage1", "rl/stage2", "hard_problems",
                  "rl/stage3", "report"):
        assert (wd / "results" / stage / "manifest.json").exists(), stage
    before = _weights(wd / "results/sft/model")
    for stage in ("rl/stage1", "rl/stage2", "rl/stage3"):
        rows = [json.loads(line) for line in (wd / "results" / stage / "metrics.jsonl").read_text().splitlines()]
        assert rows and all(not r["update_skipped"] and r["kept_total"] > 0 for r in rows), (stage, rows)
        after = _weights(wd / "results" / stage / "model")
        changed = [k for k in after if not torch.equal(after[k], before[k])]
        assert changed, f"{stage} left every weight of the model it started from unchanged"
        before = after
    print("stage-1 metrics:", (stage1 / "metrics.jsonl").read_text().splitlines()[-1][:400])
    report = wd / "results/report"
    assert (report / "summary.md").read_text().count("|") > 20
    # under the title: what the run was made from (the model, the seed, the --configfile given)
    made = re.search(r"Made from: model tiny_qwen3; seed 0; reproducible on; config files in merge order: "
                     r"config.yaml \(sha256 [0-9a-f]{12}\), configs/tiny.yaml \(sha256 ([0-9a-f]{12})\); code [^\n]+\.",
                     (report / "summary.md").read_text())
    assert made and made.group(1) == file_sha256(wd / TINY)[:12], (report / "summary.md").read_text()[:600]
    for png in ("training_curves.png", "eval.png", "funnel.png"):
        assert (report / png).stat().st_size > 1000
    # IFEval and BFCL went through their checkers (one prompt; one question per BFCL category)
    evaluated = json.loads((wd / "results/eval/rl_stage3/summary.json").read_text())["benchmarks"]
    assert evaluated["ifeval"]["n_problems"] == 1 and set(evaluated["ifeval"]["ifeval"]) >= {"prompt_level_strict_acc"}
    assert evaluated["bfcl"]["n_problems"] == 5 and evaluated["bfcl"]["checker_errors"] == 0
    assert "Generalisation beside paper Table 5" in (report / "summary.md").read_text()
    assert planned_jobs(wd, TINY) == {}
    funnel = json.loads((wd / "results/rl_data/funnel.json").read_text())
    assert funnel["step_status"]["label_verification"] == "skipped" and funnel["steps"][-3:] == [
        "limit", "prompt_length", "label_verification"]
    assert funnel["step_status"]["prompt_length"] == "done" and funnel["prompt_length"]["max_tokens"] == 2048
    assert (wd / "results/rl_data/funnel.png").stat().st_size > 1000


@pytest.mark.slow
def test_same_seed_gives_identical_results_and_another_seed_differs(killed_run, reference_run, tiny_upstream,
                                                                    tmp_path_factory):
    """An uninterrupted run of the tiny config with the same seed, built from nothing, equals the killed-and-resumed
    run in every compared artifact (rollouts, metrics, evaluations, the updated weights, manifests; the upstream
    stages built twice), timings aside; seed 1 gives other rollouts and weights."""
    from rstar2.reproduce import compare_runs

    wd, _ = killed_run
    assert [str(d) for d in compare_runs(wd / "results", reference_run / "results")] == []
    for name in ("sft/model/model.safetensors", "rl/stage1/rollouts.jsonl", "rl/stage1/model/model.safetensors",
                 "rl/stage3/model/model.safetensors", "eval/rl_stage3/summary.json"):
        assert (reference_run / "results" / name).exists(), name   # what was compared is there

    other = copy_run(tiny_upstream, tmp_path_factory.mktemp("seed1") / "wf")
    smk(other, "results/rl/stage1/manifest.json", "--cores", "2", "--configfile", TINY, "--config", "seed=1",
        timeout=900)   # the target first: --config takes every word after it
    differ = {d.path for d in compare_runs(wd / "results", other / "results")}
    assert {"rl/stage1/rollouts.jsonl", "rl/stage1/model/model.safetensors"} <= differ


@pytest.mark.slow
def test_deleted_stage2_reruns_stage2_and_dependents_only(killed_run):
    workdir, _ = killed_run
    stage2 = workdir / "results/rl/stage2"
    backup = workdir.parent / "stage2_backup"
    shutil.copytree(stage2, backup)  # copy2 keeps mtimes, so restoring makes the run up to date again
    shutil.rmtree(stage2)
    expected = {"rl_stage2": 1, "hard_problems": 1, "rl_stage3": 1, "evaluate": 1, "report": 1, "all": 1}
    try:
        assert planned_jobs(workdir, TINY) == expected
        assert planned_eval_models(workdir, TINY) == {"rl_stage3"}   # tiny.yaml evaluates sft and rl_stage3
    finally:
        shutil.copytree(backup, stage2)
    assert planned_jobs(workdir, TINY) == {}

    changed = workdir / "configs/tiny_changed.yaml"
    text = (workdir / TINY).read_text()
    assert "stage2: {max_response_tokens: 32" in text
    changed.write_text(text.replace("stage2: {max_response_tokens: 32", "stage2: {max_response_tokens: 40"))
    assert planned_jobs(workdir, str(changed)) == expected
    assert planned_eval_models(workdir, str(changed)) == {"rl_stage3"}

    # How the sandbox runs (batching, pool size) does not change results: changing it reruns nothing.
    perf = workdir / "configs/tiny_sandbox.yaml"
    perf.write_text(text + "\nsandbox: {batch_size: 32, slots: 8, batch_timeout_s: 0.01}\n")
    # (the report alone is redone: it names the config files it was made from)
    assert planned_jobs(workdir, str(perf)) == {"report": 1, "all": 1}

    # A benchmark that curation does not decontaminate against is none of rl_data's business.
    extra = workdir / "configs/tiny_extra_bench.yaml"
    extra.write_text(text + "\nbenchmarks:\n  more: {path: data/eval/amc23/test.jsonl, fields: {problem: problem, "
                            "answer: answer, id: id}, answer_type: integer}\n")
    assert planned_jobs(workdir, str(extra)) == {"report": 1, "all": 1}   # the report: another config file

    # Neither how often RL checkpoints, nor when it stops for faults, nor the settings of a disabled label
    # verification change a result.
    quiet = workdir / "configs/tiny_no_result_change.yaml"
    quiet.write_text("rl: {checkpoint_every: 3, faults: {max_infra_share: 0.5, max_nonfinite_steps: 5}}\n"
                     "label_verification: {enabled: false, samples: 4, temperature: 0.9}\n")
    assert planned_jobs(workdir, TINY, str(quiet)) == {"report": 1, "all": 1}


@pytest.mark.slow
def test_html_report_in_headless_chromium(killed_run, tmp_path):
    """Snakemake's HTML report of the finished run, clicked through in headless Chromium: every figure
    decodes, the summary page holds the evaluation table beside the paper's Table 3, the funnel and the
    training tables, and the trajectory page shows code."""
    import browser

    workdir, _ = killed_run
    smk(workdir, "--report", "report.html", "--configfile", TINY)
    got = browser.snakemake_report(workdir / "report.html", tmp_path)
    assert set(got["categories"]) == {"Evaluation", "Training", "Data", "Summary", "Trajectories"}
    shown = got["shown"]
    for png in ("training_curves.png", "eval.png", "funnel.png"):
        entry = shown[f"results/report/{png}"]
        assert entry["clicked"] and entry["img"]["width"] > 300 and entry["img"]["height"] > 200, (png, entry)
    # tiny.yaml has no ablation runs: no figure of empty panels for them
    assert "results/report/ablation.png" not in shown
    summary = shown["results/report/summary.html"]["html"]
    main = next(t for t in summary["tables"] if t[0][:2] == ["model", "source"])
    assert main[0] == ["model", "source", "aime24", "aime25", "amc23", "math500"]
    assert [r[0] for r in main[1:3]] == ["sft", "rl_stage3"]
    assert ["rStar2-Agent-14B", "paper Table 3 (avg@16)", "80.6", "69.8", "–", "97.8"] in main
    assert any(t[0][0] == "step" for t in summary["tables"])                 # the data funnel
    assert any(t[0][0] == "stage" and len(t) == 4 for t in summary["tables"])  # three RL stages
    # the learning result the report leads with, the training curves, the funnel, the evaluation
    assert len(summary["images"]) == 4 and all(src.startswith("data:image/png") for src in summary["images"])
    traj = shown["results/report/trajectories.html"]["html"]
    assert "Evaluation: sft" in traj["headings"] and any(h.startswith("RL stage1, step ") for h in traj["headings"]), \
        traj["headings"]
    assert traj["code"] and traj["scripts"] == 0


def test_package_import_never_imports_vllm():
    code = ("import sys, rstar2.cli, rstar2.rollout, rstar2.rl.trainer, rstar2.stages.rl, rstar2.stages.evaluate;"
            "assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV)


def test_parsing_the_workflow_imports_no_torch():
    """What workflow/rules/common.smk imports to parse the config and build the DAG stays light: every
    `snakemake` call (a dry run, each job's own parse on a cluster) would otherwise pay torch's import."""
    smk_imports = re.findall(r"^from (rstar2[\w.]*) import", (REPO_ROOT / "workflow/rules/common.smk").read_text(), re.M)
    assert "rstar2.stages" in smk_imports and "rstar2.workflow_checks" in smk_imports, smk_imports
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {smk_imports!r}]; "
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV)


@pytest.fixture(scope="module")
def custom_run(tiny_upstream, tmp_path_factory) -> Path:
    """docs/own-data.md's worked example, configs/custom_data.example.yaml (a CSV with other column names and a
    non-integer math source), over the tiny config from the base model to the report: one RL stage, its model
    evaluated on MATH-500, graded with the answer reward (not tiny.yaml's smoke reward). The stages before curation
    are the session's (the example changes only the RL sources)."""
    wd = copy_run(tiny_upstream, tmp_path_factory.mktemp("custom") / "wf")
    (wd / "configs/short.yaml").write_text("rl: {reward: answer, stages: {stage2: null, stage3: null}}\n"
                                          "evaluate: {models: [rl_stage1], benchmarks: [math500]}\n")
    smk(wd, "--cores", "2", "--configfile", TINY, *CUSTOM, timeout=1500)
    return wd


CUSTOM = ("configs/custom_data.example.yaml", "configs/short.yaml")


@pytest.mark.slow
def test_custom_dataset_through_config_alone(custom_run):
    """The example's sources become the RL set by editing config only; the math source's problems are rolled out and
    graded as math; the run ends with the report."""
    wd = custom_run
    rows = [json.loads(line) for line in (wd / "results/rl_data/train.jsonl").read_text().splitlines()]
    assert sum(r["source"] == "my_problems" for r in rows) == 5
    assert {r["answer_type"] for r in rows if r["source"] == "math_nonint"} == {"math"}   # data/rl/math_nonint
    funnel = json.loads((wd / "results/rl_data/funnel.json").read_text())
    assert funnel["integer_filter_skipped"] == {"math_nonint": "math"}
    assert funnel["step_status"] == {"loaded": "done", "integer_answer": "done", "dedupe": "done",
                                     "near_dedupe": "done", "decontaminate": "done", "limit": "done",
                                     "prompt_length": "done", "label_verification": "skipped"}
    assert {r["id"]: r["answer"] for r in rows}["my_problems-ex-5"] == "37"
    types = {r["problem"]: r["answer_type"] for r in rows}
    assert {r["source"] for r in rows} == {"my_problems", "math_nonint"} and set(types.values()) == {"integer", "math"}
    records = read_jsonl(wd / "results/rl/stage1/rollouts.jsonl")
    assert records and all(r["answer_type"] == types[r["question"]] for r in records)
    assert json.loads((wd / "results/rl/stage1/manifest.json").read_text())["params"]["reward"] == "answer"
    assert read_jsonl(wd / "results/eval/rl_stage1/math500/per_problem.jsonl")
    assert (wd / "results/report/manifest.json").exists()


@pytest.mark.slow
def test_missing_data_file_fails_at_parse_time_even_with_old_outputs(custom_run, tmp_path):
    """A mistyped dataset path must fail loudly, not let finished outputs built from the old file stand (trial
    finding: rl_candidates was not scheduled and rl_data reused the previous candidates)."""
    wd = custom_run
    typo = tmp_path / "typo.yaml"
    typo.write_text((wd / CUSTOM[0]).read_text()
                    .replace("data/examples/custom_problems.csv", "data/examples/custom_problemz.csv"))
    proc = smk(wd, "-n", "results/rl_data/manifest.json", "--configfile", TINY, str(typo), CUSTOM[1], check=False)
    assert proc.returncode != 0
    assert "not found" in proc.stderr + proc.stdout
    assert "rl_data.sources[0].path: data/examples/custom_problemz.csv" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_every_file_a_later_stage_reads_is_a_declared_output(killed_run):
    """Deleting a cross-stage artifact (optimizer state, per-step logs, evaluation results, the funnel) plans exactly
    the jobs that deleting its stage's manifest plans: the job that writes it and everything downstream."""
    workdir, _ = killed_run
    bench = sorted(json.loads((workdir / "results/eval/sft/summary.json").read_text())["benchmarks"])[0]
    artifacts = {"rl/stage1/optimizer": "rl/stage1", "rl/stage1/metrics.jsonl": "rl/stage1",
                 "rl/stage2/rollouts.jsonl": "rl/stage2", "rl/stage3/heldout.jsonl": "rl/stage3",
                 "eval/rl_stage3/summary.json": "eval/rl_stage3", f"eval/sft/{bench}/per_problem.jsonl": "eval/sft",
                 "rl_data/funnel.json": "rl_data"}

    def planned_without(rel: str) -> dict[str, int]:
        path = workdir / "results" / rel
        aside = workdir / "aside"
        path.rename(aside)   # a rename keeps the mtime, so putting it back makes the run up to date again
        try:
            return planned_jobs(workdir, TINY)
        finally:
            aside.rename(path)

    by_manifest: dict[str, dict[str, int]] = {}   # one dry run per stage's manifest, however many artifacts
    for artifact, stage in artifacts.items():
        assert (workdir / "results" / artifact).exists(), artifact
        planned = planned_without(artifact)
        if stage not in by_manifest:
            by_manifest[stage] = planned_without(f"{stage}/manifest.json")
        assert planned and planned == by_manifest[stage], (artifact, planned)
        if artifact == "rl/stage1/optimizer":
            assert planned == {"rl_stage1": 1, "rl_stage2": 1, "hard_problems": 1, "rl_stage3": 1, "evaluate": 1,
                               "report": 1, "all": 1}, planned
    assert planned_jobs(workdir, TINY) == {}
