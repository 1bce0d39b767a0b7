"""IFEval rows for evaluation (data/eval/ifeval/input_data.jsonl; paper Table 5).

Each row of Google's ``input_data.jsonl`` (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) becomes a
benchmark row whose prompt is the rStar2 template without tools: the bare system prompt, the IFEval prompt
as the user turn (no math instruction prefix, as for the SFT data's instruction rows) and the generation
prompt ``<|im_start|>assistant\\n<reason>``. The reference the checker needs travels as the row's ``answer``
(JSON), so evaluation stores and resumes it like any gold.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import chat

_KEYS = ("key", "prompt", "instruction_id_list", "kwargs")


def prompt_text(prompt: str) -> str:
    """The full prompt text for one IFEval prompt (module docstring)."""
    return chat.turn("system", chat.system_message([])) + chat.turn("user", prompt) + chat.ASSISTANT_PREFIX


def load(name: str, path: Path) -> list[dict]:
    """Rows ``{"id", "problem", "prompt", "answer" (JSON of the IFEval row), "group"}`` in file order.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a line is not JSON or lacks one of ``key``, ``prompt``, ``instruction_id_list``,
            ``kwargs`` (or they differ in length); the message names the file and line.
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"benchmark '{name}' ({path}): line {i + 1}: not JSON ({e.msg})") from None
            missing = [k for k in _KEYS if k not in rec]
            if missing or len(rec["instruction_id_list"]) != len(rec["kwargs"]):
                raise ValueError(f"benchmark '{name}' ({path}): line {i + 1}: "
                                 + (f"missing field(s) {missing}" if missing else
                                    "instruction_id_list and kwargs differ in length"))
            ref = {k: rec[k] for k in _KEYS}
            rows.append({"id": str(rec["key"]), "problem": rec["prompt"], "prompt": prompt_text(rec["prompt"]),
                         "answer": json.dumps(ref, ensure_ascii=False, sort_keys=True), "group": name})
    return rows
