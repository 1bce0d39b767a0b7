"""The sandbox works wherever its Python lives: a venv under /tmp, behind a symlink, under a path
with a space; every zygote kind's calls import numpy there, and the checkout's other files stay hidden. The
start-up probe turns a Python tree the sandbox hides into one error at start.

Each layout gets its own small venv (``tests/sandbox_venv.py``: numpy only), run as the host Python of a
pool in a subprocess that imports rstar2 from this worktree through PYTHONPATH.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from rstar2.sandbox import Pool, SandboxLimits
from rstar2.sandbox import pool as pool_mod
from rstar2.sandbox.python_layout import PythonLayout, per_call_mounts, python_layout
from sandbox_venv import make_venv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN = r"""
import json, os, sys
from rstar2.sandbox import Pool, SandboxLimits, pool as pool_mod
proj, repo, isolation = sys.argv[1], sys.argv[2], sys.argv[3]
check = ("import json, os\nnp = __import__('nu' + 'mpy')\n"
         f"print(json.dumps([np.__file__, int(np.arange(5).sum()) + __import__('rstar2_extra_mod').X, "
         "[os.path.exists(p) for p in "
         f"({proj + '/README.md'!r}, {proj + '/data'!r}, {repo + '/README.md'!r}, {repo + '/data'!r})]]))")
out = {}
with Pool(SandboxLimits(timeout_s=10), workers=1, lean_workers=1, full_workers=1, slots=2, isolation=isolation,
          preload=pool_mod.LEAN_PRELOAD + ("numpy",)) as p:
    out["iso"] = [p.isolation.mode, p.isolation.filesystem, p.isolation.per_call_uid]
    for kind in ("lean", "sci", "full"):  # each kind's own zygote, whatever the picker would choose
        w = next(w for w in p.workers if w.kind == kind)
        fut = pool_mod.Future()
        w.submit(10**6, check, "", p.limits, fut)
        r = fut.result()
        out[kind] = json.loads(r.stdout) if r.status == "ok" else r.stderr
if out["iso"][2]:  # the fault this module prevents, put back: the probe must stop the pool at start, in one line
    pool_mod.per_call_mounts = lambda layout, mode: {"keep": [], "mkdirs": [], "cover": []}
    try:
        Pool(SandboxLimits(timeout_s=10), workers=1, lean_workers=1, full_workers=0, slots=2, isolation=isolation)
        out["unfixed"] = "started"
    except RuntimeError as e:
        out["unfixed"] = str(e)
print(json.dumps(out))
"""


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the 'uid' fallback needs root")


@pytest.mark.parametrize("layout,isolation", [("under-tmp", "auto"), ("through-symlink", "auto"),
                                              ("path with space", "auto"),
                                              pytest.param("under-tmp", "uid", marks=ROOT_ONLY)])
def test_a_venv_anywhere_imports_numpy_in_every_zygote_kind_and_hides_the_checkout(tmp_path, layout, isolation):
    assert str(tmp_path).startswith(("/tmp/", os.environ.get("TMPDIR", "/tmp")))
    real = tmp_path / ("with space" if layout == "path with space" else "real") / "proj"
    real.mkdir(parents=True)
    (real / "README.md").write_text("project file")
    (real / "data").mkdir()
    make_venv(real / ".venv")
    extra = tmp_path / "site extra"  # a .pth names it: on sys.path, outside the venv, so bound too
    extra.mkdir()
    (extra / "rstar2_extra_mod.py").write_text("X = 7\n")
    site = real / ".venv" / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    (site / "extra.pth").write_text(f"{extra}\n")
    proj = real
    if layout == "through-symlink":
        (tmp_path / "link").symlink_to(real.parent)
        proj = tmp_path / "link" / "proj"
    python = str(proj / ".venv" / "bin" / "python")
    res = subprocess.run([python, "-c", _RUN, str(proj), REPO, isolation], capture_output=True, text=True,
                         timeout=180, cwd=str(proj), env={"PATH": os.environ["PATH"], "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    mode, hides_files, per_call_uid = out["iso"]
    for kind in ("lean", "sci", "full"):
        assert isinstance(out[kind], list), f"{kind}: {out[kind]}"
        np_file, total, seen = out[kind]
        assert np_file == f"{proj}/.venv/lib/python3.{sys.version_info.minor}/site-packages/numpy/__init__.py"
        assert total == 10 + 7
        # the checkout around the venv is hidden by a private /tmp or bubblewrap; the worktree only by bubblewrap
        assert seen[:2] == [False, False] or not (hides_files or per_call_uid), f"{kind} sees the checkout: {seen}"
        assert seen[2:] == [False, False] or not hides_files, f"{kind} zygote's call sees project files: {seen}"
    if per_call_uid:
        assert "\n" not in out["unfixed"] and "cannot import" in out["unfixed"], out["unfixed"]
        assert "does not exist inside the sandbox" in out["unfixed"], out["unfixed"]
    if mode == "bwrap" and per_call_uid:  # the uid mode's first failure is the 0700 home's stdlib instead
        assert f"sys.path entry {proj}/.venv/lib/" in out["unfixed"], out["unfixed"]


def test_start_up_probe_names_the_module_and_the_missing_path(tmp_path, monkeypatch):
    """A sys.path entry the sandbox leaves out (simulated: named on the Python's path but never mounted)."""
    hidden = tmp_path / "left out"
    hidden.mkdir()
    (hidden / "rstar2_probe_mod.py").write_text("X = 1\n")
    real = python_layout(sys.executable, os.getcwd())
    fake = type(real)(real.executable, real.prefix, real.base_prefix, real.path + (str(hidden),), real.roots)
    monkeypatch.setattr(pool_mod, "python_layout", lambda python, cwd: fake)
    with pytest.raises(RuntimeError) as err:
        Pool(SandboxLimits(timeout_s=5), workers=1, lean_workers=1, full_workers=1, slots=2,
             preload=pool_mod.LEAN_PRELOAD + ("rstar2_probe_mod",))
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(r"the (lean|sci|full) zygote's calls cannot import rstar2_probe_mod: sys\.path entry "
                     + re.escape(str(hidden)) + " does not exist inside the sandbox", msg), msg


def test_layout_roots_bind_each_tree_once_and_never_the_project():
    lay = python_layout(sys.executable, os.getcwd())
    dests = [d for _, d in lay.roots]
    assert dests == sorted(dests) and len(set(dests)) == len(dests)
    assert not any(d != e and e.startswith(d + "/") for d in dests for e in dests)  # none below another
    assert os.path.realpath(REPO) not in [os.path.realpath(d) for d in dests]
    for entry in lay.path:
        assert any(entry == d or entry.startswith(d + "/") for d in dests + ["/usr"]), entry


def test_per_call_mounts_rebind_what_tmp_or_a_cover_hides(tmp_path):
    venv = tmp_path / "a b" / "proj" / ".venv"
    venv.mkdir(parents=True)
    closed = tmp_path / "closed"
    (closed / "py").mkdir(parents=True)
    closed.chmod(0o700)
    lay = PythonLayout("x", "x", "x", (), ((str(venv), str(venv)), (str(closed / "py"), str(closed / "py")),
                                           ("/opt/py", "/opt/py")))
    m = per_call_mounts(lay, "bwrap")
    assert m["cover"] == [] and m["keep"] == [[str(venv), True], [str(closed / "py"), True]]
    assert m["mkdirs"][-3:] == [str(tmp_path / "a b"), str(tmp_path / "a b" / "proj"), str(closed)]
    assert m["mkdirs"][0] == "/" + str(tmp_path).split("/")[1] + "/" + str(tmp_path).split("/")[2]
    home = PythonLayout("x", "x", "x", (), (("/opt/py", "/opt/py"),))
    assert per_call_mounts(home, "bwrap") == {"cover": [], "keep": [], "mkdirs": []}


def test_pth_directories_are_roots_but_not_editable_projects_or_the_working_directory(tmp_path):
    python = make_venv(tmp_path / "venv", packages=())
    site = tmp_path / "venv" / "lib" / f"python3.{sys.version_info.minor}" / "site-packages"
    lib, edited, here = tmp_path / "lib", tmp_path / "edited", tmp_path / "here"
    for d in (lib, edited, here / "sub"):
        d.mkdir(parents=True)
    (site / "dirs.pth").write_text(f"{lib}\n{edited}\n{here}\n")
    info = site / "edited-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: edited\nVersion: 0.1\n")
    (info / "direct_url.json").write_text(json.dumps({"url": edited.as_uri(), "dir_info": {"editable": True}}))
    lay = python_layout(python, str(here / "sub"))
    assert str(lib) in lay.path and (str(lib), str(lib)) in lay.roots
    for hidden in (edited, here):  # an editable install's project; the directory the host runs in
        assert str(hidden) not in lay.path and all(d != str(hidden) for _, d in lay.roots)
