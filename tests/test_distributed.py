"""Training processes and their engine (rstar2/distributed.py): the FSDP shim on a CPU (gloo) process group, the
one-line refusal of a launch that cannot shard or trains as independent processes, and DDP in two processes
(``accelerate launch`` with configs/accelerate/cpu_2proc.yaml, gloo backend).

What this module ran before FSDP2 executed is now checked under FSDP2 in tests/test_fsdp.py (the paper config's
engine), in fewer launches: the real ``rstar2 sft`` and ``rstar2 rl`` commands in two processes (examples,
optimizer steps and metrics of SFT; metrics once per step by one process, both processes' groups counted,
rollout records, manifest, checkpoints removed, saved model = trained model, training changed the weights of RL),
a process that keeps nothing training on padding only, and the micro-batched two-process gradient against the
one-process single pass. DDP keeps one launch here: its own gradient path (``no_sync`` on all but the last
micro-batch), checked the same way (``test_ddp_micro_batched_step_equals_one_process``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import fsdp_runner
import pytest

REPO = Path(__file__).resolve().parents[1]
ACCEL_CFG = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
       "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_init(monkeypatch):
    """``AcceleratorState.__init__`` replaced by one that only sets the distributed type and backend it is given
    (``fsdp_on_gloo`` then wraps it), and accelerate's shared state by an empty dict, both restored afterwards."""
    from accelerate.state import AcceleratorState, PartialState

    def init(self, *args, fsdp_plugin=None, distributed_type=None, backend=None, **kwargs):
        self.distributed_type, self.backend, self._mixed_precision = distributed_type, backend, "no"
        self.fsdp_plugin = None

    monkeypatch.setattr(AcceleratorState, "__init__", init)
    monkeypatch.setattr(PartialState, "_shared_state", {})
    return AcceleratorState, PartialState


def test_fsdp_on_gloo_sets_the_fsdp_type_only_on_a_gloo_cpu_group(fake_init):
    """The shim turns a MULTI_CPU (gloo) state given an FSDP plugin into DistributedType.FSDP with that plugin, as
    accelerate does for accelerator groups; an accelerator group (MULTI_GPU over NCCL: what CUDA gets), a CPU group
    without a plugin and one over another backend are left as accelerate made them. Installing it twice wraps
    once."""
    from accelerate.utils import DistributedType

    from rstar2 import distributed

    state_cls, partial = fake_init
    distributed.fsdp_on_gloo()
    wrapped = state_cls.__init__
    distributed.fsdp_on_gloo()
    assert state_cls.__init__ is wrapped and wrapped._rstar2_fsdp_on_gloo
    plugin = types.SimpleNamespace(set_mixed_precision=lambda mp: None)
    cases = [(DistributedType.MULTI_CPU, "gloo", plugin, DistributedType.FSDP),
             (DistributedType.MULTI_GPU, "nccl", plugin, DistributedType.MULTI_GPU),
             (DistributedType.MULTI_CPU, "gloo", None, DistributedType.MULTI_CPU),
             (DistributedType.MULTI_CPU, "mpi", plugin, DistributedType.MULTI_CPU)]
    for kind, backend, fsdp_plugin, want in cases:
        state = types.SimpleNamespace()
        partial._shared_state.clear()
        state_cls.__init__(state, fsdp_plugin=fsdp_plugin, distributed_type=kind, backend=backend)
        assert state.distributed_type == want, (kind, backend, fsdp_plugin)
        assert (state.fsdp_plugin is plugin) == (want == DistributedType.FSDP)
        assert partial._shared_state.get("distributed_type") == (want if want == DistributedType.FSDP else None)


def test_an_fsdp_launch_that_cannot_shard_fails_in_one_line(monkeypatch, tmp_path):
    """A launch that asked for FSDP stops before training, in one line, when (1) its processes each train alone:
    two processes launched with the FSDP config and ``distributed.device: cuda`` on this machine without a GPU,
    where accelerate picks no backend (DistributedType.NO, one process each) and the shim is never installed;
    (2) the trainer got any other type than FSDP (e.g. MULTI_CPU, a CPU run without the shim), whatever the
    device. A single process that was not launched as several passes."""
    from accelerate.utils import DistributedType

    from rstar2 import distributed

    probe = tmp_path / "probe.py"
    probe.write_text("import json, os\nfrom accelerate.state import AcceleratorState\nfrom rstar2 import distributed\n"
                     "try:\n    distributed.process_state({'device': 'cuda'})\n    err = None\n"
                     "except ValueError as e:\n    err = str(e)\n"
                     "out = {'rank': os.environ['RANK'], 'error': err,\n"
                     "       'shim': hasattr(AcceleratorState.__init__, '_rstar2_fsdp_on_gloo')}\n"
                     # a file per process: the two processes' prints can interleave on the shared stdout
                     f"open({str(tmp_path)!r} + '/probe' + os.environ['RANK'] + '.json', 'w').write(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                        str(REPO / "configs" / "accelerate" / "fsdp_cpu_2proc.yaml"), "--main_process_port",
                        str(_port()), str(probe)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("probe*.json"))]
    assert sorted(g["rank"] for g in got) == ["0", "1"], r.stdout[-2000:]
    for g in got:
        assert g["shim"] is False
        assert g["error"] and "\n" not in g["error"], g
        assert "launched 2 processes for FSDP training, but this one trains alone (DistributedType.NO" in g["error"]

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for kind in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.NO):
        acc = types.SimpleNamespace(distributed_type=kind, num_processes=1 if kind == DistributedType.NO else 2)
        with pytest.raises(ValueError) as e:
            distributed.check_engine(acc)
        assert "\n" not in str(e.value) and str(kind) in str(e.value)
    distributed.check_engine(types.SimpleNamespace(distributed_type=DistributedType.FSDP, num_processes=2))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    distributed.check_engine(types.SimpleNamespace(distributed_type=DistributedType.NO, num_processes=1))


def test_ddp_micro_batched_step_equals_one_process(tmp_path):
    """DDP (gloo) in two processes with 10 and 3 generated trajectories in step 1, 4 and none in step 2 (that
    process trains on padding rows only, joining every all-reduce), micro-batches of at most 40 padded tokens
    (``no_sync`` on all but the last) and gradient checkpointing: both processes see the same all-reduced step-1
    gradient, equal to one process's single pass over all rows (|diff| <= 1e-6 + 1e-5 |g|, float32), and end with
    identical weights, within 5e-5 of the one-process run's after both AdamW steps, and saved as trained."""
    import torch

    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2,
                                                         "stop_early": True}, "seed": 0}, tmp_path / "model")
    two, one = tmp_path / "two", tmp_path / "one"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"name": "eq", "out": str(two), "equivalence": {
        "params": fsdp_runner.equivalence_params(40), "model": str(tmp_path / "model")}}]))
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCEL_CFG),
                        "--main_process_port", str(_port()), str(REPO / "tests" / "fsdp_runner.py"), str(plan)],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    recs = [json.loads((two / f"eq.rank{k}.json").read_text()) for k in (0, 1)]
    assert {(x["distributed_type"], x["num_processes"]) for x in recs} == {("DistributedType.MULTI_CPU", 2)}
    assert recs[0]["micro_batches"] == recs[1]["micro_batches"] and recs[0]["micro_batches"][0] >= 4, recs
    seen = {}
    fsdp_runner.run_equivalence({"out": str(one), "equivalence": {"params": fsdp_runner.equivalence_params(100000),
                                                                  "model": str(tmp_path / "model")}}, 0, seen)
    assert seen["micro_batches"] == [1, 1]
    c = fsdp_runner.compare(two, one, tmp_path / "model")
    print(f"DDP vs one process: gradient max |diff| {c['grad_max_diff']:.1e}, weights {c['weight_max_diff']:.1e}")
    assert c["grad_nonzero"] and c["grads_same_on_both"] and c["weights_same_on_both"]
    assert c["grads_close"], c["grad_max_diff"]
    assert c["moved"] > 1e-3 and c["weight_max_diff"] <= 5e-5, c
    from safetensors.torch import load_file

    saved, trained = load_file(str(two / "model" / "model.safetensors")), load_file(str(two / "weights.rank0.safetensors"))
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)


def test_vllm_weights_are_synced_before_each_steps_rollouts(qwen_tokenizer):
    """With use_vllm, _prepare_inputs pushes the policy to vLLM (TRL's sync_weights, once per global step)
    before the rollouts, and the rollouts get engines on TRL's vLLM (server mode here: OpenAIEngine on the
    trl vllm-serve address; colocate mode needs vLLM itself and is covered by scripts/gpu_vllm_smoke.py)."""
    import types

    import torch

    from rstar2.rl import trainer as rl_trainer
    from rstar2.rollout.engines import OpenAIEngine

    events = []

    class FakeVLLM:
        def sync_weights(self):
            events.append(("sync", fake.state.global_step))

    class FakeRollouts:
        G, last_results, pending = 2, [], None
        rcfg = types.SimpleNamespace(temperature=1.0, top_p=1.0, batch_size=4)

        def __call__(self, prompts, trainer, engines=None):
            events.append(("rollout", trainer.state.global_step, engines))
            return [], []

    acc = types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True, device=torch.device("cpu"),
                                wait_for_everyone=lambda: None, unwrap_model=lambda m: m)
    fake = types.SimpleNamespace(
        use_vllm=True, vllm_generation=FakeVLLM(), _last_loaded_step=-1, state=types.SimpleNamespace(global_step=0),
        micro_batch_tokens=64,
        args=types.SimpleNamespace(vllm_mode="server", vllm_enable_sleep_mode=False,
                                   vllm_server_base_url="http://127.0.0.1:9", vllm_server_host="127.0.0.1",
                                   vllm_server_port=9),
        model=types.SimpleNamespace(training=True, config=types.SimpleNamespace(_name_or_path="policy")),
        processing_class=qwen_tokenizer, accelerator=acc, rollout_fn=FakeRollouts())
    cls = rl_trainer.make_trainer_class()
    for name in ("_rollout_engines", "_after_rollouts", "_rollout_weights"):
        setattr(fake, name, types.MethodType(getattr(cls, name), fake))
    batch = [{"prompt": "q"}, {"prompt": "q"}]
    assert cls._rollout_micro_batches(fake, batch) == []    # no group kept: no micro-batch, no update
    assert cls._rollout_micro_batches(fake, batch) == []    # same global step: no second sync
    fake.state.global_step = 1
    cls._rollout_micro_batches(fake, batch)
    kinds = [e[:2] for e in events]
    assert kinds == [("sync", 0), ("rollout", 0), ("rollout", 0), ("sync", 1), ("rollout", 1)]
    engines = events[1][2]
    assert len(engines) == 1 and isinstance(engines[0], OpenAIEngine)
    assert engines[0].base_url == "http://127.0.0.1:9" and engines[0].model == "policy"
