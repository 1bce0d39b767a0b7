"""Training compute of a GRPO-RoC step (2G drawn, G kept) against a plain GRPO step (G drawn), generation
excluded. Target (issue 4): at most 1.15x.

Usage: .venv/bin/python benchmarks/bench_roc_compute.py [--group-size 8] [--repeats 7] [--hidden 64]

Both paths train on the identical kept batch of G trajectories, through the trainer's real code: RoC path =
penalties + equal-reward check + ``roc.select_group`` over 2G + ``build_batch`` of the kept G + TRL's
``_compute_loss`` forward/backward + optimizer step; GRPO path = ``build_batch`` of the same G + the same
forward/backward + step. FLOPs of the forward/backward are counted with torch's FlopCounterMode and wall time
is the median over repeats (alternating paths). For contrast, the "mask instead of drop" alternative
(frameworks.md §1: keep all 2G rows, zero the dropped rows' loss mask) is measured too.
Synthetic trajectories: 48 prompt tokens, responses of 64-256 tokens with a masked tool-response span, half of them correct.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from rstar2 import models
from rstar2.rl import roc
from rstar2.rl.trainer import build_batch, make_trainer_class, rollout_reward
from rstar2.rollout import Trajectory

VOCAB = 8192
PAD = 0   # padding id for the synthetic batches (padding is masked out either way)


def synthetic_group(n: int, rng: random.Random) -> list[Trajectory]:
    out = []
    for i in range(n):
        length = rng.randint(64, 256)
        tool_at, tool_len = rng.randint(10, length // 2), rng.randint(5, 20)
        mask = [0 if tool_at <= j < tool_at + tool_len else 1 for j in range(length)]
        statuses = [rng.choice(["ok", "ok", "error", "timeout"]) for _ in range(rng.randint(0, 3))]
        out.append(Trajectory(problem_id="p", question="q", gold="1",
                              prompt_ids=[rng.randint(100, 5000) for _ in range(48)],
                              response_ids=[rng.randint(100, 5000) for _ in range(length)], response_mask=mask,
                              turns=[{"text": "<answer>1</answer>" * rng.randint(0, 2),
                                      "tool_calls": [{"status": s} for s in statuses]}],
                              finish_reason="answer", reward=float(i % 2 == 0)))
    return out


def make_trainer(hidden: int):
    from datasets import Dataset
    from trl import GRPOConfig

    from transformers import Qwen3Config, Qwen3ForCausalLM

    # The tiny test architecture (Qwen3, random weights, real tokenizer for the special ids) with a vocabulary
    # cut to VOCAB: with all 151k entries the LM head's logits dominate memory and time on CPU.
    tok = models.qwen3_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=hidden // 4, max_position_embeddings=2048,
                                         tie_word_embeddings=True))
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      beta=0.0, entropy_coef=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
                      report_to=[], save_strategy="no", learning_rate=1e-5, max_completion_length=512,
                      disable_tqdm=True)
    tr = make_trainer_class()(model=model, reward_funcs=[rollout_reward], args=args,
                              train_dataset=Dataset.from_list([{"prompt": "a"}]), processing_class=tok, rollout_fn=None)
    tr.current_gradient_accumulation_steps = 1
    tr.create_optimizer()
    return tr, tok


def train_on(tr, batch, count: bool) -> int | None:
    """Forward/backward over ``batch`` through TRL's loss, then one optimizer step; returns the forward/backward
    FLOPs when ``count`` (counting slows the ops down, so counted rounds are not timed)."""
    counter = FlopCounterMode(display=False) if count else contextlib.nullcontext()
    with counter:
        loss = tr._compute_loss(tr.model, batch)
        loss.backward()
    tr.optimizer.step()
    tr.optimizer.zero_grad()
    return counter.get_total_flops() if count else None


def roc_step(tr, group, G, rng, count):
    pens = [roc.tool_error_penalty([c["status"] for c in t.tool_calls]) +
            roc.format_penalty([turn["text"] for turn in t.turns]) for t in group]
    rewards = [t.reward for t in group]
    assert not roc.rewards_equal(rewards)
    kept = roc.select_group(rewards, pens, G, rng, "inverse_prob")
    adv = roc.group_advantages([rewards[i] for i in kept])
    return train_on(tr, build_batch([group[i] for i in kept], adv, PAD), count), kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=128)
    a = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    tr, _ = make_trainer(a.hidden)
    G = a.group_size
    group = synthetic_group(2 * G, rng)

    times = {"grpo_roc": [], "grpo": [], "mask_2g": []}
    flops = {}
    for rep in range(a.repeats + 1):   # round 0 warms up and counts FLOPs; it is not timed
        sel_rng = random.Random(rep)
        t0 = time.perf_counter()
        f_roc, kept = roc_step(tr, group, G, sel_rng, rep == 0)
        t_roc = time.perf_counter() - t0

        kept_trajs = [group[i] for i in kept]  # plain GRPO trains on the identical G trajectories
        t0 = time.perf_counter()
        f_grpo = train_on(tr, build_batch(kept_trajs, roc.group_advantages([t.reward for t in kept_trajs]),
                                          PAD), rep == 0)
        t_grpo = time.perf_counter() - t0

        adv = dict(zip(kept, roc.group_advantages([group[i].reward for i in kept])))
        masked = build_batch(group, [adv.get(i, 0.0) for i in range(len(group))], PAD)
        drop = torch.tensor([i not in adv for i in range(len(group))])
        masked["tool_mask"][drop] = 0
        masked["num_items_in_batch"] = (masked["completion_mask"] * masked["tool_mask"]).sum()
        t0 = time.perf_counter()
        f_mask = train_on(tr, masked, rep == 0)
        t_mask = time.perf_counter() - t0
        if rep:
            times["grpo_roc"].append(t_roc), times["grpo"].append(t_grpo), times["mask_2g"].append(t_mask)
        else:
            flops = {"grpo_roc": f_roc, "grpo": f_grpo, "mask_2g": f_mask}

    med = {k: statistics.median(v) for k, v in times.items()}
    n_params = sum(p.numel() for p in tr.model.parameters())
    print(f"tiny Qwen3 (hidden {a.hidden}, 2 layers, vocab {VOCAB}, {n_params / 1e6:.1f}M parameters), G = {G}, 2G = {2 * G} drawn, "
          f"{a.repeats} timed repeats, {torch.get_num_threads()} CPU threads")
    print(f"{'path':<10} {'rows':>5} {'fwd+bwd GFLOP':>14} {'median s':>9} {'vs grpo (time)':>15} {'vs grpo (FLOP)':>15}")
    for k, rows in (("grpo", G), ("grpo_roc", G), ("mask_2g", 2 * G)):
        print(f"{k:<10} {rows:>5} {flops[k] / 1e9:>14.3f} {med[k]:>9.3f} {med[k] / med['grpo']:>15.3f} "
              f"{flops[k] / flops['grpo']:>15.3f}")
    ratio_t, ratio_f = med["grpo_roc"] / med["grpo"], flops["grpo_roc"] / flops["grpo"]
    verdict = "PASS" if ratio_t <= 1.15 and ratio_f <= 1.15 else "FAIL"
    print(f"GRPO-RoC / GRPO training compute: {ratio_f:.3f}x FLOPs, {ratio_t:.3f}x wall time "
          f"(target <= 1.15x): {verdict}")


if __name__ == "__main__":
    main()
