"""OpenAI-compatible vLLM servers as rollout engines (``vllm serve``; ``trl vllm-serve`` runs the same server).

A server started with ``--data-parallel-size N`` holds N engines (one per GPU or TP group) behind one URL. Its
``/v1/completions`` honours the ``X-data-parallel-rank`` header (vllm==0.31.0
``vllm/entrypoints/generate/base/serving.py`` ``_get_data_parallel_rank``; the request then goes to that engine,
``DPLBAsyncMPClient.get_core_engine_for_request``), so ``server_engines`` makes one engine per rank: the scheduler
then reserves KV on each GPU and keeps a trajectory on the rank that holds its prefix, instead of the server's own
load balancer spreading a trajectory's turns over ranks (a prefix-cache miss each time it moves).

KV capacity comes from the server's Prometheus ``/metrics``: ``vllm:cache_config_info`` has one line per engine
(label ``engine``) whose labels are the frontend's ``CacheConfig``: ``kv_cache_size_tokens`` is per engine
(vllm 0.31.0 ``vllm/config/cache.py``); older servers only give ``num_gpu_blocks * block_size``, which the
frontend sums over its engines (``vllm/v1/engine/core_client.py`` ``_apply_ready_response``).
"""

from __future__ import annotations

import asyncio
import re

from .protocol import Generation, normalise_finish
from .vllm_reproducible import turn_seed

_CACHE_INFO_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.MULTILINE)


def server_kv_from_metrics(text: str) -> tuple[int | None, list[str]]:
    """(KV tokens per engine, the engines' ``engine`` labels) from a vLLM server's ``/metrics`` text.

    Returns ``(None, [])`` when the text has no ``vllm:cache_config_info`` line, ``(None, labels)`` when the
    lines carry no usable size. A server without the ``engine`` label counts as one engine, label "".
    """
    lines = [dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) for m in _CACHE_INFO_RE.finditer(text)]
    if not lines:
        return None, []
    labels = list(dict.fromkeys(ln.get("engine", "") for ln in lines))
    first = lines[0]
    try:
        return int(first["kv_cache_size_tokens"]), labels
    except (KeyError, ValueError):
        pass
    try:
        return int(first["num_gpu_blocks"]) * int(first["block_size"]) // len(labels), labels
    except (KeyError, ValueError):
        return None, labels


def kv_tokens_from_metrics(text: str) -> int | None:
    """KV-cache size in tokens of one of a vLLM server's engines, from its ``/metrics`` (None if not reported)."""
    return server_kv_from_metrics(text)[0]


def read_metrics(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The server's ``/metrics`` text, or None when it cannot be read (no server yet, no metrics)."""
    import httpx

    try:
        r = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


class OpenAIEngine:
    """Client for an OpenAI-compatible completions server (``vllm serve`` / ``trl vllm-serve``), or one of its
    data-parallel ranks.

    Sends the context as token ids (``prompt: [ids]``) and asks for the generated ids back
    (``return_token_ids``, vLLM >= 0.10.2) with the sampled tokens' log-probabilities (``logprobs: 0``;
    ``trl vllm-serve`` runs with ``--logprobs-mode processed_logprobs``, the distribution sampled from), so nothing
    is re-tokenised. All requests are in flight at once; the server batches them. Weights: with ``trl vllm-serve``,
    TRL's ``VLLMClient`` pushes the policy's weights to the same server before each step.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (no ``/v1``). model: the served model name.
        stop_token_ids: ids that end a turn. kv_tokens: override; None = read ``/metrics`` once.
        dp_rank: send every request to this data-parallel engine of the server (``X-data-parallel-rank``);
            None = let the server choose.
        seed: each turn's request carries its own ``seed`` (``vllm_reproducible.turn_seed`` of the trajectory key
            and context length, as the in-process vLLM engines; ``reproducible``); None = unseeded, unless
            ``run_rollouts`` lends the phase's seed (``vllm_reproducible.seed_engines``).
    Raises (from ``generate``):
        RuntimeError: the server answered with an error status or without token ids.
    """

    seeded_turns = True   # run_rollouts may hand it the phase's seed (vllm_reproducible.seed_engines)

    def __init__(self, base_url: str, model: str, stop_token_ids: list[int], temperature: float, top_p: float,
                 kv_tokens: int | None = None, dp_rank: int | None = None, timeout_s: float = 600.0,
                 max_connections: int = 256, seed: int | None = None):
        self.base_url, self.model, self.stop = base_url.rstrip("/"), model, list(stop_token_ids)
        self.seed = seed
        self.temperature, self.top_p, self.kv_tokens, self.dp_rank = temperature, top_p, kv_tokens, dp_rank
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._client = None
        self._metrics_read = kv_tokens is not None

    def _http(self):
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            headers = {"X-data-parallel-rank": str(self.dp_rank)} if self.dp_rank is not None else {}
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, headers=headers,
                                             limits=httpx.Limits(max_connections=self.max_connections))
            self._client_loop = loop
        return self._client

    def kv_capacity_tokens(self) -> int | None:
        if not self._metrics_read:
            self._metrics_read = True
            text = read_metrics(self.base_url)
            self.kv_tokens = kv_tokens_from_metrics(text) if text is not None else None
        return self.kv_tokens

    def release(self, key: str) -> None:
        """Nothing to drop: the server's prefix cache evicts a finished trajectory's blocks by itself."""

    def request_body(self, key: str, context_ids: list[int], max_new_tokens: int) -> dict:
        """The ``/v1/completions`` JSON of one turn of trajectory ``key`` (vllm 0.31.0 ``CompletionRequest``
        fields, vllm/entrypoints/openai/completion/protocol.py); a subclass may add fields (e.g.
        ``structured_outputs``)."""
        body = {"model": self.model, "prompt": context_ids, "max_tokens": max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "stop_token_ids": self.stop,
                "skip_special_tokens": False, "return_token_ids": True, "n": 1, "logprobs": 0,
                "return_tokens_as_token_ids": True}  # no detokenised token strings in the log-probs
        seed = turn_seed(self.seed, key, len(context_ids))
        if seed is not None:
            body["seed"] = seed
        return body

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        r = await self._http().post("/v1/completions", json=self.request_body(key, context_ids, max_new_tokens))
        if r.status_code != 200:
            raise RuntimeError(f"{self.base_url}/v1/completions: HTTP {r.status_code}: {r.text[:300]}")
        choice = r.json()["choices"][0]
        if choice.get("token_ids") is None:
            raise RuntimeError(f"{self.base_url}: the completion has no 'token_ids'; the server must support "
                               "return_token_ids (vLLM >= 0.10.2)")
        ids = list(choice["token_ids"])
        gen = normalise_finish(ids, choice.get("finish_reason"), self.stop, max_new_tokens)
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if lps is not None and len(lps) == len(ids) == len(gen.token_ids) and None not in lps:
            gen.logprobs = [float(x) for x in lps]
        return gen

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def server_engines(base_url: str, model: str, stop_token_ids: list[int], temperature: float, top_p: float,
                   kv_tokens: int | None = None, seed: int | None = None) -> list[OpenAIEngine]:
    """One ``OpenAIEngine`` per data-parallel engine of the server at ``base_url`` (see the module docstring),
    each with that engine's KV capacity (``kv_tokens`` overrides it) and per-turn seeds from ``seed`` (None:
    unseeded). A server whose ``/metrics`` cannot be read, or that has one engine, gives one engine that lets the
    server choose."""
    text = read_metrics(base_url)
    per_engine, labels = server_kv_from_metrics(text) if text is not None else (None, [])
    kv = kv_tokens if kv_tokens is not None else per_engine
    ranks = [int(x) for x in labels] if len(labels) > 1 and all(x.isdigit() for x in labels) else [None]
    return [OpenAIEngine(base_url, model, stop_token_ids, temperature, top_p, kv, dp_rank=r, seed=seed) for r in ranks]
