"""Inference engines behind one async interface (paper §3.2).

An engine turns a token-id context into the next assistant turn (the ``Engine`` protocol, protocol.py):

- ``await engine.generate(key, context_ids, max_new_tokens) -> Generation(token_ids, finish_reason, logprobs)``:
  ``key`` names the trajectory (stable over all its turns, unique among live trajectories), so an engine may
  keep per-trajectory state between turns (its KV cache, a server it is pinned to); ``finish_reason`` is
  "stop" (the turn ended with the EOS/stop token, which is included in ``token_ids``) or "length" (cut by
  ``max_new_tokens`` or the model's context); ``logprobs`` are the sampling log-probabilities of
  ``token_ids`` where the engine reports them (vLLM, servers, ``HFEngine`` on a transformers model), else None.
- ``engine.release(key)``: the trajectory has ended (the scheduler calls it once, after its last turn, also on
  failure); per-trajectory state may go.
- ``engine.kv_capacity_tokens()``: the engine's KV-cache size in tokens (from its own metrics), or None when
  it has no fixed cache; the scheduler admits trajectories against it and holds the reservations.

Many coroutines may call ``generate`` at once; the engine batches them.

- ``HFEngine`` (here): transformers ``generate`` (CPU or GPU) on the live policy, so it never needs a weight sync.
- ``vllm_engines.AsyncVLLMEngine``: an in-process ``vllm.AsyncLLM``; ``vllm_engines.StepVLLMEngine``: a
  ``vllm.LLM`` driven step by step (the one TRL's colocate mode keeps in sync with the policy).
- ``servers.OpenAIEngine``: an OpenAI-compatible ``/v1/completions`` server (``vllm serve`` or
  ``trl vllm-serve``, whose weights TRL's ``VLLMClient`` updates), or one data-parallel rank of it.
vLLM is an optional GPU extra: nothing here imports it at module level.
"""

from __future__ import annotations

import asyncio

from .lane import run_blocking
from .protocol import Engine, Generation, TurnRequest, normalise_finish  # noqa: F401 (the protocol, re-exported)
from .servers import OpenAIEngine, kv_tokens_from_metrics, server_engines  # noqa: F401 (importable from here)
from .vllm_engines import StepVLLMEngine


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

    ``reproducible``: which requests share a batch then depends only on the trajectories, never on
    when their tool calls finish. The scheduler announces each trajectory it places here (``expect``) and its
    end (``release``); a round starts once every announced trajectory is waiting for its next turn, and runs
    them in announcement order, ``max_batch`` at a time (a per-engine turn barrier). On a CPU a row's tokens
    can depend on its batch (measured with bf16: the same rows decoded alone or six together differ), so this is
    what makes a seeded run repeat. Cost: a turn waits for the slowest tool call of its round.
    """

    def __init__(self, max_batch: int = 16, kv_tokens: int | None = None, linger_s: float = 0.005,
                 max_linger_s: float | None = None, reproducible: bool = False):
        self.max_batch, self.kv_tokens, self.linger_s = max_batch, kv_tokens, linger_s
        self.max_linger_s = linger_s if max_linger_s is None else max_linger_s
        self.reproducible = reproducible
        self._queue: list[tuple[TurnRequest, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._expected: dict[str, int] = {}   # announced live trajectory -> its announcement number
        self._announced = 0
        self.batches = 0  # how many backend calls were made (for tests and benchmarks)
        self.batch_keys: list[list[str]] = []  # the keys of every batch, in order (tests)

    def _generate_batch(self, requests: list[TurnRequest]) -> list[Generation]:
        raise NotImplementedError

    def kv_capacity_tokens(self) -> int | None:
        return self.kv_tokens

    def expect(self, key: str) -> None:
        """The scheduler placed trajectory ``key`` on this engine: in reproducible mode no round starts before it
        waits for a turn too (until ``release``)."""
        if key not in self._expected:
            self._expected[key] = self._announced
            self._announced += 1

    def release(self, key: str) -> None:
        """The trajectory ``key`` has ended: a round no longer waits for it. A subclass that keeps state per
        trajectory (its KV cache across turns) drops it too."""
        self._expected.pop(key, None)
        if self._wake is not None:
            self._wake.set()

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._work())
        fut = loop.create_future()
        self._queue.append((TurnRequest(key, context_ids, max_new_tokens), fut))
        self._wake.set()
        return await fut

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            if self.reproducible:
                await self._round()
                continue
            if self.linger_s > 0:
                deadline, seen = asyncio.get_running_loop().time() + self.max_linger_s, -1
                while seen != len(self._queue) < self.max_batch and asyncio.get_running_loop().time() < deadline:
                    seen = len(self._queue)
                    await asyncio.sleep(self.linger_s)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            if not self._queue:
                self._wake.clear()
            if batch:
                await self._run(batch)

    async def _round(self) -> None:
        """Reproducible mode: once every announced trajectory waits, run all waiting requests in announcement
        order (keys not announced last, by key), ``max_batch`` at a time; otherwise wait for the next arrival or
        release."""
        self._wake.clear()
        waiting = {r.key for r, _ in self._queue}
        if not self._queue or any(k not in waiting for k in self._expected):
            return
        order = sorted(self._queue, key=lambda q: (self._expected.get(q[0].key, 1 << 62), q[0].key))
        self._queue = []
        for start in range(0, len(order), self.max_batch):
            await self._run(order[start:start + self.max_batch])

    async def _run(self, batch: list) -> None:
        self.batch_keys.append([r.key for r, _ in batch])
        try:
            outs = await run_blocking(self._generate_batch, [r for r, _ in batch])
        except Exception as e:  # every waiter sees the failure; the worker keeps serving
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        self.batches += 1
        for (_, fut), out in zip(batch, outs):
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


def kv_bytes_per_token(model) -> int | None:
    """Bytes one token's keys and values take in ``model``'s KV cache: 2 (K and V) x layers x KV heads x head
    dimension x the weights' element size (the cache is kept in the model's dtype). None for anything that is not
    a transformers model with those config fields (scripted stand-ins)."""
    cfg = getattr(model, "config", None)
    try:
        layers, heads = cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        itemsize = next(model.parameters()).element_size()
    except (AttributeError, TypeError, StopIteration):
        return None
    return 2 * layers * heads * head_dim * itemsize


class HFEngine(BatchingEngine):
    """A transformers model on left-padded batches (CPU or GPU).

    A ``PreTrainedModel`` is decoded by ``hf_cache.decode_cached``: each row leaves the batch when it finishes
    (its stop token or its own token limit); a trajectory's KV cache is kept between its turns (``kv_reuse``), so a
    later turn prefills only its new tokens, and a group's equal prompts are prefilled once. ``kv_reuse=False``
    decodes every turn from its whole context (``hf_decode.decode_shrinking``; the baseline to compare with).
    Anything that is not a ``PreTrainedModel`` is driven through its ``generate`` (scripted stand-ins in tests).

    Sampling: row i draws token t of its trajectory from the counter-based stream ``(seed, key_i)``
    (``hf_decode.row_uniforms``), so its tokens do not depend on which trajectories share its batch. A
    ``PreTrainedModel``'s turns carry the sampled tokens' log-probabilities (``Generation.logprobs``: the distribution
    sampled from, after temperature and top-p, in the decoding precision: bf16 under ``precision`` bf16).

    Args:
        model: a causal LM (or anything with ``generate(input_ids, attention_mask, max_new_tokens, ...)``).
        tok: its tokenizer; ``eos_token_id`` ends a turn, ``pad_token_id`` pads.
        temperature, top_p: sampling (temperature 0 = greedy).
        precision: "fp32"; "bf16" to generate under ``torch.autocast`` in bfloat16 where the device has native
            bf16 (about 1.5x faster on CPUs with AMX / AVX512-BF16; float32 elsewhere, ``rstar2.precision``);
            "force-bf16" everywhere. ``default_engines`` also hands it a bfloat16 copy (``inference_copy``).
        seed: the sampling streams' seed; None = drawn from torch's global RNG when the engine is made (so a seeded
            stage gives the same streams every run, and each rollout phase new ones).
        kv_reuse: keep each trajectory's KV cache across turns (memory: its context's keys and values, until
            ``release``).
        reproducible: batches independent of tool-call timing (``BatchingEngine``).
        kv_tokens: the KV capacity to report (tokens), overriding ``kv_budget_mb``.
        kv_budget_mb: the memory this engine's KV caches may take (MiB), reported as a capacity in tokens
            (``kv_capacity_tokens``); None = no bound.
    """

    def __init__(self, model, tok, temperature: float = 1.0, top_p: float = 1.0, max_batch: int = 16,
                 kv_tokens: int | None = None, linger_s: float = 0.02, max_linger_s: float = 0.5,
                 precision: str = "fp32", seed: int | None = None, kv_reuse: bool = True,
                 reproducible: bool = False, kv_budget_mb: int | None = None):
        import torch

        if kv_tokens is None and kv_budget_mb is not None and (per := kv_bytes_per_token(model)):
            kv_tokens = kv_budget_mb * 2**20 // per
        super().__init__(max_batch, kv_tokens, linger_s, max_linger_s, reproducible)
        self.model, self.tok, self.temperature, self.top_p = model, tok, temperature, top_p
        self.precision, self.kv_reuse = precision, kv_reuse
        self.seed = int(torch.randint(0, 2**62, (1,))) if seed is None else seed
        self._kv: dict = {}          # trajectory key -> hf_cache.PastKV of its last turn
        # packed linear weights (hf_packed), valid for this engine's life: one rollout phase, during which the
        # weights do not change (an RL step builds new engines after its update)
        self._packs: dict = {}
        self.prefilled_tokens = 0    # context tokens forwarded in prefills (benchmarks)

    def release(self, key: str) -> None:
        super().release(key)
        self._kv.pop(key, None)

    def cached_bytes(self) -> int:
        """Memory held by the trajectories' kept KV caches (bytes)."""
        return sum(kv.nbytes() for kv in list(self._kv.values()))

    def _rows(self, requests):
        """``(past, new ids)`` per request: the kept cache when it covers a prefix of the context, else none."""
        rows = []
        for r in requests:
            past = self._kv.pop(r.key, None)
            n = past.n_tokens if past is not None else 0
            if past is None or len(r.context_ids) <= n or r.context_ids[:n] != past.ids[:n]:
                past, n = None, 0
            rows.append((past, r.context_ids[n:]))
        return rows

    def _generate_batch(self, requests):
        import torch
        from transformers import PreTrainedModel

        from .. import precision as precision_lib
        from .hf_cache import decode_cached
        from .hf_decode import decode_shrinking

        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        device = getattr(self.model, "device", torch.device("cpu"))
        limits, streams = [r.max_new_tokens for r in requests], (self.seed, [r.key for r in requests])
        bf16 = precision_lib.rollout(self.precision, device.type).bf16
        lps: list | None = [] if isinstance(self.model, PreTrainedModel) else None
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if lps is None:
                new = self._generate_padded(requests, pad)
            elif self.kv_reuse:
                rows = self._rows(requests)
                self.prefilled_tokens += sum(len(ids) for _, ids in {(id(p), tuple(ids)): (p, ids)
                                                                    for p, ids in rows}.values())
                out = decode_cached(self.model, rows, limits, self.tok.eos_token_id, pad, self.temperature,
                                    self.top_p, keep=True, streams=streams, logprobs=lps, packs=self._packs)
                for r, (_, kv) in zip(requests, out):
                    if kv is not None:
                        self._kv[r.key] = kv
                new = [ids for ids, _ in out]
            else:
                self.prefilled_tokens += sum(len(r.context_ids) for r in requests)
                new = decode_shrinking(self.model, [r.context_ids for r in requests], limits,
                                       self.tok.eos_token_id, pad, self.temperature, self.top_p, streams=streams,
                                       logprobs=lps)
        gens = [cut_at_stop(row, {self.tok.eos_token_id}, r.max_new_tokens, pad) for row, r in zip(new, requests)]
        for i, g in enumerate(gens if lps else []):  # decoding stops at the stop token: nothing to trim but the limit
            g.logprobs = lps[i][: len(g.token_ids)]
        return gens

    def _generate_padded(self, requests, pad):
        import torch

        width = max(len(r.context_ids) for r in requests)
        input_ids = torch.tensor([[pad] * (width - len(r.context_ids)) + r.context_ids for r in requests])
        attn = torch.tensor([[0] * (width - len(r.context_ids)) + [1] * len(r.context_ids) for r in requests])
        sample = self.temperature > 0
        out = self.model.generate(input_ids=input_ids, attention_mask=attn,
                                  max_new_tokens=max(r.max_new_tokens for r in requests), do_sample=sample,
                                  temperature=self.temperature if sample else None,
                                  top_p=self.top_p if sample else None, top_k=None,
                                  eos_token_id=self.tok.eos_token_id, pad_token_id=pad)
        return out[:, width:].tolist()


def engines_for_trainer(trainer, tok, temperature: float, top_p: float, max_batch: int = 16,
                        num_engines: int = 1, server_model: str | None = None) -> list:
    """The engines rollouts should use inside TRL's GRPOTrainer, on the vLLM whose weights TRL keeps in sync.

    The caller syncs first: TRL's own ``rollout_func`` path calls ``vllm_generation.sync_weights()`` before
    each call (trl 1.16 ``GRPOTrainer._generate``), ``RoCGRPOTrainer`` does the same before its rollouts. Then:
    colocate mode -> ``StepVLLMEngine`` on TRL's own ``vllm.LLM`` (this process's GPU); server mode
    (``trl vllm-serve``) -> one ``OpenAIEngine`` per data-parallel rank of the same server
    (``servers.server_engines``), asking for ``server_model`` (None = the policy's folder name, which is what
    ``trl vllm-serve --model FOLDER`` serves); no vLLM -> ``HFEngine`` replicas on the live (unwrapped) policy,
    which need no sync at all. With several training processes in server mode, ``central.for_trainer`` lets the
    main process's scheduler run every process's trajectories on these engines.
    """
    stop = [tok.eos_token_id]
    if getattr(trainer, "use_vllm", False):
        args = trainer.args
        if args.vllm_mode == "colocate":
            return [StepVLLMEngine(trainer.vllm_generation.llm, stop, temperature, top_p)]
        base = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        return server_engines(base, server_model or trainer.model.config._name_or_path, stop, temperature, top_p)
    model = trainer.accelerator.unwrap_model(trainer.model)
    return [HFEngine(model, tok, temperature, top_p, max_batch=max_batch) for _ in range(num_engines)]

