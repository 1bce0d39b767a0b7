"""One-line config errors: validate the merged config against the schema and name the refused key's path and the
config file that sets it, instead of Snakemake's print of the whole schema and config (thousands of lines).

Used by ``workflow/rules/common.smk`` when the workflow parses its config, and by ``stages.params.load_config``.
"""

from __future__ import annotations

from collections.abc import Mapping


def validate_config(config: dict, schema_path: str, files: list = ()) -> None:
    """Validate ``config`` against the schema and fill its defaults (``snakemake.utils.validate``), but report a
    refused value in one line naming its key path and the config file that sets it, e.g. ``config:
    hard_problems.k: 0 is less than the minimum of 1 (set in my.yaml)``, instead of Snakemake's print of the
    whole schema and config (thousands of lines). ``files``: the config files in merge order (config.yaml first),
    then optionally the ``--config`` overrides as a mapping.

    Raises:
        ValueError: the most specific error (``jsonschema.exceptions.best_match``; an unexpected key wins over
            the required key it was probably meant to be).
    """
    import jsonschema
    import yaml
    from snakemake.utils import validate

    schema = yaml.safe_load(open(schema_path))
    validator = jsonschema.validators.validator_for(schema)(schema)
    relevance = jsonschema.exceptions.by_relevance(strong=frozenset({"additionalProperties", "unevaluatedProperties"}))
    error = _best_error(list(validator.iter_errors(config)), relevance)
    if error is not None:
        keys = list(error.absolute_path)
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in keys).lstrip(".") or "(top level)"
        message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
        types = [e.validator_value for e in error.context if e.validator == "type" and not e.relative_path]
        if error.validator in ("oneOf", "anyOf") and types and len(types) == len(error.context):
            message = f"{error.instance!r} is not of type " + " or ".join(
                repr(t) for v in types for t in (v if isinstance(v, list) else [v]))
        # an unexpected key is set where it appears: look for the key itself (also at the top level)
        extra = [k for k in (error.instance if isinstance(error.instance, dict) else {}) if repr(k) in error.message] \
            if error.validator in ("additionalProperties", "unevaluatedProperties") else []
        where = _setting_file(files, keys + extra[:1])
        if error.validator == "type" and isinstance(error.instance, str) and \
                any(t in str(error.validator_value) for t in ("number", "integer")):
            try:
                float(error.instance)
                if where == "with --config":
                    message += (" (Snakemake's --config passes the values inside a mapping as strings: set it in a "
                                "--configfile)")
                elif "number" in str(error.validator_value):
                    message += f" (YAML reads {error.instance} as a string: write it with a dot, e.g. 1.0e-4)"
            except ValueError:
                pass
        raise ValueError(f"config: {path}: {message}" + (f" (set {where})" if where else ""))
    validate(config, schema_path)


def _best_error(errors: list, key):
    """The most relevant error (``key``: jsonschema's ``by_relevance``), descending into oneOf / anyOf branches
    like ``best_match`` but skipping a branch whose type does not fit the value at all (for ``null or object``
    with a typo inside the object, the typo, not "is not of type 'null'")."""
    best = max(errors, key=key, default=None)
    while best is not None and best.context:
        fitting = [e for e in best.context if not (e.validator == "type" and not e.relative_path)]
        if not fitting:
            break
        best = max(fitting, key=key)
    return best


def _setting_file(files: list, keys: list) -> str | None:
    """Where the key path ``keys`` is set: "in <file>" for the last of ``files`` (merge order) whose YAML holds it,
    "with --config" when that is an entry that is a mapping (Snakemake's ``--config`` overrides); None: nowhere."""
    import yaml

    if not keys:
        return None
    found = None
    for f in files:
        if isinstance(f, Mapping):
            node, label = dict(f), "with --config"
        else:
            try:
                node, label = yaml.safe_load(open(f)) or {}, f"in {f}"
            except (OSError, yaml.YAMLError):
                continue
        for k in keys:
            if isinstance(node, dict) and k in node:
                node = node[k]
            elif isinstance(node, list) and isinstance(k, int) and k < len(node):
                node = node[k]
            else:
                break
        else:
            found = label
    return found
