"""Open an HTML page in headless Chromium and read back what its JavaScript rendered (no driver needed).

``--dump-dom`` prints the DOM after scripts ran; ``--virtual-time-budget`` lets timers run without waiting.
For Snakemake's report (a React app) a probe script is appended that clicks through the real menu like a
user: each result's category, then the result's view button, and records what the content area shows
(an image's decoded size; an HTML result's tables, figures and code blocks, parsed by the browser).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

_PROBE = """
<script>
window.addEventListener("load", async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const out = {categories: Object.keys(categories), shown: {}};
  await sleep(500);
  out.menu = document.body.innerText;
  for (const path of Object.keys(results)) {
    const cat = Object.keys(categories).find(c => Object.values(categories[c]).some(s => s.includes(path)));
    app.setView({navbarMode: "menu"});
    await sleep(300);
    const item = [...document.querySelectorAll("a")].find(a => a.textContent.trim() === cat);
    if (item) item.click();
    await sleep(300);
    const row = [...document.querySelectorAll("tr")].find(tr => tr.textContent.includes(path));
    const eye = row && row.querySelector("a[iconname=eye]");
    if (eye) eye.click();
    await sleep(500);
    const r = {category: cat, clicked: !!eye};
    const img = document.querySelector("img[src^='data:image/png']");
    const frame = document.querySelector("iframe[src^='data:text/html']");
    if (img) r.img = {width: img.naturalWidth, height: img.naturalHeight};
    if (frame) {
      const b64 = frame.getAttribute("src").split(",")[1];
      const text = new TextDecoder().decode(Uint8Array.from(atob(b64), c => c.charCodeAt(0)));
      r.html = describe(new DOMParser().parseFromString(text, "text/html"));
    }
    out.shown[path] = r;
  }
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""

_DESCRIBE = """
<script>
function describe(doc) {
  return {tables: [...doc.querySelectorAll("table")].map(t => [...t.querySelectorAll("tr")].map(
            tr => [...tr.children].map(c => c.textContent))),
          images: [...doc.querySelectorAll("img")].map(i => i.getAttribute("src").slice(0, 22)),
          code: [...doc.querySelectorAll("pre code")].map(c => c.textContent),
          scripts: doc.querySelectorAll("script").length,
          headings: [...doc.querySelectorAll("h1, h2, h3, h4")].map(h => h.textContent)};
}
</script>
"""

_SELF = """
<script>
window.addEventListener("load", () => {
  const imgs = [...document.querySelectorAll("img")];
  const out = describe(document);
  out.decoded = imgs.map(i => [i.naturalWidth, i.naturalHeight]);
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str:
    """The Chromium binary; skips the test when absent unless RSTAR2_REQUIRE_CHROMIUM is set (CI), then fails."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("RSTAR2_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed (.ci/run installs the Debian package)")
        pytest.skip("chromium is not installed")
    return exe


def _run(page: Path, probe: str, tmp: Path, budget_ms: int) -> dict:
    text = page.read_text(encoding="utf-8")
    i = text.rindex("</body>")
    probed = tmp / f"probed-{page.name}"
    probed.write_text(text[:i] + _DESCRIBE + probe + text[i:], encoding="utf-8")
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp / 'chromium-profile'}", f"--virtual-time-budget={budget_ms}",
           "--dump-dom", probed.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the probe did not run (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


def snakemake_report(page: Path, tmp: Path) -> dict:
    """``{"categories", "menu", "shown": {result path: {"category", "clicked", "img" | "html"}}}``."""
    return _run(page, _PROBE, tmp, 30000)


def static_page(page: Path, tmp: Path) -> dict:
    """``{"tables": [[cells per row]], "images", "decoded": [[w, h]], "code", "scripts", "headings"}``."""
    return _run(page, _SELF, tmp, 5000)
