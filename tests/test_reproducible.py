"""Reproducible mode: batches that do not depend on tool-call timing, streams derived from the seed,
and the run comparison users check a run with (rstar2.reproduce). The whole-workflow check (two tiny runs with
one seed are identical, another seed differs) is in tests/test_workflow.py; the real-rollout resume check in
tests/test_rl_resume.py."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch

from rstar2 import reproduce
from rstar2.rollout import AgentLoop, RolloutConfig, Scheduler
from rstar2.rollout.engines import BatchingEngine, Generation, HFEngine
from rstar2.rollout.sim import SimPolicy, SimToolRunner, SimTurn


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from conftest import write_tiny_rl_inputs
    from rstar2 import models

    root = tmp_path_factory.mktemp("tiny_lm")
    write_tiny_rl_inputs(root, 1)
    return models.load(root / "model")


def _drive_engine(engine, n: int, turns: int, delays: random.Random) -> dict[str, list[int]]:
    """What the scheduler does, by hand: announce n trajectories, run each for ``turns`` turns with a random
    'tool call' (sleep) between turns, release each at its end. Returns every trajectory's generated tokens."""
    out: dict[str, list[int]] = {}
    lat = {f"t{i}": [delays.uniform(0, 0.03) for _ in range(turns)] for i in range(n)}

    async def one(key, i):
        ctx = [100 + i, 200 + i, 300 + (i % 3)] * (2 + i % 4)   # rows of different lengths
        out[key] = []
        try:
            for turn in range(turns):
                g = await engine.generate(key, ctx, 6)
                out[key] += g.token_ids
                await asyncio.sleep(lat[key][turn])
                ctx = ctx + g.token_ids + [400 + turn]          # the 'tool response'
        finally:
            engine.release(key)

    async def main():
        keys = [f"t{i}" for i in range(n)]
        for k in keys:
            engine.expect(k)
        try:
            await asyncio.gather(*(one(k, i) for i, k in enumerate(keys)))
        finally:
            await engine.aclose()
    asyncio.run(main())
    return out


def test_hf_engine_rounds_do_not_depend_on_tool_timing(tiny_lm):
    """Reproducible batching on the real transformers engine: two runs whose tool calls finish in different
    orders form the same batches (announcement order, max_batch at a time) and sample the same tokens; without
    it the batches follow the timing."""
    model, tok = tiny_lm
    runs = []
    for delay_seed in (1, 2):
        eng = HFEngine(model, tok, temperature=1.0, max_batch=4, seed=11, reproducible=True)
        runs.append((_drive_engine(eng, 7, 3, random.Random(delay_seed)), eng.batch_keys))
    (tokens_a, batches_a), (tokens_b, batches_b) = runs
    assert batches_a == batches_b
    assert batches_a[:2] == [["t0", "t1", "t2", "t3"], ["t4", "t5", "t6"]]   # a round: announcement order
    assert all(len(b) <= 4 for b in batches_a)
    assert tokens_a == tokens_b and all(len(v) >= 3 for v in tokens_a.values())

    timed = []
    for delay_seed in (1, 2):
        eng = HFEngine(model, tok, temperature=1.0, max_batch=4, seed=11, reproducible=False, linger_s=0.001,
                       max_linger_s=0.002)
        _drive_engine(eng, 7, 3, random.Random(delay_seed))
        timed.append(eng.batch_keys)
    assert timed[0] != timed[1], "without reproducible rounds the batches should follow the tool timing"


class _ScriptedBatching(BatchingEngine):
    """A batching engine over SimPolicy (scripted turns with real tool calls), recording its batches."""

    def __init__(self, policy, kv_tokens, reproducible):
        super().__init__(max_batch=3, kv_tokens=kv_tokens, linger_s=0.001, max_linger_s=0.002,
                         reproducible=reproducible)
        self.policy = policy

    def _generate_batch(self, requests):
        return [Generation(self.policy(r.key, r.context_ids, r.max_new_tokens), "stop") for r in requests]


class _JitteredTools(SimToolRunner):
    """Tool calls whose latency is the scripted one plus random jitter (real seconds)."""

    def __init__(self, rng):
        self.rng = rng

    async def run(self, code, stdin=""):
        await asyncio.sleep(self.rng.uniform(0, 0.02))
        return await super().run(code, stdin)


def _schedule(tok, jitter_seed: int, reproducible: bool):
    scripts = [[SimTurn(20, 0.0)] * (1 + i % 3) + [SimTurn(10, None)] for i in range(9)]
    cfg = RolloutConfig(max_response_tokens=400, max_turns=10)
    agent = AgentLoop(tok, cfg, _JitteredTools(random.Random(jitter_seed)))
    trajs = [agent.new_trajectory({"id": i, "problem": f"Problem sim-{i}."}) for i in range(len(scripts))]
    need = len(trajs[0].prompt_ids) + 400
    policy = SimPolicy(tok, scripts)
    engines = [_ScriptedBatching(policy, 2 * need + 10, reproducible) for _ in range(2)]  # 2 at a time each
    sched = Scheduler(engines, agent, "balanced", 400, reproducible=reproducible)

    async def main():
        try:
            await sched.run(trajs)
        finally:
            for e in engines:
                await e.aclose()
    asyncio.run(main())
    assert all(t.finish_reason == "answer" for t in trajs)
    return sched, [e.batch_keys for e in engines]


def test_scheduler_placement_admission_and_batches_repeat_under_jitter(qwen_tokenizer):
    """Two engines that take two trajectories each (KV admission), nine trajectories of 1-3 tool calls with
    jittered latencies: trajectory j runs on engine j mod 2, a finished one's room is refilled inside its
    release, and every engine's batches are the same in both runs."""
    a, batches_a = _schedule(qwen_tokenizer, 1, True)
    b, batches_b = _schedule(qwen_tokenizer, 2, True)
    assert a.placements == b.placements == {f"{j}#0": j % 2 for j in range(9)}
    assert batches_a == batches_b
    assert a.reserved == [0, 0] and a.admissions[:2] == [(0, 2), (1, 2)] and len(a.admissions) > 2  # refills
    timed = [_schedule(qwen_tokenizer, s, False)[1] for s in (1, 2)]
    assert timed[0] != timed[1], "without reproducible mode placement and batches follow the timing"


def test_trajectory_keys_name_problem_and_sample_so_streams_do_not_depend_on_the_batch(qwen_tokenizer):
    agent = AgentLoop(qwen_tokenizer, RolloutConfig(), SimToolRunner())
    keys = [agent.new_trajectory(p).key for p in
            [{"id": 7, "problem": "a"}, {"id": 3, "problem": "b"}, {"id": 7, "problem": "a"},
             {"id": 3, "key": "aime24/3", "problem": "b"}]]
    assert keys == ["7#0", "3#0", "7#1", "aime24/3#0"]


# ---- rstar2.reproduce: the comparison -----------------------------------------------------------------------

def _results(root, rows, metrics, weight=1.0, manifest_extra=None):
    from safetensors.torch import save_file

    (root / "rl/stage1/model").mkdir(parents=True)
    (root / "rl/stage1/rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "rl/stage1/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (root / "rl/stage1/manifest.json").write_text(json.dumps({"stage": "rl_stage1", "finished_at": "2026-01-01T00",
                                                               "wall_time_s": 3.0, **(manifest_extra or {})}))
    save_file({"a": torch.zeros(3), "b": torch.full((2,), weight)}, str(root / "rl/stage1/model/model.safetensors"))
    (root / "rl/stage1/train.log").write_text("timings differ here\n")
    return root


def test_compare_runs_ignores_timing_fields_and_names_the_first_difference(tmp_path):
    rows = [{"step": 1, "turns": [{"text": "x", "tool_calls": [{"status": "ok", "duration_s": 0.1}]}]}]
    metrics = [{"step": 1, "loss": 0.5, "rollout_time_s": 2.0}]
    a = _results(tmp_path / "a", rows, metrics)
    b_rows = [{"step": 1, "turns": [{"text": "x", "tool_calls": [{"status": "ok", "duration_s": 9.9}]}]}]
    b = _results(tmp_path / "b", b_rows, [{"step": 1, "loss": 0.5, "rollout_time_s": 7.0}],
                 manifest_extra={"finished_at": "2026-02-02T00", "wall_time_s": 8.0, "counts": None})
    (b / "rl/stage1/train.log").write_text("other timings\n")
    diffs = reproduce.compare_runs(a, b)
    assert [str(d) for d in diffs] == ["rl/stage1/manifest.json: field counts only in B"]
    (a / "rl/stage1/manifest.json").write_text((b / "rl/stage1/manifest.json").read_text())
    assert reproduce.compare_runs(a, b) == []
    assert {"duration_s", "rollout_time_s", "wall_time_s", "finished_at"} <= reproduce.TIMING_FIELDS

    c = _results(tmp_path / "c", [{"step": 1, "turns": [{"text": "y", "tool_calls": []}]}], metrics, weight=2.0,
                 manifest_extra={"counts": None})
    diffs = [str(d) for d in reproduce.compare_runs(b, c)]
    assert "rl/stage1/rollouts.jsonl: line 1, field turns[0].text: \"x\" != \"y\"" in diffs
    assert "rl/stage1/model/model.safetensors: tensor b differs (max abs difference 1)" in diffs
    (c / "rl/stage1/extra.json").write_text("{}")
    assert "rl/stage1/extra.json: only in B" in [str(d) for d in reproduce.compare_runs(b, c)]
    with pytest.raises(FileNotFoundError, match="no results folder"):
        reproduce.compare_runs(a, tmp_path / "missing")


def test_compare_runs_cli_exit_codes(tmp_path, capsys):
    from rstar2 import cli

    a = _results(tmp_path / "a", [{"step": 1}], [{"step": 1}])
    b = _results(tmp_path / "b", [{"step": 1}], [{"step": 1}])
    assert cli.main(["compare-runs", str(a), str(b)]) == 0
    assert "identical" in capsys.readouterr().out
    (b / "rl/stage1/metrics.jsonl").write_text('{"step": 2}\n')
    assert cli.main(["compare-runs", str(a), str(b)]) == 1
    assert "the first: rl/stage1/metrics.jsonl: line 1, field step: 1 != 2" in capsys.readouterr().out


def test_compare_runs_reads_a_workflow_folders_results_and_refuses_nothing_to_compare(tmp_path):
    a = _results(tmp_path / "wa" / "results", [{"step": 1}], [{"step": 1}])
    b = _results(tmp_path / "wb" / "results", [{"step": 1}], [{"step": 1}])
    for w in ("wa", "wb"):
        (tmp_path / w / "Snakefile").write_text("")
        (tmp_path / w / ".snakemake" / "metadata").mkdir(parents=True)
        (tmp_path / w / ".snakemake" / "metadata" / "x").write_text(w)   # Snakemake's bookkeeping differs
    assert reproduce.compare_runs(tmp_path / "wa", tmp_path / "wb") == [] == reproduce.compare_runs(a, b)
    assert reproduce.compared_files(a, b) == 4   # rollouts, metrics, manifest, weights (the log is skipped)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="nothing to compare"):
        reproduce.compare_runs(tmp_path / "empty", tmp_path / "empty")


def test_reproduce_refuses_a_workdir_that_already_holds_a_run(tmp_path):
    from pathlib import Path

    (tmp_path / "a" / "results").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="already holds a run"):
        reproduce.run_twice(Path(__file__).resolve().parents[1], tmp_path, [], [], 1)
