"""``AsyncVLLMEngine`` on a real ``vllm.AsyncLLM`` (vLLM's CPU build, requirements-vllm.txt) through ``run_rollouts``:
the agent loop, the balanced scheduler and real tool calls in the sandbox.

Real: the engine (every generated token id and its log-probability is vLLM's sample from a tiny random Qwen3), the
agent loop, the scheduler and the sandbox that runs the parsed code. Steered: a random model writes no tool call, so
the first turn of each trajectory is sampled under a structured-output regex (vLLM's own constrained decoding)
that admits only ``</reason>`` + one fixed call of the code tool; later turns are sampled freely. The KV cache is
set small (``num_gpu_blocks_override``) so that the scheduler's admission, fed by the capacity vLLM reports, binds.
A second test has one steered short answer and one freely sampled long turn run at once.

One engine for the module (its own process: AsyncLLM always runs its EngineCore apart)."""

import contextvars
import time

import pytest
from vllm_cpu import ENV, check_trajectory, first_turn, literal_regex, recorded_scheduler, tiny_model

from rstar2.rollout import AsyncVLLMEngine

pytest.importorskip("vllm")

FIRST = first_turn()
# response budget (tokens), tool responses included. The steered first turn is sampled under a regex, which admits
# every tokenization of its 134 characters (a random model picks among them: about 40 tokens up to one per
# character), and the ~30-token tool response must fit after it, or the trajectory ends on its budget after one
# turn (seen: 3 of 7 runs with L = 96 on a loaded machine, where the requests' sampling order differs)
L = 176
MAX_LEN, BLOCK, BLOCKS = 640, 128, 10  # KV: 1280 tokens, room for 2 sequences of max_model_len
N = 5                            # trajectories: more than the KV admits at once
_STEER = contextvars.ContextVar("steer", default=None)  # the text a turn is steered to


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs

    from rstar2.rollout import start_async_llm

    with pytest.MonkeyPatch.context() as mp:
        for name, value in ENV.items():
            mp.setenv(name, value)
        path = tiny_model(tmp_path_factory.mktemp("vllm") / "model")
        tok = AutoTokenizer.from_pretrained(path)
        args = AsyncEngineArgs(model=str(path), dtype="float32", enforce_eager=True, max_model_len=MAX_LEN,
                               block_size=BLOCK, num_gpu_blocks_override=BLOCKS, enable_prefix_caching=True,
                               logprobs_mode="processed_logprobs", seed=0)
        llm = start_async_llm(args)
        engine = FirstTurnSteered(llm, [tok.eos_token_id], temperature=1.0, top_p=1.0)
        try:
            yield tok, engine
        finally:
            engine.shutdown()


class FirstTurnSteered(AsyncVLLMEngine):
    """Records every turn (context in, Generation out, the time it came back); a trajectory's first turn is
    sampled under a regex that admits only ``first(key)`` (None: not steered)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: dict[str, list] = {}
        self.first = lambda key: FIRST

    def params(self, max_new_tokens, seed=None):
        p = super().params(max_new_tokens, seed)
        if (text := _STEER.get()) is not None:
            from vllm.sampling_params import StructuredOutputsParams

            p.structured_outputs = StructuredOutputsParams(regex=literal_regex(text))
        return p

    async def _turn(self, key, context_ids, max_new_tokens):  # runs as its own task on the engine's loop
        # generate() logged this turn: steer the first one of each key
        _STEER.set(self.first(key) if len(self.turns[key]) == 1 else None)
        return await super()._turn(key, context_ids, max_new_tokens)

    async def generate(self, key, context_ids, max_new_tokens):
        log = self.turns.setdefault(key, [])
        log.append([list(context_ids), None, None])
        gen = await super().generate(key, context_ids, max_new_tokens)
        log[-1][1:] = [gen, time.monotonic()]
        return gen


def test_multi_turn_rollouts_with_sandbox_tool_calls_on_async_vllm(setup, monkeypatch):
    from rstar2.rollout import RolloutConfig, run_rollouts

    tok, engine = setup
    made = recorded_scheduler(monkeypatch)

    cfg = RolloutConfig(max_response_tokens=L, max_turns=3, temperature=1.0)
    problems = [{"id": f"p{i}", "problem": f"What is {i} times 7?"} for i in range(N)]
    trajs = run_rollouts(None, tok, problems, cfg, engines=[engine])

    # KV capacity: vLLM's own figure for what it allocated, and the scheduler never reserved more
    cache = engine.llm.vllm_config.cache_config
    cap = engine.kv_capacity_tokens()
    (sched,) = made
    need = len(trajs[0].prompt_ids) + L
    print(f"vLLM KV: {cache.num_gpu_blocks} blocks x {cache.block_size} = {cache.num_gpu_blocks * cache.block_size}"
          f" tokens, reported capacity {cap}; need/trajectory {need}; peak reserved {sched.peak_reserved[0]}; "
          f"admission waves {sched.admissions}")
    assert cache.num_gpu_blocks == BLOCKS and cache.block_size == BLOCK
    assert cap == cache.kv_cache_size_tokens and 0 < cap <= BLOCKS * BLOCK
    assert sched.capacity(0) == cap
    assert sched.peak_reserved[0] <= cap
    assert cap // need < N and sched.admissions[0] == (0, cap // need)  # admission bound by vLLM's figure

    for t in trajs:
        check_trajectory(t, engine.turns[t.key], tok)
    print("turns per trajectory", [len(t.turns) for t in trajs], "finish", [t.finish_reason for t in trajs],
          "response tokens", [len(t.response_ids) for t in trajs])


def test_a_short_trajectory_is_not_held_back_by_a_long_one(setup):
    """Two trajectories at once on the engine: one answers in a few tokens (steered), the other samples freely to
    the whole budget. The short one is back while the long one still decodes (vLLM batches requests continuously;
    a per-batch ``generate`` would return both together)."""
    from rstar2.rollout import RolloutConfig, run_rollouts

    tok, engine = setup
    engine.first = lambda key: "</reason><answer>1</answer>" if key.startswith("short") else None
    cfg = RolloutConfig(max_response_tokens=L, max_turns=3, temperature=1.0)
    t0 = time.monotonic()
    short, long_ = run_rollouts(None, tok, [{"id": "short", "problem": "1?"}, {"id": "long", "problem": "2?"}],
                                cfg, engines=[engine], tools=object())  # neither calls a tool
    (_, s_gen, s_end), = engine.turns[short.key]
    (_, l_gen, l_end), = engine.turns[long_.key]
    print(f"short: {len(s_gen.token_ids)} tokens back at {s_end - t0:.2f}s; long: {len(l_gen.token_ids)} tokens "
          f"back at {l_end - t0:.2f}s")
    assert short.finish_reason == "answer" and long_.finish_reason == "budget"
    assert len(s_gen.token_ids) <= len("</reason><answer>1</answer>") + 1 and len(l_gen.token_ids) == L  # any split
    assert s_end < l_end - 0.25 * (l_end - t0)  # back well before the long turn ended


def test_reproducible_mode_seeds_each_trajectory_so_same_seed_runs_repeat_and_a_group_differs(setup):
    """``reproducible`` on vLLM (rollout/vllm_reproducible.py): each turn is a request with its own seed from the
    phase's seed and the trajectory key. Two runs with one seed give the same token ids (and log-probs) for the
    same group, even with another problem added to the batch the second time (log-probs then equal to float32
    noise: the CPU build has no batch-invariant kernels); the G samples of the group differ
    (never one seed per group); another seed gives other tokens."""
    from rstar2.rollout import AsyncVLLMEngine, RolloutConfig, run_rollouts

    tok, steered = setup
    engine = AsyncVLLMEngine(steered.llm, [tok.eos_token_id], temperature=1.0, top_p=1.0)  # the module's AsyncLLM
    cfg = RolloutConfig(max_response_tokens=24, max_turns=1, temperature=1.0)
    assert cfg.reproducible
    group = [{"id": "g", "problem": "What is 6 times 7?"}] * 3
    other = [{"id": "o", "problem": "What is 2 plus 2?"}]

    def run(problems, seed):
        trajs = run_rollouts(None, tok, problems, cfg, engines=[engine], tools=object(), seed=seed)
        assert engine.seed is None  # the phase's seed was lent for the run only
        return {t.key: (t.response_ids, t.response_logprobs) for t in trajs}

    t0 = time.monotonic()
    first, again, other_seed = run(group, 7), run(other + group, 7), run(group, 8)
    print(f"3 seeded runs in {time.monotonic() - t0:.1f}s; group tokens", [ids for ids, _ in first.values()])
    keys = ["g#0", "g#1", "g#2"]
    assert [first[k][0] for k in keys] == [again[k][0] for k in keys]
    # log-probs: equal up to float32 noise of the larger batch (CPU vLLM has no batch-invariant kernels)
    lp_gap = max(abs(a - b) for k in keys for a, b in zip(first[k][1], again[k][1]))
    print(f"same seed, other batch: max |log-prob difference| {lp_gap:.2e}")
    assert lp_gap < 1e-3
    assert len({tuple(first[k][0]) for k in keys}) == 3   # the group's samples differ
    assert [first[k][0] for k in keys] != [other_seed[k][0] for k in keys]
