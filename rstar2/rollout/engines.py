"""Inference engines behind one async interface (paper §3.2; frameworks.md §4).

An engine turns a token-id context into the next assistant turn:
``await engine.generate(context_ids, max_new_tokens) -> Generation(token_ids, finish_reason)``, where
``finish_reason`` is "stop" (the turn ended with the EOS/stop token, which is included in ``token_ids``)
or "length" (cut by ``max_new_tokens`` or the model's context). ``kv_capacity_tokens()`` reports the
engine's KV-cache size in tokens, or None when it has no fixed cache; the scheduler admits trajectories
against it. Many coroutines may call ``generate`` at once; the engine batches them.

- ``HFEngine``: transformers ``generate`` (CPU or GPU) on the live policy, so it never needs a weight sync.
- ``VLLMEngine``: an in-process ``vllm.LLM`` (e.g. the one TRL's colocate mode keeps in sync with the policy).
- ``OpenAIEngine``: an OpenAI-compatible ``/v1/completions`` server (``vllm serve`` or ``trl vllm-serve``,
  whose weights TRL's ``VLLMClient`` updates), token ids in and out.
vLLM is an optional GPU extra: nothing here imports it at module level.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Protocol


@dataclass
class Generation:
    """One generated turn: new token ids (EOS included when finish_reason == "stop")."""
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"


class Engine(Protocol):
    async def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation: ...

    def kv_capacity_tokens(self) -> int | None: ...


def cut_at_stop(ids: list[int], stop_ids: set[int], max_new: int, pad_id: int | None = None) -> Generation:
    """Trim one row of generated ids to its own budget and first stop token."""
    for i, tid in enumerate(ids[:max_new]):
        if tid in stop_ids:
            return Generation(ids[: i + 1], "stop")
    ids = ids[:max_new]
    if pad_id is not None:
        while ids and ids[-1] == pad_id:  # right padding generate adds after other rows finished
            ids = ids[:-1]
    return Generation(ids, "length")


class BatchingEngine:
    """Collects concurrent ``generate`` calls into batches for a synchronous batch backend.

    A worker task takes up to ``max_batch`` waiting requests, runs ``_generate_batch`` in a thread so the
    event loop keeps running tool calls, and starts the next batch as soon as one returns: requests that
    arrived meanwhile join it (no per-turn barrier). Before a batch it lingers ``linger_s`` for more
    requests, and keeps lingering while new ones keep arriving, up to ``max_linger_s`` in all: the next turns
    of a batch's trajectories come back from their tool calls a few milliseconds apart, and a backend
    without continuous batching (``HFEngine``) pays a whole decode for each batch it starts, so starting
    one on the first arrival would split a turn into several sequential batches.
    """

    def __init__(self, max_batch: int = 16, kv_tokens: int | None = None, linger_s: float = 0.005,
                 max_linger_s: float | None = None):
        self.max_batch, self.kv_tokens, self.linger_s = max_batch, kv_tokens, linger_s
        self.max_linger_s = linger_s if max_linger_s is None else max_linger_s
        self._queue: list[tuple[list[int], int, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self.batches = 0  # how many backend calls were made (for tests and benchmarks)

    def _generate_batch(self, requests: list[tuple[list[int], int]]) -> list[Generation]:
        raise NotImplementedError

    def kv_capacity_tokens(self) -> int | None:
        return self.kv_tokens

    async def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._work())
        fut = loop.create_future()
        self._queue.append((context_ids, max_new_tokens, fut))
        self._wake.set()
        return await fut

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            if self.linger_s > 0:
                deadline, seen = asyncio.get_running_loop().time() + self.max_linger_s, -1
                while seen != len(self._queue) < self.max_batch and asyncio.get_running_loop().time() < deadline:
                    seen = len(self._queue)
                    await asyncio.sleep(self.linger_s)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            if not self._queue:
                self._wake.clear()
            if not batch:
                continue
            try:
                outs = await asyncio.to_thread(self._generate_batch, [(ids, n) for ids, n, _ in batch])
            except Exception as e:  # every waiter sees the failure; the worker keeps serving
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self.batches += 1
            for (*_, fut), out in zip(batch, outs):
                if not fut.done():
                    fut.set_result(out)

    async def aclose(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._worker = None


def inference_copy(model, precision: str):
    """The model the "hf" engine decodes with: where ``precision`` ("fp32" | "bf16" | "force-bf16") gives bf16 on
    a CPU (``rstar2.precision.rollout``: "bf16" only with native bf16), a bfloat16 copy of a float32 ``model``
    (made now, so it holds the current weights; the trainer's float32 weights are untouched); else ``model`` itself.

    Under ``torch.autocast`` every decode step casts each float32 weight to bfloat16 again: for a small model at a
    small batch that cast, not the arithmetic, sets the step time (SmolLM2-135M, batch 8, 2 cores: about half
    the step). The copy costs one cast per rollout phase and the copy's memory (2 bytes per parameter).
    """
    import copy

    import torch
    from transformers import PreTrainedModel

    from .. import precision as precision_lib

    if not isinstance(model, PreTrainedModel) or model.device.type != "cpu" or model.dtype != torch.float32 or \
            not precision_lib.rollout(precision, "cpu").bf16:
        return model
    twin = copy.deepcopy(model).to(torch.bfloat16).eval()
    # A trainer may patch a module's forward on the instance (TRL's fused log-prob forward keeps the original
    # bound method in a closure): the copy would call the original float32 model through it. Use the classes'.
    for module in twin.modules():
        module.__dict__.pop("forward", None)
    return twin


class HFEngine(BatchingEngine):
    """A transformers model on left-padded batches (CPU or GPU).

    A ``PreTrainedModel`` is decoded by ``hf_decode.decode_shrinking``, which drops each row from the batch when
    it finishes (its stop token or its own token limit); anything else is driven through its ``generate``.

    Args:
        model: a causal LM (or anything with ``generate(input_ids, attention_mask, max_new_tokens, ...)``).
        tok: its tokenizer; ``eos_token_id`` ends a turn, ``pad_token_id`` pads.
        temperature, top_p: sampling (temperature 0 = greedy).
        precision: "fp32"; "bf16" to generate under ``torch.autocast`` in bfloat16 where the device has native
            bf16 (about 1.5x faster on CPUs with AMX / AVX512-BF16; float32 elsewhere, ``rstar2.precision``);
            "force-bf16" everywhere. ``default_engines`` also hands it a bfloat16 copy (``inference_copy``).
    """

    def __init__(self, model, tok, temperature: float = 1.0, top_p: float = 1.0, max_batch: int = 16,
                 kv_tokens: int | None = None, linger_s: float = 0.02, max_linger_s: float = 0.5,
                 precision: str = "fp32"):
        super().__init__(max_batch, kv_tokens, linger_s, max_linger_s)
        self.model, self.tok, self.temperature, self.top_p = model, tok, temperature, top_p
        self.precision = precision

    def _generate_batch(self, requests):
        import torch
        from transformers import PreTrainedModel

        from .. import precision as precision_lib
        from .hf_decode import decode_shrinking

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        device = getattr(self.model, "device", torch.device("cpu"))
        bf16 = precision_lib.rollout(self.precision, device.type).bf16
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if isinstance(self.model, PreTrainedModel):
                new = decode_shrinking(self.model, [ids for ids, _ in requests], [n for _, n in requests],
                                       self.tok.eos_token_id, pad, self.temperature, self.top_p)
            else:  # anything else that only offers generate() (scripted stand-ins in tests)
                new = self._generate_padded(requests, pad)
        return [cut_at_stop(row, {self.tok.eos_token_id}, n, pad) for row, (_, n) in zip(new, requests)]

    def _generate_padded(self, requests, pad):
        import torch

        width = max(len(ids) for ids, _ in requests)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _ in requests])
        attn = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in requests])
        sample = self.temperature > 0
        out = self.model.generate(input_ids=input_ids, attention_mask=attn,
                                  max_new_tokens=max(n for _, n in requests), do_sample=sample,
                                  temperature=self.temperature if sample else None,
                                  top_p=self.top_p if sample else None, top_k=None,
                                  eos_token_id=self.tok.eos_token_id, pad_token_id=pad)
        return out[:, width:].tolist()


class VLLMEngine(BatchingEngine):
    """An in-process ``vllm.LLM`` (vLLM continues batching inside each call).

    Args:
        llm: a ``vllm.LLM``; for RL pass the colocated one TRL keeps in sync with the policy
            (``trainer.vllm_generation.llm`` in TRL 1.16), so weight sync stays TRL's job.
        stop_token_ids: ids that end a turn (the tokenizer's EOS, ``<|im_end|>``).
        sampling_params_cls: ``vllm.SamplingParams`` (imported on first use; injectable for tests).
    Raises:
        ImportError: vLLM is not installed and no ``sampling_params_cls`` was given.
    """

    def __init__(self, llm, stop_token_ids: list[int], temperature: float = 1.0, top_p: float = 1.0,
                 max_batch: int = 256, kv_tokens: int | None = None, sampling_params_cls=None):
        super().__init__(max_batch, kv_tokens, linger_s=0.01)
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # optional GPU extra
        self.llm, self.stop, self.sp_cls = llm, list(stop_token_ids), sampling_params_cls
        self.temperature, self.top_p = temperature, top_p

    def kv_capacity_tokens(self) -> int | None:
        if self.kv_tokens is not None:
            return self.kv_tokens
        try:  # vLLM's engine knows its block count once the cache is allocated
            cfg = self.llm.llm_engine.vllm_config.cache_config
            return int(cfg.num_gpu_blocks) * int(cfg.block_size)
        except (AttributeError, TypeError):
            return None

    def _generate_batch(self, requests):
        params = [self.sp_cls(max_tokens=n, temperature=self.temperature, top_p=self.top_p,
                              stop_token_ids=self.stop, skip_special_tokens=False) for _, n in requests]
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids, _ in requests], params, use_tqdm=False)
        return [_normalise(list(o.outputs[0].token_ids), o.outputs[0].finish_reason, self.stop, n)
                for o, (_, n) in zip(outs, requests)]


def _normalise(ids: list[int], finish: str | None, stop: list[int], max_new: int) -> Generation:
    """vLLM/OpenAI finish reasons -> ours. A turn stopped by a stop token ends with that token (servers
    may leave it out of the ids; it is trained, spec §2.4)."""
    if finish == "stop":
        return Generation(ids if ids and ids[-1] in stop else ids + [stop[0]], "stop")
    return Generation(ids[:max_new], "length")


_CACHE_INFO_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.MULTILINE)


def kv_tokens_from_metrics(text: str) -> int | None:
    """KV-cache size in tokens from a vLLM server's Prometheus ``/metrics`` (``num_gpu_blocks * block_size``)."""
    m = _CACHE_INFO_RE.search(text)
    if not m:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


class OpenAIEngine:
    """Client for an OpenAI-compatible completions server (``vllm serve`` / ``trl vllm-serve``).

    Sends the context as token ids (``prompt: [ids]``) and asks for the generated ids back
    (``return_token_ids``, vLLM >= 0.10.2), so nothing is re-tokenised. All requests are in flight at
    once; the server batches them. Weights: with ``trl vllm-serve``, TRL's ``VLLMClient`` pushes the
    policy's weights to the same server before each step.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (no ``/v1``). model: the served model name.
        stop_token_ids: ids that end a turn. kv_tokens: override; None = read ``/metrics`` once.
    Raises (from ``generate``):
        RuntimeError: the server answered with an error status or without token ids.
    """

    def __init__(self, base_url: str, model: str, stop_token_ids: list[int], temperature: float = 1.0,
                 top_p: float = 1.0, kv_tokens: int | None = None, timeout_s: float = 600.0,
                 max_connections: int = 256):
        self.base_url, self.model, self.stop = base_url.rstrip("/"), model, list(stop_token_ids)
        self.temperature, self.top_p, self.kv_tokens = temperature, top_p, kv_tokens
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._client = None
        self._metrics_read = kv_tokens is not None

    def _http(self):
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s,
                                             limits=httpx.Limits(max_connections=self.max_connections))
            self._client_loop = loop
        return self._client

    def kv_capacity_tokens(self) -> int | None:
        if not self._metrics_read:
            import httpx

            self._metrics_read = True
            try:
                r = httpx.get(f"{self.base_url}/metrics", timeout=10.0)
                self.kv_tokens = kv_tokens_from_metrics(r.text) if r.status_code == 200 else None
            except httpx.HTTPError:
                self.kv_tokens = None
        return self.kv_tokens

    async def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        body = {"model": self.model, "prompt": context_ids, "max_tokens": max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "stop_token_ids": self.stop,
                "skip_special_tokens": False, "return_token_ids": True, "n": 1}
        r = await self._http().post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{self.base_url}/v1/completions: HTTP {r.status_code}: {r.text[:300]}")
        choice = r.json()["choices"][0]
        if choice.get("token_ids") is None:
            raise RuntimeError(f"{self.base_url}: the completion has no 'token_ids'; the server must support "
                               "return_token_ids (vLLM >= 0.10.2)")
        return _normalise(list(choice["token_ids"]), choice.get("finish_reason"), self.stop, max_new_tokens)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def engines_for_trainer(trainer, tok, temperature: float, top_p: float, max_batch: int = 16,
                        num_engines: int = 1, server_model: str | None = None) -> list:
    """The engines rollouts should use inside TRL's GRPOTrainer, on the vLLM whose weights TRL keeps in sync.

    The caller syncs first: TRL's own ``rollout_func`` path calls ``vllm_generation.sync_weights()`` before
    each call (trl 1.16 ``GRPOTrainer._generate``), ``RoCGRPOTrainer`` does the same before its rollouts. Then:
    colocate mode -> ``VLLMEngine`` on TRL's own ``vllm.LLM``; server mode (``trl vllm-serve``) ->
    ``OpenAIEngine`` on the same server, asking for ``server_model`` (None = the policy's folder name, which is
    what ``trl vllm-serve --model FOLDER`` serves); no vLLM -> ``HFEngine`` replicas on the live (unwrapped)
    policy, which need no sync at all.
    """
    stop = [tok.eos_token_id]
    if getattr(trainer, "use_vllm", False):
        args = trainer.args
        if args.vllm_mode == "colocate":
            return [VLLMEngine(trainer.vllm_generation.llm, stop, temperature, top_p)]
        base = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        return [OpenAIEngine(base, server_model or trainer.model.config._name_or_path, stop, temperature, top_p)]
    model = trainer.accelerator.unwrap_model(trainer.model)
    return [HFEngine(model, tok, temperature, top_p, max_batch=max_batch) for _ in range(num_engines)]
