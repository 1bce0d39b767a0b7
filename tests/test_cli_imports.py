"""What a stage job process imports (``rstar2.cli._lighter_imports``): a job started from the command line leaves
out scikit-learn (transformers' assisted generation only) and, for an RL job on the transformers engine, vLLM
(TRL's GRPO trainer would import it), while anything that needs scikit-learn later in the job still gets it. A
caller passing its own ``argv`` (several stages in one process) keeps every import as it is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

CHILD = textwrap.dedent('''
    import argparse, sys
    from rstar2 import cli
    engine = sys.argv[1]
    cli._lighter_imports(argparse.Namespace(stage="rl", params={"rollout": {"engine": engine}}))
    from transformers.utils import is_sklearn_available
    from trl.import_utils import is_vllm_available
    if engine == "hf":   # TRL's GRPO trainer imported without vLLM (with it, this import alone takes ~15 s)
        import trl.trainer.grpo_trainer
    import sklearn.metrics   # importable again: lm-eval's checkers may use it
    print(is_sklearn_available(), is_vllm_available(), "vllm" in sys.modules and sys.modules["vllm"] is not None)
''')


@pytest.mark.parametrize("engine, want", [("hf", "False False False"), ("vllm", "False True False")])
def test_a_job_process_leaves_out_what_it_does_not_use(engine, want):
    pytest.importorskip("vllm")
    out = subprocess.run([sys.executable, "-c", CHILD, engine], env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == want, out.stdout


def test_main_with_argv_changes_no_import(monkeypatch):
    """``main(argv)`` (in-process callers, e.g. tests/fsdp_runner.py running an hf stage and then a vLLM one)
    never hides a module."""
    from rstar2 import cli

    seen = []
    monkeypatch.setattr(cli, "_lighter_imports", lambda a: seen.append(a.stage))
    monkeypatch.setattr(cli, "_dispatch", lambda a: None)
    assert cli.main(["rl", "--params", '{"rollout": {"engine": "hf"}}', "--model", "m", "--data", "d",
                     "--out", "o"]) == 0
    assert seen == []
