"""Per-step RL wall time: our rollout loop (RoCGRPOTrainer + rstar2.rollout) vs TRL 1.16's built-in tool loop.

Same model, same batch (P prompts x G rollouts, mode grpo so both train on every rollout), same sampling
temperature, token budget and turn limit, same sandbox for the code, same reward (our integer grader), same
precision. TRL's loop is ``GRPOTrainer(tools=[...])``: it batches each turn's generation but calls the tool
once per sample, one after another (trl 1.16 ``GRPOTrainer._tool_call_loop``); ours runs every in-flight
trajectory's call concurrently through the sandbox's batching client and does not wait for a turn barrier.
The two loops see the same problems but in a different order (ours shuffles with the stage's seed, TRL's
dataset is not shuffled), and the model answers TRL's prompt differently (fewer tool calls, shorter answers),
so compare the work done per step (the logs' response lengths and tool calls) along with the times.

TRL renders prompts with a chat template it recognises (the Qwen2.5 template shipped in the trl wheel, set on
the model's tokenizer; SmolLM2 uses the same ChatML tokens), so its system prompt is Qwen's tool prompt rather
than rStar2's; the tool is the same function under the same name.

Usage: python benchmarks/bench_trl_tool_loop.py MODEL_DIR [--steps 3] [--prompts 2] [--group 8] [--bf16]
Prints the per-step wall times and the ratio TRL / ours (median over the steps after the first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def problems(n: int) -> list[dict]:
    rows = [json.loads(line) for line in open(REPO / "data/learning/train.jsonl")]
    return rows[:n]


def run_ours(model_dir: str, probs: list[dict], a) -> list[float]:
    from rstar2.stages import rl

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        data.write_text("".join(json.dumps(p) + "\n" for p in probs))
        params = {"name": "bench", "mode": "grpo", "steps": a.steps, "prompts_per_step": a.prompts,
                  "group_size": a.group, "oversample": 1, "learning_rate": 5e-5, "warmup_steps": 0,
                  "clip_low": 0.2, "clip_high": 0.28, "checkpoint_every": 0, "seed": 0, "heldout": None,
                  "micro_batch_tokens": 4096, "continue_optimizer": False, "save_optimizer": False,
                  "trainer": {"bf16": a.bf16},
                  "rollout": {"max_response_tokens": a.max_tokens, "max_turns": a.turns, "temperature": a.temperature,
                              "top_p": 1.0, "batch_size": a.prompts * a.group,
                              "precision": "bf16" if a.bf16 else "fp32"}}
        rl.run(params, model_dir, str(data), str(Path(tmp) / "out"))
        rows = [json.loads(line) for line in open(Path(tmp) / "out" / "metrics.jsonl")]
    return [r["step_time_s"] for r in rows]


def run_trl(model_dir: str, probs: list[dict], a) -> list[float]:
    from importlib.resources import files

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rstar2 import chat, grading, sandbox

    client = sandbox.shared_client(sandbox.SandboxLimits(timeout_s=5.0))

    def execute_python_code_with_standard_io(code: str, input: str) -> str:
        """Execute Python code. The code is run with the given standard input; standard output is captured and
        returned. If the code raises, the error message is returned.

        Args:
            code: The Python code to execute.
            input: The standard input for the code.
        """
        return sandbox.render_result(client.run_many([(code, input or "")])[0], 256)

    def reward(completions, answer, **kw):
        out = []
        for c, gold in zip(completions, answer):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(float(grading.score_trajectory(text or "", gold, answer_type="integer")["reward"]))
        return out

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": chat.user_message(p["problem"])}],
                             "answer": p["answer"]} for p in probs])
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, **kw):
            times.append(round(time.time() - self.t0, 2))
            print(f"[trl] step {state.global_step}: {times[-1]} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=a.bf16, seed=0, per_device_train_batch_size=a.prompts * a.group,
                          num_generations=a.group, max_steps=a.steps, learning_rate=5e-5, beta=0.0,
                          epsilon=0.2, epsilon_high=0.28, loss_type="dapo", max_completion_length=a.max_tokens,
                          max_tool_calling_iterations=a.turns - 1, temperature=a.temperature, logging_steps=1,
                          save_strategy="no", report_to=[], shuffle_dataset=False)
        GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                    tools=[execute_python_code_with_standard_io], callbacks=[Timer()]).train()
    client.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    probs = problems(a.steps * a.prompts)
    ours = run_ours(a.model_dir, probs, a)
    trl = run_trl(a.model_dir, probs, a)
    m_ours, m_trl = statistics.median(ours[1:] or ours), statistics.median(trl[1:] or trl)
    print(f"\nmodel {a.model_dir}; {a.prompts} prompts x {a.group} rollouts per step, {a.max_tokens} tokens, "
          f"{a.turns} turns, T={a.temperature}, bf16={a.bf16}")
    print(f"ours (rstar2 rollout loop) step times s: {ours}")
    print(f"TRL built-in tool loop     step times s: {trl}")
    print(f"median after the first step: ours {m_ours:.1f} s, TRL {m_trl:.1f} s; TRL / ours = {m_trl / m_ours:.2f}x")


if __name__ == "__main__":
    main()
