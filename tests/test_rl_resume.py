"""Step-level resume: an RL stage killed with SIGKILL mid-way resumes from its last checkpoint with the same
step counter, data order, RNG, optimizer state and LR schedule, so it ends with exactly the weights of an
uninterrupted run. The stage function runs in a subprocess on a tiny random model; rollouts are replaced by a
fast generator that draws lengths, tokens and rewards from torch's global RNG (so a mixed group, a real
update and a wrongly restored RNG all show), and sleeps a little per step so the kill lands mid-stage."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import served
from conftest import stage_params, write_tiny_rl_inputs
from conftest import kill_group_when
import torch

pytestmark = pytest.mark.slow   # subprocess stages and launches: `make test-fast` leaves them out

REPO = Path(__file__).resolve().parents[1]
ENV = served.env()   # the stage runner below is served by the test worker's stage server (tests/served.py)
STEPS = 6

RUNNER = textwrap.dedent('''
    import json, os, sys, time
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

    def parity_grade(trajs, reward_fn=None, answer_types=None, golds=None, reward=None):
        """Real rollouts of a random model never solve anything: reward the parity of the sampled tokens, so
        groups are mixed, the update is real, and the reward depends on exactly which tokens were sampled."""
        for t in trajs:
            t.reward = float(sum(t.response_ids) % 2)

    if os.environ.get("RSTAR2_TEST_REAL_ROLLOUTS"):
        rollout.grade_all = parity_grade      # run_rollouts looks it up in its module at call time
    else:
        rollout.run_rollouts = fake_run_rollouts
    pause = float(os.environ.get("RSTAR2_TEST_PAUSE_S", "0"))
    if pause:  # a pause after every step, and a long one after the last checkpoint, so a kill can land there
        from transformers import TrainerCallback
        from rstar2.rl import trainer as rl_trainer

        class Pause(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                time.sleep(pause)

            def on_save(self, args, state, control, **kw):
                if state.global_step == state.max_steps:
                    time.sleep(120)

        made_pause = rl_trainer.make_trainer_class

        def with_pause():
            cls = made_pause()

            class Pausing(cls):
                def __init__(self, *a, callbacks=None, **k):
                    super().__init__(*a, callbacks=list(callbacks or []) + [Pause()], **k)
            return Pausing

        rl_trainer.make_trainer_class = with_pause
    params, model, data, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    optimizer_from = sys.argv[5] if len(sys.argv) > 5 else None
    dump = os.environ.get("RSTAR2_TEST_OPTIMIZER_DUMP")
    if dump:  # the optimizer state and learning rate the stage starts its first step with
        from transformers import TrainerCallback
        from rstar2.rl import trainer as rl_trainer

        class Dump(TrainerCallback):
            def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
                torch.save({"optimizer": optimizer.state_dict(), "lr": lr_scheduler.get_last_lr()}, dump)

        made = rl_trainer.make_trainer_class

        def with_dump():
            cls = made()

            class Dumping(cls):
                def __init__(self, *a, callbacks=None, **k):
                    super().__init__(*a, callbacks=list(callbacks or []) + [Dump()], **k)
            return Dumping

        rl_trainer.make_trainer_class = with_dump  # rl.run imports it from the module at call time
    rl.run(params, model, data, out, optimizer_from=optimizer_from)
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_tiny_rl_inputs(root, 10)
    served.start()
    (root / "runner.py").write_text(RUNNER)
    params = stage_params("rl", "stage1", overrides={"seed": 1, "tool": {"timeout_s": 3}, "rl": {
        "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 2, "oversample": 2,
        "prompts_per_step": 1, "learning_rate": 1e-2, "warmup_steps": 2, "checkpoint_every": 1, "temperature": 1.0,
        "top_p": 1.0, "batch_size": 4, "stages": {"stage1": {"max_response_tokens": 16, "max_turns": 1, "steps": STEPS}}}})
    return root, params


def _cmd(root, params, out, model=None, optimizer_from=None):
    return [sys.executable, "-m", "rstar2.stage_client", str(root / "runner.py"), json.dumps(params),
            str(model or root / "model"), str(root / "train.jsonl"), str(out)] + \
        ([str(optimizer_from)] if optimizer_from else [])


def _run(cmd, **env):
    r = subprocess.run(cmd, cwd=REPO, env={**ENV, **env}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def stage1(setup):
    """A finished 2-step stage 1 (warm-up of 4 steps) that left its optimizer for stage 2 (save_optimizer)."""
    root, params = setup
    p1 = {**params, "steps": 2, "warmup_steps": 4, "save_optimizer": True}
    out = root / "carry" / "stage1"
    _run(_cmd(root, p1, out))
    return p1, out


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _weights(folder):
    from safetensors.torch import load_file
    return load_file(str(Path(folder) / "model.safetensors"))


@pytest.mark.parametrize("continuing", [False, True], ids=["fresh", "continuing-stage1-optimizer"])
def test_killed_stage_resumes_with_same_steps_data_order_and_weights(setup, stage1, continuing):
    """Also for a stage 2 that continues stage 1's optimizer: resumed, it takes the optimizer from its own
    checkpoint (not stage 1's again) and ends with the uninterrupted run's weights."""
    root, params = setup
    extra = {}
    if continuing:
        params = {**params, "name": "rl_stage2", "continue_optimizer": True}
        extra = {"model": stage1[1] / "model", "optimizer_from": stage1[1] / "optimizer"}
    tag = "continuing" if continuing else "fresh"
    ref = root / f"ref-{tag}" / "stage1"
    subprocess.run(_cmd(root, params, ref, **extra), cwd=REPO, env=ENV, check=True, capture_output=True, timeout=600)

    out = root / f"run-{tag}" / "stage1"
    ckpts = root / f"run-{tag}" / "checkpoints" / "stage1"
    proc = subprocess.Popen(_cmd(root, params, out, **extra), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    kill_group_when(proc, lambda: (ckpts / "checkpoint-2" / "rstar2_state.json").exists(), 300,
                    "the stage ended before its second checkpoint", "no second checkpoint in time", poll_s=0.05)
    assert not (out / "manifest.json").exists(), "killed too late: the stage had finished"
    killed_at = max(r["step"] for r in _rows(out / "metrics.jsonl"))
    assert 2 <= killed_at < STEPS

    resumed = subprocess.run(_cmd(root, params, out, **extra), cwd=REPO, env=ENV, capture_output=True, text=True,
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
    base = _weights(extra.get("model", root / "model"))
    assert any(not torch.equal(w[k], base[k]) for k in w), "training changed nothing"


def _adam(state_dict):
    """AdamW's per-parameter state: {param index: (step, exp_avg, exp_avg_sq)}."""
    return {i: (float(st["step"]), st["exp_avg"], st["exp_avg_sq"]) for i, st in state_dict["state"].items()}


def test_stage2_continues_stage1s_optimizer_and_schedule_stage3_starts_fresh(setup, stage1):
    """Paper §4.3: stage 2 starts with the AdamW moments, step counts and LR schedule stage 1 ended
    with (here mid warm-up: step 2 of 4, so its first learning rate is half the peak, not 0); a stage with
    continue_optimizer false (stage 3) starts with an empty AdamW and a new warm-up."""
    root, params = setup
    p1, s1 = stage1
    saved = torch.load(s1 / "optimizer" / "optimizer.pt", weights_only=True)
    marker = json.loads((s1 / "optimizer" / "carried_optimizer.json").read_text())
    updates = sum(not r["update_skipped"] for r in _rows(s1 / "metrics.jsonl"))
    assert marker["global_step"] == 2 and marker["stage"] == "rl_stage1" and updates >= 1
    assert {v[0] for v in _adam(saved).values()} == {float(updates)}   # AdamW's own step count

    s2 = root / "carry" / "stage2"
    _run(_cmd(root, {**p1, "name": "rl_stage2", "continue_optimizer": True, "save_optimizer": False}, s2,
              model=s1 / "model", optimizer_from=s1 / "optimizer"), RSTAR2_TEST_OPTIMIZER_DUMP=str(root / "s2.pt"))
    start = torch.load(root / "s2.pt", weights_only=True)
    got, want = _adam(start["optimizer"]), _adam(saved)
    assert got.keys() == want.keys() and got
    for i in want:
        assert got[i][0] == want[i][0] and torch.equal(got[i][1], want[i][1]) and torch.equal(got[i][2], want[i][2])
    assert _rows(s2 / "metrics.jsonl")[0]["learning_rate"] == pytest.approx(p1["learning_rate"] * 2 / 4)
    manifest = json.loads((s2 / "manifest.json").read_text())
    assert manifest["optimizer_continued_from"] == marker and not (s2 / "optimizer").exists()

    s3 = root / "carry" / "stage3"
    _run(_cmd(root, {**p1, "name": "rl_stage3", "save_optimizer": False}, s3, model=s2 / "model"),
         RSTAR2_TEST_OPTIMIZER_DUMP=str(root / "s3.pt"))
    assert torch.load(root / "s3.pt", weights_only=True)["optimizer"]["state"] == {}
    assert _rows(s3 / "metrics.jsonl")[0]["learning_rate"] == 0.0   # warm-up from the start
    assert json.loads((s3 / "manifest.json").read_text())["optimizer_continued_from"] is None


def test_continue_optimizer_without_a_saved_optimizer_fails_first(setup, tmp_path):
    root, params = setup
    r = subprocess.run(_cmd(root, {**params, "continue_optimizer": True}, tmp_path / "stage2",
                            optimizer_from=tmp_path / "nothing"), cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0 and "no optimizer state of the previous stage" in r.stderr
    assert not (tmp_path / "stage2" / "metrics.jsonl").exists()


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
    (pkg / "grading" / "symbolic.py").write_text("# v2: integer answers only\n")
    assert checkpoints.fingerprint(*args) != before


REAL = {"RSTAR2_TEST_REAL_ROLLOUTS": "1"}
KILLED = {**REAL, "RSTAR2_TEST_PAUSE_S": "1.5"}   # pauses (and a long one after the last checkpoint) to kill in
REAL_STEPS = 4


@pytest.fixture(scope="module")
def real(setup):
    """Real rollouts (the tiny model through the agent loop, engine and sandbox client; parity rewards): 4 steps,
    a checkpoint every 2, and the uninterrupted run they are compared with."""
    root, params = setup
    params = {**params, "steps": REAL_STEPS, "checkpoint_every": 2}
    ref = root / "real-ref" / "stage1"
    _run(_cmd(root, params, ref), **REAL)   # no pause: sleeping changes no result, and would hold the last 120 s
    return root, params, ref


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", ["step1", "checkpoint2", "last_checkpoint"])
def test_real_rollouts_killed_and_resumed_equal_the_uninterrupted_run(real, kill_after):
    """Kill after step 1 (before any checkpoint: the resume starts over), at the step-2 checkpoint,
    or after the last step's checkpoint (the resume runs no further step but still writes the model and the
    manifest); the resumed stage's rollouts, metrics and weights equal the uninterrupted run's, timings aside
    (rstar2.reproduce.compare_runs)."""
    from rstar2 import reproduce

    root, params, ref = real
    out = root / f"real-{kill_after}" / "stage1"
    ckpts = out.parent / "checkpoints" / "stage1"
    ready = {"step1": lambda: (out / "metrics.jsonl").exists() and len(_rows(out / "metrics.jsonl")) >= 1,
             "checkpoint2": lambda: (ckpts / "checkpoint-2" / "rstar2_state.json").exists(),
             "last_checkpoint": lambda: (ckpts / f"checkpoint-{REAL_STEPS}" / "rstar2_state.json").exists()}[kill_after]
    proc = subprocess.Popen(_cmd(root, params, out), cwd=REPO, env={**ENV, **KILLED}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    kill_group_when(proc, ready, 400, "the stage ended before the kill point", "kill point not reached in time",
                    poll_s=0.05)
    assert not (out / "manifest.json").exists(), "killed too late: the stage had finished"
    killed_at = max(r["step"] for r in _rows(out / "metrics.jsonl"))
    assert killed_at == {"step1": 1, "checkpoint2": 2, "last_checkpoint": REAL_STEPS}[kill_after]

    resumed = subprocess.run(_cmd(root, params, out), cwd=REPO, env={**ENV, **REAL},
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    start = json.loads((out / "manifest.json").read_text())["counts"]["resumed_from_step"]
    assert start == {"step1": 0, "checkpoint2": 2, "last_checkpoint": REAL_STEPS}[kill_after]
    rl_lines = [line for line in resumed.stdout.splitlines() if line.startswith("[rl] step ")]
    assert len(rl_lines) == REAL_STEPS - start, rl_lines
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == list(range(1, REAL_STEPS + 1))
    assert reproduce.compare_runs(ref, out) == []
    assert any(not r["update_skipped"] for r in _rows(ref / "metrics.jsonl")), "no real update to compare"
