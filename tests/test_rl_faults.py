"""Fault injection into tiny RL stages: sandbox zygotes killed mid-call, a sandbox that stops serving,
a grading call that hangs, a grading pool that stops answering, NaN losses. Each stage runs `rstar2 rl` (the CLI:
one-line error, exit status 3) in a subprocess on a tiny random model, through the real agent loop, sandbox client
and pool, grading pool and trainer; only the policy is scripted (turn 1 calls the tool, turn 2 answers, right for
even sample indices, so every group is mixed and every step updates). Faults come from RSTAR2_INJECT_FAULTS
(rstar2/faults.py), which take the same paths real faults take."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import served
from conftest import stage_params, write_tiny_rl_inputs

pytestmark = pytest.mark.slow   # subprocess stages and launches: `make test-fast` leaves them out

REPO = Path(__file__).resolve().parents[1]
ENV = served.env()   # the stage runner below is served by the test worker's stage server (tests/served.py)
ENV.pop("RSTAR2_INJECT_FAULTS", None)
STEPS = 3
CALLS_PER_STEP = 4   # 1 prompt x 2G = 4 trajectories, one tool call each

RUNNER = textwrap.dedent('''
    import json, os, sys
    from rstar2 import chat, rollout
    from rstar2.rollout.protocol import Generation

    class ScriptedEngine:
        """Turn 1: a tool call that sleeps a little (so a kill lands mid-call) and prints the sum; turn 2: the
        answer, right for even sample indices."""

        def __init__(self, tok):
            self.tok, self.turn = tok, {}

        def kv_capacity_tokens(self):
            return None

        def release(self, key):
            self.turn.pop(key, None)

        async def generate(self, key, context_ids, max_new_tokens):
            n = self.turn.get(key, 0)
            self.turn[key] = n + 1
            pid, sample = key.rsplit("#", 1)
            i = int(pid.lstrip("p"))
            if n == 0:
                text = chat.tool_call_text(f"import time;time.sleep(.3);print({i}+{i})")
            else:
                text = f"<answer>\\\\boxed{{{2 * i + int(sample) % 2}}}</answer>"
            return Generation(self.tok.encode(text + "<|im_end|>", add_special_tokens=False), "stop")

    if __name__ == "__main__":   # the grading pool's forkserver imports this file again
        rollout.default_engines = lambda model, tok, cfg, seed=None: [ScriptedEngine(tok)]
        from rstar2 import cli
        # as the command line gives them: this process is one job, with a job's imports (cli._lighter_imports)
        sys.argv = ["rstar2", "rl", "--params", sys.argv[1], "--model", sys.argv[2], "--data", sys.argv[3],
                    "--out", sys.argv[4]]
        sys.exit(cli.main())
''')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    write_tiny_rl_inputs(root, 8)
    served.start()
    (root / "runner.py").write_text(RUNNER)
    params = stage_params("rl", "stage1", overrides={"seed": 5, "tool": {"timeout_s": 3}, "rl": {
        "reward": "answer", "mode": "grpo_roc", "positive_selection": "inverse_prob", "group_size": 2, "oversample": 2,
        "prompts_per_step": 1, "learning_rate": 1e-2, "warmup_steps": 0, "checkpoint_every": 1, "temperature": 1.0,
        "top_p": 1.0, "batch_size": 4, "trainer_overrides": {"lr_scheduler_type": "linear"}, "faults": {"max_infra_share": 0.2, "max_nonfinite_steps": 2,
                                                  "grading_stall_s": 120},
        "stages": {"stage1": {"max_response_tokens": 256, "max_turns": 2, "steps": STEPS}}}})
    return root, params


def _stage(setup, name: str, inject: dict | None = None, retries: int = 2, **faults):
    """Run the stage into ROOT/NAME/stage1 (again: resumes); returns (completed process, output folder)."""
    root, params = setup
    out = root / name / "stage1"
    env = {**ENV, "RSTAR2_SANDBOX": json.dumps({"workers": 1, "lean_workers": 1, "full_workers": 0, "slots": 8,
                                                "retries": retries, "retry_backoff_s": 0.2})}
    if inject:
        env["RSTAR2_INJECT_FAULTS"] = json.dumps(inject)
    p = {**params, "faults": {**params["faults"], **faults}}
    r = subprocess.run([sys.executable, "-m", "rstar2.stage_client", str(root / "runner.py"), json.dumps(p),
                        str(root / "model"), str(root / "train.jsonl"), str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    return r, out


def _stop_line(stderr: str) -> str:
    """The one line `rstar2 rl` stopped with (tqdm's progress bar may be redrawn after it)."""
    lines = [ln[ln.index("rstar2 rl: "):] for ln in stderr.replace("\r", "\n").splitlines() if "rstar2 rl: " in ln]
    assert len(lines) == 1 and lines[0].startswith("rstar2 rl: stopped: "), stderr[-3000:]
    return lines[0]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _strip(v, keys):
    if isinstance(v, dict):
        return {k: _strip(x, keys) for k, x in v.items() if k not in keys}
    if isinstance(v, list):
        return [_strip(x, keys) for x in v]
    return v


@pytest.fixture(scope="module")
def reference(setup):
    r, out = _stage(setup, "ref")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = _rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(not m["update_skipped"] and m["tool_calls_per_traj"] == 1 for m in metrics)
    for m in metrics:   # a stage without faults: every fault key zero
        assert (m["tool_infra_failure_ratio"], m["tool_calls_unserved"], m["tool_calls_retried"],
                m["trajectories_excluded"], m["grading_timeouts"], m["grading_pool_restarts"], m["nonfinite_skipped"],
                m["skipped_steps"]) == (0.0, 0, 0, 0, 0, 0, False, 0), m
    return out


def test_killed_sandbox_workers_are_survived_and_change_no_result(setup, reference):
    """The zygote serving step 1's calls and the one serving step 2's are SIGKILLed mid-call: the lost calls are
    retried and served, nothing is excluded, and the stage trains exactly as the one without faults.

    Retries take call numbers too: step 1 uses calls 1-4 and the retries of the 3 or 4 calls in flight at the kill
    (5-7 or 5-8), so step 2 starts at call 8 or 9; killing the zygotes of calls 9 and 10 hits step 2 either way."""
    r, out = _stage(setup, "killed", {"sandbox_kill_calls": [2, 9, 10], "sandbox_kill_delay_s": 0.1})
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = _rows(out / "metrics.jsonl")
    print("\n".join(json.dumps(m) for m in metrics))
    assert [m["tool_calls_retried"] >= 1 for m in metrics] == [True, True, False]
    assert all(m["tool_infra_failure_ratio"] == 0.0 and m["trajectories_excluded"] == 0 for m in metrics)
    from rstar2 import reproduce

    ref_rows, rows = _rows(reference / "rollouts.jsonl"), _rows(out / "rollouts.jsonl")
    assert any(c.get("attempts", 1) > 1 for row in rows for t in row["turns"] for c in t["tool_calls"])
    assert reproduce.first_difference(_strip(ref_rows, {"attempts"}), _strip(rows, {"attempts"})) is None
    assert reproduce.first_difference(_strip(_rows(reference / "metrics.jsonl"), {"tool_calls_retried"}),
                                      _strip(metrics, {"tool_calls_retried"})) is None
    assert (out / "model" / "model.safetensors").read_bytes() == (reference / "model" / "model.safetensors").read_bytes()


def test_a_sandbox_failing_above_the_share_stops_the_stage_and_a_rerun_resumes(setup, reference):
    """From step 3 on every call's zygote dies: the calls stay unserved after their retry, the stage stops with one
    line naming the sandbox and the share, before step 3's update, with checkpoint 2 intact; a rerun with the
    sandbox working resumes there and ends with the results of the stage that had no faults."""
    r, out = _stage(setup, "share", {"sandbox_kill_from": 2 * CALLS_PER_STEP + 1, "sandbox_kill_delay_s": 0.05},
                    retries=1)
    assert r.returncode == 3, r.stderr[-3000:]
    last = _stop_line(r.stderr)
    print(last)
    assert "step 3" in last and "local pool (" in last, last
    assert "100% of the step's tool calls (4 of 4" in last and "max_infra_share 20%" in last, last
    metrics = _rows(out / "metrics.jsonl")
    print("\n".join(json.dumps(m) for m in metrics))
    assert [m["step"] for m in metrics] == [1, 2, 3] and metrics[-1]["stopped"] == last[len("rstar2 rl: stopped: "):]
    assert (metrics[-1]["tool_infra_failure_ratio"], metrics[-1]["trajectories_excluded"]) == (1.0, 4)
    excluded = [row for row in _rows(out / "rollouts.jsonl") if row["step"] == 3]
    assert len(excluded) == 4 and all(row["excluded"] == "infra-error" and not row["kept"] and row["pred"] is None
                                      for row in excluded)
    assert all(c["status"] == "infra-error" and c["attempts"] == 2 for row in excluded for t in row["turns"]
               for c in t["tool_calls"])
    ckpts = out.parent / "checkpoints" / "stage1"
    assert (ckpts / "checkpoint-2" / "rstar2_state.json").exists() and not (ckpts / "checkpoint-3").exists()
    assert not (out / "manifest.json").exists()

    r, out = _stage(setup, "share")
    assert r.returncode == 0, r.stderr[-3000:]
    from rstar2 import reproduce

    assert json.loads((out / "manifest.json").read_text())["counts"]["resumed_from_step"] == 2
    assert reproduce.compare_runs(reference, out) == []


def test_hung_grading_a_stalled_grading_pool_and_one_nan_loss_are_survived(setup, reference):
    """Step 1: the grading pool's first workers never answer: after grading_stall_s it is restarted and grades.
    Step 2: the loss is NaN: no update (loss and gradient norm unrecorded), the learning rate and step counter go
    on. Step 3 trains again, and one of its grading calls hangs: past its bound it scores 0 and is counted."""
    r, out = _stage(setup, "survive", {"grading_stall": "once", "grading_hang_items": [2 * CALLS_PER_STEP + 1],
                                       "nan_loss_steps": [2]}, grading_stall_s=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "restarting the pool" in r.stderr
    metrics = _rows(out / "metrics.jsonl")
    print("\n".join(json.dumps(m) for m in metrics))
    assert [m["grading_pool_restarts"] for m in metrics] == [1, 0, 0]
    assert [m["grading_timeouts"] for m in metrics] == [0, 0, 1]
    assert [m["nonfinite_skipped"] for m in metrics] == [False, True, False]
    assert [m["skipped_steps"] for m in metrics] == [0, 1, 1]
    assert [m["update_skipped"] for m in metrics] == [False, True, False]
    assert metrics[1]["loss"] is None and metrics[1]["grad_norm"] is None and metrics[2]["loss"] is not None
    assert [m["learning_rate"] for m in metrics] == [m["learning_rate"] for m in _rows(reference / "metrics.jsonl")]
    hung = [(row["step"], row["grading_status"], row["reward"]) for row in _rows(out / "rollouts.jsonl")
            if row.get("grading_status") == "timeout"]
    assert hung == [(3, "timeout", 0.0)], r.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["counts"]["updates_skipped"] == 1


def test_non_finite_steps_in_a_row_stop_the_stage_with_weights_untouched(setup):
    """NaN losses at steps 2 and 3 (max_nonfinite_steps 2): step 2 is skipped (its checkpoint holds step 1's
    weights and AdamW state, the schedule one step further), step 3 stops the stage with one line; a rerun resumes
    from checkpoint 2 with the guard's counts."""
    import torch
    from safetensors.torch import load_file

    r, out = _stage(setup, "nan", {"nan_loss_steps": [2, 3]})
    assert r.returncode == 3, r.stderr[-3000:]
    last = _stop_line(r.stderr)
    print(last)
    assert "step 3: 2 optimizer steps in a row" in last, last
    metrics = _rows(out / "metrics.jsonl")
    assert [(m["nonfinite_skipped"], m["skipped_steps"]) for m in metrics] == [(False, 0), (True, 1), (True, 2)]
    ck = out.parent / "checkpoints" / "stage1"
    assert not (ck / "checkpoint-3").exists()
    w1, w2 = (load_file(str(ck / f"checkpoint-{s}" / "model.safetensors")) for s in (1, 2))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    o1, o2 = (torch.load(ck / f"checkpoint-{s}" / "optimizer.pt", weights_only=True)["state"] for s in (1, 2))
    assert all(torch.equal(o1[i]["exp_avg"], o2[i]["exp_avg"]) and float(o1[i]["step"]) == float(o2[i]["step"])
               for i in o1)
    s1, s2 = (torch.load(ck / f"checkpoint-{s}" / "scheduler.pt", weights_only=True)["last_epoch"] for s in (1, 2))
    assert (s1, s2) == (1, 2)   # the schedule went on through the skipped step
    assert json.loads((ck / "checkpoint-2" / "rstar2_state.json").read_text())["finite_guard"] == {"streak": 1,
                                                                                                  "skipped": 1}
    r, out = _stage(setup, "nan")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(m["nonfinite_skipped"], m["skipped_steps"]) for m in _rows(out / "metrics.jsonl")][1:] == [(True, 1),
                                                                                                        (False, 1)]


def test_a_grading_pool_that_cannot_be_restarted_stops_the_stage(setup):
    r, out = _stage(setup, "stall", {"grading_stall": "always"}, grading_stall_s=2)
    assert r.returncode == 3, r.stderr[-3000:]
    last = _stop_line(r.stderr)
    assert last.startswith("rstar2 rl: stopped: grading pool stopped answering") and "again after a restart" in last
    # no step was logged (the stage opens its logs empty) and the stage did not finish
    assert (out / "metrics.jsonl").read_text() == "" and not (out / "manifest.json").exists()
