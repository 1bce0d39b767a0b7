"""Interrupts lose nothing finished (rstar2/stages/interrupts.py). A tiny RL stage and a tiny SFT run, each run
directly as ``rstar2 rl`` / ``rstar2 sft`` would (a runner calling the stage's ``run``; RL rollouts replaced by a
fast generator, as in test_rl_resume), get SIGTERM or SIGINT, to the process alone or to its whole group: each stops
within seconds at a consistent point, a rerun resumes from the last checkpoint with exactly the checkpoint's
weights (no false "missing keys" warning for the tied lm_head), a signal after the last step lets the stage finish,
and a finished stage whose outputs were deleted (what Snakemake does to an unrecorded job) is put back, not
retrained. The Snakemake side (a signal to the ``snakemake`` process alone) is test_interrupts_workflow.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import stage_params, write_tiny_rl_inputs

pytestmark = pytest.mark.slow   # subprocess stages and launches: `make test-fast` leaves them out

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
       "TRL_EXPERIMENTAL_SILENCE": "1"}
STEPS = 4
STOP_WITHIN_S = 15   # from the signal to the process's exit (imports done; a step is ~0.5 s here)

RUNNER = textwrap.dedent('''
    import json, os, sys, time
    import torch
    from transformers import TrainerCallback
    from rstar2 import rollout
    from rstar2.rl import trainer as rl_trainer
    from rstar2.stages import rl

    def fake_run_rollouts(model, tok, problems, cfg, progress=None, **kw):
        out = []
        for p in problems:
            ids = torch.randint(100, 1000, (int(torch.randint(3, 9, (1,))),)).tolist() + [tok.eos_token_id]
            out.append(rollout.Trajectory(
                problem_id=str(p["id"]), question=p["problem"], gold=p["answer"],
                prompt_ids=tok.encode(p["problem"], add_special_tokens=False), response_ids=ids,
                response_mask=[1] * len(ids), turns=[{"text": "<answer>x</answer>", "tool_calls": []}],
                finish_reason="answer", reward=float(torch.rand(()) < 0.5)))
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0.5")))
        return out

    rollout.run_rollouts = fake_run_rollouts
    dump, slow_save = os.environ.get("DUMP_WEIGHTS"), os.environ.get("SLOW_SAVE")

    class Dump(TrainerCallback):   # the weights the first step starts from: after a resume, the checkpoint's
        def on_train_begin(self, args, state, control, model=None, **kw):
            from safetensors.torch import save_file
            save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, dump)

    made = rl_trainer.make_trainer_class

    def hooked():
        cls = made()

        class Hooked(cls):
            def __init__(self, *a, callbacks=None, **k):
                super().__init__(*a, callbacks=list(callbacks or []) + ([Dump()] if dump else []), **k)

            def save_model(self, *a, **k):   # the final save, after the last step: a signal can land here
                if slow_save and not k.get("_internal_call"):   # not a checkpoint's save
                    open(slow_save, "w").close()
                    time.sleep(3)
                return super().save_model(*a, **k)
        return Hooked

    rl_trainer.make_trainer_class = hooked
    rl.run(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
''')

SFT_RUNNER = textwrap.dedent('''
    import json, os, sys, time
    import trl
    from transformers import TrainerCallback
    from rstar2.stages import sft

    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))

    class SlowSFT(trl.SFTTrainer):
        def __init__(self, *a, callbacks=None, **k):
            super().__init__(*a, callbacks=list(callbacks or []) + [Slow()], **k)

    trl.SFTTrainer = SlowSFT   # sft.run imports it from trl at call time
    sft.run(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
''')


# A stand-in for the Snakemake process: forward_signals() as the workflow's onstart installs it, then a job as
# Snakemake runs one (a shell, its child, running a command: here one that records the signal it gets).
FORWARDER = textwrap.dedent('''
    import subprocess, sys, time
    from rstar2.stages import interrupts

    interrupts.forward_signals()
    job = subprocess.Popen(["bash", "-c", f"{sys.executable} {sys.argv[1]} {sys.argv[2]}; exit 7"])
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("KeyboardInterrupt in the scheduler; the job's shell exited", job.wait(timeout=30), flush=True)
''')
JOB = textwrap.dedent('''
    import pathlib, signal, sys, time
    got = pathlib.Path(sys.argv[1])
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: (got.write_text(signal.Signals(n).name), sys.exit(0)))
    got.with_suffix(".ready").touch()
    time.sleep(60)
''')


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_snakemake_passes_its_signal_to_the_jobs_processes_and_stops_its_scheduler(tmp_path, sig):
    """What the workflow's onstart installs (interrupts.forward_signals): a signal to the Snakemake process alone
    reaches the process the job's shell runs (not the shell, which exits by itself once its command did), and
    Snakemake's scheduler gets KeyboardInterrupt: SIGTERM too, where Snakemake's own handler would let the running
    jobs finish. The real Snakemake run of it: test_interrupts_workflow.py."""
    (tmp_path / "forwarder.py").write_text(FORWARDER)
    (tmp_path / "job.py").write_text(JOB)
    got = tmp_path / "got.txt"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "forwarder.py"), str(tmp_path / "job.py"), str(got)],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    rc, out, _, took = _signal_when(proc, got.with_suffix(".ready").exists, lambda: os.kill(proc.pid, sig), 60)
    assert got.read_text() == signal.Signals(sig).name
    assert rc == 0 and out.strip() == "KeyboardInterrupt in the scheduler; the job's shell exited 7", out


def _start(cmd, **env):
    return subprocess.Popen(cmd, cwd=REPO, env={**ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _signal_when(proc, ready, send, timeout_s=300):
    """Once ``ready()`` holds, ``send()`` the signal; then wait for the process. Returns (rc, stdout, stderr,
    seconds from the signal to the exit)."""
    deadline = time.time() + timeout_s
    while not ready():
        assert proc.poll() is None, "the run ended before the signal: " + proc.stderr.read()[-3000:]
        assert time.time() < deadline, "the signal's moment did not come in time"
        time.sleep(0.05)
    send()
    t0 = time.time()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err, time.time() - t0


def _say(capsys, line: str) -> None:
    """A measurement on the terminal (with -s), past the capture the tests read the stages' output from."""
    with capsys.disabled():
        print(line, flush=True)


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def rl_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupts")
    write_tiny_rl_inputs(root, 8)
    (root / "runner.py").write_text(RUNNER)
    params = stage_params("rl", "stage1", overrides={"seed": 3, "rl": {
        "group_size": 2, "oversample": 2, "prompts_per_step": 1, "learning_rate": 1e-2, "checkpoint_every": 1,
        "batch_size": 4, "stages": {"stage1": {"max_response_tokens": 16, "max_turns": 1, "steps": STEPS}}}})
    return root, params


def test_rl_stage_stops_on_each_signal_resumes_with_the_checkpoints_weights_and_is_never_retrained(rl_setup,
                                                                                                      capsys):
    root, params = rl_setup
    out = root / "run" / "stage1"
    ckpts, kept = root / "run" / "checkpoints" / "stage1", root / "run" / "finished" / "stage1"
    cmd = [sys.executable, str(root / "runner.py"), json.dumps(params), str(root / "model"),
           str(root / "train.jsonl"), str(out)]

    # 1. SIGINT to the job's whole process group (a Ctrl-C): stopped within seconds, one line (though every process
    # of the group got it) naming the checkpoint a rerun resumes from; the checkpoint is complete, the stage not
    proc = _start(cmd)
    rc, _, err, took = _signal_when(proc, lambda: (ckpts / "checkpoint-1" / "rstar2_state.json").exists(),
                                    lambda: os.killpg(proc.pid, signal.SIGINT))
    _say(capsys, f"[interrupts] SIGINT to the RL process group: exit {rc} after {took:.1f} s")
    assert rc == 128 + signal.SIGINT and took < STOP_WITHIN_S, err[-3000:]
    stop = [line for line in err.splitlines() if line.startswith("[rl] SIGINT: stopped; a rerun resumes from")]
    assert len(stop) == 1, err[-3000:]
    assert not (out / "manifest.json").exists() and not kept.exists()
    first = int(stop[0].rsplit("(step ", 1)[1].rstrip(")"))
    assert 1 <= first < STEPS
    shutil.copy(ckpts / f"checkpoint-{first}" / "model.safetensors", root / "saved.safetensors")

    # 2. the rerun resumes there with exactly the checkpoint's weights (the tied lm_head re-tied, not reported
    # "missing"); SIGTERM to the group after the last step (during the final save) lets it write its outputs, exit 0
    from safetensors.torch import load_file

    proc = _start(cmd, DUMP_WEIGHTS=str(root / "resumed.safetensors"), SLOW_SAVE=str(root / "saving"))
    rc, out_text, err, _ = _signal_when(proc, lambda: (root / "saving").exists(),
                                        lambda: os.killpg(proc.pid, signal.SIGTERM))
    assert rc == 0 and "[rl] SIGTERM: the last step is done; writing the stage's outputs" in err, err[-3000:]
    assert f"resuming rl_stage1 from {ckpts / f'checkpoint-{first}'} (step {first})" in out_text
    assert "missing keys" not in err, err[-3000:]
    resumed, saved = load_file(str(root / "resumed.safetensors")), load_file(str(root / "saved.safetensors"))
    assert "lm_head.weight" not in saved and saved.keys() <= resumed.keys()
    assert all((resumed[k] == saved[k]).all() for k in saved)
    assert (resumed["lm_head.weight"] == saved["model.embed_tokens.weight"]).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["steps"] == STEPS and manifest["counts"]["resumed_from_step"] == first
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert (kept / "finished.json").exists() and not ckpts.exists()

    # 3. Snakemake, interrupted before it recorded the job, deletes its outputs and runs it again: the outputs come
    # back from their kept links, no step is trained again
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    shutil.rmtree(out)
    from rstar2.stages import rl

    t0 = time.time()
    rl.run(params, str(root / "model"), str(root / "train.jsonl"), str(out))   # in this process: no training here
    _say(capsys, f"[interrupts] rerun of the finished RL stage: {time.time() - t0:.2f} s (in process: no Python start)")
    assert "had finished with these inputs" in capsys.readouterr().out
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_sft_stops_on_a_signal_and_a_finished_one_is_put_back(tmp_path, capsys):
    from rstar2 import chat, models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 4}},
                       tmp_path / "model")
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"s{i}", "messages": [
                {"role": "system", "content": chat.system_message([chat.python_tool_schema()])},
                {"role": "user", "content": f"Reverse the word w{i}."},
                {"role": "assistant", "content": f"<reason>easy</reason><answer>{str(i)[::-1]}w</answer>"}]}) + "\n")
    (tmp_path / "runner.py").write_text(SFT_RUNNER)
    params = stage_params("sft", overrides={"sft": {"epochs": 1, "batch_size": 2, "max_length": 512}})
    out = tmp_path / "sft"
    cmd = [sys.executable, str(tmp_path / "runner.py"), json.dumps(params), str(tmp_path / "model"),
           str(tmp_path / "train.jsonl"), str(out)]

    proc = _start(cmd, STEP_SLEEP_S="1")
    rc, _, err, took = _signal_when(proc, lambda: (out / "metrics.jsonl").exists(),
                                    lambda: os.kill(proc.pid, signal.SIGTERM))
    _say(capsys, f"[interrupts] SIGTERM to the SFT process: exit {rc} after {took:.1f} s")
    assert rc == 128 + signal.SIGTERM and took < STOP_WITHIN_S, err[-3000:]
    assert "[sft] SIGTERM: stopped; the cold start keeps no step checkpoints: a rerun starts it again" in err
    assert not (out / "manifest.json").exists()

    from rstar2.stages import sft

    sft.run(params, str(tmp_path / "model"), str(tmp_path / "train.jsonl"), str(out))   # again, to its end
    assert "had finished" not in capsys.readouterr().out
    manifest = (out / "manifest.json").read_bytes()
    shutil.rmtree(out)
    sft.run(params, str(tmp_path / "model"), str(tmp_path / "train.jsonl"), str(out))
    assert "the cold start had finished with these inputs" in capsys.readouterr().out
    assert (out / "manifest.json").read_bytes() == manifest and (out / "model" / "model.safetensors").exists()
