"""Strict conversion between JSON-like dicts and (nested) dataclasses, for the stages' typed parameters.

Every workflow rule passes its stage a JSON object built from the validated config, in which Snakemake's
``validate`` has filled every default from ``workflow/schemas/config.schema.yaml``. ``parse`` turns that object
into the stage's dataclass and refuses a missing or an unknown key, so a value can only come from the config: a
dataclass default is never used on this path (the schema is the one place defaults live).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import lru_cache


@lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _dataclass_in(tp):
    """The dataclass a field's type names (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def parse(cls, data, where: str):
    """Build dataclass ``cls`` from ``data`` (a dict), recursively for fields whose type is a dataclass.

    Args:
        cls: a dataclass type. data: its values by field name. where: the name of ``data`` in messages
            (e.g. ``"rl params"``); nested fields extend it (``"rl params.rollout"``).
    Returns:
        The instance. Tuple-typed fields accept lists (JSON has no tuples).
    Raises:
        ValueError: ``data`` is not a dict, lacks a field or has a key that is not a field (all named).
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object with keys {sorted(f.name for f in dataclasses.fields(cls))}, "
                         f"got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    missing, unknown = [n for n in names if n not in data], sorted(set(data) - set(names))
    if missing or unknown:
        raise ValueError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(unknown)}"] if unknown else [])))
    hints, kwargs = _hints(cls), {}
    for name in names:
        value, tp = data[name], hints[name]
        inner = _dataclass_in(tp)
        if inner is not None and value is not None:
            value = parse(inner, value, f"{where}.{name}")
        elif typing.get_origin(tp) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def to_dict(obj) -> dict:
    """The JSON-ready dict of a (nested) dataclass instance; tuples become lists."""
    def plain(v):
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(dataclasses.asdict(obj))


def merge_overrides(cls, ours: dict, overrides: dict, protected: frozenset | set, where: str) -> dict:
    """``ours`` (the keyword arguments the recipe builds for dataclass ``cls``, e.g. TRL's ``GRPOConfig``) with the
    user's ``overrides`` on top: a documented way to set any other field of a library's config.

    Raises:
        ValueError: an override is not a field of ``cls`` (a typo would otherwise be ignored), or is in
            ``protected`` (a field the recipe's correctness depends on); ``where`` names the config section.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"{where}: {unknown} are not fields of {cls.__name__}")
    blocked = sorted(set(overrides) & set(protected))
    if blocked:
        raise ValueError(f"{where}: {blocked} cannot be overridden (the recipe sets them: {cls.__name__})")
    return {**ours, **overrides}
