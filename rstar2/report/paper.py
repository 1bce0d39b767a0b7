"""The paper's reported numbers (paper Tables 3, 4 and 5), for the report's reference rows.

Table 3 reports pass@1 averaged over 16 samples for rStar2-Agent-14B; the other rows are as reported by their
own papers. A ``None`` is a value the paper does not give.
"""

from __future__ import annotations

import re

#: Columns of Table 3, in the paper's order.
TABLE3_COLUMNS = ["MATH-500", "AIME24", "AIME25", "HMMT Feb25"]

#: Table 3 rows: (model, reasoning SFT?, {column: pass@1 in percent}).
TABLE3: list[tuple[str, bool | None, dict[str, float | None]]] = [
    ("OpenAI o3-mini (medium)", None, {"MATH-500": 98.0, "AIME24": 79.6, "AIME25": 77.0, "HMMT Feb25": 53.0}),
    ("DeepSeek-R1 (671B)", True, {"MATH-500": 97.3, "AIME24": 79.8, "AIME25": 70.0, "HMMT Feb25": 44.4}),
    ("Claude-Opus-4.0 (Think)", True, {"MATH-500": 98.2, "AIME24": 76.0, "AIME25": 69.2, "HMMT Feb25": None}),
    ("Kimi k1.5", True, {"MATH-500": 96.2, "AIME24": 77.5, "AIME25": None, "HMMT Feb25": None}),
    ("Magistral Medium", True, {"MATH-500": 94.3, "AIME24": 73.6, "AIME25": 64.9, "HMMT Feb25": None}),
    ("QWQ-32B", True, {"MATH-500": 98.0, "AIME24": 79.5, "AIME25": 65.8, "HMMT Feb25": 47.5}),
    ("Magistral Small (24B)", True, {"MATH-500": 95.9, "AIME24": 70.7, "AIME25": 62.8, "HMMT Feb25": 35.7}),
    ("Qwen3-14B", True, {"MATH-500": 96.8, "AIME24": 79.3, "AIME25": 70.4, "HMMT Feb25": 48.9}),
    ("DeepSeek-R1-Zero (671B)", False, {"MATH-500": 95.9, "AIME24": 71.0, "AIME25": 53.3, "HMMT Feb25": 46.0}),
    ("rStar2-Agent-14B", False, {"MATH-500": 97.8, "AIME24": 80.6, "AIME25": 69.8, "HMMT Feb25": 52.7}),
]
OURS = "rStar2-Agent-14B"

#: Columns of Table 5 (generalisation), in the paper's order. IFEval is strict prompt-level accuracy (paper §5.1).
TABLE5_COLUMNS = ["GPQA-Diamond", "BFCL v3", "IFEval", "Arena-Hard"]
#: Paper Table 5 rows: rStar2-Agent-14B after RL, the same model after the non-reasoning SFT, DeepSeek-V3.
TABLE5: list[tuple[str, dict[str, float]]] = [
    ("rStar2-Agent-14B", {"GPQA-Diamond": 60.9, "BFCL v3": 60.8, "IFEval": 83.4, "Arena-Hard": 86.6}),
    ("rStar2-Agent-14B after SFT", {"GPQA-Diamond": 42.1, "BFCL v3": 63.1, "IFEval": 83.7, "Arena-Hard": 86.8}),
    ("DeepSeek-V3", {"GPQA-Diamond": 59.1, "BFCL v3": 57.6, "IFEval": 86.1, "Arena-Hard": 85.5}),
]

#: P Table 4: average response length in tokens.
TABLE4_LENGTH = {
    "rStar2-Agent-14B": {"AIME24": 9339.7, "AIME25": 10943.4},
    "Qwen3-14B": {"AIME24": 14747.6, "AIME25": 17521.9},
    "QWQ-32B": {"AIME24": 11868.4, "AIME25": 15865.4},
    "DeepSeek-R1-Zero (671B)": {"AIME24": 14246.8, "AIME25": 17132.9},
}

_ALIASES = {
    "math500": "MATH-500", "math": "MATH-500",
    "aime24": "AIME24", "aime2024": "AIME24",
    "aime25": "AIME25", "aime2025": "AIME25",
    "hmmt25": "HMMT Feb25", "hmmtfeb25": "HMMT Feb25", "hmmtfeb2025": "HMMT Feb25", "hmmt2025": "HMMT Feb25",
    "gpqa": "GPQA-Diamond", "gpqadiamond": "GPQA-Diamond",
    "ifeval": "IFEval", "bfcl": "BFCL v3", "bfclv3": "BFCL v3", "arenahard": "Arena-Hard",
}


def paper_column(bench: str, declared: str | None = None) -> str | None:
    """The paper column a benchmark is reported beside: the one its spec declares (``paper``), else one
    recognised from its name (``aime24``, ``MATH-500``, ``hmmt_feb_2025`` ...), else None."""
    if declared:
        return declared
    return _ALIASES.get(re.sub(r"[^a-z0-9]", "", bench.lower()))


def reference(model: str, column: str) -> float | None:
    """The paper's number (percent) for ``model`` in ``column``: Table 3 (pass@1) or Table 5 (GPQA-Diamond,
    BFCL v3, IFEval strict prompt-level, Arena-Hard)."""
    if column in TABLE5_COLUMNS:
        return next((values.get(column) for name, values in TABLE5 if name == model), None)
    for name, _, values in TABLE3:
        if name == model:
            return values.get(column)
    return None
