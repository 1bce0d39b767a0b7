"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, its generated configuration reference lists
every key of the config schema with its default, a key without a description or a broken link fails the build, the
worked example shows the config the workflow test runs, and the README stays one screen."""

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
_BUILD = ("import logging, sys; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s'); "
          "from mkdocs.config import load_config; from mkdocs.commands.build import build; "
          "build(load_config('mkdocs.yml', docs_dir=sys.argv[1], site_dir=sys.argv[2], strict=True))")


def _build(docs_dir: Path, site_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The site as `mkdocs build --strict` builds it from mkdocs.yml, with another docs folder where given."""
    import os

    full_env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", _BUILD, str(docs_dir), str(site_dir)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = _build(REPO / "docs", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _schema_keys(schema: dict) -> dict[str, dict]:
    """Every key a user can write, by dotted path ([] = a list element, <name> = a mapping key), with its schema:
    a walk written apart from the generator's (scripts/docs_config_reference.py), so the two check each other."""
    def resolve(node):
        while "$ref" in node:
            target = schema
            for part in node["$ref"][2:].split("/"):
                target = target[part]
            own = {k: v for k, v in node.items() if k != "$ref"}
            props = {**target.get("properties", {}), **own.get("properties", {})}
            node = {**target, **own, **({"properties": props} if props else {})}
        return node

    found = {}

    def walk(node, prefix):
        node = resolve(node)
        branches = node.get("oneOf", [])
        for branch in branches:   # null or an object: the object's keys; a number or an object: one key
            if (len(branches) == 2 and {"type": "null"} in branches and resolve(branch).get("properties")
                    and not branch.get("$ref", "").startswith("#/properties/")):
                node = resolve(branch)
        for name, sub in node.get("properties", {}).items():
            path = f"{prefix}.{name}" if prefix else name
            found[path] = resolve(sub)
            walk(sub, path)
        if isinstance(node.get("items"), dict):
            walk(node["items"], prefix + "[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], prefix + ".<name>")

    walk(schema, "")
    return found


def test_reference_page_lists_every_schema_key_with_its_default(site):
    page = (site / "reference" / "configuration" / "index.html").read_text()
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        key = re.search(r"<code>([^<]+)</code>", row)   # the first cell's key (HTML-escaped: <name>)
        if key:
            rows[html.unescape(key.group(1))] = html.unescape(re.sub(r"<[^>]+>", " ", row))
    headings = {html.unescape(h) for h in re.findall(r"<h2[^>]*><code>([^<]+)</code>", page)}
    keys = _schema_keys(yaml.safe_load(SCHEMA.read_text()))
    sections = {k for k in keys if "." not in k and "[" not in k}
    assert headings == sections
    assert set(rows) | sections == set(keys), (sorted(set(keys) - set(rows) - sections),
                                               sorted(set(rows) - set(keys)))
    for path, node in keys.items():
        if path in rows and isinstance(node.get("default"), (int, float, str)) and path not in sections:
            default = node["default"] if isinstance(node["default"], str) else json.dumps(node["default"])
            assert f"default {default}" in " ".join(rows[path].split()), (path, rows[path])
    assert "rl.stages.stage1.max_response_tokens" in rows   # the response budget a user looks for


def test_a_broken_link_or_a_key_without_description_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("measurements"))
    shutil.copytree(REPO / "docs" / "measurements", docs / "measurements",
                    ignore=lambda d, names: [n for n in names if (Path(d) / n).is_dir()])   # the pages, not the data
    (docs / "measurements" / "zen3_ablation").mkdir()
    shutil.copy2(REPO / "docs/measurements/zen3_ablation/ablation.png", docs / "measurements/zen3_ablation")
    with (docs / "index.md").open("a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    text = SCHEMA.read_text()
    needle = 'description: "RL steps (one optimizer update each) of the stage'
    assert text.count(needle) == 1
    schema = tmp_path / "schema.yaml"
    schema.write_text(re.sub(r',\s*description: "RL steps \(one optimizer update each\)[^"]*"', "", text))
    proc = _build(docs, tmp_path / "site", {"RSTAR2_DOCS_SCHEMA": str(schema)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "no-such-page.md" in out
    for stage in ("stage1", "stage2", "stage3"):
        assert f"schema key 'rl.stages.{stage}.steps' has no description" in out, out[-3000:]


def test_the_worked_example_shows_the_config_the_workflow_test_runs(site):
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "own-data" / "index.html").read_text()))
    example = REPO / "configs" / "custom_data.example.yaml"
    for line in example.read_text().splitlines():
        assert line.strip() in page, line
    import test_workflow

    assert test_workflow.CUSTOM[0] == "configs/custom_data.example.yaml"   # what its custom_run runs


def test_readme_is_one_screen_and_its_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), target
