"""Label verification (paper §4.2) through the real agent loop with a scripted verifier, and the pass-through
("skipped") mode of the CPU default; hard-problem mining's pass counts with the same scripted model."""

from __future__ import annotations

import itertools

import pytest
from conftest import stage_params
import torch

from rstar2.io import read_json, read_jsonl, write_json, write_jsonl
from rstar2.stages import hard_problems, rl_data

ROLLOUT = {"max_response_tokens": 64, "max_turns": 2, "temperature": 1.0, "top_p": 1.0, "batch_size": 64}


def _lv(**kw):
    """label_verification params as the workflow builds them, with ``kw`` set in the config section."""
    return stage_params("label_verification", overrides={"label_verification": {**ROLLOUT, **kw},
                                                          "rl_data": {"max_prompt_tokens": None}})


class CyclingVerifier:
    """Stands in for a causal LM: each sampled response is the next answer of a fixed cycle, as a final turn."""

    def __init__(self, tok, answers):
        self.tok, self.answers = tok, itertools.cycle(answers)

    def eval(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kw):
        new = [self.tok.encode(f"Done.</reason>\n<answer>\\boxed{{{next(self.answers)}}}</answer><|im_end|>",
                               add_special_tokens=False)[:max_new_tokens] for _ in range(len(input_ids))]
        width = max(map(len, new))
        pad = torch.tensor([ids + [pad_token_id] * (width - len(ids)) for ids in new])
        return torch.cat([input_ids, pad], dim=1)


def _candidates(tmp_path, golds: dict[str, str], source="pool"):
    rows = [{"id": f"{source}-{i}", "source": source, "problem": f"Problem {i}: what is the answer?",
             "answer": g, "answer_raw": g} for i, g in golds.items()]
    funnel = {"steps": ["loaded", "decontaminate"], "step_status": {"loaded": "done", "decontaminate": "done"},
              "per_source": {source: {"loaded": len(rows) + 1, "decontaminate": len(rows)}},
              "total": {"loaded": len(rows) + 1, "decontaminate": len(rows)}, "drops": {"contaminated": 1},
              "drops_per_source": {source: {"contaminated": 1}}, "decontamination": {"aime24": 1}}
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_json(tmp_path / "funnel.json", funnel)
    return tmp_path / "train.jsonl", tmp_path / "funnel.json"


def test_keeps_problems_whose_label_is_matched_at_least_min_matches_times(tmp_path, qwen_tokenizer):
    # Samples are laid out problem by problem (4 each); the cycle "7,7,9,9 | 5,8,8,8 | 3,3,3,3" gives gold 7 two
    # matches (kept), gold 5 one match (dropped: label_mismatch), gold 4 none (dropped).
    data, funnel = _candidates(tmp_path, {0: "7", 1: "5", 2: "4"})
    verifier = CyclingVerifier(qwen_tokenizer, [7, 7, 9, 9, 5, 8, 8, 8, 3, 3, 3, 3])
    params = _lv(enabled=True, samples=4, min_matches=2)
    out = tmp_path / "out"
    rl_data.run(params, str(data), str(funnel), str(out), model_and_tokenizer=(verifier, qwen_tokenizer))

    assert [r["id"] for r in read_jsonl(out / "train.jsonl")] == ["pool-0"]
    verified = {v["id"]: v for v in read_jsonl(out / "verification.jsonl")}
    assert {k: v["matches"] for k, v in verified.items()} == {"pool-0": 2, "pool-1": 1, "pool-2": 0}
    assert verified["pool-1"]["preds"] == ["5", "8", "8", "8"]
    f = read_json(out / "funnel.json")
    assert f["steps"][-1] == "label_verification" and f["step_status"]["label_verification"] == "done"
    assert f["per_source"]["pool"]["label_verification"] == 1 and f["total"]["label_verification"] == 1
    assert f["drops"] == {"contaminated": 1, "label_mismatch": 2}
    assert f["drops_per_source"]["pool"]["label_mismatch"] == 2
    assert f["decontamination"] == {"aime24": 1}  # earlier keys are kept for the report
    assert (out / "funnel.png").stat().st_size > 1000
    assert (out / "funnel.csv").read_text().splitlines()[0] == \
        "source,loaded,decontaminate,prompt_length,label_verification,dropped:contaminated,dropped:label_mismatch"
    assert read_json(out / "manifest.json")["counts"]["label_mismatch"] == 2


def test_only_sources_limits_verification(tmp_path, qwen_tokenizer):
    data, funnel = _candidates(tmp_path, {0: "1"})
    rows = read_jsonl(data) + [{"id": "trusted-0", "source": "trusted", "problem": "Q?", "answer": "2",
                                "answer_raw": "2"}]
    write_jsonl(data, rows)
    f = read_json(funnel)
    f["per_source"]["trusted"] = {"loaded": 1, "decontaminate": 1}
    write_json(funnel, f)
    params = _lv(enabled=True, samples=2, min_matches=2, only_sources=["pool"])
    rl_data.run(params, str(data), str(funnel), str(tmp_path / "out"),
                           model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, [9]), qwen_tokenizer))
    assert [r["id"] for r in read_jsonl(tmp_path / "out" / "train.jsonl")] == ["trusted-0"]
    assert [v["id"] for v in read_jsonl(tmp_path / "out" / "verification.jsonl")] == ["pool-0"]


def test_disabled_passes_rows_through_as_a_skipped_step(tmp_path):
    data, funnel = _candidates(tmp_path, {0: "7", 1: "5"})
    out = tmp_path / "out"
    rl_data.run(_lv(enabled=False, samples=16, min_matches=2), str(data), str(funnel), str(out))
    assert read_jsonl(out / "train.jsonl") == read_jsonl(data)
    assert not (out / "verification.jsonl").exists()
    f = read_json(out / "funnel.json")
    assert f["step_status"]["label_verification"] == "skipped" and f["total"]["label_verification"] == 2
    assert "label_mismatch" not in f["drops"]
    assert read_json(out / "manifest.json")["counts"]["label_verification"] == "skipped"


def test_enabled_without_a_model_or_with_bad_counts_is_an_error(tmp_path):
    data, funnel = _candidates(tmp_path, {0: "7"})
    with pytest.raises(ValueError, match="no verifier model"):
        rl_data.run(_lv(enabled=True, samples=4, min_matches=2), str(data), str(funnel),
                               str(tmp_path / "o"))
    with pytest.raises(ValueError, match="min_matches"):
        rl_data.run(_lv(enabled=True, samples=2, min_matches=3), str(data), str(funnel),
                               str(tmp_path / "o"))


def test_hard_problem_mining_records_pass_counts_and_drops_k_of_k(tmp_path, qwen_tokenizer):
    data, _ = _candidates(tmp_path, {0: "7", 1: "5", 2: "4"})
    # k = 2 per problem, problems in the seeded shuffle's order: answer 7 twice, then 5 and 8, then 3 twice.
    rows = read_jsonl(data)
    import random
    random.Random(0).shuffle(rows)
    order = [r["answer"] for r in rows]
    script = {"7": [7, 7], "5": [5, 8], "4": [3, 3]}
    answers = [a for gold in order for a in script[gold]]
    params = stage_params("hard_problems", overrides={"hard_problems": {"k": 2, "subset_size": 0, "max_response_tokens": 64,
                                                                       "max_turns": 2},
                                                     "rl": {"temperature": 1.0, "top_p": 1.0, "batch_size": 64}})
    out = tmp_path / "hard"
    hard_problems.run(params, "unused", str(data), str(out),
                      model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
    counts = {r["answer"]: (r["passes"], r["k"]) for r in read_jsonl(out / "pass_counts.jsonl")}
    assert counts == {"7": (2, 2), "5": (1, 2), "4": (0, 2)}
    assert sorted(r["answer"] for r in read_jsonl(out / "hard.jsonl")) == ["4", "5"]
    assert read_json(out / "manifest.json")["counts"] == {"mined": 3, "problems": 3, "hard": 2,
                                                          "solved_k_of_k": 1, "below_min_passes": 0}

    # min_passes 1: only problems the policy solves sometimes (the 0-of-2 one is dropped too)
    params["min_passes"] = 1
    hard_problems.run(params, "unused", str(data), str(tmp_path / "hard1"),
                      model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
    assert [r["answer"] for r in read_jsonl(tmp_path / "hard1" / "hard.jsonl")] == ["5"]
    assert read_json(tmp_path / "hard1" / "manifest.json")["counts"] == {"mined": 3, "problems": 3, "hard": 1,
                                                                        "solved_k_of_k": 1, "below_min_passes": 1}

    # one problem per round, in the shuffle's order 7, 4, 5: solved 2/2, then never (below min_passes), leave nothing,
    # so mining goes on until min_hard are kept
    assert order == ["7", "4", "5"]
    one = {**params, "subset_size": 1, "min_hard": 1}
    hard_problems.run(one, "unused", str(data), str(tmp_path / "rounds"),
                      model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
    assert [r["answer"] for r in read_jsonl(tmp_path / "rounds" / "pass_counts.jsonl")] == ["7", "4", "5"]
    assert [r["answer"] for r in read_jsonl(tmp_path / "rounds" / "hard.jsonl")] == ["5"]
    assert read_json(tmp_path / "rounds" / "manifest.json")["counts"]["mined"] == 3
    # the paper's rule keeps the never-solved 4: mining stops there, the 5 is not mined
    hard_problems.run({**one, "min_passes": 0}, "unused", str(data), str(tmp_path / "rounds0"),
                      model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
    assert [r["answer"] for r in read_jsonl(tmp_path / "rounds0" / "pass_counts.jsonl")] == ["7", "4"]
    with pytest.raises(ValueError, match=r"none of 1 mined problems was solved between 1 and 1 times out of 2; "
                                         r"raise subset_size or min_hard or lower min_passes"):
        hard_problems.run({**one, "min_hard": 0}, "unused", str(data), str(tmp_path / "one_round"),
                          model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
    params["min_passes"] = 2
    with pytest.raises(ValueError, match=r"min_passes must be below k \(2\), got 2"):
        hard_problems.run(params, "unused", str(data), str(tmp_path / "hard2"),
                          model_and_tokenizer=(CyclingVerifier(qwen_tokenizer, answers), qwen_tokenizer))
