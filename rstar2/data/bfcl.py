"""BFCL rows for evaluation (data/eval/bfcl: BFCL v4 files of the bfcl-eval wheel; paper Table 5).

A BFCL question file holds ``{"id", "question": [[{role, content}, ...]], "function": [function docs]}`` per
line and ``possible_answer/`` the ground truth per id (none for irrelevance). Each question becomes a
benchmark row whose prompt is the rStar2 template with the question's functions as the tools: the system
prompt lists one ``{"type": "function", "function": doc}`` per line (chat.system_message, as the SFT data's
function-calling rows are rendered) and the model answers with ``<tool_call>`` JSON blocks. The function docs
are converted the way BFCL converts them for function-calling models: BFCL's types mapped to JSON-schema
types with its own table (``bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI``: dict -> object, float ->
number, tuple -> array, ...), and its Python hint appended to each description. Names keep their dots.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from .. import chat

# BFCL appends this to every Python function's description (bfcl_eval.utils._get_language_specific_hint).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."


def _openapi_types(schema: dict, mapping: dict) -> dict:
    """A BFCL parameter schema with every ``type`` mapped to JSON schema (unknown or absent: string)."""
    out = dict(schema)
    out["type"] = mapping.get(schema.get("type"), "string")
    if "properties" in schema:
        out["properties"] = {k: _openapi_types(v, mapping) for k, v in schema["properties"].items()}
    if "items" in schema and isinstance(schema["items"], dict):
        out["items"] = _openapi_types(schema["items"], mapping)
    return out


def tool_schemas(functions: list[dict]) -> list[dict]:
    """BFCL function docs -> the tool entries of our system prompt (module docstring)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    tools = []
    for f in copy.deepcopy(functions):
        f["description"] = f.get("description", "") + PYTHON_HINT
        f["parameters"] = _openapi_types(f.get("parameters") or {"type": "dict", "properties": {}},
                                         GORILLA_TO_OPENAPI)
        tools.append({"type": "function", "function": f})
    return tools


def prompt_text(question: list[dict], functions: list[dict]) -> str:
    """The full prompt text of one single-turn BFCL question (its first turn's messages, in order)."""
    turns = "".join(chat.turn(m["role"], m["content"]) for m in question)
    return chat.turn("system", chat.system_message(tool_schemas(functions))) + turns + chat.ASSISTANT_PREFIX


def _read_jsonl(path: Path, name: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"benchmark '{name}' ({path}): line {i + 1}: not JSON ({e.msg})") from None
    return out


def files(folder: Path, categories: list[str]) -> list[Path]:
    """The question and answer files the categories read (irrelevance has no answer file)."""
    out = []
    for c in categories:
        out.append(folder / f"BFCL_v4_{c}.json")
        if "irrelevance" not in c:
            out.append(folder / "possible_answer" / f"BFCL_v4_{c}.json")
    return out


def load(name: str, folder: Path, categories: list[str]) -> list[dict]:
    """Rows ``{"id", "problem", "prompt", "answer" (JSON: category, functions, ground_truth), "group"}``,
    category by category in the given order; ``group`` is the category.

    Raises:
        FileNotFoundError: a category's question or answer file is missing.
        ValueError: a line is not JSON, a question has more than one turn (multi-turn categories are not
            single-turn AST checks) or no answer for its id; the message names the file and id.
    """
    rows = []
    for c in categories:
        qpath = folder / f"BFCL_v4_{c}.json"
        answers = {}
        if "irrelevance" not in c:
            apath = folder / "possible_answer" / f"BFCL_v4_{c}.json"
            answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(apath, name)}
        for q in _read_jsonl(qpath, name):
            if len(q["question"]) != 1:
                raise ValueError(f"benchmark '{name}' ({qpath}): {q['id']}: {len(q['question'])} turns; only "
                                 "single-turn categories are checked")
            if "irrelevance" not in c and q["id"] not in answers:
                raise ValueError(f"benchmark '{name}' ({qpath}): {q['id']}: no ground truth in possible_answer/")
            ref = {"category": c, "functions": q["function"], "ground_truth": answers.get(q["id"])}
            user = "\n".join(m["content"] for m in q["question"][0] if m["role"] == "user")
            rows.append({"id": q["id"], "problem": user, "prompt": prompt_text(q["question"][0], q["function"]),
                         "answer": json.dumps(ref, ensure_ascii=False, sort_keys=True), "group": c})
    return rows
