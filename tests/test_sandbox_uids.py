"""Per-call uid ranges are leased host-wide, so two sandbox pools on one host never kill each other's calls."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rstar2.sandbox import Pool, SandboxLimits
from rstar2.sandbox.uids import BLOCK, MAX_BLOCKS, lease

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="per-call uids need root (machine capability)")


def test_leases_sit_on_one_grid_are_disjoint_skip_nobody_and_come_back(tmp_path):
    d = str(tmp_path)
    a = lease(61000, 3 * 32, lock_dir=d)                      # the block holding 61000: 60928..61183
    b = lease(61000, BLOCK + 1, lock_dir=d)                   # two blocks, after a's
    c = lease(61002, 4, lock_dir=d)                           # another base in a's block: not a's uids
    assert (a.base, b.base, c.base) == (60928, 61184, 61184 + 2 * BLOCK)
    e, f, g = (lease(65000, 10, lock_dir=d) for _ in range(3))
    assert (e.base, f.base, g.base) == (64768, 65024, 65536)  # 65280..65535 holds nobody (65534): skipped
    a.release()
    a.release()                                                # idempotent
    assert lease(61000, 1, lock_dir=d).base == 60928          # a's block is free again
    with pytest.raises(ValueError, match="width"):
        lease(61000, 0, lock_dir=d)


def test_a_full_host_is_an_error_not_a_shared_range(tmp_path):
    held = [lease(100_000, BLOCK, lock_dir=str(tmp_path)) for _ in range(MAX_BLOCKS)]
    assert len({h.base for h in held}) == MAX_BLOCKS
    with pytest.raises(RuntimeError, match="held by other sandbox pools"):
        lease(100_000, 1, lock_dir=str(tmp_path))


@ROOT
def test_two_uid_pools_on_one_host_leave_each_others_calls_alone():
    """Without namespaces the sweep after a call kills every process of that call's uid on the host: with a
    shared range, pool b's finished calls killed pool a's running call (seen as a 'timeout' under two test
    workers). Bases 2 apart, as two configs could give, must not overlap either."""
    lim = SandboxLimits(timeout_s=30)
    with Pool(lim, workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid", uid_base=300_000) as a, \
            Pool(lim, workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid", uid_base=300_002) as b:
        running = [a.submit("import time\ntime.sleep(3)\nprint('a')") for _ in range(2)]
        assert [r.stdout for r in b.run_many([("print(1)", "")] * 8)] == ["1\n"] * 8
        assert [(f.result().status, f.result().stdout) for f in running] == [("ok", "a\n")] * 2
        assert abs(a.uid_base - b.uid_base) >= BLOCK


HOLDER = """
import sys, time
from rstar2.sandbox import Pool, SandboxLimits
p = Pool(SandboxLimits(timeout_s=30), workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid",
         uid_base=310_000)
f = p.submit("import time\\nprint('started', flush=True)\\ntime.sleep(4)")
print(p.uid_base, flush=True)
time.sleep(60)
"""


@ROOT
def test_a_killed_holders_leftover_calls_cannot_hit_the_next_holder():
    """A pool's process SIGKILLed: the kernel frees its lease, but in uid mode its sandbox's running call lives on
    and would sweep the next holder's calls of that uid; the next holder kills such leftovers first."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    base = int(holder.stdout.readline())
    time.sleep(1.0)   # the call runs
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with Pool(SandboxLimits(timeout_s=30), workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid",
              uid_base=310_000) as p:
        assert p.uid_base == base
        # the orphan's call ends (and its zygote sweeps its uid) while these run on the same uids
        assert [r.status for r in p.run_many([("import time\ntime.sleep(6)", "")] * 2)] == ["ok"] * 2
