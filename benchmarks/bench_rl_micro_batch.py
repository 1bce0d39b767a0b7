"""Peak memory of one RL update at the paper's batch geometry, one pass against micro-batches (issue 20).

The paper config gives each of 8 processes 512 / 8 x 16 = 1,024 kept trajectories per step. Here one process
trains a tiny random Qwen3 on 1,024 such rows (short ones: 16 prompt + 48 response tokens) through the real
``RoCGRPOTrainer`` step (TRL's loss, Trainer's backward, one AdamW step), once with a budget that holds the whole
batch (one pass, what the trainer did before micro-batching) and once per smaller ``micro_batch_tokens``. Each
variant runs in a fresh process; its peak resident memory during ``train()`` (VmHWM after resetting it through
/proc/self/clear_refs, minus the resident memory before) is printed beside the memory plan's estimate for the
same micro-batch (rstar2/rl/memory_plan.py: float32 activations, LM head, gradients and AdamW moments, plus the
CPU-only LM-head term noted in ``child``).

    python benchmarks/bench_rl_micro_batch.py                       # 1,024 rows; budgets: all, 8192, 2048
    python benchmarks/bench_rl_micro_batch.py --gradient-checkpointing
    python benchmarks/bench_rl_micro_batch.py --rows 256 --budgets 0 1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DIMS = dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32)


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(rows: int, prompt: int, response: int, budget: int, checkpointing: bool) -> dict:
    import torch
    from datasets import Dataset
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig

    from rstar2 import models, rollout
    from rstar2.rl import memory_plan as mp
    from rstar2.rl import trainer as rl_trainer

    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = Qwen3Config(**DIMS)
    model = Qwen3ForCausalLM(cfg)
    tok = models.qwen3_tokenizer()
    tok.pad_token = tok.convert_ids_to_tokens(0)  # an id inside the tiny model's vocabulary
    g = torch.Generator().manual_seed(1)
    trajs = [rollout.Trajectory(problem_id=f"p{i}", question="q", gold="1",
                                prompt_ids=torch.randint(10, 4000, (prompt,), generator=g).tolist(),
                                response_ids=torch.randint(10, 4000, (response,), generator=g).tolist(),
                                response_mask=[1] * response, finish_reason="answer") for i in range(rows)]
    adv = torch.randn(rows, generator=g).tolist()

    class Fixed:
        G, last_results, pending = 2, [], None

        def set_process(self, index, count):
            pass

        def state_dict(self):
            return {}

        def __call__(self, prompts, trainer, engines=None):
            self.pending = {"kept_total": rows}
            return trajs, adv

    fn = Fixed()
    budget = budget or rows * (prompt + response)
    # bf16 and gradient_checkpointing set explicitly: GRPOConfig turns both on by default, the stages set them from
    # the distributed section (off on CPU by default)
    args = GRPOConfig(output_dir="/tmp/bench_rl_micro_batch", use_cpu=True, bf16=False,
                      gradient_checkpointing=checkpointing, per_device_train_batch_size=2,
                      num_generations=2, max_steps=1, beta=0.0, entropy_coef=0.0, loss_type="dapo", logging_steps=1,
                      save_strategy="no", report_to=[], max_completion_length=response, disable_tqdm=True)
    tr = rl_trainer.make_trainer_class()(model=model, reward_funcs=[rl_trainer.rollout_reward], args=args,
                                         train_dataset=Dataset.from_list([{"prompt": "a"}]), processing_class=tok,
                                         rollout_fn=fn, micro_batch_tokens=budget)
    before = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    t0 = time.time()
    tr.train()
    step_s = time.time() - t0
    shape = mp.shape_from_config(cfg.to_dict(), "tiny")
    mb_tokens = min(budget, rows * (prompt + response))
    # One CPU-only term: without Triton, TRL's fused LM head folds each (tokens x vocab) tile with torch ops
    # (trl/kernels/chunked_logprob.py _forward_tile) that hold about 2 more tile-sized temporaries (measured on
    # the head alone: 326 MB peak for 2,048 tokens against its 268 MB buffer)
    tile = min(mb_tokens, mp.TILE_TOKENS) * min(shape.vocab_size, mp.TILE_VOCAB) * 4
    estimate = (mp.activation_bytes(shape, mb_tokens, 4, checkpointing) + mp.lm_head_bytes(shape, mb_tokens, 4, False)
                + 2 * tile + 12 * shape.params())  # + float32 gradients and AdamW moments (weights: in `before`)
    return {"budget": budget, "micro_batches": fn.pending["micro_batches"], "peak_minus_before": _status("VmHWM") - before,
            "hwm_reset": reset, "estimate": estimate, "step_s": round(step_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024, help="kept trajectories on the process (paper: 1,024)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--response", type=int, default=48)
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 8192, 2048],
                    help="micro_batch_tokens values; 0 = the whole batch in one pass")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print("RESULT " + json.dumps(child(a.rows, a.prompt, a.response, a.child, a.gradient_checkpointing)), flush=True)
        return
    # glibc keeps freed heap blocks resident and would hide how much memory is live at the peak; with a fixed
    # mmap threshold every tensor over 64 KB is mapped on allocation and unmapped on free, so RSS follows it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    print(f"{a.rows} rows x ({a.prompt} + {a.response}) tokens on one process; tiny Qwen3 {DIMS}; float32 CPU; "
          f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}")
    print(f"{'micro_batch_tokens':>18} {'micro-batches':>13} {'peak RSS - before':>18} {'plan estimate':>14} {'step':>7}")
    for budget in a.budgets:
        r = subprocess.run([sys.executable, __file__, "--rows", str(a.rows), "--prompt", str(a.prompt), "--response",
                            str(a.response), "--child", str(budget)]
                           + (["--gradient-checkpointing"] if a.gradient_checkpointing else []),
                           env=env, capture_output=True, text=True)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if r.returncode or line is None:
            raise SystemExit(f"budget {budget} failed:\n{r.stderr[-3000:]}")
        res = json.loads(line[len("RESULT "):])
        label = f"{res['budget']}{' (all)' if budget == 0 else ''}"
        print(f"{label:>18} {res['micro_batches']:>13} {res['peak_minus_before'] / 1e6:>15.0f} MB "
              f"{res['estimate'] / 1e6:>11.0f} MB {res['step_s']:>6.1f}s"
              + ("" if res["hwm_reset"] else "  (VmHWM not resettable: peak includes start-up)"), flush=True)


if __name__ == "__main__":
    main()
