"""``python -m snakemake`` for the live SLURM tests, with the SLURM executor's status checks at most POLL_S apart.

snakemake-executor-plugin-slurm (2.8.0, ``check_active_jobs``) waits 10 s longer after every status check that finds
no job finished: checks come 2, 14, 36, 68 s after a submission (profiles/slurm-local's 2 s first wait). On the
tests' one-node cluster a tiny job takes 15-25 s, so a third of a run was waiting for the next check (measured: 43 s
of the 127 s to RL stage 1). What the tests check (sbatch's records, resources, cancel and resume, errors) does not
depend on when the executor looks, so here it looks every POLL_S at most; everything else is the plugin's own.

Usage (as ``python -m snakemake``): python tests/slurm_snakemake.py TARGETS --profile ... --configfile ...
"""

from __future__ import annotations

import asyncio
import os
import sys

POLL_S = 3.0


def main() -> None:
    sys.path[0] = os.getcwd()   # as under -m: tests/ must not shadow a module Snakemake imports
    from snakemake.cli import main as snakemake_main
    from snakemake_executor_plugin_slurm import Executor

    # the interface's RemoteExecutor.sleep is what its status loop awaits; a plugin with its own would bypass this
    assert "sleep" not in vars(Executor), "snakemake-executor-plugin-slurm now defines its own sleep"

    async def sleep(self) -> None:
        await asyncio.sleep(min(self.next_seconds_between_status_checks, POLL_S))

    Executor.sleep = sleep
    snakemake_main()


if __name__ == "__main__":
    main()
