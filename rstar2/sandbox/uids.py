"""Host-wide leases on the per-call uid ranges of sandbox pools (paper §3.1: isolated execution workers).

Started as root, each zygote slot runs its calls as its own unprivileged uid, and a finished call's leftover
processes are found by that uid (the ``uid`` isolation reads the host's /proc). Two pools on one host (two
trainers on a node, an evaluation beside a trainer, parallel test workers) that used the same uids would
kill each other's calls and share one RLIMIT_NPROC. So a pool leases its range here: blocks of ``BLOCK``
uids on one grid for the whole host (block k holds uids ``k * BLOCK`` to ``k * BLOCK + BLOCK - 1``, whatever
base a pool asks for), each held by an ``flock`` on a file in a root-only directory for as long as the pool
lives. The kernel drops the lock when the holder dies; processes of a dead holder that still run as its uids
(without namespaces nothing kills them) are swept by the next holder (:meth:`UidLease.sweep`).
"""

from __future__ import annotations

import fcntl
import os
import signal

BLOCK = 256
RESERVED = (65534, 65535)   # nobody, and the 16-bit "no uid": never a call's uid
MAX_BLOCKS = 256
# fixed places, not $TMPDIR: two processes must meet in the same directory to exclude each other
LOCK_PARENTS = ("/run/lock", "/run", "/tmp")


def _lock_dir() -> str:
    for parent in LOCK_PARENTS:
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            d = os.path.join(parent, "rstar2-sandbox-uids")
            os.makedirs(d, mode=0o700, exist_ok=True)
            return d
    raise RuntimeError(f"sandbox uid lease: none of {', '.join(LOCK_PARENTS)} is a writable directory")


class UidLease:
    """The uids ``[base, base + width)``, held host-wide until :meth:`release` (or the process ends).

    Use :func:`lease`; ``base`` is the first uid (a multiple of ``BLOCK``), ``width`` the count asked for."""

    def __init__(self, base: int, width: int, fds: list[int]):
        self.base, self.width, self._fds = base, width, fds

    def sweep(self) -> int:
        """SIGKILL every host process whose real uid is in the range (a dead holder's leftovers, or daemons a
        call of this pool left behind); returns how many were signalled. Needs root for other uids' processes."""
        n = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if self.base <= os.stat(f"/proc/{name}").st_uid < self.base + self.width:
                    os.kill(int(name), signal.SIGKILL)
                    n += 1
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
        return n

    def release(self) -> None:
        """Give the range back (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the descriptor drops its flock


def lease(first: int, width: int, lock_dir: str | None = None) -> UidLease:
    """Lease ``width`` consecutive uids: the run of free grid blocks that starts at the block holding ``first`` or
    the earliest after it, skipping blocks that hold uid 65534 or 65535. Raises RuntimeError when none is free
    within ``MAX_BLOCKS`` blocks, ValueError for a width below 1 or a negative ``first``."""
    if width < 1 or first < 0:
        raise ValueError(f"sandbox uid lease: need width >= 1 and first >= 0, got width {width}, first {first}")
    d = lock_dir or _lock_dir()
    need = -(-width // BLOCK)
    k0 = first // BLOCK
    k = k0
    while k + need <= k0 + MAX_BLOCKS:
        base = k * BLOCK
        if any(base <= r < base + need * BLOCK for r in RESERVED):
            k += 1
            continue
        fds: list[int] = []
        for j in range(need):
            fd = os.open(os.path.join(d, f"{(k + j) * BLOCK}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
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
    raise RuntimeError(f"sandbox uid lease: all {MAX_BLOCKS} blocks of {BLOCK} uids from {k0 * BLOCK} are held by "
                       f"other sandbox pools on this host")
