"""The documentation site's configuration reference, generated from workflow/schemas/config.schema.yaml.

Used two ways:

- as a MkDocs hook (``hooks:`` in mkdocs.yml): ``on_files`` adds the page ``reference/configuration.md`` to every
  build, so the page cannot drift from the schema; a key without a description is a warning, which
  ``mkdocs build --strict`` turns into a failed build;
- from the command line, to read the page without building the site:
  ``python scripts/docs_config_reference.py [SCHEMA] > page.md`` (exit status 1 when a key has no description).

Every key is listed with its dotted path (``rl.stages.stage1.steps``; ``[]`` stands for any element of a list,
``<name>`` for any key of a mapping such as ``benchmarks``), its type, default, allowed values and description,
grouped by top-level section. ``RSTAR2_DOCS_SCHEMA`` points the hook at another schema file (the tests use it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PAGE = "reference/configuration.md"
log = logging.getLogger("mkdocs.hooks.config_reference")


@dataclass
class Key:
    """One configuration key: ``path`` as a user writes it, ``node`` its (resolved) schema, ``default`` the
    default the schema gives (``MISSING`` when none), ``note`` how the default depends on another key."""
    path: str
    node: dict
    default: object
    note: str = ""
    required: bool = False


MISSING = object()


def _resolve(schema: dict, node: dict) -> dict:
    """``node`` with a local ``$ref`` replaced by its target merged under the node's own fields (properties are
    merged key by key)."""
    while "$ref" in node:
        target = schema
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        own = {k: v for k, v in node.items() if k != "$ref"}
        merged = {**target, **own}
        if "properties" in target and "properties" in own:   # a $ref extended with keys of its own
            merged["properties"] = {**target["properties"], **own["properties"]}
        node = merged
    return node


def _object_branch(schema: dict, node: dict) -> tuple[dict | None, bool]:
    """The object branch of a ``oneOf``/``anyOf`` of ``null`` or an object, and whether null is allowed. An object
    given as a ``$ref`` to another top-level key (label_verification.model -> model) is not expanded again, nor is
    one beside a scalar form (``evaluate.limit``: a number or a mapping): such a key is one row."""
    branches = node.get("oneOf") or node.get("anyOf") or []
    nullable = any(b.get("type") == "null" for b in branches)
    if sum(b.get("type") != "null" for b in branches) > 1:
        return None, nullable
    for b in branches:
        if b.get("$ref", "").startswith("#/properties/"):
            return None, nullable
        r = _resolve(schema, b)
        if r.get("properties"):
            return r, nullable
    return None, nullable


def _conditional_defaults(node: dict) -> dict:
    """Defaults given under ``allOf: [{if: ..., then: {properties: {key: {default}}}}]``, by key, with the
    condition in words (``answer_type bfcl``)."""
    out = {}
    for clause in node.get("allOf", []):
        cond = clause.get("if", {}).get("properties", {})
        words = ", ".join(f"{k} {v.get('const', ' / '.join(map(str, v.get('enum', []))))}" for k, v in cond.items())
        for k, v in clause.get("then", {}).get("properties", {}).items():
            if "default" in v:
                out[k] = (v["default"], words)
    return out


def walk(schema: dict, node: dict, path: str = "", default: object = MISSING, note: str = "") -> list[Key]:
    """Every key under ``node`` in schema order, depth first (a section's key before the keys inside it)."""
    node = _resolve(schema, node)
    keys: list[Key] = []
    obj, _ = _object_branch(schema, node)
    props = dict((obj or node).get("properties", {}))
    conditional = _conditional_defaults(node)
    required = set((obj or node).get("required", [])) | set(node.get("required", []))
    for name, sub in props.items():
        sub_r = _resolve(schema, sub)
        child_path = f"{path}.{name}" if path else name
        d, n = sub_r.get("default", MISSING), ""
        if d is MISSING and name in conditional:
            d, n = conditional[name]
        keys.append(Key(child_path, sub_r, d, n, name in required))
        keys.extend(walk(schema, sub_r, child_path))
    items = node.get("items")
    if isinstance(items, dict) and _resolve(schema, items).get("properties"):
        keys.extend(walk(schema, items, f"{path}[]"))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and _resolve(schema, extra).get("properties"):
        keys.extend(walk(schema, extra, f"{path}.<name>"))
    return keys


def _type(schema: dict, node: dict) -> str:
    """The key's type in words: ``integer ≥ 1``, ``string or null``, ``list of string``, ``mapping``."""
    node = _resolve(schema, node)
    if "oneOf" in node or "anyOf" in node:
        parts = []
        for b in node.get("oneOf") or node.get("anyOf"):
            if b.get("$ref", "").startswith("#/properties/"):
                parts.append(f"a `{b['$ref'].split('/')[-1]}` spec")
            else:
                parts.append(_type(schema, b))
        return " or ".join(dict.fromkeys(parts))
    t = node.get("type")
    if t is None and "enum" in node:
        t = sorted({type(v).__name__.replace("bool", "boolean").replace("str", "string") for v in node["enum"]})
    names = t if isinstance(t, list) else [t] if t else []
    words = []
    for name in names:
        if name == "array":
            items = _resolve(schema, node.get("items", {}))
            inner = "object" if items.get("properties") else _type(schema, items) or "value"
            words.append(f"list of {inner}")
        elif name == "object" and not node.get("properties") and isinstance(node.get("additionalProperties"), dict):
            words.append("mapping")
        else:
            words.append(str(name))
    text = " or ".join(words) if words else "any"
    for kw, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if kw in node:
            text += f", {sign} {node[kw]}"
    return text


def _code(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    if isinstance(value, (dict, list)) and len(text) > 60:
        return "see the description" if not value else f"`{text[:57]}…`"
    return f"`{text}`".replace("|", "\\|")


def _allowed(schema: dict, node: dict) -> str:
    node = _resolve(schema, node)
    values = node.get("enum")
    if values is None and node.get("type") == "array":
        values = _resolve(schema, node.get("items", {})).get("enum")
    if values is None and "pattern" in node:
        return f"pattern `{node['pattern']}`".replace("|", "\\|")
    return ", ".join(_code(v) for v in values) if values else ""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_and_default(schema: dict, k: Key) -> str:
    """The middle column: type, then the default (or "required"), then the allowed values, joined by <br>."""
    parts = [_cell(_type(schema, k.node))]
    if k.default is not MISSING:
        parts.append("default " + _code(k.default) + (f" ({k.note})" if k.note else ""))
    elif k.required:
        parts.append("required")
    allowed = _allowed(schema, k.node)
    if allowed:
        parts.append("allowed: " + allowed)
    return "<br>".join(parts)


def missing_descriptions(schema: dict) -> list[str]:
    """Paths of the keys (and sections) whose schema has no ``description``."""
    return [k.path for k in walk(schema, schema) if not str(k.node.get("description", "")).strip()]


def render(schema: dict) -> str:
    """The reference page as Markdown: one section per top-level key, one table row per key below it."""
    keys = walk(schema, schema)
    lines = [
        "# Configuration reference",
        "",
        "Generated from `workflow/schemas/config.schema.yaml` when the site is built: every key the workflow "
        "accepts, its type, default, allowed values and what it does. `config.yaml` is the default run; a "
        "`--configfile` is merged over it key by key, and a list is replaced whole (see "
        "[Configuration](../configuration.md)). An unknown key or a bad value stops the workflow with one line "
        "naming the key.",
        "",
        "In a path, `[]` stands for any element of a list (`rl_data.sources[].path`) and `<name>` for a name "
        "you choose (`benchmarks.<name>.path`).",
        "",
    ]
    top = [k for k in keys if "." not in k.path and "[" not in k.path]
    for section in top:
        inner = [k for k in keys if k.path.startswith(section.path + ".") or k.path.startswith(section.path + "[")]
        lines += [f"## `{section.path}`", ""]
        if inner:   # a section: its description above the table of the keys inside it
            lines += [_cell(section.node.get("description", "")), "",
                      f"Type: {_type_and_default(schema, section).replace('<br>', '; ')}.", ""]
        lines += ["| key | type, default, allowed | description |", "|---|---|---|"]
        for k in inner or [section]:
            # an anchor per key (#rl.stages.stage1.steps); a top-level key's heading already has its own
            anchor = "" if k is section else f"<span id=\"{k.path.replace('[]', '').replace('<name>', 'name')}\"></span>"
            lines.append(f"| {anchor}`{k.path}` | {_type_and_default(schema, k)} | "
                         f"{_cell(k.node.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines)


def load(path: Path | str | None = None) -> dict:
    return yaml.safe_load(Path(path or os.environ.get("RSTAR2_DOCS_SCHEMA") or SCHEMA).read_text())


def on_files(files, config):
    """MkDocs hook: add the generated page to the build (a warning per key without a description)."""
    from mkdocs.structure.files import File

    schema = load()
    for path in missing_descriptions(schema):
        log.warning("config reference: schema key '%s' has no description (workflow/schemas/config.schema.yaml)",
                    path)
    files.append(File.generated(config, PAGE, content=render(schema)))
    return files


def main(argv: list[str]) -> int:
    schema = load(argv[0] if argv else None)
    sys.stdout.write(render(schema))
    missing = missing_descriptions(schema)
    for path in missing:
        print(f"schema key '{path}' has no description", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
