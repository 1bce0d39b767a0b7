"""Host-wide leases on the per-call uid ranges of sandbox pools (paper §3.1: isolated execution workers).

Started as root, each zygote slot runs its calls as its own unprivileged uid, and a finished call's leftover
processes are found by that uid (the ``uid`` isolation reads the host's /proc). Two pools on one host (two
trainers on a node, an evaluation beside a trainer, parallel test workers) that used the same uids would
kill each other's calls and share one RLIMIT_NPROC. So a pool leases its range here: blocks of ``BLOCK``
uids, each held by an ``flock`` on a file in a root-only directory for as long as the pool lives (the kernel
drops it when the process exits, so a crashed pool leaves nothing stale).
"""

from __future__ import annotations

import fcntl
import os
import tempfile

BLOCK = 256
RESERVED = (65534, 65535)   # nobody, and the 16-bit "no uid": never a call's uid
MAX_BLOCKS = 256


def _lock_dir() -> str:
    for parent in ("/run/lock", tempfile.gettempdir()):
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            d = os.path.join(parent, "rstar2-sandbox-uids")
            os.makedirs(d, mode=0o700, exist_ok=True)
            return d
    raise RuntimeError("sandbox uid lease: no writable /run/lock or temporary directory")


class UidLease:
    """The uids ``[base, base + width)``, held host-wide until :meth:`release` (or the process ends).

    Use :func:`lease`; ``base`` is the first uid, ``width`` the count asked for."""

    def __init__(self, base: int, width: int, fds: list[int]):
        self.base, self.width, self._fds = base, width, fds

    def release(self) -> None:
        """Give the range back (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the descriptor drops its flock


def lease(first: int, width: int, lock_dir: str | None = None) -> UidLease:
    """Lease ``width`` consecutive uids starting at ``first`` or the next free run of ``BLOCK``-sized blocks
    after it, skipping uids 65534-65535; raises RuntimeError when ``MAX_BLOCKS`` blocks are all taken and
    ValueError for a width below 1."""
    if width < 1:
        raise ValueError(f"sandbox uid lease: width must be at least 1, got {width}")
    d = lock_dir or _lock_dir()
    need = -(-width // BLOCK)
    k = 0
    while k + need <= MAX_BLOCKS:
        base = first + k * BLOCK
        if any(base <= r < base + need * BLOCK for r in RESERVED):
            k += 1
            continue
        fds: list[int] = []
        for j in range(need):
            fd = os.open(os.path.join(d, f"{base + j * BLOCK}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                break
            fds.append(fd)
        if len(fds) == need:
            return UidLease(base, width, fds)
        for fd in fds:
            os.close(fd)
        k += len(fds) + 1   # past the block that was taken
    raise RuntimeError(f"sandbox uid lease: all {MAX_BLOCKS} blocks of {BLOCK} uids from {first} are held by "
                       f"other sandbox pools on this host")
