"""Step-level resume: an RL stage killed with SIGKILL mid-way resumes from its last checkpoint with the same
step counter, data order, RNG, optimizer state and LR schedule, so it ends with exactly the weights of an
uninterrupted run. The stage function runs in a subprocess on a tiny random model; rollouts are replaced by a
fast generator that draws lengths, tokens and rewards from torch's global RNG (so a mixed group, a real
update and a wrongly restored RNG all show), and sleeps a little per step so the kill lands mid-stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_tiny_rl_inputs
from conftest import kill_group_when
import torch

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
       "TRL_EXPERIMENTAL_SILENCE": "1"}
STEPS = 6

RUNNER = textwrap.dedent('''
    import json, sys, time
    import torch
    from rstar2 import rollout
    from rstar2.stages import rl

    def fake_run_rollouts(model, tok, problems, cfg, progress=None, **kw):
        assert kw.get("answer_type") == "integer", kw   # RL data is integer-answer: its grader must be too
        out = []
        for p in problems:
            n = int(torch.randint(3, 9, (1,)))
            ids = torch.randint(100, 1000, (n,)).tolist() + [tok.eos_token_id]
            out.append(rollout.Trajectory(
                problem_id=str(p["id"]), question=p["problem"], gold=p["answer"],
                prompt_ids=tok.encode(p["problem"], add_special_tokens=False), response_ids=ids,
                response_mask=[1] * len(ids), turns=[{"text": "<answer>x</answer>", "tool_calls": []}],
                finish_reason="answer", reward=float(torch.rand(()) < 0.5)))
        time.sleep(0.4)
        return out

    rollout.run_rollouts = fake_run_rollouts
    params, model, data, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    rl.run(params, model, data, out)
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_tiny_rl_inputs(root, 10)
    (root / "runner.py").write_text(RUNNER)
    params = {"name": "rl_stage1", "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 2,
              "oversample": 2, "prompts_per_step": 1, "learning_rate": 1e-2, "warmup_steps": 2, "clip_low": 0.2,
              "clip_high": 0.28, "checkpoint_every": 1, "steps": STEPS, "seed": 1, "tool": {"timeout_s": 3},
              "micro_batch_tokens": 4096, "continue_optimizer": False, "save_optimizer": False,
              "rollout": {"max_response_tokens": 16, "max_turns": 1, "temperature": 1.0, "top_p": 1.0,
                          "batch_size": 4}}
    return root, params


def _cmd(root, params, out):
    return [sys.executable, str(root / "runner.py"), json.dumps(params), str(root / "model"),
            str(root / "train.jsonl"), str(out)]


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _weights(folder):
    from safetensors.torch import load_file
    return load_file(str(Path(folder) / "model.safetensors"))


def test_killed_stage_resumes_with_same_steps_data_order_and_weights(setup):
    root, params = setup
    ref = root / "ref" / "stage1"
    subprocess.run(_cmd(root, params, ref), cwd=REPO, env=ENV, check=True, capture_output=True, timeout=600)

    out = root / "run" / "stage1"
    ckpts = root / "run" / "checkpoints" / "stage1"
    proc = subprocess.Popen(_cmd(root, params, out), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    kill_group_when(proc, lambda: (ckpts / "checkpoint-2" / "rstar2_state.json").exists(), 300,
                    "the stage ended before its second checkpoint", "no second checkpoint in time", poll_s=0.05)
    assert not (out / "manifest.json").exists(), "killed too late: the stage had finished"
    killed_at = max(r["step"] for r in _rows(out / "metrics.jsonl"))
    assert 2 <= killed_at < STEPS

    resumed = subprocess.run(_cmd(root, params, out), cwd=REPO, env=ENV, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    start = m["counts"]["resumed_from_step"]
    assert 2 <= start <= killed_at
    assert f"(step {start})" in resumed.stdout
    assert not ckpts.exists(), "checkpoints are removed once the stage has finished"

    # same step counter: every step exactly once, in order, and the resumed process ran only the rest
    metrics, ref_metrics = _rows(out / "metrics.jsonl"), _rows(ref / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1)) == [r["step"] for r in ref_metrics]
    assert resumed.stdout.count("[rl] step ") == STEPS - start
    # same data order and same sampled rollouts (RNG restored): rollouts.jsonl equal row by row
    strip = lambda r: {k: v for k, v in r.items() if k not in ("duration_s",)}  # noqa: E731
    rows, ref_rows = _rows(out / "rollouts.jsonl"), _rows(ref / "rollouts.jsonl")
    assert [(r["step"], r["problem_id"]) for r in rows] == [(r["step"], r["problem_id"]) for r in ref_rows]
    assert [strip(r) for r in rows] == [strip(r) for r in ref_rows]
    # learning-rate schedule and losses continue where they were
    for a, b in zip(metrics, ref_metrics):
        assert a["learning_rate"] == pytest.approx(b["learning_rate"], rel=1e-6)
        assert (a["loss"] is None) == (b["loss"] is None)
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    assert any(not r["update_skipped"] for r in metrics[start:]), "no real update after the resume"
    # optimizer state restored: the final weights equal the uninterrupted run's
    w, w_ref = _weights(out / "model"), _weights(ref / "model")
    assert w.keys() == w_ref.keys()
    for k in w:
        assert torch.allclose(w[k], w_ref[k], rtol=1e-5, atol=1e-7), k
    base = _weights(root / "model")
    assert any(not torch.equal(w[k], base[k]) for k in w), "training changed nothing"


def test_fingerprint_changes_with_the_reward_code(tmp_path, monkeypatch):
    """A checkpoint trained under another grader is not resumed: the reward modules' source is fingerprinted."""
    from rstar2.rl import checkpoints

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"w")
    (tmp_path / "d.jsonl").write_text("{}\n")
    pkg = tmp_path / "pkg"
    for m in checkpoints.REWARD_MODULES:
        (pkg / m).parent.mkdir(parents=True, exist_ok=True)
        (pkg / m).write_text("# v1\n")
    monkeypatch.setattr(checkpoints, "PACKAGE", pkg)
    args = ({"lr": 1}, tmp_path / "model", tmp_path / "d.jsonl")
    before = checkpoints.fingerprint(*args)
    assert checkpoints.fingerprint(*args) == before
    (pkg / "grading.py").write_text("# v2: integer answers only\n")
    assert checkpoints.fingerprint(*args) != before
