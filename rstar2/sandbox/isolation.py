"""Which isolation the sandbox can use here, and the command that starts one zygote inside it (paper §3.1).

Modes, strongest first (measured on this project's machines):

- ``bwrap``: the zygote runs under bubblewrap in new network, mount, pid, ipc and uts namespaces. The
  only host paths visible are ``/usr``, the Python installation, the virtual environment, directories a
  ``.pth`` file puts on ``sys.path`` (see :mod:`.python_layout`) and ``/etc/ld.so.cache``, all read-only; ``/tmp`` is a private size-capped tmpfs; no ``/etc``, ``/home``,
  ``/root``, ``data/``, ``results/`` or credentials. When started as root, bwrap keeps only the
  capabilities the zygote needs to drop each child to its own unprivileged uid (so RLIMIT_NPROC holds
  and a snippet cannot signal the zygote or its siblings); when started unprivileged, bwrap uses a user
  namespace and leftover processes are swept by session.
- ``uid``: no namespaces, but root: each child drops to its own unprivileged uid on the host (host
  world-readable files and the network stay reachable; logged loudly).
- ``none``: resource limits only. Refused unless the config explicitly allows it (``allow_unsandboxed``).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .python_layout import PythonLayout

log = logging.getLogger("rstar2.sandbox")

MODES = ("auto", "bwrap", "uid", "none")
ZYGOTE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
ZYGOTE_IN_SANDBOX = "/opt/rstar2-sandbox/zygote.py"


@dataclass
class Isolation:
    """The isolation in force. mode: one of ``bwrap``, ``uid``, ``none``; root: started by uid 0;
    per_call_uid: each child gets its own unprivileged uid; sweep: how leftovers are found
    (``uid``, ``pidns`` or ``none``); network/filesystem: whether those are isolated."""
    mode: str
    root: bool
    per_call_uid: bool
    sweep: str
    network: bool
    filesystem: bool
    bwrap: str | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [self.mode, "netns" if self.network else "HOST NETWORK",
                 "private fs" if self.filesystem else "HOST FILES READABLE",
                 "per-call uid" if self.per_call_uid else "shared uid"]
        return ", ".join(parts)


def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def _bwrap_works(bwrap: str, root: bool) -> bool:
    cmd = [bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
           "--dev", "/dev", "true"]
    if not root:
        cmd.insert(1, "--unshare-user")
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def detect(mode: str = "auto", allow_unsandboxed: bool = False) -> Isolation:
    """Choose the isolation for ``mode`` (one of ``MODES``) and log it.

    Raises RuntimeError when the requested mode is unavailable, or when only ``none`` is possible and
    ``allow_unsandboxed`` is False.
    """
    if mode not in MODES:
        raise ValueError(f"sandbox isolation must be one of {MODES}, got {mode!r}")
    root = os.geteuid() == 0
    bwrap = _bwrap_path()
    iso = None
    if mode in ("auto", "bwrap") and bwrap and _bwrap_works(bwrap, root):
        iso = Isolation("bwrap", root, per_call_uid=root, sweep="uid" if root else "pidns", network=True,
                        filesystem=True, bwrap=bwrap)
    elif mode == "bwrap":
        raise RuntimeError("sandbox isolation 'bwrap' requested but bubblewrap is missing or cannot create "
                           "namespaces here (install the Debian package 'bubblewrap')")
    elif mode in ("auto", "uid") and root:
        iso = Isolation("uid", root, per_call_uid=True, sweep="uid", network=False, filesystem=False,
                        notes=["no namespaces: host network and world-readable host files are reachable"])
    elif mode == "uid":
        raise RuntimeError("sandbox isolation 'uid' needs root to switch each call to its own uid")
    elif allow_unsandboxed:
        iso = Isolation("none", root, per_call_uid=False, sweep="none", network=False, filesystem=False,
                        notes=["resource limits only"])
    elif mode == "none":
        raise RuntimeError("sandbox isolation 'none' (resource limits only) was requested; refusing to run "
                           "model-written code unsandboxed unless sandbox.allow_unsandboxed is true")
    else:
        raise RuntimeError("no sandbox isolation is available (no working bubblewrap and not root); refusing "
                           "to run model-written code unsandboxed. Install 'bubblewrap', or set "
                           "sandbox.allow_unsandboxed: true to accept the risk.")
    level = logging.INFO if iso.mode == "bwrap" else logging.WARNING
    log.log(level, "sandbox isolation: %s%s", iso.describe(), "".join(f"; {n}" for n in iso.notes))
    return iso


def _mkdirs(args: list[str], path: str, made: set[str]) -> None:
    """bwrap creates missing parents of a mount point with the host parent's mode (e.g. /root is 0700,
    unreadable to the per-call uid); create them 0755 first."""
    parts = os.path.dirname(path).strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if d not in made and d not in ("/", "/usr", "/tmp"):
            made.add(d)
            args += ["--perms", "0755", "--dir", d]


def zygote_command(iso: Isolation, config_json: str, layout: PythonLayout, tmpfs_mb: int = 256) -> list[str]:
    """The argv that starts one zygote under ``iso`` with the Python of ``layout``; ``config_json`` is the
    zygote's JSON config; ``tmpfs_mb`` caps the sandbox's /tmp."""
    python = layout.executable
    if iso.mode != "bwrap":
        return [python, "-I", ZYGOTE_SRC, config_json]
    args = [iso.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    if iso.root:
        args += ["--cap-add", "CAP_SETUID,CAP_SETGID,CAP_KILL,CAP_CHOWN,CAP_FOWNER,CAP_DAC_OVERRIDE,CAP_SYS_ADMIN"]
    else:
        args += ["--unshare-user"]
    args += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
             "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev",
             "--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    made: set[str] = set()
    # The interpreter, its stdlib and site-packages at the paths the host sees them (a venv reached through a
    # symlink too: Python looks for pyvenv.cfg next to the path it was started by, so without that bind the
    # sandbox silently runs the base interpreter's site-packages instead of the venv's).
    for src, dest in layout.roots:
        _mkdirs(args, dest, made)
        args += ["--ro-bind", src, dest]
    _mkdirs(args, ZYGOTE_IN_SANDBOX, made)
    args += ["--ro-bind", ZYGOTE_SRC, ZYGOTE_IN_SANDBOX, "--chdir", "/tmp", python, "-I", ZYGOTE_IN_SANDBOX,
             config_json]
    return args
