"""A reward a random model can earn, for smoke runs of the whole workflow (``configs/tiny.yaml``).

The paper's answer reward (§2.2, Eq. 3) is 0 for every rollout of a randomly initialised model, so every GRPO group
has equal rewards, is dropped, and an RL step of the tiny workflow would never update a weight: the workflow tests
of determinism, kill-and-resume and SLURM cancellation would then compare weights nothing changed. This reward
varies between any two different completions, so each group has a non-zero advantage and each step takes an
optimizer step. It goes through the user-reward path of the registry (``rl.reward:
rstar2.grading.smoke_reward:ascii_letter_share``, :mod:`rstar2.grading.rewards`), which the tiny workflow thereby
exercises. It measures nothing about solving and must not be used for a real run.
"""

from __future__ import annotations


def ascii_letter_share(completion: str, answer: str, answer_type: str) -> float:
    """The share of the final turn's characters that are ASCII letters, in [0, 1] (0 for an empty turn).

    Args:
        completion: the model's final assistant turn (tool calls and responses removed by the registry).
        answer: the row's gold answer (unused: the reward does not depend on solving).
        answer_type: the row's answer type (unused).
    """
    if not completion:
        return 0.0
    return sum(c.isascii() and c.isalpha() for c in completion) / len(completion)
