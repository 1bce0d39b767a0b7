"""The rollout layer handed to TRL: 2G drawn per prompt, G kept, tool tokens masked via env_mask."""

import types

import torch

from rstar2 import chat
from rstar2.rl.trainer import RolloutFunc, rollout_reward
from rstar2.rollout import RolloutConfig


class CyclingModel:
    """Emits scripted turns in a fixed cycle so a group holds both correct and wrong trajectories."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.n = tok, turns, 0
        self.training = True

    def eval(self):
        return self

    def train(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        rows = []
        for _ in range(input_ids.shape[0]):
            rows.append(self.tok.encode(self.turns[self.n % len(self.turns)], add_special_tokens=False))
            self.n += 1
        width = max(map(len, rows))
        rows = [r + [self.tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)


def test_rollout_func_oversamples_selects_and_masks(qwen_tokenizer, tmp_path):
    tok = qwen_tokenizer
    call = "Compute.</reason>\n" + chat.tool_call_text("print(6*7)") + "<|im_end|>"
    right = "It is 42.</reason>\n<answer>\\boxed{42}</answer><|im_end|>"
    wrong = "It is 41.</reason>\n<answer>\\boxed{41}</answer><|im_end|>"
    model = CyclingModel(tok, [right, wrong, wrong, call, right, wrong, right, wrong])
    trainer = types.SimpleNamespace(model=model, processing_class=tok,
                                    accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))
    q = "What is 6 times 7?"
    fn = RolloutFunc({q: {"id": "p1", "answer": "42"}}, RolloutConfig(max_response_tokens=200, batch_size=8),
                     group_size=4, oversample=2, mode="grpo_roc", positive_selection="inverse_prob", seed=0,
                     out_dir=str(tmp_path))
    out = fn([q] * 4, trainer)
    assert len(out["completion_ids"]) == 4 == len(out["env_mask"]) == len(out["rollout_reward"])
    assert fn.pending["kept_pos"] + fn.pending["kept_neg"] == 4
    assert 0 < sum(out["rollout_reward"]) < 4   # mixed group: both kinds kept
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        assert len(ids) == len(mask)
        text_masked = tok.decode([i for i, m in zip(ids, mask) if not m])
        assert "<tool_response>" not in tok.decode([i for i, m in zip(ids, mask) if m])
        if text_masked:
            assert text_masked.startswith("\n<|im_start|>user\n<tool_response>")
    assert rollout_reward(None, out["rollout_reward"]) == out["rollout_reward"]
    records = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(records) == 8 and sum('"kept": true' in r for r in records) == 4
