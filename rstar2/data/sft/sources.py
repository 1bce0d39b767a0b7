"""One SFT source from its spec to counted, converted rows (paper §4.1): checks the spec, reads the file or hub
dataset through :mod:`rstar2.data.loaders` (file types, ``hub:`` ids, dotted field paths, filters), samples
``limit`` rows, converts each with its format's module, runs the Python calls in the sandbox and counts every
drop under its reason.

A source spec (config ``sft_data.sources[]``; ``workflow/schemas/config.schema.yaml`` documents each key)::

    name        required, unique: the rows' "source" and id prefix (id "<name>-<0-based row>" or fields.id)
    path        a jsonl/json/parquet/csv file (relative to the run folder) or "hub:<id>" (config, split);
                file_type overrides the type the extension gives
    format      messages | sharegpt | alpaca | toolformer  (FORMATS; each module documents its fields)
    generate    string_tools or recovery (GENERATORS) with n rows, instead of path and format
    fields      {role: column or dotted path, or null = unmapped}: renames the format's columns
    filters     {column: value or [values]}   limit: rows read (a seeded sample; null = all; 0 = skip)
    python_tool the data's name for its Python tool; execute: re-run those calls (toolformer: required)
    calls, tools_from_system   sharegpt only (ToolACE)
    mistake_weight  recovery only: 0 = the mistaken first call is context, not loss (absent or 1: trained)

Errors name the source, the file, the row (0-based data row) and the field, in one line, before anything is
run or written.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import numpy as np

from .. import loaders
from .common import Broken, Context, Drop, Pending, run_in_sandbox
from . import alpaca, messages, sharegpt, toolformer
from .generated import GENERATORS

FORMATS = {"messages": messages, "sharegpt": sharegpt, "alpaca": alpaca, "toolformer": toolformer}
_SHAREGPT_ONLY = ("calls", "tools_from_system")


def check_spec(spec: dict) -> None:
    """Reject a spec whose keys do not fit together, naming the source.

    Raises:
        ValueError: no name; both or neither of path and generate; unknown format, generator or field role;
            toolformer without ``execute: true``; ``execute`` without ``python_tool`` on a chat format.
    """
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"sft_data: every source needs a non-empty 'name' (got {name!r} for {spec!r:.120})")
    where = f"sft_data source '{name}'"
    if (spec.get("path") is None) == (spec.get("generate") is None):
        raise ValueError(f"{where}: give either 'path' (a file or hub:<id>, with 'format') or 'generate'")
    if spec.get("mistake_weight") is not None and (spec.get("generate") != "recovery"
                                                   or spec["mistake_weight"] not in (0, 1)):
        raise ValueError(f"{where}: mistake_weight (0 or 1, got {spec['mistake_weight']!r}) applies to generate: "
                         "recovery only; chat rows set a per-message 'weight' instead")
    if spec.get("generate") is not None:
        if spec["generate"] not in GENERATORS:
            raise ValueError(f"{where}: unknown generator {spec['generate']!r}; known: {sorted(GENERATORS)}")
        return
    fmt = spec.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"{where}: 'format' must be one of {sorted(FORMATS)}, got {fmt!r}")
    module = FORMATS[fmt]
    unknown = set(spec.get("fields") or {}) - set(module.FIELDS) - {"id"}
    if unknown:
        raise ValueError(f"{where}: unknown keys in fields for format {fmt}: {sorted(unknown)}; "
                         f"known: {sorted([*module.FIELDS, 'id'])}")
    if module.EXECUTES and not spec.get("execute"):
        raise ValueError(f"{where}: format {fmt} rows hold no tool output; set execute: true to run their calls")
    if spec.get("execute") and not module.EXECUTES and not spec.get("python_tool"):
        raise ValueError(f"{where}: execute needs python_tool, the name the data gives its Python tool")
    if fmt != "sharegpt" and (spec.get("calls") not in (None, "json") or spec.get("tools_from_system")):
        raise ValueError(f"{where}: {' and '.join(_SHAREGPT_ONLY)} apply to format sharegpt only")


def convert(spec: dict, ctx: Context, base_dir: Path | str) -> tuple[list[tuple[str, Pending]], dict]:
    """Read and convert one source: ``([(row id, Pending)], stats)``; nothing is run yet.

    stats: ``{"path", "format" | "generate", "rows_available", "rows_in", "dropped": Counter}``, or
    ``{"skipped": reason, ...}`` for ``limit: 0`` / ``n: 0``.

    Raises:
        ValueError: the file cannot be read, a required field is missing, a row is broken, duplicate ids.
        FileNotFoundError: the file does not exist.
    """
    kind = {"generate": spec["generate"]} if spec.get("generate") else {"format": spec["format"]}
    size = spec.get("n") if spec.get("generate") else spec.get("limit")
    path = loaders.resolve_path({"path": spec["path"]}, base_dir) if spec.get("path") else None
    if size == 0:
        return [], {"path": path, **kind, "skipped": f"{'n' if 'generate' in kind else 'limit'} 0",
                    "rows_in": 0, "rows_out": 0, "dropped": {}}
    if spec.get("generate"):
        items = GENERATORS[spec["generate"]](int(size), ctx)
        return items, {"path": None, **kind, "rows_available": len(items), "rows_in": len(items),
                       "dropped": Counter()}
    module, fields = FORMATS[spec["format"]], _field_map(spec)
    table = {"name": spec["name"], "path": spec["path"], "format": spec.get("file_type"), "fields": fields,
             "filters": spec.get("filters"), **{k: spec[k] for k in ("config", "split") if spec.get(k)}}
    frame, where = loaders.read_table(table, base_dir)
    records = frame.to_dict("records")
    keep = loaders.filter_indices(records, spec["filters"], spec["name"], where) if spec.get("filters") \
        else list(range(len(records)))
    idx = sample(keep, spec.get("limit"), ctx.seed, spec["name"])
    values = _values(records, idx, fields, module.FIELDS, set(spec.get("fields") or {}), spec["name"], where)
    stats = {"path": where, **kind, "rows_available": len(records), "rows_in": len(idx), "dropped": Counter()}
    items, seen = [], set()
    for k, i in enumerate(idx):
        row_id = f"{spec['name']}-{values['id'][k] if 'id' in values else i}"
        if row_id in seen:
            raise ValueError(f"sft_data source '{spec['name']}' (file {where}): row {i}: duplicate id {row_id!r} "
                             f"(field '{fields['id']}', fields.id)")
        seen.add(row_id)
        try:
            items.append((row_id, module.convert({r: v[k] for r, v in values.items()}, row_id, ctx)))
        except Drop as d:
            stats["dropped"][d.reason] += 1
        except Broken as b:
            field = fields[b.role] + (f".{b.path}" if b.path else "")
            raise ValueError(f"sft_data source '{spec['name']}' (file {where}): row {i}: field '{field}' "
                             f"(fields.{b.role}): {b.message}") from None
    return items, stats


def read(spec: dict, seed: int, tool_name: str, max_tool_chars: int, base_dir: Path | str):
    """``check_spec`` then ``convert`` one source with its own ``Context``: ``(ctx, items, stats)``; nothing is run
    (the sft_data stage, and the workflow's DAG-time check of every local file source).

    Raises:
        what ``check_spec`` and ``convert`` raise.
    """
    check_spec(spec)
    ctx = Context(name=spec["name"], spec=spec, seed=seed, tool_name=tool_name, max_tool_chars=max_tool_chars)
    return (ctx, *convert(spec, ctx, base_dir))


def finish(items: list[tuple[str, Pending]], stats: dict, ctx: Context, limits) -> list[dict]:
    """Run every pending row's Python calls (one batch per source) and build the output rows
    ``{"id", "source", "messages"}``; completes ``stats`` (rows_out, dropped, tool_calls, sandbox)."""
    jobs = [job for _, p in items for job in p.jobs]
    results = iter(run_in_sandbox(jobs, limits, ctx.name, stats) if jobs else [])
    rows = []
    for row_id, p in items:
        try:
            rows.append({"id": row_id, "source": ctx.name, "messages": p.finish([next(results) for _ in p.jobs])})
        except Drop as d:
            stats["dropped"][d.reason] += 1
    stats.update(ctx.counts)
    stats["rows_out"] = len(rows)
    stats["dropped"] = dict(sorted(stats["dropped"].items()))
    stats["tool_calls"] = sum(m["role"] == "tool" for r in rows for m in r["messages"])
    assert stats["rows_in"] == stats["rows_out"] + sum(stats["dropped"].values()), ctx.name
    return rows


def sample(keep: list[int], limit: int | None, seed: int, name: str) -> list[int]:
    """The rows read: all of ``keep`` when limit is None or >= its size, else a seeded sample in file order."""
    if limit is None or limit >= len(keep):
        return list(keep)
    return sorted(random.Random(f"{seed}:{name}:sample").sample(keep, int(limit)))


def _field_map(spec: dict) -> dict[str, str]:
    """Role -> column: the format's own column names, renamed or unmapped (null) by ``fields``."""
    given = spec.get("fields") or {}
    roles = {r: r for r in FORMATS[spec["format"]].FIELDS}
    roles.update(given)
    return {r: str(c) for r, c in roles.items() if c}


def _values(records: list[dict], idx: list[int], fields: dict[str, str], required: dict[str, bool],
            explicit: set[str], name: str, where: str) -> dict[str, list]:
    """Each mapped role's values over the rows read (numpy containers made plain, null as None).

    A required field that is absent or null in any row is an error naming the first such row (a file holds
    no difference between the two once read as a table), and so is a field mapped in ``fields`` whose column
    the file does not have; an optional field under its default name that the file lacks is left unmapped.
    """
    columns = sorted({str(c) for r in records for c in r})
    out = {}
    for role, col in fields.items():
        vals = [_plain(loaders.resolve_field(records[i], col)) for i in idx]
        missing = [i for i, v in zip(idx, vals) if v is None]
        strict = required.get(role, role == "id")
        absent = col not in columns and col.split(".")[0] not in columns
        if missing and (strict or (role in explicit and absent)):
            raise ValueError(f"sft_data source '{name}' (file {where}): row {missing[0]}: missing field '{col}' "
                             f"(fields.{role}; {len(missing)} of {len(vals)} rows lack it); "
                             f"available columns: {columns}")
        if not absent or strict or role in explicit:
            out[role] = vals
    return out


def _plain(value):
    """Parquet and hub rows hold numpy arrays and scalars: lists, dicts and Python scalars instead; NaN -> None."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value
