"""A small document model (headings, paragraphs, tables, figures, code) rendered to markdown and to HTML.

The report's sections are built once as blocks, so ``summary.md`` and the HTML pages of Snakemake's report
always say the same thing. HTML output escapes every text, so model-written text can never inject markup.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str
    strong: bool = False


@dataclass
class Table:
    header: list[str]
    rows: list[list]
    caption: str = ""


@dataclass
class Figure:
    path: str          # relative to the document
    caption: str = ""


@dataclass
class Code:
    text: str
    lang: str = ""
    label: str = ""


@dataclass
class Doc:
    """An ordered list of blocks. ``add`` appends any number of blocks and returns the doc."""
    title: str
    blocks: list = field(default_factory=list)

    def add(self, *blocks) -> "Doc":
        self.blocks.extend(blocks)
        return self


def _md_cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list]) -> list[str]:
    """Markdown (GFM) table lines; ``|`` in cells is escaped, newlines become spaces."""
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]


def _fence(text: str) -> str:
    """A code fence longer than any backtick run inside ``text`` (model output may contain fences)."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def to_markdown(doc: Doc) -> str:
    """The document as GitHub-flavoured markdown."""
    lines = [f"# {doc.title}", ""]
    for b in doc.blocks:
        if isinstance(b, Heading):
            lines += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            lines += [f"**{b.text}**" if b.strong else b.text, ""]
        elif isinstance(b, Table):
            lines += ([b.caption, ""] if b.caption else []) + md_table(b.header, b.rows) + [""]
        elif isinstance(b, Figure):
            lines += [f"![{b.caption}]({b.path})", ""]
        elif isinstance(b, Code):
            fence = _fence(b.text)
            lines += ([f"*{b.label}*", ""] if b.label else []) + [fence + b.lang, b.text.rstrip("\n"), fence, ""]
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
caption{caption-side:top;text-align:left;font-style:italic;padding:.3em 0}
pre{background:#f6f8fa;border:1px solid #ddd;padding:.6em;overflow-x:auto;white-space:pre-wrap}
.label{font-weight:600;margin:.6em 0 .2em}.strong{font-weight:700;color:#a40000}
img{max-width:100%}
"""


def to_html(doc: Doc, images: dict[str, str] | None = None) -> str:
    """The document as one self-contained HTML page.

    Args:
        images: optional ``{figure path: data URI}``, to embed figures instead of linking them (Snakemake's
            report shows an HTML result on its own, without the files beside it).
    """
    e = html.escape
    images = images or {}
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{e(doc.title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{e(doc.title)}</h1>"]
    for b in doc.blocks:
        if isinstance(b, Heading):
            parts.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            parts.append(f"<p class=\"strong\">{e(b.text)}</p>" if b.strong else f"<p>{e(b.text)}</p>")
        elif isinstance(b, Table):
            cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
            head = "".join(f"<th>{e(str(h))}</th>" for h in b.header)
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b.rows)
            parts.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Figure):
            src = images.get(b.path, b.path)
            parts.append(f"<figure><img src=\"{e(src)}\" alt=\"{e(b.caption)}\">"
                         f"<figcaption>{e(b.caption)}</figcaption></figure>")
        elif isinstance(b, Code):
            label = f"<div class=\"label\">{e(b.label)}</div>" if b.label else ""
            parts.append(f"{label}<pre><code class=\"{e(b.lang)}\">{e(b.text)}</code></pre>")
    parts.append("</body></html>")
    return "\n".join(parts)
