"""The report's RL training section: one row per RL stage from its ``metrics.jsonl`` and ``manifest.json``, the RL
reward each stage trained on (``rl.reward``, from the manifest's ``params.reward``), warnings for stages without
learning signal, and the fault table.

A step's ``accuracy`` (``rstar2.rl.step_metrics``) is the share of its trajectories with reward > 0. Under the
built-in answer reward (paper §2.2, Eq. 3) that is the share answered correctly; under any other reward (a user's
``module:function``, or the smoke reward of ``configs/tiny.yaml``) it counts no solved problem, so the section
names the reward and the table labels the column for what it is.
"""

from __future__ import annotations

from pathlib import Path

from .canvas import NO_DATA
from .document import Figure, Heading, Para, Table
from .faults import faults
from .inputs import num
from .sections import fmt, fmt_int, fmt_seconds

#: ``rl.reward``'s built-in answer reward (``rstar2.grading.rewards.BUILTIN``).
ANSWER_REWARD = "answer"
#: The smoke reward of configs/tiny.yaml (``rstar2.grading.smoke_reward``): it ignores the golds.
SMOKE_MODULE = "rstar2.grading.smoke_reward"


def stage_rewards(manifests: dict[str, dict | None]) -> dict[str, str | None]:
    """``{stage: rl.reward}`` as each stage's manifest records it (``params.reward``); None where the manifest is
    missing or records none."""
    out = {}
    for name, m in manifests.items():
        reward = ((m or {}).get("params") or {}).get("reward")
        out[name] = str(reward) if reward is not None else None
    return out


def reward_blocks(rewards: dict[str, str | None]) -> list:
    """A line naming the RL reward of each stage (stages with the same reward together), then, per reward other
    than the answer reward, what its rewards and positives do not measure: a warning for the smoke reward (it
    ignores the golds), a note for a user's reward (it may grade against them)."""
    if not rewards:
        return []
    by_reward: dict[str, list[str]] = {}
    for name, reward in rewards.items():
        by_reward.setdefault(reward if reward is not None else "not recorded", []).append(name)
    named = "; ".join(f"{', '.join(stages)}: {reward}" + (" (the paper's binary answer reward, §2.2)"
                                                         if reward == ANSWER_REWARD else "")
                      for reward, stages in by_reward.items())
    blocks: list = [Para(f"RL reward (rl.reward, from each stage's manifest): {named}.")]
    for reward, names in by_reward.items():
        if reward in (ANSWER_REWARD, "not recorded"):
            continue
        smoke = reward.startswith(SMOKE_MODULE + ":")
        blocks.append(Para(
            f"{'Warning' if smoke else 'Note'}: {', '.join(names)} trained on {reward}, not the answer reward: "
            + ("a smoke-test reward a random model can earn (configs/tiny.yaml), which ignores the golds; the "
               "rewards below and the share of trajectories with reward > 0 say nothing about solved problems."
               if smoke else "the rewards below and the share of trajectories with reward > 0 count solved "
                             "problems only as far as that function grades answers against the golds.")
            + " Set rl.reward: answer to train on the golds with the paper's reward.", strong=smoke))
    return blocks


def _stage_stats(rows: list[dict], manifest: dict | None) -> dict:
    def series(key):
        return [v for v in (num(r.get(key)) for r in rows) if v is not None]
    rewards, acc, times, steps = series("reward_mean"), series("accuracy"), series("step_time_s"), series("step")
    last = {k: (series(k) or [None])[-1] for k in ("response_length_mean", "tool_error_ratio_pos",
                                                   "truncation_ratio", "all_correct_frac")}
    return {
        "steps": len(rows),
        "first_reward": rewards[0] if rewards else None, "last_reward": rewards[-1] if rewards else None,
        "first_acc": acc[0] if acc else None, "last_acc": acc[-1] if acc else None,
        "last": last,
        "wall": sum(times) if times else num((manifest or {}).get("wall_time_s")),
        "last_step": int(steps[-1]) if steps else None,
    }


def _trained_on(manifest: dict | None) -> tuple[str, str]:
    """(the rl_data sources and data file a stage trained on, "problems / updates") from its manifest."""
    if not manifest:
        return "–", "–"
    params, counts = manifest.get("params") or {}, manifest.get("counts") or {}
    data = next((Path(str(i)).name for i in manifest.get("inputs") or [] if str(i).endswith(".jsonl")), None)
    sources = params.get("sources")
    what = (", ".join(sources) if sources else "all sources") + (f" ({data})" if data else "")
    steps, skipped = counts.get("steps"), counts.get("updates_skipped")
    updates = "–" if steps is None or skipped is None else str(steps - skipped)
    return what, f"{fmt_int(counts.get('train_problems'))} / {updates}"


def training(stages: dict[str, list[dict]], manifests: dict[str, dict | None]) -> list:
    """The RL training section: the RL reward of each stage (``reward_blocks``), one row per RL stage (what it
    trained on, problems and updates, first/last reward and accuracy, last length, tool error ratio of positives,
    truncation ratio, all-correct fraction, wall time), a warning per stage without learning signal, and the fault
    table where a stage had faults (``faults``).

    The accuracy columns are headed "accuracy" only when no stage records a reward other than the answer reward
    (a stage without a recorded reward ran before ``rl.reward`` existed, on the answer reward); else they are
    headed "share with reward > 0", which is what ``accuracy`` counts.
    """
    blocks: list = [Heading("RL training")]
    if not stages:
        return blocks + [Para(f"RL training: {NO_DATA}.")]
    rewards = stage_rewards({name: manifests.get(name) for name in stages})
    blocks += reward_blocks(rewards)
    answer_only = all(r in (None, ANSWER_REWARD) for r in rewards.values())
    acc = "accuracy" if answer_only else "share with reward > 0"
    rows = []
    for name, rows_ in stages.items():
        st = _stage_stats(rows_, manifests.get(name))
        what, sizes = _trained_on(manifests.get(name))
        if st["steps"] == 0:
            rows.append([name, what, sizes, "0", NO_DATA, NO_DATA, "–", "–", "–", "–", "–", "–",
                         fmt_seconds(st["wall"])])
            continue
        last = st["last"]
        rows.append([name, what, sizes, str(st["steps"]), fmt(st["first_reward"], 3), fmt(st["last_reward"], 3),
                     fmt(st["first_acc"], 3), fmt(st["last_acc"], 3), fmt(last["response_length_mean"], 0),
                     fmt(last["tool_error_ratio_pos"], 3), fmt(last["truncation_ratio"], 3),
                     fmt(last["all_correct_frac"], 3), fmt_seconds(st["wall"])])
    blocks.append(Table(["stage", "trained on", "problems / updates", "steps", "first reward", "last reward",
                         f"first {acc}", f"last {acc}", "last mean response length",
                         "last tool error ratio (positives)", "last truncation ratio", "last all-correct groups",
                         "wall time"], rows,
                        caption="A step's reward is the mean over that step's few problems (rl.prompts_per_step), so "
                                "first and last values are noisy; stages train on different problems, so their "
                                "rewards are not comparable with each other (the held-out accuracy above is). "
                                + ("Accuracy: the share of a step's trajectories with reward > 0. " if answer_only
                                   else "Share with reward > 0: of a step's trajectories; it is an accuracy only "
                                        "under the answer reward. ")
                                + "Updates: steps whose groups were not all equal. Wall time is the sum of per-step "
                                  "times (the stage manifest's wall time when steps carry none)."))
    blocks += no_signal_warnings(stages)
    blocks += faults(stages)
    blocks.append(Figure("training_curves.png", "RL training curves (paper Figs. 4, 8, 9)"))
    return blocks


def no_signal_warnings(stages: dict[str, list[dict]]) -> list:
    """Say plainly when a stage had no learning signal: every group's rewards were equal in every step,
    so every advantage was 0 and the update left the weights unchanged."""
    out = []
    for name, rows in stages.items():
        flat = [r for r in rows if num(r.get("all_correct_frac")) is not None and num(r.get("all_wrong_frac")) is not None]
        if flat and len(flat) == len(rows) and all(r["all_correct_frac"] + r["all_wrong_frac"] >= 1 for r in flat):
            wrong = sum(r["all_wrong_frac"] >= 1 for r in flat)
            out.append(Para(f"Warning ({name}): no learning signal. In all {len(flat)} steps every group had equal "
                            f"rewards ({wrong} steps all wrong, {len(flat) - wrong} all correct), so every advantage "
                            "was 0 and this stage did not change the model. Use easier problems, more rollouts per "
                            "group or a stronger base model.", strong=True))
    return out
