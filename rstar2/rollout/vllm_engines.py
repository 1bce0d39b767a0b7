"""In-process vLLM engines with no batch barrier (paper §3.2): one vLLM request per trajectory turn, token ids in
and out (nothing is re-tokenised), the sampled tokens' log-probabilities returned (``Generation.logprobs``), so a
turn that ends early goes back to its trajectory (and its tool call out) at once while longer ones keep decoding.

- ``AsyncVLLMEngine``: a ``vllm.AsyncLLM`` (``AsyncLLMEngine`` is the same class), the engine we build ourselves
  (evaluation, hard-problem mining, label verification: ``rollout.engine: vllm``).
- ``StepVLLMEngine``: a ``vllm.LLM`` we do not own (TRL's colocated one, which TRL keeps in sync with the policy),
  driven request by request through its ``LLMEngine`` (``add_request`` / ``step``) instead of one blocking
  ``llm.generate`` per batch.

Call signatures as in vllm==0.31.0 (the pinned GPU extra), read in its wheel: ``vllm/v1/engine/async_llm.py``
``AsyncLLM.generate(prompt, sampling_params, request_id, ...) -> AsyncGenerator[RequestOutput]`` (a cancelled
generator aborts its request); ``vllm/v1/engine/llm_engine.py`` ``LLMEngine.add_request(request_id, prompt, params)``,
``step() -> list[RequestOutput]`` (``RequestOutput.request_id`` is the id given to ``add_request``),
``has_unfinished_requests()``, ``abort_request(request_ids)``; ``vllm/sampling_params.py`` ``SamplingParams``
(``logprobs=0``: the sampled token's log-probability, ``output_kind=RequestOutputKind.FINAL_ONLY``);
``vllm/outputs.py`` ``CompletionOutput.logprobs[i][token_id].logprob``; the KV size in tokens is
``cache_config.kv_cache_size_tokens`` (per engine), else ``num_gpu_blocks * block_size``.
vLLM is an optional GPU extra: it is imported only when an engine is built without injected classes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import weakref

from .protocol import Generation, normalise_finish
from .vllm_reproducible import turn_seed

_LOOPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # AsyncLLM -> the event loop it runs on
_LOOPS_LOCK = threading.Lock()
_REQUESTS = itertools.count()  # request ids "<trajectory key>/<n>" never repeat in a process (keys can, across phases)


def kv_tokens_of(vllm_config) -> int | None:
    """KV-cache size in tokens of a running vLLM engine (None before its cache is allocated)."""
    cache = getattr(vllm_config, "cache_config", None)
    tokens = getattr(cache, "kv_cache_size_tokens", None)
    if tokens:
        return int(tokens)
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def _new_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="vllm-async", daemon=True).start()
    return loop


def start_async_llm(engine_args, async_llm_cls=None):
    """Build a ``vllm.AsyncLLM`` from ``vllm.AsyncEngineArgs`` inside the event loop it will run on (as vLLM's own
    server does), so its output handler starts there at once; ``AsyncVLLMEngine`` on it uses that loop.

    Raises:
        ImportError: vLLM is not installed and no ``async_llm_cls`` was given.
    """
    if async_llm_cls is None:
        from vllm.v1.engine.async_llm import AsyncLLM as async_llm_cls  # optional GPU extra

    async def build():
        return async_llm_cls.from_engine_args(engine_args)
    loop = _new_loop()
    llm = asyncio.run_coroutine_threadsafe(build(), loop).result()
    with _LOOPS_LOCK:
        _LOOPS[llm] = loop
    return llm


def shutdown_async_llm(llm) -> None:
    """Shut an ``AsyncLLM`` down (its engine process exits) and stop the event loop it runs on."""
    with _LOOPS_LOCK:
        loop = _LOOPS.pop(llm, None)
    handler = getattr(llm, "output_handler", None)
    if loop is not None and handler is not None:
        # AsyncLLM.shutdown stops the engine first and cancels its output handler after: the handler, still
        # waiting for outputs, meets the dead engine and logs an EngineDeadError traceback into every stage's log
        async def cancel():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(cancel(), loop).result(timeout=30)
    llm.shutdown()
    # once: AsyncLLM.__del__ calls shutdown again when the object is collected at interpreter exit, after vLLM's
    # module globals are gone (a TypeError traceback in every stage's log)
    llm.shutdown = lambda *args, **kwargs: None
    if loop is not None:
        loop.call_soon_threadsafe(loop.stop)


def vllm_classes():
    """``(SamplingParams, RequestOutputKind.FINAL_ONLY)`` from vLLM (ImportError without the GPU extra)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams, RequestOutputKind.FINAL_ONLY


def to_generation(output, stop: list[int], max_new: int) -> Generation:
    """A finished vLLM ``RequestOutput`` -> Generation, with the sampled tokens' log-probabilities.

    Raises:
        RuntimeError: vLLM aborted the request or returned no output (the turn cannot be used).
    """
    if output is None or not output.outputs:
        raise RuntimeError("vLLM returned no output for a turn")
    o = output.outputs[0]
    if o.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended request {output.request_id} with finish_reason {o.finish_reason!r}")
    ids = list(o.token_ids)
    gen = normalise_finish(ids, o.finish_reason, stop, max_new)
    if o.logprobs is not None and len(o.logprobs) == len(ids) == len(gen.token_ids):
        gen.logprobs = [float(o.logprobs[j][tid].logprob) for j, tid in enumerate(ids)]
    return gen


def _current_cuda_device() -> int | None:
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


class _Sampling:
    """The per-turn ``SamplingParams`` shared by both engines; ``seed`` (None: unseeded) gives every turn its own
    ``SamplingParams.seed`` (``vllm_reproducible.turn_seed`` of the trajectory key and context length)."""
    seeded_turns = True  # run_rollouts may hand it the phase's seed (vllm_reproducible.seed_engines)

    def __init__(self, stop_token_ids, temperature, top_p, classes, seed=None):
        self.stop, self.temperature, self.top_p, self.seed = list(stop_token_ids), temperature, top_p, seed
        self.sp_cls, self.final_only = classes if classes is not None else vllm_classes()

    def params(self, max_new_tokens: int, seed: int | None = None):
        return self.sp_cls(max_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                           stop_token_ids=self.stop, skip_special_tokens=False, detokenize=False, logprobs=0,
                           output_kind=self.final_only, seed=seed)


class AsyncVLLMEngine(_Sampling):
    """``vllm.AsyncLLM`` behind the Engine protocol: each turn is its own request, vLLM batches them continuously.

    AsyncLLM binds its output handler to the event loop of its first request, while every ``run_rollouts`` runs
    its own loop: so each AsyncLLM lives on one event loop in a daemon thread (shared by every engine object on
    that AsyncLLM), and ``generate`` hands each turn over to it. Cancelling ``generate`` cancels the request
    (vLLM aborts it).

    Args:
        llm: a ``vllm.AsyncLLM`` (``start_async_llm(AsyncEngineArgs(...))``, or one not used on any loop yet).
        stop_token_ids: ids that end a turn. temperature, top_p: sampling.
        kv_tokens: KV capacity override; None = vLLM's own (``kv_tokens_of(llm.vllm_config)``).
        classes: ``(SamplingParams, RequestOutputKind.FINAL_ONLY)``; None = import vLLM (tests inject fakes).
        seed: per-turn seeds derived from it (``reproducible``); None = unseeded.
    Raises:
        ImportError: vLLM is not installed and no ``classes`` were given.
    """

    def __init__(self, llm, stop_token_ids: list[int], temperature: float, top_p: float,
                 kv_tokens: int | None = None, classes=None, seed: int | None = None):
        super().__init__(stop_token_ids, temperature, top_p, classes, seed)
        self.llm, self.kv_tokens = llm, kv_tokens

    def kv_capacity_tokens(self) -> int | None:
        return self.kv_tokens if self.kv_tokens is not None else kv_tokens_of(getattr(self.llm, "vllm_config", None))

    def release(self, key: str) -> None:
        """Nothing to drop: vLLM's prefix cache evicts a finished trajectory's blocks when it needs them."""

    def _engine_loop(self) -> asyncio.AbstractEventLoop:
        with _LOOPS_LOCK:
            if self.llm not in _LOOPS:  # an AsyncLLM built elsewhere, not yet used: it binds to this loop
                _LOOPS[self.llm] = _new_loop()
            return _LOOPS[self.llm]

    async def _turn(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        final = None
        params = self.params(max_new_tokens, turn_seed(self.seed, key, len(context_ids)))
        async for out in self.llm.generate({"prompt_token_ids": context_ids}, params, f"{key}/{next(_REQUESTS)}"):
            final = out  # FINAL_ONLY: one output, when the turn is finished
        return to_generation(final, self.stop, max_new_tokens)

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        fut = self.submit(self._turn(key, context_ids, max_new_tokens))
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise

    def submit(self, coro) -> concurrent.futures.Future:
        """Run ``coro`` on the event loop this engine's AsyncLLM is bound to (for callers that also use the
        AsyncLLM directly, e.g. a bare-vLLM throughput baseline)."""
        return asyncio.run_coroutine_threadsafe(coro, self._engine_loop())

    def shutdown(self) -> None:
        """Shut vLLM down and stop its event loop (every engine on this AsyncLLM is unusable afterwards)."""
        shutdown_async_llm(self.llm)


class StepVLLMEngine(_Sampling):
    """A ``vllm.LLM`` driven request by request: continuous batching without ``llm.generate``'s per-call barrier.

    One worker thread owns the LLM's ``LLMEngine`` (it is not thread-safe): it adds the turns that arrived, runs
    one ``step()`` while any request is unfinished, and hands each finished turn back to its caller's event loop
    at once. ``aclose()`` (``run_rollouts`` calls it at the end of each rollout phase) aborts what is left and
    stops the thread, so the LLM is idle again when TRL syncs weights or puts it to sleep.

    Args:
        llm: a ``vllm.LLM`` (for RL the colocated one of TRL: ``trainer.vllm_generation.llm`` in TRL 1.16).
        stop_token_ids, temperature, top_p, kv_tokens, classes, seed: as ``AsyncVLLMEngine``.
    Raises:
        ImportError: vLLM is not installed and no ``classes`` were given.
    """

    def __init__(self, llm, stop_token_ids: list[int], temperature: float, top_p: float,
                 kv_tokens: int | None = None, classes=None, seed: int | None = None):
        super().__init__(stop_token_ids, temperature, top_p, classes, seed)
        self.llm, self.kv_tokens = llm, kv_tokens
        self._cv = threading.Condition()
        self._inbox: list[tuple] = []               # ("add", id, context, params) | ("abort", id)
        self._waiters: dict[str, tuple] = {}        # request id -> (event loop, future, max_new_tokens)
        self._thread: threading.Thread | None = None
        self._closing = False
        self.steps = 0                              # engine steps run (tests, benchmarks)
        self._cuda_device = _current_cuda_device()  # the worker thread must step on the GPU the LLM was built on

    def kv_capacity_tokens(self) -> int | None:
        return self.kv_tokens if self.kv_tokens is not None else kv_tokens_of(self.llm.llm_engine.vllm_config)

    def release(self, key: str) -> None:
        """Nothing to drop: vLLM's prefix cache evicts a finished trajectory's blocks when it needs them."""

    async def generate(self, key: str, context_ids: list[int], max_new_tokens: int) -> Generation:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        loop = asyncio.get_running_loop()
        fut, rid = loop.create_future(), f"{key}/{next(_REQUESTS)}"
        with self._cv:
            if self._thread is None:
                self._closing = False
                self._thread = threading.Thread(target=self._work, name="vllm-step", daemon=True)
                self._thread.start()
            self._waiters[rid] = (loop, fut, max_new_tokens)
            seed = turn_seed(self.seed, key, len(context_ids))
            self._inbox.append(("add", rid, context_ids, self.params(max_new_tokens, seed)))
            self._cv.notify()
        try:
            return await fut
        except asyncio.CancelledError:
            with self._cv:
                self._inbox.append(("abort", rid))
                self._cv.notify()
            raise

    def _hand_back(self, rid: str, result=None, error: BaseException | None = None) -> None:
        entry = self._waiters.pop(rid, None)
        if entry is None:
            return
        loop, fut, _ = entry

        def settle():
            if not fut.done():
                fut.set_exception(error) if error is not None else fut.set_result(result)
        loop.call_soon_threadsafe(settle)

    def _work(self) -> None:
        if self._cuda_device is not None:  # a new thread's current CUDA device is 0, whatever this process uses
            import torch

            torch.cuda.set_device(self._cuda_device)
        engine = self.llm.llm_engine
        while True:
            with self._cv:
                while not self._inbox and not self._closing and not engine.has_unfinished_requests():
                    self._cv.wait()
                todo, self._inbox, closing = self._inbox, [], self._closing
            for op in todo:
                if op[0] == "abort":
                    engine.abort_request([op[1]])
                    self._hand_back(op[1], error=asyncio.CancelledError())
                    continue
                if closing:
                    self._hand_back(op[1], error=RuntimeError("the engine was closed before the turn started"))
                    continue
                try:
                    engine.add_request(op[1], {"prompt_token_ids": op[2]}, op[3])
                except Exception as e:  # e.g. a context over the model's length: that turn fails, not the rest
                    self._hand_back(op[1], error=e)
            if closing:
                unfinished = list(self._waiters)
                if unfinished:
                    engine.abort_request(unfinished)
                for rid in unfinished:
                    self._hand_back(rid, error=RuntimeError("the engine was closed before the turn finished"))
                return
            if not engine.has_unfinished_requests():
                continue
            try:
                outs = engine.step()
            except Exception as e:  # every waiting turn sees the failure
                for rid in list(self._waiters):
                    self._hand_back(rid, error=e)
                continue
            self.steps += 1
            for out in outs:
                if out.finished and out.request_id in self._waiters:
                    try:
                        self._hand_back(out.request_id, to_generation(out, self.stop, self._waiters[out.request_id][2]))
                    except RuntimeError as e:
                        self._hand_back(out.request_id, error=e)

    async def aclose(self) -> None:
        """Abort unfinished turns and stop the worker thread (a later ``generate`` starts a new one)."""
        with self._cv:
            thread, self._closing = self._thread, True
            self._cv.notify()
        if thread is not None:
            await asyncio.to_thread(thread.join)
        with self._cv:
            self._thread = None
