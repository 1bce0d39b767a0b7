"""What the real-vLLM tests (tests/test_vllm_*.py) share: vLLM's CPU-backend settings for a shared 2-core
machine and the tiny model its CPU attention can run."""

# VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (the machine is shared); VLLM_CPU_OMP_THREADS_BIND: no pinning to cores
# other jobs also use.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def tiny_model(dest):
    """A tiny random Qwen3 (real Qwen3 tokenizer) in ``dest`` with head_dim 32: vLLM's CPU attention has no kernel
    for the CI model's head_dim 8."""
    from rstar2 import models

    models.materialise({"source": "tiny_qwen3", "tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2}}, dest)
    return dest


def literal_regex(text: str) -> str:
    """A regex matching exactly ``text`` in xgrammar's dialect (``re.escape`` escapes spaces, which it warns on):
    the structured-output constraint that steers a random model's turn to a fixed text."""
    return "".join("\\" + c if c in r".^$*+?{}[]\|()" else c for c in text).replace("\n", "\\n")
