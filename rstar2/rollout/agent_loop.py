"""The multi-turn agent loop, one trajectory at a time (paper §2.1; released code
rstar2_agent/rollout/rstar2_agent_loop.py).

A trajectory advances in two awaitable steps that the scheduler composes: ``generate_turn`` (one
assistant turn from an engine, parsed with the rStar2 rules) and ``run_tool_calls`` (execute the turn's
calls through a ``ToolRunner`` and append the masked tool-response tokens). The token budget is shared
by all turns and counts tool-response tokens (as in the released loop); token ids are appended, never re-tokenised.
Nothing here waits for other trajectories: barriers, if any, belong to the scheduler's static mode.
"""

from __future__ import annotations

import asyncio
from collections import Counter
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Protocol

from .. import chat, grading_pool, sandbox
from .. import precision as precision_lib


@dataclass
class ToolConfig:
    """The code tool as the model sees it and as the sandbox runs it (the config's ``tool`` section).

    name: the tool's function name in the schema and in ``<tool_call>`` JSON (paper Fig. 3).
    timeout_s: wall-clock limit of one call (seconds). memory_mb: memory one call may add (MB).
    max_output_chars: tool output shown to the model, middle-truncated beyond this (released code: 256).
    """
    name: str = chat.DEFAULT_TOOL_NAME
    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_output_chars: int = 256

    def limits(self) -> sandbox.SandboxLimits:
        """The per-call sandbox limits these settings give."""
        return sandbox.SandboxLimits(timeout_s=self.timeout_s, memory_mb=self.memory_mb)


ENGINES = ("hf", "vllm", "server")     # rollout.engine
SCHEDULERS = ("balanced", "static")    # rollout.scheduler


@dataclass
class RolloutConfig:
    """Sampling, loop limits and rollout-engine settings. Token counts are in the policy tokenizer's tokens.

    The keyword defaults serve the Python API (docs/api.md examples, tests); a workflow stage builds its config with
    ``from_params`` from the validated config, where every value is given (the schema holds the defaults).

    batch_size: most sequences one engine runs in one forward batch (transformers engine).
    engine: "hf" (transformers ``generate`` on the policy), "vllm" (an in-process ``vllm.AsyncLLM`` on the
        model's folder; the GPU extra or vLLM's CPU build; RL: the trainer's colocated ``vllm.LLM``) or "server" (OpenAI-compatible vLLM servers at ``server_urls``, one engine per
        data-parallel rank, serving ``server_model``).
    num_engines: engine instances for "hf" (replicas sharing one model object).
    scheduler: "balanced" (KV-aware admission, no per-turn barrier; paper §3.2) or "static" (even split,
        per-turn barrier; the baseline the paper improves on).
    kv_cache_tokens: KV capacity per engine used for admission; None = ask the engine (None there too =
        no KV limit, admission then only caps in-flight trajectories at ``max_inflight_per_engine``).
    hf_kv_cache_mb: "hf" engine: the memory its KV caches may take (MiB); it reports the capacity in tokens this
        holds for the policy (``HFEngine.kv_capacity_tokens``), so admission is KV-bound on CPU too. None = no bound.
    max_calls_per_turn: calls executed per turn (released code: 1); further calls are reported as dropped.
    kv_reuse: "hf" engine: keep each trajectory's KV cache across its turns and prefill a group's equal prompts
        once (False: re-prefill the whole context every turn).
    reproducible: the same seed gives the same trajectories whatever the timing of tool calls: deterministic
        placement and admission (scheduler.py) and per-engine turn rounds (engines.BatchingEngine).
    precision: "fp32" | "bf16" | "force-bf16" for the "hf" engine (bf16 = a bfloat16 copy of the policy, generated
        under torch.autocast; "bf16" only where the device has native bf16, else float32: rstar2.precision).
    vllm: engine "vllm": the in-process engine's settings (``distributed.vllm``: ``max_model_length``,
        ``enforce_eager``, ``env``; ``vllm_settings``); None = vLLM's own defaults.
    tool: the code tool (``ToolConfig``).
    """
    max_response_tokens: int = 512
    max_turns: int = 10
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 16
    engine: str = "hf"
    num_engines: int = 1
    server_urls: tuple[str, ...] = ()
    server_model: str | None = None
    scheduler: str = "balanced"
    kv_cache_tokens: int | None = None
    hf_kv_cache_mb: int | None = 8192
    max_inflight_per_engine: int = 256
    max_calls_per_turn: int = 1
    precision: str = "fp32"
    kv_reuse: bool = True
    reproducible: bool = True
    vllm: dict | None = None
    tool: ToolConfig = field(default_factory=ToolConfig)

    def __post_init__(self):
        if isinstance(self.tool, dict):
            self.tool = ToolConfig(**self.tool)
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine must be 'hf', 'vllm' or 'server', got {self.engine!r}")
        if self.engine == "server" and not self.server_urls:
            raise ValueError("rollout.engine 'server' needs rollout.server_urls")
        self.server_urls = tuple(self.server_urls)
        if self.precision not in precision_lib.ROLLOUT_SETTINGS:
            raise ValueError(f"rollout.precision must be one of {list(precision_lib.ROLLOUT_SETTINGS)}, "
                             f"got {self.precision!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"rollout.scheduler must be 'balanced' or 'static', got {self.scheduler!r}")
        for name in ("max_response_tokens", "max_turns", "batch_size", "num_engines", "max_calls_per_turn",
                     "max_inflight_per_engine"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_params(cls, rollout: dict, tool: dict) -> "RolloutConfig":
        """The config of a stage's ``rollout`` params (every field but ``tool``) and ``tool`` params.

        Raises:
            ValueError: a field is missing or unknown (names it), or a value is out of range.
        """
        names = {f.name for f in fields(cls)} - {"tool"}
        missing, unknown = sorted(names - set(rollout)), sorted(set(rollout) - names)
        if missing or unknown:
            raise ValueError(f"rollout params: missing {missing}, unknown {unknown}")
        tool_names = {f.name for f in fields(ToolConfig)}
        if set(tool) != tool_names:
            raise ValueError(f"tool params: missing {sorted(tool_names - set(tool))}, "
                             f"unknown {sorted(set(tool) - tool_names)}")
        return cls(**rollout, tool=ToolConfig(**tool))


@dataclass
class Trajectory:
    """One rollout. ``response_ids``/``response_mask`` have equal length; mask 1 = generated by the policy.

    ``key`` names the trajectory to the engines (``AgentLoop.new_trajectory`` makes it unique per loop).
    ``response_logprobs`` is aligned with ``response_ids``: the engine's sampling log-probability of each generated
    token, 0.0 on tool-response tokens (mask 0); None when unknown (a turn came from an engine that reports
    none, or the trajectory was not made by the agent loop).
    """
    problem_id: str
    question: str
    gold: str | None
    prompt_ids: list[int]
    key: str = ""
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = None
    # {"text", "tool_calls": [{"code","status","output","duration_s"[, "attempts"]}], "dropped_calls": int}
    turns: list[dict] = field(default_factory=list)
    finish_reason: str = ""                           # answer | max_turns | budget | infra-error
    pred: str | None = None
    reward: float = 0.0
    grading_status: str | None = None                 # the grading pool's ok | timeout | error (None: not graded)
    grading_error: str | None = None                  # what the reward raised or found wrong (e.g. a bad gold)

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "budget"

    @property
    def unserved(self) -> bool:
        """A tool call could not be served after the client's retries: the trajectory ended there, ungraded (it
        says nothing about the model; RL leaves it out of the update, rl/fault_accounting.py)."""
        return self.finish_reason == sandbox.INFRA_STATUS

    @property
    def tool_calls(self) -> list[dict]:
        return [c for t in self.turns for c in t["tool_calls"]]

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def context_tokens(self) -> int:
        """Tokens this trajectory holds in an engine's KV cache (prompt + response so far)."""
        return len(self.prompt_ids) + len(self.response_ids)

    def record(self) -> dict:
        """The JSON rollout record (rollouts.jsonl): every turn, each tool call and its status, answer, reward."""
        d = asdict(self)
        for name in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "key"):
            d.pop(name)
        if d["grading_status"] in (None, "ok"):  # recorded only when grading failed
            d.pop("grading_status")
        if d["grading_error"] is None:
            d.pop("grading_error")
        d.update(truncated=self.truncated, num_turns=len(self.turns), response_tokens=len(self.response_ids),
                 generated_tokens=self.num_generated_tokens)
        return d


class ToolRunner(Protocol):
    """Executes one tool call. The sandbox service's async client has this shape."""

    async def run(self, code: str, stdin: str = "") -> sandbox.ExecResult: ...


class DelayedToolRunner:
    """Wraps a ToolRunner and adds ``delay_s`` of latency per call (network / queueing), without holding a worker."""

    def __init__(self, inner: ToolRunner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    async def run(self, code: str, stdin: str = "") -> sandbox.ExecResult:
        await asyncio.sleep(self.delay_s)
        return await self.inner.run(code, stdin)


def grade_all(trajs: list[Trajectory], reward_fn: Callable[[str, str], dict] | None = None,
              answer_types: list[str] | None = None, golds: list[str] | None = None, reward: str = "answer") -> None:
    """Set ``pred``/``reward`` of every trajectory that has a gold answer (Eq. 3).

    ``golds`` (one per trajectory) sets each trajectory's gold first: evaluation rolls out without the answers
    (the policy never sees them) and grades afterwards.

    A truncated trajectory scores 0 and is not graded (paper §4.3.1), nor is one whose tool call the sandbox could not
    serve (``Trajectory.unserved``). ``grading_status`` records the grading pool's status (a timeout scores 0). The others are graded on their final
    assistant turn by ``reward_fn(final_turn, gold) -> {"pred", "reward"}`` or, by default, by
    ``grading.score_trajectory`` in the killable grading workers (``grading_pool.score_many``: a
    per-item time bound, so an adversarial answer such as ``9^{9^{9}}`` cannot hang the rollout).
    ``answer_types`` (one per trajectory, as in ``grading.ANSWER_TYPES``; default ``"math"``) picks each
    benchmark's grader on that default path; ``reward`` names the reward of the registry that path uses
    (``rl.reward``: ``"answer"``, the paper's binary answer reward, or ``module:function``; rstar2.grading.rewards).
    """
    types = answer_types or ["math"] * len(trajs)
    if golds is not None:
        for t, gold in zip(trajs, golds, strict=True):
            t.gold = gold
    todo = []
    for t, kind in zip(trajs, types, strict=True):
        if t.gold is None:
            continue
        t.pred, t.reward = None, 0.0
        if not t.truncated and not t.unserved:
            todo.append((t, kind))
    finals = [t.turns[-1]["text"] if t.turns else "" for t, _ in todo]
    if reward_fn is None:
        scored = grading_pool.score_many([(f, t.gold, kind) for f, (t, kind) in zip(finals, todo)], reward=reward)
    else:
        scored = [reward_fn(f, t.gold) for f, (t, _) in zip(finals, todo)]
    for (t, _), s in zip(todo, scored):
        t.pred, t.reward, t.grading_status = s["pred"], s["reward"], s.get("status", "ok")
        t.grading_error = s.get("error")


def with_earlier_cells(earlier: list[str], code: str) -> str:
    """Code for the j-th call of a turn that sees the names the earlier calls defined (case T03).

    Each call runs in a fresh interpreter, so the earlier cells are replayed first with their output
    discarded and their errors ignored (as the released ``SimJupyterTool`` replays a trajectory's cells).
    The call's own code stays last, so its last expression is still displayed.
    """
    if not earlier:
        return code
    replay = "\n".join(
        f"try:\n    exec(compile({c!r}, '<earlier cell>', 'exec'))\nexcept BaseException:\n    pass" for c in earlier)
    return ("import contextlib as _ctx, io as _io\nwith _ctx.redirect_stdout(_io.StringIO()), "
            f"_ctx.redirect_stderr(_io.StringIO()):\n" + "\n".join("    " + ln for ln in replay.splitlines())
            + "\n" + code)


class AgentLoop:
    """Per-trajectory steps shared by every scheduler mode and engine (paper §2.1).

    Args:
        tok: the policy tokenizer (``encode``, ``decode``, ``eos_token``, ``eos_token_id``).
        cfg: loop limits (max_response_tokens, max_turns, max_calls_per_turn) and the tool (cfg.tool).
        tools: executes parsed calls.
    """

    def __init__(self, tok, cfg: RolloutConfig, tools: ToolRunner):
        self.tok, self.cfg, self.tools = tok, cfg, tools
        self._made: Counter = Counter()   # trajectories made per problem id

    def new_trajectory(self, problem: dict) -> Trajectory:
        """A fresh trajectory for ``{"id", "problem", "answer"?, "prompt"?}`` with the rStar2 prompt (paper Fig. 3), or
        with ``prompt``, a complete prompt text, when given (IFEval and BFCL bring their own; rstar2.data), and a key
        no other trajectory of this loop has: ``<problem id>#<n>`` for the n-th sample of that problem (``key``
        instead of the id when the problem has one, e.g. ``<benchmark>/<id>`` where several benchmarks share a
        call), which also names its sampling stream, so its tokens do not depend on the other problems of the call."""
        prompt = problem.get("prompt") or chat.prompt_text(problem["problem"],
                                                           [chat.python_tool_schema(self.cfg.tool.name)])
        return Trajectory(problem_id=str(problem["id"]), question=problem["problem"], gold=problem.get("answer"),
                          prompt_ids=self.tok.encode(prompt, add_special_tokens=False),
                          key=self._next(str(problem.get("key", problem["id"]))), response_logprobs=[])

    def _next(self, base: str) -> str:
        n = self._made[base]
        self._made[base] += 1
        return f"{base}#{n}"

    async def generate_turn(self, t: Trajectory, engine) -> list[chat.ToolCall]:
        """Generate one assistant turn; returns the calls to run (empty when the trajectory finished)."""
        budget = self.cfg.max_response_tokens - len(t.response_ids)
        out = await engine.generate(t.key, t.prompt_ids + t.response_ids, budget)
        ids = out.token_ids[:budget]
        t.response_ids += ids
        t.response_mask += [1] * len(ids)
        if t.response_logprobs is not None:  # one missing turn leaves the whole trajectory without log-probs
            known = out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
            t.response_logprobs = t.response_logprobs + list(out.logprobs[:budget]) if known else None
        text = self.tok.decode(ids, skip_special_tokens=False)
        t.turns.append({"text": text.removesuffix(self.tok.eos_token), "tool_calls": []})
        if out.finish_reason != "stop" or len(out.token_ids) > budget:
            t.finish_reason = "budget"  # cut by the length limit: a partial call is never parsed or run (T04)
            return []
        calls = chat.parse_tool_calls(text, self.cfg.tool.name)
        if not calls:
            t.finish_reason = "answer"
        elif len(t.turns) >= self.cfg.max_turns:
            t.finish_reason = "max_turns"
        else:
            t.turns[-1]["dropped_calls"] = max(0, len(calls) - self.cfg.max_calls_per_turn)
            return calls[: self.cfg.max_calls_per_turn]
        return []

    async def _run_one(self, call: chat.ToolCall, earlier: list[str]) -> dict:
        if call.error is not None:
            return {"code": None, "status": "parse-error", "output": call.error, "duration_s": 0.0}
        r = await self.tools.run(with_earlier_cells(earlier, call.code), call.stdin)
        rec = {"code": call.code, "status": r.status, "output": sandbox.render_result(r, self.cfg.tool.max_output_chars),
               "duration_s": r.duration_s}
        if getattr(r, "attempts", 1) > 1:  # retried after an infrastructure failure (sandbox.SandboxClient)
            rec["attempts"] = r.attempts
        return rec

    async def run_tool_calls(self, t: Trajectory, calls: list[chat.ToolCall]) -> None:
        """Execute ``calls`` concurrently and append the masked tool-response turn (paper §2.1)."""
        ok = [c.code for c in calls if c.error is None]
        recs = await asyncio.gather(*(self._run_one(c, ok[: sum(1 for d in calls[:i] if d.error is None)])
                                      for i, c in enumerate(calls)))
        t.turns[-1]["tool_calls"] = list(recs)
        if any(r["status"] == sandbox.INFRA_STATUS for r in recs):
            t.finish_reason = sandbox.INFRA_STATUS  # the sandbox failed, not the model: nothing more to learn here
            return
        texts = [r["output"] for r in recs]
        dropped = t.turns[-1].get("dropped_calls", 0)
        if dropped:
            texts.append(f"{dropped} further tool call(s) in this turn were not executed: at most "
                         f"{self.cfg.max_calls_per_turn} call(s) run per turn.")
        wrapper = self.tok.encode(chat.tool_response_text(texts), add_special_tokens=False)
        if len(t.response_ids) + len(wrapper) >= self.cfg.max_response_tokens:
            t.finish_reason = "budget"  # no room for the tool response: end on the assistant turn
            return
        t.response_ids += wrapper
        t.response_mask += [0] * len(wrapper)
        if t.response_logprobs is not None:
            t.response_logprobs += [0.0] * len(wrapper)

    async def run(self, t: Trajectory, engine) -> Trajectory:
        """Drive one trajectory to the end on ``engine`` with no barrier: tools run as soon as a turn ends.
        The caller (the scheduler) tells the engine when it has ended (``engine.release(t.key)``)."""
        while not t.done:
            calls = await self.generate_turn(t, engine)
            if calls:
                await self.run_tool_calls(t, calls)
        return t


class Progress:
    """A periodic progress line with rate and ETA (stderr), for long rollout phases."""

    def __init__(self, label: str, unit: str = "trajectories", every_s: float = 10.0):
        self.label, self.unit, self.every_s, self.t0, self.last = label, unit, every_s, time.time(), 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.time()
        if now - self.last < self.every_s and done < total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"[{self.label}] {done}/{total} {self.unit}, {rate:.2f}/s, ETA {eta:.0f}s", file=sys.stderr, flush=True)
