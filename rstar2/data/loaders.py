"""Load a problem/answer dataset described by a small spec dict into uniform rows.

A spec says where the file is and which columns hold the problem, the gold answer and (optionally) an id, so
a custom dataset with other column names plugs in through config alone (case P04). Every schema problem is
reported up front, before any model is loaded, naming the dataset, the file, the row and the field.

Spec keys::

    name              str, required, non-empty; becomes row["source"] and the id prefix
    path              file path, relative to base_dir or absolute; or "hub:<repo id>" for datasets.load_dataset
    format            optional "jsonl" | "json" | "parquet" | "csv"; else inferred from the extension
    fields            {"problem": col, "answer": col, and optional "id", "source", "language": col}; dotted paths
                      reach into nested values ("reward_model.ground_truth", "prompt.0.content"). "source" (the
                      upstream origin of a row inside the dataset, e.g. OpenMathReasoning's problem_source) and
                      "language" are carried to the output rows as "origin" and "language"
    filters           optional {col: value} keeps rows whose col equals value (a list value means "one of"); e.g.
                      {lang: en} for a language, {problem_source: aops_c6_high_school_olympiads} for a subset
    limit             optional int: keep the first N rows that pass the filters
    answer_from_boxed optional bool: the gold is the last \\boxed{...} inside the answer field (MATH solutions)
    answer_after      optional str: the gold is the text after the last occurrence of this marker
                      (GSM8K: "####")
    on_missing        optional "error" (default) | "drop": what to do with rows whose problem/answer value is
                      absent, null or empty (one rule for every format: a JSON "" or null, an empty CSV cell).
                      "drop" keeps them with answer_raw=None so curation counts them as "no_answer".
                      A field absent from *every* row is always an error.
    config, split     optional, hub only: passed to datasets.load_dataset (split defaults to "train")
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rstar2.grading.answers import last_boxed

# Relative dataset paths start at the working directory: the folder snakemake runs in.
WORKING_DIR = Path(".")
HUB_PREFIX = "hub:"
_EXTENSION_FORMATS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_MISSING = object()  # sentinel: a dotted path that does not resolve (absent key, null, NaN)
_MAX_LISTED_ROWS = 5
# Optional field roles -> the row key they fill. Like "id", a mapped optional field must be present in every row.
_OPTIONAL_ROLES = {"id": "id", "source": "origin", "language": "language"}

# The RL training candidates bundled under data/rl/ (see each folder's SOURCE.md). Order matters: dedupe keeps
# the first copy of a problem, so the sources with the most trustworthy labels come first. DAPO holds most of the
# historical AIME and many MATH problems, and a few of its copies carry placeholder golds ("-1" for an AIME p+q
# problem whose answer is 913), so AIME and MATH go before it.
BUNDLED_SOURCES: list[dict] = [
    {"name": "aime_1983_2023", "path": "data/rl/aime_1983_2023/aime_1983_2023.json",
     "fields": {"problem": "problem", "answer": "answer"}},
    {"name": "math_train", "path": "data/rl/math_train/math_train_deepscaler.json",
     # two upstream rows have a null answer; count them as drops instead of failing the whole stage.
     "fields": {"problem": "problem", "answer": "answer"}, "on_missing": "drop"},
    {"name": "dapo_math_17k", "path": "data/rl/dapo_math_17k/dapo_math_17k.parquet",
     # verl format: prompt is a one-message chat list; the rStar2 recipe trains on the English subset.
     "fields": {"problem": "prompt", "answer": "reward_model.ground_truth", "id": "extra_info.index"},
     "filters": {"lang": "en"}},
    {"name": "gsm8k_train", "path": "data/rl/gsm8k/train.jsonl",
     "fields": {"problem": "question", "answer": "answer"}, "answer_after": "####"},
]


def load_source(spec: dict, base_dir: Path | str = WORKING_DIR, on_missing_allowed: bool = True) -> list[dict]:
    """Read one dataset into rows ``{"id", "source", "problem", "answer_raw"}`` (+ ``origin``, ``language``).

    ``answer_raw`` is the gold as text (numbers are stringified: 27.0 -> "27.0"), or None when the row has no
    gold (null with ``on_missing="drop"``, or no ``\\boxed{}`` / marker found). ``id`` is ``"<name>-<id value>"``,
    or ``"<name>-<0-based row index in the file>"`` when ``fields.id`` is not given.

    ``on_missing_allowed``: False for a benchmark (its schema has no ``on_missing``): picks the hint of a
    missing-field error, which must not name a key the config would refuse.

    Raises:
        FileNotFoundError: the file does not exist (message names the dataset).
        ValueError: bad spec; a field or filter column missing (names dataset, file, row index, field and the
            available columns); a problem that is neither text nor chat messages; duplicate ids.
    """
    name = _dataset_name(spec)
    fields = _field_map(spec, name)
    frame, where = read_table(spec, base_dir)
    context = _Context(name=name, where=where, columns=[str(c) for c in frame.columns])
    records = frame.to_dict("records")

    keep = _filtered_indices(records, spec.get("filters") or {}, context)
    if spec.get("limit") is not None:
        keep = keep[: int(spec["limit"])]

    on_missing = spec.get("on_missing", "error")
    if on_missing not in ("error", "drop"):
        raise ValueError(f"dataset '{name}': on_missing must be 'error' or 'drop', got {on_missing!r}")
    values = {role: [_resolve(records[i], col) for i in keep] for role, col in fields.items()}
    for role in ("problem", "answer"):
        values[role] = [_blank_as_missing(v) for v in values[role]]
    # Report every missing field at once (sorted by first bad row), so one run shows the whole schema problem.
    missing = [p for role, col in fields.items()
                if (p := _missing_field(values[role], keep, role, col,
                                        strict=(on_missing == "error" or role in _OPTIONAL_ROLES),
                                        on_missing_allowed=on_missing_allowed))]
    if missing:
        raise context.error("; ".join(message for _, message in sorted(missing)))

    rows = [_make_row(i, values, k, spec, context) for k, i in enumerate(keep)]
    _check_unique_ids(rows, context)
    return rows


def resolve_path(spec: dict, base_dir: Path | str = WORKING_DIR) -> str:
    """The path a spec reads, absolute (or the ``hub:`` id unchanged), for manifests' ``inputs``."""
    path = str(spec["path"])
    if path.startswith(HUB_PREFIX):
        return path
    p = Path(path)
    return str(p if p.is_absolute() else Path(base_dir) / p)


def read_table(spec: dict, base_dir: Path | str = WORKING_DIR) -> tuple[pd.DataFrame, str]:
    """Read the spec's file into a DataFrame, keeping values raw (no dtype guessing: "042" stays "042").

    Returns:
        (frame, where): ``where`` is the resolved path or hub id, for error messages.
    """
    name = _dataset_name(spec)
    if "path" not in spec:
        raise ValueError(f"dataset '{name}': spec has no 'path'")
    where = resolve_path(spec, base_dir)
    if where.startswith(HUB_PREFIX):
        return _read_hub(spec, where[len(HUB_PREFIX):]), where
    path = Path(where)
    if not path.is_file():
        raise FileNotFoundError(f"dataset '{name}': file not found: {path} (resolved to {Path(path).resolve()}; "
                                "relative paths start at the folder snakemake runs in)")
    fmt = spec.get("format") or _EXTENSION_FORMATS.get(path.suffix.lower())
    if fmt == "parquet":
        try:
            return pd.read_parquet(path), where
        except (OSError, ValueError) as e:  # pyarrow's message names no file
            raise ValueError(f"dataset '{name}' (file {path}): not a readable parquet file: {e}") from None
    if fmt == "csv":
        # dtype=str + keep_default_na=False: "NA", "None", "042" stay text; only an empty cell is missing.
        try:
            return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]), where
        except (pd.errors.ParserError, UnicodeDecodeError) as e:  # pandas' message ("row 1") names no file
            raise ValueError(f"dataset '{name}' (file {path}): not a readable CSV file: {e}") from None
    if fmt in ("json", "jsonl"):
        # A ".json" file may hold JSON Lines (BFCL does this); decide by the first character.
        lines = fmt == "jsonl" or _first_char(path) != "["
        # dtype=False: no type guessing ("025" stays text) and, in pandas >= 3, no date conversion either.
        try:
            return pd.read_json(path, lines=lines, dtype=False), where
        except ValueError as e:  # pandas names neither file nor line: find the line
            raise ValueError(f"dataset '{name}' (file {path}): {_bad_json_line(path) if lines else e}") from None
    raise ValueError(f"dataset '{name}': cannot infer the format of {path}; set spec['format'] to one of "
                     f"jsonl, json, parquet, csv")


def _read_hub(spec: dict, repo_id: str) -> pd.DataFrame:
    """Load ``hub:<repo id>`` with ``datasets``. A hub id needs network access; the tests never use one.

    The same code path reads a local folder given as the id: one written by ``Dataset.save_to_disk`` /
    ``DatasetDict.save_to_disk`` (read with ``datasets.load_from_disk``, then the split), or a folder of data
    files (``datasets.load_dataset`` infers the builder). Only the columns the spec's ``fields`` and ``filters``
    name are converted to pandas when all of them exist (OpenMathReasoning's solutions are ~70 GB as text).
    """
    import datasets  # imported lazily: heavy, and only this path needs it

    split = spec.get("split", "train")
    folder = Path(repo_id)
    if folder.is_dir() and any((folder / f).is_file() for f in ("dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(str(folder))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"dataset '{spec.get('name')}' (file {HUB_PREFIX}{repo_id}): no split {split!r}; "
                                 f"splits: {sorted(ds)}")
            ds = ds[split]
    else:
        ds = datasets.load_dataset(repo_id, spec.get("config"), split=split)
    wanted = {str(c).split(".")[0] for c in [*(spec.get("fields") or {}).values(), *(spec.get("filters") or {})] if c}
    if wanted and wanted <= set(ds.column_names):
        ds = ds.select_columns(sorted(wanted))
    return ds.to_pandas()


def resolve_field(record: dict, path: str) -> Any:
    """The value at a dotted path of one record (``"prompt.0.content"``; an exact column name wins), or None
    when any step is absent or null (NaN included). The lookup ``fields`` use, for other loaders (SFT data)."""
    value = _resolve(record, path)
    return None if value is _MISSING else value


def filter_indices(records: list[dict], filters: dict, name: str, where: str) -> list[int]:
    """Indices of ``records`` that pass a spec's ``filters`` ({column: value or [values]}).

    Raises:
        ValueError: a filter column missing in every record (names the dataset, file and columns).
    """
    columns = sorted({str(k) for r in records[:1] for k in r})
    return _filtered_indices(records, filters, _Context(name=name, where=where, columns=columns))


def _bad_json_line(path: Path) -> str:
    """Where a JSON Lines file stops parsing: 'line N (1-based) is not valid JSON: ...' (or not an object)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                # e's own "line 1 column N" counts inside this one line: give the column only
                return f"line {lineno} (1-based) is not valid JSON: {e.msg} at column {e.colno}"
            if not isinstance(value, dict):
                return f"line {lineno} (1-based) is not a JSON object"
    return "not readable as JSON Lines"


def _first_char(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return stripped[0]


class _Context:
    """What every error message needs: dataset name, file and the available columns."""

    def __init__(self, name: str, where: str, columns: list[str]):
        self.name, self.where, self.columns = name, where, columns

    def error(self, message: str) -> ValueError:
        return ValueError(f"dataset '{self.name}' (file {self.where}): {message}; "
                          f"available columns: {self.columns}")


def _dataset_name(spec: dict) -> str:
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        # Checked here: an empty data_source would surface much later as "Reward function is not implemented" (P04).
        raise ValueError(f"dataset spec needs a non-empty 'name' (got {name!r}) for path {spec.get('path')!r}")
    return name


def _field_map(spec: dict, name: str) -> dict[str, str]:
    fields = spec.get("fields") or {}
    missing = [role for role in ("problem", "answer") if not fields.get(role)]
    if missing:
        raise ValueError(f"dataset '{name}': spec['fields'] must name the column for {missing} "
                         f"(got {fields!r})")
    unknown = set(fields) - {"problem", "answer", *_OPTIONAL_ROLES}
    if unknown:
        raise ValueError(f"dataset '{name}': unknown keys in spec['fields']: {sorted(unknown)}")
    return {role: str(col) for role, col in fields.items() if col}


def _resolve(record: dict, path: str) -> Any:
    """Value at a dotted path; ``_MISSING`` if any step is absent or null.

    An exact column name wins over the dotted reading, so a flat column literally called "a.b" still works.
    Integer steps index into lists ("prompt.0.content").
    """
    if path in record:
        return _MISSING if _is_null(record[path]) else record[path]
    value: Any = record
    for step in path.split("."):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, (list, tuple, np.ndarray)) and step.lstrip("-").isdigit() \
                and -len(value) <= int(step) < len(value):
            value = value[int(step)]
        else:
            return _MISSING
        if _is_null(value):
            return _MISSING
    return value


def _is_null(value: Any) -> bool:
    return value is None or value is _MISSING or (isinstance(value, float) and math.isnan(value))


def _blank_as_missing(value: Any) -> Any:
    """A problem or gold that is an empty (blank) string is missing, as a null is: one rule for every format (a
    JSON "" is no more a gold than a JSON null or an empty CSV cell)."""
    return _MISSING if isinstance(value, str) and not value.strip() else value


def _filtered_indices(records: list[dict], filters: dict, context: _Context) -> list[int]:
    keep = list(range(len(records)))
    for col, wanted in filters.items():
        column = [_resolve(r, col) for r in records]
        got = [column[i] for i in keep]
        if keep and all(v is _MISSING for v in got):
            raise context.error(f"filter column '{col}' is missing in every row")
        allowed = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        _check_filter_values(col, allowed, column, context)
        keep = [i for i, v in zip(keep, got) if v is not _MISSING and v in allowed]
    return keep


def _check_filter_values(col: str, allowed, column: list, context: _Context) -> None:
    """A filter value that no row of the file has is a typo (``one-step`` for ``one_step``), which would silently
    drop a whole kind of problem: fail, naming the value and the column's values (the first 12)."""
    present = {v for v in column if v is not _MISSING and isinstance(v, (str, int, float, bool))}
    unknown = [v for v in allowed if v not in present]
    if unknown and present:
        shown = sorted(map(str, present))
        more = f", ... ({len(shown)} in all)" if len(shown) > 12 else ""
        raise context.error(f"filter {col}: value(s) {unknown} match no row; the column has {shown[:12]}{more}")


def _missing_field(values: list, keep: list[int], role: str, col: str, strict: bool,
                   on_missing_allowed: bool = True) -> tuple[int, str] | None:
    """(first bad row, message) if the field is absent in every row, or (when ``strict``) in any row. The message
    ends with the fix the source's kind supports: ``on_missing: drop`` skips an RL source's rows without problem
    or gold, but no field that no row has, no mapped optional field (required in every row), no benchmark row."""
    missing_rows = [keep[k] for k, v in enumerate(values) if v is _MISSING]
    if not missing_rows or (not strict and len(missing_rows) < len(values)):
        return None
    listed = ", ".join(map(str, missing_rows[:_MAX_LISTED_ROWS]))
    more = " ..." if len(missing_rows) > _MAX_LISTED_ROWS else ""
    hint = (f"no row has it: map fields.{role} to one of the available columns" if len(missing_rows) == len(values)
            else f"a mapped fields.{role} must be in every row: fill it in, or leave fields.{role} out"
            if role in _OPTIONAL_ROLES else "on_missing: drop drops such rows, counted in the funnel"
            if on_missing_allowed else "a benchmark takes no on_missing: fill the value in or remove the row")
    return missing_rows[0], (f"row {missing_rows[0]}: missing field '{col}' (absent, null or empty; spec "
                             f"fields.{role}; {len(missing_rows)} of {len(values)} rows lack it: 0-based rows "
                             f"{listed}{more}; {hint})")


def _make_row(index: int, values: dict[str, list], k: int, spec: dict, context: _Context) -> dict:
    problem = _problem_text(values["problem"][k], index, spec["fields"]["problem"], context)
    id_value = values["id"][k] if "id" in values else index
    row = {
        "id": f"{context.name}-{_as_text(id_value)}",
        "source": context.name,
        "problem": problem,
        "answer_raw": _gold_text(values["answer"][k], spec),
    }
    for role in ("source", "language"):
        if role in values:
            row[_OPTIONAL_ROLES[role]] = _as_text(values[role][k])
    return row


def _problem_text(value: Any, index: int, col: str, context: _Context) -> str | None:
    """Problem as text. A chat list (verl ``prompt``) gives the content of its last user message."""
    if value is _MISSING:
        return None
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple, np.ndarray)):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1].strip()
        raise context.error(f"row {index}: field '{col}' is a list but has no user message with text content")
    if isinstance(value, dict):
        raise context.error(f"row {index}: field '{col}' is an object, expected text or chat messages "
                            f"(did you mean a nested path like '{col}.content'?)")
    return _as_text(value)


def _gold_text(value: Any, spec: dict) -> str | None:
    if value is _MISSING:
        return None
    text = _as_text(value)
    if spec.get("answer_from_boxed"):
        return last_boxed(text) or None
    marker = spec.get("answer_after")
    if marker:
        return (text.rsplit(marker, 1)[1].strip() or None) if marker in text else None
    return text


def _as_text(value: Any) -> str:
    """Stringify a raw value. Floats use repr so 27.0 stays "27.0" (the normaliser decides what it means)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _check_unique_ids(rows: list[dict], context: _Context) -> None:
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise context.error(f"duplicate id {row['id']!r}; fix fields.id, or set it to null to use row indices")
        seen.add(row["id"])
