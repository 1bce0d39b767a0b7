"""Per-call uid ranges are leased host-wide, so two sandbox pools on one host never kill each other's calls."""

import os

import pytest

from rstar2.sandbox import Pool, SandboxLimits
from rstar2.sandbox.uids import BLOCK, MAX_BLOCKS, lease


def test_leases_are_disjoint_skip_nobody_and_come_back_on_release(tmp_path):
    a = lease(61000, 3 * 32, lock_dir=str(tmp_path))
    b = lease(61000, BLOCK + 1, lock_dir=str(tmp_path))          # two blocks, after a's one
    assert (a.base, b.base) == (61000, 61000 + BLOCK)
    c, d, e = (lease(65000, 10, lock_dir=str(tmp_path)) for _ in range(3))
    assert (c.base, d.base) == (65000, 65256)
    assert e.base == 65000 + 3 * BLOCK > 65535                    # 65512.. would hold nobody (65534): skipped
    a.release()
    a.release()                                                   # idempotent
    assert lease(61000, 1, lock_dir=str(tmp_path)).base == 61000  # a's block is free again
    with pytest.raises(ValueError, match="width"):
        lease(61000, 0, lock_dir=str(tmp_path))


def test_a_full_host_is_an_error_not_a_shared_range(tmp_path):
    held = [lease(100_000, BLOCK, lock_dir=str(tmp_path)) for _ in range(MAX_BLOCKS)]
    assert len({h.base for h in held}) == MAX_BLOCKS
    with pytest.raises(RuntimeError, match="held by other sandbox pools"):
        lease(100_000, 1, lock_dir=str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="per-call uids need root (machine capability)")
def test_two_uid_pools_on_one_host_leave_each_others_calls_alone():
    """Without namespaces the sweep after a call kills every process of that call's uid on the host: with a
    shared range, pool b's finished calls killed pool a's running call (seen as a 'timeout' under two test
    workers)."""
    lim = SandboxLimits(timeout_s=30)
    with Pool(lim, workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid") as a, \
            Pool(lim, workers=1, lean_workers=1, full_workers=0, slots=2, isolation="uid") as b:
        running = [a.submit("import time\ntime.sleep(3)\nprint('a')") for _ in range(2)]
        assert [r.stdout for r in b.run_many([("print(1)", "")] * 8)] == ["1\n"] * 8
        assert [(f.result().status, f.result().stdout) for f in running] == [("ok", "a\n")] * 2
        assert abs(a.uid_base - b.uid_base) >= 2 * 2   # each holds 1 zygote x 2 slots of uids
